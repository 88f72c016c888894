// SPDX-License-Identifier: Apache-2.0
// Which mappings the daemon locks as its code: every read-only mapping of a
// file that is mapped executable, and nothing else.
#include "sys/code_lock.hpp"

#include <gtest/gtest.h>

namespace {

using airs::sys::code_ranges;

TEST(CodeRanges, ReadOnlyMappingsOfExecutableObjectsOnly) {
  const std::string maps =
      "55d0c0000000-55d0c0010000 r--p 00000000 fe:00 100  /usr/sbin/airs-memd\n"
      "55d0c0010000-55d0c0080000 r-xp 00010000 fe:00 100  /usr/sbin/airs-memd\n"
      "55d0c0080000-55d0c00a0000 r--p 00080000 fe:00 100  /usr/sbin/airs-memd\n"
      "55d0c00a0000-55d0c00a2000 rw-p 000a0000 fe:00 100  /usr/sbin/airs-memd\n"
      "55d0c1000000-55d0c1100000 rw-p 00000000 00:00 0    [heap]\n"
      "7f0000000000-7f0040000000 rw-s 00000000 00:2f 7    /dev/hugepages/airs-pool (deleted)\n"
      "7f1000000000-7f1000300000 r--p 00000000 fe:00 300  /usr/lib/locale/locale-archive\n"
      "7f1000400000-7f1000800000 r--s 00000000 fe:01 400  /srv/models/a model.gguf\n"
      "7f2000000000-7f2000028000 r--p 00000000 fe:00 200  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7f2000028000-7f20001bd000 r-xp 00028000 fe:00 200  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7f20001bd000-7f2000215000 r--p 001bd000 fe:00 200  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7f2000215000-7f2000219000 r--p 00214000 fe:00 200  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7f2000219000-7f200021b000 rw-p 00218000 fe:00 200  /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7f3000000000-7f3000001000 r-xp 00000000 fe:00 500  /tmp/gone.so (deleted)\n"
      "7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0    [vdso]\n"
      "not a maps line\n";
  const auto r = code_ranges(maps);
  std::vector<std::pair<uintptr_t, std::string>> got;
  for (const auto& c : r) got.emplace_back(c.start, c.path);
  const std::vector<std::pair<uintptr_t, std::string>> want = {
      {0x55d0c0000000, "/usr/sbin/airs-memd"},
      {0x55d0c0010000, "/usr/sbin/airs-memd"},
      {0x55d0c0080000, "/usr/sbin/airs-memd"},
      {0x7f2000000000, "/usr/lib/x86_64-linux-gnu/libc.so.6"},
      {0x7f2000028000, "/usr/lib/x86_64-linux-gnu/libc.so.6"},
      {0x7f20001bd000, "/usr/lib/x86_64-linux-gnu/libc.so.6"},
      {0x7f2000215000, "/usr/lib/x86_64-linux-gnu/libc.so.6"},
  };
  EXPECT_EQ(got, want);
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r[1].end, 0x55d0c0080000u);
}

// A file of the same inode number on another device is another file: only
// the object mapped executable is code.
TEST(CodeRanges, TheSameInodeOnAnotherDeviceIsAnotherFile) {
  const std::string maps =
      "1000-2000 r-xp 00000000 fe:00 42 /usr/bin/tool\n"
      "3000-4000 r--p 00000000 fe:01 42 /data/file\n";
  const auto r = code_ranges(maps);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].path, "/usr/bin/tool");
}

}  // namespace
