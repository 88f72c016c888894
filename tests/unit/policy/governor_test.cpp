// SPDX-License-Identifier: Apache-2.0
#include "policy/governor.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

using namespace airs::policy;
using namespace std::chrono_literals;
using Kind = Decision::Kind;

namespace {
const Clock::time_point t0 = Clock::time_point{} + 1000s;
GovernorConfig cfg() { return GovernorConfig{1000ms, 5000ms, 60000ms}; }
}  // namespace

TEST(Governor, EscalatesAtOnceAndEvicts) {
  Governor g(cfg(), t0);
  EXPECT_EQ(g.decide(t0, false).kind, Kind::Wait);
  EXPECT_EQ(g.observe(Level::Some, t0 + 1s), Level::Some);
  auto d = g.decide(t0 + 1s, false);
  EXPECT_EQ(d.kind, Kind::Evict);
  EXPECT_EQ(d.level, Level::Some);
  EXPECT_EQ(g.observe(Level::Full, t0 + 1100ms), Level::Full);
}

TEST(Governor, RateLimitsEvictions) {
  Governor g(cfg(), t0);
  g.observe(Level::Full, t0);
  g.record_eviction(t0);
  auto d = g.decide(t0 + 999ms, false);
  EXPECT_EQ(d.kind, Kind::Wait);
  EXPECT_EQ(d.retry_at, t0 + 1000ms);
  EXPECT_THAT(d.reason, ::testing::HasSubstr("rate limited: last eviction 999 ms ago (min 1000 ms)"));
  EXPECT_EQ(g.decide(t0 + 1000ms, false).kind, Kind::Evict);
}

TEST(Governor, LeavesPressureOnlyAfterStayingBelow) {
  Governor g(cfg(), t0);
  g.observe(Level::Full, t0);
  EXPECT_EQ(g.observe(Level::None, t0 + 1s), Level::Full);
  EXPECT_EQ(g.tick(t0 + 5999ms), Level::Full);
  // Pressure came back inside the hold: the timer starts over.
  EXPECT_EQ(g.observe(Level::Full, t0 + 5500ms), Level::Full);
  EXPECT_EQ(g.observe(Level::Some, t0 + 6s), Level::Full);
  EXPECT_EQ(g.tick(t0 + 10999ms), Level::Full);
  EXPECT_EQ(g.tick(t0 + 11s), Level::Some);
  EXPECT_EQ(g.level_since(), t0 + 11s);
}

TEST(Governor, GrowsBackAfterQuietPeriodOnlyWhenShrunk) {
  Governor g(cfg(), t0);
  g.observe(Level::Some, t0);
  g.record_eviction(t0);
  g.observe(Level::None, t0 + 1s);
  EXPECT_EQ(g.tick(t0 + 6s), Level::None);  // quiet since t0+6s
  auto d = g.decide(t0 + 65s, true);
  EXPECT_EQ(d.kind, Kind::Wait);
  EXPECT_EQ(d.retry_at, t0 + 66s);
  EXPECT_EQ(g.decide(t0 + 66s, true).kind, Kind::Grow);
  EXPECT_EQ(g.decide(t0 + 66s, false).kind, Kind::Wait);  // nothing to grow
  EXPECT_EQ(g.decide(t0 + 66s, false).retry_at, std::nullopt);
  g.record_grow(t0 + 66s);  // kernel gave fewer pages: try again a period later
  EXPECT_EQ(g.decide(t0 + 100s, true).kind, Kind::Wait);
  EXPECT_EQ(g.decide(t0 + 126s, true).kind, Kind::Grow);
}

TEST(Governor, KindNames) {
  EXPECT_STREQ(to_string(Kind::Evict), "evict");
  EXPECT_STREQ(to_string(Kind::Grow), "grow");
  EXPECT_STREQ(to_string(Kind::Wait), "wait");
}
