// SPDX-License-Identifier: Apache-2.0
// What the load benchmarks share: the loop thread the pager runs on (the
// in-process "daemon"), a generated model file, cache dropping and a
// compute stand-in. Header-only; benchmarks only.
#pragma once

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pager/pager.hpp"
#include "pool/hugetlbfs_backend.hpp"
#include "pool/pool.hpp"
#include "pool/shmem_backend.hpp"
#include "sys/event_loop.hpp"
#include "sys/fd.hpp"
#include "sys/procfs.hpp"

namespace airs::bench {

using Clock = std::chrono::steady_clock;
using airs::sys::UniqueFd;

inline double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

inline double cpu_ms(clockid_t clock) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}
// CPU time of the calling thread / of the whole process (every thread,
// the pager's loop and its io_uring workers included), ms.
inline double thread_cpu_ms() { return cpu_ms(CLOCK_THREAD_CPUTIME_ID); }
inline double process_cpu_ms() { return cpu_ms(CLOCK_PROCESS_CPUTIME_ID); }

[[noreturn]] inline void die(const std::string& m) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, m.c_str());
  std::exit(1);
}

inline void drop_caches() {
  ::sync();
  if (!airs::sys::write_text_file("/proc/sys/vm/drop_caches", "3")) die("cannot drop caches (run as root)");
}

// A file of `size` bytes of a fixed pattern (reused if the size matches).
inline void make_file(const std::string& path, uint64_t size) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == size) return;
  UniqueFd fd(::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644));
  if (!fd) die("cannot create " + path);
  std::vector<uint64_t> buf(1 << 20);
  for (uint64_t off = 0; off < size; off += buf.size() * 8) {
    for (uint64_t i = 0; i < buf.size(); ++i) buf[i] = (off / 8 + i) * 0x9e3779b97f4a7c15ULL + 1;
    const uint64_t n = std::min<uint64_t>(buf.size() * 8, size - off);
    if (::pwrite(fd.get(), buf.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) die("write");
  }
  ::fsync(fd.get());
}

inline void spin(std::chrono::microseconds d) {
  const auto end = Clock::now() + d;
  while (Clock::now() < end) {
  }
}

inline volatile uint64_t g_sink;

// Runs closures on the daemon's loop thread (the pager is single-threaded).
class LoopThread {
 public:
  LoopThread() {
    loop_ = std::move(airs::sys::EventLoop::create()).value();
    efd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    (void)loop_->add(efd_.get(), EPOLLIN, [this](uint32_t) {
      uint64_t v;
      [[maybe_unused]] auto n = ::read(efd_.get(), &v, sizeof v);
      std::vector<std::function<void()>> q;
      {
        std::lock_guard l(mu_);
        q.swap(q_);
      }
      for (auto& f : q) f();
    });
  }
  void start() {
    t_ = std::thread([this] {
      while (!stop_) {
        (void)loop_->run_once(std::chrono::milliseconds(50));
        if (tick_) tick_();
      }
    });
  }
  template <typename F>
  auto call(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto fut = task.get_future();
    {
      std::lock_guard l(mu_);
      q_.emplace_back([&task] { task(); });
    }
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(efd_.get(), &one, sizeof one);
    return fut.get();
  }
  void stop() {
    stop_ = true;
    if (t_.joinable()) t_.join();
  }
  airs::sys::EventLoop& loop() { return *loop_; }
  std::function<void()> tick_;

 private:
  std::unique_ptr<airs::sys::EventLoop> loop_;
  UniqueFd efd_;
  std::mutex mu_;
  std::vector<std::function<void()>> q_;
  std::atomic<bool> stop_{false};
  std::thread t_;
};

// The in-process daemon: a pool just large enough for a `size`-byte model
// (hugetlbfs: full mode, else pinned shmem, with `shmem` options: memfds of
// base pages with huge_folios = false) and a pager on `lt`'s loop thread
// (started here), watching when the model it loads is resident.
// Destroy `pager` on the loop thread (lt.call) before stopping it.
struct BenchPager {
  BenchPager(LoopThread& lt, bool hugetlbfs, uint64_t size, airs::pager::PagerOptions po,
             airs::pool::ShmemOptions shmem = {}) {
    std::unique_ptr<airs::pool::PoolBackend> backend;
    if (hugetlbfs) {
      backend = std::move(airs::pool::HugetlbfsBackend::create({})).value();
    } else {
      auto b = std::move(airs::pool::ShmemBackend::create(std::move(shmem))).value();
      std::fprintf(stderr, "pool: %s\n", b->huge_folios_note().c_str());
      backend = std::move(b);
    }
    const uint64_t unit = backend->page_size();
    auto p = airs::pool::Pool::create(std::move(backend), {airs::pool::pages_for(size, unit) * unit, false});
    if (!p) die(p.error().message);
    pool = std::move(p).value();
    pager = std::move(airs::pager::Pager::create(lt.loop(), *pool, po)).value();
    lt.tick_ = [this] {
      if (id != 0 && resident_ms.load() < 0) {
        auto s = pager->stats(id);
        if (s && s->state == airs::wire::ModelLoadState::Resident) {
          resident_cpu_ms = thread_cpu_ms();  // on the loop thread: its CPU time for the whole fill
          resident_ms = ms_since(t0);
        }
      }
    };
    lt.start();
  }
  // Loads `path` (t0: now) on the loop thread.
  void load(LoopThread& lt, const std::string& path, uint64_t size, std::vector<airs::pager::Extent> extents,
            std::vector<uint32_t> warmup_order = {}, bool record = false) {
    t0 = Clock::now();
    cpu0 = process_cpu_ms();
    id = lt.call([&] {
      airs::pager::ModelSpec spec;
      spec.name = "bench";
      spec.gguf = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      spec.file_size = size;
      spec.extents = std::move(extents);
      spec.warmup_order = std::move(warmup_order);
      spec.record_access = record;
      return std::move(pager->load(std::move(spec))).value();
    });
  }
  // Milliseconds from the load to residency.
  double wait_resident() const {
    while (resident_ms.load() < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return resident_ms.load();
  }
  std::unique_ptr<airs::pool::Pool> pool;
  std::unique_ptr<airs::pager::Pager> pager;
  std::atomic<double> resident_ms{-1};
  std::atomic<double> resident_cpu_ms{-1};  // the loop thread's CPU time at residency
  double cpu0 = 0;                           // the process's CPU time at the load
  std::atomic<airs::pager::ModelId> id{0};
  Clock::time_point t0;
};

}  // namespace airs::bench
