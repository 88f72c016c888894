// SPDX-License-Identifier: Apache-2.0
// A seeded generator of random valid models: every one must parse and match
// its spec exactly (shape, types, offsets, geometry, bytes).
#include <gtest/gtest.h>

#include <random>

#include "gguf/writer.hpp"
#include "unit/gguf/test_util.hpp"

namespace airs::gguf {
namespace {

ModelSpec random_spec(std::mt19937_64& rng) {
  auto pick = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  ModelSpec s;
  s.seed = rng();
  s.version = static_cast<uint32_t>(pick(2, 3));
  s.n_layers = pick(1, 5);
  s.n_head_kv = pick(1, 3);
  s.n_head = s.n_head_kv * pick(1, 3);
  const uint64_t head_dim = 32 * pick(1, 4) + (pick(0, 3) == 0 ? 8 : 0);  // sometimes not a q8_0 multiple
  s.n_embd = s.n_head * head_dim;
  if (pick(0, 2) == 0) {
    s.key_length = 32 * pick(1, 3);
    s.value_length = 32 * pick(1, 3);
  }
  s.n_ff = 32 * pick(1, 20);
  s.n_vocab = pick(1, 600);
  s.n_vocab_tokens_written = pick(0, 70);
  s.context_length = pick(1, 1 << 20);
  s.types = static_cast<TypeScheme>(pick(0, 5));
  s.alignment = uint32_t{1} << pick(0, 14);
  if (pick(0, 1) == 0) {
    const uint64_t salt = rng();
    s.type_override = [salt](std::string_view name, uint32_t t) {
      const uint32_t choice = static_cast<uint32_t>((std::hash<std::string_view>{}(name) ^ salt) % 5);
      const uint32_t cand = std::array<uint32_t, 5>{0, 1, 2, 8, 12}[choice];
      return cand == 0 || cand == 1 ? cand : t;  // F32/F16 always fit
    };
  }
  return s;
}

TEST(GgufRandom, GeneratedModelsParseAndMatchSpec) {
  std::mt19937_64 rng(20240611);
  for (int iter = 0; iter < 300; ++iter) {
    const ModelSpec spec = random_spec(rng);
    auto plan = plan_model(spec);
    ASSERT_TRUE(plan.ok()) << "iter " << iter << ": " << plan.error().message;
    auto bytes = render_model(*plan);
    ASSERT_TRUE(bytes.ok());
    auto f = testing::parse_bytes(*bytes);
    ASSERT_TRUE(f.ok()) << "iter " << iter << ": " << f.error().message;
    EXPECT_EQ(f->version, spec.version);
    EXPECT_EQ(f->alignment, spec.alignment);
    EXPECT_EQ(f->data_offset, plan->data_offset);
    EXPECT_EQ(f->file_size, plan->file_size);
    EXPECT_EQ(f->n_layers, spec.n_layers);
    ASSERT_EQ(f->tensors.size(), plan->tensors.size());
    for (size_t i = 0; i < f->tensors.size(); ++i) {
      const auto& t = f->tensors[i];
      const auto& p = plan->tensors[i];
      ASSERT_EQ(t.name, p.name);
      ASSERT_EQ(t.type_id, p.type_id) << t.name;
      ASSERT_EQ(t.dims, p.dims) << t.name;
      ASSERT_EQ(t.offset, p.offset) << t.name;
      ASSERT_EQ(t.nbytes, p.nbytes) << t.name;
      ASSERT_LE(t.offset + t.nbytes, f->file_size);
      std::vector<std::byte> expect(static_cast<size_t>(std::min<uint64_t>(t.nbytes, 64)));
      fill_tensor_bytes(spec.seed, static_cast<uint32_t>(i), 0, expect);
      ASSERT_TRUE(std::equal(expect.begin(), expect.end(), bytes->begin() + static_cast<std::ptrdiff_t>(t.offset)));
    }
    ASSERT_TRUE(f->geometry.has_value());
    EXPECT_EQ(f->geometry->head_count_kv, spec.n_head_kv);
    EXPECT_EQ(f->geometry->key_length, spec.key_length.value_or(spec.n_embd / spec.n_head));
    EXPECT_EQ(f->geometry->value_length, spec.value_length.value_or(spec.n_embd / spec.n_head));
    EXPECT_EQ(f->geometry->context_length, spec.context_length);
    EXPECT_EQ(kv_bytes_per_token(*f->geometry, KvType::kF16),
              spec.n_layers * spec.n_head_kv * (f->geometry->key_length + f->geometry->value_length) * 2);
  }
}

TEST(GgufRandom, MutatedModelsNeverCrashAndAlwaysNameAnOffset) {
  std::mt19937_64 rng(7);
  ModelSpec s;
  s.n_layers = 2;
  s.n_embd = 256;
  s.n_ff = 256;
  s.n_vocab = 64;
  auto plan = plan_model(s);
  ASSERT_TRUE(plan.ok());
  const auto good = *render_model(*plan);
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      b[rng() % plan->data_offset] = static_cast<std::byte>(rng());
    }
    auto f = testing::parse_bytes(b);
    if (!f.ok()) {
      ++rejected;
      EXPECT_TRUE(f.error().code == EBADMSG || f.error().code == ENOTSUP) << f.error().message;
      EXPECT_EQ(f.error().message.rfind("gguf: ", 0), 0U) << f.error().message;
      EXPECT_NE(f.error().message.find(" at byte "), std::string::npos) << f.error().message;
    } else {
      for (const auto& t : f->tensors) ASSERT_LE(t.offset + t.nbytes, f->file_size);
    }
  }
  EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace airs::gguf
