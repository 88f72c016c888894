// SPDX-License-Identifier: Apache-2.0
// Cold-cache model load, side by side in one run:
//   (a) read everything into anonymous memory, then run (llama.cpp --no-mmap)
//   (b) mmap MAP_SHARED|MAP_POPULATE (llama.cpp's default)
//   (c) plain mmap, demand paging
//   (d) airs lazy attach (Pool + Pager on a daemon thread, LazyMapping here)
//   limit: O_DIRECT sequential read at queue depth 16 into huge pages
// For each: time to first layer (token_embd + blk.0 touched), a simulated
// forward pass (every cache line of each layer read, then a fixed compute
// time per layer), time until fully resident, and a second client's pass.
// Plus fault→resume latency on ready pages: airs vs a minimal uffd handler.
// Needs root (drop_caches, nr_hugepages).
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/lazy_map.hpp"
#include "pager/pager.hpp"
#include "pool/hugetlbfs_backend.hpp"
#include "pool/shmem_backend.hpp"
#include "pool/pool.hpp"
#include "sys/event_loop.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/procfs.hpp"
#include "sys/uffd.hpp"
#include "sys/uring.hpp"
#include "bench_common.hpp"

namespace {

using namespace airs::bench;


struct Layer {
  uint64_t off, len;
};

std::string fmt_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", r);
  return buf;
}

// The simulated forward pass: read every cache line of each layer, then
// compute. Returns {time to first layer (layers 0 and 1), pass time} in ms.
std::pair<double, double> forward(const std::byte* base, const std::vector<Layer>& layers,
                                  std::chrono::microseconds compute, Clock::time_point t0,
                                  const std::function<void(size_t)>& before_layer = {}) {
  double first = 0;
  uint64_t sum = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (before_layer) before_layer(i);
    const auto* p = reinterpret_cast<const volatile uint64_t*>(base + layers[i].off);
    for (uint64_t w = 0; w < layers[i].len / 8; w += 8) sum += p[w];
    if (i == 1) first = ms_since(t0);
    spin(compute);
  }
  g_sink = sum;
  return {first, ms_since(t0)};
}

struct Row {
  char key = 0;  // the scenario's letter
  std::string name;
  double first = 0, pass = 0, resident = -1, second = 0;
  double proc_cpu = 0;   // the process's CPU time (all threads) from the start until the pass ended, ms
  double loop_cpu = -1;  // airs: the event loop thread's CPU time until resident, ms
};


double limit_odirect(const std::string& path, uint64_t size, uint64_t hp) {
  drop_caches();
  const unsigned qd = 16;
  void* buf = ::mmap(nullptr, qd * hp, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (buf == MAP_FAILED) die("huge page buffer for the O_DIRECT limit");
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
  auto ring = airs::sys::Ring::create(qd);
  if (!ring) die(ring.error().message);
  const auto t0 = Clock::now();
  uint64_t next = 0, done = 0;
  unsigned inflight = 0;
  while (done < size) {
    while (inflight < qd && next < size) {
      const unsigned slot = static_cast<unsigned>((next / hp) % qd);
      if (!ring->queue_read(fd.get(), static_cast<char*>(buf) + slot * hp, static_cast<uint32_t>(hp), next, 0)) break;
      next += hp;
      ++inflight;
    }
    (void)ring->submit();
    (void)ring->wait_and_reap([&](uint64_t, int32_t res) {
      if (res <= 0) die("O_DIRECT read failed");
      done += static_cast<uint64_t>(res);
      --inflight;
    });
  }
  const double ms = ms_since(t0);
  ::munmap(buf, qd * hp);
  return ms;
}

// Minimal userfaultfd handler: a thread answering MINOR faults with CONTINUE.
// Returns the median per-fault touch time in µs over `pages` huge pages.
double minimal_handler_latency(uint64_t hp, unsigned pages) {
  auto fd = airs::sys::create_hugetlb_file("", hp, "bench-minimal");
  if (!fd) die(fd.error().message);
  (void)airs::sys::resize_file(fd->get(), pages * hp, "bench");
  auto w = airs::sys::map_shared(fd->get(), pages * hp, PROT_READ | PROT_WRITE, 0, "bench");
  for (unsigned i = 0; i < pages; ++i) std::memset(w->bytes() + i * hp, 1, hp);
  auto r = airs::sys::map_shared(fd->get(), pages * hp, PROT_READ, 0, "bench");
  auto uffd = std::move(airs::sys::uffd_create()).value();
  (void)airs::sys::uffd_api(uffd.get(), UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS);
  const auto base = reinterpret_cast<uint64_t>(r->get());
  (void)airs::sys::uffd_register(uffd.get(), base, pages * hp,
                                 UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR);
  std::atomic<bool> stop{false};
  std::thread h([&] {
    pollfd p{uffd.get(), POLLIN, 0};
    while (!stop) {
      if (::poll(&p, 1, 20) != 1) continue;
      uffd_msg m;
      if (::read(uffd.get(), &m, sizeof m) != sizeof m) continue;
      const uint64_t a = m.arg.pagefault.address & ~(hp - 1);
      (void)airs::sys::uffd_continue(uffd.get(), a, hp, hp);
    }
  });
  std::vector<double> us;
  for (unsigned i = 0; i < pages; ++i) {
    const auto t0 = Clock::now();
    g_sink = *reinterpret_cast<const volatile uint64_t*>(r->bytes() + i * hp);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  stop = true;
  h.join();
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

struct Options {
  std::string path = "/var/tmp/airs-load-bench.bin";
  uint64_t size_mib = 1024;
  unsigned nlayers = 32;
  std::vector<unsigned> compute_us{0, 3000};
  uint32_t allocate_ahead = airs::pager::PagerOptions{}.allocate_ahead;
  bool memfd = false;
  bool copy_fill = airs::pager::PagerOptions{}.copy_fill;
  std::string only = "abcdef";
  [[nodiscard]] bool want(char key) const { return only.find(key) != std::string::npos; }
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--file", o.path, "generated model file (reused if the size matches)");
  app.add_option("--size-mib", o.size_mib, "model size in MiB (>= 1024 for the issue's numbers)");
  app.add_option("--layers", o.nlayers, "blk layers");
  app.add_option("--compute-us", o.compute_us, "compute time per layer, µs (one run per value)");
  app.add_option("--allocate-ahead", o.allocate_ahead, "pager: units allocated ahead of their reads (0 = off)");
  app.add_flag("--memfd", o.memfd, "shmem modes: memfds of base pages even where huge folios work (a kernel without "
                                   "transparent huge pages, as stock Raspberry Pi OS)");
  app.add_option("--copy-fill", o.copy_fill, "pager: fill base-page shmem by copy through a bounce buffer (1) or read "
                                             "into the region (0)");
  app.add_option("--only", o.only, "scenarios to run, by letter (e.g. \"ef\" for the shmem modes under a profiler)");
}

// token_embd, blk.0 .. blk.N-1, output: header in token_embd's rank.
std::vector<Layer> make_layers(uint64_t size, unsigned nlayers) {
  std::vector<Layer> layers;
  const uint64_t embd = size / 20, out = size / 20;
  const uint64_t blk = (size - embd - out) / nlayers;
  layers.push_back({0, embd});
  for (unsigned i = 0; i < nlayers; ++i) layers.push_back({embd + i * blk, blk});
  layers.push_back({embd + nlayers * blk, size - embd - nlayers * blk});
  return layers;
}

// Huge pages for the pool plus the limit's buffer, raised for the run and
// put back as they were at the end.
class HugePageReservation {
 public:
  HugePageReservation(uint64_t hp, uint64_t need)
      : nr_path_("/sys/kernel/mm/hugepages/hugepages-" + std::to_string(hp / 1024) + "kB/") {
    nr0_ = *airs::sys::read_u64_file(nr_path_ + "nr_hugepages");
    const uint64_t avail =
        *airs::sys::read_u64_file(nr_path_ + "free_hugepages") - *airs::sys::read_u64_file(nr_path_ + "resv_hugepages");
    raised_ = avail < need;
    if (raised_) (void)airs::sys::write_text_file(nr_path_ + "nr_hugepages", std::to_string(nr0_ + need - avail));
  }
  ~HugePageReservation() {
    if (raised_) (void)airs::sys::write_text_file(nr_path_ + "nr_hugepages", std::to_string(nr0_));
  }
  HugePageReservation(const HugePageReservation&) = delete;
  HugePageReservation& operator=(const HugePageReservation&) = delete;

 private:
  std::string nr_path_;
  uint64_t nr0_ = 0;
  bool raised_ = false;
};

// (a) read everything into anonymous memory, then run.
Row run_read_all(const Options& o, uint64_t size, const std::vector<Layer>& layers, std::chrono::microseconds compute) {
  drop_caches();
  Row r{'a', "(a) read all, then run"};
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_ms();
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  UniqueFd fd(::open(o.path.c_str(), O_RDONLY | O_CLOEXEC));
  for (uint64_t off = 0; off < size; off += 8 << 20)
    if (::pread(fd.get(), static_cast<char*>(m) + off, std::min<uint64_t>(8 << 20, size - off),
                static_cast<off_t>(off)) <= 0)
      die("pread");
  r.resident = ms_since(t0);
  std::tie(r.first, r.pass) = forward(static_cast<std::byte*>(m), layers, compute, t0);
  r.proc_cpu = process_cpu_ms() - cpu0;
  r.second = forward(static_cast<std::byte*>(m), layers, compute, Clock::now()).second;  // same process: no 2nd copy
  ::munmap(m, size);
  return r;
}

// (b) mmap MAP_POPULATE, or (c) plain mmap with demand paging.
Row run_mmap(const Options& o, uint64_t size, const std::vector<Layer>& layers, std::chrono::microseconds compute,
             bool populate) {
  drop_caches();
  Row r{populate ? 'b' : 'c', populate ? "(b) mmap MAP_POPULATE" : "(c) mmap, demand paging"};
  const auto t0 = Clock::now();
  const double cpu0 = process_cpu_ms();
  UniqueFd fd(::open(o.path.c_str(), O_RDONLY | O_CLOEXEC));
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd.get(), 0);
  if (populate) r.resident = ms_since(t0);
  std::tie(r.first, r.pass) = forward(static_cast<std::byte*>(m), layers, compute, t0);
  r.proc_cpu = process_cpu_ms() - cpu0;
  void* m2 = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  r.second = forward(static_cast<std::byte*>(m2), layers, compute, Clock::now()).second;
  ::munmap(m2, size);
  ::munmap(m, size);
  return r;
}

// Ready-page fault latency: zap the PTEs of a lazy mapping whose pages are
// all in; the next touch is a MINOR fault the daemon answers with CONTINUE.
// The median over `pages` huge pages, in µs.
double ready_fault_latency(const std::byte* data, uint64_t hp, unsigned pages) {
  ::madvise(const_cast<std::byte*>(data), pages * hp, MADV_DONTNEED);
  std::vector<double> us;
  for (unsigned i = 0; i < pages; ++i) {
    const auto ts = Clock::now();
    g_sink = *reinterpret_cast<const volatile uint64_t*>(data + i * hp);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - ts).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// (d) airs lazy on hugetlbfs (full mode); (e) the same on a pinned shmem
// pool (small-pages mode); (f) cooperative mode: no userfaultfd, the client
// waits per layer on the status page. Same file, same run.
enum class AirsMode { Full, SmallPages, Cooperative };

struct AirsRun {
  const Options& o;
  uint64_t size;
  const std::vector<Layer>& layers;
  const std::vector<airs::pager::Extent>& extents;
  std::chrono::microseconds compute;
  uint64_t hp;
  unsigned latency_pages;
  double* ready_us;  // set by the first full-mode run

  Row run(char letter, const char* label, AirsMode mode) const {
    drop_caches();
    Row r{letter, label};
    LoopThread lt;
    airs::pager::PagerOptions po;
    po.uffd_clients = mode != AirsMode::Cooperative;
    po.allocate_ahead = o.allocate_ahead;
    po.copy_fill = o.copy_fill;
    airs::pool::ShmemOptions so;
    so.huge_folios = !o.memfd;
    BenchPager bp(lt, mode == AirsMode::Full, size, po, so);
    bp.load(lt, o.path, size, extents);
    if (mode == AirsMode::Cooperative) cooperative(lt, bp, r);
    else lazy(lt, bp, r, mode);
    auto& pager = bp.pager;
    auto s = lt.call([&] { return std::move(pager->stats(bp.id)).value(); });
    std::printf("%s: %.0f MB/s warm-up (%s), %lu faults, %lu waited\n", label, s.read_mb_per_s,
                s.direct_io ? "O_DIRECT" : "buffered", static_cast<unsigned long>(s.faults),
                static_cast<unsigned long>(s.faults_waited));
    lt.call([&] {
      pager.reset();
      return 0;
    });
    lt.stop();
    r.loop_cpu = bp.resident_cpu_ms.load();
    return r;
  }

  void cooperative(LoopThread& lt, BenchPager& bp, Row& r) const {
    auto& pager = bp.pager;
    const int rfd = lt.call([&] { return pager->region_fd(bp.id); });
    const uint64_t rsize = lt.call([&] { return pager->region_size(bp.id); });
    const int sfd = lt.call([&] { return pager->status_fd(bp.id); });
    struct stat sst {};
    ::fstat(sfd, &sst);
    void* sp = ::mmap(nullptr, static_cast<size_t>(sst.st_size), PROT_READ, MAP_SHARED, sfd, 0);
    airs::wire::StatusPageView view(sp, static_cast<uint64_t>(sst.st_size));
    auto ro = std::move(airs::client::map_region_readonly(rfd, rsize)).value();
    auto wait = [&](size_t layer) {
      if (auto w = airs::client::wait_rank(view, static_cast<uint32_t>(layer), std::chrono::seconds(600)); !w)
        die(w.error().message);
    };
    std::tie(r.first, r.pass) = forward(ro.bytes(), layers, compute, bp.t0, wait);
    r.proc_cpu = process_cpu_ms() - bp.cpu0;
    r.resident = bp.wait_resident();
    auto ro2 = std::move(airs::client::map_region_readonly(rfd, rsize)).value();
    r.second = forward(ro2.bytes(), layers, compute, Clock::now()).second;
    ::munmap(sp, static_cast<size_t>(sst.st_size));
  }

  void lazy(LoopThread& lt, BenchPager& bp, Row& r, AirsMode mode) const {
    auto& pager = bp.pager;
    const int rfd = lt.call([&] { return pager->region_fd(bp.id); });
    const uint64_t rsize = lt.call([&] { return pager->region_size(bp.id); });
    const auto backing =
        mode == AirsMode::Full ? airs::client::LazyBacking::Hugetlbfs : airs::client::LazyBacking::Shmem;
    auto attach = [&](airs::pager::ClientKey key) {
      auto lm = airs::client::LazyMapping::create(rfd, rsize, backing);
      if (!lm) die(lm.error().message);
      auto dup = std::move(lm->dup_uffd()).value();
      auto st = lt.call([&] {
        return pager->attach(bp.id, key, ::getpid(), std::move(dup), UniqueFd(), lm->address(), lm->size());
      });
      if (!st) die(st.error().message);
      return std::move(lm).value();
    };
    auto lm = attach(1);
    std::tie(r.first, r.pass) = forward(lm.data(), layers, compute, bp.t0);
    r.proc_cpu = process_cpu_ms() - bp.cpu0;
    r.resident = bp.wait_resident();
    auto lm2 = attach(2);
    r.second = forward(lm2.data(), layers, compute, Clock::now()).second;
    if (mode == AirsMode::Full && *ready_us == 0) *ready_us = ready_fault_latency(lm2.data(), hp, latency_pages);
  }
};

// One compute time's table: each row, its ratios, and the targets.
void print_rows(const std::vector<Row>& rows, unsigned cus, size_t nlayers, double limit_ms) {
  const double total_compute = static_cast<double>(cus) * static_cast<double>(nlayers) / 1000.0;
  std::printf("\ncompute per layer %u µs (total compute %.1f ms), limit read %.1f ms\n", cus, total_compute, limit_ms);
  auto row = [&](char key) -> const Row* {
    for (const Row& r : rows)
      if (r.key == key) return &r;
    return nullptr;
  };
  // Ratios against (a) (the first load targets), (b) (llama.cpp's default
  // load) and, for the shmem modes, (d) full mode.
  auto ratio = [](double a, const Row* ref, double Row::*field) {
    return ref != nullptr && ref->*field > 0 ? fmt_ratio(a / (ref->*field)) : std::string("-");
  };
  std::printf("%-26s %12s %12s %12s %14s %9s %9s %9s %9s %12s %8s\n", "scenario", "1st layer ms", "pass ms",
              "resident ms", "2nd pass ms", "1st/(a)", "pass/(a)", "pass/(b)", "pass/(d)", "loop cpu ms", "cpu ms");
  for (const Row& r : rows)
    std::printf("%-26s %12.1f %12.1f %12s %14.1f %9s %9s %9s %9s %12s %8.0f\n", r.name.c_str(), r.first, r.pass,
                r.resident < 0 ? "n/a" : std::to_string(static_cast<int>(r.resident)).c_str(), r.second,
                ratio(r.first, row('a'), &Row::first).c_str(), ratio(r.pass, row('a'), &Row::pass).c_str(),
                ratio(r.pass, row('b'), &Row::pass).c_str(), ratio(r.pass, row('d'), &Row::pass).c_str(),
                r.loop_cpu < 0 ? "-" : std::to_string(static_cast<int>(r.loop_cpu)).c_str(), r.proc_cpu);
  const Row* d = row('d');
  if (d == nullptr) return;  // the targets are for the full mode
  // A second client's pass reads every cache line of the model as well as
  // computing: "compute alone" leaves that memory traffic out, which any
  // pass pays, even (a)'s over memory the process already holds. So the
  // 0-fault pass is also compared with (a)'s second pass (the same reads
  // and compute over resident anonymous memory).
  std::printf("targets (d): 1st layer/(a) %s (<= 0.1); warm-up speed vs limit %.2f (>= 0.8); pass/max(limit, "
              "compute) %.2f (<= 1.15); 2nd pass/compute %s, 2nd pass/(a) 2nd pass %s (<= 1.1)\n",
              ratio(d->first, row('a'), &Row::first).c_str(), limit_ms / d->resident,
              d->pass / std::max(limit_ms, total_compute),
              total_compute > 0 ? fmt_ratio(d->second / total_compute).c_str() : "n/a",
              ratio(d->second, row('a'), &Row::second).c_str());
  for (char k : {'e', 'f'})
    if (const Row* x = row(k); x != nullptr)
      std::printf("target %s: pass/(d) %s (<= 1.2)\n", x->name.c_str(), fmt_ratio(x->pass / d->pass).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cold-cache model load: read-all vs MAP_POPULATE vs mmap vs airs lazy"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);

  const uint64_t size = o.size_mib << 20;
  const uint64_t hp = std::move(airs::sys::default_huge_page_size()).value();
  make_file(o.path, size);
  const std::vector<Layer> layers = make_layers(size, o.nlayers);
  std::vector<airs::pager::Extent> extents;
  for (uint32_t i = 0; i < layers.size(); ++i) extents.push_back({layers[i].off, layers[i].len, i});
  const HugePageReservation reserved(hp, airs::pool::pages_for(size, hp) + 32);

  // Ready-page fault latency samples: 64 huge pages, or as many as the model
  // has (with 32 MiB pages 64 would be 2 GiB, past a small model's region).
  const unsigned latency_pages = static_cast<unsigned>(std::min<uint64_t>(64, size / hp));
  const double limit_ms = limit_odirect(o.path, size, hp);
  std::printf("file %s: %lu MiB, %u layers, huge page %lu KiB, allocate ahead %u\n", o.path.c_str(),
              static_cast<unsigned long>(o.size_mib), o.nlayers, static_cast<unsigned long>(hp / 1024),
              o.allocate_ahead);
  std::printf("limit: O_DIRECT QD16 sequential read: %.1f ms (%.0f MB/s)\n\n", limit_ms,
              static_cast<double>(size) / 1e3 / limit_ms);

  double airs_ready_us = 0;
  for (unsigned cus : o.compute_us) {
    const auto compute = std::chrono::microseconds(cus);
    std::vector<Row> rows;
    if (o.want('a')) rows.push_back(run_read_all(o, size, layers, compute));
    for (bool populate : {true, false})
      if (o.want(populate ? 'b' : 'c')) rows.push_back(run_mmap(o, size, layers, compute, populate));
    const AirsRun airs{o, size, layers, extents, compute, hp, latency_pages, &airs_ready_us};
    if (o.want('d')) rows.push_back(airs.run('d', "(d) airs lazy (full)", AirsMode::Full));
    if (o.want('e')) rows.push_back(airs.run('e', "(e) airs small-pages", AirsMode::SmallPages));
    if (o.want('f')) rows.push_back(airs.run('f', "(f) airs cooperative", AirsMode::Cooperative));
    print_rows(rows, cus, layers.size(), limit_ms);
  }
  const double minimal_us = minimal_handler_latency(hp, latency_pages);
  std::printf("\nready-page fault→resume (median of %u): airs %.1f µs, minimal handler %.1f µs, ratio %.2f (<= 1.5)\n",
              latency_pages, airs_ready_us, minimal_us, airs_ready_us / minimal_us);
  return 0;
}
