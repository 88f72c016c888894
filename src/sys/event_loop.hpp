// SPDX-License-Identifier: Apache-2.0
// The daemon's one event loop: epoll over every fd the daemon waits on
// (signalfd, timerfd, bus fd, uffds, pidfds, io_uring eventfd, PSI triggers).
// Single-threaded: callbacks run on the thread that calls run()/run_once().
#pragma once

#include <sys/epoll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

class EventLoop {
 public:
  // Called with the epoll event mask (EPOLLIN, EPOLLPRI, EPOLLERR, ...).
  using Callback = std::function<void(uint32_t events)>;

  static Result<std::unique_ptr<EventLoop>> create();

  // Watch `fd` (not owned) for `events`. A callback may add or remove fds,
  // including its own. Errors: EEXIST if fd is already watched.
  Status add(int fd, uint32_t events, Callback cb);
  Status modify(int fd, uint32_t events);
  // Stop watching fd; safe to call from any callback, also for fds already
  // closed by their owner (call it before closing where you can).
  void remove(int fd);
  [[nodiscard]] bool watching(int fd) const { return handlers_.contains(fd); }

  // Wait at most `timeout` (negative = forever) and dispatch what is ready.
  // Returns the number of events dispatched.
  Result<int> run_once(std::chrono::milliseconds timeout);
  // run_once until stop() is called.
  Status run();
  void stop() { stopping_ = true; }
  [[nodiscard]] bool stopping() const { return stopping_; }
  // Times epoll_wait returned (events or not): an idle loop wakes a few
  // times per request, one that spins on a descriptor that stays ready
  // thousands of times a second, however slow the machine.
  [[nodiscard]] uint64_t wakeups() const { return wakeups_; }

 private:
  explicit EventLoop(UniqueFd ep) : ep_(std::move(ep)) {}
  struct Handler {
    Callback cb;
    uint64_t generation;
  };
  UniqueFd ep_;
  // shared_ptr so a callback that removes itself does not destroy the
  // std::function it is running in.
  std::unordered_map<int, std::shared_ptr<Handler>> handlers_;
  uint64_t next_generation_ = 1;
  bool stopping_ = false;
  uint64_t wakeups_ = 0;
};

// A timerfd (CLOCK_MONOTONIC) that fires every `period` once armed.
class PeriodicTimer {
 public:
  static Result<PeriodicTimer> create(std::chrono::nanoseconds period);
  [[nodiscard]] int fd() const { return fd_.get(); }
  // Reads the expiration count (call from the EPOLLIN callback).
  uint64_t acknowledge();

 private:
  explicit PeriodicTimer(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// A timerfd (CLOCK_MONOTONIC) that fires once per arm(); created disarmed.
class OneShotTimer {
 public:
  static Result<OneShotTimer> create();
  [[nodiscard]] int fd() const { return fd_.get(); }
  // (Re)arms to fire once after `delay` (at least 1 ns). Errors: timerfd_settime.
  [[nodiscard]] Status arm(std::chrono::nanoseconds delay);
  [[nodiscard]] bool armed() const { return armed_; }
  // Reads the expiration (call from the EPOLLIN callback); disarmed after.
  void acknowledge();

 private:
  explicit OneShotTimer(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
  bool armed_ = false;
};

// A signalfd for the given signals; they are blocked for the calling thread
// (call before any thread is created so all threads inherit the mask).
class SignalSource {
 public:
  static Result<SignalSource> create(std::initializer_list<int> signals);
  [[nodiscard]] int fd() const { return fd_.get(); }
  // Next pending signal number, or 0 if none.
  int read_signal();

 private:
  explicit SignalSource(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

}  // namespace airs::sys
