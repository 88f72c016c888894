// SPDX-License-Identifier: Apache-2.0
#include "infer/kernels.hpp"

#include "infer/kernels_common.hpp"
#include "infer/kernels_neon.hpp"
#include "util/sanitizers.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

// Hot loops get an AVX2/FMA clone next to the baseline build; the dynamic
// loader picks one per CPU (GNU ifunc). Elsewhere they are plain functions.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(AIRS_ASAN) && \
    !defined(AIRS_TSAN)
#define AIRS_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define AIRS_HOT
#endif

namespace airs::infer {

namespace {

// All 65536 halves as floats: conversion is one load in the inner loops.
struct Fp16Table {
  std::array<float, 65536> v;
  Fp16Table() noexcept {
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint32_t sign = (h & 0x8000U) << 16;
      const uint32_t exp = (h >> 10) & 0x1FU;
      const uint32_t man = h & 0x3FFU;
      uint32_t bits = 0;
      if (exp == 0) {
        if (man == 0) {
          bits = sign;
        } else {  // subnormal: value = man * 2^-24
          const float f = static_cast<float>(man) * 0x1p-24F;
          bits = std::bit_cast<uint32_t>(f) | sign;
        }
      } else if (exp == 31) {
        bits = sign | 0x7F800000U | (man << 13);
      } else {
        bits = sign | ((exp + 112U) << 23) | (man << 13);
      }
      v[h] = std::bit_cast<float>(bits);
    }
  }
};
const Fp16Table kFp16;

inline float h2f(uint16_t h) noexcept { return kFp16.v[h]; }

using detail::load_u16;

// a * b + c as the portable loops accumulate. On AArch64 it is always fused
// (every AArch64 CPU has FMA; the NEON kernels fuse the same steps and so
// give these values bit for bit); elsewhere it is left to the compiler.
inline float madd(float a, float b, float c) noexcept {
#if defined(__aarch64__)
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

AIRS_HOT float dot_f32_impl(const float* a, const float* b, size_t n) noexcept {
  constexpr size_t kLanes = 16;
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) acc[j] = madd(a[i + j], b[i + j], acc[j]);
  }
  float tail = 0.0F;
  for (; i < n; ++i) tail = madd(a[i], b[i], tail);
  float s = 0.0F;
  for (float v : acc) s += v;
  return s + tail;
}

AIRS_HOT float dot_f16_f16_impl(const uint16_t* a, const uint16_t* b, size_t n) noexcept {
  constexpr size_t kLanes = 16;
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) acc[j] += h2f(a[i + j]) * h2f(b[i + j]);
  }
  float tail = 0.0F;
  for (; i < n; ++i) tail += h2f(a[i]) * h2f(b[i]);
  float s = 0.0F;
  for (float v : acc) s += v;
  return s + tail;
}

AIRS_HOT float dot_f32_f16_impl(const float* a, const uint16_t* b, size_t n) noexcept {
  constexpr size_t kLanes = 16;
  float acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) acc[j] += a[i + j] * h2f(b[i + j]);
  }
  float tail = 0.0F;
  for (; i < n; ++i) tail += a[i] * h2f(b[i]);
  float s = 0.0F;
  for (float v : acc) s += v;
  return s + tail;
}

// One Q8_0 block of the weight against one of the activation: the integer
// sum is exact, so only the final scaling rounds.
AIRS_HOT float dot_q8_0_impl(const std::byte* w, const std::byte* x, size_t n) noexcept {
  float s = 0.0F;
  for (size_t b = 0; b < n / kQBlock; ++b, w += kQ8Bytes, x += kQ8Bytes) {
    const auto* qw = reinterpret_cast<const int8_t*>(w + 2);
    const auto* qx = reinterpret_cast<const int8_t*>(x + 2);
    int32_t sum = 0;
    for (size_t j = 0; j < kQBlock; ++j) sum += int32_t{qw[j]} * int32_t{qx[j]};
    s = madd(static_cast<float>(sum), h2f(load_u16(w)) * h2f(load_u16(x)), s);
  }
  return s;
}

AIRS_HOT float dot_q4_0_impl(const std::byte* w, const std::byte* x, size_t n) noexcept {
  float s = 0.0F;
  for (size_t b = 0; b < n / kQBlock; ++b, w += kQ4Bytes, x += kQ8Bytes) {
    const auto* qs = reinterpret_cast<const uint8_t*>(w + 2);
    const auto* qx = reinterpret_cast<const int8_t*>(x + 2);
    int32_t sum = 0;
    for (size_t j = 0; j < kQBlock / 2; ++j) {
      sum += ((qs[j] & 15) - 8) * int32_t{qx[j]};
      sum += ((qs[j] >> 4) - 8) * int32_t{qx[j + 16]};
    }
    s = madd(static_cast<float>(sum), h2f(load_u16(w)) * h2f(load_u16(x)), s);
  }
  return s;
}


// The 6-bit scale and min of sub-block s of a Q4_K block (see kernels.hpp).
inline void q4k_scale_min(const uint8_t* sc, uint32_t s, int32_t* scale, int32_t* min) noexcept {
  if (s < 4) {
    *scale = sc[s] & 63;
    *min = sc[s + 4] & 63;
  } else {
    *scale = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
    *min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
  }
}

using detail::q4k_unpack_scales;

// The super block's value from its exact integer sums: one expression for
// every path (detail::q4k_value). (An out-of-line baseline function instead
// costs the AVX-512 kernel an SSE/AVX state transition per call: 15x slower.)
inline float q4k_block_value(const std::byte* w, float dx, int32_t sum_q, int32_t sum_m) noexcept {
  return detail::q4k_value(h2f(load_u16(w)), h2f(load_u16(w + 2)), dx, sum_q, sum_m);
}

inline float q8k_scale(const std::byte* x) noexcept {
  float d;
  std::memcpy(&d, x, 4);
  return d;
}

// Q4_K row against Q8_K activation blocks: the sums inside a super block
// are exact integers, scaled once per block as ggml does.
AIRS_HOT float dot_q4_k_impl(const std::byte* w, const std::byte* x, size_t n) noexcept {
  float s = 0.0F;
  for (size_t b = 0; b < n / kQKBlock; ++b, w += kQ4KBytes, x += kQ8KBytes) {
    const float dx = q8k_scale(x);
    const auto* scales = reinterpret_cast<const uint8_t*>(w + 4);
    const auto* qs = reinterpret_cast<const uint8_t*>(w + 16);
    const auto* qx = reinterpret_cast<const int8_t*>(x + 4);
    int32_t sum_q = 0, sum_m = 0;
    for (uint32_t c = 0; c < 4; ++c, qs += 32) {
      for (uint32_t half = 0; half < 2; ++half, qx += 32) {
        int32_t dot = 0, xs = 0;
        for (size_t j = 0; j < 32; ++j) {
          const int32_t q = half == 0 ? qs[j] & 15 : qs[j] >> 4;
          dot += q * int32_t{qx[j]};
          xs += int32_t{qx[j]};
        }
        int32_t sc = 0, m = 0;
        q4k_scale_min(scales, 2 * c + half, &sc, &m);
        sum_q += sc * dot;
        sum_m += m * xs;
      }
    }
    s += q4k_block_value(w, dx, sum_q, sum_m);
  }
  return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 versions of the block dots, the way ggml's x86 path computes them:
// |w| ·u8 sign(x, w) pairs summed to i32, converted, scaled by d_w · d_x
// with FMA into 8 float lanes. Picked at run time (cpu_has_avx2()).
#define AIRS_AVX2 __attribute__((target("avx2,fma,f16c")))

AIRS_AVX2 inline float hsum(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

AIRS_AVX2 inline __m256 dot_i8_block(__m256i w, __m256i x) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
  const __m256i p16 = _mm256_maddubs_epi16(aw, sx);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

AIRS_AVX2 float dot_q8_0_avx2(const std::byte* w, const std::byte* x, size_t n) noexcept {
  // Two independent accumulators: the FMA latency, not the loads, bounds a
  // single chain.
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const size_t nb = n / kQBlock;
  size_t b = 0;
  for (; b + 2 <= nb; b += 2, w += 2 * kQ8Bytes, x += 2 * kQ8Bytes) {
    const __m256 d0 = _mm256_set1_ps(h2f(load_u16(w)) * h2f(load_u16(x)));
    const __m256 d1 = _mm256_set1_ps(h2f(load_u16(w + kQ8Bytes)) * h2f(load_u16(x + kQ8Bytes)));
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2));
    const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kQ8Bytes + 2));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + kQ8Bytes + 2));
    acc0 = _mm256_fmadd_ps(d0, dot_i8_block(w0, x0), acc0);
    acc1 = _mm256_fmadd_ps(d1, dot_i8_block(w1, x1), acc1);
  }
  for (; b < nb; ++b, w += kQ8Bytes, x += kQ8Bytes) {
    const __m256 d = _mm256_set1_ps(h2f(load_u16(w)) * h2f(load_u16(x)));
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2));
    acc0 = _mm256_fmadd_ps(d, dot_i8_block(qw, qx), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

AIRS_AVX2 float dot_q4_0_avx2(const std::byte* w, const std::byte* x, size_t n) noexcept {
  __m256 acc = _mm256_setzero_ps();
  const __m128i lo_mask = _mm_set1_epi8(15);
  for (size_t b = 0; b < n / kQBlock; ++b, w += kQ4Bytes, x += kQ8Bytes) {
    const __m256 d = _mm256_set1_ps(h2f(load_u16(w)) * h2f(load_u16(x)));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    const __m128i lo = _mm_and_si128(q, lo_mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), lo_mask);
    const __m256i qw = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2));
    acc = _mm256_fmadd_ps(d, dot_i8_block(qw, qx), acc);
  }
  return hsum(acc);
}

AIRS_AVX2 inline int32_t hsum_i32(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(1, 0, 3, 2)));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

// sum_s m[s] * bsum[s] of one super block: the activation's sub-block sums
// (Q8_K's int16 bsums) against the unpacked mins, one vpmaddwd.
AIRS_AVX2 inline int32_t q4k_min_sum(const uint8_t* scales_mins, const std::byte* x) {
  const __m128i m = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales_mins + 8)));
  const __m128i bs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 4 + kQKBlock));
  __m128i r = _mm_madd_epi16(m, bs);
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(1, 0, 3, 2)));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

// Q4_K x Q8_K: per 64-value chunk, the nibbles (u8 0..15) times the
// activation (s8) pairwise to i16 (at most 2 * 15 * 127, no saturation),
// times the sub-block scale to i32; the i32 sum is exact, as the scalar one.
AIRS_AVX2 float dot_q4_k_avx2(const std::byte* w, const std::byte* x, size_t n) noexcept {
  const __m256i lo_mask = _mm256_set1_epi8(15);
  float s = 0.0F;
  for (size_t b = 0; b < n / kQKBlock; ++b, w += kQ4KBytes, x += kQ8KBytes) {
    alignas(16) uint8_t sm[16];
    q4k_unpack_scales(w + 4, sm);
    const std::byte* qs = w + 16;
    const std::byte* qx = x + 4;
    __m256i acc = _mm256_setzero_si256();
    for (size_t c = 0; c < 4; ++c, qs += 32, qx += 64) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
      const __m256i lo = _mm256_and_si256(q, lo_mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo_mask);
      const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx));
      const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + 32));
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_set1_epi16(sm[2 * c]));
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), _mm256_set1_epi16(sm[2 * c + 1]));
      acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
    }
    s += q4k_block_value(w, q8k_scale(x), hsum_i32(acc), q4k_min_sum(sm, x));
  }
  return s;
}

AIRS_AVX2 float dot_f16_f16_avx2(const uint16_t* a, const uint16_t* b, size_t n) noexcept {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    const __m256 a1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8)));
    const __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8)));
    acc0 = _mm256_fmadd_ps(a0, b0, acc0);
    acc1 = _mm256_fmadd_ps(a1, b1, acc1);
  }
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += h2f(a[i]) * h2f(b[i]);
  return s;
}

// Four Q8_0 rows against one activation: each activation block is loaded
// once for four rows, and the four chains run independently.
AIRS_AVX2 void dot4_q8_0_avx2(const std::byte* w, size_t stride, const std::byte* x, size_t n, float* out) noexcept {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (size_t b = 0; b < n / kQBlock; ++b) {
    const std::byte* xb = x + b * kQ8Bytes;
    const float dx = h2f(load_u16(xb));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 2));
    for (size_t r = 0; r < 4; ++r) {
      const std::byte* wb = w + r * stride + b * kQ8Bytes;
      const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(load_u16(wb)) * dx), dot_i8_block(qw, qx), acc[r]);
    }
  }
  for (size_t r = 0; r < 4; ++r) out[r] = hsum(acc[r]);
}

AIRS_AVX2 void dot4_q4_0_avx2(const std::byte* w, size_t stride, const std::byte* x, size_t n, float* out) noexcept {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  const __m128i lo_mask = _mm_set1_epi8(15);
  for (size_t b = 0; b < n / kQBlock; ++b) {
    const std::byte* xb = x + b * kQ8Bytes;
    const float dx = h2f(load_u16(xb));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 2));
    for (size_t r = 0; r < 4; ++r) {
      const std::byte* wb = w + r * stride + b * kQ4Bytes;
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 2));
      const __m128i lo = _mm_and_si128(q, lo_mask);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), lo_mask);
      const __m256i qw = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(load_u16(wb)) * dx), dot_i8_block(qw, qx), acc[r]);
    }
  }
  for (size_t r = 0; r < 4; ++r) out[r] = hsum(acc[r]);
}

// AVX-512 VNNI/VBMI versions (Ice Lake, Sapphire Rapids, Zen 4). The
// profile of the AVX2 four-row kernels on a 1-thread decode had 96 % of the
// time in them: stalls on the weight loads (no prefetch across four
// interleaved row streams) and the per-block scalar work (scale load,
// convert, multiply, broadcast per row and block) on top of the
// sign/maddubs/madd chain. Here each row's block group is two loads and one
// byte permute (vpermt2b) into a 512-bit register, its f16 scales one more
// permute and one convert, the integer dot one vpdpbusd (u8 x s8 -> i32, no
// i16 saturation), and each row is prefetched ahead.
// GCC 12 reports the _mm512_undefined_* inside its own intrinsics as
// (maybe-)uninitialized, a false positive.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#define AIRS_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi")))

// How far ahead of each row's reads the kernels prefetch (of 256..3072 on a
// 1-thread decode and a 200 MB weight sweep, 3072 was best or level).
constexpr size_t kPrefetchBytes = 3072;

// Byte-index vectors for vpermb/vpermt2b, built once.
struct PermTables {
  alignas(64) uint8_t q8_quants[64];   // 2 Q8_0 blocks (68 bytes) -> 64 quants
  alignas(64) uint8_t q8_scales[64];   // -> halves [d0 x8 | d1 x8]
  alignas(64) uint8_t q4_nibbles[64];  // 4 Q4_0 blocks (72 bytes) -> 64 nibble bytes
  alignas(64) uint8_t q4_scales[64];   // -> halves [d0 x4 | d1 x4 | d2 x4 | d3 x4]
  PermTables() noexcept {
    for (uint32_t j = 0; j < 64; ++j) {
      q8_quants[j] = static_cast<uint8_t>(j < 32 ? 2 + j : kQ8Bytes + 2 + (j - 32));
      q4_nibbles[j] = static_cast<uint8_t>((j / 16) * kQ4Bytes + 2 + j % 16);
      const uint32_t half = (j / 2) % 16;  // only the low 32 bytes matter
      q8_scales[j] = static_cast<uint8_t>((half / 8) * kQ8Bytes + j % 2);
      q4_scales[j] = static_cast<uint8_t>((half / 4) * kQ4Bytes + j % 2);
    }
  }
};
const PermTables kPerm;

AIRS_VNNI inline __m512i load_idx(const uint8_t* t) { return _mm512_load_si512(t); }

// The 16 f16 scales vpermb picked out of `raw` (low 32 bytes), as floats.
AIRS_VNNI inline __m512 scales_f32(__m512i raw, __m512i idx) {
  return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi8(idx, raw)));
}

// R rows' float accumulators, zeroed; finish() sums each row's lanes into
// out[r] and adds tail(r), the row's last blocks (fewer than one step).
template <size_t R>
struct VnniRows {
  __m512 acc[R];
  AIRS_VNNI VnniRows() noexcept {
    for (auto& a : acc) a = _mm512_setzero_ps();
  }
  template <typename Tail>
  AIRS_VNNI void finish(float* out, Tail tail) const noexcept {
    for (size_t r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(acc[r]) + tail(r);
  }
};

// Q8_0 x Q8_0, two blocks per step: lanes 0-7 hold block 2k, 8-15 block
// 2k+1. |w| (as u8) . (x with w's sign) is the signed product, exact.
template <size_t R>
AIRS_VNNI void dotn_q8_0_vnni(const std::byte* w, size_t stride, const std::byte* x, size_t n, float* out) noexcept {
  const __m512i iq = load_idx(kPerm.q8_quants);
  const __m512i is = load_idx(kPerm.q8_scales);
  const size_t ahead = stride == 0 ? kPrefetchBytes : R * stride;
  __m512 acc[R];
#pragma GCC unroll 16
  for (size_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const size_t nb = n / kQBlock;
  size_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const std::byte* xb = x + b * kQ8Bytes;
    const __m512i xa = _mm512_loadu_si512(xb);
    const __m512i xt = _mm512_maskz_loadu_epi8(0xF, xb + 64);  // bytes 64..67; no read past the pair
    const __m512i qx = _mm512_permutex2var_epi8(xa, iq, xt);
    const __m512 dx = scales_f32(xa, is);
#pragma GCC unroll 16
    for (size_t r = 0; r < R; ++r) {
      const std::byte* wb = w + r * stride + b * kQ8Bytes;
      _mm_prefetch(reinterpret_cast<const char*>(wb + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wb + ahead + 64), _MM_HINT_T0);
      const __m512i wa = _mm512_loadu_si512(wb);
      const __m512i qw = _mm512_permutex2var_epi8(wa, iq, _mm512_maskz_loadu_epi8(0xF, wb + 64));
      const __m512i sx = _mm512_mask_sub_epi8(qx, _mm512_movepi8_mask(qw), _mm512_setzero_si512(), qx);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(qw), sx);
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(scales_f32(wa, is), dx), _mm512_cvtepi32_ps(dot), acc[r]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    const float tail =
        b < nb ? dot_q8_0_avx2(w + r * stride + b * kQ8Bytes, x + b * kQ8Bytes, (nb - b) * kQBlock) : 0.0F;
    out[r] = _mm512_reduce_add_ps(acc[r]) + tail;
  }
}

// Q4_0 x Q8_0, four blocks per step. The 64 nibble bytes of four blocks
// unpack to lo (values 0-15 of each block, 128-bit lane k = block k) and hi
// (values 16-31); the activation is gathered the same way once per step for
// all rows. The nibbles are used as they are (u8 0..15) and the -8 offset
// comes back as -8 . sum(x), the accumulator's start value: two vpdpbusd
// per step and row, and lane group k holds block k's sum.
// Prefetch: rows are consecutive and the caller walks them in groups of R,
// so each row's reads are mirrored one group ahead (row r + R, same
// offset): the whole next group arrives while this one is computed, however
// short the rows. A single row (stride 0) prefetches kPrefetchBytes ahead.
template <size_t R>
AIRS_VNNI void dotn_q4_0_vnni(const std::byte* w, size_t stride, const std::byte* x, size_t n, float* out) noexcept {
  const __m512i in = load_idx(kPerm.q4_nibbles);
  const __m512i is = load_idx(kPerm.q4_scales);
  const __m512i lo_mask = _mm512_set1_epi8(15);
  const __m512i eights = _mm512_set1_epi8(8);
  const __m512i spread4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const size_t ahead = stride == 0 ? kPrefetchBytes : R * stride;
  __m512 acc[R];
#pragma GCC unroll 16
  for (size_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const size_t nb = n / kQBlock;
  size_t b = 0;
  for (; b + 4 <= nb; b += 4) {
    const std::byte* xb = x + b * kQ8Bytes;
    __m512i xlo = _mm512_setzero_si512(), xhi = _mm512_setzero_si512();
    alignas(16) float dxs[4];
    for (size_t k = 0; k < 4; ++k) {
      const std::byte* xk = xb + k * kQ8Bytes;
      dxs[k] = h2f(load_u16(xk));
      xlo = _mm512_mask_loadu_epi8(xlo, __mmask64{0xFFFF} << (16 * k), xk + 2 - 16 * k);
      xhi = _mm512_mask_loadu_epi8(xhi, __mmask64{0xFFFF} << (16 * k), xk + 18 - 16 * k);
    }
    const __m512 dx = _mm512_permutexvar_ps(spread4, _mm512_castps128_ps512(_mm_load_ps(dxs)));
    const __m512i init = _mm512_sub_epi32(
        _mm512_setzero_si512(),
        _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), eights, xlo), eights, xhi));
#pragma GCC unroll 16
    for (size_t r = 0; r < R; ++r) {
      const std::byte* wb = w + r * stride + b * kQ4Bytes;
      _mm_prefetch(reinterpret_cast<const char*>(wb + ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wb + ahead + 64), _MM_HINT_T0);
      const __m512i wa = _mm512_loadu_si512(wb);
      const __m512i q = _mm512_permutex2var_epi8(wa, in, _mm512_maskz_loadu_epi8(0xFF, wb + 64));
      const __m512i lo = _mm512_and_si512(q, lo_mask);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), lo_mask);
      const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, lo, xlo), hi, xhi);
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(scales_f32(wa, is), dx), _mm512_cvtepi32_ps(dot), acc[r]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    const float tail =
        b < nb ? dot_q4_0_avx2(w + r * stride + b * kQ4Bytes, x + b * kQ8Bytes, (nb - b) * kQBlock) : 0.0F;
    out[r] = _mm512_reduce_add_ps(acc[r]) + tail;
  }
}

// Q4_K x Q8_K, R rows, two 64-value chunks (128 values) per step. The 64
// quant bytes of chunks 2p, 2p+1 split into lo nibbles (sub-blocks 4p in
// bytes 0-31, 4p+2 in 32-63) and hi nibbles (4p+1, 4p+3); the activation's
// matching halves are gathered once per step for all rows (vshufi64x2).
// u8 x s8 pairs to i16 (vpmaddubsw), times a per-lane scale vector to i32
// (vpmaddwd): the lanes of a sub-block carry its scale, picked out of the
// unpacked scales with vpermw. The i32 sums are exact, so each row's value
// is the scalar kernel's bit for bit. Each super block of row r prefetches
// the same bytes of row r + R (see dotn_q4_0_vnni).
// vpermw indexes into the unpacked scales: [sub-block a x16 | b x16].
AIRS_VNNI inline __m512i q4k_pick(int16_t a, int16_t b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(a)), _mm256_set1_epi16(b), 1);
}

template <size_t R>
AIRS_VNNI void dotn_q4_k_vnni(const std::byte* w, size_t stride, const std::byte* x, size_t n, float* out) noexcept {
  const __m512i lo_mask = _mm512_set1_epi8(15);
  const __m512i pick_lo[2] = {q4k_pick(0, 2), q4k_pick(4, 6)};
  const __m512i pick_hi[2] = {q4k_pick(1, 3), q4k_pick(5, 7)};
  const size_t ahead = stride == 0 ? kPrefetchBytes : R * stride;
  float s[R] = {};
  for (size_t b = 0; b < n / kQKBlock; ++b) {
    const std::byte* xb = x + b * kQ8KBytes;
    __m512i xlo[2], xhi[2];
    for (size_t p = 0; p < 2; ++p) {
      const __m512i x0 = _mm512_loadu_si512(xb + 4 + 128 * p);
      const __m512i x1 = _mm512_loadu_si512(xb + 4 + 128 * p + 64);
      xlo[p] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(1, 0, 1, 0));
      xhi[p] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 2, 3, 2));
    }
    const float dx = q8k_scale(xb);
#pragma GCC unroll 16
    for (size_t r = 0; r < R; ++r) {
      const std::byte* wb = w + r * stride + b * kQ4KBytes;
      for (size_t k = 0; k < kQ4KBytes; k += 64) _mm_prefetch(reinterpret_cast<const char*>(wb + ahead + k), _MM_HINT_T0);
      alignas(16) uint8_t sm[16];
      q4k_unpack_scales(wb + 4, sm);
      const __m512i sc16 = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(sm))));
      __m512i acc = _mm512_setzero_si512();
      for (size_t p = 0; p < 2; ++p) {
        const __m512i q = _mm512_loadu_si512(wb + 16 + 64 * p);
        const __m512i lo = _mm512_and_si512(q, lo_mask);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), lo_mask);
        const __m512i plo = _mm512_madd_epi16(_mm512_maddubs_epi16(lo, xlo[p]), _mm512_permutexvar_epi16(pick_lo[p], sc16));
        const __m512i phi = _mm512_madd_epi16(_mm512_maddubs_epi16(hi, xhi[p]), _mm512_permutexvar_epi16(pick_hi[p], sc16));
        acc = _mm512_add_epi32(acc, _mm512_add_epi32(plo, phi));
      }
      s[r] += q4k_block_value(wb, dx, _mm512_reduce_add_epi32(acc), q4k_min_sum(sm, xb));
    }
  }
  for (size_t r = 0; r < R; ++r) out[r] = s[r];
}

#pragma GCC diagnostic pop

// F16C from cpuid (leaf 1, ECX): Clang 14's __builtin_cpu_supports does not
// know the name.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
const bool kHasVnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                      __builtin_cpu_supports("avx512vbmi") && cpu_has_f16c() &&
                      __builtin_cpu_supports("fma");
const bool kHasAvx2 =
    __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
#else
constexpr bool kHasAvx2 = false;
constexpr bool kHasVnni = false;
#endif

const bool kHasNeon = neon::cpu_has_asimd();
const bool kHasNeonDot = kHasNeon && neon::cpu_has_dotprod();

KernelPath best_path() noexcept {
  if (kHasVnni) return KernelPath::kAvx512Vnni;
  if (kHasAvx2) return KernelPath::kAvx2;
  if (kHasNeonDot) return KernelPath::kNeonDotprod;
  if (kHasNeon) return KernelPath::kNeon;
  return KernelPath::kPortable;
}
std::atomic<KernelPath> g_path{best_path()};

inline bool use_vnni() noexcept { return g_path.load(std::memory_order_relaxed) == KernelPath::kAvx512Vnni; }
inline bool use_avx2() noexcept {
  const KernelPath p = g_path.load(std::memory_order_relaxed);
  return p == KernelPath::kAvx2 || p == KernelPath::kAvx512Vnni;
}
inline bool use_neon() noexcept {
  const KernelPath p = g_path.load(std::memory_order_relaxed);
  return p == KernelPath::kNeon || p == KernelPath::kNeonDotprod;
}

}  // namespace

bool kernel_path_supported(KernelPath p) noexcept {
  switch (p) {
    case KernelPath::kPortable: return true;
    case KernelPath::kAvx2: return kHasAvx2;
    case KernelPath::kAvx512Vnni: return kHasVnni;
    case KernelPath::kNeon: return kHasNeon;
    case KernelPath::kNeonDotprod: return kHasNeonDot;
  }
  return false;
}

const char* kernel_path_name(KernelPath p) noexcept {
  switch (p) {
    case KernelPath::kPortable: return "scalar";
    case KernelPath::kAvx2: return "avx2";
    case KernelPath::kAvx512Vnni: return "avx512-vnni";
    case KernelPath::kNeon: return "neon";
    case KernelPath::kNeonDotprod: return "neon-dotprod";
  }
  return "unknown";
}

bool set_kernel_path(KernelPath p) noexcept {
  if (!kernel_path_supported(p)) return false;
  g_path.store(p, std::memory_order_relaxed);
  return true;
}

KernelPath kernel_path() noexcept { return g_path.load(std::memory_order_relaxed); }

bool weight_type_from_ggml(uint32_t ggml_type, WeightType* out) noexcept {
  switch (ggml_type) {
    case 0: *out = WeightType::kF32; return true;
    case 1: *out = WeightType::kF16; return true;
    case 2: *out = WeightType::kQ4_0; return true;
    case 8: *out = WeightType::kQ8_0; return true;
    case 12: *out = WeightType::kQ4_K; return true;
    default: return false;
  }
}

size_t row_bytes(WeightType t, size_t n) noexcept {
  switch (t) {
    case WeightType::kF32: return n * 4;
    case WeightType::kF16: return n * 2;
    case WeightType::kQ8_0: return n / kQBlock * kQ8Bytes;
    case WeightType::kQ4_0: return n / kQBlock * kQ4Bytes;
    case WeightType::kQ4_K: return n / kQKBlock * kQ4KBytes;
    case WeightType::kQ8_K: return n / kQKBlock * kQ8KBytes;
  }
  return 0;
}

const char* weight_type_name(WeightType t) noexcept {
  switch (t) {
    case WeightType::kF32: return "f32";
    case WeightType::kF16: return "f16";
    case WeightType::kQ8_0: return "q8_0";
    case WeightType::kQ4_0: return "q4_0";
    case WeightType::kQ4_K: return "q4_K";
    case WeightType::kQ8_K: return "q8_K";
  }
  return "unknown";
}

WeightType activation_type(WeightType t) noexcept {
  if (t == WeightType::kQ4_0) return WeightType::kQ8_0;
  if (t == WeightType::kQ4_K) return WeightType::kQ8_K;
  return t;
}

float fp16_to_fp32(uint16_t h) noexcept { return h2f(h); }

uint16_t fp32_to_fp16(float f) noexcept {
#if defined(__aarch64__)
  // The FPU's conversion (fcvt, round to nearest even by default): the same
  // bits as the code below for every value but NaN, whose payload it keeps.
  if (!std::isnan(f)) {
    const auto h = static_cast<__fp16>(f);
    return std::bit_cast<uint16_t>(h);
  }
#endif
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000U;
  const uint32_t ax = x & 0x7FFFFFFFU;
  if (ax >= 0x7F800000U) return static_cast<uint16_t>(sign | 0x7C00U | (ax > 0x7F800000U ? 0x200U : 0U));
  if (ax >= 0x477FF000U) return static_cast<uint16_t>(sign | 0x7C00U);  // rounds past 65504
  if (ax < 0x38800000U) {
    // Subnormal or zero in f16: scale so the integer part is the mantissa;
    // the FPU rounds to nearest even.
    const float v = std::bit_cast<float>(ax) * 0x1p24F;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(v)));
  }
  // Normal: drop 13 mantissa bits with round to nearest even; a carry into
  // the exponent is the correct result.
  const uint32_t rounded = ax + 0xFFFU + ((ax >> 13) & 1U);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000U) >> 13));
}

void quantize_row(WeightType t, const float* x, size_t n, std::byte* out) noexcept {
  switch (t) {
    case WeightType::kF32:
      std::memcpy(out, x, n * 4);
      return;
    case WeightType::kF16:
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case WeightType::kQ8_0:
    case WeightType::kQ4_0:  // not an activation format: written as its activation (Q8_0)
#if defined(__aarch64__)
      neon::quantize_q8_0(x, n, out);
      return;
#endif
      for (size_t b = 0; b < n / kQBlock; ++b, x += kQBlock, out += kQ8Bytes) {
        float amax = 0.0F;
        for (size_t j = 0; j < kQBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0F;
        const float id = amax != 0.0F ? 127.0F / amax : 0.0F;
        const uint16_t dh = fp32_to_fp16(d);
        std::memcpy(out, &dh, 2);
        auto* q = reinterpret_cast<int8_t*>(out + 2);
        for (size_t j = 0; j < kQBlock; ++j) q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      }
      return;
    case WeightType::kQ4_K:  // not an activation format: written as its activation (Q8_K)
    case WeightType::kQ8_K:
      for (size_t b = 0; b < n / kQKBlock; ++b, x += kQKBlock, out += kQ8KBytes) {
        float amax = 0.0F, mx = 0.0F;
        for (size_t j = 0; j < kQKBlock; ++j) {
          if (std::fabs(x[j]) > amax) {
            amax = std::fabs(x[j]);
            mx = x[j];
          }
        }
        auto* q = reinterpret_cast<int8_t*>(out + 4);
        if (amax == 0.0F) {
          std::memset(out, 0, kQ8KBytes);
          continue;
        }
        const float iscale = -127.0F / mx;
        for (size_t j = 0; j < kQKBlock; ++j) {
          q[j] = static_cast<int8_t>(std::min(127.0F, std::nearbyint(iscale * x[j])));
        }
        const float d = 1.0F / iscale;
        std::memcpy(out, &d, 4);
        for (size_t sb = 0; sb < kQKBlock / 32; ++sb) {
          int16_t sum = 0;
          for (size_t j = 0; j < 32; ++j) sum = static_cast<int16_t>(sum + q[32 * sb + j]);
          std::memcpy(out + 4 + kQKBlock + 2 * sb, &sum, 2);
        }
      }
      return;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
namespace {
using DotFn = float (*)(const std::byte*, const std::byte*, size_t) noexcept;
using DotRowsFn = void (*)(const std::byte*, size_t, const std::byte*, size_t, float*) noexcept;
// One row on the selected path: the AVX-512 kernel on a single row, the
// AVX2 one, or the plain loop.
float dot_on_path(DotRowsFn vnni, DotFn avx2, DotFn portable, const std::byte* w, const std::byte* x,
                  size_t n) noexcept {
  if (use_vnni()) {
    float out;
    vnni(w, 0, x, n, &out);
    return out;
  }
  return use_avx2() ? avx2(w, x, n) : portable(w, x, n);
}
}  // namespace
#define AIRS_DOT_ON_PATH(vnni, avx2, portable) dot_on_path(vnni, avx2, portable, w, x, n)
#else
#define AIRS_DOT_ON_PATH(vnni, avx2, portable) portable(w, x, n)
#endif

float dot_row(WeightType wt, const std::byte* w, const std::byte* x, size_t n) noexcept {
  if (use_neon()) {
    float out = 0.0F;
    neon::dot_rows(wt, kernel_path() == KernelPath::kNeonDotprod, w, 0, x, n, 1, &out);
    return out;
  }
  switch (wt) {
    case WeightType::kF32:
      return dot_f32_impl(reinterpret_cast<const float*>(w), reinterpret_cast<const float*>(x), n);
    case WeightType::kF16:
#if defined(__x86_64__) && defined(__GNUC__)
      if (use_avx2()) return dot_f16_f16_avx2(reinterpret_cast<const uint16_t*>(w), reinterpret_cast<const uint16_t*>(x), n);
#endif
      return dot_f16_f16_impl(reinterpret_cast<const uint16_t*>(w), reinterpret_cast<const uint16_t*>(x), n);
    case WeightType::kQ8_0:
      return AIRS_DOT_ON_PATH(dotn_q8_0_vnni<1>, dot_q8_0_avx2, dot_q8_0_impl);
    case WeightType::kQ4_0:
      return AIRS_DOT_ON_PATH(dotn_q4_0_vnni<1>, dot_q4_0_avx2, dot_q4_0_impl);
    case WeightType::kQ4_K:
      return AIRS_DOT_ON_PATH(dotn_q4_k_vnni<1>, dot_q4_k_avx2, dot_q4_k_impl);
    case WeightType::kQ8_K:  // activation only: never a weight
      return 0.0F;
  }
  return 0.0F;
}

void dequantize_row(WeightType t, const std::byte* w, size_t n, float* out) noexcept {
  switch (t) {
    case WeightType::kF32:
      std::memcpy(out, w, n * 4);
      return;
    case WeightType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = h2f(load_u16(w + 2 * i));
      return;
    case WeightType::kQ8_0:
      for (size_t b = 0; b < n / kQBlock; ++b, w += kQ8Bytes, out += kQBlock) {
        const float d = h2f(load_u16(w));
        const auto* q = reinterpret_cast<const int8_t*>(w + 2);
        for (size_t j = 0; j < kQBlock; ++j) out[j] = d * static_cast<float>(q[j]);
      }
      return;
    case WeightType::kQ4_0:
      for (size_t b = 0; b < n / kQBlock; ++b, w += kQ4Bytes, out += kQBlock) {
        const float d = h2f(load_u16(w));
        const auto* qs = reinterpret_cast<const uint8_t*>(w + 2);
        for (size_t j = 0; j < kQBlock / 2; ++j) {
          out[j] = d * static_cast<float>((qs[j] & 15) - 8);
          out[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
        }
      }
      return;
    case WeightType::kQ8_K:
      for (size_t b = 0; b < n / kQKBlock; ++b, w += kQ8KBytes, out += kQKBlock) {
        float d;
        std::memcpy(&d, w, 4);
        const auto* q = reinterpret_cast<const int8_t*>(w + 4);
        for (size_t j = 0; j < kQKBlock; ++j) out[j] = d * static_cast<float>(q[j]);
      }
      return;
    case WeightType::kQ4_K:
      for (size_t b = 0; b < n / kQKBlock; ++b, w += kQ4KBytes) {
        const float d = h2f(load_u16(w));
        const float dmin = h2f(load_u16(w + 2));
        const auto* scales = reinterpret_cast<const uint8_t*>(w + 4);
        const auto* qs = reinterpret_cast<const uint8_t*>(w + 16);
        for (uint32_t c = 0; c < 4; ++c, qs += 32) {
          int32_t sc0 = 0, m0 = 0, sc1 = 0, m1 = 0;
          q4k_scale_min(scales, 2 * c, &sc0, &m0);
          q4k_scale_min(scales, 2 * c + 1, &sc1, &m1);
          const float d0 = d * static_cast<float>(sc0), mn0 = dmin * static_cast<float>(m0);
          const float d1 = d * static_cast<float>(sc1), mn1 = dmin * static_cast<float>(m1);
          for (size_t j = 0; j < 32; ++j) *out++ = d0 * static_cast<float>(qs[j] & 15) - mn0;
          for (size_t j = 0; j < 32; ++j) *out++ = d1 * static_cast<float>(qs[j] >> 4) - mn1;
        }
      }
      return;
  }
}

void dot_rows(WeightType wt, const std::byte* w, size_t stride, const std::byte* x, size_t n, size_t rows,
              float* out) noexcept {
  if (use_neon()) {
    neon::dot_rows(wt, kernel_path() == KernelPath::kNeonDotprod, w, stride, x, n, rows, out);
    return;
  }
  size_t r = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (use_vnni() && wt == WeightType::kQ4_0) {
    for (; r + 8 <= rows; r += 8) dotn_q4_0_vnni<8>(w + r * stride, stride, x, n, out + r);
    for (; r + 4 <= rows; r += 4) dotn_q4_0_vnni<4>(w + r * stride, stride, x, n, out + r);
  } else if (use_vnni() && wt == WeightType::kQ8_0) {
    for (; r + 8 <= rows; r += 8) dotn_q8_0_vnni<8>(w + r * stride, stride, x, n, out + r);
    for (; r + 4 <= rows; r += 4) dotn_q8_0_vnni<4>(w + r * stride, stride, x, n, out + r);
  } else if (use_vnni() && wt == WeightType::kQ4_K) {
    for (; r + 8 <= rows; r += 8) dotn_q4_k_vnni<8>(w + r * stride, stride, x, n, out + r);
    for (; r + 4 <= rows; r += 4) dotn_q4_k_vnni<4>(w + r * stride, stride, x, n, out + r);
  } else if (use_avx2() && wt == WeightType::kQ8_0) {
    for (; r + 4 <= rows; r += 4) dot4_q8_0_avx2(w + r * stride, stride, x, n, out + r);
  } else if (use_avx2() && wt == WeightType::kQ4_0) {
    for (; r + 4 <= rows; r += 4) dot4_q4_0_avx2(w + r * stride, stride, x, n, out + r);
  }
#endif
  for (; r < rows; ++r) out[r] = dot_row(wt, w + r * stride, x, n);
}

float dot_f32(const float* a, const float* b, size_t n) noexcept { return dot_f32_impl(a, b, n); }
float dot_f32_f16(const float* a, const uint16_t* b, size_t n) noexcept { return dot_f32_f16_impl(a, b, n); }

AIRS_HOT void axpy_f32(float a, const float* x, float* y, size_t n) noexcept {
  for (size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

AIRS_HOT void axpy_f16(float a, const uint16_t* x, float* y, size_t n) noexcept {
#if defined(__aarch64__)
  neon::axpy_f16(a, x, y, n);
#else
  for (size_t i = 0; i < n; ++i) y[i] += a * h2f(x[i]);
#endif
}

void rms_norm(const float* x, const float* w, float eps, size_t n, float* out) noexcept {
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const auto mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0F / std::sqrt(mean + eps);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void rope(float* head, uint32_t n_rot, uint32_t pos, float freq_base, RopeStyle style) noexcept {
  const float theta_scale = std::pow(freq_base, -2.0F / static_cast<float>(n_rot));
  float theta = static_cast<float>(pos);
  for (uint32_t i0 = 0; i0 < n_rot; i0 += 2) {
    const float c = std::cos(theta);
    const float s = std::sin(theta);
    const uint32_t a = style == RopeStyle::kNormal ? i0 : i0 / 2;
    const uint32_t b = style == RopeStyle::kNormal ? i0 + 1 : i0 / 2 + n_rot / 2;
    const float x0 = head[a];
    const float x1 = head[b];
    head[a] = x0 * c - x1 * s;
    head[b] = x0 * s + x1 * c;
    theta *= theta_scale;
  }
}

void softmax(float* x, size_t n, float scale) noexcept {
  float mx = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    x[i] *= scale;
    mx = std::max(mx, x[i]);
  }
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += static_cast<double>(x[i]);
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (size_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(float* x, const float* y, size_t n) noexcept {
  for (size_t i = 0; i < n; ++i) x[i] = x[i] / (1.0F + std::exp(-x[i])) * y[i];
}

}  // namespace airs::infer
