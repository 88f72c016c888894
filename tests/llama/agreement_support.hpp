// SPDX-License-Identifier: Apache-2.0
// Shared by the llama.cpp agreement tests: llama-ref's output (token ids
// and logits of the real llama.cpp), the engine's on the same text, and
// the measure they are compared by.
#pragma once

#include <chrono>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon_fixture.hpp"
#include "infer/engine.hpp"
#include "infer/sampler.hpp"
#include "infer/sequence.hpp"
#include "infer_model.hpp"

namespace airs::test::llama {

using namespace std::chrono_literals;

inline const std::string kWork = AIRS_LLAMA_WORK;

inline std::vector<int32_t> ints(std::istringstream& in) {
  std::vector<int32_t> v;
  int32_t x;
  while (in >> x) v.push_back(x);
  return v;
}

struct LlamaRun {
  std::vector<int32_t> prompt, tokens;
  std::vector<std::vector<float>> logits;  // per step
};

inline LlamaRun run_llama(const std::string& model, const std::string& text, int n, const std::string& kv) {
  auto r = airs::test::run_process({kWork + "/llama-ref", "--backends", kWork + "/bins", "--model", model, "--kv", kv, "--n",
                        std::to_string(n), "--text", text},
                       120s);
  if (r.exit_code != 0) throw std::runtime_error("llama-ref failed: " + r.err);
  LlamaRun out;
  std::istringstream lines(r.out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "prompt") out.prompt = ints(in);
    if (tag == "tokens") out.tokens = ints(in);
    if (tag == "logits") {
      int step;
      in >> step;
      std::vector<float> v;
      float x;
      while (in >> x) v.push_back(x);
      out.logits.push_back(std::move(v));
    }
  }
  return out;
}

struct EngineRun {
  std::vector<int32_t> prompt, tokens;
  std::vector<std::vector<float>> logits;
};

// `observer`, if set, is the engine's expert observer (mixtures of experts).
inline EngineRun run_engine(const airs::test::LoadedModel& m, const std::string& text, int n,
                            airs::infer::KvElem elem, airs::infer::Engine::ExpertObserver observer = {}) {
  using namespace airs::infer;
  ThreadPool pool(2);
  const KvLayout layout = kv_layout_for(m.model.config, 16, elem);
  Engine engine(m.model, layout, pool);
  engine.set_expert_observer(std::move(observer));
  PrivateKv kv(layout.block_bytes());
  Sequence seq(engine, kv);
  EngineRun out;
  out.prompt = m.tokenizer->encode(text);
  auto logits = seq.prefill(out.prompt);
  if (!logits) throw std::runtime_error(logits.error().message);
  for (int i = 0; i < n; ++i) {
    out.logits.emplace_back(logits->begin(), logits->end());
    out.tokens.push_back(argmax(*logits));
    if (i + 1 < n) {
      logits = seq.append(out.tokens.back());
      if (!logits) throw std::runtime_error(logits.error().message);
    }
  }
  return out;
}

// Largest |a - b| over the step, relative to the step's largest |logit|.
// How many tokens from the start two runs agree on.
inline size_t same_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, mx = 1e-30;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    mx = std::max(mx, static_cast<double>(std::fabs(b[i])));
  }
  return d / mx;
}

inline double worst(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b, size_t steps) {
  double w = 0;
  for (size_t s = 0; s < steps && s < a.size() && s < b.size(); ++s) w = std::max(w, max_rel_diff(a[s], b[s]));
  return w;
}

// A prompt of several 16-token blocks: ~100 tokens.
inline const std::string kPrompt =
    "the quick brown fox jumps over the lazy dog and then it runs far away into the deep forest where nobody can "
    "find it again, 42 times; internationalization is a long word";

}  // namespace airs::test::llama
