#include "sys/numa.hpp"

#include <numa.h>
#include <numaif.h>

#include <cerrno>
#include <cstring>

namespace airs::sys {

int numa_node_count() {
  if (::numa_available() < 0) return 1;
  const int n = ::numa_num_configured_nodes();
  return n < 1 ? 1 : n;
}

namespace {

struct ModeMask {
  int mode = MPOL_DEFAULT;
  unsigned long mask = 0;  // nodes 0..63: enough for every board we target
};

ModeMask mode_mask(NumaPolicy policy, const std::vector<int>& nodes) {
  ModeMask m;
  const int count = numa_node_count();
  if (nodes.empty()) {
    for (int i = 0; i < count && i < 64; ++i) m.mask |= 1UL << i;
  } else {
    for (int n : nodes)
      if (n >= 0 && n < 64) m.mask |= 1UL << n;
  }
  switch (policy) {
    case NumaPolicy::Local: m.mode = MPOL_LOCAL; m.mask = 0; break;
    case NumaPolicy::Bind: m.mode = MPOL_BIND; break;
    case NumaPolicy::Interleave: m.mode = MPOL_INTERLEAVE; break;
  }
  return m;
}

}  // namespace

Status numa_bind_range(void* addr, uint64_t len, NumaPolicy policy, const std::vector<int>& nodes) {
  if (numa_node_count() <= 1) return {};
  const ModeMask m = mode_mask(policy, nodes);
  if (::mbind(addr, len, m.mode, m.mask == 0 ? nullptr : &m.mask, m.mask == 0 ? 0 : 64, 0) != 0)
    return make_error(errno, "mbind of {} bytes: {}", len, std::strerror(errno));
  return {};
}

ScopedThreadPolicy::ScopedThreadPolicy(NumaPolicy policy, const std::vector<int>& nodes) {
  if (numa_node_count() <= 1) return;
  const ModeMask m = mode_mask(policy, nodes);
  active_ = ::set_mempolicy(m.mode, m.mask == 0 ? nullptr : &m.mask, m.mask == 0 ? 0 : 64) == 0;
}

ScopedThreadPolicy::~ScopedThreadPolicy() {
  if (active_) ::set_mempolicy(MPOL_DEFAULT, nullptr, 0);
}

}  // namespace airs::sys
