// SPDX-License-Identifier: Apache-2.0
// Mixture-of-experts models in the engine: a prefill batch gives the same
// bits as the same tokens one at a time (a batch reads each chosen expert
// once for all its tokens), and malformed MoE files are refused with an
// error naming what is wrong. Agreement with llama.cpp is in
// tests/llama/moe_agreement_test.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "gguf/writer.hpp"
#include "infer/engine.hpp"
#include "infer/sampler.hpp"
#include "infer/sequence.hpp"

namespace {

using namespace airs;
using namespace airs::infer;

gguf::ModelSpec moe_spec(const std::string& arch, gguf::TypeScheme types) {
  gguf::ModelSpec s;
  s.architecture = arch;
  s.llama_compatible = true;
  s.types = types;
  s.n_layers = 3;
  s.n_embd = 64;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 64;
  s.n_vocab = 300;
  s.n_expert = 4;
  s.n_expert_used = 2;
  return s;
}

std::vector<std::byte> render(const gguf::ModelSpec& s) {
  auto plan = gguf::plan_model(s);
  EXPECT_TRUE(plan.ok()) << plan.error().message;
  return std::move(*gguf::render_model(*plan));
}

// The engine's verdict on `bytes` (parsed first: that must succeed).
Result<Model> load(const std::vector<std::byte>& bytes, gguf::File& file) {
  const gguf::MemorySource src(bytes);
  auto f = gguf::parse(src);
  EXPECT_TRUE(f.ok()) << f.error().message;
  file = std::move(*f);
  return load_model(file, bytes);
}

// Offset of the serialised string `s` (u64 length, bytes) in `bytes`.
size_t find_str(const std::vector<std::byte>& bytes, const std::string& s) {
  std::string needle(8, '\0');
  const uint64_t n = s.size();
  std::memcpy(needle.data(), &n, 8);
  needle += s;
  const std::string_view hay(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const size_t at = hay.find(needle);
  EXPECT_NE(at, std::string_view::npos) << s;
  return at;
}

std::vector<float> logits_of(const Model& m, std::span<const int32_t> prompt, bool batched) {
  ThreadPool pool(2);
  const KvLayout layout = kv_layout_for(m.config, 8, KvElem::kF32);
  Engine engine(m, layout, pool);
  PrivateKv kv(layout.block_bytes());
  Sequence seq(engine, kv);
  auto l = seq.prefill(batched ? prompt : prompt.first(1));
  EXPECT_TRUE(l.ok());
  for (size_t i = 1; !batched && i < prompt.size(); ++i) {
    l = seq.append(prompt[i]);
    EXPECT_TRUE(l.ok());
  }
  return {l->begin(), l->end()};
}

TEST(InferMoe, BatchEqualsTokenByToken) {
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 40; ++i) prompt.push_back(3 + (i * 37) % 290);
  for (const char* arch : {"llama", "qwen3moe"}) {
    for (auto types : {gguf::TypeScheme::kF32, gguf::TypeScheme::kQ8_0}) {
      const auto bytes = render(moe_spec(arch, types));
      gguf::File file;
      auto m = load(bytes, file);
      ASSERT_TRUE(m.ok()) << m.error().message;
      ASSERT_EQ(m->config.n_expert, 4U);
      const auto batched = logits_of(*m, prompt, true);
      const auto single = logits_of(*m, prompt, false);
      ASSERT_EQ(batched.size(), 300U);
      EXPECT_EQ(batched, single) << arch;
    }
  }
}

// The observer's contract: the experts it names for a layer are all the
// pass reads there. Before each layer's FFN, every expert it does not name
// is overwritten with NaN (the others restored): a read of one would make
// the logits NaN or change them. Prefill batches and decode steps alike.
TEST(InferMoe, ObserverNamesEveryExpertThePassReads) {
  auto bytes = render(moe_spec("qwen3moe", gguf::TypeScheme::kF32));
  const std::vector<std::byte> pristine = bytes;
  gguf::File file;
  auto m = load(bytes, file);
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 30; ++i) prompt.push_back(3 + (i * 53) % 290);
  const auto clean = logits_of(*m, prompt, true);

  ThreadPool pool(2);
  const KvLayout layout = kv_layout_for(m->config, 8, KvElem::kF32);
  Engine engine(*m, layout, pool);
  size_t calls = 0, poisoned = 0;
  engine.set_expert_observer([&](uint32_t l, std::span<const uint32_t> used) {
    ++calls;
    const Layer& L = m->layers[l];
    for (const Matrix* x : {&L.w_gate, &L.w_up, &L.w_down}) {
      for (uint32_t e = 0; e < m->config.n_expert; ++e) {
        const Matrix s = expert_slice(*x, e);
        const auto at = static_cast<size_t>(s.data - bytes.data());
        const size_t n = s.rows * s.row_stride;
        if (std::find(used.begin(), used.end(), e) != used.end()) {
          std::memcpy(bytes.data() + at, pristine.data() + at, n);
        } else {
          std::memset(bytes.data() + at, 0xFF, n);
          ++poisoned;
        }
      }
    }
  });
  PrivateKv kv(layout.block_bytes());
  Sequence seq(engine, kv);
  auto l = seq.prefill(prompt);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(std::vector<float>(l->begin(), l->end()), clean);
  // Decode steps: one token, k of the n experts, so some are poisoned.
  const size_t before = poisoned;
  for (int i = 0; i < 4; ++i) {
    l = seq.append(argmax(*l));
    ASSERT_TRUE(l.ok());
    for (float v : *l) ASSERT_FALSE(std::isnan(v));
  }
  EXPECT_GT(calls, 4U * m->config.n_layer);
  EXPECT_EQ(poisoned - before, 4U * m->config.n_layer * 3 * (m->config.n_expert - m->config.n_expert_used));
}

// The predictor's guess for layer l is layer l's router on the residual
// stream as layer l - 1 routes. Where what comes between adds nothing
// (layer l - 1's experts and layer l's attention output zeroed), the guess
// is exactly what layer l then chooses; on the model as it is, the guess
// changes no logit. Called once per pass for each layer but the first,
// between layer l - 1's observer call and layer l's.
TEST(InferMoe, PredictorGuessesTheNextLayersRouterAndChangesNothing) {
  auto bytes = render(moe_spec("qwen3moe", gguf::TypeScheme::kF32));
  gguf::File file;
  auto m = load(bytes, file);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const uint32_t layers = m->config.n_layer;
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 12; ++i) prompt.push_back(3 + (i * 41) % 290);
  const auto run = [&](bool predict, Engine::PredictionStats* stats, std::string* order) {
    ThreadPool pool(2);
    const KvLayout layout = kv_layout_for(m->config, 8, KvElem::kF32);
    Engine engine(*m, layout, pool);
    engine.set_expert_observer([&](uint32_t l, std::span<const uint32_t>) { *order += "o" + std::to_string(l); });
    if (predict) {
      engine.set_expert_predictor([&](uint32_t l, std::span<const uint32_t> guess) {
        *order += "p" + std::to_string(l);
        EXPECT_FALSE(guess.empty());
        EXPECT_TRUE(std::is_sorted(guess.begin(), guess.end()));
        EXPECT_EQ(std::adjacent_find(guess.begin(), guess.end()), guess.end());
        for (uint32_t e : guess) EXPECT_LT(e, m->config.n_expert);
      });
    }
    PrivateKv kv(layout.block_bytes());
    Sequence seq(engine, kv);
    auto l = seq.prefill(prompt);
    EXPECT_TRUE(l.ok());
    std::vector<float> out(l->begin(), l->end());
    for (int i = 0; i < 3; ++i) {
      order->clear();
      l = seq.append(argmax(*l));
      EXPECT_TRUE(l.ok());
      out.insert(out.end(), l->begin(), l->end());
    }
    *stats = engine.prediction_stats();
    return out;
  };
  Engine::PredictionStats s;
  std::string order;
  const auto plain = run(false, &s, &order);
  EXPECT_EQ(s.predictions, 0U);
  EXPECT_EQ(run(true, &s, &order), plain) << "a guess changed the logits";
  std::string want;
  for (uint32_t l = 0; l < layers; ++l) {
    want += "o" + std::to_string(l);
    if (l + 1 < layers) want += "p" + std::to_string(l + 1);
  }
  EXPECT_EQ(order, want) << "the order of the calls in the last decode step";
  EXPECT_EQ(s.predictions, 4U * (layers - 1)) << "a prefill and three decode steps";
  EXPECT_GT(s.used, 0U);
  // This model's layers do change the residual: some guesses miss (so the
  // check below can fail).
  EXPECT_LT(s.hits, s.used);
  // Nothing between layer l - 1's routing and layer l's: the guess is right.
  const auto zero = [&](const Matrix& x, size_t slices) {
    std::memset(bytes.data() + (x.data - bytes.data()), 0, x.rows * x.row_stride * slices);
  };
  for (uint32_t l = 1; l < layers; ++l) {
    zero(m->layers[l - 1].w_down, m->config.n_expert);
    zero(m->layers[l].wo, 1);
  }
  run(true, &s, &order);
  EXPECT_GT(s.used, 0U);
  EXPECT_EQ(s.hits, s.used) << "the guess differs from the routing it had every input of";
}

TEST(InferMoe, WeightBytesCountTheUsedExperts) {
  const auto bytes = render(moe_spec("llama", gguf::TypeScheme::kF32));
  gguf::File file;
  auto m = load(bytes, file);
  ASSERT_TRUE(m.ok());
  // f32: one expert's three matrices are 3 * 64 * 64 * 4 bytes; 2 of the 4
  // experts are not read by a token, in each of the 3 layers.
  uint64_t all = 0;
  for (const auto& t : file.tensors) all += t.nbytes;
  const uint64_t embd = 300ULL * 64 * 4;
  EXPECT_EQ(m->weight_bytes, all - embd + 64 * 4 - 3 * 2 * (3 * 64 * 64 * 4));
}

TEST(InferMoe, UsedCountAboveExpertCountIsRefused) {
  auto bytes = render(moe_spec("llama", gguf::TypeScheme::kF32));
  const size_t at = find_str(bytes, "llama.expert_used_count") + 8 + 23 + 4;  // length, key, type tag
  const uint32_t nine = 9;
  std::memcpy(bytes.data() + at, &nine, 4);
  gguf::File file;
  auto m = load(bytes, file);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, EINVAL);
  EXPECT_NE(m.error().message.find("expert_used_count 9 is greater than llama.expert_count 4"), std::string::npos)
      << m.error().message;
}

TEST(InferMoe, UsedCountZeroIsRefused) {
  auto bytes = render(moe_spec("qwen3moe", gguf::TypeScheme::kF32));
  const size_t at = find_str(bytes, "qwen3moe.expert_used_count") + 8 + 26 + 4;
  std::memset(bytes.data() + at, 0, 4);
  gguf::File file;
  auto m = load(bytes, file);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("expert_used_count is missing or 0"), std::string::npos) << m.error().message;
}

TEST(InferMoe, ExpertsOfAnotherArchitectureAreRefused) {
  // A llama MoE file relabelled qwen2 (the same length, so every offset
  // stays): llama.cpp runs qwen2 dense, so the engine must not guess.
  auto bytes = render(moe_spec("llama", gguf::TypeScheme::kF32));
  const size_t arch_value = find_str(bytes, "general.architecture") + 8 + 20 + 4;  // length, key, type tag
  std::memcpy(bytes.data() + arch_value + 8, "qwen2", 5);
  const size_t header_end = find_str(bytes, "token_embd.weight");
  std::string_view hay(reinterpret_cast<const char*>(bytes.data()), header_end);
  size_t keys = 0;
  for (size_t at = hay.find("llama."); at != std::string_view::npos; at = hay.find("llama.", at + 1), ++keys) {
    std::memcpy(bytes.data() + at, "qwen2.", 6);
  }
  ASSERT_GT(keys, 8U);
  gguf::File file;
  auto m = load(bytes, file);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, ENOTSUP);
  EXPECT_NE(m.error().message.find("qwen2.expert_count is 4, but the engine runs experts only for llama"),
            std::string::npos)
      << m.error().message;
}

TEST(InferMoe, WrongExpertTensorShapeIsRefused) {
  auto bytes = render(moe_spec("llama", gguf::TypeScheme::kF32));
  // [64, 64, 4] -> [64, 128, 2]: the same bytes, so the file still parses.
  const size_t dims = find_str(bytes, "blk.1.ffn_up_exps.weight") + 8 + 24 + 4;
  const uint64_t rows = 128, n = 2;
  std::memcpy(bytes.data() + dims + 8, &rows, 8);
  std::memcpy(bytes.data() + dims + 16, &n, 8);
  gguf::File file;
  auto m = load(bytes, file);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("'blk.1.ffn_up_exps.weight' has shape 64x128x2 (expected [64, 64, 4]"),
            std::string::npos)
      << m.error().message;
}

TEST(InferMoe, MissingRouterAndQkNormAreRefused) {
  for (const auto& [arch, name] : {std::pair{"llama", "blk.2.ffn_gate_inp.weight"},
                                   std::pair{"qwen3moe", "blk.0.attn_k_norm.weight"}}) {
    auto bytes = render(moe_spec(arch, gguf::TypeScheme::kF32));
    const size_t at = find_str(bytes, name) + 8;
    bytes[at] = std::byte{'X'};  // "Xlk...": the tensor is still there, under another name
    gguf::File file;
    auto m = load(bytes, file);
    ASSERT_FALSE(m.ok()) << name;
    EXPECT_NE(m.error().message.find(std::string("'") + name + "' is missing"), std::string::npos)
        << m.error().message;
  }
}

// --router-skew: any byte range of the file is still computable on its own
// (ranges that cut a router float included), and the router rows shrink
// with the expert index as the spec says.
TEST(InferMoe, SkewedRouterIsAPureFunctionAndScalesTheRows) {
  auto s = moe_spec("llama", gguf::TypeScheme::kF32);
  s.router_skew = 3;
  auto plan = gguf::plan_model(s);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const auto whole = *gguf::render_model(*plan);
  const gguf::PlannedTensor* router = nullptr;
  for (const auto& t : plan->tensors) {
    if (t.name == "blk.1.ffn_gate_inp.weight") router = &t;
  }
  ASSERT_NE(router, nullptr);
  for (const auto& [from, len] : {std::pair<uint64_t, size_t>{router->offset - 3, 10}, {router->offset + 1, 6},
                                  {router->offset + 255, 513}, {router->offset + router->nbytes - 5, 9}}) {
    std::vector<std::byte> part(len);
    ASSERT_TRUE(gguf::expected_file_bytes(*plan, from, part).ok());
    EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + from, len)) << "range at " << from;
  }
  // Row e is scaled by 2^(-3e/3): the last of the 4 rows by 1/8.
  auto row_norm = [&](uint64_t e) {
    double sum = 0;
    for (uint64_t i = 0; i < s.n_embd; ++i) {
      float v = 0;
      std::memcpy(&v, whole.data() + router->offset + (e * s.n_embd + i) * 4, 4);
      sum += double{v} * v;
    }
    return std::sqrt(sum);
  };
  const double ratio = row_norm(0) / row_norm(3);
  EXPECT_GT(ratio, 5.0);
  EXPECT_LT(ratio, 13.0);
  EXPECT_GT(row_norm(1), row_norm(2));
}

TEST(InferMoe, WriterRefusesBadExpertCounts) {
  auto s = moe_spec("llama", gguf::TypeScheme::kF32);
  s.n_expert_used = 5;
  auto p = gguf::plan_model(s);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("n_expert_used 5 must be between 1 and n_expert 4"), std::string::npos);
  s = moe_spec("qwen3moe", gguf::TypeScheme::kF32);
  s.n_expert = 0;
  s.n_expert_used = 0;
  p = gguf::plan_model(s);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("qwen3moe model needs n_expert > 0"), std::string::npos);
  s = moe_spec("llama", gguf::TypeScheme::kF32);
  s.llama_compatible = false;
  s.router_skew = 2;
  p = gguf::plan_model(s);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("router_skew needs experts and llama-compatible weights"), std::string::npos);
}

}  // namespace
