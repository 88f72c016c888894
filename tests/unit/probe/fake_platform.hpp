// SPDX-License-Identifier: Apache-2.0
// Fake platforms for the probe tests: a procfs/sysfs/devfs tree in a
// temporary directory plus KernelOps that answer from fields, so one test
// can be a Raspberry Pi OS kernel and the next a Debian arm64 one.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "probe/probe.hpp"
#include "util/result.hpp"

namespace airs::probe::testing {

class FakeTree {
 public:
  FakeTree() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "airs-probe-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = tmpl;
    for (const char* d : {"proc", "sys", "dev"}) std::filesystem::create_directories(root_ / d);
  }
  ~FakeTree() {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  FakeTree(const FakeTree&) = delete;
  FakeTree& operator=(const FakeTree&) = delete;

  // Writes `text` to root/rel, creating parent directories.
  void write(const std::string& rel, const std::string& text) {
    const auto p = root_ / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
  }
  void mkdir(const std::string& rel) { std::filesystem::create_directories(root_ / rel); }
  void chmod(const std::string& rel, mode_t mode) { ::chmod(path(rel).c_str(), mode); }
  void chown_group(const std::string& rel, gid_t gid) {
    if (::chown(path(rel).c_str(), static_cast<uid_t>(-1), gid) != 0) throw std::runtime_error("chown failed");
  }
  // One hugepages-<kB>kB directory with its counters.
  void hugepage_size(uint64_t kb, uint64_t nr, uint64_t free) {
    const std::string d = "sys/kernel/mm/hugepages/hugepages-" + std::to_string(kb) + "kB/";
    write(d + "nr_hugepages", std::to_string(nr) + "\n");
    write(d + "free_hugepages", std::to_string(free) + "\n");
    write(d + "resv_hugepages", "0\n");
    write(d + "surplus_hugepages", "0\n");
  }

  [[nodiscard]] std::string path(const std::string& rel) const { return (root_ / rel).string(); }
  [[nodiscard]] ProbePaths paths() const {
    ProbePaths p;
    p.proc_root = path("proc");
    p.sys_root = path("sys");
    p.dev_root = path("dev");
    return p;
  }

 private:
  std::filesystem::path root_;
};

// What the fake kernel answers; errno 0 = the call works.
struct FakeKernel {
  int uffd_syscall_errno = 0;
  int uffd_device_errno = 0;
  uint64_t uffd_features = 0;
  int io_uring_errno = 0;
  int psi_trigger_errno = 0;
  uint64_t page_size = 4096;
  int open_direct_errno = 0;
  // Files (full paths) whose read fails with the given errno, as a kernel
  // file can and a file in a fake tree cannot.
  std::map<std::string, int> failing_reads;

  // How often each call was made.
  mutable int psi_trigger_calls = 0;
  mutable int uffd_device_calls = 0;

  [[nodiscard]] KernelOps ops() const {
    KernelOps o = KernelOps::real();
    o.uffd_syscall = [this]() -> Result<uint64_t> {
      if (uffd_syscall_errno != 0) return make_error(uffd_syscall_errno, "fake userfaultfd(2)");
      return uffd_features;
    };
    o.uffd_device = [this](const std::string&) -> Result<uint64_t> {
      ++uffd_device_calls;
      if (uffd_device_errno != 0) return make_error(uffd_device_errno, "fake /dev/userfaultfd");
      return uffd_features;
    };
    o.io_uring_setup = [this]() -> Status {
      if (io_uring_errno != 0) return make_error(io_uring_errno, "fake io_uring_setup");
      return {};
    };
    o.psi_trigger = [this](const std::string&) -> Status {
      ++psi_trigger_calls;
      if (psi_trigger_errno != 0) return make_error(psi_trigger_errno, "fake PSI trigger");
      return {};
    };
    o.page_size = [this] { return page_size; };
    o.open_direct = [this](const std::string&) -> Status {
      if (open_direct_errno != 0) return make_error(open_direct_errno, "fake O_DIRECT open");
      return {};
    };
    auto real_read = o.read_file;
    o.read_file = [this, real_read](const std::string& p) -> Result<std::string> {
      if (auto it = failing_reads.find(p); it != failing_reads.end()) return make_error(it->second, "fake read {}", p);
      return real_read(p);
    };
    return o;
  }
};

}  // namespace airs::probe::testing
