// NUMA placement of pool memory (libnuma). On a one-node machine every call
// is a no-op: the policy only matters where there are nodes to choose from
// (the Pi 5 kernel emulates several to spread memory across banks).
#pragma once

#include <cstdint>
#include <vector>

#include "util/result.hpp"

namespace airs::sys {

enum class NumaPolicy : uint8_t { Local, Bind, Interleave };

// Number of configured nodes; 1 when libnuma reports NUMA unavailable.
[[nodiscard]] int numa_node_count();

// mbind [addr, addr+len) (a mapping not yet touched) to `policy` over `nodes`
// (empty = all nodes). Errors: mbind's.
[[nodiscard]] Status numa_bind_range(void* addr, uint64_t len, NumaPolicy policy, const std::vector<int>& nodes);

// Sets the calling thread's memory policy for allocations that have no
// mapping (fallocate of a pool file) and restores the default on destruction.
class ScopedThreadPolicy {
 public:
  ScopedThreadPolicy(NumaPolicy policy, const std::vector<int>& nodes);
  ~ScopedThreadPolicy();
  ScopedThreadPolicy(const ScopedThreadPolicy&) = delete;
  ScopedThreadPolicy& operator=(const ScopedThreadPolicy&) = delete;

 private:
  bool active_ = false;
};

}  // namespace airs::sys
