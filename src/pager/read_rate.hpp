// SPDX-License-Identifier: Apache-2.0
// A token bucket for the background warm-up's read rate: reads clients wait
// on (faults, the layer-ahead window) are never limited, only the warm-up
// that fills the rest of a model, so a device whose storage is shared (an SD
// card, a USB disk) keeps I/O for everything else. Pure: the caller passes
// the time, so it is tested without clocks.
#pragma once

#include <chrono>
#include <cstdint>

namespace airs::pager {

class ReadRate {
 public:
  using Clock = std::chrono::steady_clock;

  // bytes_per_s == 0: unlimited (take() always succeeds). `burst` is how
  // long a pause may be saved up and spent at once.
  ReadRate(uint64_t bytes_per_s, std::chrono::nanoseconds burst, Clock::time_point now);

  [[nodiscard]] bool unlimited() const { return rate_ == 0; }
  // Spends `bytes` if the bucket is not in debt at `now`. A read larger than
  // the bucket still goes (it leaves the bucket in debt), so the long-run
  // rate holds for any unit size.
  [[nodiscard]] bool take(uint64_t bytes, Clock::time_point now);
  // How long from `now` until take() can succeed (0 if it can now).
  [[nodiscard]] std::chrono::nanoseconds wait(Clock::time_point now);

 private:
  void refill(Clock::time_point now);
  uint64_t rate_;
  double cap_;      // bytes
  double tokens_;   // bytes; negative = debt
  Clock::time_point last_;
};

}  // namespace airs::pager
