// SPDX-License-Identifier: Apache-2.0
// The per-model status page: a memfd the daemon writes and clients map
// read-only (sealed F_SEAL_FUTURE_WRITE|SHRINK|GROW after the daemon mapped
// it; clients get an O_RDONLY reopen). Header-only: shared by the daemon's
// pager and the client library.
//
// Layout (host byte order; daemon and clients run on one machine), every
// offset a multiple of 8:
//   [0, 64)              StatusHeader
//   [rank_table_offset)  rank_count × RankEntry, ascending by rank
//   [bitmap_offset)      ceil(unit_count / 64) × uint64_t READY bitmap;
//                        bit u set ⇔ unit u (bytes [u*unit_size, +unit_size)
//                        of the region) holds its final bytes
// Ordering: the daemon sets a READY bit and bumps the rank counter and
// `ready_units` only after the unit's bytes are complete, then increments
// `generation` (release) and FUTEX_WAKEs it (non-private). A reader loads
// `generation` (acquire), reads what it needs and may futex-wait on
// `generation` while nothing it waits for has changed.
// A streamed model (state Streaming: bigger than its budget of pool pages)
// also clears bits: a unit on its way out loses its READY bit first, and
// only once no reader can touch it (lazy clients: the punch itself; a
// cooperative client: it closed the unit and said so on its request
// socket, wire/requests.hpp) is its page dropped. A streamed model is never
// Resident: its clients keep their fault handling for as long as they map it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace airs::wire {

inline constexpr uint32_t kStatusMagic = 0x53524941;  // "AIRS"
inline constexpr uint16_t kStatusVersion = 2;

// Unloaded: the model was dropped (eviction or a forced unload); its region
// is truncated, so every mapping of it gets SIGBUS on access. Final.
// Streaming: a streamed model, its units coming and going (never Resident).
enum class ModelLoadState : uint32_t { Loading = 0, Resident = 1, Evicted = 2, Failed = 3, Unloaded = 4, Streaming = 5 };

struct StatusHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t header_size;
  uint32_t generation;       // futex word, bumped on every change
  uint32_t state;            // ModelLoadState
  uint64_t unit_size;        // bytes per fill unit (the huge page)
  uint64_t file_size;        // bytes of the GGUF (the region is rounded up)
  uint32_t unit_count;
  uint32_t rank_count;
  uint32_t ready_units;
  uint32_t failed_units;
  uint32_t rank_table_offset;
  uint32_t bitmap_offset;
};
static_assert(sizeof(StatusHeader) == 56);

struct RankEntry {
  uint32_t rank;         // load_rank as given at load (0 = header/first)
  uint32_t units_total;  // units whose rank this is (min rank of overlapping extents)
  uint32_t units_ready;
  uint32_t reserved;
};

[[nodiscard]] constexpr uint64_t status_page_bytes(uint32_t unit_count, uint32_t rank_count) {
  const uint64_t ranks = 64 + uint64_t{rank_count} * sizeof(RankEntry);
  return ranks + (uint64_t{unit_count} + 63) / 64 * 8;
}

namespace detail {
template <typename T>
T load(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
void store(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
}  // namespace detail

// Read access to a mapped status page (any process). All methods are safe
// against concurrent updates by the daemon.
class StatusPageView {
 public:
  StatusPageView() = default;
  StatusPageView(const void* base, uint64_t len) : base_(static_cast<const std::byte*>(base)), len_(len) {}

  // The page is ours and complete for its declared sizes.
  [[nodiscard]] bool valid() const {
    if (base_ == nullptr || len_ < 64) return false;
    const auto* h = header();
    return h->magic == kStatusMagic && h->version == kStatusVersion &&
           status_page_bytes(h->unit_count, h->rank_count) <= len_ && h->rank_table_offset == 64 &&
           h->bitmap_offset == 64 + h->rank_count * sizeof(RankEntry);
  }
  [[nodiscard]] const StatusHeader* header() const { return reinterpret_cast<const StatusHeader*>(base_); }
  [[nodiscard]] uint32_t generation() const { return detail::load(&header()->generation); }
  [[nodiscard]] const uint32_t* generation_word() const { return &header()->generation; }
  [[nodiscard]] ModelLoadState state() const { return static_cast<ModelLoadState>(detail::load(&header()->state)); }
  [[nodiscard]] uint64_t unit_size() const { return header()->unit_size; }
  [[nodiscard]] uint32_t unit_count() const { return header()->unit_count; }
  [[nodiscard]] uint32_t ready_units() const { return detail::load(&header()->ready_units); }
  [[nodiscard]] bool unit_ready(uint32_t u) const {
    if (u >= header()->unit_count) return false;
    const auto* words = reinterpret_cast<const uint64_t*>(base_ + header()->bitmap_offset);
    return (detail::load(&words[u / 64]) >> (u % 64)) & 1U;
  }
  [[nodiscard]] uint32_t rank_count() const { return header()->rank_count; }
  [[nodiscard]] const RankEntry* ranks() const {
    return reinterpret_cast<const RankEntry*>(base_ + header()->rank_table_offset);
  }
  // True when every unit of load rank `rank` is ready (false for unknown ranks).
  [[nodiscard]] bool rank_ready(uint32_t rank) const {
    const RankEntry* r = ranks();
    for (uint32_t i = 0; i < rank_count(); ++i)
      if (r[i].rank == rank) return detail::load(&r[i].units_ready) == r[i].units_total;
    return false;
  }

 private:
  const std::byte* base_ = nullptr;
  uint64_t len_ = 0;
};

// The daemon's side: writes into its own writable mapping. Single writer.
class StatusPageWriter {
 public:
  StatusPageWriter() = default;
  StatusPageWriter(void* base, uint64_t len) : base_(static_cast<std::byte*>(base)), len_(len) {}

  // Lays the page out. `ranks` ascending with per-rank unit totals.
  void init(uint64_t unit_size, uint64_t file_size, uint32_t unit_count, const RankEntry* ranks, uint32_t rank_count) {
    auto* h = header();
    h->magic = kStatusMagic;
    h->version = kStatusVersion;
    h->header_size = sizeof(StatusHeader);
    h->unit_size = unit_size;
    h->file_size = file_size;
    h->unit_count = unit_count;
    h->rank_count = rank_count;
    h->rank_table_offset = 64;
    h->bitmap_offset = static_cast<uint32_t>(64 + rank_count * sizeof(RankEntry));
    auto* r = rank_table();
    for (uint32_t i = 0; i < rank_count; ++i) r[i] = ranks[i];
    reset(ModelLoadState::Loading);
  }
  // Clears every READY bit and counter (eviction, reload).
  void reset(ModelLoadState s) {
    auto* h = header();
    auto* r = rank_table();
    for (uint32_t i = 0; i < h->rank_count; ++i) detail::store(&r[i].units_ready, 0U);
    for (uint64_t w = 0; w < (uint64_t{h->unit_count} + 63) / 64; ++w) detail::store(&bitmap()[w], uint64_t{0});
    detail::store(&h->ready_units, 0U);
    detail::store(&h->failed_units, 0U);
    detail::store(&h->state, static_cast<uint32_t>(s));
  }
  // Call only once the unit's bytes are complete.
  void set_ready(uint32_t unit, uint32_t rank_index) {
    const uint64_t bit = uint64_t{1} << (unit % 64);
    if ((__atomic_fetch_or(&bitmap()[unit / 64], bit, __ATOMIC_RELEASE) & bit) != 0) return;
    __atomic_fetch_add(&rank_table()[rank_index].units_ready, 1U, __ATOMIC_RELEASE);
    __atomic_fetch_add(&header()->ready_units, 1U, __ATOMIC_RELEASE);
  }
  // A streamed unit on its way out (its bytes are still there, but nobody
  // may open it from now on).
  void set_empty(uint32_t unit, uint32_t rank_index) {
    const uint64_t bit = uint64_t{1} << (unit % 64);
    if ((__atomic_fetch_and(&bitmap()[unit / 64], ~bit, __ATOMIC_RELEASE) & bit) == 0) return;
    __atomic_fetch_sub(&rank_table()[rank_index].units_ready, 1U, __ATOMIC_RELEASE);
    __atomic_fetch_sub(&header()->ready_units, 1U, __ATOMIC_RELEASE);
  }
  void add_failed() { __atomic_fetch_add(&header()->failed_units, 1U, __ATOMIC_RELEASE); }
  void set_state(ModelLoadState s) { detail::store(&header()->state, static_cast<uint32_t>(s)); }
  // Publish: bump the generation. The caller then futex-wakes generation_word().
  void publish() { __atomic_fetch_add(&header()->generation, 1U, __ATOMIC_RELEASE); }
  [[nodiscard]] uint32_t* generation_word() { return &header()->generation; }
  [[nodiscard]] StatusPageView view() const { return StatusPageView(base_, len_); }

 private:
  StatusHeader* header() { return reinterpret_cast<StatusHeader*>(base_); }
  RankEntry* rank_table() { return reinterpret_cast<RankEntry*>(base_ + 64); }
  uint64_t* bitmap() { return reinterpret_cast<uint64_t*>(base_ + header()->bitmap_offset); }
  std::byte* base_ = nullptr;
  uint64_t len_ = 0;
};

}  // namespace airs::wire
