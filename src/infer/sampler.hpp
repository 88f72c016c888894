// SPDX-License-Identifier: Apache-2.0
// Picks the next token from logits: greedy (temperature 0: the first
// maximum, as llama-gen's argmax) or temperature + top-k sampling from a
// seeded generator (same seed and logits: same token, on every machine,
// since it uses only std::mt19937_64 and our own arithmetic).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace airs::infer {

struct SamplerParams {
  float temperature = 0.0F;  // <= 0: greedy
  uint32_t top_k = 40;       // 0: all tokens
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {}
  // Not thread-safe; advances the generator in sampling mode.
  [[nodiscard]] int32_t sample(std::span<const float> logits);

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

[[nodiscard]] int32_t argmax(std::span<const float> logits) noexcept;

}  // namespace airs::infer
