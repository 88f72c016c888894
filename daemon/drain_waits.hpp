// SPDX-License-Identifier: Apache-2.0
// Calls that wait for pool pages on their way back: a LoadModel or a KV
// Allocate whose room is in the pages of an unloaded or evicted model whose
// reads are still in flight (Evictor::make_room says EINPROGRESS). Nothing
// blocks the loop for them: the call is parked here, its bus reply held
// (sdbus-c++ asynchronous server methods), and run again from the pager's
// drain event when pages come back. It is refused after `limit` (a timer on
// the loop), and forgotten when its caller leaves the bus. A parked call
// holds no pool pages: each run starts over (quota, plan, reservation), so
// one that is refused or forgotten leaks nothing (docs/retire.md).
// Loop thread only.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sys/event_loop.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class DrainWaits {
 public:
  struct Call {
    std::string caller;  // bus unique name; "" for the daemon's own (models.preload)
    std::string what;    // "LoadModel of 'name'", for the log and the refusal
    // Runs the call again and answers it. False while it still waits (its
    // room is still on the way: EINPROGRESS again); it stays parked then.
    std::function<bool()> retry;
    // Answers it with `e` instead (time-out, the daemon stopping).
    std::function<void(const Error& e)> refuse;
  };

  static Result<std::unique_ptr<DrainWaits>> create(sys::EventLoop& loop, std::chrono::milliseconds limit);
  ~DrainWaits();
  DrainWaits(const DrainWaits&) = delete;
  DrainWaits& operator=(const DrainWaits&) = delete;

  // Parks `c` (its first run said EINPROGRESS) until pages come back.
  void park(Call c);
  // A drain ended: every parked call runs again, oldest first.
  void pages_returned();
  // `name` left the bus: its parked calls go unanswered (nobody to answer).
  void caller_left(const std::string& name);
  // Every parked call is refused with `why` (ECANCELED).
  void refuse_all(const std::string& why);
  // Every parked bus call (not the daemon's own) is refused with `why`
  // (ECANCELED): the connection they came on is going.
  void refuse_bus_calls(const std::string& why);
  [[nodiscard]] size_t size() const { return parked_.size(); }
  [[nodiscard]] std::chrono::milliseconds limit() const { return limit_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Parked {
    Call call;
    Clock::time_point deadline;
  };
  DrainWaits(sys::EventLoop& loop, sys::OneShotTimer timer, std::chrono::milliseconds limit)
      : loop_(loop), timer_(std::move(timer)), limit_(limit) {}
  void on_timer();
  void arm();

  sys::EventLoop& loop_;
  sys::OneShotTimer timer_;
  std::chrono::milliseconds limit_;
  std::vector<Parked> parked_;
  bool retrying_ = false;  // a retry that ends another drain does not run the list twice at once
  bool again_ = false;
};

}  // namespace airs::daemon
