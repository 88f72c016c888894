// SPDX-License-Identifier: Apache-2.0
// A sequence on private blocks: prefix matching skips prefill, eviction is
// repaired by recomputing only the lost blocks; the output never changes.
#include <cstring>

#include <gtest/gtest.h>

#include "gguf/writer.hpp"
#include "infer/engine.hpp"
#include "infer/sampler.hpp"
#include "infer/sequence.hpp"

namespace {

using namespace airs;
using namespace airs::infer;

struct Fixture {
  std::vector<std::byte> bytes;
  gguf::File file;
  Model model;
  explicit Fixture(gguf::TypeScheme types = gguf::TypeScheme::kQ8_0) {
    gguf::ModelSpec s;
    s.llama_compatible = true;
    s.types = types;
    s.n_layers = 4;
    s.n_embd = 128;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 256;
    s.n_vocab = 300;
    auto plan = gguf::plan_model(s);
    bytes = std::move(*gguf::render_model(*plan));
    const gguf::MemorySource src(bytes);
    file = std::move(*gguf::parse(src));
    model = std::move(*load_model(file, bytes));
  }
};

std::vector<int32_t> prompt_of(size_t n, int32_t salt) {
  std::vector<int32_t> p = {1};
  for (size_t i = 1; i < n; ++i) p.push_back(static_cast<int32_t>(3 + (i * 37 + static_cast<size_t>(salt)) % 290));
  return p;
}

std::vector<int32_t> generate(Sequence& seq, std::span<const int32_t> prompt, int n) {
  std::vector<int32_t> out;
  auto l = seq.prefill(prompt);
  EXPECT_TRUE(l.ok());
  for (int i = 0; i < n; ++i) {
    out.push_back(argmax(*l));
    l = seq.append(out.back());
    EXPECT_TRUE(l.ok());
  }
  return out;
}

TEST(InferSequence, MatchedPrefixSkipsPrefillAndChangesNothing) {
  Fixture f;
  ThreadPool pool(2);
  const KvLayout layout = kv_layout_for(f.model.config, 8, KvElem::kF16);
  Engine engine(f.model, layout, pool);
  PrivateKv kv(layout.block_bytes());
  const auto prompt = prompt_of(45, 0);
  Sequence a(engine, kv);
  const auto ta = generate(a, prompt, 10);
  EXPECT_EQ(a.matched_tokens(), 0U);
  EXPECT_EQ(kv.length(), 55U);
  Sequence b(engine, kv);
  const auto tb = generate(b, prompt, 10);
  EXPECT_EQ(b.matched_tokens(), 40U);  // 5 full blocks; the 6th holds the last prompt token
  EXPECT_EQ(tb, ta);
  // The matched blocks are the first sequence's.
  EXPECT_TRUE(std::equal(b.block_ids().begin(), b.block_ids().begin() + 5, a.block_ids().begin()));
  // A prompt that diverges inside block 3 matches blocks 0..2 only.
  auto other = prompt;
  other[27] = 5;
  Sequence c(engine, kv);
  auto l = c.prefill(other);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(c.matched_tokens(), 24U);
}

TEST(InferSequence, EvictedBlocksAreRecomputedAloneWithIdenticalOutput) {
  Fixture f;
  ThreadPool pool(1);
  const KvLayout layout = kv_layout_for(f.model.config, 8, KvElem::kF32);
  Engine engine(f.model, layout, pool);
  PrivateKv ref_kv(layout.block_bytes());
  Sequence ref(engine, ref_kv);
  const auto prompt = prompt_of(40, 3);
  const auto want = generate(ref, prompt, 12);

  PrivateKv kv(layout.block_bytes());
  Sequence seq(engine, kv);
  std::vector<int32_t> got;
  auto l = seq.prefill(prompt);
  ASSERT_TRUE(l.ok());
  for (int i = 0; i < 12; ++i) {
    got.push_back(argmax(*l));
    if (i == 4) {
      kv.evict(seq.block_ids()[1]);
      kv.evict(seq.block_ids()[3]);
    }
    l = seq.append(got.back());
    ASSERT_TRUE(l.ok());
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(seq.recomputed_blocks(), 2U);
}

// Batched prefill (forward_batch over up to 32 prompt tokens, each weight
// read once per batch) against Engine::forward one token at a time on the
// same blocks: every K/V byte and every logit is identical, for each weight
// type, both KV element types, and block sizes below and above the batch.
// 50 prompt tokens: several batches for both block sizes, and a second
// block for the 48-token one (the test runs under TSan and qemu-user too,
// where every token costs).
TEST(InferSequence, BatchedPrefillIsBitIdenticalToTokenByToken) {
  for (auto types : {gguf::TypeScheme::kF32, gguf::TypeScheme::kF16, gguf::TypeScheme::kQ8_0,
                     gguf::TypeScheme::kQ4_0}) {
    Fixture f(types);
    ThreadPool pool(2);
    for (KvElem elem : {KvElem::kF32, KvElem::kF16}) {
      for (uint32_t tpb : {8U, 48U}) {
        SCOPED_TRACE(testing::Message() << "types " << int(types) << " elem " << int(elem) << " tpb " << tpb);
        const KvLayout layout = kv_layout_for(f.model.config, tpb, elem);
        Engine engine(f.model, layout, pool);
        const auto prompt = prompt_of(50, 3);
        PrivateKv kv(layout.block_bytes());
        Sequence seq(engine, kv);
        auto batched = seq.prefill(prompt);
        ASSERT_TRUE(batched.ok());
        const std::vector<float> lb(batched->begin(), batched->end());

        std::vector<std::vector<std::byte>> blocks((prompt.size() + tpb - 1) / tpb,
                                                   std::vector<std::byte>(layout.block_bytes()));
        std::vector<std::byte*> ptrs;
        for (auto& b : blocks) ptrs.push_back(b.data());
        std::vector<float> lt(f.model.config.n_vocab);
        for (uint32_t pos = 0; pos < prompt.size(); ++pos) {
          engine.forward(prompt[pos], pos, ptrs, pos + 1 == prompt.size() ? lt.data() : nullptr);
        }
        ASSERT_EQ(lb.size(), lt.size());
        EXPECT_EQ(std::memcmp(lb.data(), lt.data(), lt.size() * sizeof(float)), 0);
        const size_t row = size_t{layout.head_dim} * layout.elem_bytes();
        size_t differing = 0;
        for (uint32_t pos = 0; pos < prompt.size(); ++pos) {
          const std::byte* a = kv.block_ptr(seq.block_ids()[pos / tpb]);
          for (uint32_t l = 0; l < layout.n_layer; ++l) {
            for (uint32_t k = 0; k < 2; ++k) {
              for (uint32_t h = 0; h < layout.n_head_kv; ++h) {
                const size_t off = layout.offset(l, k, h, pos % tpb);
                if (std::memcmp(a + off, ptrs[pos / tpb] + off, row) != 0) ++differing;
              }
            }
          }
        }
        EXPECT_EQ(differing, 0U);
      }
    }
  }
}

TEST(InferSampler, SeededSamplingIsReproducibleAndGreedyAtZero) {
  std::vector<float> logits = {0.1F, 2.0F, 1.9F, -1.0F, 1.95F};
  Sampler g(SamplerParams{0.0F, 40, 1});
  EXPECT_EQ(g.sample(logits), 1);
  Sampler a(SamplerParams{1.0F, 3, 42}), b(SamplerParams{1.0F, 3, 42});
  std::vector<int> seen(5);
  for (int i = 0; i < 200; ++i) {
    const int32_t x = a.sample(logits);
    EXPECT_EQ(x, b.sample(logits));
    ++seen[static_cast<size_t>(x)];
  }
  EXPECT_EQ(seen[0] + seen[3], 0);  // outside the top 3
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_GT(seen[4], 0);
}

}  // namespace
