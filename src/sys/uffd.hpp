// SPDX-License-Identifier: Apache-2.0
// userfaultfd: creation, feature negotiation, registration and the range
// ioctls the pager and the client library use. Debian 12's linux-libc-dev is
// older than the kernels we run on, so missing constants are defined here.
//
// Every function returns the kernel's verdict as a value; ESRCH from an ioctl
// means the process owning the registration is gone (a uffd never reports
// POLLHUP), which callers treat as "drop this client".
#pragma once

#include <linux/userfaultfd.h>

#include <cstdint>
#include <vector>

#include "sys/fd.hpp"
#include "util/result.hpp"

#ifndef UFFD_FEATURE_MINOR_HUGETLBFS
#define UFFD_FEATURE_MINOR_HUGETLBFS (1 << 9)
#endif
#ifndef UFFD_FEATURE_MINOR_SHMEM
#define UFFD_FEATURE_MINOR_SHMEM (1 << 10)
#endif
#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif
#ifndef UFFDIO_REGISTER_MODE_MINOR
#define UFFDIO_REGISTER_MODE_MINOR ((__u64)1 << 2)
#endif
#ifndef _UFFDIO_CONTINUE
#define _UFFDIO_CONTINUE (0x07)
#endif
#ifndef _UFFDIO_POISON
#define _UFFDIO_POISON (0x08)
struct uffdio_poison {
  struct uffdio_range range;
#define UFFDIO_POISON_MODE_DONTWAKE ((__u64)1 << 0)
  __u64 mode;
  __s64 updated;
};
#define UFFDIO_POISON _IOWR(UFFDIO, _UFFDIO_POISON, struct uffdio_poison)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC 0xAA
#define USERFAULTFD_IOC_NEW _IO(USERFAULTFD_IOC, 0x00)
#endif

namespace airs::sys {

// A new userfaultfd (O_CLOEXEC|O_NONBLOCK: a blocking uffd polls as POLLERR).
// Tries /dev/userfaultfd (USERFAULTFD_IOC_NEW) first, which works for users
// the device's permissions allow even with vm.unprivileged_userfaultfd=0,
// then the userfaultfd(2) syscall. Errors name both attempts.
[[nodiscard]] Result<UniqueFd> uffd_create();
// Each way alone (the probe reports them apart), O_CLOEXEC|O_NONBLOCK.
// Errors: "userfaultfd(2): <why>"; "open <device>: <why>" or
// "USERFAULTFD_IOC_NEW on <device>: <why>".
[[nodiscard]] Result<UniqueFd> uffd_create_syscall();
[[nodiscard]] Result<UniqueFd> uffd_create_device(const std::string& device = "/dev/userfaultfd");

// UFFDIO_API handshake asking for `features`. Returns the features the kernel
// granted; fails (EOPNOTSUPP) if any requested one is missing.
[[nodiscard]] Result<uint64_t> uffd_api(int uffd, uint64_t features);

// Register [addr, addr+len) with `mode` (UFFDIO_REGISTER_MODE_*). Returns the
// ioctls the kernel allows on the range.
[[nodiscard]] Result<uint64_t> uffd_register(int uffd, uint64_t addr, uint64_t len, uint64_t mode);
[[nodiscard]] Status uffd_unregister(int uffd, uint64_t addr, uint64_t len);

// Outcome of a range CONTINUE/POISON over [addr, addr+len), whose length is a
// multiple of `step` (the huge page): pages the kernel mapped now, pages that
// were already mapped (EEXIST: harmless), and whether the owner is gone.
struct RangeResult {
  uint64_t done_bytes = 0;
  uint64_t already_mapped_bytes = 0;
  bool owner_gone = false;  // ESRCH
};

// UFFDIO_CONTINUE over the range, looping on EAGAIN partial progress and
// skipping pages that are already mapped (EEXIST) one `step` at a time.
// Wakes the faulting threads in the range. Errors: anything other than
// EAGAIN/EEXIST/ESRCH (EFAULT: page not in the page cache; EINVAL: misaligned;
// ENOENT: the range is no longer registered/mapped).
[[nodiscard]] Result<RangeResult> uffd_continue(int uffd, uint64_t addr, uint64_t len, uint64_t step);

// Answers a fault at `fault` inside the unit [addr, +len): CONTINUEs the
// unit as above, and when part of it was already mapped, the faulting page
// (`page`: the mapping's page, the huge page on hugetlbfs, the base page on
// shmem) by itself as well. On shmem a unit can be partly mapped: a
// CONTINUE cut short by a fatal signal (a daemon killed mid-ioctl), or a
// client that dropped part of its entries (MADV_DONTNEED). The unit's
// CONTINUE then stops at its first mapped page and skips the rest of the
// step, and without the second call the faulting thread would fault again
// on the same page for ever. So the faulting page is always mapped when
// this returns, and the caller's wake lets its thread go on.
[[nodiscard]] Result<RangeResult> uffd_continue_fault(int uffd, uint64_t addr, uint64_t len, uint64_t fault,
                                                      uint64_t page);

// UFFDIO_POISON: faulting threads in the range get SIGBUS (BUS_ADRERR).
[[nodiscard]] Result<RangeResult> uffd_poison(int uffd, uint64_t addr, uint64_t len, uint64_t step);

// How a read error reached a client: UFFDIO_POISON (the faulting threads get
// SIGBUS with BUS_ADRERR at the address, as from a real bad page), or, on a
// kernel without it (before 6.6, e.g. Debian 12's 6.1: the ioctl is EINVAL),
// a SIGBUS sent to the whole process through its pidfd (si_code SI_USER, no
// address; the default action kills it, so it never waits forever and never
// reads zeros; a SIGBUS handler runs in whichever thread the kernel picks).
enum class PoisonHow { Poisoned, Signalled };

// UFFDIO_POISON over the range; where the kernel lacks it, SIGBUS to the
// registration's owner through `pidfd`. Errors: those of uffd_poison other
// than a missing ioctl, and pidfd_send_signal's (ESRCH: the owner is gone).
[[nodiscard]] Result<PoisonHow> uffd_poison_or_sigbus(int uffd, int pidfd, uint64_t addr, uint64_t len,
                                                      uint64_t step);

// UFFDIO_WAKE: wake threads blocked on faults in the range so they retry
// (and raise the fault again if the page is still missing).
[[nodiscard]] Status uffd_wake(int uffd, uint64_t addr, uint64_t len);

// True if `fd` is a userfaultfd (its /proc/self/fd link names one). The
// daemon checks fds clients send before reading from them.
[[nodiscard]] bool is_userfaultfd(int fd);
// True when userfaultfd `fd` never had its UFFDIO_API handshake (its reads
// fail with EINVAL and it polls EPOLLERR for ever). Asks the kernel with a
// handshake of its own, which fails (EINVAL) on a descriptor that had one;
// one that had none is left initialised with no features, and is refused.
[[nodiscard]] bool uffd_without_api(int fd);
// Sets O_NONBLOCK on the (shared) open file description: a blocking uffd in
// the daemon's event loop would stall it.
[[nodiscard]] Status set_nonblocking(int fd);

// Reads every pending message (non-blocking uffd) into `out` (cleared first).
// A dead owner's uffd just reads EAGAIN forever: liveness comes from a pidfd.
[[nodiscard]] Status uffd_read_events(int uffd, std::vector<uffd_msg>& out);

}  // namespace airs::sys
