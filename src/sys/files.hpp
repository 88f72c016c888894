// SPDX-License-Identifier: Apache-2.0
// Facts about files a client hands the daemon, and what the daemon does to
// files it hands out: identity checks (the proof of read access every model
// caller gives), revocation by truncation, and counting the descriptors a
// process still holds of ours. Also the plain file and directory calls the
// layers above make (state directory, KV spill entries, GGUF reads), one
// small function each, so no layer but this one calls the kernel.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  // No call can set ctime back: a rewrite whose mtime was restored
  // (utimensat) still moves it.
  int64_t ctime_ns = 0;
  uid_t owner = 0;
  mode_t mode = 0;
  [[nodiscard]] bool same_inode(const FileId& o) const { return dev == o.dev && ino == o.ino; }
  // The same file, unchanged as far as stat can tell.
  [[nodiscard]] bool same_version(const FileId& o) const {
    return same_inode(o) && size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns;
  }
  // Whether a uid other than root and `uid` may change the bytes in place:
  // it owns the file (and may chmod it), or the group or others may write
  // it. Stat cannot prove content: a write through a shared mapping moves
  // neither time on tmpfs. (ACLs are not read; a write ACL for another user
  // shows in the group bits, which then hold the ACL mask.)
  [[nodiscard]] bool writable_by_others_than(uid_t uid) const {
    return (owner != 0 && owner != uid) || (mode & (S_IWGRP | S_IWOTH)) != 0;
  }
};

// The identity of `fd`, which must be a regular file opened for reading:
// an O_PATH fd (it proves nothing about read access), a write-only fd, a
// closed fd or anything but a regular file is EINVAL with a message naming
// `what` and the problem.
// Attributes::Cached (statx AT_STATX_DONT_SYNC) takes the attributes the
// kernel holds, where a FUSE or network file system would otherwise ask
// its server, which the caller may run and leave unanswered: for a check
// on the daemon's loop. Local file systems answer the same either way.
enum class Attributes { Fresh, Cached };
[[nodiscard]] Result<FileId> readable_file_identity(int fd, const std::string& what,
                                                    Attributes attrs = Attributes::Fresh);

// ftruncate(fd, 0): every mapping of the file in every process gets SIGBUS
// on its next access (hugetlbfs and shmem alike), and the pages are freed.
[[nodiscard]] Status truncate_to_zero(int fd, const std::string& what);

// mkdir `path` with `mode` unless it exists (as a directory).
[[nodiscard]] Status make_dir(const std::string& path, mode_t mode);

// mkdir `path` 0700 unless it exists; it must then be a directory itself
// (lstat: not a symlink to one), and is made 0700 when its mode is another.
// Errors: "<path>: not a directory", "<path>: chmod 0700: <why>", mkdir's.
[[nodiscard]] Status ensure_private_dir(const std::string& path);

// The names in directory `path`, without "." and "..". Errors: "<path>: <why>".
[[nodiscard]] Result<std::vector<std::string>> list_dir(const std::string& path);

// lstat(path): the entry itself, never a symlink's target. Errors: "<path>: <why>".
[[nodiscard]] Result<struct stat> lstat_path(const std::string& path);
// stat(path), following symlinks. Errors: "<path>: <why>".
[[nodiscard]] Result<struct stat> stat_path(const std::string& path);

// chmod(path, mode). Errors: "<path>: chmod 0<octal mode>: <why>".
[[nodiscard]] Status chmod_path(const std::string& path, mode_t mode);

// unlink(path); a file already gone is no error. Errors: "unlink <path>: <why>".
[[nodiscard]] Status remove_file(const std::string& path);

// rename(from, to). Errors: "rename <from>: <why>".
[[nodiscard]] Status rename_file(const std::string& from, const std::string& to);

// fsync of directory `path`: the entries made or renamed in it are durable.
// Errors: "fsync <path>: <why>".
[[nodiscard]] Status sync_dir(const std::string& path);

// One pread(v) at `offset` (retried on EINTR): the bytes it read, which may
// be fewer than asked at the end of the file. Errors: "read: <why>".
[[nodiscard]] Result<size_t> read_at(int fd, void* dst, size_t len, uint64_t offset);
[[nodiscard]] Result<size_t> read_at(int fd, std::span<const iovec> iov, uint64_t offset);

// write(fd) until all of `data` is written (retried on EINTR), at the
// file's offset. Errors: "write: <why>", with the bytes written before in
// `written` when given.
[[nodiscard]] Status write_all(int fd, std::span<const std::byte> data, size_t* written = nullptr);

// close(fd), reporting what close reports (a write-back error on some file
// systems). Errors: "close: <why>".
[[nodiscard]] Status close_file(UniqueFd fd);

// Sets the modification time of the open file `fd`, or when `fd` is -1 of
// `path` itself (never following a symlink); the access time is kept.
// Errors: "<path>: <why>".
[[nodiscard]] Status set_mtime(int fd, const std::string& path, const timespec& mtime);

// `path` is a regular file this process may read (stat and access(R_OK)).
// Errors: "<path>: <why>", "<path> is not a regular file", "<path> is not
// readable: <why>".
[[nodiscard]] Status check_readable_file(const std::string& path);

// open(path, flags | O_CLOEXEC, mode). Errors: "<path>: <strerror>".
[[nodiscard]] Result<UniqueFd> open_file(const std::string& path, int flags, mode_t mode = 0);

// open(path, flags) of a regular file only, never following a symlink and
// never blocking: it opens with O_NONBLOCK | O_NOFOLLOW | O_NOCTTY (a FIFO
// without a writer would block open() itself, and a planted device must not
// be touched), checks with fstat, then clears O_NONBLOCK. Errors name the
// path: a FIFO, socket, device or directory is EINVAL "not a regular file",
// a symlink ELOOP, others open's errno.
[[nodiscard]] Result<UniqueFd> open_regular(const std::string& path, int flags);

// A new descriptor of the same open file, O_CLOEXEC and never 0-2 (a
// received fd kept past the message that carried it). Errors: "dup: <why>".
[[nodiscard]] Result<UniqueFd> dup_cloexec(int fd);
// `len` bytes of private anonymous memory, nothing populated or reserved
// (MAP_NORESERVE). Errors name `what`.
[[nodiscard]] Result<Mapping> map_anonymous(size_t len, const std::string& what);

// The pages of anonymous mapping `m` go back to the kernel when it needs
// them (MADV_FREE); the mapping stays, and a later write takes a page anew.
void free_lazily(const Mapping& m);

// fstat(fd), naming `what` in the error.
[[nodiscard]] Result<struct stat> stat_of(int fd, const std::string& what);
// fstatfs(fd).f_type (HUGETLBFS_MAGIC, TMPFS_MAGIC, ...), naming `what` in the error.
[[nodiscard]] Result<uint64_t> fs_type_of(int fd, const std::string& what);
// A file system (fs_type_of) whose reads end by themselves: a local disk's
// (ext4, xfs, btrfs, f2fs, vfat, exfat, squashfs, erofs, ...) or memory's
// (tmpfs, hugetlbfs, ramfs). Not FUSE, whose server may never answer, nor a
// network file system, nor overlayfs (whose lower layer may be either), nor
// one this list does not know.
[[nodiscard]] bool reads_end_by_themselves(uint64_t fs_type);

using InodeSet = std::set<std::pair<dev_t, ino_t>>;
// Replaces `path` with `data` atomically: written to `path`.tmp (mode
// `mode` exactly, O_NOFOLLOW), fsynced, renamed over `path`, and the
// directory fsynced, so a crash leaves the old file or the new one, never a
// torn one. Errors name the file; the temporary file is removed on failure.
// Durability::Readers skips both fsyncs: a reader still sees the old file
// or the new one, never a torn one, but after a crash the file may be the
// old one, or the new name with none or only part of its bytes (for a file
// that is written again shortly anyway, and whose readers can tell; an
// fsync under writeback can take hundreds of milliseconds on an SD card).
enum class Durability { Crash, Readers };
[[nodiscard]] Status write_file_atomic(const std::string& path, std::string_view data, mode_t mode = 0600,
                                       Durability durability = Durability::Crash);
// The whole of regular file `path` (O_NOFOLLOW), at most `max_bytes`:
// ENOENT when it does not exist, EFBIG when it is larger.
[[nodiscard]] Result<std::vector<uint8_t>> read_small_file(const std::string& path, uint64_t max_bytes);

// The (device, inode) of `fd` for an InodeSet.
[[nodiscard]] Result<std::pair<dev_t, ino_t>> inode_of(int fd);
// How many of process `pid`'s open descriptors refer to one of `inodes`
// (reads /proc/PID/fd; the daemon runs as root). ESRCH when it is gone.
[[nodiscard]] Result<uint32_t> count_fds_referring_to(pid_t pid, const InodeSet& inodes);

}  // namespace airs::sys
