// SPDX-License-Identifier: Apache-2.0
// PoolBackend over shmem: files of base pages or transparent huge pages,
// grouped in units (the pool's page: a multiple of the base page, 2 MiB by
// default) and pinned with mlock, for kernels without hugetlbfs (the
// small-pages and cooperative modes).
//
// Huge folios (docs/shmem-huge-folios.md): where the kernel has transparent
// huge pages and the unit is a multiple of their PMD size, the files live on
// a private tmpfs mounted huge=within_size (sys::mount_huge_tmpfs), so each
// unit is held by PMD-sized folios instead of 512 base pages. The kernel's
// per-page work of a fill (allocate, zero, add to the page cache and the LRU,
// lock, map in the daemon, pin for O_DIRECT, one bio segment each) is then
// done once per 2 MiB: load_bench, 512 MiB, the small-pages pass fell from
// 2.8× full mode's to 0.93×, the process's CPU time from 323 to 115 ms.
// Zero-page rules: a folio never spans two units (it is at most PMD-sized,
// naturally aligned, and the unit is a multiple of the PMD size), so
// allocating one (a populate ahead, a read) zero-fills pages of that unit
// only, which no client sees before the unit is READY, as with base pages.
// The tmpfs is the one mounted at ShmemOptions::huge_dir (a systemd drop-in
// can mount one there for a daemon that may not mount) or, without it, a private mount
// (sys::mount_huge_tmpfs). Either must pass a probe (a file of one PMD size
// that one written byte fills). Where neither does (no CAP_SYS_ADMIN or the
// @mount syscalls filtered and no directory, no THP, shmem_enabled "deny")
// the files are memfds, as before; huge_folios_note() says which and why,
// for the daemon's log.
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
#include "sys/shmem.hpp"

namespace airs::pool {

struct ShmemOptions {
  uint64_t unit = 0;  // bytes per pool page; 0 = 2 MiB rounded up to the base page size
  sys::NumaPolicy numa_policy = sys::NumaPolicy::Local;
  std::vector<int> numa_nodes;  // for Bind/Interleave; empty = all
  std::string meminfo = "/proc/meminfo";
  // Files on a huge=within_size tmpfs where possible (see above): on the one
  // mounted at huge_dir (a unit drop-in's TemporaryFileSystem=, for a
  // daemon that may not mount) if it gives huge folios, else on a private
  // mount of our own; false: memfds of base pages always.
  bool huge_folios = true;
  std::string huge_dir;
};

class ShmemBackend final : public PoolBackend {
 public:
  // Validates the unit (a non-zero multiple of the base page size). Errors:
  // EINVAL naming the base page size.
  static Result<std::unique_ptr<ShmemBackend>> create(ShmemOptions opts);
  ~ShmemBackend() override;

  [[nodiscard]] const char* name() const override { return "shmem"; }
  // Whether files are made on the huge-page tmpfs, and one line saying so
  // (or why not).
  [[nodiscard]] bool huge_folios() const { return huge_mount_.valid(); }
  [[nodiscard]] const std::string& huge_folios_note() const { return huge_note_; }
  [[nodiscard]] uint64_t page_size() const override { return unit_; }
  [[nodiscard]] uint64_t uffd_features() const override;
  [[nodiscard]] Result<sys::UniqueFd> create_file(const std::string& name, uint64_t size, FileSize kind) override;
  // A sealed memfd, also where the pool's files are on the huge tmpfs.
  [[nodiscard]] Result<sys::UniqueFd> create_base_page_file(const std::string& name, uint64_t size) override;
  // fallocate + mlock (through the backend's own mapping of the file).
  [[nodiscard]] Status populate(int fd, uint64_t offset, uint64_t len, const std::string& what) override;
  // munlock + punch hole (frees the shmem pages, zaps every mapper's PTEs).
  [[nodiscard]] Status release(int fd, uint64_t offset, uint64_t len, const std::string& what) override;
  // MAP_SHARED, NUMA policy applied, nothing populated; locked on fault
  // where the limit allows (else pin() locks unit by unit).
  [[nodiscard]] Result<sys::Mapping> map_region(int fd, uint64_t len, const std::string& what,
                                                bool reserve = true) override;
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
  // Memfds of base pages may be filled by copy (docs/shmem-base-pages.md);
  // huge folios are always read into straight (one pinned folio per 2 MiB).
  [[nodiscard]] bool fills_by_copy() const override { return !huge_folios(); }
  void forget_file(int fd) override;
  [[nodiscard]] bool release_frees_memory() const override { return true; }
  // Handing the whole region over at once cost ~0.5 ms per 2 MiB unit
  // (munlock and punch) before the first read could start.
  [[nodiscard]] bool hands_over_per_unit() const override { return true; }

 private:
  ShmemBackend() = default;
  void init_huge_folios();
  // The backend's own mapping of `fd` (created on first use).
  Result<std::byte*> pin_map(int fd, uint64_t end, const std::string& what);
  ShmemOptions opts_;
  uint64_t unit_ = 0;
  sys::UniqueFd huge_mount_;  // the huge_dir directory or a mount_huge_tmpfs, or invalid: memfds
  std::string huge_note_;
  std::map<sys::InodeKey, sys::Mapping> maps_;
  // Base addresses of the region mappings map_region locked on fault (each
  // entry is replaced when a new mapping is made at the same address).
  std::set<const std::byte*> locked_on_fault_;
};

}  // namespace airs::pool
