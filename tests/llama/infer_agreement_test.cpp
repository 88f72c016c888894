// SPDX-License-Identifier: Apache-2.0
// The engine (src/infer) against the real llama.cpp (llama-ref, the
// prebuilt libllama.so from npm) on writer-made llama models: tokenization,
// greedy tokens and logits. Tolerances are relative to the largest
// |logit| of the step, and justified by measurement (see kTol* below and
// the report printed by each test).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon_fixture.hpp"
#include "infer/engine.hpp"
#include "infer/sampler.hpp"
#include "infer/sequence.hpp"
#include "agreement_support.hpp"
#include "infer_model.hpp"

namespace {

using namespace airs::test::llama;
using airs::test::run_process;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kMkmodel = AIRS_LLAMA_MKMODEL;

struct Shape {
  std::string types;
  uint32_t heads, heads_kv;
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.types << " h" << s.heads << " kv" << s.heads_kv; }

std::string make_model(const Shape& s, uint64_t seed) {
  const std::string dir = kWork + "/infer-models";
  fs::create_directories(dir);
  const std::string p = dir + "/" + s.types + "-h" + std::to_string(s.heads) + "-kv" + std::to_string(s.heads_kv) +
                        "-s" + std::to_string(seed) + ".gguf";
  if (!fs::exists(p)) {
    auto r = run_process({kMkmodel, "--llama", "--out", p + ".tmp", "--types", s.types, "--layers", "4", "--embd",
                          "256", "--ff", "512", "--vocab", "600", "--heads", std::to_string(s.heads), "--heads-kv",
                          std::to_string(s.heads_kv), "--seed", std::to_string(seed)},
                         60s);
    if (r.exit_code != 0) throw std::runtime_error("airs-mkmodel: " + r.err);
    fs::rename(p + ".tmp", p);
  }
  return p;
}

class Agreement : public ::testing::TestWithParam<Shape> {};

TEST_P(Agreement, GreedyTokensAndLogits) {
  const Shape s = GetParam();
  const std::string path = make_model(s, 7);
  auto m = airs::test::load_model_file(path);
  constexpr int kN = 12;
  const bool f32 = s.types == "f32";
  const auto ref = run_llama(path, kPrompt, kN, "f32");
  const auto ours = run_engine(*m, kPrompt, kN, airs::infer::KvElem::kF32);
  ASSERT_EQ(ours.prompt, ref.prompt);
  ASSERT_GT(ref.prompt.size(), 48U) << "the prompt must span several KV blocks";
  ASSERT_EQ(ref.logits.size(), static_cast<size_t>(kN));
  const double step0 = max_rel_diff(ours.logits[0], ref.logits[0]);
  // Compare the steps where both fed the same tokens.
  const size_t same = same_prefix(ours.tokens, ref.tokens);
  const double all = worst(ours.logits, ref.logits, same + 1);
  // How far llama.cpp moves from itself when only the KV type changes
  // (f32 -> f16): the scale of rounding that is not a bug.
  const auto ref16 = run_llama(path, kPrompt, kN, "f16");
  const double self = worst(ref16.logits, ref.logits, 1);
  std::printf("[%s h%u kv%u] prompt %zu tokens; step-0 rel diff %.3g; worst over %zu matching steps %.3g; "
              "llama.cpp f32 vs f16 KV %.3g\n",
              s.types.c_str(), s.heads, s.heads_kv, ref.prompt.size(), step0, same + 1, all, self);
  if (f32) {
    // Measured: 3-5e-7 (float rounding of the accumulation order).
    EXPECT_EQ(ours.tokens, ref.tokens);
    EXPECT_LT(all, 1e-5);
    // f16 KV on both sides: our K/V and attention weights are rounded to
    // f16 where ggml rounds them.
    const auto ours16 = run_engine(*m, kPrompt, 1, airs::infer::KvElem::kF16);
    const double kv16 = max_rel_diff(ours16.logits[0], ref16.logits[0]);
    std::printf("[%s h%u kv%u] f16 KV: engine vs llama.cpp %.3g\n", s.types.c_str(), s.heads, s.heads_kv, kv16);
    EXPECT_LT(kv16, self);
  } else {
    // F16/Q8_0/Q4_0/Q4_K: the activation is rounded/quantised exactly as
    // ggml does (Q8_0 blocks; Q8_K super blocks for Q4_K), but the
    // accumulation order differs; bounded by the KV-type wobble of
    // llama.cpp itself (and an absolute floor for tiny wobbles). Measured:
    // q8_0 0.010 vs 0.012, q4_0 0.007 vs 0.011, q4_K 0.012 vs 0.013 (q4_K
    // against 32-value Q8_0 activations instead: 0.038, a failure here).
    EXPECT_LT(step0, std::max(2 * self, 1e-3));
  }
}

INSTANTIATE_TEST_SUITE_P(Infer, Agreement,
                         ::testing::Values(Shape{"f32", 8, 8}, Shape{"f32", 8, 2}, Shape{"f16", 8, 2},
                                           Shape{"q8_0", 8, 2}, Shape{"q4_0", 8, 4},
                                           Shape{"q4_K", 8, 2}),
                         [](const auto& p) {
                           return p.param.types + "_h" + std::to_string(p.param.heads) + "_kv" +
                                  std::to_string(p.param.heads_kv);
                         });

TEST(InferTokenizer, MatchesLlamaTokenize) {
  const std::string path = make_model(Shape{"f32", 8, 2}, 7);
  auto m = airs::test::load_model_file(path);
  const std::vector<std::string> texts = {
      "",
      "a",
      " ",
      "  leading and trailing  ",
      "Hello, world! How are you?",
      "the quick brown fox",
      "abcabcabc aaaa zzzz ab ba",
      "internationalization supercalifragilisticexpialidocious",
      "digits 0123456789 and 3.14159, -42",
      "punctuation: ;:'\"!?()[]{}<>/\\|@#$%^&*_-+=~`",
      "tabs\tand\nnewlines\n\nhere",
      "caf\xC3\xA9 na\xC3\xAFve \xE2\x82\xAC 100 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80 emoji",
      "\xE2\x96\x81 literal lower-block char",
      "<s> is not parsed as special </s>",
      "invalid utf8 \xFF\xFE tail \xC3",
  };
  std::string joined;
  for (size_t i = 0; i < texts.size(); ++i) joined += (i ? "\x1E" : "") + texts[i];
  const std::string file = kWork + "/infer-tokenize.txt";
  std::ofstream(file, std::ios::binary) << joined;
  auto r = run_process({kWork + "/llama-ref", "--backends", kWork + "/bins", "--model", path, "--tokenize", file}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    if (!line.starts_with("ids")) continue;
    std::istringstream in(line.substr(3));
    ASSERT_LT(i, texts.size());
    EXPECT_EQ(m->tokenizer->encode(texts[i]), ints(in)) << "text " << i << ": '" << texts[i] << "'";
    ++i;
  }
  EXPECT_EQ(i, texts.size());
}

}  // namespace
