// SPDX-License-Identifier: Apache-2.0
// The SPM tokenizer: merge order, byte fallback, round trips.
#include <random>

#include <gtest/gtest.h>

#include "infer/tokenizer.hpp"

namespace {

using airs::infer::Tokenizer;

// <unk> <s> </s>, the 256 byte tokens, then pieces with scores.
Tokenizer make(const std::vector<std::pair<std::string, float>>& pieces) {
  std::vector<std::string> p = {"<unk>", "<s>", "</s>"};
  std::vector<float> s = {0, 0, 0};
  std::vector<int32_t> t = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    p.push_back(fmt::format("<0x{:02X}>", b));
    s.push_back(0);
    t.push_back(6);
  }
  for (const auto& [piece, score] : pieces) {
    p.push_back(piece);
    s.push_back(score);
    t.push_back(1);
  }
  auto tok = Tokenizer::from_vocab(std::move(p), std::move(s), std::move(t), 1, 2, true, true);
  EXPECT_TRUE(tok.ok());
  return std::move(tok).value();
}

constexpr int32_t kFirst = 259;  // id of the first piece

TEST(InferTokenizer, HighestScoringMergeFirstLeftmostOnTies) {
  // "▁ab" can come from ▁a+b or ▁+ab; "ab" scores higher than "▁a".
  const Tokenizer t = make({{"\xE2\x96\x81", -5}, {"a", -5}, {"b", -5}, {"\xE2\x96\x81" "a", -3}, {"ab", -1},
                            {"\xE2\x96\x81" "ab", -2}});
  EXPECT_EQ(t.encode("ab"), (std::vector<int32_t>{1, kFirst + 5}));
  // "aba": ab and ba... only ab is a piece; the leftmost "ab" merges first.
  EXPECT_EQ(t.encode("ab", false), (std::vector<int32_t>{kFirst + 5}));
  EXPECT_EQ(t.encode("bab", false), (std::vector<int32_t>{kFirst, kFirst + 2, kFirst + 4}));
}

TEST(InferTokenizer, BytesForUnknownCharacters) {
  const Tokenizer t = make({{"\xE2\x96\x81", -1}, {"x", -1}});
  // é = C3 A9: two byte tokens (3 + byte).
  EXPECT_EQ(t.encode("x\xC3\xA9", false), (std::vector<int32_t>{kFirst, kFirst + 1, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_TRUE(t.encode("", true) == std::vector<int32_t>{1});
  EXPECT_TRUE(t.encode("", false).empty());
}

TEST(InferTokenizer, DecodeInvertsEncodeOnRandomText) {
  // Real SPM vocabularies have "▁" alone; without it a lone space falls
  // back to the bytes of U+2581 and does not decode to a space.
  std::vector<std::pair<std::string, float>> pieces = {{"\xE2\x96\x81", -10}};
  for (char c = 'a'; c <= 'z'; ++c) {
    pieces.emplace_back(std::string(1, c), -10);
    pieces.emplace_back("\xE2\x96\x81" + std::string(1, c), -9);
    pieces.emplace_back(std::string(1, c) + "e", -8);
  }
  pieces.emplace_back("the", -1);
  pieces.emplace_back("\xE2\x96\x81the", -0.5F);
  const Tokenizer t = make(pieces);
  std::mt19937 g(11);
  // Whole characters: invalid UTF-8 (a lone lead byte) swallows the next
  // bytes as llama.cpp's splitter does, and does not round-trip.
  std::vector<std::string> alphabet = {" ", " ", "the", ",", ".", "!", "0", "1", "\n", "\t", "\xC3\xA9", "\xE2\x82\xAC"};
  for (char c = 'a'; c <= 'z'; ++c) alphabet.emplace_back(1, c);
  for (int round = 0; round < 300; ++round) {
    std::string s;
    const size_t len = g() % 40;
    for (size_t i = 0; i < len; ++i) s += alphabet[g() % alphabet.size()];
    const auto ids = t.encode(s);
    ASSERT_EQ(ids.front(), 1);
    EXPECT_EQ(t.decode(std::span(ids).subspan(1)), s) << "'" << s << "'";
  }
}

}  // namespace
