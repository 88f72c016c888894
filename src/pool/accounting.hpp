// SPDX-License-Identifier: Apache-2.0
// Pool accounting: pure arithmetic over page counts, kept exact so it can be
// compared with the kernel's view (HugePages_* in /proc/meminfo, st_blocks of
// the pool's files, the mount's statfs). No I/O.
#pragma once

#include <cstdint>

namespace airs::pool {

enum class PageKind : uint8_t { Model, Kv };

struct PoolCounts {
  uint64_t page_size = 0;
  uint64_t free_pages = 0;   // held in the reserve file, pre-touched
  uint64_t model_pages = 0;  // reserved for model regions (filled or not)
  uint64_t kv_pages = 0;     // allocated to KV arenas
  [[nodiscard]] uint64_t total_pages() const { return free_pages + model_pages + kv_pages; }
  [[nodiscard]] uint64_t total_bytes() const { return total_pages() * page_size; }
  [[nodiscard]] uint64_t free_bytes() const { return free_pages * page_size; }
  [[nodiscard]] uint64_t model_bytes() const { return model_pages * page_size; }
  [[nodiscard]] uint64_t kv_bytes() const { return kv_pages * page_size; }
  [[nodiscard]] uint64_t& of(PageKind k) { return k == PageKind::Model ? model_pages : kv_pages; }
  bool operator==(const PoolCounts&) const = default;
};

// Pages needed for `bytes` (rounded up), 0 for 0 bytes.
[[nodiscard]] constexpr uint64_t pages_for(uint64_t bytes, uint64_t page_size) {
  return bytes / page_size + (bytes % page_size != 0 ? 1 : 0);
}

// The nr_hugepages value that makes `needed` pages available when `available`
// (free minus reserved) are available now and `nr` is the current setting.
[[nodiscard]] constexpr uint64_t nr_hugepages_for(uint64_t nr, uint64_t available, uint64_t needed) {
  return available >= needed ? nr : nr + (needed - available);
}

// A contiguous page range [first, first + count) of a file.
struct PageRange {
  uint64_t first = 0;
  uint64_t count = 0;
  bool operator==(const PageRange&) const = default;
};

}  // namespace airs::pool
