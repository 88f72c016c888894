// SPDX-License-Identifier: Apache-2.0
#include "pager/read_rate.hpp"

#include <gtest/gtest.h>

namespace airs::pager {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kMiB = 1 << 20;

TEST(ReadRate, ZeroMeansUnlimited) {
  const auto t0 = ReadRate::Clock::time_point{} + 1s;
  ReadRate r(0, 100ms, t0);
  EXPECT_TRUE(r.unlimited());
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(r.take(64 * kMiB, t0));
  EXPECT_EQ(r.wait(t0), 0ns);
}

TEST(ReadRate, LongRunRateHoldsForUnitsLargerThanTheBucket) {
  // 8 MiB/s with 2 MiB units and a 50 ms bucket (0.4 MiB): every unit puts
  // the bucket in debt; over simulated time exactly rate × time goes out.
  auto t = ReadRate::Clock::time_point{} + 1s;
  ReadRate r(8 * kMiB, 50ms, t);
  uint64_t sent = 0;
  const auto end = t + 10s;
  while (t < end) {
    if (r.take(2 * kMiB, t)) {
      sent += 2 * kMiB;
      continue;
    }
    const auto w = r.wait(t);
    ASSERT_GT(w, 0ns);
    t += w;
  }
  // The first take is free (empty bucket, no debt): one unit on top.
  EXPECT_GE(sent, 80 * kMiB);
  EXPECT_LE(sent, 80 * kMiB + 2 * kMiB + 2 * kMiB);
}

TEST(ReadRate, WaitIsExactlyTheDebtOverTheRate) {
  const auto t0 = ReadRate::Clock::time_point{} + 1s;
  ReadRate r(1 * kMiB, 0ns, t0);
  ASSERT_TRUE(r.take(kMiB / 2, t0));  // debt: 0.5 MiB
  EXPECT_FALSE(r.take(1, t0));
  const auto w = r.wait(t0);
  EXPECT_GE(w, 500ms);
  EXPECT_LE(w, 500ms + 2ns);
  EXPECT_FALSE(r.take(1, t0 + 499ms));
  EXPECT_TRUE(r.take(1, t0 + w));
}

TEST(ReadRate, IdleTimeSavesAtMostTheBurst) {
  const auto t0 = ReadRate::Clock::time_point{} + 1s;
  ReadRate r(10 * kMiB, 100ms, t0);  // bucket: 1 MiB
  // An hour idle saves 1 MiB, not 36 GiB: 1 MiB in 64 KiB reads is 16
  // reads, the 17th still goes (no debt yet), the 18th waits.
  const auto t1 = t0 + 1h;
  int n = 0;
  while (r.take(64 * 1024, t1)) ++n;
  EXPECT_EQ(n, 17);
}

TEST(ReadRate, TimeGoingBackwardsChangesNothing) {
  const auto t0 = ReadRate::Clock::time_point{} + 10s;
  ReadRate r(kMiB, 0ns, t0);
  ASSERT_TRUE(r.take(kMiB, t0));
  EXPECT_FALSE(r.take(1, t0 - 5s));
  EXPECT_GE(r.wait(t0 - 5s), 1s);
}

}  // namespace
}  // namespace airs::pager
