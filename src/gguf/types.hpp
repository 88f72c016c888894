// SPDX-License-Identifier: Apache-2.0
// ggml tensor types as GGUF files name them (ids, block geometry), from
// ggml.h (the table is in docs/gguf-types.tsv). Ids 4/5 are deprecated and 31–33,
// 36–38 were removed from ggml: a file using them cannot be loaded by any
// current runtime, so the reader rejects them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace airs::gguf {

// The ids the writer emits by name; any id in the table is readable.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
  kQ4_K = 12,
};

enum class TypeStatus : uint8_t { kSupported, kDeprecated, kRemoved, kUnknown };

struct TypeTraits {
  uint32_t id = 0;
  std::string_view name;      // ggml name, e.g. "q4_K"; for removed ids the ggml note
  uint32_t block_size = 0;    // elements per block (1 for plain types)
  uint32_t type_size = 0;     // bytes per block
  bool quantized = false;
  TypeStatus status = TypeStatus::kUnknown;
};

// Traits of `id`; status kUnknown (and zero sizes) for ids past the table.
// Thread-safe (constant data).
[[nodiscard]] TypeTraits type_traits(uint32_t id) noexcept;
[[nodiscard]] inline TypeTraits type_traits(GgmlType t) noexcept { return type_traits(static_cast<uint32_t>(t)); }

// Id of a supported type by its ggml name ("q4_K", case-sensitive); nullopt
// when no supported type has that name.
[[nodiscard]] std::optional<uint32_t> type_id_by_name(std::string_view name) noexcept;

// Number of ids in the table (0 .. kTypeCount-1).
inline constexpr uint32_t kTypeCount = 43;

}  // namespace airs::gguf
