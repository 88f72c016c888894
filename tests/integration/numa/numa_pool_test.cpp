// SPDX-License-Identifier: Apache-2.0
// The pool's NUMA policy on the real kernel: for each backend (hugetlbfs,
// shmem) and each policy (local, interleave over every node, bind to each
// node) a pool and a model region are made through the real backend, the
// region is touched through the daemon's mapping, and /proc/self/numa_maps
// must show the policy on that mapping and every page on the policy's
// nodes. KV pages (fallocated under the thread's policy) are checked
// through a second mapping of the arena file. Written for any node count:
// on this one-node VM everything is N0; on a Pi with numa=fake=8 the
// interleave spread is checked to within one page per node.
#include <numaif.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pool/hugetlbfs_backend.hpp"
#include "pool/pool.hpp"
#include "pool/shmem_backend.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/numa.hpp"
#include "sys/numa_maps.hpp"

namespace airs {
namespace {

using sys::NumaPolicy;

enum class Backing { Hugetlbfs, Shmem };

std::vector<int> memory_nodes() {
  auto n = sys::read_node_list(sys::kNodeHasMemory);
  return n ? *n : std::vector<int>{};
}

// The node "local" must place pages on: the first node with CPUs, where the
// test thread is pinned.
int local_node() {
  auto c = sys::read_node_list(sys::kNodeHasCpu);
  return c && !c->empty() ? c->front() : 0;
}

struct Pinned {
  explicit Pinned(int node) { ok = sys::run_on_node(node).ok(); }
  ~Pinned() { (void)sys::run_on_all_nodes(); }
  bool ok = false;
};

class NumaPoolTest : public ::testing::TestWithParam<Backing> {
 protected:
  void SetUp() override {
    if (GetParam() == Backing::Hugetlbfs) {
      auto ps = sys::default_huge_page_size();
      if (!ps || *ps == 0) GTEST_SKIP() << "this kernel has no hugetlbfs (no Hugepagesize in /proc/meminfo)";
      page_ = *ps;
      kernel_page_ = *ps;
    } else {
      page_ = 2ULL << 20;
      kernel_page_ = sys::base_page_size();
    }
    nodes_ = memory_nodes();
    ASSERT_FALSE(nodes_.empty());
    // At least two pool pages per node so interleave has something to spread.
    pages_ = std::max<uint64_t>(8, 2 * nodes_.size());
  }

  Result<std::unique_ptr<pool::PoolBackend>> backend(NumaPolicy p, const std::vector<int>& nodes) {
    if (GetParam() == Backing::Hugetlbfs) {
      pool::HugetlbfsOptions o;
      o.numa_policy = p;
      o.numa_nodes = nodes;
      auto b = pool::HugetlbfsBackend::create(o);
      if (!b) return std::move(b).error();
      return std::unique_ptr<pool::PoolBackend>(std::move(b).value());
    }
    pool::ShmemOptions o;
    o.unit = page_;
    o.numa_policy = p;
    o.numa_nodes = nodes;
    auto b = pool::ShmemBackend::create(o);
    if (!b) return std::move(b).error();
    return std::unique_ptr<pool::PoolBackend>(std::move(b).value());
  }

  // Huge pages are per node: a node without enough free ones would make the
  // fault SIGBUS rather than fail the test. Says why it cannot run, or "".
  std::string short_of_huge_pages(const std::vector<int>& on, uint64_t per_node) {
    if (GetParam() != Backing::Hugetlbfs) return "";
    auto hp = sys::read_node_huge_pages(page_);
    if (!hp) return hp.error().message;
    for (const auto& n : *hp)
      if (std::find(on.begin(), on.end(), n.node) != on.end() && n.free < per_node)
        return "node " + std::to_string(n.node) + " has " + std::to_string(n.free) + " free huge pages, need " +
               std::to_string(per_node) + " (raise nodeN/hugepages/.../nr_hugepages)";
    return "";
  }

  // Every page on `allowed`; with interleave, spread evenly (within one page).
  void expect_placement(const sys::NumaMapsEntry& e, const std::vector<int>& allowed, bool interleave,
                        uint64_t expect_pages, const std::string& what) {
    EXPECT_EQ(e.pages(), expect_pages) << what << ": pages present in the mapping";
    for (const auto& [node, n] : e.node_pages)
      EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), node) != allowed.end())
          << what << ": " << n << " pages on node " << node << ", allowed " << sys::format_node_list(allowed);
    if (interleave) {
      uint64_t lo = UINT64_MAX;
      uint64_t hi = 0;
      for (int node : allowed) {
        const auto it = e.node_pages.find(node);
        const uint64_t n = it == e.node_pages.end() ? 0 : it->second;
        lo = std::min(lo, n);
        hi = std::max(hi, n);
      }
      EXPECT_LE(hi - lo, 1U) << what << ": interleave spread over " << sys::format_node_list(allowed);
    }
  }

  // One pool, one model region and one KV arena under `p` over `nodes`.
  void check(NumaPolicy p, const std::vector<int>& nodes) {
    const int here = local_node();
    Pinned pin(here);
    ASSERT_TRUE(pin.ok) << "cannot pin the test thread to node " << here;
    auto resolved = sys::resolve_numa_nodes(p, nodes);
    ASSERT_TRUE(resolved.ok()) << resolved.error().message;
    const std::vector<int> allowed = p == NumaPolicy::Local ? std::vector<int>{here} : *resolved;
    const uint64_t per_node = p == NumaPolicy::Interleave ? (pages_ + allowed.size() - 1) / allowed.size() : pages_;
    if (auto why = short_of_huge_pages(allowed, per_node); !why.empty()) GTEST_SKIP() << why;
    const std::string what = std::string(GetParam() == Backing::Hugetlbfs ? "hugetlbfs" : "shmem") + " " +
                             sys::to_string(p) + " " + sys::format_node_list(*resolved);

    auto b = backend(p, nodes);
    ASSERT_TRUE(b.ok()) << b.error().message;
    auto pl = pool::Pool::create(std::move(b).value(), {2 * pages_ * page_, false});
    ASSERT_TRUE(pl.ok()) << pl.error().message;
    auto& pool = *pl;

    // Model region: the daemon's mapping carries the policy, faults place.
    auto r = pool->create_model_region("numa-test", pages_ * page_);
    ASSERT_TRUE(r.ok()) << r.error().message;
    std::byte* data = (*r)->data();
    ASSERT_NE(data, nullptr);
    auto before = sys::numa_maps_entry(data);
    ASSERT_TRUE(before.ok()) << before.error().message;
    EXPECT_EQ(before->policy, sys::numa_maps_policy(p, *resolved)) << what;
    EXPECT_EQ(before->pages(), 0U) << what << ": nothing touched yet";
    std::memset(data, 0x5a, pages_ * page_);
    auto e = sys::numa_maps_entry(data);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(e->policy, sys::numa_maps_policy(p, *resolved)) << what;
    EXPECT_EQ(e->huge, GetParam() == Backing::Hugetlbfs) << what;
    EXPECT_EQ(e->page_size, kernel_page_) << what;
    expect_placement(*e, allowed, p == NumaPolicy::Interleave, pages_ * page_ / kernel_page_, what + " model");

    // KV arena: fallocate under the thread policy (hugetlbfs) or the file's
    // shared policy (shmem); a read-only view maps the existing pages.
    auto kv = pool->create_kv_region("numa-kv", pages_ * page_);
    ASSERT_TRUE(kv.ok()) << kv.error().message;
    ASSERT_TRUE(pool->alloc_pages(**kv, {0, pages_}).ok());
    auto view = sys::map_shared((*kv)->fd(), pages_ * page_, PROT_READ, MAP_NORESERVE, "KV view");
    ASSERT_TRUE(view.ok()) << view.error().message;
    uint64_t sum = 0;
    for (uint64_t off = 0; off < pages_ * page_; off += kernel_page_)
      sum += static_cast<uint64_t>(std::to_integer<uint8_t>(view->bytes()[off]));
    EXPECT_EQ(sum, 0U) << "fresh KV pages are zero";
    auto ke = sys::numa_maps_entry(view->bytes());
    ASSERT_TRUE(ke.ok()) << ke.error().message;
    // hugetlbfs: the view itself has no policy; shmem: the file's shows.
    EXPECT_EQ(ke->policy, GetParam() == Backing::Hugetlbfs ? "default" : sys::numa_maps_policy(p, *resolved)) << what;
    expect_placement(*ke, allowed, p == NumaPolicy::Interleave, pages_ * page_ / kernel_page_, what + " KV");
  }

  uint64_t page_ = 0;         // pool page
  uint64_t kernel_page_ = 0;  // numa_maps' unit for the pool's memory
  uint64_t pages_ = 0;
  std::vector<int> nodes_;
};

TEST_P(NumaPoolTest, LocalPlacesOnTheTouchingNode) { check(NumaPolicy::Local, {}); }

TEST_P(NumaPoolTest, InterleaveOverEveryNodeSpreadsEvenly) { check(NumaPolicy::Interleave, {}); }

TEST_P(NumaPoolTest, InterleaveOverAnExplicitList) { check(NumaPolicy::Interleave, {nodes_.back()}); }

TEST_P(NumaPoolTest, BindToEachNode) {
  for (int n : nodes_) {
    SCOPED_TRACE("bind to node " + std::to_string(n));
    check(NumaPolicy::Bind, {n});
    if (HasFatalFailure() || IsSkipped()) return;
  }
}

TEST_P(NumaPoolTest, BindToEveryNode) { check(NumaPolicy::Bind, {}); }

TEST_P(NumaPoolTest, ANodeThatIsNotOnlineIsRejectedByName) {
  const int missing = nodes_.back() + 1;
  for (NumaPolicy p : {NumaPolicy::Bind, NumaPolicy::Interleave}) {
    auto b = backend(p, {nodes_.front(), missing});
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.error().code, EINVAL);
    EXPECT_NE(b.error().message.find("node " + std::to_string(missing) + " "), std::string::npos)
        << b.error().message;
    EXPECT_NE(b.error().message.find(sys::format_node_list(nodes_)), std::string::npos) << b.error().message;
  }
}

// hugetlbfs: the kernel view carries this size's counters per node, and
// they add up to the global ones (read twice over if another process moved
// nr_hugepages in between).
TEST_P(NumaPoolTest, KernelViewHasPerNodeHugePages) {
  auto b = backend(NumaPolicy::Local, {});
  ASSERT_TRUE(b.ok()) << b.error().message;
  bool agreed = false;
  for (int attempt = 0; attempt < 5 && !agreed; ++attempt) {
    auto v = (*b)->kernel_view();
    ASSERT_TRUE(v.ok()) << v.error().message;
    if (GetParam() == Backing::Shmem) {
      EXPECT_TRUE(v->nodes.empty()) << "shmem has no per-node pool";
      return;
    }
    std::vector<int> seen;
    uint64_t total = 0;
    for (const auto& n : v->nodes) {
      seen.push_back(n.node);
      total += n.nr;
      EXPECT_LE(n.free, n.nr);
    }
    ASSERT_EQ(seen, nodes_);
    agreed = total == v->total;
  }
  EXPECT_TRUE(agreed) << "per-node nr_hugepages never added up to the global count";
}

INSTANTIATE_TEST_SUITE_P(Backends, NumaPoolTest, ::testing::Values(Backing::Hugetlbfs, Backing::Shmem),
                         [](const auto& pi) { return pi.param == Backing::Hugetlbfs ? "hugetlbfs" : "shmem"; });

// The thread policy used around fallocate is the thread's again afterwards,
// whatever it was (numactl --interleave, systemd NUMAPolicy=).
TEST(ScopedThreadPolicy, RestoresThePreviousPolicy) {
  const auto nodes = memory_nodes();
  auto outer = sys::ScopedThreadPolicy::apply(NumaPolicy::Interleave, nodes);
  ASSERT_TRUE(outer.ok()) << outer.error().message;
  auto mode = [] {
    int m = -1;
    unsigned long mask[4] = {};
    EXPECT_EQ(::get_mempolicy(&m, mask, sizeof(mask) * 8, nullptr, 0), 0) << std::strerror(errno);
    return m;
  };
  EXPECT_EQ(mode(), MPOL_INTERLEAVE);
  {
    auto inner = sys::ScopedThreadPolicy::apply(NumaPolicy::Bind, {nodes.front()});
    ASSERT_TRUE(inner.ok()) << inner.error().message;
    EXPECT_EQ(mode(), MPOL_BIND);
    auto moved = std::move(inner).value();  // the moved-from one must not restore
    EXPECT_EQ(mode(), MPOL_BIND);
  }
  EXPECT_EQ(mode(), MPOL_INTERLEAVE);
  {
    auto local = sys::ScopedThreadPolicy::apply(NumaPolicy::Local, {});
    ASSERT_TRUE(local.ok());
    EXPECT_EQ(mode(), MPOL_LOCAL);
  }
  EXPECT_EQ(mode(), MPOL_INTERLEAVE);
}

TEST(ScopedThreadPolicy, AnOfflineNodeIsAnErrorNotSilence) {
  const int missing = memory_nodes().back() + 1;
  auto p = sys::ScopedThreadPolicy::apply(NumaPolicy::Bind, {missing});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code, EINVAL);
  EXPECT_NE(p.error().message.find(std::to_string(missing)), std::string::npos) << p.error().message;
}

TEST(NumaBindRange, AnAnonymousMappingShowsThePolicyAndItsPages) {
  const uint64_t page = sys::base_page_size();
  // PROT_NONE guard pages either side: the VMA cannot merge with a
  // neighbour, so numa_maps counts only our 16 pages.
  void* g = ::mmap(nullptr, 18 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(g, MAP_FAILED);
  sys::Mapping m(g, 18 * page);
  void* p = static_cast<std::byte*>(g) + page;
  ASSERT_EQ(::mprotect(p, 16 * page, PROT_READ | PROT_WRITE), 0);
  const auto nodes = memory_nodes();
  ASSERT_TRUE(sys::numa_bind_range(p, 16 * page, NumaPolicy::Interleave, {}, "anon").ok());
  std::memset(p, 1, 16 * page);
  auto e = sys::numa_maps_entry(p);
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->policy, sys::numa_maps_policy(NumaPolicy::Interleave, nodes));
  EXPECT_EQ(e->pages(), 16U);
  auto bad = sys::numa_bind_range(p, 16 * page, NumaPolicy::Bind, {nodes.back() + 1}, "anon test mapping");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, EINVAL);
  EXPECT_NE(bad.error().message.find("anon test mapping"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("nodes with memory: " + sys::format_node_list(nodes)), std::string::npos)
      << bad.error().message;
}

}  // namespace
}  // namespace airs
