// SPDX-License-Identifier: Apache-2.0
// The recorded access order of a model: which fill units its clients first
// needed, in the order they first needed them. Recorded the first time a
// model is used (AccessRecorder), stored with the model's content id, and
// replayed by later cold loads as the background warm-up's order
// (warmup_order): the first token's working set first, then the rest.
//
// Pure: no I/O; the daemon reads and writes the files (sys/files.hpp).
//
// File layout (little-endian, docs/state.md "The recorded access order"):
//   0   8  magic "AIRSORD\n"
//   8   4  version (kAccessOrderVersion)
//   12  4  unit_count: the model's units when recorded
//   16  8  unit_size: bytes per unit when recorded
//   24  4  entry_count (<= unit_count, <= kMaxRecordedUnits)
//   28  4  zero
//   32  4n entries: unit indexes, each < unit_count, no duplicates
//   end 8  XXH3-64 of every byte before it
// Recordings are untrusted input (any file in the state dir may have been
// edited, truncated or copied from another model): parse_access_order
// checks all of it before one entry is used.
#pragma once

#include <cstdint>
#include <vector>

#include "util/result.hpp"

namespace airs::pager {

inline constexpr uint32_t kAccessOrderVersion = 1;
// 4 Mi units: 8 TiB of 2 MiB units; a file of at most 16 MiB + 40 bytes.
inline constexpr uint32_t kMaxRecordedUnits = 1U << 22;
inline constexpr uint64_t kAccessOrderHeaderBytes = 32;
[[nodiscard]] constexpr uint64_t access_order_max_bytes() {
  return kAccessOrderHeaderBytes + 4ULL * kMaxRecordedUnits + 8;
}

// First accesses per unit, in order. Each unit is noted once; the
// recording is bounded by the unit count. Loop thread only (no locking).
class AccessRecorder {
 public:
  explicit AccessRecorder(uint32_t unit_count) : seen_(unit_count, false) {}
  // `unit` was needed by a client. Out-of-range units and repeats are ignored.
  void note(uint32_t unit) {
    if (unit >= seen_.size() || seen_[unit] || order_.size() >= kMaxRecordedUnits) return;
    seen_[unit] = true;
    order_.push_back(unit);
  }
  [[nodiscard]] bool seen(uint32_t unit) const { return unit < seen_.size() && seen_[unit]; }
  [[nodiscard]] const std::vector<uint32_t>& order() const { return order_; }

 private:
  std::vector<bool> seen_;
  std::vector<uint32_t> order_;
};

// The file bytes of a recording of a model of `unit_count` units of
// `unit_size` bytes. Entries past kMaxRecordedUnits are dropped; the caller
// gives entries < unit_count without duplicates (AccessRecorder does).
[[nodiscard]] std::vector<uint8_t> encode_access_order(uint64_t unit_size, uint32_t unit_count,
                                                       const std::vector<uint32_t>& order);

// The entries of a recording, if it is one of this model's geometry.
// Errors (EBADMSG, with what is wrong): too short or too long for its
// entry count, wrong magic, checksum mismatch, an entry out of range or
// repeated, a non-zero reserved field; ENOTSUP another version; ESTALE a
// unit count or unit size other than `unit_count` / `unit_size` (recorded
// for another model, or with another pool unit).
[[nodiscard]] Result<std::vector<uint32_t>> parse_access_order(const uint8_t* data, uint64_t len,
                                                               uint64_t unit_size, uint32_t unit_count);

}  // namespace airs::pager
