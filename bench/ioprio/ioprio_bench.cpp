// SPDX-License-Identifier: Apache-2.0
// A client's fault latency while a second model warms up, with the pager's
// per-read I/O priorities (fault best-effort 0, warm-up idle) or without
// (every read at the process's priority). One run of one side; the script
// (bench_ioprio.sh) runs both on a device whose scheduler holds requests
// and prints the ratio.
//
// The in-process daemon (pool + pager on a loop thread, as bench/load)
// loads the warm-up model, waits until its warm-up reads fill the device's
// queue, loads the client's model and maps it lazily; the client then
// touches units from the end of its model (the warm-up starts at the
// front), one at a time with a pause between, and times each touch the
// pager had to read for (its faults_waited count moved). Prints the
// latencies' p50 and p99.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench_common.hpp"
#include "client/lazy_map.hpp"

namespace {

using namespace airs::bench;

airs::pager::ModelId load(LoopThread& lt, airs::pager::Pager& pager, const std::string& name, const std::string& path,
                          uint64_t size, uint64_t unit) {
  return lt.call([&] {
    airs::pager::ModelSpec spec;
    spec.name = name;
    spec.gguf = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!spec.gguf) die("cannot open " + path);
    spec.file_size = size;
    // One layer per unit: a fault reads its own unit (a fault reads its
    // whole layer), so each timed fault is one read.
    const uint64_t layers = size / unit;
    for (uint32_t i = 0; i < layers; ++i) spec.extents.push_back({i * unit, unit, i});
    auto id = pager.load(std::move(spec));
    if (!id) die(id.error().message);
    return *id;
  });
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fault latency while another model warms up, with and without per-read I/O priorities"};
  std::string client_path, warm_path;
  uint64_t client_mib = 256, warm_mib = 512;
  bool priorities = true;
  unsigned faults = 24;
  unsigned think_ms = 10;
  bool verbose = false;
  app.add_option("--client-file", client_path, "the client's model (created if its size differs)")->required();
  app.add_option("--warm-file", warm_path, "the model warming up (created if its size differs)")->required();
  app.add_option("--client-mib", client_mib, "size of the client's model, MiB");
  app.add_option("--warm-mib", warm_mib, "size of the warming model, MiB");
  app.add_option("--priorities", priorities, "1: per-read I/O priorities (the default), 0: none");
  app.add_option("--faults", faults, "faults to time");
  app.add_option("--think-ms", think_ms, "pause between the client's touches, ms");
  app.add_flag("--verbose", verbose, "print every touch");
  CLI11_PARSE(app, argc, argv);

  const uint64_t csize = client_mib << 20, wsize = warm_mib << 20;
  make_file(client_path, csize);
  make_file(warm_path, wsize);
  drop_caches();
  const uint64_t hp = std::move(airs::sys::default_huge_page_size()).value();
  const uint64_t pages = airs::pool::pages_for(csize, hp) + airs::pool::pages_for(wsize, hp);
  const std::string nr = "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(hp / 1024) + "kB/";
  const uint64_t nr0 = *airs::sys::read_u64_file(nr + "nr_hugepages");
  const uint64_t avail = *airs::sys::read_u64_file(nr + "free_hugepages") - *airs::sys::read_u64_file(nr + "resv_hugepages");
  if (avail < pages + 4) (void)airs::sys::write_text_file(nr + "nr_hugepages", std::to_string(nr0 + pages + 4 - avail));

  LoopThread lt;
  airs::pager::PagerOptions po;
  po.prefetch_window = 0;  // a fault reads its own layer, nothing ahead: its latency is the read's
  po.background_warmup = true;
  po.io_priorities = priorities;
  po.direct_io = airs::pager::DirectIo::On;
  auto backend = std::move(airs::pool::HugetlbfsBackend::create({})).value();
  auto pool = std::move(airs::pool::Pool::create(std::move(backend), {pages * hp, false})).value();
  auto pager = std::move(airs::pager::Pager::create(lt.loop(), *pool, po)).value();
  lt.start();

  const auto warm = load(lt, *pager, "warm", warm_path, wsize, hp);
  // The warm-up's reads in the device before the client comes.
  while (lt.call([&] { return pager->stats(warm)->units_ready; }) < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto cid = load(lt, *pager, "client", client_path, csize, hp);
  const int rfd = lt.call([&] { return pager->region_fd(cid); });
  const uint64_t rsize = lt.call([&] { return pager->region_size(cid); });
  auto lm = airs::client::LazyMapping::create(rfd, rsize, airs::client::LazyBacking::Hugetlbfs);
  if (!lm) die(lm.error().message);
  auto dup = std::move(lm->dup_uffd()).value();
  if (auto st = lt.call([&] { return pager->attach(cid, 1, ::getpid(), std::move(dup), UniqueFd(), lm->address(), lm->size()); });
      !st)
    die(st.error().message);

  std::vector<double> ms;
  const uint64_t units = csize / hp;
  unsigned touched = 0, warm_done_at = 0;
  for (uint64_t u = units; u-- > 0 && ms.size() < faults;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(think_ms));
    const auto before = lt.call([&] { return pager->stats(cid)->faults_waited; });
    const auto t = Clock::now();
    g_sink = *reinterpret_cast<const volatile uint64_t*>(lm->data() + u * hp);
    const double took = ms_since(t);
    ++touched;
    const auto s = lt.call([&] { return std::make_pair(pager->stats(cid)->faults_waited, pager->stats(warm)->state); });
    if (s.first != before) ms.push_back(took);
    if (verbose) {
      const auto c = lt.call([&] { return std::move(pager->stats(cid)).value(); });
      std::fprintf(stderr, "unit %lu: %.2f ms, faults_waited %lu -> %lu; client model %u of %u units ready, warm model %u\n",
                   static_cast<unsigned long>(u), took, static_cast<unsigned long>(before),
                   static_cast<unsigned long>(s.first), c.units_ready, c.units,
                   lt.call([&] { return pager->stats(warm)->units_ready; }));
    }
    if (s.second == airs::wire::ModelLoadState::Resident && warm_done_at == 0) warm_done_at = static_cast<unsigned>(ms.size());
  }
  const auto ws = lt.call([&] { return std::move(pager->stats(warm)).value(); });
  std::printf("priorities %s: faults %zu of %u touches, p50 %.1f ms, p99 %.1f ms, max %.1f ms; warm-up %.0f MB/s%s\n",
              priorities ? "on" : "off", ms.size(), touched, pct(ms, 0.5), pct(ms, 0.99),
              ms.empty() ? 0.0 : *std::max_element(ms.begin(), ms.end()), ws.read_mb_per_s,
              warm_done_at != 0 ? (" (warm model resident after fault " + std::to_string(warm_done_at) + ")").c_str() : "");
  lt.call([&] {
    pager.reset();
    return 0;
  });
  lt.stop();
  return 0;
}
