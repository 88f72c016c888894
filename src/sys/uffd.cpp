// SPDX-License-Identifier: Apache-2.0
#include "sys/uffd.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "sys/proc_handles.hpp"

namespace airs::sys {

Result<UniqueFd> uffd_create_syscall() {
  UniqueFd fd(static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)));
  if (!fd) return make_error(errno, "userfaultfd(2): {}", std::strerror(errno));
  return fd;
}

Result<UniqueFd> uffd_create_device(const std::string& device) {
  UniqueFd dev(::open(device.c_str(), O_RDWR | O_CLOEXEC));
  if (!dev) return make_error(errno, "open {}: {}", device, std::strerror(errno));
  UniqueFd fd(::ioctl(dev.get(), USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK));
  if (!fd) return make_error(errno, "USERFAULTFD_IOC_NEW on {}: {}", device, std::strerror(errno));
  return fd;
}

Result<UniqueFd> uffd_create() {
  auto dev = uffd_create_device();
  if (dev) return dev;
  auto sc = uffd_create_syscall();
  if (sc) return sc;
  const int dev_errno = dev.error().code;
  const int sys_errno = sc.error().code;
  return make_error(sys_errno,
                    "cannot create a userfaultfd: /dev/userfaultfd: {}; userfaultfd(2): {} "
                    "(grant access to /dev/userfaultfd, e.g. a udev rule for the client's group, or set "
                    "vm.unprivileged_userfaultfd=1; the kernel needs CONFIG_USERFAULTFD)",
                    std::strerror(dev_errno), std::strerror(sys_errno));
}

Result<uint64_t> uffd_api(int uffd, uint64_t features) {
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = features;
  if (::ioctl(uffd, UFFDIO_API, &api) != 0)
    return make_error(errno, "UFFDIO_API (features {:#x}): {} (kernel lacks a requested userfaultfd feature)",
                      features, std::strerror(errno));
  if ((api.features & features) != features)
    return make_error(EOPNOTSUPP, "userfaultfd features {:#x} requested, kernel offers {:#x}", features,
                      static_cast<uint64_t>(api.features));
  return static_cast<uint64_t>(api.features);
}

bool uffd_without_api(int fd) {
  uffdio_api api{};
  api.api = UFFD_API;
  return ::ioctl(fd, UFFDIO_API, &api) == 0;
}

Result<uint64_t> uffd_register(int uffd, uint64_t addr, uint64_t len, uint64_t mode) {
  uffdio_register reg{};
  reg.range.start = addr;
  reg.range.len = len;
  reg.mode = mode;
  if (::ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
    return make_error(errno, "UFFDIO_REGISTER [{:#x}, +{}) mode {:#x}: {}{}", addr, len, mode, std::strerror(errno),
                      errno == EPERM ? " (the mapping must come from an O_RDWR fd without write seals)" : "");
  return static_cast<uint64_t>(reg.ioctls);
}

Status uffd_unregister(int uffd, uint64_t addr, uint64_t len) {
  uffdio_range r{addr, len};
  if (::ioctl(uffd, UFFDIO_UNREGISTER, &r) != 0)
    return make_error(errno, "UFFDIO_UNREGISTER [{:#x}, +{}): {}", addr, len, std::strerror(errno));
  return {};
}

namespace {

// The shared loop of the range ioctls: the kernel stops at the first page it
// cannot handle and reports what it did; EAGAIN means "partial, call again".
template <typename Op>
Result<RangeResult> range_loop(const char* what, uint64_t addr, uint64_t len, uint64_t step, Op op) {
  RangeResult out;
  uint64_t pos = addr;
  const uint64_t end = addr + len;
  while (pos < end) {
    int64_t progress = 0;
    const int rc = op(pos, end - pos, progress);
    if (rc == 0) {
      out.done_bytes += end - pos;
      break;
    }
    const int err = errno;
    if (progress > 0) {
      out.done_bytes += static_cast<uint64_t>(progress);
      pos += static_cast<uint64_t>(progress);
      continue;  // EAGAIN with partial progress: resume where it stopped.
    }
    if (err == EAGAIN || err == EINTR) continue;
    if (err == EEXIST) {
      // The page at `pos` is already mapped for this owner: skip the rest of
      // its step (counted from `addr`: after a partial run `pos` may lie
      // inside one, and a whole step from there would skip part of the next).
      const uint64_t next = std::min(end, addr + ((pos - addr) / step + 1) * step);
      out.already_mapped_bytes += next - pos;
      pos = next;
      continue;
    }
    if (err == ESRCH) {
      out.owner_gone = true;
      break;
    }
    return make_error(err, "{} [{:#x}, +{}): {}", what, pos, end - pos, std::strerror(err));
  }
  return out;
}

}  // namespace

Result<RangeResult> uffd_continue(int uffd, uint64_t addr, uint64_t len, uint64_t step) {
  return range_loop("UFFDIO_CONTINUE", addr, len, step, [uffd](uint64_t a, uint64_t l, int64_t& progress) {
    uffdio_continue c{};
    c.range.start = a;
    c.range.len = l;
    const int rc = ::ioctl(uffd, UFFDIO_CONTINUE, &c);
    progress = rc == 0 ? static_cast<int64_t>(l) : c.mapped;
    return rc;
  });
}

Result<RangeResult> uffd_continue_fault(int uffd, uint64_t addr, uint64_t len, uint64_t fault, uint64_t page) {
  auto r = uffd_continue(uffd, addr, len, len);
  if (!r || r->owner_gone || r->already_mapped_bytes == 0 || page >= len) return r;
  const uint64_t at = fault - fault % page;
  if (at < addr || at + page > addr + len) return r;
  auto one = uffd_continue(uffd, at, page, page);
  if (!one) return std::move(one).error();
  r->done_bytes += one->done_bytes;
  r->owner_gone = one->owner_gone;
  return r;
}

Result<RangeResult> uffd_poison(int uffd, uint64_t addr, uint64_t len, uint64_t step) {
  return range_loop("UFFDIO_POISON", addr, len, step, [uffd](uint64_t a, uint64_t l, int64_t& progress) {
    uffdio_poison p{};
    p.range.start = a;
    p.range.len = l;
    const int rc = ::ioctl(uffd, UFFDIO_POISON, &p);
    progress = rc == 0 ? static_cast<int64_t>(l) : p.updated;
    return rc;
  });
}

Result<PoisonHow> uffd_poison_or_sigbus(int uffd, int pidfd, uint64_t addr, uint64_t len, uint64_t step) {
  auto r = uffd_poison(uffd, addr, len, step);
  if (r) {
    if (r->owner_gone) return make_error(ESRCH, "UFFDIO_POISON [{:#x}, +{}): the owner is gone", addr, len);
    return PoisonHow::Poisoned;
  }
  // A kernel without UFFDIO_POISON rejects the unknown ioctl with EINVAL (the
  // range itself is aligned: callers pass whole units).
  if (r.error().code != EINVAL && r.error().code != ENOTTY) return std::move(r).error();
  if (::syscall(SYS_pidfd_send_signal, pidfd, SIGBUS, nullptr, 0) != 0)
    return make_error(errno, "no UFFDIO_POISON in this kernel, and SIGBUS to the client failed: {}",
                      std::strerror(errno));
  return PoisonHow::Signalled;
}

Status uffd_wake(int uffd, uint64_t addr, uint64_t len) {
  uffdio_range r{addr, len};
  if (::ioctl(uffd, UFFDIO_WAKE, &r) != 0)
    return make_error(errno, "UFFDIO_WAKE [{:#x}, +{}): {}", addr, len, std::strerror(errno));
  return {};
}

bool is_userfaultfd(int fd) { return is_anon_inode(fd, "userfaultfd"); }

Status set_nonblocking(int fd) {
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
    return make_error(errno, "fcntl(O_NONBLOCK) on fd {}: {}", fd, std::strerror(errno));
  return {};
}

Status uffd_read_events(int uffd, std::vector<uffd_msg>& out) {
  out.clear();
  uffd_msg buf[32];
  for (;;) {
    const ssize_t n = ::read(uffd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return {};
      return make_error(errno, "read(userfaultfd): {}", std::strerror(errno));
    }
    if (n == 0) return {};
    const auto count = static_cast<size_t>(n) / sizeof(uffd_msg);
    out.insert(out.end(), buf, buf + count);
    if (count < 32) return {};
  }
}

}  // namespace airs::sys
