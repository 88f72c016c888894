// SPDX-License-Identifier: Apache-2.0
#include "client/sampler.hpp"

#include <cstdlib>

namespace airs::client {

namespace {
// A round every 20 ms of 4 units: a unit of a model with 200 units in is
// sampled about once a second, and the faults cost a few hundred minor
// faults a second at most.
constexpr SamplerOptions kDefault{std::chrono::milliseconds(20), 4};

bool parse_u32(const char* name, uint32_t& out) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return false;
  char* end = nullptr;
  const unsigned long n = std::strtoul(v, &end, 10);
  if (end == v || *end != '\0' || n > 1'000'000) return false;
  out = static_cast<uint32_t>(n);
  return true;
}
}  // namespace

SamplerOptions sampler_options_from_env() {
  SamplerOptions o = kDefault;
  uint32_t v = 0;
  if (parse_u32("AIRS_SAMPLE_MS", v)) {
    o.period = std::chrono::milliseconds(v);
    o.from_env = true;
  }
  if (parse_u32("AIRS_SAMPLE_UNITS", v)) o.units = v;
  return o;
}

Sampler::Sampler(SamplerOptions o, uint32_t unit_count, Clock::time_point now)
    : o_(o), count_(unit_count), next_(now + o.period) {}

int Sampler::timeout_ms(Clock::time_point now) const {
  if (!enabled()) return -1;
  if (now >= next_) return 0;
  // Round up: a poll that wakes a hair early finds no round due.
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(next_ - now).count());
}

uint32_t Sampler::round(Clock::time_point now, const std::function<bool(uint32_t)>& sample) {
  if (!enabled() || now < next_) return 0;
  next_ = now + o_.period;
  uint32_t n = 0;
  for (uint32_t seen = 0; seen < count_ && n < o_.units; ++seen) {
    const uint32_t u = cursor_;
    cursor_ = (cursor_ + 1) % count_;
    if (sample(u)) ++n;
  }
  return n;
}

}  // namespace airs::client
