// SPDX-License-Identifier: Apache-2.0
// The pool's seam to the kernel memory it is made of. Two implementations are
// planned behind one interface and one accounting:
//   - hugetlbfs (HugetlbfsBackend): huge pages, pinned by construction;
//   - shmem (ShmemBackend): memfd base pages grouped in units, pinned with
//     mlock, for kernels without hugetlbfs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sys/fd.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/numa.hpp"
#include "util/result.hpp"

namespace airs::pool {

// What the kernel says about the memory the pool is made of.
struct KernelView {
  uint64_t page_size = 0;
  uint64_t total = 0;    // HugePages_Total for this size (persistent + surplus)
  uint64_t free = 0;     // HugePages_Free
  uint64_t reserved = 0; // HugePages_Rsvd
  uint64_t surplus = 0;  // HugePages_Surp
  // Pages the pool's own files hold (sum of st_blocks over them): the
  // reserve's pages plus the filled pages of every region.
  uint64_t files_pages = 0;
  // The mount's statfs where the pool lives on a mount with a size= limit.
  std::optional<sys::FsUsage> mount;
  // shmem backend only (bytes, /proc/meminfo): Shmem, Mlocked, Unevictable.
  std::optional<uint64_t> shmem_bytes;
  std::optional<uint64_t> mlocked_bytes;
  std::optional<uint64_t> unevictable_bytes;
  // hugetlbfs only: this size's counters per node with memory (sysfs
  // nodeN/hugepages). Bind and interleave take pages from these, not from
  // the global pool: a node at 0 free cannot serve a fault bound to it.
  // Empty on a kernel without NUMA.
  std::vector<sys::NodeHugePages> nodes;
};

// Whether a pool file may be resized later (the reserve) or keeps the size
// it was made with (model regions, KV arenas).
enum class FileSize : uint8_t { MayGrow, Fixed };

class PoolBackend {
 public:
  virtual ~PoolBackend() = default;
  [[nodiscard]] virtual const char* name() const = 0;
  [[nodiscard]] virtual uint64_t page_size() const = 0;
  // The userfaultfd features a lazy client must request for this memory.
  [[nodiscard]] virtual uint64_t uffd_features() const = 0;
  // A new unlinked file of `size` bytes (no pages yet). FileSize::Fixed: the
  // file never grows (a model region); shmem seals it so (F_SEAL_GROW), which
  // the pager's copy fill relies on.
  [[nodiscard]] virtual Result<sys::UniqueFd> create_file(const std::string& name, uint64_t size, FileSize kind) = 0;
  // A model region file of `size` bytes held by base pages only, never a
  // huge folio: a streamed region whose units are smaller than the pool's
  // page (a folio spanning units would allocate pages of units the pool
  // has not handed over). Default: as create_file, for a backend that
  // never takes such units.
  [[nodiscard]] virtual Result<sys::UniqueFd> create_base_page_file(const std::string& name, uint64_t size) {
    return create_file(name, size, FileSize::Fixed);
  }
  // Populate (allocate, zero, pin) / release a page-aligned range of a file.
  [[nodiscard]] virtual Status populate(int fd, uint64_t offset, uint64_t len, const std::string& what) = 0;
  [[nodiscard]] virtual Status release(int fd, uint64_t offset, uint64_t len, const std::string& what) = 0;
  // The daemon's mapping of a region. `reserve`: it must guarantee that
  // later faults in it cannot fail for lack of memory (hugetlbfs: MAP_SHARED
  // without MAP_NORESERVE reserves every page). Without: nothing is
  // reserved (a streamed region, bigger than the pool: the pool hands each
  // unit's page over before it is filled). Errors: ENOMEM when the pages
  // cannot be had.
  [[nodiscard]] virtual Result<sys::Mapping> map_region(int fd, uint64_t len, const std::string& what,
                                                        bool reserve = true) = 0;
  // Pages the kernel could give us right now.
  [[nodiscard]] virtual Result<uint64_t> kernel_available_pages() = 0;
  // Kernel counters for this page size (files_pages is filled in by the pool).
  [[nodiscard]] virtual Result<KernelView> kernel_view() = 0;
  // Change the kernel's pool of this page size by `delta` pages (nr_hugepages
  // for hugetlbfs); returns the change the kernel really made.
  [[nodiscard]] virtual Result<int64_t> adjust_kernel_pages(int64_t delta) = 0;
  // How to get `needed` more pages, for error messages.
  [[nodiscard]] virtual std::string advice(uint64_t needed) = 0;
  // A model region's unit [offset, +len) holds its final bytes, the first
  // `written` of them written through `map` (the daemon's mapping from
  // map_region; the rest, past the end of the file, untouched): make every
  // page of it present and pinned, so a range UFFDIO_CONTINUE finds all of
  // them and they cannot be swapped. Hugetlbfs: nothing to do (one huge page,
  // pinned by nature). Thread: the pool's.
  [[nodiscard]] virtual Status pin(int /*fd*/, std::byte* /*map*/, uint64_t /*offset*/, uint64_t /*len*/,
                                   uint64_t /*written*/, const std::string& /*what*/) {
    return {};
  }
  // True when the pager may fill a model region by copying each unit in (a
  // read into a bounce buffer, then a write into the file; opt-in,
  // PagerOptions::copy_fill) instead of reading straight into the region's
  // mapping: shmem of base pages (docs/shmem-base-pages.md). The pager also
  // needs the region sealed against growth (FileSize::Fixed).
  [[nodiscard]] virtual bool fills_by_copy() const { return false; }
  // The pool is done with file `fd` (called before it is closed): drop any
  // per-file state. Default: none.
  virtual void forget_file(int /*fd*/) {}
  // True when pages released by punching go straight back to the system
  // (shmem), false when they stay in a kernel pool that adjust_kernel_pages
  // must shrink (hugetlbfs).
  [[nodiscard]] virtual bool release_frees_memory() const { return false; }
  // True when a model region's mapping takes no pages by itself (shmem), so
  // the reserve can hand pages over unit by unit as they are filled
  // (Pool::claim) instead of all at once when the region is reserved;
  // false when mapping the region reserves every page at once (hugetlbfs).
  [[nodiscard]] virtual bool hands_over_per_unit() const { return false; }
};

}  // namespace airs::pool
