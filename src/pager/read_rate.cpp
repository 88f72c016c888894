// SPDX-License-Identifier: Apache-2.0
#include "pager/read_rate.hpp"

#include <algorithm>
#include <cmath>

namespace airs::pager {

ReadRate::ReadRate(uint64_t bytes_per_s, std::chrono::nanoseconds burst, Clock::time_point now)
    : rate_(bytes_per_s),
      cap_(static_cast<double>(bytes_per_s) * std::chrono::duration<double>(burst).count()),
      tokens_(0),
      last_(now) {}

void ReadRate::refill(Clock::time_point now) {
  if (now <= last_) return;
  const double dt = std::chrono::duration<double>(now - last_).count();
  tokens_ = std::min(cap_, tokens_ + dt * static_cast<double>(rate_));
  last_ = now;
}

bool ReadRate::take(uint64_t bytes, Clock::time_point now) {
  if (unlimited()) return true;
  refill(now);
  if (tokens_ < 0) return false;
  tokens_ -= static_cast<double>(bytes);
  return true;
}

std::chrono::nanoseconds ReadRate::wait(Clock::time_point now) {
  if (unlimited()) return std::chrono::nanoseconds(0);
  refill(now);
  if (tokens_ >= 0) return std::chrono::nanoseconds(0);
  // Round up so a timer set to this never fires a hair early.
  const double ns = std::ceil(-tokens_ / static_cast<double>(rate_) * 1e9);
  return std::chrono::nanoseconds(static_cast<int64_t>(ns) + 1);
}

}  // namespace airs::pager
