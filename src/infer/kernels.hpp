// SPDX-License-Identifier: Apache-2.0
// Numeric kernels of the forward pass: fp16 conversion, the weight formats
// (F32, F16, Q8_0, Q4_0) as rows, dot products against activations, and the
// element-wise ops (RMSNorm, RoPE, softmax, SiLU). Pure functions, no
// allocation, thread-safe.
//
// Each weight type is multiplied the way ggml's CPU backend does it, so the
// engine agrees with llama.cpp to rounding: F32 rows against f32
// activations, F16 rows against activations rounded to f16, Q8_0 and Q4_0
// rows against activations quantised to Q8_0 blocks (integer dot per block,
// scaled by both block scales). The loops are written with independent
// accumulators so the compiler vectorises them; the hot ones are cloned for
// x86-64-v3 (AVX2/FMA) and picked at load time where the CPU has it. On
// AArch64, NEON kernels (with and without sdot) are picked at run time from
// getauxval(AT_HWCAP).
// Q8_0 and Q4_0 rows also have AVX-512 VNNI/VBMI kernels (two or four
// blocks per 512-bit register, vpdpbusd), picked at run time when the CPU
// has avx512f/bw/vl/vnni/vbmi; they sum in a different order than the AVX2
// ones, so results agree to float rounding, not bit for bit. They read
// the weights in place (no repacked copy), eight rows per group, and
// prefetch the next group while computing this one.
//
// Block formats (ggml, little-endian):
//   Q8_0: 34 bytes per 32 values: f16 d | int8 q[32];          v = d * q
//   Q4_0: 18 bytes per 32 values: f16 d | u8 qs[16]; v[j] = d * ((qs[j] & 15) - 8),
//                                                    v[j+16] = d * ((qs[j] >> 4) - 8)
//   Q4_K: 144 bytes per 256 values: f16 d | f16 dmin | u8 scales[12] | u8 qs[128].
//         Eight sub-blocks s of 32 values, each with a 6-bit scale sc[s] and
//         min m[s] packed in `scales`: for s < 4, sc = scales[s] & 63,
//         m = scales[s+4] & 63; for s >= 4, sc = (scales[s+4] & 15) |
//         (scales[s-4] >> 6) << 4, m = (scales[s+4] >> 4) | (scales[s] >> 6) << 4.
//         Chunk c (0..3) of 64 values uses qs[32c..32c+32): the low nibbles
//         are sub-block 2c, the high nibbles sub-block 2c+1;
//         v = d * sc[s] * q - dmin * m[s].
//         Its rows are multiplied against Q8_K activation blocks.
//   Q8_K (activations only): 276 bytes per 256 values: f32 d | int8 q[256] |
//         int16 bsum[8] (bsum[s] = the sum of q over sub-block s, for the
//         mins term: computed once per activation, not once per row),
//         quantised as ggml's quantize_row_q8_K does: max = the value of
//         largest magnitude, iscale = -127 / max, q = round(iscale * x),
//         d = 1 / iscale. (ggml's block has 16 sums of 16 values; this
//         format is the engine's own.) Q4_K . Q8_K per super block is
//         d_w * d_x * sum_s(sc[s] * sum(q * xq)) - dmin * d_x * sum_s(m[s] * sum(xq)),
//         integer inside the block. (Against Q8_0 activations, 32-value
//         scales, the logits moved 0.038 of the largest logit from
//         llama.cpp's on the agreement model; with 256-value scales as
//         ggml, 0.013, the same as llama.cpp's own f32 -> f16 KV shift.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace airs::infer {

inline constexpr uint32_t kQBlock = 32;      // values per Q8_0/Q4_0 block
inline constexpr size_t kQ8Bytes = 34;
inline constexpr size_t kQ4Bytes = 18;
inline constexpr uint32_t kQKBlock = 256;   // values per Q4_K super block
inline constexpr size_t kQ4KBytes = 144;
inline constexpr size_t kQ8KBytes = 276;

// The instruction sets the block dots may use (the kernel families). The
// default is the best the CPU has; tests select each supported path in turn
// and compare it with the reference.
//   kPortable ("scalar"): the plain loops (the compiler may still vectorise
//     them, and clones them for x86-64-v3 on x86).
//   kAvx2 ("avx2"): the AVX2/FMA/F16C kernels.
//   kAvx512Vnni ("avx512-vnni"): the AVX-512 VNNI/VBMI ones (rows the wide
//     kernels leave over run on AVX2).
//   kNeon ("neon"): AArch64 AdvSIMD as in ARMv8.0 (any Cortex-A53 or later):
//     i8 products by smull/sadalp, f16 converted by fcvtl.
//   kNeonDotprod ("neon-dotprod"): the same with sdot for the integer blocks
//     (the CPU reports asimddp: Cortex-A55/A76 and later, a Raspberry Pi 5).
// The NEON kernels give the portable path's values bit for bit (see
// kernels_neon.inc); the x86 ones agree with it to float rounding. fp16
// arithmetic (fphp/asimdhp) is deliberately not used: it would round every
// product and partial sum to 11 bits, and fcvtl, all the F16 kernel needs,
// is ARMv8.0.
enum class KernelPath : uint8_t { kPortable, kAvx2, kAvx512Vnni, kNeon, kNeonDotprod };
inline constexpr KernelPath kAllKernelPaths[] = {KernelPath::kPortable, KernelPath::kAvx2, KernelPath::kAvx512Vnni,
                                                 KernelPath::kNeon, KernelPath::kNeonDotprod};
[[nodiscard]] bool kernel_path_supported(KernelPath p) noexcept;
// Selects `p` for every later call; false (and no change) if the CPU lacks
// it. Not to be called while another thread runs kernels.
bool set_kernel_path(KernelPath p) noexcept;
[[nodiscard]] KernelPath kernel_path() noexcept;
// The family's name as airs-generate reports it: "scalar", "avx2",
// "avx512-vnni", "neon", "neon-dotprod".
[[nodiscard]] const char* kernel_path_name(KernelPath p) noexcept;

// kQ8_K is an activation format only (no model tensor is read as it).
enum class WeightType : uint8_t { kF32, kF16, kQ8_0, kQ4_0, kQ4_K, kQ8_K };

// ggml type id -> WeightType; false for any other type.
[[nodiscard]] bool weight_type_from_ggml(uint32_t ggml_type, WeightType* out) noexcept;
// Bytes of one row of `n` values (n a multiple of 32 for the block types,
// of 256 for Q4_K).
[[nodiscard]] size_t row_bytes(WeightType t, size_t n) noexcept;
// The type's ggml name ("f32", "f16", "q8_0", "q4_0", "q4_K", "q8_K").
[[nodiscard]] const char* weight_type_name(WeightType t) noexcept;
// The activation format a weight type is multiplied against.
[[nodiscard]] WeightType activation_type(WeightType t) noexcept;

// IEEE binary16 <-> binary32, round to nearest even (as F16C does).
[[nodiscard]] float fp16_to_fp32(uint16_t h) noexcept;
[[nodiscard]] uint16_t fp32_to_fp16(float f) noexcept;

// Converts n f32 values into `out` in activation format `t` (row_bytes(t, n)
// bytes): a copy for F32, f16 for F16, Q8_0 blocks for Q8_0 (amax / 127
// scales, values rounded to nearest even, like ggml's AVX2 path).
void quantize_row(WeightType t, const float* x, size_t n, std::byte* out) noexcept;

// Row `w` (format `wt`) · activation `x` (already in activation_type(wt)).
[[nodiscard]] float dot_row(WeightType wt, const std::byte* w, const std::byte* x, size_t n) noexcept;

// The mat-vec over a range of rows: `rows` consecutive rows (row r at
// w + r * stride) · x into out[0..rows). Any range of a weight matrix is one
// call with w at its first row, so an expert's rows of a 3-D tensor
// (mixture of experts: expert e of a [n_expert][n_rows][n] tensor is rows
// [e * n_rows, (e + 1) * n_rows)) are too. The same values as dot_row calls,
// computed kRowGroup (or 4) rows at a time with one read of each activation
// block per group. The x86 kernels prefetch the next group of rows
// (w + rows * stride onwards) while they compute: a caller walking a matrix
// should pass groups of kRowGroup rows in order.
inline constexpr size_t kRowGroup = 8;
void dot_rows(WeightType wt, const std::byte* w, size_t stride, const std::byte* x, size_t n, size_t rows,
              float* out) noexcept;

// Dequantises a row of n values into f32.
void dequantize_row(WeightType t, const std::byte* w, size_t n, float* out) noexcept;

// Plain f32 helpers.
[[nodiscard]] float dot_f32(const float* a, const float* b, size_t n) noexcept;
[[nodiscard]] float dot_f32_f16(const float* a, const uint16_t* b, size_t n) noexcept;
// y += a * x
void axpy_f32(float a, const float* x, float* y, size_t n) noexcept;
void axpy_f16(float a, const uint16_t* x, float* y, size_t n) noexcept;

// out = x / sqrt(mean(x²) + eps) * w  (sum of squares in double, as ggml).
void rms_norm(const float* x, const float* w, float eps, size_t n, float* out) noexcept;

enum class RopeStyle : uint8_t {
  kNormal,  // llama: rotates pairs (x[2i], x[2i+1])
  kNeox,    // NeoX: rotates pairs (x[i], x[i + n_rot/2])
};
// Rotates the first n_rot values of one head (head_dim values) for position
// `pos`: theta_i = pos * base^(-2i/n_rot), computed by repeated
// multiplication in float as ggml does.
void rope(float* head, uint32_t n_rot, uint32_t pos, float freq_base, RopeStyle style) noexcept;

// In place: x = softmax(x * scale).
void softmax(float* x, size_t n, float scale) noexcept;

// x = silu(x) * y
void swiglu(float* x, const float* y, size_t n) noexcept;

}  // namespace airs::infer
