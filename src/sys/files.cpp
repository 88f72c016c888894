// SPDX-License-Identifier: Apache-2.0
#include "sys/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sys/fd.hpp"

namespace airs::sys {

Result<FileId> readable_file_identity(int fd, const std::string& what, Attributes attrs) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) return make_error(EINVAL, "{}: not an open file descriptor ({})", what, std::strerror(errno));
  if ((fl & O_PATH) != 0)
    return make_error(EINVAL, "{}: an O_PATH descriptor proves no read access; pass one opened for reading", what);
  if ((fl & O_ACCMODE) == O_WRONLY) return make_error(EINVAL, "{}: the descriptor is not open for reading", what);
  struct statx st {};
  const int flags = AT_EMPTY_PATH | (attrs == Attributes::Cached ? AT_STATX_DONT_SYNC : AT_STATX_SYNC_AS_STAT);
  if (::statx(fd, "", flags, STATX_BASIC_STATS, &st) != 0)
    return make_error(EINVAL, "{}: statx: {}", what, std::strerror(errno));
  if (!S_ISREG(st.stx_mode)) return make_error(EINVAL, "{}: not a regular file", what);
  FileId id;
  id.dev = makedev(st.stx_dev_major, st.stx_dev_minor);
  id.ino = st.stx_ino;
  id.size = st.stx_size;
  id.mtime_ns = int64_t{st.stx_mtime.tv_sec} * 1'000'000'000 + st.stx_mtime.tv_nsec;
  id.ctime_ns = int64_t{st.stx_ctime.tv_sec} * 1'000'000'000 + st.stx_ctime.tv_nsec;
  id.owner = st.stx_uid;
  id.mode = st.stx_mode;
  return id;
}

Status truncate_to_zero(int fd, const std::string& what) {
  if (::ftruncate(fd, 0) != 0) return make_error(errno, "{}: truncating: {}", what, std::strerror(errno));
  return {};
}

Status make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) == 0) return {};
  struct stat st {};
  if (errno == EEXIST && ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return {};
  return make_error(errno == 0 ? EEXIST : errno, "{}: {}", path, std::strerror(errno == 0 ? EEXIST : errno));
}

Status ensure_private_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return make_error(errno, "{}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return make_error(ENOTDIR, "{}: not a directory", path);
  if ((st.st_mode & 07777) != 0700) AIRS_TRY(chmod_path(path, 0700));
  return {};
}

Result<std::vector<std::string>> list_dir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return make_error(errno, "{}: {}", path, std::strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name(e->d_name);
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  return names;
}

Result<struct stat> lstat_path(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return make_error(errno, "{}: {}", path, std::strerror(errno));
  return st;
}

Result<struct stat> stat_path(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_error(errno, "{}: {}", path, std::strerror(errno));
  return st;
}

Status chmod_path(const std::string& path, mode_t mode) {
  if (::chmod(path.c_str(), mode) != 0) return make_error(errno, "{}: chmod 0{:o}: {}", path, mode, std::strerror(errno));
  return {};
}

Status remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return make_error(errno, "unlink {}: {}", path, std::strerror(errno));
  return {};
}

Status rename_file(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return make_error(errno, "rename {}: {}", from, std::strerror(errno));
  return {};
}

Status sync_dir(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd || ::fsync(fd.get()) != 0) return make_error(errno, "fsync {}: {}", path, std::strerror(errno));
  return {};
}

Result<size_t> read_at(int fd, void* dst, size_t len, uint64_t offset) {
  const iovec iov{dst, len};
  return read_at(fd, std::span<const iovec>(&iov, 1), offset);
}

Result<size_t> read_at(int fd, std::span<const iovec> iov, uint64_t offset) {
  for (;;) {
    const ssize_t n = ::preadv(fd, iov.data(), static_cast<int>(iov.size()), static_cast<off_t>(offset));
    if (n >= 0) return static_cast<size_t>(n);
    if (errno != EINTR) return make_error(errno, "read: {}", std::strerror(errno));
  }
}

Status write_all(int fd, std::span<const std::byte> data, size_t* written) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      if (written != nullptr) *written = done;
      return make_error(errno, "write: {}", std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  if (written != nullptr) *written = done;
  return {};
}

Status close_file(UniqueFd fd) {
  if (::close(fd.release()) != 0) return make_error(errno, "close: {}", std::strerror(errno));
  return {};
}

Status set_mtime(int fd, const std::string& path, const timespec& mtime) {
  const timespec times[2] = {{0, UTIME_OMIT}, mtime};
  const int r = fd >= 0 ? ::futimens(fd, times) : ::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW);
  if (r != 0) return make_error(errno, "{}: {}", path, std::strerror(errno));
  return {};
}

Status check_readable_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_error(errno, "{}: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return make_error(EINVAL, "{} is not a regular file", path);
  if (::access(path.c_str(), R_OK) != 0) return make_error(errno, "{} is not readable: {}", path, std::strerror(errno));
  return {};
}

Result<UniqueFd> open_file(const std::string& path, int flags, mode_t mode) {
  UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC, mode));
  if (!fd) return make_error(errno, "{}: {}", path, std::strerror(errno));
  return fd;
}

Result<UniqueFd> open_regular(const std::string& path, int flags) {
  UniqueFd fd(::open(path.c_str(), flags | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
  if (!fd) return make_error(errno, "{}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return make_error(errno, "{}: fstat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return make_error(EINVAL, "{}: not a regular file", path);
  if ((flags & O_NONBLOCK) == 0 && ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK) != 0)
    return make_error(errno, "{}: clearing O_NONBLOCK: {}", path, std::strerror(errno));
  return fd;
}

Result<Mapping> map_anonymous(size_t len, const std::string& what) {
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return make_error(errno, "no {} of anonymous memory for {}: {}", len, what, std::strerror(errno));
  return Mapping(p, len);
}

void free_lazily(const Mapping& m) {
  if (m.valid()) (void)::madvise(m.get(), m.size(), MADV_FREE);
}

Result<UniqueFd> dup_cloexec(int fd) {
  UniqueFd r(::fcntl(fd, F_DUPFD_CLOEXEC, 3));
  if (!r) return make_error(errno, "dup: {}", std::strerror(errno));
  return r;
}

Result<struct stat> stat_of(int fd, const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "{}: fstat: {}", what, std::strerror(errno));
  return st;
}

Result<uint64_t> fs_type_of(int fd, const std::string& what) {
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) return make_error(errno, "{}: fstatfs: {}", what, std::strerror(errno));
  return static_cast<uint64_t>(fs.f_type);
}

bool reads_end_by_themselves(uint64_t fs_type) {
  switch (fs_type) {
    case 0xEF53:      // ext2, ext3, ext4
    case 0x58465342:  // xfs
    case 0x9123683E:  // btrfs
    case 0xF2F52010:  // f2fs
    case 0x4d44:      // vfat (msdos)
    case 0x2011BAB0:  // exfat
    case 0x5346544e:  // ntfs3
    case 0x73717368:  // squashfs
    case 0xE0F5E1E2:  // erofs
    case 0x01021994:  // tmpfs
    case 0x958458f6:  // hugetlbfs
    case 0x858458f6:  // ramfs
    case 0x2fc12fc1:  // zfs
    case 0xca451a4e:  // bcachefs
      return true;
    default:
      return false;
  }
}

Result<std::pair<dev_t, ino_t>> inode_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "fstat fd {}: {}", fd, std::strerror(errno));
  return std::pair{st.st_dev, st.st_ino};
}

Result<uint32_t> count_fds_referring_to(pid_t pid, const InodeSet& inodes) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return make_error(errno == ENOENT ? ESRCH : errno, "{}: {}", dir, std::strerror(errno));
  uint32_t n = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    // statx follows the magic link to the open file itself (memfds
    // included). AT_STATX_DONT_SYNC: the inode number from the inode in
    // memory; the file system is never asked, so a client's fd on a hung
    // NFS mount or on a FUSE server it runs cannot stall the daemon here.
    struct statx stx {};
    if (::statx(::dirfd(d), e->d_name, AT_STATX_DONT_SYNC, STATX_INO, &stx) != 0) continue;
    if (inodes.contains({makedev(stx.stx_dev_major, stx.stx_dev_minor), static_cast<ino_t>(stx.stx_ino)})) ++n;
  }
  ::closedir(d);
  return n;
}

Status write_file_atomic(const std::string& path, std::string_view data, mode_t mode, Durability durability) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode));
  if (!fd) return make_error(errno, "{}: {}", tmp, std::strerror(errno));
  auto fail = [&](int e) -> Status {
    ::unlink(tmp.c_str());
    return make_error(e, "{}: {}", tmp, std::strerror(e));
  };
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  // O_TRUNC on an existing tmp keeps its mode: make it ours.
  if (::fchmod(fd.get(), mode) != 0) return fail(errno);
  if (durability == Durability::Crash && ::fsync(fd.get()) != 0) return fail(errno);
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return make_error(e, "{}: {}", path, std::strerror(e));
  }
  if (durability == Durability::Readers) return {};
  // The rename itself is durable once the directory is.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  (void)sync_dir(dir);
  return {};
}

Result<std::vector<uint8_t>> read_small_file(const std::string& path, uint64_t max_bytes) {
  auto opened = open_regular(path, O_RDONLY);
  if (!opened) return std::move(opened).error();
  const UniqueFd fd = std::move(opened).value();
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return make_error(errno, "{}: {}", path, std::strerror(errno));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return make_error(EFBIG, "{}: {} bytes, more than the {} allowed", path, st.st_size, max_bytes);
  std::vector<uint8_t> out(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return make_error(errno, "{}: {}", path, std::strerror(errno));
    if (n == 0) break;  // shrank while read: what is there (the parser judges it)
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

}  // namespace airs::sys
