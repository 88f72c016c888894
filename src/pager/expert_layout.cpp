// SPDX-License-Identifier: Apache-2.0
#include "pager/expert_layout.hpp"

#include <algorithm>

namespace airs::pager {

ExpertLayout::ExpertLayout(const std::vector<Extent>& extents, uint64_t file_size, uint64_t unit_size)
    : unit_(unit_size) {
  for (const Extent& e : extents)
    if (e.access == Access::Expert && e.length > 0 && e.offset < file_size) keys_.push_back({e.layer, e.expert});
  if (keys_.empty()) return;
  std::sort(keys_.begin(), keys_.end());
  keys_.erase(std::unique(keys_.begin(), keys_.end()), keys_.end());
  const uint64_t units = file_size / unit_size + (file_size % unit_size != 0 ? 1 : 0);
  units_of_key_.resize(keys_.size());
  keys_of_unit_.resize(units);
  expert_only_.assign(units, false);
  std::vector<bool> other(units, false);
  for (const Extent& e : extents) {
    if (e.length == 0 || e.offset >= file_size) continue;
    const uint64_t end = e.offset + std::min(e.length, file_size - e.offset);
    const uint64_t first = e.offset / unit_size, last = (end - 1) / unit_size;
    if (e.access != Access::Expert) {
      for (uint64_t u = first; u <= last; ++u) other[u] = true;
      continue;
    }
    const auto k = static_cast<uint32_t>(*find({e.layer, e.expert}));
    slices_.push_back({e.offset, end, k});
    layers_ = std::max(layers_, e.layer + 1);
    for (uint64_t u = first; u <= last; ++u) {
      units_of_key_[k].push_back(static_cast<uint32_t>(u));
      keys_of_unit_[u].push_back(k);
      expert_only_[u] = true;
    }
  }
  for (uint64_t u = 0; u < units; ++u) {
    if (other[u]) expert_only_[u] = false;
    auto& v = keys_of_unit_[u];
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  }
  for (auto& v : units_of_key_) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    widest_ = std::max(widest_, static_cast<uint32_t>(v.size()));
  }
  std::sort(slices_.begin(), slices_.end(), [](const Slice& a, const Slice& b) { return a.offset < b.offset; });
}

std::optional<uint32_t> ExpertLayout::find(ExpertKey key) const {
  auto it = std::lower_bound(keys_.begin(), keys_.end(), key);
  if (it == keys_.end() || *it != key) return std::nullopt;
  return static_cast<uint32_t>(it - keys_.begin());
}

const std::vector<uint32_t>& ExpertLayout::keys_of(uint32_t u) const {
  static const std::vector<uint32_t> kNone;
  return u < keys_of_unit_.size() ? keys_of_unit_[u] : kNone;
}

std::optional<uint32_t> ExpertLayout::key_at(uint64_t offset) const {
  auto it = std::upper_bound(slices_.begin(), slices_.end(), offset,
                             [](uint64_t off, const Slice& s) { return off < s.offset; });
  if (it == slices_.begin()) return std::nullopt;
  --it;
  if (offset >= it->end) return std::nullopt;
  return it->key;
}

std::optional<uint32_t> ExpertLayout::expert_of_touch(uint32_t u, uint64_t lo, uint64_t hi) const {
  const auto& ks = keys_of(u);
  if (ks.empty()) return std::nullopt;
  lo = std::max(lo, uint64_t{u} * unit_);
  hi = std::min(hi, (uint64_t{u} + 1) * unit_);
  if (lo < hi) {
    const auto first = key_at(lo), last = key_at(hi - 1);
    if (first && first == last) return first;  // slices are contiguous: one expert holds the whole range
  }
  // A range that does not tell: the unit's one expert, where the unit holds
  // nothing else. A unit that also holds dense bytes is read every token:
  // a touch of it names no expert (access sampling makes such touches each
  // token, and naming the unit's expert read that expert every token).
  if (ks.size() == 1 && expert_unit(u)) return ks.front();
  return std::nullopt;
}

}  // namespace airs::pager
