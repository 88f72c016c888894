// SPDX-License-Identifier: Apache-2.0
#include "policy/policy.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "util/units.hpp"

namespace airs::policy {
namespace {

using std::chrono::duration_cast;
using std::chrono::seconds;

bool contains(const std::vector<uint64_t>& v, uint64_t id) { return std::find(v.begin(), v.end(), id) != v.end(); }

uint64_t sat_mul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return std::numeric_limits<uint64_t>::max();
  return a * b;
}
uint64_t sat_add(uint64_t a, uint64_t b) {
  return b > std::numeric_limits<uint64_t>::max() - a ? std::numeric_limits<uint64_t>::max() : a + b;
}

// Idle time in whole seconds for messages; a last_used in the future (clock
// skew between callers) counts as 0.
int64_t idle_seconds(Clock::time_point now, Clock::time_point last_used) {
  return now > last_used ? duration_cast<seconds>(now - last_used).count() : 0;
}

// Accumulates the plan and knows when to stop.
class Builder {
 public:
  Builder(uint64_t target, bool everything) : target_(target), everything_(everything) {}
  [[nodiscard]] bool done() const { return !everything_ && plan_.bytes >= target_; }
  [[nodiscard]] uint64_t remaining() const { return plan_.bytes >= target_ ? 0 : target_ - plan_.bytes; }

  // Adds up to `available` units of `unit_bytes`; takes only what is still
  // needed unless everything is wanted. Returns the units taken.
  uint32_t take_blocks(ActionKind kind, uint64_t id, uint32_t available, uint64_t unit_bytes, std::string reason) {
    if (available == 0 || unit_bytes == 0 || done()) return 0;
    uint32_t n = available;
    if (!everything_) {
      const uint64_t need = div_round_up(remaining(), unit_bytes);
      n = static_cast<uint32_t>(std::min<uint64_t>(available, need));
    }
    const uint64_t bytes = sat_mul(n, unit_bytes);
    plan_.actions.push_back(Action{kind, id, n, bytes, std::move(reason)});
    plan_.bytes = sat_add(plan_.bytes, bytes);
    return n;
  }
  void take_model(uint64_t id, uint64_t bytes, std::string reason) {
    if (bytes == 0 || done()) return;
    plan_.actions.push_back(Action{ActionKind::EvictModel, id, 0, bytes, std::move(reason)});
    plan_.bytes = sat_add(plan_.bytes, bytes);
  }
  // Up to `spare` bytes of a streamed model's budget, in whole `unit`s;
  // only what is still needed unless everything is wanted.
  void take_budget(uint64_t id, uint64_t spare, uint64_t unit, std::string reason) {
    if (spare == 0 || unit == 0 || done()) return;
    const uint64_t bytes = everything_ ? spare / unit * unit : std::min(spare / unit, div_round_up(remaining(), unit)) * unit;
    if (bytes == 0) return;
    plan_.actions.push_back(Action{ActionKind::ShrinkModel, id, 0, bytes, std::move(reason)});
    plan_.bytes = sat_add(plan_.bytes, bytes);
  }
  Plan finish() && { return std::move(plan_); }
  [[nodiscard]] uint64_t bytes() const { return plan_.bytes; }
  // Bytes already planned from model `id` (a budget cut before its eviction).
  [[nodiscard]] uint64_t taken_from(uint64_t id) const {
    uint64_t n = 0;
    for (const auto& a : plan_.actions)
      if (a.kind == ActionKind::ShrinkModel && a.id == id) n += a.bytes;
    return n;
  }

 private:
  uint64_t target_;
  bool everything_;
  Plan plan_;
};

const char* level_label(Priority p) {
  switch (p) {
    case Priority::Background: return "background KV";
    case Priority::System: return "system KV";
    case Priority::Interactive: return "interactive KV";
  }
  return "KV";
}

// Coldest first. Measured access rates rank a level only when every session in it was
// measured: a rate and a last-use time are different scales, and mixing them
// would not give a consistent order.
void sort_coldest_first(std::vector<const SessionState*>& v) {
  const bool all_rated = std::all_of(v.begin(), v.end(), [](const SessionState* s) { return s->access_rate.has_value(); });
  std::sort(v.begin(), v.end(), [all_rated](const SessionState* a, const SessionState* b) {
    if (all_rated && *a->access_rate != *b->access_rate) return *a->access_rate < *b->access_rate;
    if (a->last_used != b->last_used) return a->last_used < b->last_used;
    return a->id < b->id;
  });
}

// One plan in the making: the request, the state it plans over, and what
// the rules kept out of it (for the shortfall message).
struct Planning {
  const PoolState& state;
  const Request& request;
  Clock::time_point now;
  const Config& config;
  bool targeted;  // the request names sessions or models
  Builder& b;
  uint64_t active_interactive = 0;
  uint64_t pinned = 0;
  uint64_t referenced = 0;
  uint64_t own = 0;
};

// 0. Unreferenced prefix-cache blocks, least recently used arena first.
void plan_cached(Planning& p) {
  std::vector<const CachedBlocks*> cached;
  for (const auto& c : p.state.cached) cached.push_back(&c);
  std::sort(cached.begin(), cached.end(), [](const CachedBlocks* x, const CachedBlocks* y) {
    return x->last_used != y->last_used ? x->last_used < y->last_used : x->arena_id < y->arena_id;
  });
  for (const CachedBlocks* c : cached) {
    p.b.take_blocks(ActionKind::DropCached, c->arena_id, c->blocks, c->block_bytes,
                    fmt::format("cached prefix blocks unused for {} s", idle_seconds(p.now, c->last_used)));
  }
}

// The sessions of priority `prio` the request may take KV from, coldest
// first; what the rules keep (the requester's own, active interactive KV)
// is counted in `p`.
std::vector<const SessionState*> victims_of_level(Planning& p, Priority prio) {
  const Request& request = p.request;
  const bool allowed = request.priorities.empty() ||
                       std::find(request.priorities.begin(), request.priorities.end(), prio) != request.priorities.end();
  std::vector<const SessionState*> level;
  for (const auto& s : p.state.sessions) {
    if (s.priority != prio || s.blocks == 0 || s.block_bytes == 0) continue;
    const uint64_t bytes = sat_mul(s.blocks, s.block_bytes);
    if (p.targeted && !contains(request.sessions, s.id)) continue;
    if (request.requester && *request.requester == s.id) {
      p.own = sat_add(p.own, bytes);
      continue;
    }
    // Interactive KV is a victim only once idle strictly longer than the
    // threshold: a user waiting on it must never lose it.
    if (prio == Priority::Interactive && !(p.now - s.last_used > p.config.idle_threshold)) {
      p.active_interactive = sat_add(p.active_interactive, bytes);
      continue;
    }
    if (!allowed) continue;
    level.push_back(&s);
  }
  sort_coldest_first(level);
  return level;
}

// 1–3. KV by priority level: background, system, idle interactive.
void plan_sessions(Planning& p) {
  for (Priority prio : {Priority::Background, Priority::System, Priority::Interactive}) {
    const std::vector<const SessionState*> level = victims_of_level(p, prio);
    if (level.empty()) continue;
    const bool all_rated =
        std::all_of(level.begin(), level.end(), [](auto* x) { return x->access_rate.has_value(); });
    auto reason = [&](const SessionState& s, const char* what) {
      std::string r = prio == Priority::Interactive
                          ? fmt::format("interactive KV idle {} s", idle_seconds(p.now, s.last_used))
                          : std::string(level_label(prio));
      if (s.access_rate && all_rated) r += fmt::format(", {:.1f} accesses/s", *s.access_rate);
      return r + what;
    };
    // Partially filled blocks first: they hold the fewest tokens per byte,
    // so recomputing them costs the least.
    for (const SessionState* s : level)
      p.b.take_blocks(ActionKind::EvictBlocks, s->id, std::min(s->partial_blocks, s->blocks), s->block_bytes,
                      reason(*s, ", partial blocks"));
    for (const SessionState* s : level) {
      const uint32_t full = s->blocks - std::min(s->partial_blocks, s->blocks);
      p.b.take_blocks(ActionKind::EvictBlocks, s->id, full, s->block_bytes, reason(*s, ""));
    }
  }
}

// 4. Models nobody references, least recently used first; never pinned.
// An unused streamed model first gives back its budget above its floor (it
// streams on, slower), then unused models go whole.
void plan_unused_models(Planning& p) {
  std::vector<const ModelState*> models;
  for (const auto& m : p.state.models) {
    if (p.targeted && !contains(p.request.models, m.id)) continue;
    if (m.pinned) {
      p.pinned = sat_add(p.pinned, m.resident_bytes);
      continue;
    }
    if (m.refcount > 0) {
      p.referenced = sat_add(p.referenced, m.resident_bytes);
      continue;
    }
    models.push_back(&m);
  }
  std::sort(models.begin(), models.end(), [](const ModelState* x, const ModelState* y) {
    return x->last_used != y->last_used ? x->last_used < y->last_used : x->id < y->id;
  });
  const uint64_t unit = p.state.unit_bytes == 0 ? 1 : p.state.unit_bytes;
  for (const ModelState* m : models)
    p.b.take_budget(m->id, m->spare_bytes, unit,
                    fmt::format("streamed model '{}' unused for {} s: a smaller budget", m->name,
                                idle_seconds(p.now, m->last_used)));
  for (const ModelState* m : models) {
    p.b.take_model(m->id, m->resident_bytes - std::min(m->resident_bytes, p.b.taken_from(m->id)),
                   fmt::format("model '{}' unused for {} s", m->name, idle_seconds(p.now, m->last_used)));
  }
}

// 5. Streamed models in use give back budget above their floor, the
// largest spare first (pinned ones too: pinning keeps a model loaded, and a
// smaller budget keeps it serving).
void plan_streamed_budgets(Planning& p) {
  std::vector<const ModelState*> streamed;
  for (const auto& m : p.state.models) {
    if (p.targeted && !contains(p.request.models, m.id)) continue;
    if (m.spare_bytes > 0 && (m.refcount > 0 || m.pinned)) streamed.push_back(&m);
  }
  std::sort(streamed.begin(), streamed.end(), [](const ModelState* x, const ModelState* y) {
    return x->spare_bytes != y->spare_bytes ? x->spare_bytes > y->spare_bytes : x->id < y->id;
  });
  for (const ModelState* m : streamed)
    p.b.take_budget(m->id, m->spare_bytes, p.state.unit_bytes == 0 ? 1 : p.state.unit_bytes,
                    fmt::format("streamed model '{}': a smaller budget", m->name));
}

// Why a plan falls short: what the rules kept, or that nothing (more) was
// there, and whether the request's own filters narrowed it.
std::string shortfall_reason(const Planning& p, const Plan& plan) {
  std::vector<std::pair<const char*, uint64_t>> blockers;
  if (p.active_interactive != 0) blockers.emplace_back("active interactive KV", p.active_interactive);
  if (p.pinned != 0) blockers.emplace_back("pinned models", p.pinned);
  if (p.referenced != 0) blockers.emplace_back("models in use", p.referenced);
  if (p.own != 0) blockers.emplace_back("the requesting session's own KV", p.own);
  std::string why;
  if (blockers.empty()) {
    why = plan.actions.empty() ? "nothing evictable" : "nothing more evictable";
  } else if (blockers.size() == 1) {
    why = fmt::format("only {} left: {}", blockers[0].first, format_bytes(blockers[0].second));
  } else {
    why = "only ";
    for (size_t i = 0; i < blockers.size(); ++i)
      why += fmt::format("{}{} ({})", i == 0 ? "" : ", ", blockers[i].first, format_bytes(blockers[i].second));
    why += " left";
  }
  const Request& r = p.request;
  if (!r.priorities.empty() || p.targeted || !r.include_models || !r.include_cached || !r.include_sessions)
    why += " within the request's filters";
  return why;
}

}  // namespace

Plan plan_eviction(const PoolState& state, const Request& request, Clock::time_point now, const Config& config) {
  uint64_t target = request.bytes;
  if (target == 0) {
    if (request.level == Level::Full) target = config.target_full_bytes;
    else if (request.level == Level::Some) target = config.target_some_bytes;
  }
  Builder b(target, request.everything);
  Planning p{state, request, now, config, !request.sessions.empty() || !request.models.empty(), b};
  if (request.include_cached && !p.targeted) plan_cached(p);
  if (request.include_sessions) plan_sessions(p);
  if (request.include_models && (!p.targeted || !request.models.empty())) {
    plan_unused_models(p);
    plan_streamed_budgets(p);
  }
  Plan plan = std::move(b).finish();
  plan.satisfied = plan.bytes >= target;
  if (!plan.satisfied)
    plan.shortfall =
        fmt::format("{} of {} short: {}", format_bytes(target - plan.bytes), format_bytes(target), shortfall_reason(p, plan));
  return plan;
}

std::vector<Priority> evictable_by(Priority p) {
  switch (p) {
    case Priority::Interactive: return {Priority::Background, Priority::System, Priority::Interactive};
    case Priority::System: return {Priority::Background};
    case Priority::Background: return {};
  }
  return {};
}

Request Request::for_kv_allocation(Priority requester_priority, uint64_t requester_session, uint64_t bytes) {
  Request r;
  r.bytes = bytes;
  r.requester = requester_session;
  r.priorities = evictable_by(requester_priority);
  r.include_sessions = !r.priorities.empty();
  return r;
}

Request Request::for_model_load(uint64_t bytes) {
  Request r;
  r.bytes = bytes;
  r.include_sessions = false;
  return r;
}

Request Request::for_pressure(Level level, uint64_t bytes) {
  Request r;
  r.level = level;
  r.bytes = bytes;
  return r;
}

const char* to_string(Priority p) {
  switch (p) {
    case Priority::Interactive: return "interactive";
    case Priority::System: return "system";
    case Priority::Background: return "background";
  }
  return "unknown";
}

std::optional<Priority> parse_priority(std::string_view s) {
  if (s == "interactive") return Priority::Interactive;
  if (s == "system") return Priority::System;
  if (s == "background") return Priority::Background;
  return std::nullopt;
}

const char* to_string(Level l) {
  switch (l) {
    case Level::None: return "none";
    case Level::Some: return "some";
    case Level::Full: return "full";
  }
  return "unknown";
}

}  // namespace airs::policy
