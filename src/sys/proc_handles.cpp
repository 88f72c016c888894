#include "sys/proc_handles.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

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

Status eventfd_signal(int efd, uint64_t n) {
  if (::write(efd, &n, sizeof n) == static_cast<ssize_t>(sizeof n) || errno == EAGAIN) return {};
  return make_error(errno, "eventfd write: {}", std::strerror(errno));
}

uint64_t eventfd_drain(int efd) {
  uint64_t v = 0;
  if (::read(efd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) return 0;
  return v;
}

Result<std::pair<UniqueFd, UniqueFd>> message_channel() {
  int p[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p) != 0)
    return make_error(errno, "socketpair: {}", std::strerror(errno));
  std::pair<UniqueFd, UniqueFd> out{UniqueFd(p[0]), UniqueFd(p[1])};
  ::shutdown(p[1], SHUT_RD);
  return out;
}

Result<int> poll_fds(pollfd* fds, size_t n, int timeout_ms) {
  const int r = ::poll(fds, static_cast<nfds_t>(n), timeout_ms);
  if (r < 0) return make_error(errno, "poll: {}", std::strerror(errno));
  return r;
}

Result<UniqueFd> memfd_create_sealable(const std::string& name, uint64_t size) {
  UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return make_error(errno, "memfd_create({}): {}", name, std::strerror(errno));
  // 0777 by default; the seals keep it read-only for others anyway.
  if (::fchmod(fd.get(), 0600) != 0) return make_error(errno, "memfd {}: fchmod 0600: {}", name, std::strerror(errno));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    return make_error(errno, "memfd {}: ftruncate {}: {}", name, size, std::strerror(errno));
  return fd;
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
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool futex_wait(const uint32_t* word, uint32_t expected, int64_t timeout_ns) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1'000'000'000);
    tsp = &ts;
  }
  const long rc = ::syscall(SYS_futex, word, FUTEX_WAIT, expected, tsp, nullptr, 0);
  return !(rc != 0 && errno == ETIMEDOUT);
}

}  // namespace airs::sys
