// SPDX-License-Identifier: Apache-2.0
#include "kv/geometry.hpp"

#include <gtest/gtest.h>

#include "util/units.hpp"

namespace airs::kv {
namespace {

TEST(KvGeometry, BytesPerTokenLlama31_8B) {
  // 32 layers, 8 KV heads, head_dim 128: 2 × 32 × 8 × 128 values per token.
  EXPECT_EQ(kv_bytes_per_token(32, 8, 128, KvType::F16).value(), 128 * kKiB);
  // q8_0: 34 bytes per 32 values → 1024 values = 1088 bytes per row.
  EXPECT_EQ(kv_bytes_per_token(32, 8, 128, KvType::Q8_0).value(), 68 * kKiB);
}

TEST(KvGeometry, RejectsBadShapes) {
  EXPECT_EQ(kv_bytes_per_token(0, 8, 128, KvType::F16).error().code, EINVAL);
  auto r = kv_bytes_per_token(32, 1, 40, KvType::Q8_0);  // 40 values: not whole q8_0 blocks
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("multiple of 32"), std::string::npos);
  EXPECT_EQ(kv_bytes_per_token(UINT32_MAX, UINT32_MAX, UINT32_MAX, KvType::F16).error().code, EOVERFLOW);
}

TEST(KvGeometry, SeedQ8OneByte) {
  // The seed's 8B q8 example: 1 byte per value → 64 KiB/token, 1 MiB blocks,
  // two per 2 MiB chunk, nothing lost.
  auto g = make_geometry({.bytes_per_token = 64 * kKiB, .tokens_per_block = 16, .page_bytes = 2 * kMiB}).value();
  EXPECT_EQ(g.block_bytes, 1 * kMiB);
  EXPECT_EQ(g.chunk_bytes, 2 * kMiB);
  EXPECT_EQ(g.blocks_per_chunk, 2u);
  EXPECT_EQ(g.pack_loss_bytes(), 0u);
  EXPECT_EQ(g.block_offset(0), 0u);
  EXPECT_EQ(g.block_offset(3), 3 * kMiB);
  EXPECT_EQ(g.chunk_of(3), 1u);
}

TEST(KvGeometry, F16BlockIsOnePage) {
  auto g = make_geometry({.bytes_per_token = 128 * kKiB, .page_bytes = 2 * kMiB}).value();
  EXPECT_EQ(g.block_bytes, 2 * kMiB);
  EXPECT_EQ(g.chunk_bytes, 2 * kMiB);
  EXPECT_EQ(g.blocks_per_chunk, 1u);
}

TEST(KvGeometry, RealQ8_0PacksIntoSevenPages) {
  // 1088 KiB blocks: one 2 MiB page would hold 1 block and lose 47 %; seven
  // pages hold 13 blocks and lose 192 KiB (1.3 %), the fewest pages under 1/64.
  auto g = make_geometry({.bytes_per_token = 68 * kKiB, .page_bytes = 2 * kMiB}).value();
  EXPECT_EQ(g.block_bytes, 1088 * kKiB);
  EXPECT_EQ(g.chunk_bytes, 14 * kMiB);
  EXPECT_EQ(g.blocks_per_chunk, 13u);
  EXPECT_EQ(g.pack_loss_bytes(), 192 * kKiB);
  EXPECT_EQ(g.block_offset(14), 14 * kMiB + 1088 * kKiB);
}

TEST(KvGeometry, ExplicitChunkIsHonoured) {
  auto g = make_geometry({.bytes_per_token = 68 * kKiB, .page_bytes = 2 * kMiB, .chunk_bytes = 2 * kMiB}).value();
  EXPECT_EQ(g.blocks_per_chunk, 1u);
  EXPECT_EQ(g.pack_loss_bytes(), 960 * kKiB);
}

TEST(KvGeometry, BlockLargerThanPageSpansSeveralPages) {
  // 70B-class f16: 80 layers × 8 heads × 128 → 320 KiB/token, 5 MiB blocks.
  const uint64_t bpt = kv_bytes_per_token(80, 8, 128, KvType::F16).value();
  EXPECT_EQ(bpt, 320 * kKiB);
  auto g = make_geometry({.bytes_per_token = bpt, .page_bytes = 2 * kMiB}).value();
  EXPECT_EQ(g.block_bytes, 5 * kMiB);
  EXPECT_EQ(g.chunk_bytes, 10 * kMiB);  // 3 pages would lose 1 MiB of 6; 5 pages hold 2 blocks exactly
  EXPECT_EQ(g.blocks_per_chunk, 2u);
}

TEST(KvGeometry, LargePmdPages) {
  // Pi 5 16 KiB-page kernel: 32 MiB PMD pages.
  auto g = make_geometry({.bytes_per_token = 64 * kKiB, .page_bytes = 32 * kMiB}).value();
  EXPECT_EQ(g.chunk_bytes, 32 * kMiB);
  EXPECT_EQ(g.blocks_per_chunk, 32u);
}

TEST(KvGeometry, ClearErrors) {
  auto small = make_geometry({.bytes_per_token = 128 * kKiB, .page_bytes = 1 * kMiB, .chunk_bytes = 1 * kMiB});
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().code, EINVAL);
  EXPECT_NE(small.error().message.find("does not fit a chunk of 1 MiB"), std::string::npos) << small.error().message;
  auto odd = make_geometry({.bytes_per_token = 64 * kKiB, .page_bytes = 2 * kMiB, .chunk_bytes = 3 * kMiB});
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.error().message.find("not a multiple"), std::string::npos);
  EXPECT_EQ(make_geometry({.bytes_per_token = 0, .page_bytes = 2 * kMiB}).error().code, EINVAL);
  EXPECT_EQ(make_geometry({.bytes_per_token = 1, .tokens_per_block = 0, .page_bytes = 2 * kMiB}).error().code, EINVAL);
  EXPECT_EQ(make_geometry({.bytes_per_token = 1, .page_bytes = 0}).error().code, EINVAL);
  EXPECT_EQ(make_geometry({.bytes_per_token = UINT64_MAX / 2, .page_bytes = 2 * kMiB}).error().code, EOVERFLOW);
}

}  // namespace
}  // namespace airs::kv
