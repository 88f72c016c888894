// SPDX-License-Identifier: Apache-2.0
// Which units of a streamed model stay in its budget, which go, and what to
// read ahead: pure bookkeeping, no I/O, unit-tested.
//
// A model bigger than its budget of pool pages is streamed: its units move
// in and out of the budget while clients map the whole file. Every token
// reads the model's cyclic units once, in the same order (the blocks layer
// by layer, then the output), and a few cold ones (an embeddings row, the
// header read once at load). A cyclic scan bigger than the cache defeats
// LRU: the unit it evicts is always the one the scan needs first.
//
// This policy predicts, for each unit, how many steps of the cycle lie
// between the nearest client and its next use of the unit, and evicts the
// unit needed last: Belady's MIN on the predicted order. For one client on
// a cyclic scan the prediction is exact, so it reads what MIN reads (the
// units that do not fit, once per token) plus the read-ahead window. With
// several clients a unit's distance is its distance from the nearest one.
// A step is a tensor a token reads whole, in (load rank, offset) order at
// first; the cycle then follows the order clients read the steps in
// (touched() learns it: llama.cpp reads ffn_up before ffn_gate). The units
// of the step a client is in are protected (it may still be reading them),
// so the budget needs at least one step's units plus the window
// (floor_units()).
//
// Cold units are evicted first, least recently touched first, except the
// last two units each client touched (the row it is reading now). Any unit
// a client touched last or just before is protected: one access may need
// two units at once (a row, or a block of one, that crosses a unit's end),
// and with only the last one kept each would evict the other for ever
// (llama.cpp on a dense model at 512 KiB units did: two units read in turn,
// every fault waiting for a read, for as long as it ran).
//
// A mixture of experts (an ExpertLayout that is not empty): the units only
// expert slices use are neither cyclic nor cold. A token reads K of a
// layer's N experts, so they are a cache (ExpertCache: its policy decides
// which go) and never read ahead; the dense part keeps its steps. Victims:
// cold units, then expert units, then cyclic ones (by distance): the dense
// part stays resident as long as the budget holds it and one expert. The
// units of the expert each client touched last are protected (it reads
// them now), and so are the last kRecentExpertUnits expert units each
// client touched since (a touch that does not tell its expert, as a hugetlbfs
// fault in a unit several experts share, still protects what the client
// reads now: a token reads an expert's gate and up slices side by side,
// and without this their units evict each other for ever). The floor
// makes room for the widest expert.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "pager/expert_cache.hpp"
#include "pager/expert_layout.hpp"
#include "pager/fill_plan.hpp"

namespace airs::pager {

inline constexpr uint32_t kColdStep = UINT32_MAX;
inline constexpr uint32_t kRecentExpertUnits = 4;
inline constexpr uint32_t kReorderReach = 16;

class StreamPolicy {
 public:
  // `steps`: each unit's first and last step in the per-token cycle (0
  // first, in file order; unit_steps), or kColdStep. `window`: units read
  // ahead of the clients (at least 1). `experts`: the model's expert slices
  // (empty: a dense model); its expert units must have kColdStep.
  StreamPolicy(UnitSteps steps, uint32_t window, ExpertLayout experts = {},
               ExpertPolicy expert_policy = ExpertCache::kDefault);

  [[nodiscard]] uint32_t unit_count() const { return static_cast<uint32_t>(step_.size()); }
  [[nodiscard]] uint32_t steps() const { return steps_; }
  [[nodiscard]] uint32_t window() const { return window_; }
  [[nodiscard]] uint32_t step(uint32_t u) const { return step_[u]; }
  // Where step `s` is in the cycle as clients read it (0 first): file order
  // until a client reads two tensors the other way round (touched()).
  [[nodiscard]] uint32_t cycle_position(uint32_t s) const { return pos_[s]; }
  [[nodiscard]] bool cyclic(uint32_t u) const { return step_[u] != kColdStep; }
  [[nodiscard]] bool expert_unit(uint32_t u) const { return experts_.expert_unit(u); }
  [[nodiscard]] const ExpertLayout& experts() const { return experts_; }
  [[nodiscard]] const ExpertCache& expert_cache() const { return cache_; }
  // The smallest budget that streams without evicting what a client reads:
  // the largest step's units, one cold unit, the window, and the widest
  // expert (at least the recent expert units).
  [[nodiscard]] uint32_t floor_units() const;
  // Units of one cycle (every cyclic unit once).
  [[nodiscard]] uint32_t cyclic_units() const { return cyclic_units_; }

  // Client `client` touched unit `u` (a fault, a cooperative touch). Its
  // position moves to u's step (of a unit in several steps, the one
  // nearest ahead) when that step is ahead of it by at most half a cycle
  // in the cycle's order (a new token wraps around; a straggler thread
  // behind it, at a step it was at this pass, does not move it back).
  // A touch of a step behind it (at most kReorderReach steps, more than a
  // layer has tensors; in this pass; a unit of that step only) that it was
  // not at this pass says it reads the tensors in another order than the
  // file's (llama.cpp computes ffn_up before ffn_gate, which files store
  // first): the step moves to just after the client's in the cycle's
  // order, and the client to it. One token teaches the order; the
  // read-ahead and the distances follow it from the next.
  void touched(uint64_t client, uint32_t u);
  // Client `client` uses expert `key` (ExpertLayout::expert_of_touch of a
  // touch): the cache counts the use (unless not `count`: a later touch of
  // the same use), and (`current`) its units are protected while this is
  // the client's last expert. Not `current`: one of the experts of a
  // touched unit that does not tell which (each is counted; the unit is
  // protected as a recent one).
  void touched_expert(uint64_t client, uint32_t key, bool current = true, bool count = true);
  // Client `client` will read experts `keys` next (an expert hint: its
  // router chose them, it has not touched them yet): the cache counts a
  // use of each, and their units are protected for the client until its
  // next hint (a hinted expert read ahead of its touch must not make room
  // for the next one). Keys out of range are skipped.
  void hinted(uint64_t client, std::span<const uint32_t> keys);
  void forget(uint64_t client);
  [[nodiscard]] size_t clients() const { return clients_.size(); }
  // The step client `client` is at, if it touched a cyclic unit.
  [[nodiscard]] std::optional<uint32_t> position(uint64_t client) const;

  // Steps until the nearest client needs `u` next (0: the step a client is
  // in). Cold units: steps() plus how long ago they were touched, so they
  // always go first and the oldest first. Without clients, a cyclic unit's
  // distance is its step (a fresh client starts at step 0).
  [[nodiscard]] uint64_t distance(uint32_t u) const;
  // Never evicted while a client is at it: the units of a client's current
  // step, the last two units each client touched, the units of its last expert
  // and of the experts of its last hint.
  [[nodiscard]] bool protected_unit(uint32_t u) const;

  // Up to `limit` units to read ahead, nearest first, for which `wanted(u)`
  // holds (not resident, not in flight): the cyclic units of each client's
  // current step and of the steps after it, as far as `horizon` units past
  // that step (counting the resident ones: a read ahead is worth evicting
  // for only when it is needed soon; reading further ahead in place of
  // units used last turns the budget into a window sliding over the cycle,
  // which reads every unit of every token). `horizon` 0: a whole cycle
  // (free room of the budget, where nothing is evicted). Without clients:
  // from step 0 (the warm-up of a fresh model).
  [[nodiscard]] std::vector<uint32_t> ahead(uint32_t limit, const std::function<bool(uint32_t)>& wanted,
                                            uint32_t horizon = 0) const;

  // The unit to evict so that a unit at distance `for_distance` can be
  // read: among `candidates` (resident, evictable units), an unprotected
  // cold unit (the oldest), else an unprotected expert unit (the cache
  // policy's choice), else the cyclic one with the largest distance, if
  // that is larger than `for_distance` and it is not protected. `urgent` (a client waits for the read): when every candidate
  // is protected, the one with the largest distance all the same (the
  // client that was at it faults again later; nothing waits for ever).
  [[nodiscard]] std::optional<uint32_t> victim(const std::vector<uint32_t>& candidates, uint64_t for_distance,
                                               bool urgent) const;

 private:
  struct Client {
    std::optional<uint32_t> step;  // set once it touched a cyclic unit
    std::vector<bool> visited;      // per step: it was at the step this pass
    std::optional<uint32_t> last;  // the last unit it touched
    std::optional<uint32_t> before_last;  // the one before (another unit)
    std::optional<uint32_t> expert;  // the last expert it used
    std::vector<uint32_t> recent;    // expert units touched since its last expert, oldest first
    std::vector<uint32_t> hinted;    // the units of the experts of its last hint, ascending
  };
  // Steps of unit u: step_[u] (its first) to last_[u].
  [[nodiscard]] uint64_t ahead_of(uint32_t from, uint32_t s) const { return (pos_[s] + steps_ - pos_[from]) % steps_; }
  void move_after(uint32_t s, uint32_t t);
  std::vector<uint32_t> step_;
  std::vector<uint32_t> last_;
  std::vector<uint32_t> order_;  // the step at each cycle position
  std::vector<uint32_t> pos_;    // each step's cycle position
  std::vector<std::vector<uint32_t>> units_of_step_;
  std::vector<uint64_t> cold_touched_;  // per unit: tick of its last touch (cold units)
  std::map<uint64_t, Client> clients_;
  uint64_t tick_ = 0;
  uint32_t steps_ = 0;
  uint32_t window_ = 1;
  uint32_t cyclic_units_ = 0;
  ExpertLayout experts_;
  ExpertCache cache_;
};

}  // namespace airs::pager
