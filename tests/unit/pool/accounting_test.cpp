// SPDX-License-Identifier: Apache-2.0
#include "pool/accounting.hpp"

#include <gtest/gtest.h>

namespace airs::pool {
namespace {

TEST(Accounting, PagesForRoundsUpForAnyPageSize) {
  EXPECT_EQ(pages_for(0, 2 << 20), 0U);
  EXPECT_EQ(pages_for(1, 2 << 20), 1U);
  EXPECT_EQ(pages_for(2 << 20, 2 << 20), 1U);
  EXPECT_EQ(pages_for((2 << 20) + 1, 2 << 20), 2U);
  EXPECT_EQ(pages_for(100, 32 << 20), 1U);   // 16 KiB-page arm64 PMD size
  EXPECT_EQ(pages_for(3 * 16384, 16384), 3U);
}

TEST(Accounting, NrHugepagesForAddsOnlyWhatIsMissing) {
  EXPECT_EQ(nr_hugepages_for(100, 30, 50), 120U);
  EXPECT_EQ(nr_hugepages_for(100, 60, 50), 100U);
  EXPECT_EQ(nr_hugepages_for(0, 0, 1024), 1024U);
}

TEST(Accounting, TotalsAreTheSumOfKinds) {
  PoolCounts c;
  c.page_size = 2 << 20;
  c.free_pages = 3;
  c.model_pages = 4;
  c.kv_pages = 5;
  EXPECT_EQ(c.total_pages(), 12U);
  EXPECT_EQ(c.total_bytes(), 12U * (2 << 20));
  c.of(PageKind::Kv) -= 5;
  c.of(PageKind::Model) += 1;
  EXPECT_EQ(c.kv_bytes(), 0U);
  EXPECT_EQ(c.model_bytes(), 5U * (2 << 20));
}

}  // namespace
}  // namespace airs::pool
