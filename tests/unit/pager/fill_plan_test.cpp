// SPDX-License-Identifier: Apache-2.0
#include "pager/fill_plan.hpp"

#include <gtest/gtest.h>

namespace airs::pager {
namespace {

constexpr uint64_t kU = 1000;  // any unit size: nothing assumes 2 MiB

TEST(RankUnits, MinimumRankOfOverlappingExtentsAndUnrankedLast) {
  // Units: [0,1000) [1000,2000) [2000,3000) [3000,3500)
  const std::vector<Extent> ext{{0, 100, 0}, {100, 1500, 2}, {1600, 500, 1}};
  const auto r = rank_units(ext, 3500, kU);
  ASSERT_EQ(r.size(), 4U);
  EXPECT_EQ(r[0], 0U);  // header rank 0 and rank 2
  EXPECT_EQ(r[1], 1U);  // ranks 2 and 1
  EXPECT_EQ(r[2], 1U);  // rank 1 ends at 2100
  EXPECT_EQ(r[3], kUnrankedUnit);
}

TEST(RankUnits, ClipsExtentsAtTheEndOfTheFileAndIgnoresEmptyOnes) {
  const std::vector<Extent> ext{{0, 0, 0}, {2500, 100000, 3}, {9999, 5, 0}};
  const auto r = rank_units(ext, 3001, kU);
  ASSERT_EQ(r.size(), 4U);
  EXPECT_EQ(r[0], kUnrankedUnit);
  EXPECT_EQ(r[2], 3U);
  EXPECT_EQ(r[3], 3U);
}

std::vector<uint32_t> drain(FillPlan& p, ReadClass cls) {
  std::vector<uint32_t> out;
  while (auto u = p.next(cls)) {
    out.push_back(*u);
    p.set_state(*u, UnitState::InFlight);
  }
  return out;
}

TEST(FillPlan, BackgroundFollowsRankOrderThenIndex) {
  FillPlan p({3, 0, 2, 0, 1, kUnrankedUnit}, 2);
  EXPECT_EQ(drain(p, ReadClass::Background), (std::vector<uint32_t>{1, 3, 4, 2, 0, 5}));
  EXPECT_EQ(p.in_flight(), 6U);
}

TEST(FillPlan, FaultedUnitsComeFirstOldestFirstAndOnlyOnce) {
  FillPlan p({0, 1, 2, 3, 4, 5}, 0);
  p.on_fault(4);
  p.on_fault(2);
  p.on_fault(4);  // duplicate event
  EXPECT_EQ(p.next(ReadClass::Urgent), 4U);
  p.set_state(4, UnitState::InFlight);
  p.on_fault(4);  // fault on an in-flight unit: not queued again
  EXPECT_EQ(p.next(ReadClass::Urgent), 2U);
  p.set_state(2, UnitState::InFlight);
  EXPECT_EQ(p.next(ReadClass::Urgent), std::nullopt);
}

TEST(FillPlan, PrefetchWindowCoversTheFaultedRankAndWMore) {
  FillPlan p({0, 1, 1, 2, 3, 4, 5}, 2);
  EXPECT_EQ(p.next(ReadClass::Prefetch), std::nullopt);  // no fault yet
  p.on_fault(2);  // rank 1 → window ranks 1..3
  p.set_state(2, UnitState::InFlight);
  EXPECT_EQ(drain(p, ReadClass::Prefetch), (std::vector<uint32_t>{1, 3, 4}));
  // A later fault moves the window.
  p.on_fault(6);
  EXPECT_EQ(drain(p, ReadClass::Prefetch), (std::vector<uint32_t>{6}));
}

TEST(FillPlan, PeekNamesTheUnitsNextWouldReturnWithoutChangingThem) {
  FillPlan p({3, 0, 2, 0, 1, kUnrankedUnit}, 1);
  p.set_state(3, UnitState::Ready);  // skipped: not EMPTY
  EXPECT_EQ(p.peek(ReadClass::Background, 3), (std::vector<uint32_t>{1, 4, 2}));
  EXPECT_EQ(p.peek(ReadClass::Background, 3), (std::vector<uint32_t>{1, 4, 2}));  // nothing moved
  EXPECT_EQ(p.next(ReadClass::Background), 1U);
  EXPECT_TRUE(p.peek(ReadClass::Prefetch, 3).empty());  // no fault yet
  EXPECT_TRUE(p.peek(ReadClass::Urgent, 3).empty());
  p.on_fault(2);  // rank 2 → window ranks 2..3
  EXPECT_EQ(p.peek(ReadClass::Prefetch, 5), (std::vector<uint32_t>{2, 0}));
  EXPECT_EQ(drain(p, ReadClass::Prefetch), (std::vector<uint32_t>{2, 0}));
  EXPECT_EQ(p.peek(ReadClass::Background, 9), (std::vector<uint32_t>{1, 4, 5}));
}

TEST(FillPlan, CountersFollowTransitionsAndResetEmptiesEverything) {
  FillPlan p({0, 0, 1}, 1);
  p.set_state(0, UnitState::InFlight);
  p.set_state(0, UnitState::Ready);
  p.set_state(1, UnitState::InFlight);
  p.set_state(1, UnitState::Failed);
  EXPECT_EQ(p.ready(), 1U);
  EXPECT_EQ(p.failed(), 1U);
  EXPECT_EQ(p.in_flight(), 0U);
  EXPECT_FALSE(p.complete());
  p.set_state(2, UnitState::Ready);
  EXPECT_TRUE(p.complete());
  p.on_fault(2);
  p.reset();
  EXPECT_EQ(p.ready() + p.failed() + p.in_flight(), 0U);
  EXPECT_EQ(p.next(ReadClass::Urgent), std::nullopt);
  EXPECT_EQ(drain(p, ReadClass::Background), (std::vector<uint32_t>{0, 1, 2}));
}

TEST(FillPlan, RankTableCountsUnitsPerRank) {
  FillPlan p({5, 1, 5, 5, kUnrankedUnit}, 1);
  ASSERT_EQ(p.ranks(), (std::vector<uint32_t>{1, 5, kUnrankedUnit}));
  EXPECT_EQ(p.units_of_rank_index(0), 1U);
  EXPECT_EQ(p.units_of_rank_index(1), 3U);
  EXPECT_EQ(p.units_of_rank_index(2), 1U);
  EXPECT_EQ(p.rank_index(3), 1U);
}

}  // namespace
}  // namespace airs::pager
