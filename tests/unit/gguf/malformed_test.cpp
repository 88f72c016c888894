// SPDX-License-Identifier: Apache-2.0
// Handcrafted malformed files, one per defect. Each asserts the error code
// and the message fragment naming the field and its byte offset.
#include <gtest/gtest.h>

#include <limits>

#include "gguf/writer.hpp"
#include "unit/gguf/test_util.hpp"

namespace airs::gguf {
namespace {

using testing::parse_bytes;

void expect_reject(const std::vector<std::byte>& b, int code, std::string_view fragment,
                   const ParseLimits& lim = {}) {
  auto r = parse_bytes(b, lim);
  ASSERT_FALSE(r.ok()) << "malformed file was accepted";
  EXPECT_EQ(r.error().code, code) << r.error().message;
  EXPECT_NE(r.error().message.find(fragment), std::string::npos)
      << "message:  " << r.error().message << "\nexpected: " << fragment;
}

Builder hdr(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
  Builder b;
  b.header(version, n_tensors, n_kv);
  return b;
}

std::vector<std::byte> finish(Builder& b, uint64_t data_bytes, uint32_t align = 32) {
  b.pad_to(align).zeros(data_bytes);
  return b.take();
}

// One f32 tensor 't' of `dims` at relative offset `off`, no metadata.
std::vector<std::byte> one_tensor(std::vector<uint64_t> dims, uint32_t type = 0, uint64_t off = 0,
                                  uint64_t data = 128) {
  Builder b = hdr(1, 0);
  b.tensor_info("t", dims, type, off);
  return finish(b, data);
}

constexpr uint64_t kT0 = 24;             // tensor[0] info with no KVs
constexpr uint64_t kT0Dims = kT0 + 13;   // dims[0] of a 1-byte name
uint64_t type_at(size_t n_dims) { return kT0Dims + 8 * n_dims; }
uint64_t offset_at(size_t n_dims) { return type_at(n_dims) + 4; }

// ---- header ----------------------------------------------------------------

TEST(GgufMalformed, EmptyFile) { expect_reject({}, EBADMSG, "gguf: header at byte 0: file is 0 bytes"); }

TEST(GgufMalformed, HeaderShorterThan24Bytes) {
  auto b = hdr(0, 0).take();
  b.resize(20);
  expect_reject(b, EBADMSG, "header at byte 0: file is 20 bytes, shorter than the 24-byte GGUF header");
}

TEST(GgufMalformed, BadMagic) {
  auto b = hdr(0, 0).take();
  b[0] = std::byte{'X'};
  expect_reject(b, EBADMSG, "magic at byte 0: 0x46554758 is not \"GGUF\"");
}

TEST(GgufMalformed, Version1Rejected) { expect_reject(hdr(0, 0, 1).take(), ENOTSUP, "version at byte 4: version 1 is not supported"); }
TEST(GgufMalformed, Version0Unknown) { expect_reject(hdr(0, 0, 0).take(), ENOTSUP, "version at byte 4: unknown version 0"); }
TEST(GgufMalformed, Version4Unknown) { expect_reject(hdr(0, 0, 4).take(), ENOTSUP, "version at byte 4: unknown version 4"); }

TEST(GgufMalformed, BigEndianFile) {
  expect_reject(hdr(0, 0, 0x03000000).take(), ENOTSUP, "version at byte 4: big-endian GGUF (version 3) is not supported");
}

TEST(GgufMalformed, TensorCountAboveCap) {
  expect_reject(hdr(uint64_t{1} << 40, 0).take(), EBADMSG,
                "tensor count at byte 8: 1099511627776 tensors exceeds the limit of 1048576");
}

TEST(GgufMalformed, TensorCountBeyondFileBytes) {
  expect_reject(hdr(1000, 0).take(), EBADMSG, "tensor count at byte 8: 1000 tensors need at least 32000 bytes, only 0 remain");
}

TEST(GgufMalformed, KvCountAboveCap) {
  expect_reject(hdr(0, uint64_t{1} << 20).take(), EBADMSG, "kv count at byte 16: 1048576 keys exceeds the limit of 65536");
}

TEST(GgufMalformed, KvCountBeyondFileBytes) {
  expect_reject(hdr(0, 100).take(), EBADMSG, "kv count at byte 16: 100 keys need at least 1300 bytes, only 0 remain");
}

// ---- metadata --------------------------------------------------------------

TEST(GgufMalformed, KeyLengthAboveCap) {
  Builder b = hdr(0, 1);
  b.u64(std::numeric_limits<uint64_t>::max()).zeros(16);
  expect_reject(b.take(), EBADMSG, "kv[0] key length at byte 24: 18446744073709551615 bytes exceeds the limit");
}

TEST(GgufMalformed, KeyTruncated) {
  Builder b = hdr(0, 1);
  b.u64(100).zeros(10);
  expect_reject(b.take(), EBADMSG, "kv[0] key at byte 32: needs 100 bytes but only 10 remain");
}

TEST(GgufMalformed, EmptyKey) {
  Builder b = hdr(0, 1);
  b.kv_u32("", 1);
  expect_reject(b.take(), EBADMSG, "kv[0] key at byte 24: key is empty");
}

TEST(GgufMalformed, UnknownValueType) {
  Builder b = hdr(0, 1);
  b.str("a").u32(13).u32(0);
  expect_reject(b.take(), EBADMSG, "kv[0] 'a' value type at byte 33: unknown value type 13");
}

TEST(GgufMalformed, DuplicateKey) {
  Builder b = hdr(0, 2);
  b.kv_u32("a", 1);
  const size_t second = b.pos();
  b.kv_u32("a", 2);
  expect_reject(b.take(), EBADMSG,
                fmt::format("kv[1] key 'a' at byte {}: duplicate key (first defined at byte 37)", second));
}

TEST(GgufMalformed, BoolNotZeroOrOne) {
  Builder b = hdr(0, 1);
  b.str("flag").u32(static_cast<uint32_t>(ValueType::kBool)).u8(2).zeros(8);
  expect_reject(b.take(), EBADMSG, "kv[0] 'flag' at byte 40: BOOL value is 2, not 0 or 1");
}

TEST(GgufMalformed, StringValueAboveLimit) {
  Builder b = hdr(0, 1);
  b.kv_str("s", std::string(17, 'x'));
  ParseLimits lim;
  lim.max_string_bytes = 16;
  expect_reject(b.take(), EBADMSG, "kv[0] 's' length at byte 37: 17 bytes exceeds the limit of 16", lim);
}

TEST(GgufMalformed, StringValueTruncated) {
  Builder b = hdr(0, 1);
  b.str("s").u32(static_cast<uint32_t>(ValueType::kString)).u64(50).zeros(5);
  expect_reject(b.take(), EBADMSG, "kv[0] 's' at byte 45: needs 50 bytes but only 5 remain");
}

TEST(GgufMalformed, ScalarValueTruncated) {
  Builder b = hdr(0, 1);
  b.str("v").u32(static_cast<uint32_t>(ValueType::kUint64)).u8(0);
  // 13 bytes minimum per KV passes (key 9 + type 4 + 1), the u64 does not fit.
  expect_reject(b.take(), EBADMSG, "kv[0] 'v' at byte 37: needs 8 bytes but only 1 remain");
}

TEST(GgufMalformed, NestedArray) {
  Builder b = hdr(0, 1);
  b.str("arr").u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kArray)).u64(0);
  expect_reject(b.take(), EBADMSG, "kv[0] 'arr' element type at byte 39: nested arrays are not supported");
}

TEST(GgufMalformed, ArrayUnknownElementType) {
  Builder b = hdr(0, 1);
  b.str("arr").u32(static_cast<uint32_t>(ValueType::kArray)).u32(99).u64(0);
  expect_reject(b.take(), EBADMSG, "kv[0] 'arr' element type at byte 39: unknown value type 99");
}

TEST(GgufMalformed, ArrayCountAboveCap) {
  Builder b = hdr(0, 1);
  b.str("arr").u32(static_cast<uint32_t>(ValueType::kArray)).u32(0).u64(uint64_t{1} << 30);
  expect_reject(b.take(), EBADMSG, "kv[0] 'arr' count at byte 43: 1073741824 elements exceeds the limit of 16777216");
}

TEST(GgufMalformed, ArrayCountBeyondFileBytes) {
  Builder b = hdr(0, 1);
  b.str("arr").u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kUint32)).u64(1000);
  b.u32(1);
  expect_reject(b.take(), EBADMSG,
                "kv[0] 'arr' count at byte 43: 1000 elements of UINT32 need at least 4000 bytes, only 4 remain");
}

TEST(GgufMalformed, ArrayStringElementTruncated) {
  Builder b = hdr(0, 1);
  b.str("arr").u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kString)).u64(2);
  b.str("ok");  // element 0 at 51
  b.u64(40).zeros(4);  // element 1 at 61, claims 40 bytes
  expect_reject(b.take(), EBADMSG, "kv[0] 'arr'[1] at byte 69: needs 40 bytes but only 4 remain");
}

TEST(GgufMalformed, LazyArrayStringElementTooLong) {
  Builder b = hdr(0, 1);
  b.str("a").u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kString)).u64(3);
  b.str("a").str("b").str("ccc");  // elements at 49, 58, 67
  ParseLimits lim;
  lim.eager_array_elements = 0;  // the skip path must check as strictly
  lim.max_string_bytes = 2;
  expect_reject(b.take(), EBADMSG, "kv[0] 'a'[2] length at byte 67: 3 bytes exceeds the limit of 2", lim);
}

TEST(GgufMalformed, AlignmentWrongType) {
  Builder b = hdr(0, 1);
  b.kv_u64("general.alignment", 32);
  expect_reject(b.take(), EBADMSG, "key 'general.alignment' at byte 53: type is UINT64, expected UINT32");
}

TEST(GgufMalformed, AlignmentZero) {
  Builder b = hdr(0, 1);
  b.kv_u32("general.alignment", 0);
  expect_reject(b.take(), EBADMSG, "key 'general.alignment' at byte 53: 0 is not a power of two");
}

TEST(GgufMalformed, AlignmentNotPowerOfTwo) {
  Builder b = hdr(0, 1);
  b.kv_u32("general.alignment", 48);
  expect_reject(b.take(), EBADMSG, "key 'general.alignment' at byte 53: 48 is not a power of two");
}

TEST(GgufMalformed, AlignmentAboveOneGiB) {
  Builder b = hdr(0, 1);
  b.kv_u32("general.alignment", uint32_t{1} << 31);
  expect_reject(b.take(), EBADMSG, "key 'general.alignment' at byte 53: 2147483648 exceeds the limit of 1073741824");
}

TEST(GgufMalformed, ArchitectureNotString) {
  Builder b = hdr(0, 1);
  b.kv_u32("general.architecture", 7);
  expect_reject(b.take(), EBADMSG, "key 'general.architecture' at byte 56: type is UINT32, expected STRING");
}

TEST(GgufMalformed, MetadataAboveTotalLimit) {
  Builder b = hdr(0, 3);
  b.kv_str("a", std::string(30, 'x')).kv_str("b", std::string(30, 'x'));
  const size_t third = b.pos();
  b.kv_str("c", std::string(30, 'x'));
  ParseLimits lim;
  lim.max_metadata_bytes = 120;
  expect_reject(b.take(), EBADMSG, fmt::format("kv[2] 'c' at byte {}: metadata exceeds the limit of 120 bytes", third),
                lim);
}

// ---- tensor infos ----------------------------------------------------------

TEST(GgufMalformed, TensorNameLongerThanGgmlMaxName) {
  Builder b = hdr(1, 0);
  b.tensor_info(std::string(64, 'n'), std::vector<uint64_t>{32}, 0, 0);
  expect_reject(finish(b, 128), EBADMSG, "tensor[0] name length at byte 24: 64 bytes exceeds the limit of 63");
}

TEST(GgufMalformed, TensorNameEmpty) {
  Builder b = hdr(1, 0);
  b.tensor_info("", std::vector<uint64_t>{32}, 0, 0);
  expect_reject(finish(b, 128), EBADMSG, "tensor[0] name at byte 24: name is empty");
}

TEST(GgufMalformed, DuplicateTensorName) {
  Builder b = hdr(2, 0);
  b.tensor_info("t", std::vector<uint64_t>{32}, 0, 0);
  const size_t second = b.pos();
  b.tensor_info("t", std::vector<uint64_t>{32}, 0, 128);
  expect_reject(finish(b, 256), EBADMSG,
                fmt::format("tensor[1] 't' name at byte {}: duplicate tensor name (first is tensor[0] at byte 24)",
                            second));
}

TEST(GgufMalformed, ZeroDimensions) {
  expect_reject(one_tensor({}), EBADMSG, "tensor[0] 't' n_dims at byte 33: 0 dimensions, expected 1 to 4");
}

TEST(GgufMalformed, FiveDimensions) {
  expect_reject(one_tensor({1, 1, 1, 1, 32}), EBADMSG, "tensor[0] 't' n_dims at byte 33: 5 dimensions, expected 1 to 4");
}

TEST(GgufMalformed, DimensionIsZero) {
  expect_reject(one_tensor({32, 0}), EBADMSG, fmt::format("tensor[0] 't' dims[1] at byte {}: dimension is 0", kT0Dims + 8));
}

TEST(GgufMalformed, DimensionAboveInt64Max) {
  expect_reject(one_tensor({32, uint64_t{1} << 63}), EBADMSG,
                fmt::format("tensor[0] 't' dims[1] at byte {}: dimension 9223372036854775808 exceeds INT64_MAX",
                            kT0Dims + 8));
}

// CVE-2024-21802 class: ne product wraps, a small buffer would be allocated.
TEST(GgufMalformed, ElementCountOverflow) {
  expect_reject(one_tensor({uint64_t{1} << 32, uint64_t{1} << 32}), EBADMSG,
                fmt::format("tensor[0] 't' dims[1] at byte {}: element count overflows 63 bits", kT0Dims + 8));
}

// CVE-2025-53630 class: elements fit, bytes = elements × type size wrap.
TEST(GgufMalformed, ByteSizeOverflow) {
  expect_reject(one_tensor({uint64_t{1} << 31, uint64_t{1} << 31}), EBADMSG,
                fmt::format("tensor[0] 't' dims[1] at byte {}: byte size overflows 64 bits", kT0Dims + 8));
}

// CVE-2025-53630 class, one dimension: ne0 / block size × type size wraps
// before any other dimension is multiplied in (2^62 f32 = 2^64 bytes was
// accepted as a 0-byte tensor).
TEST(GgufMalformed, TensorByteSizeWrapsInNe0) {
  expect_reject(one_tensor({uint64_t{1} << 62}), EBADMSG,
                fmt::format("tensor[0] 't' dims[0] at byte {}: byte size overflows 64 bits (4611686018427387904 f32 "
                            "blocks of 4 bytes)",
                            kT0Dims));
}

TEST(GgufMalformed, TensorByteSizeWrapsInNe0WithMoreDims) {
  expect_reject(one_tensor({uint64_t{1} << 61, 1}, 28), EBADMSG,
                fmt::format("tensor[0] 't' dims[0] at byte {}: byte size overflows 64 bits (2305843009213693952 f64 "
                            "blocks of 8 bytes)",
                            kT0Dims));
}

TEST(GgufMalformed, DeprecatedTypeId) {
  expect_reject(one_tensor({32}, 4), ENOTSUP,
                fmt::format("tensor[0] 't' type at byte {}: ggml type id 4 is no longer supported (DEPRECATED",
                            type_at(1)));
}

TEST(GgufMalformed, RemovedTypeId) {
  expect_reject(one_tensor({32}, 31), ENOTSUP,
                fmt::format("tensor[0] 't' type at byte {}: ggml type id 31 is no longer supported "
                            "(TYPE_Q4_0_4_4 REMOVED, use Q4_0 with runtime repacking)",
                            type_at(1)));
}

TEST(GgufMalformed, UnknownTypeId) {
  expect_reject(one_tensor({32}, 43), ENOTSUP, fmt::format("tensor[0] 't' type at byte {}: unknown ggml type id 43", type_at(1)));
}

TEST(GgufMalformed, Ne0NotMultipleOfBlockSize) {
  expect_reject(one_tensor({100, 2}, 12), EBADMSG,
                fmt::format("tensor[0] 't' dims[0] at byte {}: ne0 = 100 is not a multiple of the q4_K block size 256",
                            kT0Dims));
}

TEST(GgufMalformed, OffsetNotAligned) {
  expect_reject(one_tensor({8}, 0, 16), EBADMSG,
                fmt::format("tensor[0] 't' offset at byte {}: 16 is not a multiple of the alignment 32", offset_at(1)));
}

TEST(GgufMalformed, TensorPastEndOfFile) {
  // 64 elements × 4 = 256 bytes, only 128 after the data offset (64).
  expect_reject(one_tensor({64}), EBADMSG,
                fmt::format("tensor[0] 't' offset at byte {}: data [64, 320) extends past the end of the file (192 "
                            "bytes)",
                            offset_at(1)));
}

TEST(GgufMalformed, TensorOffsetOverflows) {
  expect_reject(one_tensor({8}, 0, ~uint64_t{31}), EBADMSG,
                fmt::format("tensor[0] 't' offset at byte {}: data offset 18446744073709551584 + 32 bytes overflows",
                            offset_at(1)));
}

TEST(GgufMalformed, OverlappingTensors) {
  Builder b = hdr(2, 0);
  b.tensor_info("a", std::vector<uint64_t>{32}, 0, 0);  // [0, 128)
  const size_t b_off = b.pos() + 8 + 1 + 4 + 8 + 4;
  b.tensor_info("b", std::vector<uint64_t>{32}, 0, 96);  // [96, 224)
  auto bytes = finish(b, 256);
  expect_reject(bytes, EBADMSG,
                fmt::format("tensor[1] 'b' offset at byte {}: data [192, 320) overlaps tensor[0] 'a' [96, 224)", b_off));
}

TEST(GgufMalformed, TensorInfoTruncatedInDims) {
  Builder b = hdr(1, 0);
  b.str("tensor").u32(2).u64(32).zeros(7);  // 33 bytes pass the minimum; dims[1] at 50 has only 7
  expect_reject(b.take(), EBADMSG, "tensor[0] 'tensor' dims[1] at byte 50: needs 8 bytes but only 7 remain");
}

TEST(GgufMalformed, TensorInfoTruncatedInOffset) {
  Builder b = hdr(1, 0);
  b.str("t").u32(1).u64(32).u32(0).zeros(7);
  expect_reject(b.take(), EBADMSG, fmt::format("tensor[0] 't' offset at byte {}: needs 8 bytes but only 7 remain", offset_at(1)));
}

TEST(GgufMalformed, DataSectionStartsPastEnd) {
  Builder b = hdr(1, 0);
  b.tensor_info("t", std::vector<uint64_t>{1}, 0, 0);  // info ends at 57, data would start at 64
  auto bytes = b.take();
  expect_reject(bytes, EBADMSG, "data section at byte 64: starts past the end of the file (57 bytes)");
}

// ---- llama geometry and layers ----------------------------------------------

Builder llama_kv(uint64_t n_tensors, uint32_t blocks, uint32_t heads, uint32_t heads_kv, uint32_t embd, size_t* kv_at) {
  Builder b = hdr(n_tensors, 5);
  b.kv_str("general.architecture", "llama").kv_u32("llama.block_count", blocks);
  kv_at[0] = b.pos() + 8 + 26 + 4;
  b.kv_u32("llama.attention.head_count", heads);
  kv_at[1] = b.pos() + 8 + 29 + 4;
  b.kv_u32("llama.attention.head_count_kv", heads_kv);
  kv_at[2] = b.pos() + 8 + 22 + 4;
  b.kv_u32("llama.embedding_length", embd);
  return b;
}

TEST(GgufMalformed, BlockIndexBeyondBlockCount) {
  size_t at[3];
  Builder b = llama_kv(1, 2, 4, 4, 64, at);
  const size_t info = b.pos();
  b.tensor_info("blk.5.attn_q.weight", std::vector<uint64_t>{32}, 0, 0);
  expect_reject(finish(b, 128), EBADMSG,
                fmt::format("tensor[0] 'blk.5.attn_q.weight' name at byte {}: block 5 is outside llama.block_count = 2",
                            info));
}

TEST(GgufMalformed, BlockCountNotAnInteger) {
  Builder b = hdr(0, 2);
  b.kv_str("general.architecture", "llama");
  const size_t v = b.pos() + 8 + 17 + 4;
  b.kv_str("llama.block_count", "four");
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'llama.block_count' at byte {}: type is STRING, expected an unsigned integer", v));
}

TEST(GgufMalformed, HeadCountZero) {
  size_t at[3];
  Builder b = llama_kv(0, 2, 0, 0, 64, at);
  expect_reject(b.take(), EBADMSG, fmt::format("key 'llama.attention.head_count' at byte {}: must be at least 1", at[0]));
}

TEST(GgufMalformed, HeadCountKvAboveHeadCount) {
  size_t at[3];
  Builder b = llama_kv(0, 2, 4, 8, 64, at);
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'llama.attention.head_count_kv' at byte {}: 8 KV heads exceed 4 heads", at[1]));
}

TEST(GgufMalformed, EmbeddingNotMultipleOfHeads) {
  size_t at[3];
  Builder b = llama_kv(0, 2, 3, 1, 64, at);
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'llama.embedding_length' at byte {}: 64 is not a multiple of head_count 3", at[2]));
}

TEST(GgufMalformed, BlockCountAboveLimitWithoutOtherGeometry) {
  Builder b = hdr(0, 2);
  b.kv_str("general.architecture", "llama");
  const size_t v = b.pos() + 8 + 17 + 4;
  b.kv_u64("llama.block_count", uint64_t{1} << 40);
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'llama.block_count' at byte {}: 1099511627776 exceeds the limit of 16777216", v));
}

// Each geometry value passes its own cap; the KV bytes per token do not fit
// in u64 (2^24 layers × 2^24 KV heads × 2^25 elements × 2 bytes).
Builder geometry_kv(uint64_t blocks, uint64_t heads, uint64_t embd, uint64_t kl, uint64_t vl, size_t* blocks_at) {
  Builder b = hdr(0, 7);
  b.kv_str("general.architecture", "llama");
  *blocks_at = b.pos() + 8 + 17 + 4;
  b.kv_u64("llama.block_count", blocks)
      .kv_u64("llama.attention.head_count", heads)
      .kv_u64("llama.attention.head_count_kv", heads)
      .kv_u64("llama.embedding_length", embd)
      .kv_u64("llama.attention.key_length", kl)
      .kv_u64("llama.attention.value_length", vl);
  return b;
}

TEST(GgufMalformed, KvBytesPerTokenWraps) {
  constexpr uint64_t kCap = uint64_t{1} << 24;
  size_t at = 0;
  Builder b = geometry_kv(kCap, kCap, kCap, kCap, kCap, &at);
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'llama.block_count' at byte {}: a f16 KV cache of 16777216 layers x 16777216 KV heads "
                            "x (key 16777216 + value 16777216) is more than 2^64 bytes per token",
                            at));
}

TEST(GgufMalformed, KvBytesPerTokenAboveLimit) {
  size_t at = 0;
  Builder b = geometry_kv(32, 8, 4096, 128, 128, &at);  // f16: 32 × 8 × 256 × 2 = 131072; q8_0: 32 × 8 × 8 × 34
  ParseLimits lim;
  lim.max_kv_bytes_per_token = 100000;
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'llama.block_count' at byte {}: a f16 KV cache of 32 layers x 8 KV heads x (key 128 "
                            "+ value 128) is 131072 bytes per token, above the limit of 100000",
                            at),
                lim);
  lim.max_kv_bytes_per_token = 131072;  // f16 fits exactly, q8_0 (69632) too
  size_t unused = 0;
  EXPECT_TRUE(parse_bytes(geometry_kv(32, 8, 4096, 128, 128, &unused).take(), lim).ok());
}

TEST(GgufKvBytes, CheckedReportsWrapAndPlainSaturates) {
  ModelGeometry g;
  g.block_count = uint64_t{1} << 24;
  g.head_count = g.head_count_kv = uint64_t{1} << 24;
  g.key_length = g.value_length = uint64_t{1} << 24;
  EXPECT_FALSE(checked_kv_bytes_per_token(g, KvType::kF16).has_value());
  EXPECT_FALSE(checked_kv_bytes_per_token(g, KvType::kQ8_0).has_value());
  EXPECT_EQ(kv_bytes_per_token(g, KvType::kF16), std::numeric_limits<uint64_t>::max());
  g.block_count = 2;
  g.head_count_kv = 3;
  g.key_length = 40;  // q8_0: 2 blocks
  g.value_length = 32;
  EXPECT_EQ(checked_kv_bytes_per_token(g, KvType::kF16), 2U * 3U * 72U * 2U);
  EXPECT_EQ(checked_kv_bytes_per_token(g, KvType::kQ8_0), 2U * 3U * 3U * 34U);
}

// ---- tokenizer ---------------------------------------------------------------

// Offset of the value of the KV record that starts at the builder's position.
size_t value_at(const Builder& b, std::string_view key) { return b.pos() + 8 + key.size() + 4; }

const std::vector<std::string> kToks{"<unk>", "<s>", "</s>", "a"};

TEST(GgufMalformed, TokenizerScoresLengthMismatch) {
  Builder b = hdr(0, 2);
  const size_t toks = value_at(b, "tokenizer.ggml.tokens");
  b.kv_array_str("tokenizer.ggml.tokens", kToks);
  const size_t v = value_at(b, "tokenizer.ggml.scores");
  b.kv_array_f32("tokenizer.ggml.scores", std::vector<float>{0, 0, 0});
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.scores' at byte {}: 3 elements, expected 4 (one per entry of "
                            "'tokenizer.ggml.tokens' at byte {})",
                            v, toks));
}

TEST(GgufMalformed, TokenizerTokenTypeLengthMismatch) {
  // token_type before tokens: the check does not depend on key order.
  Builder b = hdr(0, 2);
  const size_t v = value_at(b, "tokenizer.ggml.token_type");
  b.kv_array_i32("tokenizer.ggml.token_type", std::vector<int32_t>{1, 1, 1, 1, 1});
  const size_t toks = value_at(b, "tokenizer.ggml.tokens");
  b.kv_array_str("tokenizer.ggml.tokens", kToks);
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.token_type' at byte {}: 5 elements, expected 4 (one per entry of "
                            "'tokenizer.ggml.tokens' at byte {})",
                            v, toks));
}

TEST(GgufMalformed, TokenizerScoresWrongElementType) {
  Builder b = hdr(0, 2);
  b.kv_array_str("tokenizer.ggml.tokens", kToks);
  const size_t v = value_at(b, "tokenizer.ggml.scores");
  b.kv_array_i32("tokenizer.ggml.scores", std::vector<int32_t>{0, 0, 0, 0});
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.scores' at byte {}: type is ARRAY of INT32, expected ARRAY of FLOAT32",
                            v));
}

TEST(GgufMalformed, TokenizerScoresNotAnArray) {
  Builder b = hdr(0, 1);
  const size_t v = value_at(b, "tokenizer.ggml.scores");
  b.kv_f32("tokenizer.ggml.scores", 0.5F);
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.scores' at byte {}: type is FLOAT32, expected ARRAY of FLOAT32", v));
}

TEST(GgufMalformed, TokenizerTokenTypeWrongElementType) {
  Builder b = hdr(0, 2);
  b.kv_array_str("tokenizer.ggml.tokens", kToks);
  const size_t v = value_at(b, "tokenizer.ggml.token_type");
  b.kv_array_u32("tokenizer.ggml.token_type", std::vector<uint32_t>{1, 1, 1, 1});
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.token_type' at byte {}: type is ARRAY of UINT32, expected ARRAY of "
                            "INT32",
                            v));
}

TEST(GgufMalformed, TokenizerTokensNotStrings) {
  Builder b = hdr(0, 1);
  const size_t v = value_at(b, "tokenizer.ggml.tokens");
  b.kv_array_u32("tokenizer.ggml.tokens", std::vector<uint32_t>{1, 2});
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.tokens' at byte {}: type is ARRAY of UINT32, expected ARRAY of STRING",
                            v));
}

TEST(GgufMalformed, TokenizerMergesNotStrings) {
  Builder b = hdr(0, 1);
  const size_t v = value_at(b, "tokenizer.ggml.merges");
  b.kv_array_i32("tokenizer.ggml.merges", std::vector<int32_t>{1, 2});
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.merges' at byte {}: type is ARRAY of INT32, expected ARRAY of STRING",
                            v));
}

// llama.cpp CVE class: a special token id past the vocabulary is used as an
// index into it.
TEST(GgufMalformed, TokenizerBosTokenIdOutOfRange) {
  Builder b = hdr(0, 2);
  const size_t toks = value_at(b, "tokenizer.ggml.tokens");
  b.kv_array_str("tokenizer.ggml.tokens", kToks);
  const size_t v = value_at(b, "tokenizer.ggml.bos_token_id");
  b.kv_u32("tokenizer.ggml.bos_token_id", 4);
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.bos_token_id' at byte {}: token id 4 is out of range for 4 tokens "
                            "('tokenizer.ggml.tokens' at byte {})",
                            v, toks));
}

TEST(GgufMalformed, TokenizerEveryTokenIdKeyIsRangeChecked) {
  for (std::string_view key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.unknown_token_id",
                               "tokenizer.ggml.padding_token_id", "tokenizer.ggml.separator_token_id",
                               "tokenizer.ggml.seperator_token_id", "tokenizer.ggml.eot_token_id"}) {
    SCOPED_TRACE(key);
    Builder b = hdr(0, 3);
    b.kv_u32("tokenizer.ggml.bos_token_id", 1);  // in range, and first in the file
    const size_t v = value_at(b, key);
    b.kv_u64(key, uint64_t{1} << 40);
    b.kv_array_str("tokenizer.ggml.tokens", kToks);
    expect_reject(b.take(), EBADMSG,
                  fmt::format("key '{}' at byte {}: token id 1099511627776 is out of range for 4 tokens", key, v));
  }
}

TEST(GgufMalformed, TokenizerTokenIdOutOfRangeOfLazyTokens) {
  // A vocabulary left on disk is counted all the same.
  std::vector<std::string> many(10, "t");
  Builder b = hdr(0, 2);
  b.kv_array_str("tokenizer.ggml.tokens", many);
  const size_t v = value_at(b, "tokenizer.ggml.eos_token_id");
  b.kv_u32("tokenizer.ggml.eos_token_id", 10);
  ParseLimits lim;
  lim.eager_array_elements = 2;
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.eos_token_id' at byte {}: token id 10 is out of range for 10 tokens",
                            v),
                lim);
}

TEST(GgufMalformed, TokenizerTokenIdNegative) {
  Builder b = hdr(0, 1);
  const size_t v = value_at(b, "tokenizer.ggml.padding_token_id");
  b.kv_i32("tokenizer.ggml.padding_token_id", -1);
  expect_reject(b.take(), EBADMSG, fmt::format("key 'tokenizer.ggml.padding_token_id' at byte {}: token id is negative", v));
}

TEST(GgufMalformed, TokenizerTokenIdNotAnInteger) {
  Builder b = hdr(0, 1);
  const size_t v = value_at(b, "tokenizer.ggml.bos_token_id");
  b.kv_str("tokenizer.ggml.bos_token_id", "1");
  expect_reject(b.take(), EBADMSG,
                fmt::format("key 'tokenizer.ggml.bos_token_id' at byte {}: type is STRING, expected an unsigned integer "
                            "token id",
                            v));
}

TEST(GgufTokenizer, ConsistentArraysAndIdsAreAccepted) {
  Builder b = hdr(0, 7);
  b.kv_array_str("tokenizer.ggml.tokens", kToks)
      .kv_array_f32("tokenizer.ggml.scores", std::vector<float>{0, 0, 0, -1})
      .kv_array_i32("tokenizer.ggml.token_type", std::vector<int32_t>{2, 3, 3, 1})
      .kv_array_str("tokenizer.ggml.merges", std::vector<std::string>{"a a"})
      .kv_u32("tokenizer.ggml.bos_token_id", 1)
      .kv_u32("tokenizer.ggml.eos_token_id", 3)
      .kv_i32("tokenizer.ggml.unknown_token_id", 0);
  auto f = parse_bytes(b.take());
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->find("tokenizer.ggml.scores")->array.count, 4U);
}

TEST(GgufTokenizer, IdsWithoutTokensAreOnlyTypeChecked) {
  // A file without a vocabulary has nothing to index; ids stay as metadata.
  Builder b = hdr(0, 1);
  b.kv_u32("tokenizer.ggml.bos_token_id", 7);
  EXPECT_TRUE(parse_bytes(b.take()).ok());
}

// ---- sizes with raised limits --------------------------------------------------

// The default caps keep count × record size far from 2^64; a caller that
// raises them must not get a wrapped (small) minimum that passes.
TEST(GgufMalformed, KvCountTimesRecordSizeWraps) {
  ParseLimits lim;
  lim.max_kv = std::numeric_limits<uint64_t>::max();
  expect_reject(hdr(0, uint64_t{1} << 62).take(), EBADMSG,
                "kv count at byte 16: 4611686018427387904 keys need at least more than 2^64 bytes, only 0 remain", lim);
}

TEST(GgufMalformed, TensorCountAboveU32Indices) {
  ParseLimits lim;
  lim.max_tensors = std::numeric_limits<uint64_t>::max();
  expect_reject(hdr(uint64_t{1} << 59, 0).take(), EBADMSG,
                "tensor count at byte 8: 576460752303423488 tensors exceeds the limit of 4294967295", lim);
}

TEST(GgufMalformed, ArrayCountTimesElementSizeWraps) {
  Builder b = hdr(0, 1);
  b.str("arr").u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kUint64));
  b.u64(uint64_t{1} << 61).u64(0);  // 2^61 × 8 = 2^64 bytes, wraps to 0
  ParseLimits lim;
  lim.max_array_elements = std::numeric_limits<uint64_t>::max();
  expect_reject(b.take(), EBADMSG,
                "kv[0] 'arr' count at byte 43: 2305843009213693952 elements of UINT64 overflow 64 bits of bytes", lim);
}

TEST(GgufMalformed, DataSectionAlignmentRoundingWraps) {
  // A source that claims 2^64 - 1 bytes, one skipped string element that ends
  // 2 bytes before that, no tensors: rounding up to 32 passes 2^64.
  constexpr uint64_t kSize = std::numeric_limits<uint64_t>::max();
  Builder b = hdr(0, 1);
  b.str("a").u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kString)).u64(1);
  const uint64_t elem_at = b.pos();
  b.u64(kSize - 2 - elem_at - 8);
  ParseLimits lim;
  lim.eager_array_elements = 0;
  lim.max_string_bytes = kSize;
  lim.max_metadata_bytes = kSize;
  testing::SparseSource src(b.take(), kSize);
  auto r = parse(src, lim);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EBADMSG);
  EXPECT_NE(r.error().message.find(fmt::format("data section at byte {}: rounding up to the alignment 32 overflows "
                                               "64 bits",
                                               kSize - 2)),
            std::string::npos)
      << r.error().message;
}

TEST(GgufMalformed, EveryRejectionIsBoundedAndNamed) {
  // Truncating a valid model at every byte must never crash and must always
  // name a byte offset.
  ModelSpec s;
  s.n_layers = 1;
  s.n_embd = 256;
  s.n_ff = 256;
  s.n_vocab = 32;
  s.n_head = 2;
  s.n_head_kv = 1;
  auto plan = plan_model(s);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  auto full = render_model(*plan);
  ASSERT_TRUE(full.ok());
  for (size_t n = 0; n < plan->data_offset; n += 7) {
    std::vector<std::byte> cut(full->begin(), full->begin() + static_cast<std::ptrdiff_t>(n));
    auto r = parse_bytes(cut);
    ASSERT_FALSE(r.ok()) << "truncated at " << n;
    EXPECT_NE(r.error().message.find(" at byte "), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace airs::gguf
