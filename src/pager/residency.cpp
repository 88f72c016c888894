// SPDX-License-Identifier: Apache-2.0
#include "pager/residency.hpp"

#include <algorithm>

namespace airs::pager {

Residency::Residency(FillPlan plan, wire::StatusPageWriter status, uint64_t unit_size, uint64_t file_size,
                     UnitSteps steps, uint32_t budget, uint32_t window, ExpertLayout experts)
    : plan_(std::move(plan)), status_(status), budget_(budget) {
  const auto& ranks = plan_.ranks();
  std::vector<wire::RankEntry> entries(ranks.size());
  for (uint32_t i = 0; i < ranks.size(); ++i) entries[i] = {ranks[i], plan_.units_of_rank_index(i), 0, 0};
  status_.init(unit_size, file_size, plan_.unit_count(), entries.data(), static_cast<uint32_t>(entries.size()));
  if (!steps.empty()) {
    policy_.emplace(std::move(steps), window, std::move(experts));
    state_ = wire::ModelLoadState::Streaming;
    status_.set_state(state_);
    stats_.window = policy_->window();
    stats_.cyclic_units = policy_->cyclic_units();
  }
}

void Residency::set_state(wire::ModelLoadState s) {
  state_ = s;
  status_.set_state(s);
}

void Residency::read_started(uint32_t u) {
  plan_.set_state(u, UnitState::InFlight);
  read_order_.push_back(u);
}

void Residency::read_done(uint32_t u) {
  plan_.set_state(u, UnitState::Ready);
  status_.set_ready(u, plan_.rank_index(u));
  newly_ready_.push_back(u);
  ++stats_.units_read;
}

void Residency::read_failed(uint32_t u) {
  plan_.set_state(u, UnitState::Failed);
  status_.add_failed();
  set_state(wire::ModelLoadState::Failed);
}

std::vector<uint32_t> Residency::take_newly_ready() {
  std::vector<uint32_t> out = std::move(newly_ready_);
  newly_ready_.clear();
  std::sort(out.begin(), out.end());
  return out;
}

bool Residency::became_resident() {
  if (streamed() || plan_.ready() != plan_.unit_count() || state_ == wire::ModelLoadState::Resident) return false;
  set_state(wire::ModelLoadState::Resident);
  return true;
}

void Residency::all_ready() {
  for (uint32_t u = 0; u < plan_.unit_count(); ++u) {
    plan_.set_state(u, UnitState::Ready);
    status_.set_ready(u, plan_.rank_index(u));
  }
}

std::vector<uint32_t> Residency::droppable(const std::function<bool(uint32_t)>& busy) const {
  std::vector<uint32_t> out;
  for (uint32_t u = 0; u < plan_.unit_count(); ++u)
    if (plan_.state(u) == UnitState::Ready && !closing_.contains(u) && !busy(u)) out.push_back(u);
  return out;
}

void Residency::touched(ClientKey client, uint32_t u) {
  if (!policy_) return;
  const auto before = policy_->position(client);
  policy_->touched(client, u);
  const auto after = policy_->position(client);
  if (before && after && policy_->cycle_position(*after) < policy_->cycle_position(*before) &&
      policy_->experts().empty())
    new_pass();
}

void Residency::touched_expert(ClientKey client, uint32_t key, bool current, bool count) {
  if (!policy_ || key >= policy_->experts().key_count()) return;
  policy_->touched_expert(client, key, current, count);
  const uint32_t layer = policy_->experts().key(key).layer;
  auto [it, fresh] = expert_layer_.try_emplace(client, layer);
  if (!fresh && layer < it->second) new_pass();
  it->second = layer;
}

void Residency::hinted(ClientKey client, std::span<const uint32_t> keys) {
  if (policy_) policy_->hinted(client, keys);
}

void Residency::forget(ClientKey client) {
  if (policy_) policy_->forget(client);
  expert_layer_.erase(client);
}

void Residency::new_pass() {
  // A new token: what the last one read.
  ++stats_.passes;
  stats_.last_pass_units_read = stats_.units_read - pass_start_reads_;
  pass_start_reads_ = stats_.units_read;
}

void Residency::begin_drop(uint32_t u) {
  closing_.insert(u);
  status_.set_empty(u, plan_.rank_index(u));
}

void Residency::cancel_drop(uint32_t u) {
  if (closing_.erase(u) == 0) return;
  status_.set_ready(u, plan_.rank_index(u));
}

void Residency::dropped(uint32_t u) {
  closing_.erase(u);
  plan_.set_state(u, UnitState::Empty);
  ++stats_.units_dropped;
}

void Residency::drop_refused(uint32_t u) {
  cancel_drop(u);
  ++stats_.drops_refused;
}

StreamStats Residency::stream_stats() const {
  StreamStats s = stats_;
  s.budget_units = budget_;
  s.closing = static_cast<uint32_t>(closing_.size());
  if (policy_) {
    s.expert_uses = policy_->expert_cache().uses();
    s.expert_keys = policy_->experts().key_count();
  }
  return s;
}

}  // namespace airs::pager
