// SPDX-License-Identifier: Apache-2.0
#include "gguf/types.hpp"

#include <array>

namespace airs::gguf {
namespace {

constexpr TypeStatus S = TypeStatus::kSupported;
constexpr TypeStatus D = TypeStatus::kDeprecated;
constexpr TypeStatus R = TypeStatus::kRemoved;

// Mirrors gguf-types.tsv row for row; a test checks ids are dense.
constexpr std::array<TypeTraits, kTypeCount> kTable{{
    {0, "f32", 1, 4, false, S},
    {1, "f16", 1, 2, false, S},
    {2, "q4_0", 32, 18, true, S},
    {3, "q4_1", 32, 20, true, S},
    {4, "DEPRECATED (Q4_2)", 0, 0, false, D},
    {5, "DEPRECATED (Q4_3)", 0, 0, false, D},
    {6, "q5_0", 32, 22, true, S},
    {7, "q5_1", 32, 24, true, S},
    {8, "q8_0", 32, 34, true, S},
    {9, "q8_1", 32, 36, true, S},
    {10, "q2_K", 256, 84, true, S},
    {11, "q3_K", 256, 110, true, S},
    {12, "q4_K", 256, 144, true, S},
    {13, "q5_K", 256, 176, true, S},
    {14, "q6_K", 256, 210, true, S},
    {15, "q8_K", 256, 292, true, S},
    {16, "iq2_xxs", 256, 66, true, S},
    {17, "iq2_xs", 256, 74, true, S},
    {18, "iq3_xxs", 256, 98, true, S},
    {19, "iq1_s", 256, 50, true, S},
    {20, "iq4_nl", 32, 18, true, S},
    {21, "iq3_s", 256, 110, true, S},
    {22, "iq2_s", 256, 82, true, S},
    {23, "iq4_xs", 256, 136, true, S},
    {24, "i8", 1, 1, false, S},
    {25, "i16", 1, 2, false, S},
    {26, "i32", 1, 4, false, S},
    {27, "i64", 1, 8, false, S},
    {28, "f64", 1, 8, false, S},
    {29, "iq1_m", 256, 56, true, S},
    {30, "bf16", 1, 2, false, S},
    {31, "TYPE_Q4_0_4_4 REMOVED, use Q4_0 with runtime repacking", 0, 0, false, R},
    {32, "TYPE_Q4_0_4_8 REMOVED, use Q4_0 with runtime repacking", 0, 0, false, R},
    {33, "TYPE_Q4_0_8_8 REMOVED, use Q4_0 with runtime repacking", 0, 0, false, R},
    {34, "tq1_0", 256, 54, true, S},
    {35, "tq2_0", 256, 66, true, S},
    {36, "TYPE_IQ4_NL_4_4 REMOVED, use IQ4_NL with runtime repacking", 0, 0, false, R},
    {37, "TYPE_IQ4_NL_4_8 REMOVED, use IQ4_NL with runtime repacking", 0, 0, false, R},
    {38, "TYPE_IQ4_NL_8_8 REMOVED, use IQ4_NL with runtime repacking", 0, 0, false, R},
    {39, "mxfp4", 32, 17, true, S},
    {40, "nvfp4", 64, 36, true, S},
    {41, "q1_0", 128, 18, true, S},
    {42, "q2_0", 64, 18, true, S},
}};

}  // namespace

TypeTraits type_traits(uint32_t id) noexcept {
  if (id >= kTable.size()) return TypeTraits{id, "unknown", 0, 0, false, TypeStatus::kUnknown};
  return kTable[id];
}

std::optional<uint32_t> type_id_by_name(std::string_view name) noexcept {
  for (const auto& t : kTable) {
    if (t.status == TypeStatus::kSupported && t.name == name) return t.id;
  }
  return std::nullopt;
}

}  // namespace airs::gguf
