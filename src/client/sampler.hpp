// SPDX-License-Identifier: Apache-2.0
#pragma once
// Access sampling for a streamed mixture of experts. A unit that is in
// takes no fault, so the daemon sees only the experts that were not in,
// and its expert cache counts only misses. A client that sends no expert
// hints (an unmodified runtime through the preload) drops a few units that
// are in from its own page tables now and then: the next touch of each is
// a fault (a lazy mapping) or an open (cooperative) that the daemon sees
// and counts as a use. The bytes stay where they are: a dropped page-table
// entry of a shared mapping maps the same page again on its next touch.
#include <chrono>
#include <cstdint>
#include <functional>

namespace airs::client {

struct SamplerOptions {
  std::chrono::milliseconds period{0};  // 0: no sampling
  uint32_t units = 0;                   // units dropped per round
  bool from_env = false;                // AIRS_SAMPLE_MS was set
};

// AIRS_SAMPLE_MS (a round's period, 0 turns sampling off) and
// AIRS_SAMPLE_UNITS (units per round) over the defaults; a value that is
// not a number keeps the default (and does not count as set).
SamplerOptions sampler_options_from_env();

class Sampler {
 public:
  using Clock = std::chrono::steady_clock;
  Sampler(SamplerOptions o, uint32_t unit_count, Clock::time_point now);
  [[nodiscard]] bool enabled() const { return o_.period.count() > 0 && o_.units > 0 && count_ > 0; }
  // Milliseconds until the next round is due (0: now; -1: never).
  [[nodiscard]] int timeout_ms(Clock::time_point now) const;
  // The round due at `now`: offers `sample` the units from where the last
  // round stopped (round robin over the model, so every unit is sampled
  // alike) until it has sampled `units` of them (it returns false for a
  // unit that is not in) or every unit was offered. Returns how many it
  // sampled; 0 when no round is due.
  uint32_t round(Clock::time_point now, const std::function<bool(uint32_t)>& sample);

 private:
  SamplerOptions o_;
  uint32_t count_;
  uint32_t cursor_ = 0;
  Clock::time_point next_;
};

}  // namespace airs::client
