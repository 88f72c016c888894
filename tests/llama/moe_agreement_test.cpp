// SPDX-License-Identifier: Apache-2.0
// The engine (src/infer) against the real llama.cpp (llama-ref, the
// prebuilt libllama.so from npm) on writer-made mixture-of-experts models:
// the Mixtral layout (architecture llama with experts) and qwen3moe (its
// own keys, q/k norms, NeoX RoPE). Same measures and bounds as the dense
// agreement tests (infer_agreement_test.cpp): greedy tokens identical and
// logits within 1e-5 of the step's largest |logit| for f32 weights; for
// quantised weights, step-0 logits within twice llama.cpp's own f32 -> f16
// KV shift. Routing is where a MoE can go wrong silently (a wrong expert
// still gives plausible logits), so f32 must agree over every step.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agreement_support.hpp"

namespace {

using namespace airs::test::llama;
using airs::test::run_process;
namespace fs = std::filesystem;

const std::string kMkmodel = AIRS_LLAMA_MKMODEL;
constexpr uint32_t kLayers = 4;

struct MoeShape {
  std::string arch, types;
  uint32_t experts, used;
  double skew;
};

std::string tag(const MoeShape& s) {
  return s.arch + "_" + s.types + "_e" + std::to_string(s.experts) + "k" + std::to_string(s.used) + "_skew" +
         std::to_string(static_cast<int>(s.skew));
}

void PrintTo(const MoeShape& s, std::ostream* os) { *os << tag(s); }

std::string make_model(const MoeShape& s, uint64_t seed) {
  const std::string dir = kWork + "/infer-models";
  fs::create_directories(dir);
  const std::string p = dir + "/moe-" + tag(s) + "-s" + std::to_string(seed) + ".gguf";
  if (!fs::exists(p)) {
    auto r = run_process({kMkmodel, "--llama", "--arch", s.arch, "--out", p + ".tmp", "--types", s.types, "--layers",
                          std::to_string(kLayers), "--embd", "256", "--ff", "256", "--vocab", "600", "--heads", "8",
                          "--heads-kv", "2", "--experts", std::to_string(s.experts), "--experts-used",
                          std::to_string(s.used), "--router-skew", std::to_string(s.skew), "--seed",
                          std::to_string(seed)},
                         60s);
    if (r.exit_code != 0) throw std::runtime_error("airs-mkmodel: " + r.err);
    fs::rename(p + ".tmp", p);
  }
  return p;
}

// What the expert observer saw: per forward pass, per layer, the experts.
struct Routing {
  std::vector<std::vector<std::vector<uint32_t>>> passes;
  uint32_t last_layer = UINT32_MAX;
  void observe(uint32_t layer, std::span<const uint32_t> experts) {
    if (layer <= last_layer && layer == 0) passes.emplace_back();
    last_layer = layer;
    passes.back().emplace_back(experts.begin(), experts.end());
  }
};

class MoeAgreement : public ::testing::TestWithParam<MoeShape> {};

TEST_P(MoeAgreement, GreedyTokensAndLogits) {
  const MoeShape s = GetParam();
  const std::string path = make_model(s, 7);
  auto m = airs::test::load_model_file(path);
  ASSERT_EQ(m->model.config.n_expert, s.experts);
  ASSERT_EQ(m->model.config.n_expert_used, s.used);
  constexpr int kN = 12;
  const auto ref = run_llama(path, kPrompt, kN, "f32");
  Routing routing;
  const auto ours = run_engine(*m, kPrompt, kN, airs::infer::KvElem::kF32,
                               [&](uint32_t l, std::span<const uint32_t> e) { routing.observe(l, e); });
  ASSERT_EQ(ours.prompt, ref.prompt);
  ASSERT_GT(ref.prompt.size(), 48U) << "the prompt must span several KV blocks";
  ASSERT_EQ(ref.logits.size(), static_cast<size_t>(kN));
  const double step0 = max_rel_diff(ours.logits[0], ref.logits[0]);
  const size_t same = same_prefix(ours.tokens, ref.tokens);
  const double all = worst(ours.logits, ref.logits, same + 1);
  const auto ref16 = run_llama(path, kPrompt, kN, "f16");
  const double self = worst(ref16.logits, ref.logits, 1);
  const size_t same16 = same_prefix(ref16.tokens, ref.tokens);
  std::printf("[%s] prompt %zu tokens; greedy tokens equal for %zu of %d steps; step-0 rel diff %.3g; worst over "
              "%zu matching steps %.3g; llama.cpp f32 vs f16 KV: step 0 %.3g, worst over %zu steps %.3g\n",
              tag(s).c_str(), ref.prompt.size(), same, kN, step0, std::min<size_t>(same + 1, kN), all, self,
              std::min<size_t>(same16 + 1, kN), worst(ref16.logits, ref.logits, same16 + 1));

  // The observer: one call per layer per forward pass, ascending distinct
  // ids below n_expert; a decode pass (one token) names exactly k experts.
  ASSERT_FALSE(routing.passes.empty());
  std::map<uint32_t, size_t> decode_choices;
  size_t decode_passes = 0;
  for (size_t p = 0; p < routing.passes.size(); ++p) {
    const auto& pass = routing.passes[p];
    ASSERT_EQ(pass.size(), kLayers) << "pass " << p;
    for (const auto& ids : pass) {
      ASSERT_FALSE(ids.empty());
      EXPECT_TRUE(std::is_sorted(ids.begin(), ids.end()));
      EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());
      EXPECT_LT(ids.back(), s.experts);
    }
  }
  // Prefill runs in batches (each names the union of its tokens' experts);
  // the last kN - 1 passes are the decode steps.
  ASSERT_GE(routing.passes.size(), static_cast<size_t>(kN));
  for (size_t p = routing.passes.size() - (kN - 1); p < routing.passes.size(); ++p, ++decode_passes) {
    for (const auto& ids : routing.passes[p]) {
      EXPECT_EQ(ids.size(), s.used);
      for (uint32_t e : ids) ++decode_choices[e];
    }
  }
  std::string hist;
  for (const auto& [e, n] : decode_choices) hist += " " + std::to_string(e) + ":" + std::to_string(n);
  std::printf("[%s] decode routing (expert:choices over %zu steps x %u layers):%s\n", tag(s).c_str(), decode_passes,
              kLayers, hist.c_str());

  if (s.types == "f32") {
    EXPECT_EQ(ours.tokens, ref.tokens);
    EXPECT_LT(all, 1e-5);
    const auto ours16 = run_engine(*m, kPrompt, 1, airs::infer::KvElem::kF16);
    const double kv16 = max_rel_diff(ours16.logits[0], ref16.logits[0]);
    std::printf("[%s] f16 KV: engine vs llama.cpp %.3g\n", tag(s).c_str(), kv16);
    EXPECT_LT(kv16, self);
  } else {
    // Quantised: as the dense tests, step 0 only. Greedy tokens can part
    // at a near tie: on llama q4_0 with 64 experts (8 used) the top two
    // logits are 0.008 apart and llama.cpp itself picks another first
    // token with f16 KV than with f32.
    EXPECT_LT(step0, std::max(2 * self, 1e-3));
  }
}

INSTANTIATE_TEST_SUITE_P(Infer, MoeAgreement,
                         ::testing::Values(MoeShape{"llama", "f32", 8, 2, 0}, MoeShape{"llama", "f32", 8, 2, 3},
                                           MoeShape{"llama", "f32", 4, 1, 0}, MoeShape{"qwen3moe", "f32", 8, 2, 0},
                                           MoeShape{"qwen3moe", "f32", 16, 4, 3},
                                           MoeShape{"llama", "q8_0", 8, 2, 0},
                                           MoeShape{"qwen3moe", "q4_K", 8, 2, 0},
                                           MoeShape{"qwen3moe", "q4_0", 64, 8, 0}),
                         [](const auto& p) { return tag(p.param); });

// Dense qwen3 shares qwen3moe's q/k norms (RMSNorm of each head of q and
// k before RoPE), which the engine once ignored: f32 weights must agree
// as tightly as the dense llama models do.
TEST(MoeAgreementQkNorm, DenseQwen3) {
  const MoeShape s{"qwen3", "f32", 0, 0, 0};
  const std::string path = make_model(s, 5);
  auto m = airs::test::load_model_file(path);
  ASSERT_NE(m->model.layers[0].attn_q_norm, nullptr);
  ASSERT_EQ(m->model.config.n_expert, 0U);
  constexpr int kN = 12;
  const auto ref = run_llama(path, kPrompt, kN, "f32");
  const auto ours = run_engine(*m, kPrompt, kN, airs::infer::KvElem::kF32);
  ASSERT_EQ(ours.prompt, ref.prompt);
  const double all = worst(ours.logits, ref.logits, kN);
  std::printf("[qwen3 f32] worst over %d steps %.3g\n", kN, all);
  EXPECT_EQ(ours.tokens, ref.tokens);
  EXPECT_LT(all, 1e-5);
}

// --router-skew concentrates the routing on the low-numbered experts: over
// the prompt's tokens, fed one at a time (so each pass is one token's
// choice), experts 0 and 1 take a larger share of the choices than in the
// same model without skew.
TEST(MoeRouting, SkewConcentratesChoices) {
  using namespace airs::infer;
  auto share_of_first_two = [](double skew) {
    const MoeShape s{"llama", "f32", 8, 2, skew};
    auto m = airs::test::load_model_file(make_model(s, 11));
    std::vector<size_t> count(s.experts, 0);
    ThreadPool pool(2);
    const KvLayout layout = kv_layout_for(m->model.config, 16, KvElem::kF32);
    Engine engine(m->model, layout, pool);
    engine.set_expert_observer([&](uint32_t, std::span<const uint32_t> e) {
      EXPECT_EQ(e.size(), s.used);
      for (uint32_t id : e) ++count[id];
    });
    PrivateKv kv(layout.block_bytes());
    Sequence seq(engine, kv);
    const auto prompt = m->tokenizer->encode(kPrompt);
    EXPECT_TRUE(seq.prefill(std::span(prompt).first(1)).ok());
    for (size_t i = 1; i < prompt.size(); ++i) EXPECT_TRUE(seq.append(prompt[i]).ok());
    const size_t total = std::accumulate(count.begin(), count.end(), size_t{0});
    EXPECT_EQ(total, prompt.size() * kLayers * s.used);
    return static_cast<double>(count[0] + count[1]) / static_cast<double>(total);
  };
  const double flat = share_of_first_two(0);
  const double skewed = share_of_first_two(4);
  std::printf("share of experts 0 and 1 in the per-token choices: skew 0 %.3f, skew 4 %.3f\n", flat, skewed);
  // Measured: 0.180 without skew, 0.325 with skew 4. The hidden states of
  // these random models share a dominant direction, so a few experts win
  // most tokens even without skew, and scaling the router rows moves the
  // choice less than it would for random inputs.
  EXPECT_GT(skewed, flat + 0.1);
}

}  // namespace
