// SPDX-License-Identifier: Apache-2.0
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "daemon_fixture.hpp"
#include "harness.hpp"

using namespace airs::test;

namespace {

uint64_t meminfo(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key + ":") return v;
    in.ignore(256, '\n');
  }
  return 0;
}

std::string pool_toml(uint64_t pages, bool grow) {
  const uint64_t mib = pages * huge_page_size() / (1 << 20);
  return "[pool]\nsize = \"" + std::to_string(mib) + "M\"\ngrow_nr_hugepages = " + (grow ? "true" : "false") +
         "\n[pressure]\nresize_pool = false\n";
}

TEST(PoolLifecycle, StartsWithThePagesItGotAndSaysSo) {
  const uint64_t free0 = meminfo("HugePages_Free");
  if (free0 == 0) GTEST_SKIP() << "no free huge pages on this machine (scripts/hugepages.sh reserves them)";
  PrivateBus bus;
  DaemonProcess d(bus.address(), pool_toml(free0 + 16, false));
  ASSERT_TRUE(d.started()) << "a pool short of pages must still start:\n" << d.log();
  BusClient c(bus.address());
  auto st = c.status();
  const uint64_t total = st["pool"]["total_pages"].get<uint64_t>();
  EXPECT_GT(total, 0u);
  EXPECT_LE(total, free0);
  EXPECT_EQ(st["pool"]["target_bytes"].get<uint64_t>(), (free0 + 16) * huge_page_size()) << st["pool"].dump();
  EXPECT_NE(d.log().find("started with"), std::string::npos) << d.log();
  EXPECT_EQ(d.stop(), 0) << d.log();
}

TEST(PoolLifecycle, GivesBackOnExitExactlyTheHugePagesItAdded) {
  const uint64_t total0 = meminfo("HugePages_Total");
  const uint64_t free0 = meminfo("HugePages_Free");
  {
    PrivateBus bus;
    // 16 pages more than are free: the daemon raises nr_hugepages for them.
    DaemonProcess d(bus.address(), pool_toml(free0 + 16, true));
    ASSERT_TRUE(d.started()) << d.log();
    BusClient c(bus.address());
    auto st = c.status();
    const uint64_t raised = st["pool"]["raised_pages"].get<uint64_t>();
    EXPECT_GT(raised, 0u) << st["pool"].dump();
    EXPECT_EQ(meminfo("HugePages_Total"), total0 + raised) << "the kernel's pool did not grow by what status says";
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
  // A clean SIGTERM: what it added is gone, what was there before stays.
  EXPECT_EQ(meminfo("HugePages_Total"), total0);
  EXPECT_EQ(meminfo("HugePages_Free"), free0);
}

}  // namespace
