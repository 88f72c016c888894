// SPDX-License-Identifier: Apache-2.0
// GGUF reader: header, metadata, tensor table, validated against the file.
//
// File layout (little-endian; versions 2 and 3 — v1 used 32-bit counts and is
// rejected, as are big-endian files):
//
//   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv ×      { str key | u32 value_type | value }
//   n_tensors × { str name | u32 n_dims | u64 ne[n_dims] (ne0 first) | u32 ggml_type | u64 offset }
//   zero padding to general.alignment (default 32)
//   data section: tensor `offset`s are relative to its start, each aligned
//
//   str   = u64 length | bytes (not NUL-terminated)
//   value = scalar of value_type, or for ARRAY: u32 elem_type | u64 count | elements
//
// Every count and length is checked against the bytes that remain before
// anything is allocated; every size (count × element size, ne product ×
// type size, offset + size, alignment rounding, KV bytes per token) uses
// checked arithmetic and a wrap is rejected naming the field; duplicate keys
// and tensor names are found with a seeded hash set (linear time for any
// input). Tokenizer metadata that a runtime indexes by is checked for
// consistency: tokenizer.ggml.tokens (ARRAY of STRING), .scores (ARRAY of
// FLOAT32) and .token_type (ARRAY of INT32) agree in length, .merges is an
// ARRAY of STRING, and every tokenizer.ggml.*_token_id is an integer below
// the token count.
// Rejections are Error{EBADMSG} (malformed) or Error{ENOTSUP} (valid but
// unsupported: version, big-endian, deprecated/removed/unknown tensor type),
// with a message naming the field and its byte offset, e.g.
//   gguf: tensor[3] 'blk.0.attn_q.weight' dims[1] at byte 1234: dimension is 0
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "gguf/byte_source.hpp"
#include "gguf/types.hpp"
#include "util/hash.hpp"
#include "util/result.hpp"

namespace airs::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr uint32_t kMaxDims = 4;          // GGML_MAX_DIMS
inline constexpr uint32_t kMaxNameBytes = 63;    // GGML_MAX_NAME - 1 (NUL)

enum class ValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
// "UINT32", "ARRAY", ...; "unknown" past the enum.
[[nodiscard]] std::string_view value_type_name(ValueType t) noexcept;
// Bytes of one scalar on disk; 0 for STRING/ARRAY/unknown.
[[nodiscard]] uint64_t value_type_size(ValueType t) noexcept;

// Caps that bound time and memory for any input. Real models are far below
// each (llama-3 70B: 723 tensors, ~30 keys, a 128k-token vocabulary).
struct ParseLimits {
  uint64_t max_tensors = uint64_t{1} << 20;  // never above 2^32 - 1 (tensor indices are u32)
  uint64_t max_kv = uint64_t{1} << 16;
  uint64_t max_string_bytes = uint64_t{1} << 20;      // any one key, value or array element
  uint64_t max_array_elements = uint64_t{1} << 24;    // per array (vocab, merges, scores)
  uint64_t max_metadata_bytes = uint64_t{512} << 20;  // whole KV section on disk
  // Arrays up to this many elements are decoded into MetaValue::array.items;
  // longer ones stay on disk (offset + count) so a 256k-token vocabulary
  // costs no memory until someone asks for it.
  uint64_t eager_array_elements = 4096;
  // Memory all eagerly decoded arrays may take together (one Scalar per
  // element plus string bytes); arrays past it stay on disk as long ones do,
  // so a file of many short arrays costs at most this, not 40× its size.
  uint64_t max_eager_bytes = uint64_t{64} << 20;
  // general.alignment must be a power of two no larger than this: 1 GiB, the
  // largest huge page size Linux has, so a region can align to any of them.
  uint32_t max_alignment = uint32_t{1} << 30;
  // Sanity caps on llama-style geometry: each of block_count, head counts,
  // embedding/key/value length (block_count also when there is no other
  // geometry: it sizes per-layer state), and the KV bytes per token of either
  // KV type (real models: well under 8 MiB), so a caller may multiply it by a
  // u32 token count without wrapping u64.
  uint64_t max_geometry_value = uint64_t{1} << 24;
  uint64_t max_kv_bytes_per_token = uint64_t{1} << 30;
};

using Scalar = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
                            uint64_t, int64_t, double>;

struct ArrayValue {
  ValueType elem_type = ValueType::kUint8;
  uint64_t count = 0;
  uint64_t data_offset = 0;  // absolute file offset of element 0
  uint64_t byte_size = 0;    // bytes of all elements on disk
  bool loaded = false;       // items holds all `count` elements
  std::vector<Scalar> items;
};

struct MetaValue {
  ValueType type = ValueType::kUint8;
  uint64_t offset = 0;  // absolute file offset of the value (after the type tag)
  Scalar scalar;        // when type != kArray
  ArrayValue array;     // when type == kArray

  // Any integer type (incl. bool) that is non-negative, as u64.
  [[nodiscard]] std::optional<uint64_t> as_uint() const;
  [[nodiscard]] std::optional<std::string_view> as_string() const;
};

// Where a tensor sits in prefetch order.
enum class LayerSlot : uint8_t {
  kPre,    // token_embd.* and anything outside blk.N.* that is not output
  kBlock,  // blk.N.*
  kPost,   // output_norm.*, output.*
};

struct TensorInfo {
  std::string name;
  uint32_t type_id = 0;
  std::string_view type_name;  // ggml name from the table ("q4_K"); static storage
  std::vector<uint64_t> dims;  // ne0 first, 1..4 entries, each >= 1
  uint64_t n_elements = 0;
  uint64_t offset = 0;         // absolute file offset (data_offset + relative)
  uint64_t nbytes = 0;
  uint64_t info_offset = 0;    // where this tensor's info record starts in the file
  LayerSlot slot = LayerSlot::kPre;
  // -1 for kPre, N for blk.N, File::n_layers for kPost.
  int64_t layer = -1;
  // Position 0..n_tensors-1 in prefetch order: pre-layer tensors, blk.0 …
  // blk.N, output_norm, output; ties by file offset. load_order[load_rank] is
  // this tensor's index.
  uint32_t load_rank = 0;
};

struct ModelGeometry {
  uint64_t block_count = 0;
  uint64_t head_count = 0;
  uint64_t head_count_kv = 0;     // defaults to head_count
  uint64_t embedding_length = 0;
  uint64_t key_length = 0;        // defaults to embedding_length / head_count
  uint64_t value_length = 0;      // defaults to embedding_length / head_count
  uint64_t context_length = 0;    // 0 when absent
};

enum class KvType : uint8_t { kF16, kQ8_0 };
[[nodiscard]] std::string_view kv_type_name(KvType t) noexcept;

// KV-cache bytes per token: n_layer × n_head_kv × (key_length + value_length)
// elements; f16 = 2 bytes each, q8_0 = 34 bytes per 32-element block (rows
// rounded up to whole blocks). nullopt when the product overflows u64.
[[nodiscard]] std::optional<uint64_t> checked_kv_bytes_per_token(const ModelGeometry& g, KvType t) noexcept;
// The same, saturating at UINT64_MAX instead of wrapping. For a File's
// geometry it never saturates: parse() rejects geometry above
// ParseLimits::max_kv_bytes_per_token.
[[nodiscard]] uint64_t kv_bytes_per_token(const ModelGeometry& g, KvType t) noexcept;

using MetadataMap = std::unordered_map<std::string, MetaValue, SeededStringHash, std::equal_to<>>;

struct File {
  uint32_t version = 0;
  uint32_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;  // absolute start of the data section
  uint64_t file_size = 0;
  uint64_t n_kv = 0;
  std::string architecture;  // general.architecture, "" when absent
  MetadataMap metadata;
  std::vector<TensorInfo> tensors;  // in file order
  std::vector<uint32_t> load_order; // tensor indices in prefetch order
  uint64_t n_layers = 0;            // <arch>.block_count, else highest blk.N + 1
  std::optional<ModelGeometry> geometry;

  // Index into `tensors`, nullopt if absent. O(1).
  [[nodiscard]] std::optional<uint32_t> find_tensor(std::string_view name) const;
  [[nodiscard]] const MetaValue* find(std::string_view key) const;
  // The key's value as an unsigned integer; nullopt when absent or not an integer.
  [[nodiscard]] std::optional<uint64_t> find_uint(std::string_view key) const;
  // End of the last tensor's bytes (data_offset when there are none).
  [[nodiscard]] uint64_t data_end() const noexcept;

  // name → index into `tensors` (owned copies, so File stays copyable).
  std::unordered_map<std::string, uint32_t, SeededStringHash, std::equal_to<>> tensor_index;
};

// Parses and validates the whole header and tensor table of `src` (tensor
// data is not read). Reads only through `src`; no other I/O. Time O(n log n)
// in the number of tensors, memory O(header) bounded by `limits`.
// Errors: EBADMSG malformed, ENOTSUP unsupported, or the source's read error.
// Thread-safe if `src` is.
[[nodiscard]] Result<File> parse(const ByteSource& src, const ParseLimits& limits = {});

// Reads the elements of an array left on disk (ArrayValue::loaded == false),
// re-validating as parse() does. Errors as parse().
[[nodiscard]] Result<std::vector<Scalar>> load_array(const ByteSource& src, const ArrayValue& a,
                                                     const ParseLimits& limits = {});

}  // namespace airs::gguf
