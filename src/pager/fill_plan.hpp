// SPDX-License-Identifier: Apache-2.0
// Which fill unit to read next: pure bookkeeping, no I/O, unit-tested.
//
// A model region is cut into fill units (one huge page each). Each unit has a
// load rank (the minimum load_rank of the GGUF extents overlapping it; units
// no extent covers go last) and a state EMPTY → IN_FLIGHT → READY, or FAILED
// on a read error; eviction resets everything to EMPTY.
// Reads are picked in three classes, first non-empty class wins:
//   1. Urgent: units a client faulted on and waits for, oldest first;
//   2. Prefetch: units of the last faulted rank and the W ranks after it
//      (with a replayed order: as many units as those ranks hold, following
//      the faulted unit in the replayed order, which knows better);
//   3. Background: everything else in rank order (warm-up), or in a
//      replayed order (set_warmup_order: a recorded access order first,
//      then the rest in rank order).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace airs::pager {

// How a token reads an extent: all of it, once per token, in load-rank
// order (a layer's weights, the output); a row at a time (the embeddings
// when an output tensor exists); once at load (the header); or only when
// the layer's router chooses its expert (one expert's slice of a layer's
// 3-D expert tensor: a token reads K of the layer's N experts).
enum class Access : uint8_t { EveryToken, Rows, Once, Expert };

struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t load_rank = 0;
  Access access = Access::EveryToken;
  // Access::Expert: whose slice it is (the block's layer, the expert's index).
  uint32_t layer = 0;
  uint32_t expert = 0;
};

enum class UnitState : uint8_t { Empty, InFlight, Ready, Failed };
enum class ReadClass : uint8_t { Urgent, Prefetch, Background };

inline constexpr uint32_t kUnrankedUnit = UINT32_MAX;

// Rank of every unit of a `file_size`-byte file cut into `unit_size` units.
// Extents past the end of the file are clipped; empty extents ignored.
[[nodiscard]] std::vector<uint32_t> rank_units(const std::vector<Extent>& extents, uint64_t file_size,
                                               uint64_t unit_size);
// Each unit's steps in the per-token cycle of a streamed model: every
// EveryToken extent (a tensor) is a step, in (load rank, offset) order;
// steps are numbered 0, 1, ... A unit's `first` and `last` are the first
// and last steps overlapping it: a unit two tensors share (one ends in it,
// the next begins) is in both, and in any step between (a tensor smaller
// than the unit). Both kColdStep (stream_policy.hpp) for a unit no
// EveryToken extent overlaps (header, embedding rows, unranked bytes,
// units only experts use: a token reads the experts its router chose, not
// all of them). A UnitSteps built from one vector has one step a unit.
struct UnitSteps {
  std::vector<uint32_t> first, last;
  UnitSteps() = default;
  UnitSteps(std::vector<uint32_t> one) : first(one), last(std::move(one)) {}  // NOLINT: one step per unit
  UnitSteps(std::vector<uint32_t> f, std::vector<uint32_t> l) : first(std::move(f)), last(std::move(l)) {}
  [[nodiscard]] bool empty() const { return first.empty(); }
};
[[nodiscard]] UnitSteps unit_steps(const std::vector<Extent>& extents, uint64_t file_size, uint64_t unit_size);

class FillPlan {
 public:
  FillPlan(std::vector<uint32_t> unit_rank, uint32_t prefetch_window);

  [[nodiscard]] uint32_t unit_count() const { return static_cast<uint32_t>(state_.size()); }
  [[nodiscard]] UnitState state(uint32_t u) const { return state_[u]; }
  [[nodiscard]] uint32_t rank(uint32_t u) const { return rank_[u]; }
  // Index of the unit's rank in ranks() (ascending distinct ranks).
  [[nodiscard]] uint32_t rank_index(uint32_t u) const { return rank_index_[u]; }
  [[nodiscard]] const std::vector<uint32_t>& ranks() const { return ranks_; }
  [[nodiscard]] uint32_t units_of_rank_index(uint32_t ri) const { return rank_begin_[ri + 1] - rank_begin_[ri]; }

  // Transitions (any state may be set; counters follow).
  void set_state(uint32_t u, UnitState s);
  [[nodiscard]] uint32_t ready() const { return ready_; }
  [[nodiscard]] uint32_t in_flight() const { return in_flight_; }
  [[nodiscard]] uint32_t failed() const { return failed_; }
  [[nodiscard]] bool complete() const { return ready_ + failed_ == unit_count(); }

  // A client faulted on `u` (EMPTY/IN_FLIGHT): queue it as urgent if EMPTY
  // and move the prefetch window to its rank. Idempotent for duplicates.
  void on_fault(uint32_t u);
  // Next EMPTY unit of `cls`, or nullopt. Does not change its state.
  [[nodiscard]] std::optional<uint32_t> next(ReadClass cls);
  // Up to `n` EMPTY units that next(cls) would return in turn if each were
  // set IN_FLIGHT (Prefetch, Background; Urgent gives none: those reads are
  // issued at once). Looks at most 4n + 64 positions past the class's cursor
  // (bounded cost per call). Changes nothing.
  [[nodiscard]] std::vector<uint32_t> peek(ReadClass cls, uint32_t n) const;
  // Everything EMPTY again (eviction): queues and cursors cleared (the
  // warm-up order stays).
  void reset();
  // The background class reads `first` in its order, then every other unit
  // in rank order; the prefetch window then follows that order too (same
  // number of units as the layer window). Urgent reads are unchanged. `first` must
  // hold units < unit_count() without repeats; otherwise nothing changes and
  // false is returned. Empty: rank order again. Call before reads start
  // (a moved cursor restarts at the beginning).
  bool set_warmup_order(const std::vector<uint32_t>& first);

 private:
  [[nodiscard]] const std::vector<uint32_t>& prefetch_order() const;
  std::vector<uint32_t> rank_;
  std::vector<uint32_t> rank_index_;
  std::vector<uint32_t> ranks_;       // distinct, ascending
  std::vector<uint32_t> order_;       // units by (rank, index)
  std::vector<uint32_t> rank_begin_;  // position in order_ of each rank index; size ranks+1
  std::vector<uint32_t> bg_order_;    // the background class's order (order_ unless replayed)
  std::vector<uint32_t> bg_pos_of_;   // position of each unit in bg_order_ (empty unless replayed)
  std::vector<UnitState> state_;
  std::vector<bool> queued_;
  std::deque<uint32_t> urgent_;
  uint32_t window_;
  uint32_t pf_pos_ = 0, pf_end_ = 0;
  uint32_t bg_pos_ = 0;
  uint32_t ready_ = 0, in_flight_ = 0, failed_ = 0;
};

}  // namespace airs::pager
