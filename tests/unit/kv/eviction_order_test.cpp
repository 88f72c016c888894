#include "kv/eviction_order.hpp"

#include <gtest/gtest.h>

namespace airs::kv {
namespace {

using namespace std::chrono_literals;

const TimePoint kT0{std::chrono::hours(100)};
constexpr auto kIdle = std::chrono::nanoseconds(5min);

struct Step {
  uint64_t id;
  uint32_t blocks;
};

std::vector<Step> steps(const VictimPlan& p) {
  std::vector<Step> out;
  for (const auto& a : p.actions) {
    EXPECT_EQ(a.kind, policy::ActionKind::EvictBlocks);
    EXPECT_EQ(a.bytes, uint64_t{a.blocks} * 1024);
    out.push_back({a.id, a.blocks});
  }
  return out;
}

bool operator==(const Step& a, const Step& b) { return a.id == b.id && a.blocks == b.blocks; }
void PrintTo(const Step& s, std::ostream* os) { *os << "{" << s.id << "," << s.blocks << "}"; }

TEST(EvictionOrder, LevelsInOrderNeverActiveInteractive) {
  const std::vector<VictimCandidate> c = {
      {1, Priority::Interactive, 4, 1, kT0 - 1min},   // active: never
      {2, Priority::System, 3, 1, kT0 - 1h},
      {3, Priority::Background, 2, 0, kT0 - 1s},
      {4, Priority::Interactive, 5, 1, kT0 - 6min},   // idle
      {5, Priority::Background, 2, 1, kT0 - 2h},
      {9, Priority::Interactive, 7, 1, kT0 - 3h},     // the requester itself
  };
  auto p = plan_allocation_eviction(c, 9, Priority::Interactive, 100, 1024, kT0, kIdle);
  EXPECT_FALSE(p.satisfied);
  EXPECT_EQ(p.blocks, 2u + 2u + 3u + 5u);
  // background: partial tails first (5 is colder than 3), then full blocks;
  // then system; then idle interactive.
  const std::vector<Step> want = {{5, 1}, {5, 1}, {3, 2}, {2, 1}, {2, 2}, {4, 1}, {4, 4}};
  EXPECT_EQ(steps(p), want);
  EXPECT_NE(p.shortfall.find("88 more blocks"), std::string::npos) << p.shortfall;
  EXPECT_NE(p.actions[5].reason.find("idle interactive KV idle 360 s"), std::string::npos) << p.actions[5].reason;
}

TEST(EvictionOrder, PartialBlocksFirstAcrossSessionsOfALevel) {
  const std::vector<VictimCandidate> c = {
      {1, Priority::Background, 5, 1, kT0 - 2h},
      {2, Priority::Background, 3, 1, kT0 - 1h},
  };
  auto p = plan_allocation_eviction(c, 9, Priority::Interactive, 3, 1024, kT0, kIdle);
  EXPECT_TRUE(p.satisfied);
  const std::vector<Step> want = {{1, 1}, {2, 1}, {1, 1}};
  EXPECT_EQ(steps(p), want);
}

TEST(EvictionOrder, StopsAsSoonAsCovered) {
  const std::vector<VictimCandidate> c = {{1, Priority::Background, 10, 2, kT0}};
  auto p = plan_allocation_eviction(c, 9, Priority::Interactive, 1, 1024, kT0, kIdle);
  EXPECT_TRUE(p.satisfied);
  EXPECT_EQ(steps(p), (std::vector<Step>{{1, 1}}));
  EXPECT_TRUE(plan_allocation_eviction(c, 9, Priority::Interactive, 0, 1024, kT0, kIdle).actions.empty());
}

TEST(EvictionOrder, RequesterOnlyTakesLevelsItOutranks) {
  const std::vector<VictimCandidate> c = {
      {1, Priority::Background, 2, 0, kT0},
      {2, Priority::System, 2, 0, kT0 - 1h},
      {3, Priority::Interactive, 2, 0, kT0 - 1h},
  };
  auto sys = plan_allocation_eviction(c, 9, Priority::System, 10, 1024, kT0, kIdle);
  EXPECT_EQ(steps(sys), (std::vector<Step>{{1, 2}}));
  auto bg = plan_allocation_eviction(c, 9, Priority::Background, 1, 1024, kT0, kIdle);
  EXPECT_TRUE(bg.actions.empty());
  EXPECT_FALSE(bg.satisfied);
  EXPECT_NE(bg.shortfall.find("background session may not evict (6 blocks"), std::string::npos) << bg.shortfall;
}

TEST(EvictionOrder, IdleMeansStrictlyLongerThanThreshold) {
  const std::vector<VictimCandidate> c = {{1, Priority::Interactive, 2, 0, kT0 - 5min}};
  EXPECT_TRUE(plan_allocation_eviction(c, 9, Priority::Interactive, 1, 1024, kT0, kIdle).actions.empty());
  EXPECT_EQ(plan_allocation_eviction(c, 9, Priority::Interactive, 1, 1024, kT0 + 1ns, kIdle).blocks, 1u);
}

TEST(EvictionOrder, DeterministicTieBreakById) {
  const std::vector<VictimCandidate> a = {{7, Priority::Background, 1, 0, kT0}, {3, Priority::Background, 1, 0, kT0}};
  const std::vector<VictimCandidate> b = {a[1], a[0]};
  EXPECT_EQ(steps(plan_allocation_eviction(a, 9, Priority::Interactive, 1, 1024, kT0, kIdle)),
            (std::vector<Step>{{3, 1}}));
  EXPECT_EQ(steps(plan_allocation_eviction(b, 9, Priority::Interactive, 1, 1024, kT0, kIdle)),
            (std::vector<Step>{{3, 1}}));
}

}  // namespace
}  // namespace airs::kv
