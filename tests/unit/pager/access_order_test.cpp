// SPDX-License-Identifier: Apache-2.0
// The recorded access order's file format (untrusted input) and its replay
// as the fill plan's warm-up order.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <xxhash.h>

#include "pager/access_order.hpp"
#include "pager/fill_plan.hpp"

namespace airs::pager {
namespace {

constexpr uint64_t kUnit = 2 << 20;

std::vector<uint32_t> background_order(FillPlan& p) {
  std::vector<uint32_t> out;
  while (auto u = p.next(ReadClass::Background)) {
    out.push_back(*u);
    p.set_state(*u, UnitState::Ready);
  }
  return out;
}

TEST(AccessOrder, RoundTripsWithItsExactLayout) {
  const std::vector<uint32_t> order{7, 0, 3};
  const auto bytes = encode_access_order(kUnit, 9, order);
  ASSERT_EQ(bytes.size(), 32U + 12 + 8);
  EXPECT_EQ(std::memcmp(bytes.data(), "AIRSORD\n", 8), 0);
  const std::vector<uint8_t> header_tail{1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin() + 8, bytes.begin() + 32), header_tail);
  EXPECT_EQ(std::vector<uint8_t>(bytes.begin() + 32, bytes.begin() + 44),
            (std::vector<uint8_t>{7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0}));
  auto back = parse_access_order(bytes.data(), bytes.size(), kUnit, 9);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, order);
}

TEST(AccessOrder, EmptyRecordingParses) {
  const auto bytes = encode_access_order(kUnit, 4, {});
  auto back = parse_access_order(bytes.data(), bytes.size(), kUnit, 4);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->empty());
}

TEST(AccessOrder, ForeignGeometryIsStale) {
  const auto bytes = encode_access_order(kUnit, 9, {1, 2});
  EXPECT_EQ(parse_access_order(bytes.data(), bytes.size(), kUnit, 10).error().code, ESTALE);
  EXPECT_EQ(parse_access_order(bytes.data(), bytes.size(), 4096, 9).error().code, ESTALE);
}

// A recording sealed again after an edit (its checksum recomputed), so the
// checks behind the checksum are reached.
std::vector<uint8_t> resealed(std::vector<uint8_t> b) {
  const uint64_t h = XXH3_64bits(b.data(), b.size() - 8);
  for (size_t i = 0; i < 8; ++i) b[b.size() - 8 + i] = static_cast<uint8_t>(h >> (8 * i));
  return b;
}

TEST(AccessOrder, EditedFieldsBehindAValidChecksumAreRejected) {
  const auto base = encode_access_order(kUnit, 9, {4, 5, 6});
  auto set32 = [](std::vector<uint8_t> b, size_t off, uint32_t v) {
    for (size_t i = 0; i < 4; ++i) b[off + i] = static_cast<uint8_t>(v >> (8 * i));
    return resealed(std::move(b));
  };
  auto parse = [](const std::vector<uint8_t>& b) { return parse_access_order(b.data(), b.size(), kUnit, 9); };
  ASSERT_TRUE(parse(resealed(base)).ok());
  EXPECT_EQ(parse(set32(base, 8, 2)).error().code, ENOTSUP);       // version
  EXPECT_EQ(parse(set32(base, 28, 1)).error().code, EBADMSG);      // reserved
  EXPECT_EQ(parse(set32(base, 36, 4)).error().code, EBADMSG);      // duplicate of entry 0
  EXPECT_EQ(parse(set32(base, 40, 9)).error().code, EBADMSG);      // out of range
  EXPECT_EQ(parse(set32(base, 24, 4)).error().code, EBADMSG);      // entry count past the bytes
  auto magic = base;
  magic[0] = 'X';
  EXPECT_EQ(parse(resealed(magic)).error().code, EBADMSG);
  // More entries than units (each distinct and in range is impossible, but
  // the count alone must not pass).
  const auto many = encode_access_order(kUnit, 2, {0, 1});
  auto m2 = set32(many, 12, 1);  // claims 1 unit, holds 2 entries
  EXPECT_FALSE(parse_access_order(m2.data(), m2.size(), kUnit, 1).ok());
}

TEST(AccessOrder, RandomCorruptionIsNeverAccepted) {
  std::mt19937_64 rng(17);
  std::vector<uint32_t> order(200);
  std::iota(order.begin(), order.end(), 0U);
  std::shuffle(order.begin(), order.end(), rng);
  const auto good = encode_access_order(kUnit, 300, order);
  ASSERT_TRUE(parse_access_order(good.data(), good.size(), kUnit, 300).ok());
  for (int round = 0; round < 5000; ++round) {
    auto b = good;
    switch (round % 4) {
      case 0: {  // flip 1..4 random bits
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int i = 0; i < flips; ++i) b[rng() % b.size()] ^= static_cast<uint8_t>(1U << (rng() % 8));
        break;
      }
      case 1:  // truncated
        b.resize(rng() % b.size());
        break;
      case 2:  // garbage appended
        for (uint64_t i = 0, n = 1 + rng() % 16; i < n; ++i) b.push_back(static_cast<uint8_t>(rng()));
        break;
      case 3:  // a random run overwritten
        for (uint64_t i = rng() % b.size(), n = 1 + rng() % 32; i < b.size() && n > 0; ++i, --n)
          b[i] = static_cast<uint8_t>(rng());
        break;
    }
    if (b == good) continue;
    auto r = parse_access_order(b.data(), b.size(), kUnit, 300);
    EXPECT_FALSE(r.ok()) << "round " << round << " accepted a corrupted recording";
  }
  // Pure noise of every small length.
  for (size_t len = 0; len < 128; ++len) {
    std::vector<uint8_t> b(len);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    EXPECT_FALSE(parse_access_order(b.data(), b.size(), kUnit, 300).ok());
  }
}

TEST(AccessOrder, RecorderKeepsFirstAccessesOnce) {
  AccessRecorder r(5);
  for (uint32_t u : {3U, 1U, 3U, 9U, 1U, 0U}) r.note(u);
  EXPECT_EQ(r.order(), (std::vector<uint32_t>{3, 1, 0}));
  EXPECT_TRUE(r.seen(3));
  EXPECT_FALSE(r.seen(2));
  EXPECT_FALSE(r.seen(9));
}

TEST(FillPlanWarmupOrder, ReplaysTheRecordingThenTheRestInRankOrder) {
  // Ranks: units 0-1 rank 0, 2-3 rank 1, 4-5 rank 2.
  FillPlan p({0, 0, 1, 1, 2, 2}, 1);
  ASSERT_TRUE(p.set_warmup_order({5, 0, 3}));
  EXPECT_EQ(p.peek(ReadClass::Background, 6), (std::vector<uint32_t>{5, 0, 3, 1, 2, 4}));
  EXPECT_EQ(background_order(p), (std::vector<uint32_t>{5, 0, 3, 1, 2, 4}));
  // It survives an eviction's reset.
  p.reset();
  EXPECT_EQ(background_order(p), (std::vector<uint32_t>{5, 0, 3, 1, 2, 4}));
}

TEST(FillPlanWarmupOrder, FaultsAndPrefetchStillComeFirst) {
  FillPlan p({0, 0, 1, 1, 2, 2}, 0);
  ASSERT_TRUE(p.set_warmup_order({5, 4}));
  p.on_fault(2);
  EXPECT_EQ(p.next(ReadClass::Urgent), std::optional<uint32_t>(2));
  p.set_state(2, UnitState::InFlight);
  EXPECT_EQ(p.next(ReadClass::Prefetch), std::optional<uint32_t>(3));  // rank 1's other unit
  EXPECT_EQ(p.next(ReadClass::Background), std::optional<uint32_t>(5));
}

// The layer window would prefetch unit 1 (rank 0's other unit) after a
// fault on unit 0; the replayed order knows unit 5 comes next, and the window
// holds as many units as the layer window (rank 0: two).
TEST(FillPlanWarmupOrder, PrefetchFollowsTheReplayedOrder) {
  FillPlan p({0, 0, 1, 1, 2, 2}, 0);
  ASSERT_TRUE(p.set_warmup_order({0, 5, 3}));
  p.on_fault(0);
  EXPECT_EQ(p.next(ReadClass::Urgent), std::optional<uint32_t>(0));
  p.set_state(0, UnitState::InFlight);
  EXPECT_EQ(p.peek(ReadClass::Prefetch, 4), (std::vector<uint32_t>{5}));
  EXPECT_EQ(p.next(ReadClass::Prefetch), std::optional<uint32_t>(5));
  p.set_state(5, UnitState::InFlight);
  EXPECT_EQ(p.next(ReadClass::Prefetch), std::nullopt);
  EXPECT_EQ(p.next(ReadClass::Background), std::optional<uint32_t>(3));
  // Without a replay, the same fault prefetches by layer.
  FillPlan q({0, 0, 1, 1, 2, 2}, 0);
  q.on_fault(0);
  q.set_state(0, UnitState::InFlight);
  EXPECT_EQ(q.next(ReadClass::Prefetch), std::optional<uint32_t>(1));
}

TEST(FillPlanWarmupOrder, InvalidOrdersChangeNothing) {
  FillPlan p({0, 1, 2}, 1);
  EXPECT_FALSE(p.set_warmup_order({2, 2}));
  EXPECT_FALSE(p.set_warmup_order({3}));
  EXPECT_EQ(background_order(p), (std::vector<uint32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace airs::pager
