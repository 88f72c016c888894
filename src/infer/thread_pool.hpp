// SPDX-License-Identifier: Apache-2.0
// A small fixed pool for the mat-vec products: the caller creates it with n
// threads (named "airs-infer-N"), runs parallel_for from one thread at a
// time, and destroys it (joins). n = 1 runs everything on the caller.
// Waiting threads poll briefly (a few µs) before sleeping on a condition
// variable, since dispatches come in quick succession during a step.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace airs::infer {

class ThreadPool {
 public:
  // n_threads >= 1 counts the caller: n_threads - 1 workers are started.
  explicit ThreadPool(unsigned n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  [[nodiscard]] unsigned size() const noexcept { return static_cast<unsigned>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), the caller
  // taking one share; returns when all are done. fn must not throw. Ranges
  // are multiples of `grain` (except the last).
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void worker(unsigned index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<unsigned> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace airs::infer
