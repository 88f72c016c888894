// SPDX-License-Identifier: Apache-2.0
#include "pager/expert_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>

namespace airs::pager {

namespace {
// By ExpertPolicy's value.
constexpr std::string_view kPolicyNames[] = {"lru", "lfu", "next-use"};
}  // namespace

std::string_view expert_policy_name(ExpertPolicy p) {
  const auto i = static_cast<size_t>(p);
  return i < std::size(kPolicyNames) ? kPolicyNames[i] : "?";
}

std::optional<ExpertPolicy> expert_policy_by_name(std::string_view name) {
  for (ExpertPolicy p : {ExpertPolicy::Lru, ExpertPolicy::Lfu, ExpertPolicy::NextUse})
    if (expert_policy_name(p) == name) return p;
  return std::nullopt;
}

ExpertCache::ExpertCache(ExpertPolicy policy, std::vector<uint32_t> layer_of_key, uint32_t layers)
    : policy_(policy), layer_of_(std::move(layer_of_key)), keys_in_layer_(layers, 0), layers_(layers) {
  for (uint32_t l : layer_of_) ++keys_in_layer_[l];
  // Forgetting over about four uses of every expert (with K of N chosen a
  // token, 4·N/K tokens): long enough to tell a hot expert from a cold one
  // in uniform routing's noise, short enough to follow a change of topic.
  half_life_ = std::max<double>(1.0, 4.0 * static_cast<double>(layer_of_.size()));
  last_.assign(layer_of_.size(), 0);
  count_.assign(layer_of_.size(), 0.0);
  visit_of_.assign(layer_of_.size(), 0);
  visits_.assign(layers, 0.0);
  visit_tick_.assign(layers, 0);
  visit_id_.assign(layers, 0);
}

double ExpertCache::decayed(double value, uint64_t since) const {
  return value * std::exp2(-static_cast<double>(tick_ - since) / half_life_);
}

void ExpertCache::access(uint32_t key) {
  if (key >= layer_of_.size()) return;
  ++tick_;
  const uint32_t l = layer_of_[key];
  if (!layer_ || *layer_ != l) {
    // The client reached layer l: a new visit of it.
    visits_[l] = decayed(visits_[l], visit_tick_[l]) + 1.0;
    visit_tick_[l] = tick_;
    ++visit_id_[l];
    layer_ = l;
  }
  if (visit_of_[key] != visit_id_[l]) {
    // Its first use in this visit (a token reads an expert once: the
    // touches of its other units are the same use).
    count_[key] = decayed(count_[key], last_[key]) + 1.0;
    visit_of_[key] = visit_id_[l];
  } else {
    count_[key] = decayed(count_[key], last_[key]);
  }
  last_[key] = tick_;
}

double ExpertCache::key_score(uint32_t key) const {
  const double age = static_cast<double>(tick_ - last_[key]) + (last_[key] == 0 ? 1.0 : 0.0);
  switch (policy_) {
    case ExpertPolicy::Lru:
      return age;
    case ExpertPolicy::Lfu:
      // Fewest aged uses first; among equals, the oldest.
      return -decayed(count_[key], last_[key]) + 1e-9 * age / static_cast<double>(tick_ + 1);
    case ExpertPolicy::NextUse: {
      const uint32_t l = layer_of_[key];
      const double layers = layers_;
      double d = l;
      if (layer_) {
        d = static_cast<double>((l + layers_ - *layer_) % layers_);
        if (d == 0 && visit_of_[key] == visit_id_[l]) d = layers;
      }
      const double n = std::max<uint32_t>(keys_in_layer_[l], 1);
      const double visits = decayed(visits_[l], visit_tick_[l]);
      const double p = std::min(1.0, (decayed(count_[key], last_[key]) + 1.0 / n) / (visits + 1.0));
      return d + layers * (1.0 / p - 1.0);
    }
  }
  return age;
}

double ExpertCache::evict_score(std::span<const uint32_t> keys) const {
  double s = std::numeric_limits<double>::infinity();
  for (uint32_t k : keys) s = std::min(s, key_score(k));
  return keys.empty() ? 0.0 : s;
}

}  // namespace airs::pager
