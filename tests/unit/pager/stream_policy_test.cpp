// SPDX-License-Identifier: Apache-2.0
// StreamPolicy: the residency policy of streamed models, on plain values.
// The simulations replay a client's per-token cycle against a budget and
// count the units read, next to what LRU and Belady's MIN (the offline
// optimum on the same trace) read.
#include "pager/stream_policy.hpp"

#include <algorithm>
#include <cstdio>
#include <list>
#include <set>
#include <string>
#include <unordered_map>

#include <gtest/gtest.h>

namespace airs::pager {
namespace {

// `layers` steps of `per_layer` units each, in unit order.
std::vector<uint32_t> layered(uint32_t layers, uint32_t per_layer) {
  std::vector<uint32_t> s;
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t i = 0; i < per_layer; ++i) s.push_back(l);
  return s;
}

// Reads a unit the way the pager does: a free slot, else the policy's victim.
struct Sim {
  StreamPolicy p;
  uint32_t budget;
  std::set<uint32_t> resident;
  uint64_t reads = 0;

  bool make_room(uint64_t for_distance, bool urgent) {
    if (resident.size() < budget) return true;
    std::vector<uint32_t> cand(resident.begin(), resident.end());
    auto v = p.victim(cand, for_distance, urgent);
    if (!v) return false;
    resident.erase(*v);
    return true;
  }
  // A client touches `u`: a miss reads it (urgent); then read ahead.
  void touch(uint64_t client, uint32_t u) {
    p.touched(client, u);
    if (!resident.contains(u)) {
      EXPECT_TRUE(make_room(0, true));
      resident.insert(u);
      ++reads;
    }
    // Free room is filled in cycle order; once the budget is full, a read
    // ahead looks only as far as the window.
    const uint32_t horizon = resident.size() < budget ? 0 : p.window();
    for (uint32_t x : p.ahead(p.window(), [&](uint32_t y) { return !resident.contains(y); }, horizon)) {
      if (!make_room(p.distance(x), false)) break;
      resident.insert(x);
      ++reads;
    }
    EXPECT_LE(resident.size(), budget);
  }
};

uint64_t lru_reads(const std::vector<uint32_t>& trace, uint32_t budget) {
  std::list<uint32_t> order;
  std::unordered_map<uint32_t, std::list<uint32_t>::iterator> where;
  uint64_t reads = 0;
  for (uint32_t u : trace) {
    if (auto it = where.find(u); it != where.end()) {
      order.erase(it->second);
    } else {
      ++reads;
      if (order.size() == budget) {
        where.erase(order.back());
        order.pop_back();
      }
    }
    order.push_front(u);
    where[u] = order.begin();
  }
  return reads;
}

uint64_t min_reads(const std::vector<uint32_t>& trace, uint32_t budget) {
  std::vector<size_t> next(trace.size(), SIZE_MAX);
  std::unordered_map<uint32_t, size_t> seen;
  for (size_t i = trace.size(); i-- > 0;) {
    if (auto it = seen.find(trace[i]); it != seen.end()) next[i] = it->second;
    seen[trace[i]] = i;
  }
  std::set<std::pair<size_t, uint32_t>> by_next;  // (next use, unit)
  std::unordered_map<uint32_t, size_t> in;        // unit -> its key in by_next
  uint64_t reads = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const uint32_t u = trace[i];
    if (auto it = in.find(u); it != in.end()) {
      by_next.erase({it->second, u});
    } else {
      ++reads;
      if (in.size() == budget) {
        auto last = std::prev(by_next.end());
        in.erase(last->second);
        by_next.erase(last);
      }
    }
    by_next.insert({next[i], u});
    in[u] = next[i];
  }
  return reads;
}

TEST(StreamPolicy, OneClientOnACycleReadsWhatMinReadsPlusTheWindow) {
  const uint32_t layers = 20, per_layer = 4, n = layers * per_layer, budget = 50, window = 2;
  Sim sim{StreamPolicy(layered(layers, per_layer), window), budget, {}, 0};
  ASSERT_LE(sim.p.floor_units(), budget);
  std::vector<uint32_t> trace;
  const int tokens = 12;
  for (int t = 0; t < tokens; ++t)
    for (uint32_t u = 0; u < n; ++u) {
      sim.touch(1, u);
      trace.push_back(u);
    }
  const uint64_t opt = min_reads(trace, budget);
  const uint64_t lru = lru_reads(trace, budget);
  // LRU reads every unit of every token: a cyclic scan larger than the cache.
  EXPECT_EQ(lru, uint64_t{n} * tokens);
  // The policy: within the window of the optimum per token.
  EXPECT_LE(sim.reads, opt + uint64_t{window} * tokens + n) << "policy " << sim.reads << ", MIN " << opt;
  EXPECT_LT(sim.reads * 2, lru) << "policy " << sim.reads << ", LRU " << lru;
  ::testing::Test::RecordProperty("policy_reads", static_cast<int>(sim.reads));
  ::testing::Test::RecordProperty("min_reads", static_cast<int>(opt));
}

TEST(StreamPolicy, TheStepAClientIsInAndItsLastUnitAreProtected) {
  StreamPolicy p(layered(4, 2), 1);  // units 0-1 step 0, 2-3 step 1, ...
  p.touched(7, 2);                   // client 7 at step 1
  EXPECT_TRUE(p.protected_unit(2));
  EXPECT_TRUE(p.protected_unit(3));
  EXPECT_FALSE(p.protected_unit(0));
  EXPECT_EQ(p.distance(4), 1u);
  EXPECT_EQ(p.distance(0), 3u);  // just used: needed last
  // The victim for a read two steps ahead is the unit used last, never
  // one of step 1.
  EXPECT_EQ(p.victim({0, 2, 3, 6}, 2, false), std::optional<uint32_t>(0));
  EXPECT_EQ(p.victim({2, 3}, 2, false), std::nullopt);
  // A client waits: the protected unit farthest away goes all the same.
  EXPECT_EQ(p.victim({2, 3}, 0, true).has_value(), true);
  // Nothing farther than what is read: no victim for a read-ahead.
  EXPECT_EQ(p.victim({4, 5}, 2, false), std::nullopt);
}

TEST(StreamPolicy, AStragglerBehindDoesNotMoveTheClientBackAndANewTokenWraps) {
  StreamPolicy p(layered(10, 1), 1);
  p.touched(1, 4);
  p.touched(1, 5);
  p.touched(1, 4);  // a straggler thread of layer 4 (the client was at 4)
  EXPECT_EQ(p.position(1), std::optional<uint32_t>(5));
  EXPECT_EQ(p.cycle_position(4), 4u) << "a straggler is not an order";
  p.touched(1, 9);
  p.touched(1, 0);  // the next token
  EXPECT_EQ(p.position(1), std::optional<uint32_t>(0));
}

// A client that reads a step it skipped, just behind it, reads the tensors
// in another order than the file's: the step moves after the client's, and
// the distances and the read-ahead follow the order from then on.
TEST(StreamPolicy, AStepReadAfterTheOneAfterItMovesInTheCycle) {
  StreamPolicy p(layered(10, 1), 1);
  p.touched(1, 3);
  p.touched(1, 5);  // 4 skipped: its unit was in
  p.touched(1, 4);
  EXPECT_EQ(p.position(1), std::optional<uint32_t>(4));
  EXPECT_EQ(p.cycle_position(5), 4u);
  EXPECT_EQ(p.cycle_position(4), 5u);
  EXPECT_EQ(p.distance(6), 1u) << "6 comes after 4 now";
  EXPECT_EQ(p.distance(5), 9u) << "5 was used: needed last";
  EXPECT_EQ(p.ahead(2, [](uint32_t) { return true; }), (std::vector<uint32_t>{4, 6}));
  // The next token reads in the learnt order: nothing moves.
  for (uint32_t u : {6U, 7U, 8U, 9U, 0U, 1U, 2U, 3U, 5U, 4U, 6U}) p.touched(1, u);
  EXPECT_EQ(p.cycle_position(5), 4u);
  EXPECT_EQ(p.cycle_position(4), 5u);
  EXPECT_EQ(p.position(1), std::optional<uint32_t>(6));
  // Far behind is not an order (more than kReorderReach steps back).
  StreamPolicy q(layered(64, 1), 1);
  q.touched(1, 40);
  q.touched(1, 40 - kReorderReach - 1);
  EXPECT_EQ(q.position(1), std::optional<uint32_t>(40));
  EXPECT_EQ(q.cycle_position(40 - kReorderReach - 1), 40 - kReorderReach - 1);
  q.touched(1, 40 - kReorderReach);
  EXPECT_EQ(q.position(1), std::optional<uint32_t>(40 - kReorderReach)) << "just within reach";
  EXPECT_EQ(q.cycle_position(40 - kReorderReach), 40u);
}

// One access can need two units at once: a row (or a block of one) that
// crosses a unit's end. With only the last unit it touched protected, the
// read of each evicted the other, for ever: llama.cpp on a dense model at
// 512 KiB units, its position a step past both, read them in turn with
// every fault waiting for a read.
TEST(StreamPolicy, AnAccessAcrossTwoUnitsKeepsBoth) {
  StreamPolicy p(layered(10, 1), 1);
  for (uint32_t u = 0; u <= 7; ++u) p.touched(1, u);  // at step 7
  p.touched(1, 5);  // a row across units 5 and 6, both behind it
  p.touched(1, 6);
  EXPECT_EQ(p.position(1), std::optional<uint32_t>(7));
  EXPECT_GT(p.distance(5), p.distance(0)) << "by the cycle, 5 is needed after 0";
  // Room for a read the client waits for: never the other half of its row.
  EXPECT_EQ(p.victim({5, 0}, 0, true), std::optional<uint32_t>(0));
  p.touched(1, 5);
  EXPECT_EQ(p.victim({6, 1}, 0, true), std::optional<uint32_t>(1));
  // On to another unit: the older of the two may go.
  p.touched(1, 8);
  EXPECT_EQ(p.victim({6, 1}, 0, true), std::optional<uint32_t>(6));
}

TEST(StreamPolicy, ColdUnitsGoFirstOldestFirstButNotTheRowAClientReads) {
  std::vector<uint32_t> steps = layered(4, 1);
  steps.insert(steps.begin(), {kColdStep, kColdStep});  // units 0, 1 cold; 2..5 steps 0..3
  StreamPolicy p(steps, 1);
  p.touched(1, 0);
  p.touched(2, 1);
  p.touched(1, 3);  // client 1 moves on to step 1, then 2: unit 0 is no longer one of its last two
  p.touched(1, 4);
  EXPECT_GT(p.distance(0), p.distance(5));
  EXPECT_GT(p.distance(0), p.distance(1));  // touched earlier
  EXPECT_EQ(p.victim({0, 1, 4, 5}, 0, false), std::optional<uint32_t>(0));
  EXPECT_TRUE(p.protected_unit(1));  // client 2's row
  EXPECT_EQ(p.floor_units(), 1u + 1u + 1u);
}

TEST(StreamPolicy, ReadAheadFollowsEveryClientNearestFirst) {
  StreamPolicy p(layered(8, 1), 2);
  auto all = [](uint32_t) { return true; };
  EXPECT_EQ(p.ahead(3, all), (std::vector<uint32_t>{0, 1, 2}));  // no client yet: the warm-up from step 0
  p.touched(1, 2);
  p.touched(2, 6);
  EXPECT_EQ(p.ahead(4, all), (std::vector<uint32_t>{2, 6, 3, 7}));
  EXPECT_EQ(p.ahead(3, [](uint32_t u) { return u != 3 && u != 2; }), (std::vector<uint32_t>{6, 7, 4}));
  p.forget(2);
  EXPECT_EQ(p.ahead(2, all), (std::vector<uint32_t>{2, 3}));
}

TEST(StreamPolicy, TwoClientsAtDifferentLayersKeepWhatEitherNeedsSoon) {
  const uint32_t n = 40, budget = 30;
  Sim sim{StreamPolicy(layered(n, 1), 2), budget, {}, 0};
  // Two clients half a cycle apart, interleaved.
  uint64_t touches = 0;
  for (int t = 0; t < 6; ++t)
    for (uint32_t i = 0; i < n; ++i) {
      sim.touch(1, i);
      sim.touch(2, (i + n / 2) % n);
      touches += 2;
    }
  // Both share every resident unit: together they read far less than two
  // private caches of half the budget each (LRU on each would read all).
  EXPECT_LT(sim.reads, touches / 2);
}

// Layers of `per_layer` tensors, `len` units long each, the first starting
// `skew` units into a unit (0.5: each pair shares a unit): the extents, in
// units of 2 bytes.
std::vector<Extent> tensor_layers(uint32_t layers, uint32_t per_layer, double len, double skew) {
  std::vector<Extent> ex;
  uint64_t off = static_cast<uint64_t>(skew * 2);
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t t = 0; t < per_layer; ++t) {
      ex.push_back({off, static_cast<uint64_t>(len * 2), l});
      off += static_cast<uint64_t>(len * 2);
    }
  return ex;
}

// A client that reads each layer's tensors in another order than the
// file's. llama.cpp computes ffn_up before ffn_gate, which our writer (and
// llama.cpp's own) stores first; files converted from other formats keep
// about alphabetical order (attn_norm, ffn_down, ffn_gate, ffn_up,
// ffn_norm, attn_k, attn_output, attn_q, attn_v), which llama.cpp reads as
// attn_norm, q, k, v, output, ffn_norm, up, gate, down. With the file's
// order the policy took units needed next for the units ahead of the
// client; after one token it reads in the client's order, within the
// window of the optimum per token as for a client in file order. Units
// that two tensors share (the file's layout) must not undo what it learnt.
TEST(StreamPolicy, AClientThatReadsInAnotherOrderThanTheFileReadsWhatMinReads) {
  const std::vector<std::vector<uint32_t>> orders = {{1, 0, 2}, {0, 7, 5, 8, 6, 4, 3, 2, 1}};
  for (const auto& order : orders)
    for (const double skew : {0.0, 0.5}) {
      const auto per_layer = static_cast<uint32_t>(order.size());
      const uint32_t layers = std::max(3U, 30 / per_layer), window = 2;
      const std::vector<Extent> ex = tensor_layers(layers, per_layer, 4, skew);
      const uint64_t size = ex.back().offset + ex.back().length;
      const UnitSteps steps = unit_steps(ex, size, 2);
      const auto n = static_cast<uint32_t>(steps.first.size());
      const uint32_t budget = n * 3 / 5;
      Sim sim{StreamPolicy(steps, window), budget, {}, 0};
      ASSERT_LE(sim.p.floor_units(), budget);
      std::vector<uint32_t> trace;
      const int tokens = 12;
      for (int t = 0; t < tokens; ++t)
        for (uint32_t l = 0; l < layers; ++l)
          for (uint32_t tensor : order) {
            const Extent& e = ex[l * per_layer + tensor];
            for (uint64_t u = e.offset / 2; u * 2 < e.offset + e.length; ++u) {
              sim.touch(1, static_cast<uint32_t>(u));
              trace.push_back(static_cast<uint32_t>(u));
            }
          }
      const uint64_t opt = min_reads(trace, budget);
      const std::string what = std::to_string(per_layer) + " tensors a layer, units shared: " + (skew != 0 ? "yes" : "no");
      EXPECT_LE(sim.reads, opt + uint64_t{window} * tokens + n) << what << ": policy " << sim.reads << ", MIN " << opt;
      std::printf("[ info ] %s: %lu reads, MIN %lu, %d tokens of %u units through %u\n", what.c_str(),
                  static_cast<unsigned long>(sim.reads), static_cast<unsigned long>(opt), tokens, n, budget);
      // Layer 1's tensors are in the cycle in the order the client reads them.
      const auto pos = [&](uint32_t tensor) {
        const Extent& e = ex[per_layer + tensor];
        return sim.p.cycle_position(sim.p.step(static_cast<uint32_t>((e.offset + e.length / 2) / 2)));
      };
      for (size_t i = 1; i < order.size(); ++i)
        EXPECT_LT(pos(order[i - 1]), pos(order[i])) << what << ": tensor " << order[i] << " is not after " << order[i - 1];
    }
}

}  // namespace
}  // namespace airs::pager

// --- a mixture of experts -----------------------------------------------

namespace airs::pager {
namespace {

// One-byte units: the header (0), then per layer a dense unit and two
// experts of two units each, then the output (11).
struct MoeLayout {
  std::vector<Extent> extents;
  uint64_t size = 12;
  MoeLayout() {
    extents.push_back({0, 1, 0, Access::Once});
    extents.push_back({1, 1, 1});
    extents.push_back({2, 2, 1, Access::Expert, 0, 0});
    extents.push_back({4, 2, 1, Access::Expert, 0, 1});
    extents.push_back({6, 1, 2});
    extents.push_back({7, 2, 2, Access::Expert, 1, 0});
    extents.push_back({9, 2, 2, Access::Expert, 1, 1});
    extents.push_back({11, 1, 3});
  }
  [[nodiscard]] StreamPolicy policy(ExpertPolicy p = ExpertCache::kDefault) const {
    return StreamPolicy(unit_steps(extents, size, 1), 1, ExpertLayout(extents, size, 1), p);
  }
};

TEST(StreamPolicyExperts, ExpertUnitsAreNeitherCyclicNorReadAhead) {
  const MoeLayout m;
  const StreamPolicy p = m.policy();
  EXPECT_EQ(p.cyclic_units(), 3U) << "the two dense layers and the output";
  for (uint32_t u : {2U, 3U, 4U, 5U, 7U, 8U, 9U, 10U}) {
    EXPECT_TRUE(p.expert_unit(u)) << u;
    EXPECT_FALSE(p.cyclic(u)) << u;
  }
  const auto all = p.ahead(100, [](uint32_t) { return true; });
  EXPECT_EQ(all, (std::vector<uint32_t>{1, 6, 11}));
  // The widest step (1) + the header (cold) + the window (1) + the recent
  // expert units (4: more than the widest expert, 2).
  EXPECT_EQ(p.floor_units(), 7U);
}

TEST(StreamPolicyExperts, VictimsAreColdUnitsThenExpertsThenTheDensePart) {
  const MoeLayout m;
  StreamPolicy p = m.policy(ExpertPolicy::Lru);
  p.touched(1, 1);  // layer 0's dense unit, the header, layer 0's expert 1
  p.touched(1, 0);
  p.touched_expert(1, *p.experts().find({0, 1}));
  EXPECT_EQ(p.victim({0, 1, 2, 4, 6}, 0, false), 2U) << "the header is the last unit touched: protected";
  p.touched(1, 5);
  p.touched(1, 1);  // the header is no longer one of its last two units
  EXPECT_EQ(p.victim({0, 1, 6, 7}, 0, false), 0U) << "cold first";
  EXPECT_EQ(p.victim({1, 6, 7}, 0, false), 7U) << "an expert before the dense part";
  // Expert 1's units are protected while it is the client's last expert.
  EXPECT_EQ(p.victim({1, 4, 6}, 0, false), 6U) << "dense units needed later than the one to read";
  EXPECT_EQ(p.victim({4, 6, 11}, 11, false), std::nullopt);
  EXPECT_EQ(p.victim({4, 6, 11}, 11, true), 4U) << "a waiting client: another's expert before the dense part";
}

TEST(StreamPolicyExperts, TheCachePolicyChoosesAmongExperts) {
  const MoeLayout m;
  // Layer 0's expert 0 used three times, expert 1 once, then layer 1's
  // expert 0: LRU drops the least recent, LFU the least used.
  for (ExpertPolicy pol : {ExpertPolicy::Lru, ExpertPolicy::Lfu}) {
    StreamPolicy p = m.policy(pol);
    const uint32_t a = *p.experts().find({0, 0}), b = *p.experts().find({0, 1}), c = *p.experts().find({1, 0});
    for (int token = 0; token < 3; ++token) {
      p.touched_expert(1, a);
      p.touched_expert(1, c);
    }
    p.touched_expert(1, b);
    p.touched_expert(1, c);
    const auto v = p.victim({2, 4}, 0, true);
    EXPECT_EQ(v, pol == ExpertPolicy::Lru ? 2U : 4U) << expert_policy_name(pol);
  }
}

TEST(ExpertCache, OneUseOfAnExpertPerVisitOfItsLayer) {
  ExpertCache c(ExpertPolicy::Lfu, {0, 0, 1, 1}, 2);
  // Three touches of expert 0 in one visit (its gate, up and down units)
  // are one use; expert 1 used in two visits is used more.
  c.access(0);
  c.access(0);
  c.access(0);
  c.access(2);
  c.access(1);
  c.access(2);
  c.access(1);
  const std::vector<uint32_t> k0{0}, k1{1};
  EXPECT_GT(c.evict_score(k0), c.evict_score(k1));
}

TEST(ExpertCache, NextUseDropsTheLayerJustPassedWhenRoutingIsUniform) {
  // Four layers of two experts, each used once; the client is now in
  // layer 2: layer 1's experts are needed last (a whole cycle away), layer
  // 3's next.
  ExpertCache c(ExpertPolicy::NextUse, {0, 0, 1, 1, 2, 2, 3, 3}, 4);
  for (uint32_t k : {0U, 2U, 4U, 6U, 1U, 3U, 5U}) c.access(k);  // a token, then the next one to layer 2
  const std::vector<uint32_t> layer1{2}, layer3{6};
  EXPECT_GT(c.evict_score(layer1), c.evict_score(layer3));
  EXPECT_EQ(c.layer(), 2U);
  // A key that spans both (an edge unit) is worth its better expert.
  const std::vector<uint32_t> both{2, 6};
  EXPECT_EQ(c.evict_score(both), c.evict_score(layer3));
}

}  // namespace
}  // namespace airs::pager

namespace airs::pager {
namespace {

// An expert hint counts a use of each expert it names (the cache sees the
// uses that hit, not only the misses) and protects their units until the
// client's next hint; it does not move the client or make its expert the
// current one.
TEST(StreamPolicyExperts, AHintCountsAUseOfEachExpertAndProtectsItsUnitsUntilTheNextHint) {
  const MoeLayout m;
  StreamPolicy p = m.policy(ExpertPolicy::Lfu);
  const uint32_t a = *p.experts().find({0, 0}), b = *p.experts().find({0, 1});
  const uint32_t c = *p.experts().find({1, 0}), d = *p.experts().find({1, 1});
  const uint64_t uses0 = p.expert_cache().uses();
  // Three tokens whose layer 0 reads expert 1 and layer 1 expert 0, told by
  // hints only (every read a hit: nothing faulted).
  for (int token = 0; token < 3; ++token) {
    p.hinted(7, std::vector<uint32_t>{b});
    p.hinted(7, std::vector<uint32_t>{c});
  }
  EXPECT_EQ(p.expert_cache().uses(), uses0 + 6) << "every hinted expert counted, once per hint";
  EXPECT_GT(p.expert_cache().key_score(a), p.expert_cache().key_score(b)) << "a hinted expert is worth more";
  EXPECT_GT(p.expert_cache().key_score(d), p.expert_cache().key_score(c));
  EXPECT_EQ(p.position(7), std::nullopt) << "a hint is not a touch";
  // The last hint (layer 1's expert 0: units 7, 8) is protected, the one
  // before it (units 4, 5) no longer.
  EXPECT_TRUE(p.protected_unit(7));
  EXPECT_TRUE(p.protected_unit(8));
  EXPECT_FALSE(p.protected_unit(4));
  EXPECT_EQ(p.victim({7, 8}, UINT64_MAX, false), std::nullopt) << "a hinted expert is not a victim for an ordinary read";
  EXPECT_EQ(p.victim({2, 7, 8}, UINT64_MAX, false), 2U);
  // A hint naming what the layout does not have counts nothing.
  p.hinted(7, std::vector<uint32_t>{p.experts().key_count(), UINT32_MAX});
  EXPECT_EQ(p.expert_cache().uses(), uses0 + 6);
  EXPECT_FALSE(p.protected_unit(7)) << "the new hint replaced the old one";
  p.hinted(7, std::vector<uint32_t>{d});
  EXPECT_TRUE(p.protected_unit(9));
  p.forget(7);
  EXPECT_FALSE(p.protected_unit(9)) << "a client that left protects nothing";
}

}  // namespace
}  // namespace airs::pager
