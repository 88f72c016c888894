// PoolBackend over shmem: memfd files (no MFD_HUGETLB) of base pages, grouped
// in units (the pool's page: a multiple of the base page, 2 MiB by default)
// and pinned with mlock, for kernels without hugetlbfs (DESIGN §2.7:
// small-pages and cooperative modes).
//
// Pinning: mlock works on mappings, so the backend keeps its own whole-file
// MAP_SHARED mapping of every file it populates (the reserve, KV arenas) and
// locks the populated ranges in it; release unlocks and punches. Model
// regions are locked at map time with MLOCK_ONFAULT (a plain mlock would
// allocate every page before it is filled): each page is locked as the read
// (or the populate ahead of it) faults it into the daemon's mapping, so a
// completed unit needs no work of its own (before, each one took a fallocate
// and an mlock on the event loop, re-walking the 512 pages its read had just
// written). Where the on-fault lock fails (RLIMIT_MEMLOCK), pin() locks each
// unit as before and reports the error. Needs CAP_IPC_LOCK or RLIMIT_MEMLOCK
// ≥ the pool (systemd: LimitMEMLOCK=infinity).
//
// There is no kernel pool to resize: punched pages go straight back to
// MemAvailable, adjust_kernel_pages changes nothing and reports 0.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "pool/backend.hpp"
#include "sys/numa.hpp"

namespace airs::pool {

struct ShmemOptions {
  uint64_t unit = 0;  // bytes per pool page; 0 = 2 MiB rounded up to the base page size
  sys::NumaPolicy numa_policy = sys::NumaPolicy::Local;
  std::vector<int> numa_nodes;  // for Bind/Interleave; empty = all
  std::string meminfo = "/proc/meminfo";
};

class ShmemBackend final : public PoolBackend {
 public:
  // Validates the unit (a non-zero multiple of the base page size). Errors:
  // EINVAL naming the base page size.
  static Result<std::unique_ptr<ShmemBackend>> create(ShmemOptions opts);
  ~ShmemBackend() override;

  [[nodiscard]] const char* name() const override { return "shmem"; }
  [[nodiscard]] uint64_t page_size() const override { return unit_; }
  [[nodiscard]] uint64_t uffd_features() const override;
  [[nodiscard]] Result<sys::UniqueFd> create_file(const std::string& name, uint64_t size) override;
  // fallocate + mlock (through the backend's own mapping of the file).
  [[nodiscard]] Status populate(int fd, uint64_t offset, uint64_t len, const std::string& what) override;
  // munlock + punch hole (frees the shmem pages, zaps every mapper's PTEs).
  [[nodiscard]] Status release(int fd, uint64_t offset, uint64_t len, const std::string& what) override;
  // MAP_SHARED, NUMA policy applied, nothing populated; locked on fault
  // where the limit allows (else pin() locks unit by unit).
  [[nodiscard]] Result<sys::Mapping> map_region(int fd, uint64_t len, const std::string& what) override;
  // MemAvailable / unit.
  [[nodiscard]] Result<uint64_t> kernel_available_pages() override;
  // total = MemTotal, free = MemAvailable (in units); shmem/mlocked/unevictable
  // bytes from /proc/meminfo.
  [[nodiscard]] Result<KernelView> kernel_view() override;
  [[nodiscard]] Result<int64_t> adjust_kernel_pages(int64_t delta) override;
  [[nodiscard]] std::string advice(uint64_t needed) override;
  // fallocate the pages the read did not write (the tail past EOF, so
  // CONTINUE finds every page) and mlock what the on-fault lock of `map` does
  // not already hold: nothing for a fully written unit of a locked mapping.
  [[nodiscard]] Status pin(int fd, std::byte* map, uint64_t offset, uint64_t len, uint64_t written,
                           const std::string& what) override;
  void forget_file(int fd) override;
  [[nodiscard]] bool release_frees_memory() const override { return true; }
  // Handing the whole region over at once cost ~0.5 ms per 2 MiB unit
  // (munlock and punch) before the first read could start.
  [[nodiscard]] bool hands_over_per_unit() const override { return true; }

 private:
  ShmemBackend() = default;
  // The backend's own mapping of `fd` (created on first use).
  Result<std::byte*> pin_map(int fd, uint64_t end, const std::string& what);
  ShmemOptions opts_;
  uint64_t unit_ = 0;
  std::map<uint64_t, sys::Mapping> maps_;  // by inode
  // Base addresses of the region mappings map_region locked on fault (each
  // entry is replaced when a new mapping is made at the same address).
  std::set<const std::byte*> locked_on_fault_;
};

}  // namespace airs::pool
