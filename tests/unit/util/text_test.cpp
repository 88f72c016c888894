// SPDX-License-Identifier: Apache-2.0
#include "util/text.hpp"

#include <gtest/gtest.h>

namespace airs {
namespace {

TEST(Names, ValidNamesArePrintableUtf8WithinTheLimit) {
  EXPECT_TRUE(is_valid_name("phi-2.Q4_K_M"));
  EXPECT_TRUE(is_valid_name("Llama 3.1 8B Instruct"));
  EXPECT_TRUE(is_valid_name("模型-é"));
  EXPECT_FALSE(is_valid_name(""));
  EXPECT_FALSE(is_valid_name(std::string(kMaxNameBytes + 1, 'a')));
  EXPECT_TRUE(is_valid_name(std::string(kMaxNameBytes, 'a')));
}

TEST(Names, ControlCharactersEscapesAndBadUtf8AreRefused) {
  for (std::string bad : {std::string("a\nb"), std::string("\x1b[31mred"), std::string("tab\there"),
                          std::string("del\x7f"), std::string("q\"uote"), std::string("back\\slash"),
                          std::string("c1\xc2\x9b" "31m"), std::string("\xff\xfe"), std::string("\xc0\xaf"),
                          std::string("trunc\xe6\xa8"), std::string("nul\0x", 5)})
    EXPECT_FALSE(is_valid_name(bad)) << bad;
}

// A right-to-left override (U+202E) makes "evil\u202Efdp.gguf" show as
// "evilfugg.pdf"; embeddings, isolates and marks reorder text the same way.
TEST(Names, BidirectionalFormattingIsRefusedAndReplaced) {
  for (const char* bad : {"evil\u202Efdp", "a\u202Ab", "a\u2066b\u2069", "x\u200Fy", "x\u200Ey"})
    EXPECT_FALSE(is_valid_name(bad)) << bad;
  EXPECT_EQ(printable_name("evil\u202Egnp"), "evil???gnp");
  EXPECT_TRUE(is_valid_name("\u05E9\u05DC\u05D5\u05DD"));  // right-to-left letters themselves are fine
}

TEST(Names, PrintableReplacesWhatIsRefusedAndKeepsTheRest) {
  EXPECT_EQ(printable_name("bad\x1b[2Jname\n"), "bad?[2Jname?");
  EXPECT_EQ(printable_name("ok-é"), "ok-é");
  EXPECT_EQ(printable_name(""), "?");
  EXPECT_EQ(printable_name("\xc2\x9b"), "??");
  EXPECT_TRUE(is_valid_name(printable_name("x\x1b\x7f\xff")));
  // Cut at a character boundary, never inside a UTF-8 sequence.
  const std::string cut = printable_name("aé", 2);
  EXPECT_EQ(cut, "a");
  EXPECT_EQ(printable_name(std::string(200, 'z')).size(), kMaxNameBytes);
}

}  // namespace
}  // namespace airs
