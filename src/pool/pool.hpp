// SPDX-License-Identifier: Apache-2.0
// The model pool: pages reserved and held by the daemon, pre-touched at
// start, lent to model regions and KV arenas and taken back. Single-threaded:
// call everything from the daemon's event loop thread.
//
// Layout: one "reserve" file holds every free page (fallocated: allocated and
// zeroed, which is the pre-touch). Giving pages to a region punches them out
// of the reserve and immediately claims them in the region (a model region's
// reserving MAP_SHARED mapping, or fallocate for KV chunks); freeing punches
// the region and fallocates the reserve again. Counts are exact by kind and
// `kernel_view()` exposes the kernel's numbers so they can be compared.
//
// On shmem the hand-over to a model region is per unit instead (claim(),
// called by the pager before it reads a unit): the reserve keeps the pages
// charged to the region until each is about to be filled, so loading starts
// at once and the pool's memory stays its size throughout.
//
// Known window: between the punch of the reserve and the claim in the target
// another process on the machine could take the freed pages; the claim then
// fails with ENOMEM, the pages are claimed back into the reserve, and the
// caller gets a PoolExhausted-style error (never a half-made region).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "pool/accounting.hpp"
#include "pool/backend.hpp"
#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::pool {

class Pool;

// A file whose pages are charged to one kind. Model regions carry the
// daemon's own read-write mapping while reserved. Must not outlive its Pool.
class Region {
 public:
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  [[nodiscard]] int fd() const { return fd_.get(); }
  [[nodiscard]] const std::string& name() const { return name_; }
  // Bytes, a multiple of the page size (of the unit for a streamed region
  // of small units).
  [[nodiscard]] uint64_t size() const { return size_; }
  [[nodiscard]] uint64_t pages() const { return pages_; }
  [[nodiscard]] PageKind kind() const { return kind_; }
  // Model regions: pages charged and the daemon mapping live.
  [[nodiscard]] bool reserved() const { return map_.valid(); }
  // The daemon's mapping (model regions while reserved), else nullptr.
  [[nodiscard]] std::byte* data() const { return map_.bytes(); }
  // KV regions: pages currently allocated. Model regions: pages charged
  // while reserved (every page; a streamed region its budget).
  [[nodiscard]] uint64_t charged_pages() const { return charged_; }
  // A streamed model region: bigger than what it may hold (its budget).
  [[nodiscard]] bool streamed() const { return streamed_; }
  // Model regions: pages handed over to the region now (its claimed units,
  // rounded up to whole pages).
  [[nodiscard]] uint64_t held_pages() const { return claimed_.empty() ? (map_.valid() ? pages_ : 0) : handed(); }
  // Bytes per unit: the pool's page, or for a streamed region of small
  // units (Pool::create_streamed_region) a divisor of it.
  [[nodiscard]] uint64_t unit_size() const { return unit_; }

 private:
  friend class Pool;
  Region(Pool* pool, std::string name, sys::UniqueFd fd, uint64_t size, uint64_t pages, PageKind kind);
  Pool* pool_;
  std::string name_;
  sys::UniqueFd fd_;
  uint64_t size_;
  uint64_t pages_;
  PageKind kind_;
  sys::Mapping map_;
  uint64_t charged_ = 0;
  bool streamed_ = false;
  std::vector<bool> held_;  // KV: which pages are allocated
  uint64_t unit_ = 0;
  uint64_t units_per_page_ = 1;
  // Model regions on a per-unit backend: which units the pool has handed
  // over. The reserve gives up whole pages (handed()): as many as the
  // claimed units fill, so a region of small units holds at most one page
  // part used. The rest of the charge is still held by the reserve.
  std::vector<bool> claimed_;
  uint64_t claimed_count_ = 0;
  [[nodiscard]] uint64_t pages_for_units(uint64_t units) const {
    return (units + units_per_page_ - 1) / units_per_page_;
  }
  [[nodiscard]] uint64_t handed() const { return pages_for_units(claimed_count_); }
};

struct PoolOptions {
  uint64_t size_bytes = 0;          // rounded up to the page size
  bool grow_nr_hugepages = false;   // may raise the kernel's pool at create
  // Start with the pages the kernel can give now when that is fewer than
  // size_bytes (at least one); the caller grows toward the size later.
  bool allow_partial = false;
};

class Pool {
 public:
  // Reserves and pre-touches the pool. Errors (ENOMEM): not enough pages,
  // with the exact fix (sysctl / kernel command line, the number to set);
  // nothing is left allocated and nr_hugepages is restored on failure.
  static Result<std::unique_ptr<Pool>> create(std::unique_ptr<PoolBackend> backend, PoolOptions opts);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  [[nodiscard]] uint64_t page_size() const { return counts_.page_size; }
  [[nodiscard]] const PoolCounts& counts() const { return counts_; }
  [[nodiscard]] PoolBackend& backend() { return *backend_; }

  // A model region of `bytes` (rounded up to whole pages): takes the pages
  // from the reserve and maps the region with a reservation. Errors: ENOSPC
  // "pool exhausted" (counts unchanged), ENOMEM if the kernel refused.
  [[nodiscard]] Result<std::unique_ptr<Region>> create_model_region(const std::string& name, uint64_t bytes);
  // Evict: drops the daemon mapping, punches the whole region (every mapper's
  // PTEs go; their next access faults again) and returns its pages to the
  // reserve. No-op if not reserved.
  [[nodiscard]] Status release_region(Region& r);
  // A model region that outlived an earlier daemon (the service manager's
  // fd store kept `fd`): its pages are already allocated and filled, so
  // they join the pool as model pages (the pool's total grows by them; its
  // reserve was sized without them) and are handed over whole. Errors:
  // EINVAL when `fd` is not a file of this backend's page size, ENOMEM if
  // the kernel would not map it.
  [[nodiscard]] Result<std::unique_ptr<Region>> adopt_model_region(const std::string& name, sys::UniqueFd fd);
  // A streamed model region of `bytes`, bigger than the pool (or the
  // caller's share) will hold: charged `budget` pages only. The daemon's
  // mapping reserves nothing; each unit is handed over by claim() just
  // before its read and given back by release_unit(), and the region never
  // holds more than `budget` pages. `unit`: bytes per unit, the pool's page
  // (0) or, on a backend that hands over per unit (shmem), a divisor of it
  // that is a multiple of the base page: the file is then of base pages
  // (a huge folio would span units), and the reserve gives up a page for
  // every units-per-page units claimed. Errors: ENOSPC when `budget` pages
  // are not free, EINVAL for a budget of 0 or not smaller than the region,
  // or a unit the backend cannot take.
  [[nodiscard]] Result<std::unique_ptr<Region>> create_streamed_region(const std::string& name, uint64_t bytes,
                                                                       uint64_t budget, uint64_t unit = 0);
  // Streamed regions: drops unit `unit` (punched: every mapping of it loses
  // it; the next access faults) and, once the claimed units fill a page
  // fewer, puts a page back in the reserve, still charged to the region.
  // No-op for a unit not handed over.
  [[nodiscard]] Status release_unit(Region& r, uint64_t unit);
  // Streamed regions: a new budget. Growing takes free pages; shrinking
  // gives back pages not handed over (release units first). Errors: ENOSPC
  // (not enough free pages), EBUSY (more pages handed over than `budget`).
  [[nodiscard]] Status set_budget(Region& r, uint64_t budget);
  // Re-reserve a released model region (same errors as create_model_region).
  [[nodiscard]] Status reserve_region(Region& r);
  // Before unit `unit` of a reserved model region is first written: on a
  // backend that hands over per unit (shmem), the reserve gives a page up
  // now when the region's claimed units need one more, so the pool's memory
  // never exceeds its size; elsewhere (and for a unit already handed over)
  // nothing to do. Errors: ENOSPC past the region's charge, the reserve's
  // punch.
  [[nodiscard]] Status claim(Region& r, uint64_t unit);

  // A KV arena file of `bytes` with no pages yet.
  [[nodiscard]] Result<std::unique_ptr<Region>> create_kv_region(const std::string& name, uint64_t bytes);
  // Give / take back pages [range] of a KV region (page indices in the file).
  // Errors: ENOSPC when the reserve has too few free pages; EINVAL for a range
  // outside the file or already in the requested state.
  [[nodiscard]] Status alloc_pages(Region& r, PageRange range);
  [[nodiscard]] Status free_pages(Region& r, PageRange range);
  // A KV arena goes to its clients O_RDWR (they map it writable), so one
  // may resize it, punch it or fill its holes with pages the pool never
  // gave. This puts it back as the pool made it: its own size (the pages it
  // held are allocated again: a client that cut its arena lost its own
  // uid's KV, nobody else's) and pages only where the pool allocated them
  // (the rest punched). Cheap when there is nothing to do: one fstat.
  // Refill::No finds a cut (or a punch) and repairs nothing: the caller
  // closes the arena instead. Errors: the resize, punch or allocation that
  // failed (the rest is still done).
  struct KvRepair {
    uint64_t found_size = 0;     // the file's size before (the arena's size when untouched)
    uint64_t stray_bytes = 0;    // pages the file held that the pool never gave
    uint64_t missing_bytes = 0;  // pages the pool gave that the file no longer held
    [[nodiscard]] bool any(uint64_t size) const { return found_size != size || stray_bytes != 0 || missing_bytes != 0; }
    // A cut (or a punch): the repair allocated pages again.
    [[nodiscard]] bool refilled(uint64_t size) const { return found_size < size || missing_bytes != 0; }
  };
  enum class Refill { Yes, No };
  [[nodiscard]] Result<KvRepair> restore_kv_region(Region& r, Refill refill = Refill::Yes);

  // The kernel's numbers plus the pages our files really hold.
  [[nodiscard]] Result<KernelView> kernel_view();

  // Hand `pages` free pages back to the kernel (punch from the reserve, lower
  // nr_hugepages by as many). Returns how many the kernel really took back.
  [[nodiscard]] Result<uint64_t> shrink(uint64_t pages);
  // Ask the kernel for `pages` more and add what it gives to the reserve.
  // Returns how many were added (may be fewer: fragmentation).
  [[nodiscard]] Result<uint64_t> grow(uint64_t pages);
  // Pages this pool added to the kernel's pool (nr_hugepages) and still
  // holds: given back when the pool is destroyed, and only those (a
  // boot-time reservation is not the daemon's to drop).
  [[nodiscard]] uint64_t raised_pages() const { return raised_; }
  // The daemon is exiting: regions destroyed from now on keep their pages,
  // so every client mapping stays valid (byte for byte what it was) until
  // the client unmaps; the kernel frees the pages then. Never zeros.
  void leave_regions_in_place() { leave_in_place_ = true; }

 private:
  friend class Region;
  Pool(std::unique_ptr<PoolBackend> backend, sys::UniqueFd reserve, uint64_t pages, uint64_t raised);
  [[nodiscard]] Status take_from_reserve(uint64_t n);
  // Punches `n` held reserve pages: free ones (take_from_reserve) or ones
  // already charged to a model region (`owed`, claim).
  [[nodiscard]] Status punch_reserve(uint64_t n, bool owed);
  // Puts a model region's pages back: those handed over return through
  // give_to_reserve, those never handed over just become free again.
  void return_model_pages(Region& r);
  // Returns pages that could not be claimed back (lost to the pool).
  uint64_t give_to_reserve(uint64_t n);
  void forget(Region* r) { regions_.erase(r); }
  [[nodiscard]] Error exhausted(const std::string& what, uint64_t need) const;

  std::unique_ptr<PoolBackend> backend_;
  sys::UniqueFd reserve_;
  std::vector<bool> reserve_held_;  // held = free pages + owed_
  uint64_t owed_ = 0;               // charged to model regions, not yet handed over
  PoolCounts counts_;
  std::unordered_set<Region*> regions_;
  uint64_t raised_ = 0;
  bool leave_in_place_ = false;
};

}  // namespace airs::pool
