// SPDX-License-Identifier: Apache-2.0
// The kernels against naive double-precision references.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#if defined(__aarch64__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#elif defined(__x86_64__)
#include <cpuid.h>
#endif

#include <gtest/gtest.h>

#include "infer/kernels.hpp"

namespace {

using namespace airs::infer;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0F) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Every kernel path this CPU has, each selected for the scope of one
// iteration and the default restored after.
std::vector<KernelPath> supported_paths() {
  std::vector<KernelPath> v;
  for (KernelPath p : kAllKernelPaths) {
    if (kernel_path_supported(p)) v.push_back(p);
  }
  return v;
}
class PathScope {
 public:
  explicit PathScope(KernelPath p) : saved_(kernel_path()) { EXPECT_TRUE(set_kernel_path(p)); }
  ~PathScope() { set_kernel_path(saved_); }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  KernelPath saved_;
};

TEST(InferKernels, PortablePathIsAlwaysThereAndTheDefaultIsTheBest) {
  EXPECT_TRUE(kernel_path_supported(KernelPath::kPortable));
  EXPECT_EQ(kernel_path(), supported_paths().back());
  if (!kernel_path_supported(KernelPath::kAvx512Vnni)) {
    EXPECT_FALSE(set_kernel_path(KernelPath::kAvx512Vnni));
    EXPECT_EQ(kernel_path(), supported_paths().back());
  }
}

TEST(InferKernels, Fp16RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(fp32_to_fp16(f), h) << h;
  }
  EXPECT_EQ(fp16_to_fp32(0x3C00), 1.0F);
  EXPECT_EQ(fp16_to_fp32(0xC000), -2.0F);
  EXPECT_EQ(fp32_to_fp16(65520.0F), 0x7C00);       // rounds to +inf
  EXPECT_EQ(fp32_to_fp16(1.0F + 0x1p-11F), 0x3C00);  // tie: to even
  EXPECT_EQ(fp32_to_fp16(1.0F + 3 * 0x1p-11F), 0x3C02);
  EXPECT_EQ(fp32_to_fp16(0x1p-25F), 0);  // tie at the smallest subnormal: to even (0)
}

TEST(InferKernels, DotProductsMatchNaive) {
  for (size_t n : {32UL, 64UL, 256UL, 4096UL}) {
    const auto w = random_floats(n, 1);
    const auto x = random_floats(n, 2);
    double ref = 0;
    for (size_t i = 0; i < n; ++i) ref += double{w[i]} * double{x[i]};
    for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kQ8_0, WeightType::kQ4_0}) {
      // Weight in format t, from the same floats; the reference is the
      // dequantised weight · the dequantised activation, in double.
      std::vector<std::byte> wq(row_bytes(t, n)), xq(row_bytes(activation_type(t), n));
      if (t == WeightType::kQ4_0) {
        // Q4_0 rows: d = max/-8, q = round(w/d) + 8 clamped to 0..15.
        for (size_t b = 0; b < n / 32; ++b) {
          float amax = 0, mx = 0;
          for (size_t j = 0; j < 32; ++j) {
            if (std::fabs(w[b * 32 + j]) > amax) { amax = std::fabs(w[b * 32 + j]); mx = w[b * 32 + j]; }
          }
          const float d = mx / -8;
          const uint16_t dh = fp32_to_fp16(d);
          std::memcpy(wq.data() + b * 18, &dh, 2);
          for (size_t j = 0; j < 16; ++j) {
            auto q = [&](size_t k) {
              return static_cast<uint8_t>(std::clamp(std::lround(w[b * 32 + k] / d) + 8, 0L, 15L));
            };
            wq[b * 18 + 2 + j] = static_cast<std::byte>(q(j) | (q(j + 16) << 4));
          }
        }
      } else {
        quantize_row(t, w.data(), n, wq.data());
      }
      quantize_row(activation_type(t), x.data(), n, xq.data());
      std::vector<float> wd(n), xd(n);
      dequantize_row(t, wq.data(), n, wd.data());
      dequantize_row(activation_type(t), xq.data(), n, xd.data());
      double deq = 0;
      for (size_t i = 0; i < n; ++i) deq += double{wd[i]} * double{xd[i]};
      for (KernelPath path : supported_paths()) {
        PathScope scope(path);
        const float got = dot_row(t, wq.data(), xq.data(), n);
        EXPECT_NEAR(got, deq, 1e-5 * std::sqrt(static_cast<double>(n)))
            << "type " << int(t) << " n " << n << " path " << kernel_path_name(path);
        // And the format's own error against the exact product is bounded.
        const double bound =
            t == WeightType::kF32 ? 1e-4 : t == WeightType::kF16 ? 1e-2 : t == WeightType::kQ8_0 ? 0.1 : 1.0;
        EXPECT_NEAR(got, ref, bound * std::sqrt(static_cast<double>(n) / 32))
            << "type " << int(t) << " n " << n << " path " << kernel_path_name(path);
      }
    }
  }
}

TEST(InferKernels, Q8ActivationQuantisationIsAmaxOver127) {
  std::vector<float> x(32, 0.0F);
  x[3] = -2.54F;
  x[7] = 1.27F;
  std::vector<std::byte> q(34);
  quantize_row(WeightType::kQ8_0, x.data(), 32, q.data());
  uint16_t dh;
  std::memcpy(&dh, q.data(), 2);
  EXPECT_NEAR(fp16_to_fp32(dh), 0.02F, 1e-5F);
  EXPECT_EQ(static_cast<int8_t>(q[2 + 3]), -127);
  EXPECT_EQ(static_cast<int8_t>(q[2 + 7]), 64);  // 63.5 rounds to even
}

TEST(InferKernels, RmsNormMatchesNaive) {
  const auto x = random_floats(300, 3, 5.0F);
  const auto w = random_floats(300, 4);
  std::vector<float> out(300);
  rms_norm(x.data(), w.data(), 1e-5F, 300, out.data());
  double ss = 0;
  for (float v : x) ss += double{v} * v;
  const double scale = 1.0 / std::sqrt(ss / 300 + 1e-5);
  for (size_t i = 0; i < 300; ++i) EXPECT_NEAR(out[i], x[i] * scale * w[i], 1e-5);
}

TEST(InferKernels, RopeRotatesThePairsTheStyleNames) {
  const uint32_t d = 16;
  for (RopeStyle style : {RopeStyle::kNormal, RopeStyle::kNeox}) {
    auto h = random_floats(d, 5);
    const auto orig = h;
    rope(h.data(), d, 7, 10000.0F, style);
    for (uint32_t i = 0; i < d / 2; ++i) {
      const uint32_t a = style == RopeStyle::kNormal ? 2 * i : i;
      const uint32_t b = style == RopeStyle::kNormal ? 2 * i + 1 : i + d / 2;
      const double th = 7.0 * std::pow(10000.0, -2.0 * i / d);
      EXPECT_NEAR(h[a], orig[a] * std::cos(th) - orig[b] * std::sin(th), 1e-4);
      EXPECT_NEAR(h[b], orig[a] * std::sin(th) + orig[b] * std::cos(th), 1e-4);
    }
  }
  auto h = random_floats(d, 6);
  const auto orig = h;
  rope(h.data(), d, 0, 10000.0F, RopeStyle::kNormal);  // position 0: identity
  EXPECT_EQ(h, orig);
}

TEST(InferKernels, SoftmaxAndSwiglu) {
  std::vector<float> x = {1.0F, 2.0F, 3.0F, -1000.0F};
  softmax(x.data(), x.size(), 0.5F);
  const double e0 = std::exp(-1.0), e1 = std::exp(-0.5), s = e0 + e1 + 1.0;
  EXPECT_NEAR(x[0], e0 / s, 1e-6);
  EXPECT_NEAR(x[1], e1 / s, 1e-6);
  EXPECT_NEAR(x[2], 1.0 / s, 1e-6);
  EXPECT_EQ(x[3], 0.0F);
  std::vector<float> g = {-2.0F, 0.0F, 3.0F}, u = {1.0F, 5.0F, 2.0F};
  swiglu(g.data(), u.data(), 3);
  EXPECT_NEAR(g[0], -2.0 / (1 + std::exp(2.0)), 1e-6);
  EXPECT_EQ(g[1], 0.0F);
  EXPECT_NEAR(g[2], 3.0 / (1 + std::exp(-3.0)) * 2, 1e-5);
}

}  // namespace

namespace {

TEST(InferKernels, RowGroupDotsEqualSingleRowDotsOnEveryPath) {
  using namespace airs::infer;
  // 13 rows: one group of 8, one of 4 and a single row; 17 blocks of 32, so
  // the wide kernels' steps (2 or 4 blocks) leave a tail block.
  const size_t n = 544, rows = 13;
  for (WeightType t : {WeightType::kF32, WeightType::kF16, WeightType::kQ8_0, WeightType::kQ4_0}) {
    const size_t stride = row_bytes(t, n);
    std::vector<std::byte> w(rows * stride);
    std::mt19937 g(9);
    for (auto& b : w) b = static_cast<std::byte>(g());
    // Sane block scales / floats: pin each format's scale bytes.
    std::vector<float> src = random_floats(rows * n, 10);
    if (t == WeightType::kF32 || t == WeightType::kF16) {
      for (size_t r = 0; r < rows; ++r) quantize_row(t, src.data() + r * n, n, w.data() + r * stride);
    } else {
      const size_t bb = t == WeightType::kQ8_0 ? kQ8Bytes : kQ4Bytes;
      for (size_t b = 0; b < w.size() / bb; ++b) {
        const uint16_t d = fp32_to_fp16(0.01F * static_cast<float>(1 + b % 7));
        std::memcpy(w.data() + b * bb, &d, 2);
      }
    }
    const auto x = random_floats(n, 11);
    std::vector<std::byte> xq(row_bytes(activation_type(t), n));
    quantize_row(activation_type(t), x.data(), n, xq.data());
    // The reference: dequantised row . dequantised activation in double.
    std::vector<float> wd(n), xd(n);
    dequantize_row(activation_type(t), xq.data(), n, xd.data());
    std::vector<double> ref(rows);
    for (size_t r = 0; r < rows; ++r) {
      dequantize_row(t, w.data() + r * stride, n, wd.data());
      for (size_t i = 0; i < n; ++i) ref[r] += double{wd[i]} * double{xd[i]};
    }
    for (KernelPath path : supported_paths()) {
      PathScope scope(path);
      std::vector<float> group(rows, -1.0F);
      dot_rows(t, w.data(), stride, xq.data(), n, rows, group.data());
      for (size_t r = 0; r < rows; ++r) {
        const float one = dot_row(t, w.data() + r * stride, xq.data(), n);
        EXPECT_NEAR(group[r], one, 1e-5 * (1 + std::fabs(one))) << "type " << int(t) << " row " << r << " path " << kernel_path_name(path);
        EXPECT_NEAR(group[r], ref[r], 1e-4 * (1 + std::fabs(ref[r]))) << "type " << int(t) << " row " << r << " path " << kernel_path_name(path);
      }
    }
  }
}

}  // namespace

namespace {

// A Q4_K block from explicit parts: 6-bit scales/mins packed the way the
// format says (kernels.hpp), values q[i] for the 256 positions.
std::vector<std::byte> q4k_block(float d, float dmin, const int (&sc)[8], const int (&mn)[8], const int (&q)[256]) {
  std::vector<std::byte> b(airs::infer::kQ4KBytes);
  auto put16 = [&](size_t at, float v) {
    const uint16_t h = airs::infer::fp32_to_fp16(v);
    std::memcpy(b.data() + at, &h, 2);
  };
  put16(0, d);
  put16(2, dmin);
  uint8_t s[12] = {};
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  std::memcpy(b.data() + 4, s, 12);
  for (size_t c = 0; c < 4; ++c) {
    for (size_t l = 0; l < 32; ++l) {
      b[16 + 32 * c + l] = static_cast<std::byte>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
  }
  return b;
}

TEST(InferKernels, Q4KDequantisesAndDotsAsTheFormatSays) {
  using namespace airs::infer;
  std::mt19937 g(5);
  int sc[8], mn[8], q[256];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<int>(g() % 64);
    mn[j] = static_cast<int>(g() % 64);
  }
  sc[5] = 63;  // both high bits set: the packing's spill bits matter
  mn[6] = 48;
  for (int& v : q) v = static_cast<int>(g() % 16);
  const float d = 0.0078125F, dmin = 0.00390625F;  // exact in f16
  const auto blk = q4k_block(d, dmin, sc, mn, q);
  std::vector<float> deq(256);
  dequantize_row(WeightType::kQ4_K, blk.data(), 256, deq.data());
  for (size_t i = 0; i < 256; ++i) {
    ASSERT_FLOAT_EQ(deq[i], d * static_cast<float>(sc[i / 32]) * static_cast<float>(q[i]) -
                                dmin * static_cast<float>(mn[i / 32]))
        << i;
  }
  // Two super blocks: dot against a Q8_K activation equals the dequantised
  // weight . dequantised activation (double), and four rows agree with one.
  std::vector<std::byte> row = blk;
  const auto blk2 = q4k_block(0.5F * d, 2 * dmin, mn, sc, q);
  row.insert(row.end(), blk2.begin(), blk2.end());
  const size_t n = 512;
  EXPECT_EQ(row_bytes(WeightType::kQ4_K, n), row.size());
  EXPECT_EQ(activation_type(WeightType::kQ4_K), WeightType::kQ8_K);
  const auto x = random_floats(n, 12);
  std::vector<std::byte> xq(row_bytes(WeightType::kQ8_K, n));
  quantize_row(WeightType::kQ8_K, x.data(), n, xq.data());
  std::vector<float> wd(n), xd(n);
  dequantize_row(WeightType::kQ4_K, row.data(), n, wd.data());
  dequantize_row(WeightType::kQ8_K, xq.data(), n, xd.data());
  // Q8_K: the value of largest magnitude maps to -127 (ggml's sign
  // convention), every value within half a step.
  for (size_t b = 0; b < 2; ++b) {
    float amax = 0;
    size_t at = 0;
    for (size_t j = 0; j < 256; ++j) {
      if (std::fabs(x[b * 256 + j]) > amax) { amax = std::fabs(x[b * 256 + j]); at = j; }
    }
    EXPECT_EQ(static_cast<int8_t>(xq[b * kQ8KBytes + 4 + at]), -127);
    for (size_t j = 0; j < 256; ++j) EXPECT_NEAR(xd[b * 256 + j], x[b * 256 + j], amax / 127 / 2 * 1.0001);
  }
  double ref = 0, mag = 0;
  for (size_t i = 0; i < n; ++i) {
    ref += double{wd[i]} * double{xd[i]};
    mag += std::fabs(double{wd[i]} * double{xd[i]});
  }
  // The activation's sub-block sums (the mins term) are the sums of its q.
  for (size_t b = 0; b < 2; ++b) {
    for (size_t sb = 0; sb < 8; ++sb) {
      int sum = 0;
      for (size_t j = 0; j < 32; ++j) sum += static_cast<int8_t>(xq[b * kQ8KBytes + 4 + 32 * sb + j]);
      int16_t stored;
      std::memcpy(&stored, xq.data() + b * kQ8KBytes + 4 + 256 + 2 * sb, 2);
      EXPECT_EQ(stored, sum) << b << " " << sb;
    }
  }
  // Every path: the integer sums inside a super block are exact and the
  // scaling one shared expression, so all paths give the same float; 13
  // rows (groups of 8, 4 and one), each a different mix of the two blocks.
  const size_t rows = 13;
  std::vector<std::byte> many;
  for (size_t r = 0; r < rows; ++r) {
    many.insert(many.end(), r % 3 == 2 ? blk2.begin() : blk.begin(), r % 3 == 2 ? blk2.end() : blk.end());
    many.insert(many.end(), r % 2 == 1 ? blk.begin() : blk2.begin(), r % 2 == 1 ? blk.end() : blk2.end());
  }
  std::vector<double> refs(rows);
  for (size_t r = 0; r < rows; ++r) {
    dequantize_row(WeightType::kQ4_K, many.data() + r * row.size(), n, wd.data());
    for (size_t i = 0; i < n; ++i) refs[r] += double{wd[i]} * double{xd[i]};
  }
  std::vector<float> first;
  for (KernelPath path : supported_paths()) {
    PathScope scope(path);
    const float got = dot_row(WeightType::kQ4_K, row.data(), xq.data(), n);
    EXPECT_NEAR(got, ref, 1e-6 * mag) << "path " << kernel_path_name(path);
    std::vector<float> out(rows, -1.0F);
    dot_rows(WeightType::kQ4_K, many.data(), row.size(), xq.data(), n, rows, out.data());
    for (size_t r = 0; r < rows; ++r) {
      EXPECT_NEAR(out[r], refs[r], 1e-6 * mag) << "path " << kernel_path_name(path) << " row " << r;
      EXPECT_EQ(out[r], dot_row(WeightType::kQ4_K, many.data() + r * row.size(), xq.data(), n)) << r;
    }
    if (first.empty()) first = out;
    for (size_t r = 0; r < rows; ++r) EXPECT_EQ(out[r], first[r]) << "path " << kernel_path_name(path) << " row " << r;
  }
}

}  // namespace


namespace {

using namespace airs::infer;

#if defined(__x86_64__)
// F16C from cpuid (leaf 1, ECX): Clang 14's __builtin_cpu_supports does not
// know the name.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

// The family this CPU should run, decided here independently of the
// library: on AArch64 from the kernel's hwcaps, on x86 from cpuid.
KernelPath expected_family() {
#if defined(__aarch64__)
  const unsigned long hw = getauxval(AT_HWCAP);
  if ((hw & HWCAP_ASIMD) == 0) return KernelPath::kPortable;
  return (hw & HWCAP_ASIMDDP) != 0 ? KernelPath::kNeonDotprod : KernelPath::kNeon;
#elif defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  const bool vnni = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                    __builtin_cpu_supports("avx512vbmi");
  return vnni ? KernelPath::kAvx512Vnni : avx2 ? KernelPath::kAvx2 : KernelPath::kPortable;
#else
  return KernelPath::kPortable;
#endif
}

// The line the arm64 stage's qemu runs look for (one per -cpu model): the
// family the kernels run, so a fallback to the scalar path cannot pass for
// NEON.
TEST(InferKernels, DefaultFamilyIsTheBestTheCpuHas) {
  const KernelPath want = expected_family();
  std::printf("kernel family: %s\n", kernel_path_name(kernel_path()));
  EXPECT_STREQ(kernel_path_name(kernel_path()), kernel_path_name(want));
  for (KernelPath p : kAllKernelPaths) {
    const bool on_this_arch =
#if defined(__aarch64__)
        p == KernelPath::kPortable || p == KernelPath::kNeon || p == KernelPath::kNeonDotprod;
#elif defined(__x86_64__)
        p == KernelPath::kPortable || p == KernelPath::kAvx2 || p == KernelPath::kAvx512Vnni;
#else
        p == KernelPath::kPortable;
#endif
    // Every family up to the expected one is there; none of the other
    // architecture's is, and selecting one fails without a change.
    if (!on_this_arch) {
      EXPECT_FALSE(kernel_path_supported(p)) << kernel_path_name(p);
      EXPECT_FALSE(set_kernel_path(p)) << kernel_path_name(p);
      EXPECT_EQ(kernel_path(), want);
    }
  }
  EXPECT_TRUE(kernel_path_supported(want));
}

// `rows` rows of n values of type t with sane block scales (the quantised
// bytes are random, the f16 scales pinned to small values).
std::vector<std::byte> random_rows(WeightType t, size_t rows, size_t n, uint32_t seed) {
  const size_t stride = row_bytes(t, n);
  std::vector<std::byte> w(rows * stride);
  std::mt19937 g(seed);
  for (auto& b : w) b = static_cast<std::byte>(g());
  if (t == WeightType::kF32 || t == WeightType::kF16) {
    const auto src = random_floats(rows * n, seed + 1);
    for (size_t r = 0; r < rows; ++r) quantize_row(t, src.data() + r * n, n, w.data() + r * stride);
    return w;
  }
  const size_t bb = t == WeightType::kQ8_0 ? kQ8Bytes : t == WeightType::kQ4_0 ? kQ4Bytes : kQ4KBytes;
  for (size_t b = 0; b < w.size() / bb; ++b) {
    const uint16_t d = fp32_to_fp16(0.01F * static_cast<float>(1 + b % 7));
    std::memcpy(w.data() + b * bb, &d, 2);
    if (t == WeightType::kQ4_K) {
      const uint16_t dmin = fp32_to_fp16(0.002F * static_cast<float>(1 + b % 5));
      std::memcpy(w.data() + b * bb + 2, &dmin, 2);
    }
  }
  return w;
}

constexpr WeightType kWeightTypes[] = {WeightType::kF32, WeightType::kF16, WeightType::kQ8_0, WeightType::kQ4_0,
                                       WeightType::kQ4_K};

// The row-range mat-vec a mixture-of-experts layer needs: experts are
// contiguous row blocks of a 3-D tensor, so expert e is dot_rows from its
// first row. On every path, for every weight type: an expert's full slice
// and a range inside it that starts and ends off the row groups give each
// row's dot_row value, and the rows around the range are not written.
TEST(InferKernels, RowRangeMatVecOverExpertSlicesOnEveryPath) {
  constexpr size_t kExperts = 3, kRows = 21, n = 512;  // 21 rows: a group of 8, of 4, and singles
  for (WeightType t : kWeightTypes) {
    const size_t stride = row_bytes(t, n);
    const auto w = random_rows(t, kExperts * kRows, n, 21);
    const auto x = random_floats(n, 22);
    std::vector<std::byte> xq(row_bytes(activation_type(t), n));
    quantize_row(activation_type(t), x.data(), n, xq.data());
    for (KernelPath path : supported_paths()) {
      PathScope scope(path);
      for (size_t e = 0; e < kExperts; ++e) {
        const std::byte* first = w.data() + e * kRows * stride;
        for (auto [b, end] : {std::pair<size_t, size_t>{0, kRows}, {5, 18}, {3, 4}}) {
          std::vector<float> out(kRows + 2, -7.0F);
          dot_rows(t, first + b * stride, stride, xq.data(), n, end - b, out.data() + 1);
          EXPECT_EQ(out.front(), -7.0F);
          EXPECT_EQ(out[end - b + 1], -7.0F);
          for (size_t r = b; r < end; ++r) {
            const float one = dot_row(t, first + r * stride, xq.data(), n);
            EXPECT_NEAR(out[r - b + 1], one, 1e-5 * (1 + std::fabs(one)))
                << kernel_path_name(path) << " type " << int(t) << " expert " << e << " row " << r;
          }
        }
      }
    }
  }
}

// The NEON kernels compute the portable loop's steps in its order: the
// same floats, bit for bit, for every weight type, on row groups of 8, 4
// and single rows, with block counts that are not a multiple of anything
// the kernels step by.
// An AArch64 test: built for arm64 only (the arm64 stage runs it under
// qemu), so an x86 run does not count it as skipped.
#if defined(__aarch64__)
TEST(InferKernels, NeonIsThePortablePathBitForBit) {
  std::vector<KernelPath> neon;
  for (KernelPath p : {KernelPath::kNeon, KernelPath::kNeonDotprod}) {
    if (kernel_path_supported(p)) neon.push_back(p);
  }
  if (neon.empty()) GTEST_SKIP() << "this AArch64 CPU has no Advanced SIMD (NEON)";
  for (WeightType t : kWeightTypes) {
    for (size_t n : {256UL, 544UL, 1280UL}) {
      if (t == WeightType::kQ4_K && n % kQKBlock != 0) continue;
      constexpr size_t rows = 13;
      const size_t stride = row_bytes(t, n);
      const auto w = random_rows(t, rows, n, 31 + static_cast<uint32_t>(n));
      const auto x = random_floats(n, 32, 3.0F);
      std::vector<std::byte> xq(row_bytes(activation_type(t), n));
      quantize_row(activation_type(t), x.data(), n, xq.data());
      std::vector<float> want(rows);
      {
        PathScope scope(KernelPath::kPortable);
        dot_rows(t, w.data(), stride, xq.data(), n, rows, want.data());
      }
      for (KernelPath path : neon) {
        PathScope scope(path);
        std::vector<float> got(rows, -1.0F);
        dot_rows(t, w.data(), stride, xq.data(), n, rows, got.data());
        for (size_t r = 0; r < rows; ++r) {
          EXPECT_EQ(got[r], want[r]) << kernel_path_name(path) << " type " << int(t) << " n " << n << " row " << r;
          EXPECT_EQ(dot_row(t, w.data() + r * stride, xq.data(), n), want[r])
              << kernel_path_name(path) << " type " << int(t) << " n " << n << " row " << r;
        }
      }
    }
  }
}
#endif  // __aarch64__

}  // namespace

namespace {

using namespace airs::infer;

// The element-wise helpers on AArch64 (NEON whatever the path) against
// their definitions: y + a * x fused per element, and Q8_0 activation
// blocks as amax / 127 scales with round-to-nearest-even quants. Lengths
// with tails past the vector steps.
TEST(InferKernels, AxpyF16AndQ8ActivationsMatchTheirDefinitions) {
  for (size_t n : {8UL, 37UL, 128UL}) {
    const auto xf = random_floats(n, 41, 4.0F);
    std::vector<uint16_t> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = fp32_to_fp16(xf[i]);
    auto y = random_floats(n, 42);
    const auto y0 = y;
    axpy_f16(0.37F, x.data(), y.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const float want = std::fma(0.37F, fp16_to_fp32(x[i]), y0[i]);
#if defined(__aarch64__)
      EXPECT_EQ(y[i], want) << i;
#else
      EXPECT_NEAR(y[i], want, 1e-6 * (1 + std::fabs(want))) << i;
#endif
    }
  }
  const size_t n = 96;
  auto x = random_floats(n, 43, 2.0F);
  for (size_t j = 64; j < 96; ++j) x[j] = 0.0F;  // an all-zero block: d = 0, q = 0
  std::vector<std::byte> q(row_bytes(WeightType::kQ8_0, n));
  quantize_row(WeightType::kQ8_0, x.data(), n, q.data());
  for (size_t b = 0; b < n / 32; ++b) {
    float amax = 0.0F;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
    uint16_t dh;
    std::memcpy(&dh, q.data() + b * kQ8Bytes, 2);
    EXPECT_EQ(dh, fp32_to_fp16(amax / 127.0F)) << b;
    const float id = amax != 0.0F ? 127.0F / amax : 0.0F;
    for (size_t j = 0; j < 32; ++j) {
      EXPECT_EQ(static_cast<int8_t>(q[b * kQ8Bytes + 2 + j]), static_cast<int8_t>(std::nearbyint(x[32 * b + j] * id)))
          << b << " " << j;
    }
  }
}

}  // namespace
