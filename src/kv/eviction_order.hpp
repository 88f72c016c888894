// Allocation-time victim selection (issue 4 item 4), pure: which sessions'
// KV blocks to evict, in which order, so a session can get `need` blocks.
//
// Order, first evicted first (seed §6.3):
//   1. background KV          (only for a system or interactive requester)
//   2. system KV              (only for an interactive requester)
//   3. interactive KV idle longer than idle_threshold (interactive requester)
//   never: active interactive KV, and never the requester itself.
// A requester only takes KV of a level it outranks, so background sessions
// never evict each other. Within a level, partially filled blocks of every
// session go first (least recomputation), then full blocks; sessions are
// taken coldest first (last use, then id so the plan is deterministic).
//
// TODO(policy): delegate to policy::plan_eviction (with Request{priorities,
// requester, include_models=false}) once that lands; this function is the
// same order restricted to one arena's sessions, kept here so the KV library
// does not wait for it.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "policy/policy.hpp"

namespace airs::kv {

using Clock = policy::Clock;
using TimePoint = Clock::time_point;
using policy::Priority;

struct VictimCandidate {
  uint64_t session = 0;
  Priority priority = Priority::Background;
  uint32_t blocks = 0;          // blocks eviction can free (held by this session alone)
  uint32_t partial_blocks = 0;  // of those, blocks not completely filled (taken first)
  TimePoint last_used{};
};

struct VictimPlan {
  // EvictBlocks actions in execution order; `blocks` of each is taken from
  // that session's tail (a session may appear twice: partial, then full).
  std::vector<policy::Action> actions;
  uint32_t blocks = 0;     // total planned
  bool satisfied = false;  // blocks >= need
  // When not satisfied: the blocks that could not be touched and why
  // ("active interactive KV: 12 blocks").
  std::string shortfall;
};

// Contract: pure, deterministic; `block_bytes` only fills Action::bytes.
// Never plans the requester, an active interactive session, or a level the
// requester does not outrank. Stops as soon as `need` is covered.
[[nodiscard]] VictimPlan plan_allocation_eviction(std::span<const VictimCandidate> candidates, uint64_t requester,
                                                  Priority requester_priority, uint32_t need, uint64_t block_bytes,
                                                  TimePoint now, std::chrono::nanoseconds idle_threshold);

[[nodiscard]] const char* priority_name(Priority p);

}  // namespace airs::kv
