// SPDX-License-Identifier: Apache-2.0
// PoolBackend over hugetlbfs: files on a hugetlbfs mount (or memfd
// MFD_HUGETLB, the same filesystem), nr_hugepages through sysfs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pool/backend.hpp"
#include "sys/numa.hpp"

namespace airs::pool {

struct HugetlbfsOptions {
  uint64_t page_size = 0;         // 0 = the kernel's default (Hugepagesize)
  std::string mount_path;         // "" = discover in mountinfo, else memfd
  sys::NumaPolicy numa_policy = sys::NumaPolicy::Local;
  std::vector<int> numa_nodes;    // for Bind/Interleave; empty = all
  std::string sysfs_dir = "/sys/kernel/mm/hugepages";
  std::string node_dir = sys::kNodeDir;  // per-node counters (kernel_view)
  std::string meminfo = "/proc/meminfo";
  std::string mountinfo = "/proc/self/mountinfo";
};

class HugetlbfsBackend final : public PoolBackend {
 public:
  // Validates the page size against sysfs and picks the mount. Errors name
  // the sizes the kernel offers.
  static Result<std::unique_ptr<HugetlbfsBackend>> create(HugetlbfsOptions opts);

  [[nodiscard]] const char* name() const override { return "hugetlbfs"; }
  [[nodiscard]] uint64_t page_size() const override { return page_size_; }
  [[nodiscard]] uint64_t uffd_features() const override;
  [[nodiscard]] Result<sys::UniqueFd> create_file(const std::string& name, uint64_t size, FileSize kind) override;
  [[nodiscard]] Status populate(int fd, uint64_t offset, uint64_t len, const std::string& what) override;
  [[nodiscard]] Status release(int fd, uint64_t offset, uint64_t len, const std::string& what) override;
  [[nodiscard]] Result<sys::Mapping> map_region(int fd, uint64_t len, const std::string& what,
                                                bool reserve = true) override;
  [[nodiscard]] Result<uint64_t> kernel_available_pages() override;
  [[nodiscard]] Result<KernelView> kernel_view() override;
  [[nodiscard]] Result<int64_t> adjust_kernel_pages(int64_t delta) override;
  [[nodiscard]] std::string advice(uint64_t needed) override;

  // "" when files are memfds.
  [[nodiscard]] const std::string& mount() const { return mount_; }

 private:
  HugetlbfsBackend() = default;
  [[nodiscard]] std::string size_dir() const;
  HugetlbfsOptions opts_;
  uint64_t page_size_ = 0;
  bool is_default_size_ = false;
  std::string mount_;
};

}  // namespace airs::pool
