// SPDX-License-Identifier: Apache-2.0
// Which experts of a streamed mixture-of-experts model are worth keeping:
// pure bookkeeping, no I/O, unit-tested and replayed on recorded traces by
// bench/experts.
//
// A token reads the model's layers in order and, in each MoE layer, the K
// experts its router chose out of N. The dense part (attention, norms,
// routers, shared experts) is read by every token and stays resident; the
// expert units are a cache. Its entries are (layer, expert) keys; a unit's
// worth is that of the best expert whose bytes it holds (an edge unit two
// experts share stays while either is worth keeping).
//
// Policies (victim: the unit with the largest eviction score):
//   Lru      the key used longest ago.
//   Lfu      the key with the fewest uses, counted with exponential aging
//            (a use weighs 2^(t/half_life) more than one half_life earlier),
//            ties to the one used longest ago.
//   NextUse  the key whose next use is expected furthest away, in layer
//            steps: the layers until the client is at its layer again
//            (a key of the current layer already used in this visit waits
//            a whole cycle), plus (1/p - 1) cycles, p being its aged
//            frequency per visit of its layer. Under uniform routing it
//            evicts the experts of the layer just passed, as Belady's MIN
//            does; under skewed routing the cold experts first.
// bench/experts compares them with MIN on recorded traces; the choice
// (Lfu) and the numbers are in docs/streaming.md. The daemon sees a use
// only when it faults (a resident unit stays mapped in a lazy client, open
// in a cooperative one): a miss. Counted on misses alone, Lfu keeps its
// order (every count ages alike) where NextUse's per-visit frequency of a
// resident expert decays while its layer's visits go on, and it evicts
// the hot experts.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace airs::pager {

enum class ExpertPolicy : uint8_t { Lru, Lfu, NextUse };
[[nodiscard]] std::string_view expert_policy_name(ExpertPolicy p);
[[nodiscard]] std::optional<ExpertPolicy> expert_policy_by_name(std::string_view name);

class ExpertCache {
 public:
  // The policy the daemon uses (docs/streaming.md says why).
  static constexpr ExpertPolicy kDefault = ExpertPolicy::Lfu;

  ExpertCache() = default;
  // `layer_of_key`: each key's layer (< layers); `experts_of_layer`: keys per layer.
  ExpertCache(ExpertPolicy policy, std::vector<uint32_t> layer_of_key, uint32_t layers);

  [[nodiscard]] ExpertPolicy policy() const { return policy_; }
  // A use of expert `key` (a touch of one of its units).
  void access(uint32_t key);
  // The score of a unit holding `keys`' bytes: the larger, the sooner it
  // goes (the smallest of its keys' scores).
  [[nodiscard]] double evict_score(std::span<const uint32_t> keys) const;
  [[nodiscard]] double key_score(uint32_t key) const;
  // The layer the last use was in.
  [[nodiscard]] std::optional<uint32_t> layer() const { return layer_; }
  // Uses counted so far (access() calls with a valid key).
  [[nodiscard]] uint64_t uses() const { return tick_; }

 private:
  [[nodiscard]] double decayed(double value, uint64_t since) const;
  ExpertPolicy policy_ = kDefault;
  std::vector<uint32_t> layer_of_;
  std::vector<uint32_t> keys_in_layer_;
  uint32_t layers_ = 0;
  double half_life_ = 1;  // in uses
  uint64_t tick_ = 0;
  std::vector<uint64_t> last_;     // per key: tick of its last use (0: never)
  std::vector<double> count_;      // per key: aged uses, as of last_
  std::vector<uint64_t> visit_of_; // per key: the visit of its layer it was last used in
  std::vector<double> visits_;     // per layer: aged visits, as of visit_tick_
  std::vector<uint64_t> visit_tick_;
  std::vector<uint64_t> visit_id_; // per layer: visits so far
  std::optional<uint32_t> layer_;
};

}  // namespace airs::pager
