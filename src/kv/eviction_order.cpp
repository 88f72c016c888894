#include "kv/eviction_order.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace airs::kv {
namespace {

enum class Level : uint8_t { Background = 1, System = 2, IdleInteractive = 3, Never = 4 };

Level level_of(const VictimCandidate& c, TimePoint now, std::chrono::nanoseconds idle) {
  switch (c.priority) {
    case Priority::Background:
      return Level::Background;
    case Priority::System:
      return Level::System;
    case Priority::Interactive:
      return now - c.last_used > idle ? Level::IdleInteractive : Level::Never;
  }
  return Level::Never;
}

// The deepest level a requester of this priority may take from.
Level max_level_for(Priority requester) {
  switch (requester) {
    case Priority::Interactive:
      return Level::IdleInteractive;
    case Priority::System:
      return Level::Background;
    case Priority::Background:
      return static_cast<Level>(0);
  }
  return static_cast<Level>(0);
}

const char* level_reason(Level l) {
  switch (l) {
    case Level::Background:
      return "background KV";
    case Level::System:
      return "system KV";
    case Level::IdleInteractive:
      return "idle interactive KV";
    case Level::Never:
      break;
  }
  return "active interactive KV";
}

}  // namespace

const char* priority_name(Priority p) {
  switch (p) {
    case Priority::Interactive:
      return "interactive";
    case Priority::System:
      return "system";
    case Priority::Background:
      return "background";
  }
  return "?";
}

VictimPlan plan_allocation_eviction(std::span<const VictimCandidate> candidates, uint64_t requester,
                                    Priority requester_priority, uint32_t need, uint64_t block_bytes, TimePoint now,
                                    std::chrono::nanoseconds idle_threshold) {
  VictimPlan plan;
  if (need == 0) {
    plan.satisfied = true;
    return plan;
  }
  const Level max_level = max_level_for(requester_priority);
  std::vector<const VictimCandidate*> order;
  order.reserve(candidates.size());
  uint32_t untouchable = 0;
  for (const auto& c : candidates) {
    if (c.session == requester || c.blocks == 0) continue;
    if (level_of(c, now, idle_threshold) > max_level) {
      untouchable += c.blocks;
      continue;
    }
    order.push_back(&c);
  }
  std::sort(order.begin(), order.end(), [&](const VictimCandidate* a, const VictimCandidate* b) {
    const Level la = level_of(*a, now, idle_threshold);
    const Level lb = level_of(*b, now, idle_threshold);
    if (la != lb) return la < lb;
    if (a->last_used != b->last_used) return a->last_used < b->last_used;
    return a->session < b->session;
  });

  auto add = [&](const VictimCandidate& c, uint32_t n, const char* what) {
    const Level l = level_of(c, now, idle_threshold);
    std::string reason = level_reason(l);
    if (l == Level::IdleInteractive) {
      reason += fmt::format(" idle {} s", std::chrono::duration_cast<std::chrono::seconds>(now - c.last_used).count());
    }
    reason += what;
    plan.actions.push_back(policy::Action{policy::ActionKind::EvictBlocks, c.session, n, uint64_t{n} * block_bytes,
                                          std::move(reason)});
    plan.blocks += n;
  };

  // Per level: partially filled tails of all sessions, then full blocks.
  size_t i = 0;
  while (i < order.size() && plan.blocks < need) {
    size_t j = i;
    const Level l = level_of(*order[i], now, idle_threshold);
    while (j < order.size() && level_of(*order[j], now, idle_threshold) == l) ++j;
    for (size_t k = i; k < j && plan.blocks < need; ++k) {
      const uint32_t n = std::min(order[k]->partial_blocks, need - plan.blocks);
      if (n > 0) add(*order[k], n, ", partially filled blocks");
    }
    for (size_t k = i; k < j && plan.blocks < need; ++k) {
      // The partial pass took all of this session's partial blocks (it only
      // stops early once `need` is covered), so what is left is full blocks.
      const uint32_t rest = order[k]->blocks - std::min(order[k]->partial_blocks, order[k]->blocks);
      const uint32_t n = std::min(rest, need - plan.blocks);
      if (n > 0) add(*order[k], n, "");
    }
    i = j;
  }
  plan.satisfied = plan.blocks >= need;
  if (!plan.satisfied) {
    plan.shortfall = fmt::format("{} more blocks needed; the rest is KV that a {} session may not evict ({} blocks: active "
                                 "interactive or equal/higher priority)",
                                 need - plan.blocks, priority_name(requester_priority), untouchable);
  }
  return plan;
}

}  // namespace airs::kv
