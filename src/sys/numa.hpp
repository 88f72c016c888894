// SPDX-License-Identifier: Apache-2.0
// NUMA placement of pool memory (mbind / set_mempolicy through libnuma's
// numaif.h). The configured policy is applied on every machine, one node
// included: MPOL_BIND / MPOL_INTERLEAVE over node 0 are valid there, so the
// policy shows in /proc/<pid>/numa_maps and the placement code is exercised
// on every machine, not only on multi-node boards (the Pi 5 kernel emulates
// several nodes to spread memory across its banks).
//
// Policies:
//   Local      MPOL_LOCAL: each page on the node of the CPU that first
//              touches it. Chosen over MPOL_DEFAULT so the pool's placement
//              is what the configuration says, whatever task policy the
//              daemon was started with (numactl, systemd NUMAPolicy=); it
//              shows as "local" in numa_maps.
//   Bind       MPOL_BIND over the nodes (empty = every node with memory).
//   Interleave MPOL_INTERLEAVE over the nodes (empty = every node with
//              memory): page i on the (i mod n)-th node.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sys/hugepage_knobs.hpp"
#include "util/result.hpp"

namespace airs::sys {

enum class NumaPolicy : uint8_t { Local, Bind, Interleave };

inline constexpr const char* kNodeHasMemory = "/sys/devices/system/node/has_memory";
inline constexpr const char* kNodeHasCpu = "/sys/devices/system/node/has_cpu";
inline constexpr const char* kNodeDir = "/sys/devices/system/node";

// "local" / "bind" / "interleave" (the config's spelling).
[[nodiscard]] const char* to_string(NumaPolicy p);
// The config's spelling back. Errors: EINVAL naming the three policies.
[[nodiscard]] Result<NumaPolicy> parse_numa_policy(std::string_view s);

// A sysfs/kernel node list ("0", "0-7", "0,2-3", "" = none) to ascending node
// numbers. Errors: EINVAL naming `what` and the bad text.
[[nodiscard]] Result<std::vector<int>> parse_node_list(std::string_view text, const std::string& what);
// The kernel's compact form of ascending `nodes` ("0-3,5"), as numa_maps and
// sysfs print it.
[[nodiscard]] std::string format_node_list(const std::vector<int>& nodes);
// Nodes listed in a sysfs node mask file (has_memory, has_cpu, online).
// A kernel without CONFIG_NUMA has no such file: that is node 0 alone.
[[nodiscard]] Result<std::vector<int>> read_node_list(const std::string& path);

// Number of nodes with memory (1 on a kernel without NUMA).
[[nodiscard]] int numa_node_count();

// The nodes a policy really uses: `nodes` itself, every node with memory
// (read from `has_memory`) when empty, nothing for Local. Errors: EINVAL
// when a node is not online with memory, naming it and listing the nodes
// that are, and saying where to change it (pool.numa_nodes).
[[nodiscard]] Result<std::vector<int>> resolve_numa_nodes(NumaPolicy policy, const std::vector<int>& nodes,
                                                          const std::string& has_memory = kNodeHasMemory);

// The policy string the kernel prints in numa_maps for `policy` over
// resolved `nodes` ("local", "bind:0-1", "interleave:0-7").
[[nodiscard]] std::string numa_maps_policy(NumaPolicy policy, const std::vector<int>& nodes);

// mbind [addr, addr+len) (a mapping not yet touched: placement applies to
// pages allocated after the call) to `policy` over `nodes` (empty = every
// node with memory). On shmem the policy is the file's (shared policy), on
// hugetlbfs the mapping's. Errors: mbind's, naming `what`, the policy and
// nodes, and the nodes that have memory.
[[nodiscard]] Status numa_bind_range(void* addr, uint64_t len, NumaPolicy policy, const std::vector<int>& nodes,
                                     const std::string& what);

// The calling thread's memory policy set for allocations that have no
// mapping (fallocate of a pool file); the previous policy is restored on
// destruction. Thread: the one that applied it (set_mempolicy is per
// thread); move it only within that thread.
class ScopedThreadPolicy {
 public:
  // Errors: set_mempolicy's / get_mempolicy's, naming the policy and nodes.
  [[nodiscard]] static Result<ScopedThreadPolicy> apply(NumaPolicy policy, const std::vector<int>& nodes);
  ~ScopedThreadPolicy();
  ScopedThreadPolicy(ScopedThreadPolicy&& o) noexcept;
  ScopedThreadPolicy& operator=(ScopedThreadPolicy&&) = delete;
  ScopedThreadPolicy(const ScopedThreadPolicy&) = delete;
  ScopedThreadPolicy& operator=(const ScopedThreadPolicy&) = delete;

 private:
  ScopedThreadPolicy() = default;
  bool active_ = false;
  int old_mode_ = 0;
  unsigned long old_mask_[4] = {};  // 256 nodes: more than any board we target
};

// Moves the calling thread onto the CPUs of `node` (sched_setaffinity via
// libnuma). Errors: EINVAL naming the node and the nodes that have CPUs.
[[nodiscard]] Status run_on_node(int node);
// Lets the calling thread run on every CPU again.
[[nodiscard]] Status run_on_all_nodes();

// One entry (sys/hugepage_knobs.hpp: NodeHugePages, the sysfs
// nodeN/hugepages/hugepages-<kB>kB/{nr,free,surplus}_hugepages) per node listed in `node_dir`/has_memory; none when there is no
// has_memory (a kernel without NUMA). Errors: a missing counter file (the
// kernel has no pages of that size), naming it.
[[nodiscard]] Result<std::vector<NodeHugePages>> read_node_huge_pages(uint64_t page_size,
                                                                       const std::string& node_dir = kNodeDir);

}  // namespace airs::sys
