// SPDX-License-Identifier: Apache-2.0
#include "client/sampler.hpp"

#include <cstdlib>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace airs::client {
namespace {

using namespace std::chrono_literals;
using Clock = Sampler::Clock;

TEST(Sampler, ARoundIsDueOncePerPeriod) {
  const auto t0 = Clock::time_point{} + 1s;
  Sampler s({10ms, 2}, 8, t0);
  ASSERT_TRUE(s.enabled());
  EXPECT_EQ(s.timeout_ms(t0), 10);
  EXPECT_EQ(s.timeout_ms(t0 + 9500us), 1) << "rounded up, never a hair early";
  int offered = 0;
  EXPECT_EQ(s.round(t0 + 9ms, [&](uint32_t) { return ++offered, true; }), 0U) << "not due yet";
  EXPECT_EQ(offered, 0);
  EXPECT_EQ(s.round(t0 + 10ms, [](uint32_t) { return true; }), 2U);
  EXPECT_EQ(s.timeout_ms(t0 + 10ms), 10) << "the next round is a period after this one";
  EXPECT_EQ(s.round(t0 + 11ms, [](uint32_t) { return true; }), 0U);
}

TEST(Sampler, RoundsGoRoundRobinAndSkipUnitsThatAreNotIn) {
  auto t = Clock::time_point{} + 1s;
  Sampler s({1ms, 3}, 10, t);
  const std::set<uint32_t> in = {1, 2, 4, 7, 8, 9};
  std::vector<uint32_t> got;
  const auto take = [&](uint32_t u) {
    if (!in.contains(u)) return false;
    got.push_back(u);
    return true;
  };
  for (int i = 0; i < 4; ++i) {
    t += 1ms;
    EXPECT_EQ(s.round(t, take), 3U) << "round " << i;
  }
  // From where each round stopped: every unit that is in, alike.
  EXPECT_EQ(got, (std::vector<uint32_t>{1, 2, 4, 7, 8, 9, 1, 2, 4, 7, 8, 9}));
}

TEST(Sampler, ARoundOffersEachUnitOnceAtMost) {
  auto t = Clock::time_point{} + 1s;
  Sampler s({1ms, 100}, 5, t);
  std::vector<uint32_t> offered;
  t += 1ms;
  EXPECT_EQ(s.round(t, [&](uint32_t u) { return offered.push_back(u), u == 3; }), 1U);
  EXPECT_EQ(offered, (std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

TEST(Sampler, ZeroPeriodZeroUnitsOrNoUnitsIsOff) {
  const auto t0 = Clock::time_point{} + 1s;
  for (const auto& [o, n] : {std::pair{SamplerOptions{0ms, 4}, 8U}, {SamplerOptions{5ms, 0}, 8U}, {SamplerOptions{5ms, 4}, 0U}}) {
    Sampler s(o, n, t0);
    EXPECT_FALSE(s.enabled());
    EXPECT_EQ(s.timeout_ms(t0 + 1h), -1);
    EXPECT_EQ(s.round(t0 + 1h, [](uint32_t) { return true; }), 0U);
  }
}

TEST(Sampler, TheEnvironmentSetsPeriodAndUnitsAndABadValueKeepsTheDefault) {
  ::unsetenv("AIRS_SAMPLE_MS");
  ::unsetenv("AIRS_SAMPLE_UNITS");
  const SamplerOptions d = sampler_options_from_env();
  EXPECT_GT(d.period.count(), 0) << "on by default";
  EXPECT_GT(d.units, 0U);
  EXPECT_FALSE(d.from_env);
  ::setenv("AIRS_SAMPLE_MS", "0", 1);
  ::setenv("AIRS_SAMPLE_UNITS", "7", 1);
  SamplerOptions o = sampler_options_from_env();
  EXPECT_EQ(o.period.count(), 0);
  EXPECT_EQ(o.units, 7U);
  EXPECT_TRUE(o.from_env);
  ::setenv("AIRS_SAMPLE_MS", "12ms", 1);
  ::setenv("AIRS_SAMPLE_UNITS", "-1", 1);
  o = sampler_options_from_env();
  EXPECT_EQ(o.period, d.period);
  EXPECT_EQ(o.units, d.units);
  EXPECT_FALSE(o.from_env);
  ::unsetenv("AIRS_SAMPLE_MS");
  ::unsetenv("AIRS_SAMPLE_UNITS");
}

}  // namespace
}  // namespace airs::client
