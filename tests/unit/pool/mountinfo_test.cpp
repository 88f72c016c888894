// SPDX-License-Identifier: Apache-2.0
#include <unistd.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "sys/hugetlbfs.hpp"

namespace airs::sys {
namespace {

std::string write_fixture(const std::string& text) {
  char path[] = "/tmp/airs-mountinfo-XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  return path;
}

TEST(Mountinfo, FindsTheMountWithTheRightPageSize) {
  const std::string f = write_fixture(
      "22 1 0:21 / /proc rw - proc proc rw\n"
      "40 22 0:40 / /tmp rw,relatime shared:9 - hugetlbfs hugetlbfs rw,pagesize=1024M\n"
      "41 22 0:41 / /tmp rw,relatime - hugetlbfs none rw,pagesize=2M\n"
      "42 22 0:42 / /dev/hugepages rw - hugetlbfs hugetlbfs rw\n");
  auto m2 = find_hugetlbfs_mount(2 << 20, 2 << 20, f);
  ASSERT_TRUE(m2.ok());
  ASSERT_TRUE(m2->has_value());
  EXPECT_EQ(**m2, "/tmp");
  // No option: the mount uses the default size.
  auto m32 = find_hugetlbfs_mount(32 << 20, 32 << 20, f);
  ASSERT_TRUE(m32.ok());
  ASSERT_TRUE(m32->has_value());
  EXPECT_EQ(**m32, "/dev/hugepages");
  auto none = find_hugetlbfs_mount(16 << 20, 2 << 20, f);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ::unlink(f.c_str());
}

}  // namespace
}  // namespace airs::sys
