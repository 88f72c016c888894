// SPDX-License-Identifier: Apache-2.0
// numa_maps parsing on canned text: the lines a 6.x kernel prints for the
// pool's mappings (hugetlbfs memfd, shmem memfd), other VMAs, and malformed
// lines.
#include <string>

#include <gtest/gtest.h>

#include "sys/numa_maps.hpp"

namespace airs {
namespace {

constexpr const char* kNumaMaps =
    "55d0c8a00000 default file=/usr/sbin/airs-memd mapped=12 N0=12 kernelpagesize_kB=4\n"
    "55d0c9e00000 default heap anon=33 dirty=33 N0=33 kernelpagesize_kB=4\n"
    "7f3a00000000 interleave:0-3 file=/memfd:airs-model:llama\\040(deleted) huge dirty=8 N0=2 N1=2 N2=2 N3=2 "
    "kernelpagesize_kB=2048\n"
    "7f3a40000000 bind:1 file=/memfd:airs-model:qwen\\040(deleted) dirty=1024 active=0 N1=1024 kernelpagesize_kB=4\n"
    "7f3a80000000 local file=/dev/hugepages/airs-kv:s1 huge\n"
    "7f3ac0000000 weighted interleave:0-1 anon=6 dirty=6 N0=3 N1=3 kernelpagesize_kB=4\n"
    "7f3b00000000 prefer (many):0,2 anon=1 dirty=1 N2=1 kernelpagesize_kB=4\n"
    "7f3b40000000 interleave=static:0 anon=2 dirty=2 N0=2 kernelpagesize_kB=4 swapcache=0 newkey=7 futureword\n"
    "\n"
    "7ffc12300000 default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=4\n";

TEST(NumaMaps, ParsesEveryKindOfLine) {
  auto r = sys::parse_numa_maps(kNumaMaps, "fixture");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 9U);
  const auto& exe = (*r)[0];
  EXPECT_EQ(exe.start, 0x55d0c8a00000U);
  EXPECT_EQ(exe.policy, "default");
  EXPECT_EQ(exe.file, "/usr/sbin/airs-memd");
  EXPECT_FALSE(exe.huge);
  EXPECT_EQ(exe.page_size, 4096U);
  EXPECT_EQ(exe.pages(), 12U);

  const auto& heap = (*r)[1];
  EXPECT_EQ(heap.file, "");
  EXPECT_EQ(heap.pages(), 33U);

  const auto& huge = (*r)[2];
  EXPECT_EQ(huge.start, 0x7f3a00000000U);
  EXPECT_EQ(huge.policy, "interleave:0-3");
  EXPECT_EQ(huge.file, "/memfd:airs-model:llama\\040(deleted)");
  EXPECT_TRUE(huge.huge);
  EXPECT_EQ(huge.page_size, 2U << 20);
  EXPECT_EQ(huge.node_pages, (std::map<int, uint64_t>{{0, 2}, {1, 2}, {2, 2}, {3, 2}}));
  EXPECT_EQ(huge.pages(), 8U);

  const auto& bind = (*r)[3];
  EXPECT_EQ(bind.policy, "bind:1");
  EXPECT_EQ(bind.node_pages, (std::map<int, uint64_t>{{1, 1024}}));

  // Nothing touched yet: no N<node>= and no page size on the line.
  const auto& untouched = (*r)[4];
  EXPECT_EQ(untouched.policy, "local");
  EXPECT_TRUE(untouched.huge);
  EXPECT_EQ(untouched.page_size, 0U);
  EXPECT_TRUE(untouched.node_pages.empty());
  EXPECT_EQ(untouched.pages(), 0U);

  EXPECT_EQ((*r)[5].policy, "weighted interleave:0-1");
  EXPECT_EQ((*r)[5].pages(), 6U);
  EXPECT_EQ((*r)[6].policy, "prefer (many):0,2");
  EXPECT_EQ((*r)[6].node_pages, (std::map<int, uint64_t>{{2, 1}}));
  // Flags on the mode, keys and words newer than the parser.
  EXPECT_EQ((*r)[7].policy, "interleave=static:0");
  EXPECT_EQ((*r)[7].pages(), 2U);
  EXPECT_EQ((*r)[8].start, 0x7ffc12300000U);
}

TEST(NumaMaps, EmptyTextIsNoEntries) {
  auto r = sys::parse_numa_maps("", "fixture");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST(NumaMaps, MalformedLinesAreEinvalWithTheLineNumber) {
  struct Case {
    const char* line;
    const char* says;
  };
  for (const Case& c : {Case{"zz00 default N0=1 kernelpagesize_kB=4", "address"},
                        Case{"default N0=1", "address"},
                        Case{"7f00", "policy"},
                        Case{"7f00 N0=3 kernelpagesize_kB=4", "policy"},
                        Case{"7f00 file=/x N0=3", "policy"},
                        Case{"7f00 default N0=x kernelpagesize_kB=4", "page count"},
                        Case{"7f00 default N0=-1 kernelpagesize_kB=4", "page count"},
                        Case{"7f00 default N0x=1 kernelpagesize_kB=4", "node"},
                        Case{"7f00 default N0=1 kernelpagesize_kB=four", "kernelpagesize_kB"}}) {
    const std::string text = std::string("7e00 default anon=1 N0=1 kernelpagesize_kB=4\n") + c.line + "\n";
    auto r = sys::parse_numa_maps(text, "/proc/42/numa_maps");
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.error().code, EINVAL);
    EXPECT_NE(r.error().message.find("/proc/42/numa_maps line 2"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(c.says), std::string::npos) << r.error().message;
  }
}

constexpr const char* kMaps =
    "55d0c8a00000-55d0c8a0c000 r-xp 00000000 fe:01 1234 /usr/sbin/airs-memd\n"
    "55d0c9e00000-55d0c9e21000 rw-p 00000000 00:00 0 [heap]\n"
    "7f3a00000000-7f3a01000000 rw-s 00000000 00:0f 77 /memfd:airs-model:llama (deleted)\n"
    "7f3a40000000-7f3a40400000 rw-s 00000000 00:01 78 /memfd:airs-model:qwen (deleted)\n"
    "7f3a80000000-7f3a80200000 rw-s 00000000 00:2a 79 /dev/hugepages/airs-kv:s1\n"
    "7f3ac0000000-7f3ac0006000 rw-p 00000000 00:00 0\n"
    "7f3b00000000-7f3b00001000 rw-p 00000000 00:00 0\n"
    "7f3b40000000-7f3b40002000 rw-p 00000000 00:00 0\n"
    "7f3b80000000-7f3b80001000 ---p 00000000 00:00 0\n"
    "7ffc12300000-7ffc12321000 rw-p 00000000 00:00 0 [stack]\n";

TEST(NumaMaps, FindsTheVmaContainingAnAddress) {
  auto first = sys::find_numa_maps_entry(kNumaMaps, kMaps, 0x7f3a00000000, "fixture");
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->policy, "interleave:0-3");
  auto last_byte = sys::find_numa_maps_entry(kNumaMaps, kMaps, 0x7f3a00ffffff, "fixture");
  ASSERT_TRUE(last_byte.ok());
  EXPECT_EQ(last_byte->start, 0x7f3a00000000U);
  auto inner = sys::find_numa_maps_entry(kNumaMaps, kMaps, 0x7f3a40123456, "fixture");
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ(inner->policy, "bind:1");
}

TEST(NumaMaps, AnUnmappedAddressIsEnoent) {
  // Just past the first model mapping's end, in the gap before the next.
  auto gap = sys::find_numa_maps_entry(kNumaMaps, kMaps, 0x7f3a01000000, "fixture");
  ASSERT_FALSE(gap.ok());
  EXPECT_EQ(gap.error().code, ENOENT);
  EXPECT_NE(gap.error().message.find("0x7f3a01000000"), std::string::npos) << gap.error().message;
  // In maps but not in numa_maps (the mapping changed between the reads).
  auto raced = sys::find_numa_maps_entry(kNumaMaps, kMaps, 0x7f3b80000000, "fixture");
  ASSERT_FALSE(raced.ok());
  EXPECT_EQ(raced.error().code, ENOENT);
}

TEST(NumaMaps, MalformedMapsIsEinval) {
  auto r = sys::find_numa_maps_entry(kNumaMaps, "55d0c8a00000 r-xp\n", 0x55d0c8a00000, "fixture");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_NE(r.error().message.find("line 1"), std::string::npos);
}

}  // namespace
}  // namespace airs
