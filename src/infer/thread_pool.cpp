// SPDX-License-Identifier: Apache-2.0
#include "infer/thread_pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace airs::infer {

namespace {

// Share `index` of `parts` of [0, n), rounded to `grain`.
std::pair<size_t, size_t> share(size_t n, size_t grain, unsigned index, unsigned parts) {
  const size_t units = (n + grain - 1) / grain;
  const size_t begin = units * index / parts * grain;
  const size_t end = units * (index + 1) / parts * grain;
  return {std::min(begin, n), std::min(end, n)};
}

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A decode step dispatches ~30 mat-vecs a few hundred µs apart: waiting
// briefly by spinning saves a futex wake-up per dispatch; after this many
// polls the waiter sleeps on the condition variable.
constexpr int kSpinPolls = 4000;

}  // namespace

ThreadPool::ThreadPool(unsigned n_threads) {
  for (unsigned i = 1; i < std::max(1U, n_threads); ++i) {
    workers_.emplace_back([this, i] { worker(i); });
    const std::string name = "airs-infer-" + std::to_string(i);
    pthread_setname_np(workers_.back().native_handle(), name.c_str());
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  grain = std::max<size_t>(1, grain);
  const unsigned parts = size();
  if (parts == 1 || n <= grain) {
    if (n > 0) fn(0, n);
    return;
  }
  {
    std::lock_guard lk(mu_);
    job_ = &fn;
    n_ = n;
    grain_ = grain;
    pending_.store(parts - 1);
    generation_.fetch_add(1);
  }
  start_cv_.notify_all();
  const auto [b, e] = share(n, grain, 0, parts);
  if (b < e) fn(b, e);
  for (int i = 0; i < kSpinPolls && pending_.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return pending_.load() == 0; });
  }
}

void ThreadPool::worker(unsigned index) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinPolls && generation_.load(std::memory_order_acquire) == seen && !stop_.load(); ++i) {
      cpu_relax();
    }
    const std::function<void(size_t, size_t)>* job = nullptr;
    size_t n = 0;
    size_t grain = 1;
    {
      std::unique_lock lk(mu_);
      start_cv_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_.load()) return;
      seen = generation_.load();
      job = job_;
      n = n_;
      grain = grain_;
    }
    const auto [b, e] = share(n, grain, index, size());
    if (b < e) (*job)(b, e);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Last one: wake a caller that stopped spinning (under the lock, so the
      // wake cannot fall between its check and its wait).
      std::lock_guard lk(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace airs::infer
