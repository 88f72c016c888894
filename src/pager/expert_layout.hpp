// SPDX-License-Identifier: Apache-2.0
// Which experts of a mixture-of-experts model each unit holds: pure, no
// I/O, unit-tested.
//
// A MoE layer stores its experts in three 3-D tensors (gate, up, down) with
// the expert index outermost, so one expert is one contiguous slice of each
// (Access::Expert extents, one per slice). Tensor data is aligned to 32
// bytes only: a slice shares its first and last unit with its neighbours
// (an "edge" unit), and a slice smaller than a unit shares all of it. A
// unit is an *expert unit* when it holds expert bytes and nothing else a
// token reads (no dense tensor, header or embedding byte): only those can
// be kept or dropped per expert; a unit that also holds a dense tensor is
// read every token and stays with the dense part.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <vector>

#include "pager/fill_plan.hpp"

namespace airs::pager {

struct ExpertKey {
  uint32_t layer = 0;
  uint32_t expert = 0;
  auto operator<=>(const ExpertKey&) const = default;
};

class ExpertLayout {
 public:
  ExpertLayout() = default;
  // From a model's extents (the Access::Expert ones are the slices), its
  // size and the unit size.
  ExpertLayout(const std::vector<Extent>& extents, uint64_t file_size, uint64_t unit_size);

  [[nodiscard]] bool empty() const { return keys_.empty(); }
  // Experts of every layer, by (layer, expert); a key is an index into it.
  [[nodiscard]] uint32_t key_count() const { return static_cast<uint32_t>(keys_.size()); }
  [[nodiscard]] const ExpertKey& key(uint32_t k) const { return keys_[k]; }
  [[nodiscard]] std::optional<uint32_t> find(ExpertKey key) const;
  // Layers that have experts: the highest layer + 1.
  [[nodiscard]] uint32_t layers() const { return layers_; }

  // The units any slice of expert `k` overlaps, ascending (its gate, up and
  // down slices, edge units included).
  [[nodiscard]] const std::vector<uint32_t>& units_of(uint32_t k) const { return units_of_key_[k]; }
  // The experts whose slices overlap unit `u`, ascending; empty for a unit
  // without expert bytes.
  [[nodiscard]] const std::vector<uint32_t>& keys_of(uint32_t u) const;
  // `u` holds expert bytes and no byte of another extent.
  [[nodiscard]] bool expert_unit(uint32_t u) const { return u < expert_only_.size() && expert_only_[u]; }
  // The expert whose slice holds file byte `offset`, if any.
  [[nodiscard]] std::optional<uint32_t> key_at(uint64_t offset) const;
  // The expert a touch of unit `u` at some byte of [lo, hi) belongs to
  // (the kernel reports the faulting page, not the byte: a base page on
  // shmem, the whole unit on hugetlbfs; a cooperative client's request
  // names the unit): the one expert whose slice holds every byte of the
  // range (clipped to u), else the only expert with bytes in u when u
  // holds nothing but its bytes. None for a unit several experts share
  // touched in a range that does not tell them apart (an edge unit), for a
  // unit that also holds dense bytes touched outside the expert's, nor for
  // a unit without expert bytes.
  [[nodiscard]] std::optional<uint32_t> expert_of_touch(uint32_t u, uint64_t lo, uint64_t hi) const;
  // The most units one expert spans.
  [[nodiscard]] uint32_t widest() const { return widest_; }

 private:
  struct Slice {
    uint64_t offset = 0, end = 0;
    uint32_t key = 0;
  };
  uint64_t unit_ = 0;
  std::vector<ExpertKey> keys_;
  std::vector<Slice> slices_;  // by offset
  std::vector<std::vector<uint32_t>> units_of_key_;
  std::vector<std::vector<uint32_t>> keys_of_unit_;  // empty when no unit has experts
  std::vector<bool> expert_only_;
  uint32_t layers_ = 0;
  uint32_t widest_ = 0;
};

}  // namespace airs::pager
