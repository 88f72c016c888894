// SPDX-License-Identifier: Apache-2.0
// Internal to the kernels: the NEON row dots (AArch64 only). kernels.cpp
// selects them at run time (kernels.hpp: KernelPath::kNeon, kNeonDotprod).
#pragma once

#include <cstddef>
#include <cstdint>

#include "infer/kernels.hpp"

namespace airs::infer::neon {

// The CPU's AdvSIMD and dot-product features, from getauxval(AT_HWCAP)
// (asimd, asimddp). False off AArch64.
[[nodiscard]] bool cpu_has_asimd() noexcept;
[[nodiscard]] bool cpu_has_dotprod() noexcept;

// `rows` consecutive rows of type wt (row r at w + r * stride) · x (in
// activation_type(wt)) into out[0..rows): the portable loop's values bit
// for bit. dotprod selects the sdot kernels for the integer types; the CPU
// must have asimddp then.
void dot_rows(WeightType wt, bool dotprod, const std::byte* w, size_t stride, const std::byte* x, size_t n,
              size_t rows, float* out) noexcept;

// The element-wise helpers the engine uses on AArch64 whatever the path
// (AdvSIMD is part of the AArch64 baseline the compiler already vectorises
// for): the portable functions' values bit for bit.
void axpy_f16(float a, const uint16_t* x, float* y, size_t n) noexcept;
void quantize_q8_0(const float* x, size_t n, std::byte* out) noexcept;

}  // namespace airs::infer::neon
