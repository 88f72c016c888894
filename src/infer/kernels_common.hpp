// SPDX-License-Identifier: Apache-2.0
// Internal to the kernels (kernels.cpp, kernels_neon.cpp): the pieces of a
// block format every instruction-set path shares, so that the paths compute
// the same integer sums and round them through the same expression.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace airs::infer::detail {

inline uint16_t load_u16(const std::byte* p) noexcept {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

inline float load_f32(const std::byte* p) noexcept {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// All eight scales then all eight mins of a Q4_K block (out[0..8) scales,
// out[8..16) mins), unpacked with four 32-bit word operations (ggml's
// kmask trick); the format is described in kernels.hpp.
inline void q4k_unpack_scales(const std::byte* packed, uint8_t* out) noexcept {
  constexpr uint32_t kLow6 = 0x3F3F3F3FU, kLow4 = 0x0F0F0F0FU, kLow2 = 0x03030303U;
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);  // mins 4..7
  const uint32_t mins_lo = u[1] & kLow6;                        // mins 0..3
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);          // scales 4..7
  u[2] = mins_lo;
  u[0] &= kLow6;  // scales 0..3
  std::memcpy(out, u, 16);
}

// A Q4_K super block's contribution from its exact integer sums (d, dmin:
// the block's scales; dx: the Q8_K activation block's), one expression for
// every path so they agree bit for bit. The FMA is explicit: left to the
// compiler, FMA-enabled code contracts it and baseline code does not.
inline float q4k_value(float d, float dmin, float dx, int32_t sum_q, int32_t sum_m) noexcept {
  return std::fma(d * dx, static_cast<float>(sum_q), -(dmin * dx * static_cast<float>(sum_m)));
}

}  // namespace airs::infer::detail
