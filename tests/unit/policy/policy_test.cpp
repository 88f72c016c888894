// SPDX-License-Identifier: Apache-2.0
#include "policy/policy.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "util/units.hpp"

using namespace airs;
using namespace airs::policy;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

namespace {

const Clock::time_point kNow = Clock::time_point{} + 100000s;
constexpr uint64_t kBlock = 2 * kMiB;

SessionState session(uint64_t id, Priority p, uint32_t blocks, uint32_t partial, std::chrono::seconds idle,
                     std::optional<double> rate = std::nullopt) {
  SessionState s;
  s.id = id;
  s.priority = p;
  s.blocks = blocks;
  s.partial_blocks = partial;
  s.block_bytes = kBlock;
  s.last_used = kNow - idle;
  s.access_rate = rate;
  return s;
}

ModelState model(uint64_t id, std::string name, uint64_t bytes, uint32_t refs, bool pinned, std::chrono::seconds idle) {
  ModelState m;
  m.id = id;
  m.name = std::move(name);
  m.resident_bytes = bytes;
  m.refcount = refs;
  m.pinned = pinned;
  m.last_used = kNow - idle;
  return m;
}

Config config() {
  Config c;
  c.idle_threshold = 300s;
  c.target_some_bytes = 4 * kBlock;
  c.target_full_bytes = 16 * kBlock;
  return c;
}

Request everything() {
  Request r;
  r.everything = true;
  return r;
}

// Compact rendering of a plan for whole-plan assertions: "C7x2 S3x1 M9".
std::string render(const Plan& p) {
  std::string out;
  for (const auto& a : p.actions) {
    if (!out.empty()) out += ' ';
    switch (a.kind) {
      case ActionKind::DropCached: out += "C" + std::to_string(a.id) + "x" + std::to_string(a.blocks); break;
      case ActionKind::EvictBlocks: out += "S" + std::to_string(a.id) + "x" + std::to_string(a.blocks); break;
      case ActionKind::EvictModel: out += "M" + std::to_string(a.id); break;
      case ActionKind::ShrinkModel: out += "B" + std::to_string(a.id); break;
    }
  }
  return out;
}

// Every kind of victim, with one of each "never" case.
PoolState full_state() {
  PoolState st;
  st.sessions = {
      session(1, Priority::Interactive, 3, 1, 10s),      // active interactive: never
      session(2, Priority::Interactive, 2, 0, 600s),     // idle interactive
      session(3, Priority::System, 2, 1, 20s),
      session(4, Priority::Background, 4, 1, 5s),
  };
  st.cached = {CachedBlocks{7, 2, kBlock, kNow - 50s}};
  st.models = {
      model(9, "old", 100 * kMiB, 0, false, 400s),
      model(10, "pinned", 200 * kMiB, 0, true, 9000s),  // never
      model(11, "in-use", 300 * kMiB, 2, false, 9000s), // never
  };
  return st;
}

}  // namespace

TEST(Policy, OrderIsCachedThenBackgroundSystemIdleInteractiveThenModels) {
  auto p = plan_eviction(full_state(), everything(), kNow, config());
  EXPECT_EQ(render(p), "C7x2 S4x1 S4x3 S3x1 S3x1 S2x2 M9");
  EXPECT_EQ(p.bytes, (2 + 4 + 2 + 2) * kBlock + 100 * kMiB);
  EXPECT_TRUE(p.satisfied);
  EXPECT_TRUE(p.shortfall.empty());
  uint64_t sum = 0;
  for (const auto& a : p.actions) sum += a.bytes;
  EXPECT_EQ(sum, p.bytes);
}

TEST(Policy, NeverActiveInteractivePinnedOrReferencedModels) {
  Request r;
  r.bytes = 100 * kGiB;
  auto p = plan_eviction(full_state(), r, kNow, config());
  for (const auto& a : p.actions) {
    EXPECT_FALSE(a.kind == ActionKind::EvictBlocks && a.id == 1) << render(p);
    EXPECT_FALSE(a.kind == ActionKind::EvictModel && (a.id == 10 || a.id == 11)) << render(p);
  }
  EXPECT_FALSE(p.satisfied);
  EXPECT_THAT(p.shortfall, HasSubstr("active interactive KV (6 MiB)"));
  EXPECT_THAT(p.shortfall, HasSubstr("pinned models (200 MiB)"));
  EXPECT_THAT(p.shortfall, HasSubstr("models in use (300 MiB)"));
}

TEST(Policy, NothingEvictable) {
  PoolState empty;
  Request r;
  r.bytes = kBlock;
  auto p = plan_eviction(empty, r, kNow, config());
  EXPECT_TRUE(p.actions.empty());
  EXPECT_EQ(p.bytes, 0u);
  EXPECT_FALSE(p.satisfied);
  EXPECT_EQ(p.shortfall, "2 MiB of 2 MiB short: nothing evictable");
}

TEST(Policy, OnlyActiveInteractiveLeft) {
  PoolState st;
  st.sessions = {session(1, Priority::Interactive, 48, 1, 1s)};  // 96 MiB, active
  Request r;
  r.level = Level::Full;
  auto p = plan_eviction(st, r, kNow, config());
  EXPECT_TRUE(p.actions.empty());
  EXPECT_FALSE(p.satisfied);
  EXPECT_EQ(p.shortfall, "32 MiB of 32 MiB short: only active interactive KV left: 96 MiB");
}

TEST(Policy, IdleThresholdIsStrict) {
  PoolState st;
  st.sessions = {session(1, Priority::Interactive, 1, 0, 300s), session(2, Priority::Interactive, 1, 0, 301s)};
  auto p = plan_eviction(st, everything(), kNow, config());
  EXPECT_EQ(render(p), "S2x1");
  EXPECT_EQ(p.actions[0].reason, "interactive KV idle 301 s");
  // One nanosecond past the threshold is idle.
  st.sessions[0].last_used = kNow - 300s - 1ns;
  p = plan_eviction(st, everything(), kNow, config());
  EXPECT_EQ(render(p), "S2x1 S1x1");
}

TEST(Policy, PinnedAndReferencedModelsSkippedOthersLruOrder) {
  PoolState st;
  st.models = {
      model(1, "a", 10 * kMiB, 0, false, 5s),   model(2, "b", 10 * kMiB, 0, false, 500s),
      model(3, "c", 10 * kMiB, 0, true, 9000s), model(4, "d", 10 * kMiB, 1, false, 9000s),
      model(5, "e", 10 * kMiB, 0, false, 50s),  model(6, "f", 0, 0, false, 9999s),  // nothing resident: nothing to free
  };
  auto p = plan_eviction(st, everything(), kNow, config());
  EXPECT_EQ(render(p), "M2 M5 M1");
  EXPECT_EQ(p.actions[0].reason, "model 'b' unused for 500 s");
  Request r;
  r.include_models = false;
  r.everything = true;
  EXPECT_TRUE(plan_eviction(st, r, kNow, config()).actions.empty());
}

TEST(Policy, StreamedModelsInUseGiveBackBudgetLastAndNeverBelowTheirFloor) {
  PoolState st;
  st.unit_bytes = 2 * kMiB;
  auto streamed = model(7, "big", 64 * kMiB, 1, false, 1s);
  streamed.spare_bytes = 40 * kMiB;  // its floor is 24 MiB
  auto small = model(8, "small", 32 * kMiB, 1, false, 1s);
  small.spare_bytes = 6 * kMiB;
  auto idle_streamed = model(9, "idle-big", 30 * kMiB, 0, false, 100s);
  idle_streamed.spare_bytes = 20 * kMiB;
  st.models = {model(1, "idle", 10 * kMiB, 0, false, 500s), streamed, small, idle_streamed};
  st.sessions = {session(3, Priority::Background, 2, 0, 10s)};
  // Everything: KV first; an unused streamed model's spare budget before
  // any unused model goes whole (the streamed one last, what is left of
  // it); then the budgets of those in use, the larger spare first, each
  // down to its floor and no further.
  auto p = plan_eviction(st, everything(), kNow, config());
  EXPECT_EQ(render(p), "S3x2 B9 M1 M9 B7 B8");
  ASSERT_EQ(p.actions.size(), 6U);
  EXPECT_EQ(p.actions[1].bytes, 20 * kMiB);
  EXPECT_EQ(p.actions[3].bytes, 10 * kMiB) << "what is left of it after the cut";
  EXPECT_EQ(p.actions[4].bytes, 40 * kMiB);
  EXPECT_EQ(p.actions[5].bytes, 6 * kMiB);
  EXPECT_EQ(p.actions[4].reason, "streamed model 'big': a smaller budget");
  st.models.pop_back();
  // Only as much as needed, in whole units.
  Request r;
  r.bytes = 2 * kBlock + 10 * kMiB + 1;  // the KV, the idle model, then 1 byte: one unit of budget
  p = plan_eviction(st, r, kNow, config());
  EXPECT_EQ(render(p), "S3x2 M1 B7");
  EXPECT_EQ(p.actions.back().bytes, 2 * kMiB);
  // A model that is not streamed in use is never touched, and the shortfall says so.
  st.models = {model(2, "dense", 10 * kMiB, 1, false, 1s)};
  st.sessions.clear();
  r.bytes = kMiB;
  p = plan_eviction(st, r, kNow, config());
  EXPECT_FALSE(p.satisfied);
  EXPECT_THAT(p.shortfall, HasSubstr("models in use"));
}

TEST(Policy, PartialBlocksFirstWithinALevelColdestSessionFirst) {
  PoolState st;
  st.sessions = {
      session(1, Priority::Background, 5, 1, 10s),
      session(2, Priority::Background, 3, 1, 100s),  // colder
      session(3, Priority::Background, 2, 0, 1000s), // coldest, no partial block
  };
  auto p = plan_eviction(st, everything(), kNow, config());
  EXPECT_EQ(render(p), "S2x1 S1x1 S3x2 S2x2 S1x4");
  EXPECT_EQ(p.actions[0].reason, "background KV, partial blocks");
  EXPECT_EQ(p.actions[2].reason, "background KV");
  // Only the partial blocks are needed: the plan stops there.
  Request r;
  r.bytes = 2 * kBlock;
  p = plan_eviction(st, r, kNow, config());
  EXPECT_EQ(render(p), "S2x1 S1x1");
  EXPECT_TRUE(p.satisfied);
}

TEST(Policy, DamonRateRanksBeforeLastUse) {
  PoolState st;
  st.sessions = {
      session(1, Priority::System, 2, 0, 1000s, 50.0),  // oldest by last use but hot
      session(2, Priority::System, 2, 0, 10s, 0.5),     // recent but cold
      session(3, Priority::System, 2, 0, 100s, 5.0),
  };
  auto p = plan_eviction(st, everything(), kNow, config());
  EXPECT_EQ(render(p), "S2x2 S3x2 S1x2");
  EXPECT_THAT(p.actions[0].reason, HasSubstr("0.5 accesses/s"));
  // One session without a measurement: the level falls back to last use.
  st.sessions[2].access_rate.reset();
  p = plan_eviction(st, everything(), kNow, config());
  EXPECT_EQ(render(p), "S1x2 S3x2 S2x2");
}

TEST(Policy, RequesterIsNeverItsOwnVictim) {
  PoolState st;
  st.sessions = {session(1, Priority::Background, 4, 0, 100s), session(2, Priority::Background, 1, 0, 10s)};
  Request r;
  r.bytes = 4 * kBlock;
  r.requester = 1;
  auto p = plan_eviction(st, r, kNow, config());
  EXPECT_EQ(render(p), "S2x1");
  EXPECT_FALSE(p.satisfied);
  EXPECT_EQ(p.shortfall, "6 MiB of 8 MiB short: only the requesting session's own KV left: 8 MiB");
}

TEST(Policy, PriorityFilterStopsAtThatPriority) {
  Request r;
  r.everything = true;
  r.priorities = {Priority::Background};
  r.include_models = false;
  r.include_cached = false;
  auto p = plan_eviction(full_state(), r, kNow, config());
  EXPECT_EQ(render(p), "S4x1 S4x3");
  r.priorities = {Priority::System, Priority::Interactive};
  p = plan_eviction(full_state(), r, kNow, config());
  EXPECT_EQ(render(p), "S3x1 S3x1 S2x2");
}

TEST(Policy, StopsAsSoonAsBytesAreCoveredTakingOnlyWhatIsNeeded) {
  auto st = full_state();
  Request r;
  r.bytes = 3 * kBlock + 1;  // cached 2 blocks, then background partial 1, then 1 full block
  auto p = plan_eviction(st, r, kNow, config());
  EXPECT_EQ(render(p), "C7x2 S4x1 S4x1");
  EXPECT_EQ(p.bytes, 4 * kBlock);
  EXPECT_TRUE(p.satisfied);
  r.bytes = kBlock;  // one cached block suffices; the arena's other block stays
  p = plan_eviction(st, r, kNow, config());
  EXPECT_EQ(render(p), "C7x1");
  EXPECT_EQ(p.actions[0].bytes, kBlock);
}

TEST(Policy, ZeroBytesMeansTheLevelTarget) {
  auto st = full_state();
  Request r;
  r.level = Level::Some;  // 4 blocks
  auto p = plan_eviction(st, r, kNow, config());
  EXPECT_EQ(p.bytes, 4 * kBlock);
  EXPECT_EQ(render(p), "C7x2 S4x1 S4x1");
  r.level = Level::Full;  // 16 blocks: all KV (10 blocks) + the 100 MiB model
  p = plan_eviction(st, r, kNow, config());
  EXPECT_EQ(render(p), "C7x2 S4x1 S4x3 S3x1 S3x1 S2x2 M9");
  r.level = Level::None;  // nothing asked, nothing done
  p = plan_eviction(st, r, kNow, config());
  EXPECT_TRUE(p.actions.empty());
  EXPECT_TRUE(p.satisfied);
}

TEST(Policy, CachedBlocksLeastRecentlyUsedArenaFirst) {
  PoolState st;
  st.cached = {CachedBlocks{1, 3, kBlock, kNow - 5s}, CachedBlocks{2, 1, kBlock, kNow - 500s}};
  auto p = plan_eviction(st, everything(), kNow, config());
  EXPECT_EQ(render(p), "C2x1 C1x3");
  EXPECT_EQ(p.actions[0].reason, "cached prefix blocks unused for 500 s");
}

TEST(Policy, TargetedSessionsAndModels) {
  Request r;
  r.everything = true;
  r.sessions = {3, 1};  // 1 is active interactive: still never
  auto p = plan_eviction(full_state(), r, kNow, config());
  EXPECT_EQ(render(p), "S3x1 S3x1");
  r.sessions.clear();
  r.models = {9, 10};  // 10 is pinned: never
  p = plan_eviction(full_state(), r, kNow, config());
  EXPECT_EQ(render(p), "M9");
  r.everything = false;
  r.bytes = 1 * kGiB;
  p = plan_eviction(full_state(), r, kNow, config());
  EXPECT_THAT(p.shortfall, HasSubstr("only pinned models left: 200 MiB within the request's filters"));
}

TEST(Policy, PureSameInputsSamePlan) {
  auto a = plan_eviction(full_state(), everything(), kNow, config());
  auto b = plan_eviction(full_state(), everything(), kNow, config());
  EXPECT_EQ(render(a), render(b));
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST(Policy, PriorityNames) {
  for (Priority p : {Priority::Interactive, Priority::System, Priority::Background})
    EXPECT_EQ(parse_priority(to_string(p)), p);
  EXPECT_EQ(parse_priority("Interactive"), std::nullopt);
  EXPECT_EQ(parse_priority(""), std::nullopt);
  EXPECT_STREQ(to_string(Level::Full), "full");
  EXPECT_STREQ(to_string(Level::Some), "some");
  EXPECT_STREQ(to_string(Level::None), "none");
}

// Who may evict whom: the rules a KV allocation plans with, inside an arena
// and across arenas (they were a second, separate order before).
namespace {

PoolState kv_only(std::vector<SessionState> s) {
  PoolState st;
  st.sessions = std::move(s);
  return st;
}

std::vector<std::pair<uint64_t, uint32_t>> steps(const Plan& p) {
  std::vector<std::pair<uint64_t, uint32_t>> out;
  for (const auto& a : p.actions) out.emplace_back(a.id, a.blocks);
  return out;
}

}  // namespace

TEST(WhoMayEvictWhom, InteractiveTakesLowerLevelsThenIdleInteractiveNeverActiveNorItself) {
  auto st = kv_only({session(1, Priority::Interactive, 4, 1, 60s), session(2, Priority::System, 3, 1, 3600s),
                     session(3, Priority::Background, 2, 0, 1s), session(4, Priority::Interactive, 5, 1, 360s),
                     session(5, Priority::Background, 2, 1, 7200s), session(9, Priority::Interactive, 7, 1, 10800s)});
  Config c;
  c.idle_threshold = 300s;
  auto p = plan_eviction(st, Request::for_kv_allocation(Priority::Interactive, 9, 100 * kBlock), kNow, c);
  EXPECT_FALSE(p.satisfied);
  // background: partial tails first (5 is colder than 3), then full blocks;
  // then system; then idle interactive. Never 1 (active), never 9 (itself).
  const std::vector<std::pair<uint64_t, uint32_t>> want = {{5, 1}, {5, 1}, {3, 2}, {2, 1}, {2, 2}, {4, 1}, {4, 4}};
  EXPECT_EQ(steps(p), want);
  EXPECT_THAT(p.shortfall, HasSubstr("active interactive KV"));
  EXPECT_THAT(p.shortfall, HasSubstr("the requesting session's own KV"));
}

TEST(WhoMayEvictWhom, SystemTakesOnlyBackgroundAndBackgroundTakesNoSessionKv) {
  auto st = kv_only({session(1, Priority::Background, 2, 0, 0s), session(2, Priority::System, 2, 0, 3600s),
                     session(3, Priority::Interactive, 2, 0, 3600s)});
  Config c;
  c.idle_threshold = 300s;
  auto sys = plan_eviction(st, Request::for_kv_allocation(Priority::System, 9, 10 * kBlock), kNow, c);
  EXPECT_EQ(steps(sys), (std::vector<std::pair<uint64_t, uint32_t>>{{1, 2}}));
  auto bg = plan_eviction(st, Request::for_kv_allocation(Priority::Background, 9, kBlock), kNow, c);
  EXPECT_TRUE(bg.actions.empty());
  EXPECT_FALSE(bg.satisfied);
  // Equal priority across arenas too: a system session never takes another system session's KV.
  for (const auto& a : sys.actions) EXPECT_NE(a.id, 2u);
}

TEST(WhoMayEvictWhom, KvAllocationTakesCachedPrefixesFirstAndIdleModelsLast) {
  PoolState st;
  st.sessions = {session(1, Priority::Background, 2, 0, 10s)};
  st.cached = {CachedBlocks{7, 1, kBlock, kNow - 5s}};
  st.models = {model(20, "idle", 8 * kBlock, 0, false, 100s), model(21, "pinned", 8 * kBlock, 0, true, 900s),
               model(22, "used", 8 * kBlock, 1, false, 900s)};
  auto p = plan_eviction(st, Request::for_kv_allocation(Priority::Interactive, 9, 11 * kBlock), kNow, Config{});
  ASSERT_EQ(p.actions.size(), 3u);
  EXPECT_EQ(p.actions[0].kind, ActionKind::DropCached);
  EXPECT_EQ(p.actions[1].kind, ActionKind::EvictBlocks);
  EXPECT_EQ(p.actions[2].kind, ActionKind::EvictModel);
  EXPECT_EQ(p.actions[2].id, 20u);
  EXPECT_TRUE(p.satisfied);
}

TEST(WhoMayEvictWhom, ModelLoadTakesCachedKvAndIdleModelsButNeverSessionKv) {
  PoolState st;
  st.sessions = {session(1, Priority::Background, 50, 0, 9999s)};
  st.cached = {CachedBlocks{7, 2, kBlock, kNow - 5s}};
  st.models = {model(20, "idle", 4 * kBlock, 0, false, 100s)};
  auto p = plan_eviction(st, Request::for_model_load(6 * kBlock), kNow, Config{});
  EXPECT_TRUE(p.satisfied);
  ASSERT_EQ(p.actions.size(), 2u);
  EXPECT_EQ(p.actions[0].kind, ActionKind::DropCached);
  EXPECT_EQ(p.actions[1].kind, ActionKind::EvictModel);
  // More than cached KV and idle models hold: unsatisfied, and no session KV is offered.
  auto big = plan_eviction(st, Request::for_model_load(40 * kBlock), kNow, Config{});
  EXPECT_FALSE(big.satisfied);
  for (const auto& a : big.actions) EXPECT_NE(a.kind, ActionKind::EvictBlocks);
}

TEST(WhoMayEvictWhom, IdleMeansStrictlyLongerThanThreshold) {
  Config c;
  c.idle_threshold = 300s;
  auto st = kv_only({session(1, Priority::Interactive, 2, 0, 300s)});
  EXPECT_TRUE(plan_eviction(st, Request::for_kv_allocation(Priority::Interactive, 9, kBlock), kNow, c).actions.empty());
  EXPECT_EQ(plan_eviction(st, Request::for_kv_allocation(Priority::Interactive, 9, kBlock), kNow + 1ns, c).actions.size(),
            1u);
}
