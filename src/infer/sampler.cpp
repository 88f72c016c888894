// SPDX-License-Identifier: Apache-2.0
#include "infer/sampler.hpp"

#include <algorithm>
#include <cmath>

namespace airs::infer {

int32_t argmax(std::span<const float> logits) noexcept {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (p_.temperature <= 0.0F || logits.empty()) return argmax(logits);
  cand_.clear();
  cand_.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_.emplace_back(logits[i], static_cast<int32_t>(i));
  const size_t k = p_.top_k == 0 ? cand_.size() : std::min<size_t>(p_.top_k, cand_.size());
  // Ties by id so the order (and the draw) does not depend on the sort.
  auto better = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(k), cand_.end(), better);
  cand_.resize(k);
  const float mx = cand_[0].first;
  double sum = 0.0;
  std::vector<double> w(k);
  for (size_t i = 0; i < k; ++i) {
    w[i] = std::exp(static_cast<double>((cand_[i].first - mx) / p_.temperature));
    sum += w[i];
  }
  // 53 random bits -> [0, 1): no std::uniform_real_distribution (its
  // algorithm is implementation-defined).
  const double u = static_cast<double>(rng_() >> 11) * 0x1p-53 * sum;
  double acc = 0.0;
  for (size_t i = 0; i < k; ++i) {
    acc += w[i];
    if (u < acc) return cand_[i].second;
  }
  return cand_[k - 1].second;
}

}  // namespace airs::infer
