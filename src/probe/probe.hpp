// SPDX-License-Identifier: Apache-2.0
// The start-up platform probe: reads procfs/sysfs/devfs under roots given as
// parameters (tests point them at a fake tree) and tries the few kernel
// calls that only an attempt can answer, through KernelOps (tests replace
// them to fake ENOSYS, EPERM, a feature mask).
//
// What is read, relative to the roots:
//   proc: filesystems, meminfo, cmdline, self/mountinfo, pressure/memory,
//         sys/kernel/osrelease, sys/vm/unprivileged_userfaultfd,
//         sys/kernel/io_uring_disabled
//   sys:  kernel/mm/hugepages/hugepages-<kB>kB/{nr,free}_hugepages,
//         kernel/mm/transparent_hugepage/{enabled,shmem_enabled},
//         devices/system/node/node<N>
//   dev:  userfaultfd
// Mount points from mountinfo under /proc or /sys are looked up below
// proc_root / sys_root, so cgroup2's cgroup.controllers comes from the tree.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "probe/capabilities.hpp"
#include "util/result.hpp"

namespace airs::probe {

struct ProbePaths {
  std::string proc_root = "/proc";
  std::string sys_root = "/sys";
  std::string dev_root = "/dev";
  // A model file or the models directory: O_DIRECT is tried there. Empty =
  // not probed.
  std::string odirect_path;
};

// The calls that change nothing lasting but need the kernel to answer.
// Each returns the kernel's verdict; an Error's code is the errno.
struct KernelOps {
  // userfaultfd(O_CLOEXEC|O_NONBLOCK), then UFFDIO_API asking for nothing:
  // the features the kernel offers. The fd is closed before returning.
  std::function<Result<uint64_t>()> uffd_syscall;
  // The same through `device` (/dev/userfaultfd): open O_RDWR, USERFAULTFD_IOC_NEW.
  std::function<Result<uint64_t>(const std::string& device)> uffd_device;
  // io_uring_setup of a tiny ring, torn down at once.
  std::function<Status()> io_uring_setup;
  // Opens `path` O_RDWR|O_NONBLOCK and writes "some 150000 2000000\0";
  // the trigger is removed before returning.
  std::function<Status(const std::string& path)> psi_trigger;
  // sysconf(_SC_PAGESIZE).
  std::function<uint64_t()> page_size;
  // Opens a file with O_DIRECT: `path` itself if it is a file, else an
  // unnamed O_TMPFILE in the directory (falling back to its first regular
  // file when the file system has no O_TMPFILE). EINVAL = no O_DIRECT.
  std::function<Status(const std::string& path)> open_direct;
  // Reads a whole procfs/sysfs file (sys::read_text_file). A seam only so a
  // test can make one file fail the way a kernel file does (EOPNOTSUPP from
  // /proc/pressure/memory when PSI is off), which a fake tree cannot.
  std::function<Result<std::string>(const std::string& path)> read_file;

  // The real kernel calls.
  [[nodiscard]] static KernelOps real();
};

// Probes everything in Capabilities. Never fails: what cannot be found is
// reported as absent, and a reader that fails for another reason adds a line
// to Capabilities::problems. Runs on the calling thread; takes a few
// milliseconds (one uffd, one ring, one PSI trigger, one O_DIRECT open).
[[nodiscard]] Capabilities probe(const ProbePaths& paths, const KernelOps& ops = KernelOps::real());

}  // namespace airs::probe
