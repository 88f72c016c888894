// SPDX-License-Identifier: Apache-2.0
#include "infer/kernels_neon.hpp"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>

#include <cmath>
#include <cstring>

#include "infer/kernels_common.hpp"

namespace airs::infer::neon {

// Read on each call, not cached in a global: kernels.cpp asks from its own
// static initialisers, which may run before this file's.
bool cpu_has_asimd() noexcept { return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0; }
bool cpu_has_dotprod() noexcept { return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0; }

// Two copies of the kernels: the ARMv8.0 baseline, and one compiled for
// ARMv8.2 with the dot-product extension. The target pragma applies to the
// functions defined between push and pop only, so the library (and this
// file) stays runnable on any ARMv8.0 CPU; the sdot copy is only called
// when the CPU reports asimddp.
namespace plain {
#define AIRS_NEON_DOTPROD 0
#include "infer/kernels_neon.inc"
#undef AIRS_NEON_DOTPROD
}  // namespace plain

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
namespace dot {
#define AIRS_NEON_DOTPROD 1
#include "infer/kernels_neon.inc"
#undef AIRS_NEON_DOTPROD
}  // namespace dot
#pragma GCC pop_options

void dot_rows(WeightType wt, bool dotprod, const std::byte* w, size_t stride, const std::byte* x, size_t n,
              size_t rows, float* out) noexcept {
  switch (wt) {
    case WeightType::kF32: plain::f32_rows(w, stride, x, n, rows, out); return;
    case WeightType::kF16: plain::f16_rows(w, stride, x, n, rows, out); return;
    case WeightType::kQ8_0:
      (dotprod ? dot::q8_0_rows : plain::q8_0_rows)(w, stride, x, n, rows, out);
      return;
    case WeightType::kQ4_0:
      (dotprod ? dot::q4_0_rows : plain::q4_0_rows)(w, stride, x, n, rows, out);
      return;
    case WeightType::kQ4_K:
      (dotprod ? dot::q4_k_rows : plain::q4_k_rows)(w, stride, x, n, rows, out);
      return;
    case WeightType::kQ8_K:  // activation only: never a weight
      for (size_t r = 0; r < rows; ++r) out[r] = 0.0F;
      return;
  }
}

void axpy_f16(float a, const uint16_t* x, float* y, size_t n) noexcept { plain::axpy_f16(a, x, y, n); }
void quantize_q8_0(const float* x, size_t n, std::byte* out) noexcept { plain::quantize_q8_0(x, n, out); }

}  // namespace airs::infer::neon

#else

namespace airs::infer::neon {

bool cpu_has_asimd() noexcept { return false; }
bool cpu_has_dotprod() noexcept { return false; }
void dot_rows(WeightType, bool, const std::byte*, size_t, const std::byte*, size_t, size_t rows, float* out) noexcept {
  for (size_t r = 0; r < rows; ++r) out[r] = 0.0F;
}
void axpy_f16(float, const uint16_t*, float*, size_t) noexcept {}
void quantize_q8_0(const float*, size_t, std::byte*) noexcept {}

}  // namespace airs::infer::neon

#endif
