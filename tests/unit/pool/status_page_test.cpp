// SPDX-License-Identifier: Apache-2.0
#include "wire/status_page.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace airs::client {
namespace {

TEST(StatusPage, LayoutAndReadyBitsAreSetOnlyWhenAsked) {
  const uint32_t units = 130;  // more than two bitmap words
  const wire::RankEntry ranks[3] = {{0, 1, 0, 0}, {1, 100, 0, 0}, {7, 29, 0, 0}};
  const uint64_t bytes = wire::status_page_bytes(units, 3);
  EXPECT_EQ(bytes, 64 + 3 * sizeof(wire::RankEntry) + 3 * 8);
  std::vector<uint64_t> mem(bytes / 8 + 1, 0xdeadbeefdeadbeefULL);  // garbage first
  wire::StatusPageWriter w(mem.data(), bytes);
  w.init(2 << 20, 12345, units, ranks, 3);
  const wire::StatusPageView v = w.view();
  ASSERT_TRUE(v.valid());
  EXPECT_EQ(v.unit_count(), units);
  EXPECT_EQ(v.state(), wire::ModelLoadState::Loading);
  for (uint32_t u = 0; u < units; ++u) EXPECT_FALSE(v.unit_ready(u)) << u;
  const uint32_t g0 = v.generation();
  w.set_ready(0, 0);
  w.set_ready(129, 2);
  w.publish();
  EXPECT_EQ(v.generation(), g0 + 1);
  EXPECT_TRUE(v.unit_ready(0));
  EXPECT_TRUE(v.unit_ready(129));
  EXPECT_FALSE(v.unit_ready(128));
  EXPECT_FALSE(v.unit_ready(130));  // out of range
  EXPECT_EQ(v.ready_units(), 2U);
  EXPECT_TRUE(v.rank_ready(0));
  EXPECT_FALSE(v.rank_ready(7));
  EXPECT_FALSE(v.rank_ready(3));  // unknown rank
  w.reset(wire::ModelLoadState::Evicted);
  EXPECT_FALSE(v.unit_ready(0));
  EXPECT_EQ(v.ready_units(), 0U);
  EXPECT_EQ(v.state(), wire::ModelLoadState::Evicted);
}

TEST(StatusPage, RejectsForeignOrTruncatedPages) {
  std::vector<uint64_t> mem(64, 0);
  EXPECT_FALSE(wire::StatusPageView(mem.data(), 512).valid());
  wire::StatusPageWriter w(mem.data(), 512);
  const wire::RankEntry r{0, 1000, 0, 0};
  w.init(4096, 1, 1000, &r, 1);
  EXPECT_FALSE(wire::StatusPageView(mem.data(), 64).valid());  // too short for 1000 units
}

}  // namespace
}  // namespace airs::client
