// SPDX-License-Identifier: Apache-2.0
// Small process-level handles: pidfds (client and daemon liveness), eventfds
// and wake channels (notifications), sealed memfds (read-only shared status pages).
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

// pidfd_open(pid): becomes readable (EPOLLIN) when the process exits.
// Errors: ESRCH if it is already gone.
[[nodiscard]] Result<UniqueFd> pidfd_open(pid_t pid);
// True if the process behind the pidfd has exited (poll with zero timeout).
[[nodiscard]] bool pidfd_exited(int pidfd);
// pidfd_send_signal(pidfd, sig). Errors: ESRCH (gone), EPERM.
[[nodiscard]] Status pidfd_signal(int pidfd, int sig);

// True if `fd` is an anonymous inode of `kind` (its /proc/self/fd link is
// "anon_inode:[kind]": "eventfd", "userfaultfd", ...). The daemon checks
// the fds clients send before it reads or writes them.
[[nodiscard]] bool is_anon_inode(int fd, std::string_view kind);
// True if `fd` is an eventfd.
[[nodiscard]] bool is_eventfd(int fd);
// eventfd(0, EFD_CLOEXEC|EFD_NONBLOCK).
[[nodiscard]] Result<UniqueFd> eventfd_create();
// Adds `n` to the counter; EAGAIN (counter saturated) counts as delivered.
[[nodiscard]] Status eventfd_signal(int efd, uint64_t n = 1);
// Reads and returns the counter (0 if nothing was pending).
uint64_t eventfd_drain(int efd);

// A wake-up the daemon gives a client (a KV session's eviction notices): a
// connected SOCK_SEQPACKET pair. The daemon keeps `ours` and hands out
// `theirs`, which polls readable (POLLIN) while a wake-up waits. The other
// way the client sends its KV access reports (wire/kv_access.hpp), which
// the daemon reads from `ours` (non-blocking, a bounded number at a time;
// what it does not read waits in a queue the socket's buffer bounds). Not an
// eventfd: a client shares an eventfd's O_NONBLOCK flag with the daemon
// (one open file), could clear it and saturate the counter, and the
// daemon's next write would then block its loop for good. A socket's
// MSG_DONTWAIT holds whatever either side sets on its own end.
struct WakeChannel {
  UniqueFd ours;
  UniqueFd theirs;
};
[[nodiscard]] Result<WakeChannel> wake_channel();
// Makes `theirs` readable unless a wake-up already waits there (at most one
// ever does: the client's reads cannot fall behind). Never blocks; a client
// that closed its end is not an error.
void wake(int ours);
// Takes every waiting wake-up of a notice fd without blocking, whatever its
// flags: a wake channel's end, or an eventfd (older daemons; read only if
// poll says it is readable). Returns how many there were. After the daemon
// closed its end, the fd polls POLLIN|POLLHUP for good and this returns 0:
// the session is gone, stop polling it.
uint64_t drain_wakeups(int fd);

// Names the calling thread (`name`: 15 characters at most) and lowers its
// scheduling priority to nice 10, so the work it does (parsing a hostile
// GGUF header) takes no CPU the event loop's thread wants. Best effort.
void become_background_thread(const char* name);

// A SOCK_SEQPACKET socket pair (O_CLOEXEC) for messages both ways (one
// record per send, boundaries kept). Errors: "socketpair: <why>".
[[nodiscard]] Result<std::pair<UniqueFd, UniqueFd>> message_channel();
// EBADF naming `what` unless `fd` is a connected SOCK_SEQPACKET socket (a
// listening or never connected one would report EPOLLHUP for ever).
[[nodiscard]] Status check_message_socket(int fd, const std::string& what);
// One message of a non-blocking message socket into `buf`.
struct MessageRead {
  enum State : uint8_t { Message, Again, Closed, Failed } state = Again;
  size_t bytes = 0;  // Message: its length (truncated to the buffer)
};
[[nodiscard]] MessageRead read_message(int fd, void* buf, size_t len);
// Sends one message without blocking and without SIGPIPE (MSG_DONTWAIT |
// MSG_NOSIGNAL, async-signal-safe). False if it could not go now (a full
// socket, a closed peer).
[[nodiscard]] bool send_message(int fd, const void* buf, size_t len);

// poll(2) on `n` descriptors, `timeout_ms` (-1: forever). Returns how many
// have events; EINTR comes back as an error like any other.
[[nodiscard]] Result<int> poll_fds(pollfd* fds, size_t n, int timeout_ms);

// Copies `n` bytes from `src` to `dst`, both in this process, through the
// kernel (process_vm_readv on our own pid): a page of either that cannot be
// had (a shared file that another process truncated under the mapping)
// comes back as EFAULT instead of SIGBUS. For memory that clients can
// resize: KV arenas.
[[nodiscard]] Status copy_checked(void* dst, const void* src, size_t n);

// A memfd (MFD_CLOEXEC|MFD_ALLOW_SEALING) of `size` bytes.
[[nodiscard]] Result<UniqueFd> memfd_create_sealable(const std::string& name, uint64_t size);
// Seals against shrink and grow (the size is fixed; writes stay allowed).
[[nodiscard]] Status seal_size(int fd, const std::string& what);
// Seals against shrink, grow and future writes; mappings made before keep
// their write access (the daemon's), later ones cannot get any.
[[nodiscard]] Status memfd_seal_readonly(int fd);
// A shared page the daemon writes and hands out read-only (model status
// pages, KV eviction notice pages): a memfd of `size` bytes, mapped
// read-write here, then sealed (shrink, grow, future writes, seals). The
// seal is a security property: a failure to seal is an error, never ignored.
class SealedMemfd {
 public:
  // Errors: memfd_create, ftruncate, mmap, F_ADD_SEALS, the read-only reopen.
  static Result<SealedMemfd> create(const std::string& name, uint64_t size);
  SealedMemfd() = default;
  [[nodiscard]] std::byte* bytes() const { return map_.bytes(); }
  [[nodiscard]] uint64_t size() const { return map_.size(); }
  // An O_RDONLY file description to hand out (owned here; dup or reopen to send).
  [[nodiscard]] int read_only_fd() const { return ro_.get(); }
  // A new O_RDONLY file description for one client.
  [[nodiscard]] Result<UniqueFd> open_read_only() const;

 private:
  UniqueFd rw_;
  UniqueFd ro_;
  Mapping map_;
};

// A memfd another process made and sealed against shrinking and growing
// (F_SEAL_SHRINK|F_SEAL_GROW), of at least `min_bytes`, mapped read-only
// and shared (its writer's changes show). The seals make it safe to read:
// nobody can truncate it under the mapping. Errors: EBADF naming `what`
// (not a memfd, not sealed so, too small), mmap's.
[[nodiscard]] Result<Mapping> map_sealed_read_only(int fd, uint64_t min_bytes, const std::string& what);

// A new O_RDONLY open file description of `fd` (via /proc/self/fd), so its
// holder cannot mmap it writable.
[[nodiscard]] Result<UniqueFd> reopen(int fd, int flags);

// futex wake of every waiter on a 32-bit word in shared memory (non-private:
// waiters are other processes).
void futex_wake_all(const uint32_t* word);
// futex wait while *word == expected, at most `timeout_ns` (negative: forever).
// Returns false on timeout.
bool futex_wait(const uint32_t* word, uint32_t expected, int64_t timeout_ns);

}  // namespace airs::sys
