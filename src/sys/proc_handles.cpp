// SPDX-License-Identifier: Apache-2.0
#include "sys/proc_handles.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <linux/magic.h>
#include <linux/sockios.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include "sys/own_devices.hpp"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace airs::sys {

Result<UniqueFd> pidfd_open(pid_t pid) {
  UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!fd) return make_error(errno, "pidfd_open({}): {}", pid, std::strerror(errno));
  // pidfds are always O_CLOEXEC.
  return fd;
}

bool pidfd_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP)) != 0;
}

Result<UniqueFd> eventfd_create() {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd) return make_error(errno, "eventfd: {}", std::strerror(errno));
  return fd;
}

Status pidfd_signal(int pidfd, int sig) {
  if (::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0) return {};
  return make_error(errno, "pidfd_send_signal({}): {}", sig, std::strerror(errno));
}

Result<Mapping> map_sealed_read_only(int fd, uint64_t min_bytes, const std::string& what) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) return make_error(EINVAL, "{} is not a memfd that can be sealed ({})", what, std::strerror(errno));
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    return make_error(EINVAL, "{} is not sealed against shrinking and growing (F_SEAL_SHRINK|F_SEAL_GROW)", what);
  // Only shmem and hugetlbfs files take seals, so this asks no server. The
  // daemon reads the bits with plain loads: a hole punched in shmem reads
  // as zeros, but one in a file of huge pages is a SIGBUS once no free huge
  // page is left to fill it (and its unmap needs an aligned length).
  struct statfs fs {};
  if (::fstatfs(fd, &fs) != 0) return make_error(errno, "{}: fstatfs: {}", what, std::strerror(errno));
  if (fs.f_type == HUGETLBFS_MAGIC)
    return make_error(EINVAL, "{} is a memfd of huge pages (MFD_HUGETLB); pass a memfd of base pages", what);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "{}: fstat: {}", what, std::strerror(errno));
  if (static_cast<uint64_t>(st.st_size) < min_bytes)
    return make_error(EINVAL, "{} holds {} bytes, {} needed", what, st.st_size, min_bytes);
  void* p = ::mmap(nullptr, min_bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return make_error(errno, "{}: mmap: {}", what, std::strerror(errno));
  return Mapping(p, min_bytes);
}

bool is_anon_inode(int fd, std::string_view kind) {
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  char buf[64] = {};
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  const std::string_view got(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return got.size() == kind.size() + 13 && got.starts_with("anon_inode:[") && got.substr(12, kind.size()) == kind &&
         got.back() == ']';
}

bool is_eventfd(int fd) { return is_anon_inode(fd, "eventfd"); }

Status eventfd_signal(int efd, uint64_t n) {
  if (::write(efd, &n, sizeof n) == static_cast<ssize_t>(sizeof n) || errno == EAGAIN) return {};
  return make_error(errno, "eventfd write: {}", std::strerror(errno));
}

uint64_t eventfd_drain(int efd) {
  uint64_t v = 0;
  if (::read(efd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) return 0;
  return v;
}

Result<WakeChannel> wake_channel() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0)
    return make_error(errno, "socketpair: {}", std::strerror(errno));
  return WakeChannel{UniqueFd(sv[0]), UniqueFd(sv[1])};
}

void wake(int ours) {
  // Bytes sent and not yet read by the peer: a wake-up still waits.
  int unread = 0;
  if (::ioctl(ours, SIOCOUTQ, &unread) == 0 && unread > 0) return;
  const uint64_t one = 1;
  // EAGAIN: the peer's queue is full, so it is readable; EPIPE/ECONNRESET:
  // the client closed its end. Neither is the daemon's concern.
  (void)::send(ours, &one, sizeof one, MSG_DONTWAIT | MSG_NOSIGNAL);
}

uint64_t drain_wakeups(int fd) {
  uint64_t n = 0;
  for (;;) {
    uint64_t v = 0;
    const ssize_t r = ::recv(fd, &v, sizeof v, MSG_DONTWAIT);
    if (r > 0) {
      ++n;
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == ENOTSOCK) {
      pollfd p{fd, POLLIN, 0};
      return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0 ? eventfd_drain(fd) : 0;
    }
    return n;
  }
}

void become_background_thread(const char* name) {
  ::pthread_setname_np(::pthread_self(), name);
  // Linux: a thread's nice value is its own (PRIO_PROCESS with its tid).
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
}

Result<std::pair<UniqueFd, UniqueFd>> message_channel() {
  int p[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p) != 0)
    return make_error(errno, "socketpair: {}", std::strerror(errno));
  return std::pair<UniqueFd, UniqueFd>{UniqueFd(p[0]), UniqueFd(p[1])};
}

Status check_message_socket(int fd, const std::string& what) {
  int type = 0, listening = 0;
  socklen_t tlen = sizeof type, llen = sizeof listening;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_SEQPACKET)
    return make_error(EINVAL, "{} is not a SOCK_SEQPACKET socket", what);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &llen) != 0 || listening != 0)
    return make_error(EINVAL, "{} is a listening socket, not one end of a connected pair", what);
  sockaddr_storage peer{};
  socklen_t plen = sizeof peer;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0)
    return make_error(EINVAL, "{} is not connected ({})", what, std::strerror(errno));
  return {};
}

MessageRead read_message(int fd, void* buf, size_t len) {
  for (;;) {
    const ssize_t n = ::recv(fd, buf, len, MSG_DONTWAIT);
    if (n > 0) return {MessageRead::Message, static_cast<size_t>(n)};
    if (n == 0) return {MessageRead::Closed, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {MessageRead::Again, 0};
    return {MessageRead::Failed, 0};
  }
}

bool send_message(int fd, const void* buf, size_t len) {
  return ::send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

Result<int> poll_fds(pollfd* fds, size_t n, int timeout_ms) {
  const int r = ::poll(fds, static_cast<nfds_t>(n), timeout_ms);
  if (r < 0) return make_error(errno, "poll: {}", std::strerror(errno));
  return r;
}

Status copy_checked(void* dst, const void* src, size_t n) {
  size_t done = 0;
  while (done < n) {
    iovec local{static_cast<char*>(dst) + done, n - done};
    iovec remote{const_cast<char*>(static_cast<const char*>(src)) + done, n - done};
    const ssize_t r = ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      return make_error(r < 0 ? errno : EFAULT, "copying {} bytes at {}: {} (the file under the mapping was cut)", n - done,
                        static_cast<const void*>(static_cast<const char*>(src) + done),
                        std::strerror(r < 0 ? errno : EFAULT));
    done += static_cast<size_t>(r);
  }
  return {};
}

Result<UniqueFd> memfd_create_sealable(const std::string& name, uint64_t size) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return make_error(errno, "memfd_create({}): {}", name, std::strerror(errno));
  note_own_device(fd.get());
  // 0777 by default; the seals keep it read-only for others anyway.
  if (::fchmod(fd.get(), 0600) != 0) return make_error(errno, "memfd {}: fchmod 0600: {}", name, std::strerror(errno));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    return make_error(errno, "memfd {}: ftruncate {}: {}", name, size, std::strerror(errno));
  return fd;
}

Status seal_size(int fd, const std::string& what) {
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
    return make_error(errno, "sealing {} against shrinking and growing: {}", what, std::strerror(errno));
  return {};
}

Status memfd_seal_readonly(int fd) {
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0)
    return make_error(errno, "sealing memfd: {}", std::strerror(errno));
  return {};
}

Result<SealedMemfd> SealedMemfd::create(const std::string& name, uint64_t size) {
  SealedMemfd m;
  auto fd = memfd_create_sealable(name, size);
  if (!fd) return std::move(fd).error();
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  if (p == MAP_FAILED) return make_error(errno, "memfd {}: mmap {} bytes: {}", name, size, std::strerror(errno));
  m.map_ = Mapping(p, size);
  if (auto st = memfd_seal_readonly(fd->get()); !st)
    return make_error(st.error().code, "memfd {}: {} (it would stay writable for whoever gets it)", name,
                      st.error().message);
  auto ro = reopen(fd->get(), O_RDONLY);
  if (!ro) return std::move(ro).error();
  m.rw_ = std::move(fd).value();
  m.ro_ = std::move(ro).value();
  return m;
}

Result<UniqueFd> SealedMemfd::open_read_only() const { return reopen(ro_.get(), O_RDONLY); }

Result<UniqueFd> reopen(int fd, int flags) {
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  UniqueFd out(::open(path.c_str(), flags | O_CLOEXEC));
  if (!out) return make_error(errno, "reopening fd {} ({}): {}", fd, path, std::strerror(errno));
  return out;
}

void futex_wake_all(const uint32_t* word) {
  ::syscall(SYS_futex, word, long{FUTEX_WAKE}, long{INT_MAX}, nullptr, nullptr, 0L);
}

bool futex_wait(const uint32_t* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000);
    tsp = &ts;
  }
  const long rc = ::syscall(SYS_futex, word, long{FUTEX_WAIT}, long{expected}, tsp, nullptr, 0L);
  return !(rc != 0 && errno == ETIMEDOUT);
}

}  // namespace airs::sys
