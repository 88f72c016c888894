// SPDX-License-Identifier: Apache-2.0
#include "sys/numa.hpp"

#include <numa.h>
#include <numaif.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "sys/procfs.hpp"

namespace airs::sys {

namespace {

// Nodes 0..63 in one word; the kernel reads maxnode-1 bits, hence the +1.
constexpr int kMaxNodes = 64;
constexpr unsigned long kMaxNode = kMaxNodes + 1;

int mode_of(NumaPolicy p) {
  switch (p) {
    case NumaPolicy::Local: return MPOL_LOCAL;
    case NumaPolicy::Bind: return MPOL_BIND;
    case NumaPolicy::Interleave: return MPOL_INTERLEAVE;
  }
  return MPOL_DEFAULT;
}

Result<unsigned long> mask_of(const std::vector<int>& nodes) {
  unsigned long m = 0;
  for (int n : nodes) {
    if (n < 0 || n >= kMaxNodes)
      return make_error(EINVAL, "NUMA node {} is outside 0..{} (the nodes airs-memd can address)", n, kMaxNodes - 1);
    m |= 1UL << n;
  }
  return m;
}

std::string memory_nodes_text() {
  auto have = read_node_list(kNodeHasMemory);
  return have ? format_node_list(*have) : "unknown (" + have.error().message + ")";
}

}  // namespace

const char* to_string(NumaPolicy p) {
  switch (p) {
    case NumaPolicy::Local: return "local";
    case NumaPolicy::Bind: return "bind";
    case NumaPolicy::Interleave: return "interleave";
  }
  return "?";
}

Result<NumaPolicy> parse_numa_policy(std::string_view s) {
  for (NumaPolicy p : {NumaPolicy::Local, NumaPolicy::Bind, NumaPolicy::Interleave})
    if (s == to_string(p)) return p;
  return make_error(EINVAL, "NUMA policy '{}' is not one of local, bind, interleave", s);
}

Result<std::vector<int>> parse_node_list(std::string_view text, const std::string& what) {
  std::vector<int> out;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  const std::string_view whole = text;
  auto bad = [&] { return make_error(EINVAL, "{}: '{}' is not a node list (like 0-3,5)", what, whole); };
  auto number = [&](std::string_view s, int& v) {
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    return r.ec == std::errc() && r.ptr == s.data() + s.size() && v >= 0;
  };
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) return bad();
    const size_t dash = item.find('-');
    int lo = 0;
    int hi = 0;
    if (dash == std::string_view::npos) {
      if (!number(item, lo)) return bad();
      hi = lo;
    } else if (!number(item.substr(0, dash), lo) || !number(item.substr(dash + 1), hi) || hi < lo) {
      return bad();
    }
    for (int n = lo; n <= hi; ++n) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_node_list(const std::vector<int>& nodes) {
  std::string s;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j + 1 < nodes.size() && nodes[j + 1] == nodes[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(nodes[i]);
    if (j > i) s += '-' + std::to_string(nodes[j]);
    i = j + 1;
  }
  return s;
}

Result<std::vector<int>> read_node_list(const std::string& path) {
  auto t = read_text_file(path);
  if (!t) {
    // No /sys/devices/system/node: the kernel has no NUMA, all memory is node 0.
    if (t.error().code == ENOENT) return std::vector<int>{0};
    return std::move(t).error();
  }
  return parse_node_list(*t, path);
}

int numa_node_count() {
  auto n = read_node_list(kNodeHasMemory);
  return n && !n->empty() ? static_cast<int>(n->size()) : 1;
}

Result<std::vector<int>> resolve_numa_nodes(NumaPolicy policy, const std::vector<int>& nodes,
                                            const std::string& has_memory) {
  if (policy == NumaPolicy::Local) return std::vector<int>{};
  auto have = read_node_list(has_memory);
  if (!have) return std::move(have).error();
  if (nodes.empty()) return std::move(have).value();
  std::vector<int> out;
  for (int n : nodes) {
    if (!std::binary_search(have->begin(), have->end(), n))
      return make_error(EINVAL, "pool.numa_nodes: NUMA node {} is not online with memory (nodes with memory: {}, "
                                "from {}); fix pool.numa_nodes or leave it empty for all nodes",
                        n, format_node_list(*have), has_memory);
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string numa_maps_policy(NumaPolicy policy, const std::vector<int>& nodes) {
  if (policy == NumaPolicy::Local) return "local";
  return std::string(to_string(policy)) + ":" + format_node_list(nodes);
}

namespace {

// The nodes a policy uses (every node with memory when none are listed;
// none for Local) and their mask for mbind/set_mempolicy.
struct PolicyNodes {
  std::vector<int> nodes;
  unsigned long mask = 0;
};

Result<PolicyNodes> policy_nodes(NumaPolicy policy, const std::vector<int>& nodes) {
  PolicyNodes p{nodes, 0};
  if (policy != NumaPolicy::Local && p.nodes.empty()) {
    auto all = read_node_list(kNodeHasMemory);
    if (!all) return std::move(all).error();
    p.nodes = std::move(all).value();
  }
  auto mask = mask_of(policy == NumaPolicy::Local ? std::vector<int>{} : p.nodes);
  if (!mask) return std::move(mask).error();
  p.mask = *mask;
  return p;
}

}  // namespace

Status numa_bind_range(void* addr, uint64_t len, NumaPolicy policy, const std::vector<int>& nodes,
                       const std::string& what) {
  auto pn = policy_nodes(policy, nodes);
  if (!pn) return std::move(pn).error();
  const std::vector<int>& use = pn->nodes;
  const unsigned long m = pn->mask;
  if (::mbind(addr, len, mode_of(policy), m == 0 ? nullptr : &m, m == 0 ? 0 : kMaxNode, 0) != 0) {
    const int e = errno;
    return make_error(e, "{}: mbind of {} bytes to NUMA policy {}{}{} failed: {} (nodes with memory: {})", what, len,
                      to_string(policy), use.empty() ? "" : " over nodes ", format_node_list(use), std::strerror(e),
                      memory_nodes_text());
  }
  return {};
}

Result<ScopedThreadPolicy> ScopedThreadPolicy::apply(NumaPolicy policy, const std::vector<int>& nodes) {
  auto pn = policy_nodes(policy, nodes);
  if (!pn) return std::move(pn).error();
  const std::vector<int>& use = pn->nodes;
  ScopedThreadPolicy s;
  if (::get_mempolicy(&s.old_mode_, s.old_mask_, sizeof(s.old_mask_) * 8, nullptr, 0) != 0) {
    const int e = errno;
    return make_error(e, "get_mempolicy of the calling thread: {}", std::strerror(e));
  }
  const unsigned long m = pn->mask;
  if (::set_mempolicy(mode_of(policy), m == 0 ? nullptr : &m, m == 0 ? 0 : kMaxNode) != 0) {
    const int e = errno;
    return make_error(e, "set_mempolicy to NUMA policy {}{}{} failed: {} (nodes with memory: {})", to_string(policy),
                      use.empty() ? "" : " over nodes ", format_node_list(use), std::strerror(e), memory_nodes_text());
  }
  s.active_ = true;
  return s;
}

ScopedThreadPolicy::ScopedThreadPolicy(ScopedThreadPolicy&& o) noexcept
    : active_(o.active_), old_mode_(o.old_mode_) {
  std::copy(std::begin(o.old_mask_), std::end(o.old_mask_), std::begin(old_mask_));
  o.active_ = false;
}

ScopedThreadPolicy::~ScopedThreadPolicy() {
  if (!active_) return;
  // The mode may carry MPOL_F_{STATIC,RELATIVE}_NODES / NUMA_BALANCING
  // (linux/mempolicy.h, not in numaif.h): set_mempolicy takes them back the
  // same way. A mask is meaningless for default/local.
  constexpr int kModeFlags = (1 << 15) | (1 << 14) | (1 << 13);
  const int base = old_mode_ & ~kModeFlags;
  const bool no_mask = base == MPOL_DEFAULT || base == MPOL_LOCAL;
  (void)::set_mempolicy(old_mode_, no_mask ? nullptr : old_mask_, no_mask ? 0 : sizeof(old_mask_) * 8 + 1);
}

Status run_on_node(int node) {
  if (::numa_available() < 0) {
    if (node == 0) return {};
    return make_error(EINVAL, "NUMA node {}: this kernel has no NUMA, only node 0", node);
  }
  if (::numa_run_on_node(node) != 0) {
    const int e = errno;
    auto cpus = read_node_list(kNodeHasCpu);
    return make_error(e, "running the calling thread on NUMA node {}: {} (nodes with CPUs: {})", node,
                      std::strerror(e), cpus ? format_node_list(*cpus) : std::string("unknown"));
  }
  return {};
}

Status run_on_all_nodes() {
  if (::numa_available() < 0) return {};
  if (::numa_run_on_node(-1) != 0) {
    const int e = errno;
    return make_error(e, "letting the calling thread run on every NUMA node: {}", std::strerror(e));
  }
  return {};
}

Result<std::vector<NodeHugePages>> read_node_huge_pages(uint64_t page_size, const std::string& node_dir) {
  auto t = read_text_file(node_dir + "/has_memory");
  // No node directory: a kernel without NUMA has no per-node counters.
  if (!t && t.error().code == ENOENT) return std::vector<NodeHugePages>{};
  if (!t) return std::move(t).error();
  auto nodes = parse_node_list(*t, node_dir + "/has_memory");
  if (!nodes) return std::move(nodes).error();
  std::vector<NodeHugePages> out;
  for (int n : *nodes) {
    const std::string d =
        node_dir + "/node" + std::to_string(n) + "/hugepages/hugepages-" + std::to_string(page_size / 1024) + "kB/";
    NodeHugePages h;
    h.node = n;
    auto nr = read_u64_file(d + "nr_hugepages");
    if (!nr) return std::move(nr).error();
    auto fr = read_u64_file(d + "free_hugepages");
    if (!fr) return std::move(fr).error();
    auto sp = read_u64_file(d + "surplus_hugepages");
    if (!sp) return std::move(sp).error();
    h.nr = *nr;
    h.free = *fr;
    h.surplus = *sp;
    out.push_back(h);
  }
  return out;
}

}  // namespace airs::sys
