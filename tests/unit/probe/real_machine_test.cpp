// SPDX-License-Identifier: Apache-2.0
// The real probe on the real machine. The CI machine has hugetlbfs,
// userfaultfd, io_uring and PSI (docs/kernel-facts.md): a missing one
// here is a failure of the probe or of the machine, never a skip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "probe/mode.hpp"
#include "probe/probe.hpp"
#include "sys/uffd.hpp"

namespace airs::probe {
namespace {

TEST(ProbeRealMachine, FindsHugetlbfsUserfaultfdIoUringAndPsi) {
  ProbePaths paths;
  paths.odirect_path = std::filesystem::temp_directory_path().string();
  const Capabilities c = probe(paths);
  SCOPED_TRACE(format_report(c));
  EXPECT_TRUE(c.problems.empty());
  EXPECT_EQ(c.base_page_size, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  EXPECT_TRUE(c.hugetlbfs.available());
  EXPECT_NE(c.hugetlbfs.default_size, 0u);
  EXPECT_TRUE(c.uffd.usable());
  EXPECT_TRUE(c.uffd.has(UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS | UFFD_FEATURE_MINOR_SHMEM));
  EXPECT_TRUE(c.io_uring.setup_ok) << "io_uring_setup errno " << c.io_uring.setup_errno;
  EXPECT_TRUE(c.psi.readable) << "errno " << c.psi.read_errno;
  EXPECT_TRUE(c.psi.trigger_ok) << "errno " << c.psi.trigger_errno;
  EXPECT_GE(c.numa_nodes, 1);
  EXPECT_TRUE(c.odirect.ok) << paths.odirect_path << ": errno " << c.odirect.err;

  auto choice = choose_mode(c, "auto");
  ASSERT_TRUE(choice.ok()) << choice.error().message;
  EXPECT_EQ(choice->mode, Mode::Full) << choice->reason;
}

}  // namespace
}  // namespace airs::probe
