// SPDX-License-Identifier: Apache-2.0
#include "sys/hugepage_knobs.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fixture.hpp"
#include "util/units.hpp"

using namespace airs;
using ::testing::HasSubstr;

namespace {

constexpr uint64_t k2M = 2 * kMiB;
const std::string kGlobal = "sys/kernel/mm/hugepages/hugepages-2048kB/";

std::string node_dir(int n) { return "sys/devices/system/node/node" + std::to_string(n) + "/hugepages/hugepages-2048kB/"; }

void global(const test::FixtureDir& d, uint64_t nr, uint64_t free, uint64_t resv, uint64_t surplus = 0) {
  d.write(kGlobal + "nr_hugepages", std::to_string(nr) + "\n");
  d.write(kGlobal + "free_hugepages", std::to_string(free) + "\n");
  d.write(kGlobal + "resv_hugepages", std::to_string(resv) + "\n");
  d.write(kGlobal + "surplus_hugepages", std::to_string(surplus) + "\n");
}

void node(const test::FixtureDir& d, int n, uint64_t nr, uint64_t free) {
  d.write(node_dir(n) + "nr_hugepages", std::to_string(nr) + "\n");
  d.write(node_dir(n) + "free_hugepages", std::to_string(free) + "\n");
  d.write(node_dir(n) + "surplus_hugepages", "0\n");
}

}  // namespace

TEST(HugepageKnobs, ReadsGlobalAndPerNode) {
  test::FixtureDir d("hp-read");
  global(d, 30, 12, 2, 1);
  node(d, 0, 10, 4);
  node(d, 1, 20, 8);
  d.write("sys/devices/system/node/online", "0-1\n");  // not a node directory
  sys::HugepageKnobs k(d.root());
  auto c = k.read(k2M);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->nr, 30u);
  EXPECT_EQ(c->free, 12u);
  EXPECT_EQ(c->resv, 2u);
  EXPECT_EQ(c->surplus, 1u);
  ASSERT_EQ(c->nodes.size(), 2u);
  EXPECT_EQ(c->nodes[0].node, 0);
  EXPECT_EQ(c->nodes[0].nr, 10u);
  EXPECT_EQ(c->nodes[1].free, 8u);
  EXPECT_EQ(sys::pool_pages(*c), 30u);
}

TEST(HugepageKnobs, MissingSizeNamesHugetlbfs) {
  test::FixtureDir d("hp-missing");
  global(d, 0, 0, 0);
  sys::HugepageKnobs k(d.root());
  auto c = k.read(32 * kMiB);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, ENOENT);
  EXPECT_THAT(c.error().message, HasSubstr("no huge pages of 32 MiB"));
  EXPECT_THAT(c.error().message, HasSubstr("CONFIG_HUGETLBFS"));
}

TEST(HugepageKnobs, ShrinkSplitsAcrossNodesByFreePages) {
  test::FixtureDir d("hp-shrink-nodes");
  global(d, 30, 12, 2);
  node(d, 0, 10, 4);
  node(d, 1, 20, 8);
  sys::HugepageKnobs k(d.root());
  // 5 pages over free 4:8 → exact shares 1.67:3.33 → 1:3 plus the largest
  // remainder (node 0) → 2:3.
  auto r = k.shrink(k2M, 5);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(d.read(node_dir(0) + "nr_hugepages"), "8");
  EXPECT_EQ(d.read(node_dir(1) + "nr_hugepages"), "17");
  EXPECT_EQ(d.read(kGlobal + "nr_hugepages"), "30\n");  // the global knob is left alone
  EXPECT_EQ(r->requested, 5u);
  EXPECT_EQ(r->before, 30u);
  EXPECT_EQ(r->after, 25u);
  EXPECT_EQ(r->done, 5u);
  ASSERT_EQ(r->nodes.size(), 2u);
  EXPECT_EQ(r->nodes[0].asked, 2u);
  EXPECT_EQ(r->nodes[0].done, 2u);
  EXPECT_EQ(r->nodes[1].asked, 3u);
  EXPECT_EQ(r->nodes[1].done, 3u);
  EXPECT_TRUE(r->note.empty()) << r->note;
}

TEST(HugepageKnobs, ShrinkNeverTakesReservedOrUsedPages) {
  test::FixtureDir d("hp-shrink-resv");
  global(d, 30, 12, 2);
  node(d, 0, 10, 4);
  node(d, 1, 20, 8);
  sys::HugepageKnobs k(d.root());
  auto r = k.shrink(k2M, 25);  // 12 free, 2 of them reserved → 10 can go
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->done, 10u);
  // 10 over 4:8 → 3.33:6.67 → 3:6 plus node 1's larger remainder → 3:7.
  EXPECT_EQ(d.read(node_dir(0) + "nr_hugepages"), "7");
  EXPECT_EQ(d.read(node_dir(1) + "nr_hugepages"), "13");
  EXPECT_EQ(r->note, "gave back 10 of 25 pages of 2 MiB: only 10 free and unreserved (12 free, 2 reserved)");
}

TEST(HugepageKnobs, ShrinkWithoutNodesLowersTheGlobalCount) {
  test::FixtureDir d("hp-shrink-global");
  global(d, 16, 6, 0);
  sys::HugepageKnobs k(d.root());
  auto r = k.shrink(k2M, 4);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(d.read(kGlobal + "nr_hugepages"), "12");
  EXPECT_EQ(r->done, 4u);
  EXPECT_TRUE(r->nodes.empty());
  auto none = k.shrink(k2M, 0);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->done, 0u);
  EXPECT_EQ(d.read(kGlobal + "nr_hugepages"), "12");
}

TEST(HugepageKnobs, ShrinkWithNothingFreeWritesNothing) {
  test::FixtureDir d("hp-shrink-none");
  global(d, 8, 0, 0);
  node(d, 0, 8, 0);
  sys::HugepageKnobs k(d.root());
  auto r = k.shrink(k2M, 3);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->done, 0u);
  EXPECT_EQ(d.read(node_dir(0) + "nr_hugepages"), "8\n");
  EXPECT_THAT(r->note, HasSubstr("only 0 free and unreserved"));
}

TEST(HugepageKnobs, GrowWritesTheGlobalCount) {
  test::FixtureDir d("hp-grow");
  global(d, 10, 0, 0);
  sys::HugepageKnobs k(d.root());
  auto r = k.grow(k2M, 6);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(d.read(kGlobal + "nr_hugepages"), "16");
  EXPECT_EQ(r->before, 10u);
  EXPECT_EQ(r->after, 16u);
  EXPECT_EQ(r->done, 6u);
  EXPECT_TRUE(r->note.empty());
}

TEST(HugepageKnobs, WriteErrorsNameTheFile) {
  test::FixtureDir d("hp-ro");
  global(d, 10, 5, 0);
  sys::HugepageKnobs k(d.root());
  // A directory where the knob should be: open for writing fails with EISDIR.
  std::filesystem::remove(d.path(kGlobal + "nr_hugepages"));
  std::filesystem::create_directories(d.path(kGlobal + "nr_hugepages"));
  auto r = k.grow(k2M, 1);
  ASSERT_FALSE(r);
  EXPECT_THAT(r.error().message, HasSubstr("nr_hugepages"));
}
