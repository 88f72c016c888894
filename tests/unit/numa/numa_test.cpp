// SPDX-License-Identifier: Apache-2.0
// Node lists, policy names and node validation against fixture sysfs files.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "sys/numa.hpp"

namespace airs {
namespace {

using sys::NumaPolicy;
using V = std::vector<int>;

class TempDir {
 public:
  TempDir() {
    std::string t = "/tmp/airs-numa-XXXXXX";
    EXPECT_NE(::mkdtemp(t.data()), nullptr);
    path_ = t;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  void write(const std::string& rel, const std::string& text) const {
    const auto p = std::filesystem::path(path_) / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  [[nodiscard]] std::string path(const std::string& rel = "") const { return path_ + (rel.empty() ? "" : "/" + rel); }

 private:
  std::string path_;
};

TEST(NodeList, ParsesTheKernelsForms) {
  EXPECT_EQ(*sys::parse_node_list("0\n", "t"), (V{0}));
  EXPECT_EQ(*sys::parse_node_list("0-7", "t"), (V{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(*sys::parse_node_list("0,2-3,9", "t"), (V{0, 2, 3, 9}));
  EXPECT_EQ(*sys::parse_node_list("3,1,1", "t"), (V{1, 3}));
  EXPECT_EQ(*sys::parse_node_list("\n", "t"), V{});  // has_cpu on a CPU-less box
}

TEST(NodeList, RejectsGarbageNamingTheSource) {
  for (const char* bad : {"a", "3-1", "0,", ",0", "1--2", "-1", "0-", "1 2", "0x1"}) {
    auto r = sys::parse_node_list(bad, "/sys/x/online");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code, EINVAL);
    EXPECT_NE(r.error().message.find("/sys/x/online"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(bad), std::string::npos) << r.error().message;
  }
}

TEST(NodeList, FormatsLikeTheKernel) {
  EXPECT_EQ(sys::format_node_list({}), "");
  EXPECT_EQ(sys::format_node_list({0}), "0");
  EXPECT_EQ(sys::format_node_list({0, 1}), "0-1");
  EXPECT_EQ(sys::format_node_list({0, 2}), "0,2");
  EXPECT_EQ(sys::format_node_list({0, 1, 2, 3, 5, 7, 8}), "0-3,5,7-8");
  for (const char* s : {"0-7", "0,2-3,9", "4"})
    EXPECT_EQ(sys::format_node_list(*sys::parse_node_list(s, "t")), s);
}

TEST(NumaPolicyName, RoundTripsAndRejectsOthers) {
  for (NumaPolicy p : {NumaPolicy::Local, NumaPolicy::Bind, NumaPolicy::Interleave})
    EXPECT_EQ(*sys::parse_numa_policy(sys::to_string(p)), p);
  auto r = sys::parse_numa_policy("preferred");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("preferred"), std::string::npos);
  EXPECT_NE(r.error().message.find("interleave"), std::string::npos);
}

TEST(ResolveNodes, EmptyMeansEveryNodeWithMemoryLocalNeedsNone) {
  TempDir d;
  d.write("has_memory", "0-3\n");
  EXPECT_EQ(*sys::resolve_numa_nodes(NumaPolicy::Interleave, {}, d.path("has_memory")), (V{0, 1, 2, 3}));
  EXPECT_EQ(*sys::resolve_numa_nodes(NumaPolicy::Bind, {}, d.path("has_memory")), (V{0, 1, 2, 3}));
  EXPECT_EQ(*sys::resolve_numa_nodes(NumaPolicy::Bind, {3, 1, 3}, d.path("has_memory")), (V{1, 3}));
  EXPECT_EQ(*sys::resolve_numa_nodes(NumaPolicy::Local, {7}, d.path("has_memory")), V{});
}

TEST(ResolveNodes, AnOfflineNodeIsEinvalNamingItAndTheOnlineOnes) {
  TempDir d;
  d.write("has_memory", "0,2-3\n");
  auto r = sys::resolve_numa_nodes(NumaPolicy::Bind, {0, 1}, d.path("has_memory"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_NE(r.error().message.find("node 1 "), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("0,2-3"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("pool.numa_nodes"), std::string::npos) << r.error().message;
  EXPECT_FALSE(sys::resolve_numa_nodes(NumaPolicy::Interleave, {64}, d.path("has_memory")).ok());
  EXPECT_FALSE(sys::resolve_numa_nodes(NumaPolicy::Interleave, {-1}, d.path("has_memory")).ok());
}

TEST(ResolveNodes, NoNumaInTheKernelIsNodeZero) {
  TempDir d;
  EXPECT_EQ(*sys::resolve_numa_nodes(NumaPolicy::Interleave, {}, d.path("missing")), (V{0}));
  EXPECT_FALSE(sys::resolve_numa_nodes(NumaPolicy::Bind, {1}, d.path("missing")).ok());
}

TEST(ResolveNodes, GarbageInSysfsIsAnError) {
  TempDir d;
  d.write("has_memory", "zero\n");
  auto r = sys::resolve_numa_nodes(NumaPolicy::Bind, {0}, d.path("has_memory"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("has_memory"), std::string::npos);
}

TEST(NumaMapsPolicy, SpelledAsTheKernelPrintsIt) {
  EXPECT_EQ(sys::numa_maps_policy(NumaPolicy::Local, {}), "local");
  EXPECT_EQ(sys::numa_maps_policy(NumaPolicy::Bind, {0}), "bind:0");
  EXPECT_EQ(sys::numa_maps_policy(NumaPolicy::Interleave, {0, 1, 2, 3, 4, 5, 6, 7}), "interleave:0-7");
  EXPECT_EQ(sys::numa_maps_policy(NumaPolicy::Bind, {1, 3}), "bind:1,3");
}

TEST(NodeHugePages, OneEntryPerNodeWithMemory) {
  TempDir d;
  d.write("has_memory", "0-1\n");
  for (int n : {0, 1}) {
    const std::string h = "node" + std::to_string(n) + "/hugepages/hugepages-2048kB/";
    d.write(h + "nr_hugepages", std::to_string(10 + n) + "\n");
    d.write(h + "free_hugepages", std::to_string(4 + n) + "\n");
    d.write(h + "surplus_hugepages", "0\n");
  }
  auto r = sys::read_node_huge_pages(2 << 20, d.path());
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 2U);
  EXPECT_EQ((*r)[1].node, 1);
  EXPECT_EQ((*r)[1].nr, 11U);
  EXPECT_EQ((*r)[1].free, 5U);
  EXPECT_EQ((*r)[0].nr, 10U);
  auto missing = sys::read_node_huge_pages(1 << 30, d.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("hugepages-1048576kB"), std::string::npos) << missing.error().message;
}

}  // namespace
}  // namespace airs
