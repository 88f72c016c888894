// SPDX-License-Identifier: Apache-2.0
// The expert hint's message (wire/hints.hpp): what the client library
// encodes the daemon decodes, and every malformed message is named.
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "wire/hints.hpp"
#include "wire/requests.hpp"

namespace airs::wire {
namespace {

TEST(HintWire, WhatIsEncodedIsDecoded) {
  std::byte buf[kMaxHintBytes];
  const std::vector<uint32_t> experts{3, 17, 0, 255};
  const size_t n = encode_hint(9, experts, buf);
  EXPECT_EQ(n, kHintHeaderBytes + 4 * experts.size());
  const DecodedHint h = decode_hint(buf, n);
  ASSERT_EQ(h.error, nullptr) << h.error;
  EXPECT_EQ(h.layer, 9U);
  ASSERT_EQ(h.count, experts.size());
  EXPECT_EQ(std::vector<uint32_t>(h.experts, h.experts + h.count), experts);
}

TEST(HintWire, APredictionIsAHintWithItsOwnMagicWord) {
  std::byte buf[kMaxHintBytes];
  const std::vector<uint32_t> experts{7, 2};
  const size_t n = encode_hint(3, experts, buf, true);
  ASSERT_EQ(n, kHintHeaderBytes + 8);
  uint32_t magic = 0;
  std::memcpy(&magic, buf, 4);
  EXPECT_EQ(magic, kPredictMagic);
  const DecodedHint h = decode_hint(buf, n);
  ASSERT_EQ(h.error, nullptr) << h.error;
  EXPECT_TRUE(h.predicted);
  EXPECT_EQ(h.layer, 3U);
  EXPECT_EQ(std::vector<uint32_t>(h.experts, h.experts + h.count), experts);
  EXPECT_FALSE(decode_hint(buf, encode_hint(3, experts, buf)).predicted) << "a hint is no prediction";
}

TEST(HintWire, TheLongestHintFitsAndOneMoreDoesNot) {
  std::byte buf[kMaxHintBytes];
  std::vector<uint32_t> experts(kMaxHintExperts);
  std::iota(experts.begin(), experts.end(), 0U);
  const size_t n = encode_hint(0, experts, buf);
  EXPECT_EQ(n, kMaxHintBytes);
  EXPECT_EQ(decode_hint(buf, n).error, nullptr);
  experts.push_back(1000);
  EXPECT_EQ(encode_hint(0, experts, buf), 0U) << "too many experts: nothing to send";
  EXPECT_EQ(encode_hint(0, {}, buf), 0U) << "no expert: nothing to send";
}

TEST(HintWire, NeverTheLengthOfARequestWord) {
  // The request socket carries both: a 4-byte message is a request word.
  std::byte buf[kMaxHintBytes];
  const uint32_t one = 1;
  EXPECT_GT(encode_hint(0, std::span<const uint32_t>(&one, 1), buf), sizeof(uint32_t));
  uint32_t word = encode_request({RequestKind::Wait, 5});
  EXPECT_NE(decode_hint(reinterpret_cast<const std::byte*>(&word), sizeof word).error, nullptr);
}

TEST(HintWire, EveryMalformedMessageIsRefusedWithItsReason) {
  std::byte buf[kMaxHintBytes + 8] = {};
  const std::vector<uint32_t> experts{1, 2};
  const size_t n = encode_hint(4, experts, buf);
  const auto why = [&](size_t len) {
    const DecodedHint h = decode_hint(buf, len);
    return std::string(h.error == nullptr ? "" : h.error);
  };
  EXPECT_NE(why(0), "");
  EXPECT_NE(why(11), "") << "shorter than the header";
  EXPECT_NE(why(n - 1), "") << "cut";
  EXPECT_NE(why(n + 4), "") << "more experts than its count";
  EXPECT_NE(why(kMaxHintBytes + 4), "") << "longer than the longest hint";
  // A wrong magic word.
  std::byte bad[kMaxHintBytes];
  std::memcpy(bad, buf, n);
  bad[0] = std::byte{0};
  EXPECT_NE(decode_hint(bad, n).error, nullptr);
  // A count of 0, and one over the most.
  for (uint32_t count : {0U, kMaxHintExperts + 1}) {
    std::memcpy(bad, buf, n);
    std::memcpy(bad + 8, &count, 4);
    EXPECT_NE(decode_hint(bad, n).error, nullptr) << count;
  }
  // Random bytes of every length never decode (the magic word), and never
  // read past the length given.
  std::vector<std::byte> noise(kMaxHintBytes + 8);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  for (size_t len = 0; len <= noise.size(); ++len) EXPECT_NE(decode_hint(noise.data(), len).error, nullptr) << len;
}

}  // namespace
}  // namespace airs::wire
