// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "sys/procfs.hpp"

namespace fs = std::filesystem;
using namespace airs;

namespace {
fs::path fixture_dir() {
  auto d = fs::temp_directory_path() / ("airs-procfs-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}
void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << s;
}
}  // namespace

TEST(Procfs, MeminfoConvertsKilobytesAndKeepsPageCounts) {
  auto d = fixture_dir();
  write(d / "meminfo",
        "MemTotal:       24576000 kB\nMemAvailable:    1000 kB\nHugePages_Total:     512\nHugepagesize:       2048 kB\n");
  auto m = sys::read_meminfo((d / "meminfo").string());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->at("MemTotal"), 24576000ull * 1024);
  EXPECT_EQ(m->at("MemAvailable"), 1000ull * 1024);
  EXPECT_EQ(m->at("HugePages_Total"), 512u);
  EXPECT_EQ(m->at("Hugepagesize"), 2048ull * 1024);
  fs::remove_all(d);
}

TEST(Procfs, HugepageSizesAreDiscoveredNotAssumed) {
  auto d = fixture_dir() / "hp";
  // A 16 KiB-page arm64 kernel: 64 KiB, 2 MiB (cont-PTE), 32 MiB (PMD), 1 GiB.
  for (auto [kb, nr] : {std::pair{32768, 8}, {64, 0}, {2048, 3}, {1048576, 0}}) {
    auto sub = d / ("hugepages-" + std::to_string(kb) + "kB");
    write(sub / "nr_hugepages", std::to_string(nr) + "\n");
    write(sub / "free_hugepages", "1\n");
    write(sub / "resv_hugepages", "0\n");
    write(sub / "surplus_hugepages", "0\n");
  }
  auto sizes = sys::read_hugepage_sizes(d.string());
  ASSERT_TRUE(sizes) << sizes.error().message;
  ASSERT_EQ(sizes->size(), 4u);
  EXPECT_EQ((*sizes)[0].bytes, 64u * 1024);
  EXPECT_EQ((*sizes)[2].bytes, 32u * 1024 * 1024);
  EXPECT_EQ((*sizes)[2].nr, 8u);
  EXPECT_EQ((*sizes)[3].bytes, 1024ull * 1024 * 1024);
  fs::remove_all(d.parent_path());
}

TEST(Procfs, MissingHugepageDirSaysWhy) {
  auto sizes = sys::read_hugepage_sizes("/nonexistent/hugepages");
  ASSERT_FALSE(sizes);
  EXPECT_NE(sizes.error().message.find("hugetlbfs"), std::string::npos);
}

TEST(Mountinfo, ParsesEveryLineAndUnescapesTheMountPoint) {
  const auto m = sys::parse_mountinfo(
      "22 1 0:21 / /proc rw - proc proc rw\n"
      "40 22 0:40 / /mnt/huge\\040pages rw,relatime shared:9 master:2 - hugetlbfs none rw,pagesize=2M\n"
      "no separator here\n"
      "41 22 0:41 / /a\\134b rw - tmpfs tmpfs rw,size=1k");
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].mount_point, "/proc");
  EXPECT_EQ(m[0].fstype, "proc");
  EXPECT_EQ(m[1].mount_point, "/mnt/huge pages");  // optional fields skipped
  EXPECT_EQ(m[1].fstype, "hugetlbfs");
  EXPECT_EQ(m[1].super_options, "rw,pagesize=2M");
  EXPECT_EQ(m[2].mount_point, "/a\\b");
  EXPECT_EQ(m[2].super_options, "rw,size=1k");
}

TEST(Maps, ParsesALineWithItsPathAsPrinted) {
  const auto f = sys::parse_maps_line("7f2000028000-7f20001bd000 r-xp 00028000 fe:00 200    /srv/a model.gguf (deleted)");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->start, 0x7f2000028000u);
  EXPECT_EQ(f->end, 0x7f20001bd000u);
  EXPECT_EQ(f->perms, "r-xp");
  EXPECT_EQ(f->dev, "fe:00");
  EXPECT_EQ(f->inode, 200u);
  EXPECT_EQ(f->path, "/srv/a model.gguf (deleted)");
  const auto anon = sys::parse_maps_line("7f3ac0000000-7f3ac0006000 rw-p 00000000 00:00 0");
  ASSERT_TRUE(anon);
  EXPECT_EQ(anon->inode, 0u);
  EXPECT_EQ(anon->path, "");
  // Not a maps line: a missing field, a range that is not one, an smaps field.
  EXPECT_FALSE(sys::parse_maps_line("55d0c8a00000 r-xp"));
  EXPECT_FALSE(sys::parse_maps_line("2000-1000 r--p 00000000 fe:00 1 /x"));
  EXPECT_FALSE(sys::parse_maps_line("12g4-2000 r--p 00000000 fe:00 1 /x"));
  EXPECT_FALSE(sys::parse_maps_line("Size:                  4 kB"));
}
