// SPDX-License-Identifier: Apache-2.0
// Finds the content id (gguf/content_id.hpp) of models whose file was not
// hashed before, off the loop: one worker thread reads the filled region
// (pread of the region fd: memory speed, no second read of the file) and
// posts the id back to the event loop. A model dropped while it is hashed
// is cancelled; its region is truncated then, so a late read just ends
// short and the result is discarded.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gguf/content_id.hpp"
#include "sys/event_loop.hpp"
#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class ContentHasher {
 public:
  // `done` runs on the loop thread, once per submitted key that was not
  // cancelled, with the id or the error.
  using Done = std::function<void(uint64_t key, Result<gguf::ContentId>)>;
  static Result<std::unique_ptr<ContentHasher>> create(sys::EventLoop& loop, Done done);
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;

  // Hashes the first `length` bytes of `fd` (owned from here). Loop thread.
  void submit(uint64_t key, sys::UniqueFd fd, uint64_t length);
  // Forgets `key`: queued work is dropped, a running hash stops, and `done`
  // is not called for it. Loop thread.
  void cancel(uint64_t key);
  [[nodiscard]] bool pending(uint64_t key) const;

 private:
  struct Job {
    uint64_t key;
    sys::UniqueFd fd;
    uint64_t length;
  };
  ContentHasher(sys::EventLoop& loop, sys::UniqueFd efd, Done done);
  void work();
  void on_ready();

  sys::EventLoop& loop_;
  sys::UniqueFd efd_;
  Done done_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<std::pair<uint64_t, Result<gguf::ContentId>>> results_;
  std::set<uint64_t> live_;  // submitted, not yet delivered or cancelled
  uint64_t running_ = 0;     // key being hashed (0: none)
  std::atomic<bool> cancel_running_{false};
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace airs::daemon
