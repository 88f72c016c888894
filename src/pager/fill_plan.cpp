// SPDX-License-Identifier: Apache-2.0
#include "pager/fill_plan.hpp"

#include <algorithm>
#include <numeric>

namespace airs::pager {

std::vector<uint32_t> rank_units(const std::vector<Extent>& extents, uint64_t file_size, uint64_t unit_size) {
  const uint64_t units = file_size / unit_size + (file_size % unit_size != 0 ? 1 : 0);
  std::vector<uint32_t> rank(units, kUnrankedUnit);
  for (const Extent& e : extents) {
    if (e.length == 0 || e.offset >= file_size) continue;
    const uint64_t end = std::min(file_size, e.offset + std::min(e.length, file_size - e.offset));
    for (uint64_t u = e.offset / unit_size; u * unit_size < end; ++u) rank[u] = std::min(rank[u], e.load_rank);
  }
  return rank;
}

UnitSteps unit_steps(const std::vector<Extent>& extents, uint64_t file_size, uint64_t unit_size) {
  // Each EveryToken extent (a tensor) is a step of its own, in (load rank,
  // offset) order: a token reads a layer's tensors one after the other, so
  // the unit a client just finished is known to the tensor, not only to the
  // layer (a layer-sized step would evict whole layers at a time).
  std::vector<const Extent*> cyclic;
  for (const Extent& e : extents)
    if (e.access == Access::EveryToken && e.length > 0 && e.offset < file_size) cyclic.push_back(&e);
  std::sort(cyclic.begin(), cyclic.end(), [](const Extent* a, const Extent* b) {
    return a->load_rank != b->load_rank ? a->load_rank < b->load_rank : a->offset < b->offset;
  });
  const uint64_t units = file_size / unit_size + (file_size % unit_size != 0 ? 1 : 0);
  std::vector<uint32_t> first(units, UINT32_MAX), last(units, UINT32_MAX);
  for (uint32_t i = 0; i < cyclic.size(); ++i) {
    const Extent& e = *cyclic[i];
    const uint64_t end = std::min(file_size, e.offset + std::min(e.length, file_size - e.offset));
    for (uint64_t u = e.offset / unit_size; u * unit_size < end; ++u) {
      first[u] = std::min(first[u], i);
      last[u] = last[u] == UINT32_MAX ? i : std::max(last[u], i);
    }
  }
  // Steps numbered 0, 1, ... with no gaps (a tensor inside a unit another
  // one starts in has no unit of its own).
  std::vector<uint32_t> used;
  for (uint32_t s : first)
    if (s != UINT32_MAX) used.push_back(s);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  // A unit's last step, numbered so: the last used step at or before it.
  const auto number = [&](uint32_t s) {
    return static_cast<uint32_t>(std::upper_bound(used.begin(), used.end(), s) - used.begin()) - 1;
  };
  for (uint64_t u = 0; u < units; ++u) {
    if (first[u] == UINT32_MAX) continue;
    first[u] = number(first[u]);
    last[u] = number(last[u]);
  }
  return {std::move(first), std::move(last)};
}

FillPlan::FillPlan(std::vector<uint32_t> unit_rank, uint32_t prefetch_window)
    : rank_(std::move(unit_rank)), window_(prefetch_window) {
  const auto n = static_cast<uint32_t>(rank_.size());
  state_.assign(n, UnitState::Empty);
  queued_.assign(n, false);
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0U);
  std::stable_sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) { return rank_[a] < rank_[b]; });
  rank_index_.assign(n, 0);
  for (uint32_t pos = 0; pos < n; ++pos) {
    const uint32_t u = order_[pos];
    if (ranks_.empty() || ranks_.back() != rank_[u]) {
      ranks_.push_back(rank_[u]);
      rank_begin_.push_back(pos);
    }
    rank_index_[u] = static_cast<uint32_t>(ranks_.size() - 1);
  }
  rank_begin_.push_back(n);
  bg_order_ = order_;
}

bool FillPlan::set_warmup_order(const std::vector<uint32_t>& first) {
  std::vector<bool> taken(unit_count(), false);
  for (uint32_t u : first) {
    if (u >= unit_count() || taken[u]) return false;
    taken[u] = true;
  }
  bg_order_ = first;
  for (uint32_t u : order_)
    if (!taken[u]) bg_order_.push_back(u);
  bg_pos_ = 0;
  pf_pos_ = pf_end_ = 0;
  bg_pos_of_.clear();
  if (!first.empty()) {
    bg_pos_of_.resize(unit_count());
    for (uint32_t pos = 0; pos < unit_count(); ++pos) bg_pos_of_[bg_order_[pos]] = pos;
  }
  return true;
}

void FillPlan::set_state(uint32_t u, UnitState s) {
  auto count = [&](UnitState st, int d) {
    if (st == UnitState::Ready) ready_ = static_cast<uint32_t>(static_cast<int>(ready_) + d);
    if (st == UnitState::InFlight) in_flight_ = static_cast<uint32_t>(static_cast<int>(in_flight_) + d);
    if (st == UnitState::Failed) failed_ = static_cast<uint32_t>(static_cast<int>(failed_) + d);
  };
  count(state_[u], -1);
  state_[u] = s;
  count(s, +1);
}

void FillPlan::on_fault(uint32_t u) {
  if (u >= unit_count()) return;
  if (state_[u] == UnitState::Empty && !queued_[u]) {
    queued_[u] = true;
    urgent_.push_back(u);
  }
  const uint32_t ri = rank_index_[u];
  pf_pos_ = rank_begin_[ri];
  pf_end_ = rank_begin_[std::min<uint64_t>(uint64_t{ri} + window_ + 1, ranks_.size())];
  if (!bg_pos_of_.empty()) {
    // Replayed: what follows `u` in the recording, as much as the layer window.
    const uint32_t len = pf_end_ - pf_pos_;
    pf_pos_ = bg_pos_of_[u];
    pf_end_ = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{pf_pos_} + len, unit_count()));
  }
}

const std::vector<uint32_t>& FillPlan::prefetch_order() const { return bg_pos_of_.empty() ? order_ : bg_order_; }

std::optional<uint32_t> FillPlan::next(ReadClass cls) {
  switch (cls) {
    case ReadClass::Urgent:
      while (!urgent_.empty()) {
        const uint32_t u = urgent_.front();
        if (state_[u] == UnitState::Empty) return u;
        urgent_.pop_front();
        queued_[u] = false;
      }
      return std::nullopt;
    case ReadClass::Prefetch:
      while (pf_pos_ < pf_end_) {
        const uint32_t u = prefetch_order()[pf_pos_];
        if (state_[u] == UnitState::Empty) return u;
        ++pf_pos_;
      }
      return std::nullopt;
    case ReadClass::Background:
      while (bg_pos_ < bg_order_.size()) {
        const uint32_t u = bg_order_[bg_pos_];
        if (state_[u] == UnitState::Empty) return u;
        ++bg_pos_;
      }
      return std::nullopt;
  }
  return std::nullopt;
}

std::vector<uint32_t> FillPlan::peek(ReadClass cls, uint32_t n) const {
  std::vector<uint32_t> out;
  uint32_t pos = 0, end = 0;
  const std::vector<uint32_t>& order = cls == ReadClass::Background ? bg_order_ : prefetch_order();
  if (cls == ReadClass::Prefetch) {
    pos = pf_pos_;
    end = pf_end_;
  } else if (cls == ReadClass::Background) {
    pos = bg_pos_;
    end = static_cast<uint32_t>(order.size());
  }
  end = static_cast<uint32_t>(std::min<uint64_t>(end, uint64_t{pos} + 4ULL * n + 64));
  for (; pos < end && out.size() < n; ++pos)
    if (state_[order[pos]] == UnitState::Empty) out.push_back(order[pos]);
  return out;
}

void FillPlan::reset() {
  std::fill(state_.begin(), state_.end(), UnitState::Empty);
  std::fill(queued_.begin(), queued_.end(), false);
  urgent_.clear();
  pf_pos_ = pf_end_ = bg_pos_ = 0;
  ready_ = in_flight_ = failed_ = 0;
}

}  // namespace airs::pager
