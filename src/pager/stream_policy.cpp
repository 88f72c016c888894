// SPDX-License-Identifier: Apache-2.0
#include "pager/stream_policy.hpp"

#include <algorithm>
#include <utility>

namespace airs::pager {

StreamPolicy::StreamPolicy(UnitSteps steps, uint32_t window, ExpertLayout experts, ExpertPolicy expert_policy)
    : step_(std::move(steps.first)),
      last_(std::move(steps.last)),
      cold_touched_(step_.size(), 0),
      window_(std::max<uint32_t>(window, 1)),
      experts_(std::move(experts)) {
  if (!experts_.empty()) {
    std::vector<uint32_t> layer_of(experts_.key_count());
    for (uint32_t k = 0; k < experts_.key_count(); ++k) layer_of[k] = experts_.key(k).layer;
    cache_ = ExpertCache(expert_policy, std::move(layer_of), experts_.layers());
  }
  for (uint32_t s : step_)
    if (s != kColdStep) steps_ = std::max(steps_, s + 1);
  if (last_.size() != step_.size()) last_ = step_;
  for (uint32_t u = 0; u < step_.size(); ++u)
    if (step_[u] == kColdStep || last_[u] == kColdStep || last_[u] < step_[u]) last_[u] = step_[u];
  units_of_step_.resize(steps_);
  order_.resize(steps_);
  pos_.resize(steps_);
  for (uint32_t s = 0; s < steps_; ++s) order_[s] = pos_[s] = s;
  for (uint32_t u = 0; u < step_.size(); ++u) {
    if (step_[u] == kColdStep) continue;
    units_of_step_[step_[u]].push_back(u);
    ++cyclic_units_;
  }
}

uint32_t StreamPolicy::floor_units() const {
  size_t widest = 0;
  for (const auto& v : units_of_step_) widest = std::max(widest, v.size());
  bool any_cold = false;
  for (uint32_t u = 0; u < step_.size(); ++u)
    if (step_[u] == kColdStep && !expert_unit(u)) any_cold = true;
  const uint32_t experts = experts_.empty() ? 0 : std::max(experts_.widest(), kRecentExpertUnits);
  return static_cast<uint32_t>(widest) + (any_cold ? 1 : 0) + window_ + experts;
}

void StreamPolicy::touched(uint64_t client, uint32_t u) {
  if (u >= step_.size()) return;
  ++tick_;
  Client& c = clients_[client];
  if (c.last != u) c.before_last = std::exchange(c.last, u);
  if (expert_unit(u)) {
    std::erase(c.recent, u);
    c.recent.push_back(u);
    if (c.recent.size() > kRecentExpertUnits) c.recent.erase(c.recent.begin());
  }
  const uint32_t s = step_[u];
  if (s == kColdStep) {
    cold_touched_[u] = tick_;
    return;
  }
  if (c.visited.size() != steps_) c.visited.assign(steps_, false);
  // A unit of one step says the client is at that step; a unit two tensors
  // share may be read for either (the position moves, the step is not
  // marked as one the client was at).
  const bool one_step = s == last_[u];
  const auto at = [&](uint32_t to) {
    if (c.step && pos_[to] < pos_[*c.step]) c.visited.assign(steps_, false);  // a new pass
    c.step = to;
    if (one_step) c.visited[to] = true;
  };
  if (!c.step) return at(s);
  // The unit's step nearest ahead of the client (a unit two tensors share
  // is in both).
  std::optional<uint32_t> next;
  uint64_t nearest = 0;
  for (uint32_t t = s; t <= last_[u]; ++t) {
    const uint64_t a = ahead_of(*c.step, t);
    if (a <= steps_ / 2 && (!next || a < nearest)) next = t, nearest = a;
  }
  if (next) return at(*next);
  // Behind it: a straggler, or a client that reads tensors in another order
  // than the file's (a step of this pass it has not been at).
  if (one_step && !c.visited[s] && pos_[s] < pos_[*c.step] && pos_[*c.step] - pos_[s] <= kReorderReach) {
    move_after(s, *c.step);
    at(s);
  }
}

void StreamPolicy::move_after(uint32_t s, uint32_t t) {
  const uint32_t from = pos_[s], to = pos_[t];  // from < to
  for (uint32_t p = from; p < to; ++p) {
    order_[p] = order_[p + 1];
    pos_[order_[p]] = p;
  }
  order_[to] = s;
  pos_[s] = to;
}

void StreamPolicy::touched_expert(uint64_t client, uint32_t key, bool current, bool count) {
  if (key >= experts_.key_count()) return;
  if (current) {
    // Its units are protected as the client's expert: the recent ones,
    // touched before the client's touches told the expert, are not needed.
    Client& c = clients_[client];
    c.expert = key;
    c.recent.clear();
  }
  if (count) cache_.access(key);
}

void StreamPolicy::hinted(uint64_t client, std::span<const uint32_t> keys) {
  Client& c = clients_[client];
  c.hinted.clear();
  for (uint32_t k : keys) {
    if (k >= experts_.key_count()) continue;
    cache_.access(k);
    const auto& units = experts_.units_of(k);
    c.hinted.insert(c.hinted.end(), units.begin(), units.end());
  }
  std::sort(c.hinted.begin(), c.hinted.end());
  c.hinted.erase(std::unique(c.hinted.begin(), c.hinted.end()), c.hinted.end());
}

void StreamPolicy::forget(uint64_t client) { clients_.erase(client); }

std::optional<uint32_t> StreamPolicy::position(uint64_t client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? std::nullopt : it->second.step;
}

uint64_t StreamPolicy::distance(uint32_t u) const {
  const uint32_t s = step_[u];
  if (s == kColdStep) return uint64_t{steps_} + (tick_ - cold_touched_[u]);
  uint64_t best = UINT64_MAX;
  for (const auto& [key, c] : clients_)
    if (c.step)
      for (uint32_t t = s; t <= last_[u]; ++t) best = std::min(best, ahead_of(*c.step, t));
  if (best != UINT64_MAX) return best;
  for (uint32_t t = s; t <= last_[u]; ++t) best = std::min<uint64_t>(best, pos_[t]);
  return best;
}

bool StreamPolicy::protected_unit(uint32_t u) const {
  for (const auto& [key, c] : clients_) {
    if (c.last == u || c.before_last == u) return true;
    if (c.step && step_[u] != kColdStep && step_[u] <= *c.step && *c.step <= last_[u]) return true;
    if (c.expert) {
      const auto& units = experts_.units_of(*c.expert);
      if (std::binary_search(units.begin(), units.end(), u)) return true;
    }
    if (std::find(c.recent.begin(), c.recent.end(), u) != c.recent.end()) return true;
    if (std::binary_search(c.hinted.begin(), c.hinted.end(), u)) return true;
  }
  return false;
}

std::vector<uint32_t> StreamPolicy::ahead(uint32_t limit, const std::function<bool(uint32_t)>& wanted,
                                          uint32_t horizon) const {
  std::vector<uint32_t> starts;  // cycle positions
  for (const auto& [key, c] : clients_)
    if (c.step) starts.push_back(pos_[*c.step]);
  if (starts.empty()) starts.push_back(0);
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  // Walk every client's cycle in step; the d-th step after each client at
  // once, so the nearest units come first whoever needs them.
  // How many steps past its own one a client looks.
  uint32_t reach = steps_;
  if (horizon != 0) {
    uint64_t seen = 0;
    reach = 1;
    for (uint32_t d = 1; d < steps_; ++d) {
      uint64_t widest = 0;
      for (uint32_t start : starts)
        widest = std::max<uint64_t>(widest, units_of_step_[order_[(start + d) % steps_]].size());
      seen += widest;
      reach = d + 1;
      if (seen >= horizon) break;
    }
  }
  std::vector<uint32_t> out;
  std::vector<bool> taken(step_.size(), false);
  for (uint32_t d = 0; d < reach && out.size() < limit; ++d) {
    for (uint32_t start : starts) {
      for (uint32_t u : units_of_step_[order_[(start + d) % steps_]]) {
        if (out.size() >= limit) return out;
        if (taken[u] || !wanted(u)) continue;
        taken[u] = true;
        out.push_back(u);
      }
    }
  }
  return out;
}

std::optional<uint32_t> StreamPolicy::victim(const std::vector<uint32_t>& candidates, uint64_t for_distance,
                                             bool urgent) const {
  std::optional<uint32_t> best, best_protected, best_expert, best_expert_protected;
  uint64_t best_d = 0, best_protected_d = 0;
  double best_expert_score = 0, best_expert_protected_score = 0;
  for (uint32_t u : candidates) {
    if (expert_unit(u)) {
      const double s = cache_.evict_score(experts_.keys_of(u));
      if (protected_unit(u)) {
        if (!best_expert_protected || s > best_expert_protected_score)
          best_expert_protected = u, best_expert_protected_score = s;
      } else if (!best_expert || s > best_expert_score) {
        best_expert = u, best_expert_score = s;
      }
      continue;
    }
    const uint64_t d = distance(u);
    if (protected_unit(u)) {
      if (!best_protected || d > best_protected_d) best_protected = u, best_protected_d = d;
      continue;
    }
    if (!best || d > best_d) best = u, best_d = d;
  }
  // Cold units first (their distance is past every step), then experts,
  // then the dense part.
  if (best && !cyclic(*best)) return best;
  if (best_expert) return best_expert;
  if (best && best_d > for_distance) return best;
  if (!urgent) return std::nullopt;
  // A client waits: another client's expert (it faults on it again) before
  // the dense part every token reads.
  if (best_expert_protected) return best_expert_protected;
  return best ? best : best_protected;
}

}  // namespace airs::pager
