// SPDX-License-Identifier: Apache-2.0
// Pressure governor: hysteresis and rate limits between the pressure source
// and the eviction loop. Pure (time is a parameter, no I/O): the daemon feeds
// it every level change and asks it what to do on each tick.
//
//   raw level ──observe()──► effective level (up at once, down only after the
//                            raw level stayed lower for `leave_after`)
//   decide(now) ──► Evict (effective > None and the last eviction is at least
//                   `min_interval` ago) | Grow (effective None for `grow_after`
//                   since the last pressure, eviction and grow, and the pool is
//                   below its configured size) | Wait (with when to ask again)
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "policy/policy.hpp"

namespace airs::policy {

struct GovernorConfig {
  // Least time between two evictions: the kernel needs a moment to show the
  // effect of the last one in PSI before we take more.
  std::chrono::milliseconds min_interval{1000};
  // The raw level must stay below the effective one this long before the
  // effective level steps down.
  std::chrono::milliseconds leave_after{5000};
  // No pressure for this long → the pool may grow back.
  std::chrono::milliseconds grow_after{60000};
};

struct Decision {
  enum class Kind : uint8_t { Wait, Evict, Grow };
  Kind kind = Kind::Wait;
  Level level = Level::None;  // effective level the decision was made at
  std::string reason;         // for logs/status: "rate limited: last eviction 300 ms ago (min 1000 ms)"
  // Wait: when asking again can change the answer (nullopt: only a new
  // observation can). Evict/Grow: unset.
  std::optional<Clock::time_point> retry_at;
};

class Governor {
 public:
  // `now` is the start of the quiet period (no pressure seen yet).
  Governor(GovernorConfig config, Clock::time_point now);

  // Record the pressure source's current level. Returns the effective level.
  Level observe(Level raw, Clock::time_point now);
  // Re-evaluates the step-down timer without a new observation (call on a
  // tick); returns the effective level.
  Level tick(Clock::time_point now);
  [[nodiscard]] Level level() const { return level_; }
  [[nodiscard]] Level raw_level() const { return raw_; }

  // What to do now. `pool_below_target`: the pool was shrunk and may grow.
  [[nodiscard]] Decision decide(Clock::time_point now, bool pool_below_target) const;

  // The caller acted on a decision (also for admin evictions, so an operator
  // and the loop share the rate limit).
  void record_eviction(Clock::time_point now) { last_eviction_ = now; }
  void record_grow(Clock::time_point now) { last_grow_ = now; }

  [[nodiscard]] std::optional<Clock::time_point> last_eviction() const { return last_eviction_; }
  [[nodiscard]] Clock::time_point level_since() const { return level_since_; }

 private:
  GovernorConfig config_;
  Level level_ = Level::None;
  Level raw_ = Level::None;
  Clock::time_point level_since_;
  std::optional<Clock::time_point> below_since_;
  std::optional<Clock::time_point> last_eviction_;
  std::optional<Clock::time_point> last_grow_;
};

[[nodiscard]] const char* to_string(Decision::Kind k);

}  // namespace airs::policy
