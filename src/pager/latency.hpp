// SPDX-License-Identifier: Apache-2.0
// Fault-to-resume latency of a model's lazy clients, as the daemon sees it
// (fault event read → CONTINUE done), by kind of fault.
#pragma once

#include <array>
#include <cstdint>

namespace airs::pager {

struct LatencyHistogram {
  static constexpr std::array<uint64_t, 12> kUpperUs{10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000, 100000};
  std::array<uint64_t, kUpperUs.size() + 1> counts{};  // last: above the last bound
  uint64_t samples = 0;
  uint64_t sum_us = 0;
  void add(uint64_t us) {
    size_t i = 0;
    while (i < kUpperUs.size() && us > kUpperUs[i]) ++i;
    ++counts[i];
    ++samples;
    sum_us += us;
  }
};

struct LatencyStats {
  uint64_t faults = 0;         // fault events (duplicates included) and cooperative requests (not a repeated ask)
  uint64_t faults_waited = 0;  // on units not ready yet
  LatencyHistogram ready;      // faults on ready units
  LatencyHistogram waited;     // faults that waited for a read
};

}  // namespace airs::pager
