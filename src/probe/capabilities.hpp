// SPDX-License-Identifier: Apache-2.0
// What the running kernel offers airs-memd, as plain data. Filled by probe()
// (probe.hpp) at start-up; read by the pure mode choice (mode.hpp) and shown
// in `airsctl status`. Nothing here does I/O.
//
// Errno fields hold a positive errno of the attempt that failed, 0 when it
// worked or was not made; the bool next to each says which.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace airs::probe {

struct HugePageSizeInfo {
  uint64_t bytes = 0;  // e.g. 2 MiB; 32 MiB on a 16 KiB-page arm64 kernel
  uint64_t nr = 0;     // pages the kernel keeps in the pool (nr_hugepages)
  uint64_t free = 0;   // free_hugepages
};

struct HugetlbfsMount {
  std::string path;        // mount point as the kernel names it
  uint64_t page_size = 0;  // pagesize= option, or the default size
};

struct HugetlbfsCaps {
  bool in_filesystems = false;            // "hugetlbfs" listed in /proc/filesystems
  std::vector<HugePageSizeInfo> sizes;    // /sys/kernel/mm/hugepages, ascending
  uint64_t default_size = 0;              // /proc/meminfo Hugepagesize; 0 = none
  std::vector<HugetlbfsMount> mounts;     // /proc/self/mountinfo
  // The file system exists and has at least one page size.
  [[nodiscard]] bool available() const { return in_filesystems && !sizes.empty(); }
  // Pages reserved over every size (0: nothing to allocate until someone
  // raises nr_hugepages).
  [[nodiscard]] uint64_t reserved_pages() const;
};

struct UffdCaps {
  bool syscall_ok = false;   // userfaultfd(O_CLOEXEC|O_NONBLOCK) + UFFDIO_API worked
  int syscall_errno = 0;
  bool device_exists = false;  // /dev/userfaultfd
  bool device_ok = false;      // open + USERFAULTFD_IOC_NEW + UFFDIO_API worked
  int device_errno = 0;
  uint32_t device_mode = 0;    // permission bits of /dev/userfaultfd (07777 mask)
  std::string device_group;    // its group, by name (number if unnamed)
  std::optional<int> unprivileged_sysctl;  // vm.unprivileged_userfaultfd; nullopt = no such file
  uint64_t features = 0;       // UFFDIO_API features (UFFD_FEATURE_*), 0 when unusable

  // This process (the daemon) can create a userfaultfd.
  [[nodiscard]] bool usable() const { return syscall_ok || device_ok; }
  // Unprivileged clients can create one: the sysctl allows it, or the device
  // is read/writable by others or by a group other than root.
  [[nodiscard]] bool open_to_clients() const;
  [[nodiscard]] bool has(uint64_t feature) const { return (features & feature) == feature; }
};

struct IoUringCaps {
  std::optional<int> disabled_sysctl;  // kernel.io_uring_disabled (0/1/2); nullopt = no such file
  bool setup_ok = false;               // io_uring_setup worked for this process
  int setup_errno = 0;
};

struct PsiCaps {
  bool file_exists = false;   // /proc/pressure/memory
  bool readable = false;      // and its contents parse
  int read_errno = 0;         // EOPNOTSUPP when PSI is built in but off
  bool trigger_ok = false;    // "some 150000 2000000" trigger accepted
  int trigger_errno = 0;
  std::optional<bool> cmdline_psi;  // psi=1 / psi=0 on the kernel command line; nullopt = absent
  [[nodiscard]] bool available() const { return readable && trigger_ok; }
};

struct MemcgCaps {
  std::string v1_mount;          // cgroup v1 hierarchy with the memory controller
  std::string v2_mount;          // cgroup2 mount whose cgroup.controllers lists memory
  bool cmdline_disabled = false; // cgroup_disable=memory on the kernel command line
  [[nodiscard]] bool available() const { return !v1_mount.empty() || !v2_mount.empty(); }
};

struct ThpCaps {
  std::string enabled;        // the bracketed word of .../transparent_hugepage/enabled; empty = no THP
  std::string shmem_enabled;  // same for shmem_enabled
  [[nodiscard]] bool available() const { return !enabled.empty(); }
};

struct OdirectCaps {
  std::string path;    // what was probed; empty = not probed
  bool ok = false;
  int err = 0;         // EINVAL: the file system refuses O_DIRECT
};

struct Capabilities {
  std::string kernel_release;  // /proc/sys/kernel/osrelease
  uint64_t base_page_size = 0;
  HugetlbfsCaps hugetlbfs;
  UffdCaps uffd;
  IoUringCaps io_uring;
  PsiCaps psi;
  MemcgCaps memcg;
  int numa_nodes = 0;          // /sys/devices/system/node/node<N>; 0 = no directories
  ThpCaps thp;
  OdirectCaps odirect;
  // Readers that failed for a reason other than "not there" (EACCES, a
  // file that does not parse): what and why, for the report.
  std::vector<std::string> problems;
};

// Names of the userfaultfd features airs-memd cares about that `features`
// has, space-separated ("MISSING_HUGETLBFS MINOR_HUGETLBFS ... POISON").
[[nodiscard]] std::string uffd_feature_names(uint64_t features);

// A human report, one capability per line, no trailing newline.
[[nodiscard]] std::string format_report(const Capabilities& caps);

// The same facts as keys and values for `airsctl status` ("hugetlbfs" →
// "yes", "hugetlbfs.sizes" → "2 MiB,1 GiB", "userfaultfd.features" →
// "0x1ffff", ...). Every key is always present.
[[nodiscard]] std::map<std::string, std::string> to_key_values(const Capabilities& caps);

}  // namespace airs::probe
