// SPDX-License-Identifier: Apache-2.0
// Eviction policy: a pure function from the pool's state, the pressure level
// and the time to an ordered eviction plan. No I/O, no clocks of its own —
// `now` is a parameter — so every rule is tested with plain values.
//
// This is the one eviction order of the daemon: KV allocation (inside an
// arena and across arenas), model loading, the pressure loop and admin
// eviction all plan with plan_eviction(); only the Request differs.
//
// The order, first evicted first:
//   0. cached prefix blocks nobody references (least recently used first)
//   1. background KV
//   2. system KV
//   3. interactive KV idle longer than `idle_threshold`
//   4. models with no references, least recently used first: a streamed
//      one's budget above its floor before any of them goes whole (it
//      gives pages back by streaming more), then the models whole
//   5. the budgets of streamed models in use, down to each one's floor,
//      the largest spare first
// Never: interactive KV that is active (not idle), pinned models, models with
// references (a client's Open, or a KV session on the model), a streamed
// model's budget below its floor. Within a KV
// level, partially filled blocks go before full ones, and sessions are taken
// coldest first (the access rate libairs measures, when every session in the
// level has a current one; else last use).
//
// Who may evict whom (the Request constructors below):
//   - A KV allocation of priority P takes cached prefix blocks, then KV of
//     the levels P outranks (interactive: background, system and idle
//     interactive; system: background; background: none — background
//     sessions never evict each other), never its own session, then idle
//     models (the daemon allows that last step for admins' sessions only: a
//     user's KV never pushes out models other users loaded). The same rule
//     holds inside an arena and across arenas, and an allocation goes
//     through them in that order: first its own arena (the same model and
//     uid: the uid's cached prefixes, then its lower-priority KV), and only
//     when that cannot cover it, across arenas. So one arena's background
//     KV can go before another arena's cached prefixes: a uid pays for its
//     own allocations with its own KV before it touches anyone else's.
//     (kv::Allocator::obtain plans inside the arena; KvService makes room
//     across arenas.)
//   - A model load takes cached prefix blocks, then idle models; never the
//     KV of a live session (a session is a user at work; a load is not more
//     important than it). Non-admin loads are bounded by the caller's quota
//     before anything is planned (the daemon checks it).
//   - Memory pressure takes everything evictable, in the order above.
// Models and KV compete for the same pool: a KV allocation can push out an
// idle model, a model load can push out cached KV. Every caller acts only on
// a plan that covers its request: nothing is evicted for a request that
// would fail anyway.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace airs::policy {

using Clock = std::chrono::steady_clock;

enum class Priority : uint8_t { Interactive = 0, System = 1, Background = 2 };
enum class Level : uint8_t { None = 0, Some = 1, Full = 2 };

struct SessionState {
  uint64_t id = 0;
  Priority priority = Priority::Background;
  uint32_t blocks = 0;          // blocks this session holds that eviction can take (private, plus shared ones only it references)
  uint32_t partial_blocks = 0;  // of those, blocks not completely filled with tokens (0 or 1 in practice: the tail)
  uint64_t block_bytes = 0;
  Clock::time_point last_used{};
  // How much of the session's KV its client reads: the share of it touched
  // per round of libairs' access sampling, averaged over the last seconds
  // (0..1; none while the client does not report). Ranks idle KV within a
  // level before last_used, when every session in the level has one.
  std::optional<double> access_rate;
};

struct CachedBlocks {  // unreferenced prefix-cache blocks of one arena
  uint64_t arena_id = 0;
  uint32_t blocks = 0;
  uint64_t block_bytes = 0;
  Clock::time_point last_used{};
};

struct ModelState {
  uint64_t id = 0;
  std::string name;
  uint64_t resident_bytes = 0;
  uint32_t refcount = 0;
  bool pinned = false;
  Clock::time_point last_used{};
  // A streamed model: the part of its budget above its floor, which it can
  // give back and go on streaming (0 for a model that is not streamed).
  uint64_t spare_bytes = 0;
};

struct PoolState {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t unit_bytes = 0;  // the pool's page: a budget is cut in whole ones
  std::vector<SessionState> sessions;
  std::vector<CachedBlocks> cached;
  std::vector<ModelState> models;
};

struct Config {
  std::chrono::nanoseconds idle_threshold = std::chrono::seconds(300);
  // Bytes to free when pressure is reported, per level.
  uint64_t target_some_bytes = 0;
  uint64_t target_full_bytes = 0;
};

// What the caller wants freed: `bytes` at least (0 = use the level's target;
// if that is 0 too, nothing is requested and the plan is empty unless
// `everything` is set). The filters bound how deep the plan may go (e.g. KV
// allocation for an interactive session may go through level 3; admin
// eviction by priority stops at that priority).
struct Request {
  uint64_t bytes = 0;
  Level level = Level::None;
  // Only consider sessions of these priorities (empty = all).
  std::vector<Priority> priorities;
  bool include_models = true;
  // Unreferenced prefix-cache blocks (level 0).
  bool include_cached = true;
  // KV of sessions (levels 1-3; `priorities` narrows them further).
  bool include_sessions = true;
  // The session asking for memory, never a victim of its own request.
  std::optional<uint64_t> requester;
  // Admin targeting (`airsctl evict --session/--model`): when either list is
  // non-empty only the named sessions/models are candidates (cached blocks
  // are then left alone). The "never" rules still hold.
  std::vector<uint64_t> sessions;
  std::vector<uint64_t> models;
  // Take every candidate the filters allow instead of stopping at `bytes`
  // (`airsctl evict --priority background` without --bytes).
  bool everything = false;

  // The rules above, as requests. `bytes` is what is missing.
  [[nodiscard]] static Request for_kv_allocation(Priority requester_priority, uint64_t requester_session,
                                                 uint64_t bytes);
  [[nodiscard]] static Request for_model_load(uint64_t bytes);
  [[nodiscard]] static Request for_pressure(Level level, uint64_t bytes);
};

// The session priorities a requester of `p` may take KV from (its outranked
// levels; interactive includes idle interactive KV: the never-rule still
// keeps active interactive KV out). Empty for background.
[[nodiscard]] std::vector<Priority> evictable_by(Priority p);

enum class ActionKind : uint8_t { DropCached, EvictBlocks, EvictModel, ShrinkModel };

struct Action {
  ActionKind kind = ActionKind::DropCached;
  uint64_t id = 0;        // arena (DropCached), session (EvictBlocks) or model (EvictModel, ShrinkModel)
  uint32_t blocks = 0;    // DropCached/EvictBlocks: how many (EvictBlocks takes from the session's tail)
  uint64_t bytes = 0;     // what this action frees
  std::string reason;     // "background KV", "interactive KV idle 312 s", "model unused for 40 s" …
};

struct Plan {
  std::vector<Action> actions;
  uint64_t bytes = 0;      // sum of actions' bytes
  bool satisfied = false;  // bytes >= requested
  // When not satisfied: what blocked it, for the user ("only active
  // interactive KV left: 96 MiB").
  std::string shortfall;
};

// Contract: pure; same inputs → same plan. Never lists an active interactive
// session, a pinned model or a referenced model. Actions are in eviction
// order; the plan stops as soon as `bytes` is covered.
[[nodiscard]] Plan plan_eviction(const PoolState& state, const Request& request, Clock::time_point now,
                                 const Config& config);

[[nodiscard]] const char* to_string(Priority p);
[[nodiscard]] std::optional<Priority> parse_priority(std::string_view s);
[[nodiscard]] const char* to_string(Level l);

}  // namespace airs::policy
