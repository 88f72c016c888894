// SPDX-License-Identifier: Apache-2.0
#include "policy/governor.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace airs::policy {
namespace {
int64_t ms(Clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }
}  // namespace

Governor::Governor(GovernorConfig config, Clock::time_point now) : config_(config), level_since_(now) {}

Level Governor::observe(Level raw, Clock::time_point now) {
  raw_ = raw;
  if (raw > level_) {
    // Escalate at once: waiting here is what lets the OOM killer win.
    level_ = raw;
    level_since_ = now;
    below_since_.reset();
  } else if (raw == level_) {
    below_since_.reset();
  } else if (!below_since_) {
    below_since_ = now;
  }
  return tick(now);
}

Level Governor::tick(Clock::time_point now) {
  if (below_since_ && now - *below_since_ >= config_.leave_after) {
    level_ = raw_;
    level_since_ = now;
    below_since_.reset();
  }
  return level_;
}

Decision Governor::decide(Clock::time_point now, bool pool_below_target) const {
  Decision d;
  d.level = level_;
  if (level_ != Level::None) {
    if (last_eviction_ && now - *last_eviction_ < config_.min_interval) {
      d.kind = Decision::Kind::Wait;
      d.retry_at = *last_eviction_ + config_.min_interval;
      d.reason = fmt::format("rate limited: last eviction {} ms ago (min {} ms)", ms(now - *last_eviction_),
                             config_.min_interval.count());
      return d;
    }
    d.kind = Decision::Kind::Evict;
    d.reason = fmt::format("pressure {} for {} ms", to_string(level_), ms(now - level_since_));
    return d;
  }
  if (!pool_below_target) {
    d.reason = "no pressure; pool at its configured size";
    return d;
  }
  // The quiet period restarts with every eviction and every grow: growing
  // right after giving pages away would only invite the next eviction.
  Clock::time_point quiet_start = level_since_;
  if (last_eviction_) quiet_start = std::max(quiet_start, *last_eviction_);
  if (last_grow_) quiet_start = std::max(quiet_start, *last_grow_);
  if (now - quiet_start >= config_.grow_after) {
    d.kind = Decision::Kind::Grow;
    d.reason = fmt::format("no pressure for {} s", ms(now - quiet_start) / 1000);
    return d;
  }
  d.retry_at = quiet_start + config_.grow_after;
  d.reason = fmt::format("no pressure for {} s; growing the pool back after {} s", ms(now - quiet_start) / 1000,
                         config_.grow_after.count() / 1000);
  return d;
}

const char* to_string(Decision::Kind k) {
  switch (k) {
    case Decision::Kind::Wait: return "wait";
    case Decision::Kind::Evict: return "evict";
    case Decision::Kind::Grow: return "grow";
  }
  return "unknown";
}

}  // namespace airs::policy
