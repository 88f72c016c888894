// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include "util/units.hpp"

using namespace airs;

TEST(Units, ParseBytesAcceptsBinaryUnits) {
  EXPECT_EQ(parse_bytes("4G"), 4 * kGiB);
  EXPECT_EQ(parse_bytes("512M"), 512 * kMiB);
  EXPECT_EQ(parse_bytes("2 GiB"), 2 * kGiB);
  EXPECT_EQ(parse_bytes("1048576"), kMiB);
  EXPECT_EQ(parse_bytes(" 64 KiB "), 64 * kKiB);
}

TEST(Units, ParseBytesRejectsGarbageAndOverflow) {
  EXPECT_FALSE(parse_bytes(""));
  EXPECT_FALSE(parse_bytes("G"));
  EXPECT_FALSE(parse_bytes("12X"));
  EXPECT_FALSE(parse_bytes("-1"));
  EXPECT_FALSE(parse_bytes("99999999999999999999"));
  EXPECT_FALSE(parse_bytes("17179869184T"));
}

TEST(Units, RoundUpChecksOverflow) {
  EXPECT_EQ(round_up(1, 4096), 4096u);
  EXPECT_EQ(round_up(4096, 4096), 4096u);
  EXPECT_EQ(round_up(5, 3), 6u);
  EXPECT_FALSE(round_up(UINT64_MAX, 4096).has_value());
}

TEST(Units, FormatBytes) {
  EXPECT_EQ(format_bytes(17), "17 B");
  EXPECT_EQ(format_bytes(2 * kMiB), "2 MiB");
  EXPECT_EQ(format_bytes(3 * kGiB / 2), "1.5 GiB");
}
