// SPDX-License-Identifier: Apache-2.0
// Recorded access order against the static layer order: cold time
// to first token and time to resident of a synthetic client that touches
// what a first token needs, in the order it needs it, on the in-process
// Pool + Pager (the daemon's engine, on its own loop thread), one run:
//   static    layer-order warm-up (no recording kept)
//   first use the same, recording the access order (its cost)
//   replayed  a cold load replaying that recording
// Scenarios (a model of token_embd, N blk layers, output.weight):
//   vocab  untied output and a large vocabulary: the first token needs one
//          row of token_embd (a quarter of the file), every layer, output
//   moe    2 of 8 experts per layer (the rest of each layer is experts)
//   dense  every byte in layer order: the static order is right
// Medians of --reps cold loads (caches dropped, O_DIRECT). Run it under the
// SD-card throttle with bench/load/bench_order.sh. Needs root.
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_common.hpp"
#include "client/lazy_map.hpp"
#include "pager/pager.hpp"
#include "sys/hugetlbfs.hpp"

namespace {

using namespace airs::bench;

struct Range {
  uint64_t off, len;
};
// One step of the first token: bytes to read, then compute.
struct Step {
  std::vector<Range> reads;
};

struct Model {
  uint64_t size = 0;
  std::vector<airs::pager::Extent> extents;
  std::vector<Step> first_token;
};

// token_embd (embd_frac of the file), `layers` blk layers, output (1/20).
Model make_model(uint64_t size, unsigned layers, const std::string& scenario) {
  Model m;
  m.size = size;
  const double embd_frac = scenario == "dense" ? 0.05 : 0.25;
  const auto embd = static_cast<uint64_t>(static_cast<double>(size) * embd_frac);
  const uint64_t out = size / 20;
  const uint64_t blk = (size - embd - out) / layers;
  const uint64_t out_off = embd + layers * blk;
  m.extents.push_back({0, embd, 0});
  for (unsigned i = 0; i < layers; ++i) m.extents.push_back({embd + i * blk, blk, i + 1});
  m.extents.push_back({out_off, size - out_off, layers + 1});
  if (scenario == "dense") m.first_token.push_back({{{0, embd}}});
  else m.first_token.push_back({{{embd / 2, 4096}}});  // one token's row
  for (unsigned i = 0; i < layers; ++i) {
    const uint64_t b = embd + i * blk;
    if (scenario != "moe") {
      m.first_token.push_back({{{b, blk}}});
      continue;
    }
    // Attention first eighth, then 8 experts; the token routes to two of
    // them (a different pair per layer).
    const uint64_t attn = blk / 8, ex = (blk - attn) / 8;
    const uint64_t e1 = (i * 3) % 8, e2 = (i * 5 + 1) % 8 == e1 ? (e1 + 1) % 8 : (i * 5 + 1) % 8;
    m.first_token.push_back({{{b, attn}, {b + attn + e1 * ex, ex}, {b + attn + e2 * ex, ex}}});
  }
  m.first_token.push_back({{{out_off, size - out_off}}});
  return m;
}

struct Result {
  double ttft = 0, resident = 0;
  std::vector<uint32_t> order;  // recorded (first use only)
};

Result run(const std::string& path, const Model& model, bool hugetlbfs, std::chrono::microseconds compute,
           bool record, const std::vector<uint32_t>& replay) {
  drop_caches();
  LoopThread lt;
  BenchPager bp(lt, hugetlbfs, model.size, {});
  bp.load(lt, path, model.size, model.extents, replay, record);
  auto& pager = bp.pager;
  const airs::pager::ModelId id = bp.id;
  const Clock::time_point t0 = bp.t0;
  const int rfd = lt.call([&] { return pager->region_fd(id); });
  const uint64_t rsize = lt.call([&] { return pager->region_size(id); });
  auto lm = airs::client::LazyMapping::create(
      rfd, rsize, hugetlbfs ? airs::client::LazyBacking::Hugetlbfs : airs::client::LazyBacking::Shmem);
  if (!lm) die(lm.error().message);
  auto dup = std::move(lm->dup_uffd()).value();
  auto st = lt.call([&] { return pager->attach(id, 1, ::getpid(), std::move(dup), UniqueFd(), lm->address(), lm->size()); });
  if (!st) die(st.error().message);
  uint64_t sum = 0;
  for (const Step& s : model.first_token) {
    for (const Range& r : s.reads) {
      const auto* p = reinterpret_cast<const volatile uint64_t*>(lm->data() + r.off);
      for (uint64_t w = 0; w < r.len / 8; w += 8) sum += p[w];
    }
    spin(compute);
  }
  g_sink = sum;
  Result res;
  res.ttft = ms_since(t0);
  res.resident = bp.wait_resident();
  if (record) res.order = lt.call([&] { return std::move(pager->take_access_order(id)).value_or(std::vector<uint32_t>{}); });
  lt.call([&] {
    pager.reset();
    return 0;
  });
  lt.stop();
  return res;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cold time to first token: recorded access order vs static layer order"};
  std::string path = "/var/tmp/airs-order-bench.bin";
  uint64_t size_mib = 256;
  unsigned layers = 24;
  unsigned compute_us = 2000;
  unsigned reps = 3;
  std::string label = "fast disk";
  std::vector<std::string> scenarios{"vocab", "moe", "dense"};
  app.add_option("--file", path, "generated model file (reused if the size matches)");
  app.add_option("--size-mib", size_mib, "model size in MiB");
  app.add_option("--layers", layers, "blk layers");
  app.add_option("--compute-us", compute_us, "compute per layer of the first token, µs");
  app.add_option("--reps", reps, "cold loads per row (median)");
  app.add_option("--label", label, "what the disk is (printed)");
  app.add_option("--scenario", scenarios, "vocab, moe, dense");
  CLI11_PARSE(app, argc, argv);
  if (reps == 0) reps = 1;
  const uint64_t size = size_mib << 20;
  make_file(path, size);
  // Full mode when the huge pages are there, small-pages mode otherwise
  // (never grows nr_hugepages).
  const uint64_t hp = std::move(airs::sys::default_huge_page_size()).value();
  const std::string nr = "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(hp / 1024) + "kB/";
  auto sys_u64 = [&](const std::string& f) {
    auto v = airs::sys::read_u64_file(nr + f);
    return v ? *v : uint64_t{0};
  };
  const uint64_t avail = sys_u64("free_hugepages") - std::min(sys_u64("free_hugepages"), sys_u64("resv_hugepages"));
  const bool hugetlbfs = avail >= airs::pool::pages_for(size, hp) + 8;
  std::printf("%s: %lu MiB model, %u layers, %u µs compute per layer, %s pool, median of %u\n", label.c_str(),
              static_cast<unsigned long>(size_mib), layers, compute_us, hugetlbfs ? "hugetlbfs (full)" : "shmem (small-pages)",
              reps);
  std::printf("%-8s %-10s %10s %12s %10s\n", "scenario", "order", "TTFT ms", "resident ms", "TTFT/static");
  for (const std::string& sc : scenarios) {
    const Model model = make_model(size, layers, sc);
    const auto compute = std::chrono::microseconds(compute_us);
    std::vector<double> st_t, st_r, rec_t, rec_r, rep_t, rep_r;
    std::vector<uint32_t> order;
    for (unsigned i = 0; i < reps; ++i) {
      auto a = run(path, model, hugetlbfs, compute, false, {});
      st_t.push_back(a.ttft);
      st_r.push_back(a.resident);
      auto b = run(path, model, hugetlbfs, compute, true, {});
      rec_t.push_back(b.ttft);
      rec_r.push_back(b.resident);
      if (order.empty()) order = b.order;
      auto c = run(path, model, hugetlbfs, compute, false, order);
      rep_t.push_back(c.ttft);
      rep_r.push_back(c.resident);
    }
    const double base = median(st_t);
    std::printf("%-8s %-10s %10.0f %12.0f %10.2f\n", sc.c_str(), "static", base, median(st_r), 1.0);
    std::printf("%-8s %-10s %10.0f %12.0f %10.2f\n", sc.c_str(), "first use", median(rec_t), median(rec_r),
                median(rec_t) / base);
    std::printf("%-8s %-10s %10.0f %12.0f %10.2f   (%zu units recorded)\n", sc.c_str(), "replayed", median(rep_t),
                median(rep_r), median(rep_t) / base, order.size());
  }
  return 0;
}
