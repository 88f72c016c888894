// SPDX-License-Identifier: Apache-2.0
// Which pool.numa_policy to pick: for each policy — local,
// interleave over every node with memory, bind to each node — and each pool
// backend (hugetlbfs, shmem), a model region of --mib MiB is made through
// the real backend, filled from a thread on the first CPU node, and read
// sequentially (sum of uint64, best of --passes) from a thread on each node
// that has CPUs. One table, ratios against local from the same run.
//
// On a one-node machine every row is N0 and the ratios are ~1.0. On a
// Raspberry Pi 5 (the kernel splits memory into emulated nodes, or boot with
// numa=fake=8 in cmdline.txt; `cat /sys/devices/system/node/has_memory`)
// run it unchanged, as root, after reserving huge pages:
//   sudo scripts/hugepages.sh $((300 << 20)) && sudo build/bench/numa/numa_bench
// Interleave beating local there means the banks add bandwidth: set
// pool.numa_policy = "interleave".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "pool/hugetlbfs_backend.hpp"
#include "pool/pool.hpp"
#include "pool/shmem_backend.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/numa.hpp"
#include "sys/numa_maps.hpp"
#include "util/units.hpp"

namespace airs {
namespace {

using sys::NumaPolicy;

struct Case {
  NumaPolicy policy;
  std::vector<int> nodes;  // resolved
  std::string label;
};

struct Row {
  std::string policy;
  std::string backend;
  std::string placement;  // N0=.. N1=..
  int reader = 0;
  double gbps = 0;
};

Result<std::unique_ptr<pool::PoolBackend>> make_backend(const std::string& kind, const Case& c) {
  if (kind == "hugetlbfs") {
    pool::HugetlbfsOptions o;
    o.numa_policy = c.policy;
    o.numa_nodes = c.nodes;
    auto b = pool::HugetlbfsBackend::create(o);
    if (!b) return std::move(b).error();
    return std::unique_ptr<pool::PoolBackend>(std::move(b).value());
  }
  pool::ShmemOptions o;
  o.numa_policy = c.policy;
  o.numa_nodes = c.nodes;
  auto b = pool::ShmemBackend::create(o);
  if (!b) return std::move(b).error();
  return std::unique_ptr<pool::PoolBackend>(std::move(b).value());
}

// Four independent sums so the loop is bound by memory, not by one add chain.
uint64_t sum_words(const uint64_t* p, uint64_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

// Runs `fn` on a thread pinned to `node`; returns its status.
template <typename Fn>
Status on_node(int node, Fn&& fn) {
  Status st;
  std::thread t([&] {
    st = sys::run_on_node(node);
    if (st) fn();
  });
  t.join();
  return st;
}

Result<Row> run_case(const std::string& kind, const Case& c, uint64_t bytes, int passes, int fill_node, int reader) {
  auto b = make_backend(kind, c);
  if (!b) return std::move(b).error();
  auto pool = pool::Pool::create(std::move(b).value(), {bytes, false});
  if (!pool) return std::move(pool).error();
  auto r = (*pool)->create_model_region("numa-bench", bytes);
  if (!r) return std::move(r).error();
  auto* words = reinterpret_cast<uint64_t*>((*r)->data());
  const uint64_t n = bytes / sizeof(uint64_t);
  // The fill is the first touch: it places the pages.
  AIRS_TRY(on_node(fill_node, [&] {
    for (uint64_t i = 0; i < n; ++i) words[i] = i;
  }));
  auto e = sys::numa_maps_entry(words);
  if (!e) return std::move(e).error();
  Row row;
  row.policy = c.label;
  row.backend = kind;
  row.reader = reader;
  for (const auto& [node, pages] : e->node_pages)
    row.placement += (row.placement.empty() ? "" : " ") + fmt::format("N{}={}", node, pages);
  if (e->huge) row.placement += " (2M)";
  const uint64_t want = n * (n - 1) / 2;
  double best = 1e30;
  uint64_t got = 0;
  AIRS_TRY(on_node(reader, [&] {
    for (int p = 0; p < passes; ++p) {
      const auto t0 = std::chrono::steady_clock::now();
      got = sum_words(words, n);
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      best = std::min(best, dt.count());
    }
  }));
  if (got != want) return make_error(EIO, "{} {}: read back sum {} != {}: the region lost bytes", kind, c.label, got, want);
  row.gbps = static_cast<double>(bytes) / best / 1e9;
  return row;
}

int run(uint64_t mib, int passes, int rounds, const std::string& only) {
  auto mem = sys::read_node_list(sys::kNodeHasMemory);
  auto cpu = sys::read_node_list(sys::kNodeHasCpu);
  if (!mem || !cpu || mem->empty() || cpu->empty()) {
    std::fprintf(stderr, "cannot read the node lists in /sys/devices/system/node\n");
    return 1;
  }
  std::printf("nodes with memory: %s, with CPUs: %s; region %llu MiB, best of %d passes x %d rounds\n",
              sys::format_node_list(*mem).c_str(), sys::format_node_list(*cpu).c_str(),
              static_cast<unsigned long long>(mib), passes, rounds);
  std::vector<Case> cases{{NumaPolicy::Local, {}, "local"},
                          {NumaPolicy::Interleave, *mem, "interleave:" + sys::format_node_list(*mem)}};
  for (int n : *mem) cases.push_back({NumaPolicy::Bind, {n}, "bind:" + std::to_string(n)});
  std::vector<std::string> kinds;
  for (const char* k : {"hugetlbfs", "shmem"})
    if (only.empty() || only == k) kinds.emplace_back(k);
  const uint64_t bytes = mib * kMiB;
  std::vector<Row> rows;
  std::map<std::pair<std::string, int>, double> local;  // (backend, reader) -> GB/s
  int failures = 0;
  // Rounds over the whole set, best per row across them: noise from other
  // work on the machine then hits every policy alike instead of one row.
  // The case order rotates each round so no policy always runs first.
  rows.resize(kinds.size() * cases.size() * cpu->size());
  for (int round = 0; round < rounds; ++round) {
    for (size_t ki = 0; ki < kinds.size(); ++ki)
      for (size_t step = 0; step < cases.size(); ++step)
        for (size_t ri = 0; ri < cpu->size(); ++ri) {
          const size_t ci = (step + static_cast<size_t>(round)) % cases.size();
          const std::string& kind = kinds[ki];
          const Case& c = cases[ci];
          const int reader = (*cpu)[ri];
          const size_t k = (ki * cases.size() + ci) * cpu->size() + ri;
          auto row = run_case(kind, c, bytes, passes, cpu->front(), reader);
          if (!row) {
            std::fprintf(stderr, "%s %s reader node %d: %s\n", kind.c_str(), c.label.c_str(), reader,
                         row.error().message.c_str());
            ++failures;
            row = Row{c.label, kind, "failed", reader, 0};
          }
          if (round == 0) {
            rows[k] = std::move(row).value();
          } else {
            rows[k].gbps = std::max(rows[k].gbps, row->gbps);
          }
        }
  }
  for (const auto& r : rows)
    if (r.policy == "local") local[{r.backend, r.reader}] = r.gbps;
  std::printf("%-18s %-10s %-7s %-34s %8s %9s\n", "policy", "backend", "reader", "pages per node", "GB/s",
              "vs local");
  for (const auto& r : rows) {
    const auto it = local.find({r.backend, r.reader});
    const std::string ratio = it == local.end() ? "-" : fmt::format("{:.2f}", r.gbps / it->second);
    std::printf("%-18s %-10s N%-6d %-34s %8.2f %9s\n", r.policy.c_str(), r.backend.c_str(), r.reader,
                r.placement.c_str(), r.gbps, ratio.c_str());
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace airs

int main(int argc, char** argv) {
  CLI::App app{"pool NUMA policy: sequential read bandwidth per policy, backend and reading node"};
  uint64_t mib = 256;
  int passes = 5;
  int rounds = 3;
  std::string backend;
  app.add_option("--mib", mib, "region size in MiB")->check(CLI::PositiveNumber);
  app.add_option("--passes", passes, "read passes per row (best is reported)")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "times the whole table is measured (best per row)")->check(CLI::PositiveNumber);
  app.add_option("--backend", backend, "only this backend")->check(CLI::IsMember({"hugetlbfs", "shmem"}));
  CLI11_PARSE(app, argc, argv);
  return airs::run(mib, passes, rounds, backend);
}
