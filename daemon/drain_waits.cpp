// SPDX-License-Identifier: Apache-2.0
#include "daemon/drain_waits.hpp"

#include <sys/epoll.h>

#include <spdlog/spdlog.h>

namespace airs::daemon {

Result<std::unique_ptr<DrainWaits>> DrainWaits::create(sys::EventLoop& loop, std::chrono::milliseconds limit) {
  auto t = sys::OneShotTimer::create();
  if (!t) return std::move(t).error();
  std::unique_ptr<DrainWaits> w(new DrainWaits(loop, std::move(t).value(), limit));
  AIRS_TRY(loop.add(w->timer_.fd(), EPOLLIN, [p = w.get()](uint32_t) {
    p->timer_.acknowledge();
    p->on_timer();
  }));
  return w;
}

DrainWaits::~DrainWaits() {
  refuse_all("the daemon is shutting down");
  loop_.remove(timer_.fd());
}

void DrainWaits::park(Call c) {
  spdlog::info("{}: waits for the reads in flight of unloaded models (at most {} ms), the loop serves on", c.what,
               limit_.count());
  parked_.push_back(Parked{std::move(c), Clock::now() + limit_});
  arm();
}

void DrainWaits::pages_returned() {
  if (retrying_) {
    again_ = true;
    return;
  }
  retrying_ = true;
  do {
    again_ = false;
    // Calls parked by a retry (none: a retry answers or stays) or left
    // over are kept in order.
    auto waiting = std::move(parked_);
    parked_.clear();
    for (auto& p : waiting)
      if (!p.call.retry()) parked_.push_back(std::move(p));
  } while (again_ && !parked_.empty());
  retrying_ = false;
  arm();
}

void DrainWaits::caller_left(const std::string& name) {
  const auto n = std::erase_if(parked_, [&](const Parked& p) { return !p.call.caller.empty() && p.call.caller == name; });
  if (n > 0) spdlog::info("{} waiting call(s) of {} dropped: it left the bus", n, name);
}

void DrainWaits::refuse_all(const std::string& why) {
  auto waiting = std::move(parked_);
  parked_.clear();
  for (auto& p : waiting) p.call.refuse(make_error(ECANCELED, "{}: {}", p.call.what, why));
}

void DrainWaits::refuse_bus_calls(const std::string& why) {
  std::vector<Parked> refused;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (!it->call.caller.empty()) {
      refused.push_back(std::move(*it));
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& p : refused) p.call.refuse(make_error(ECANCELED, "{}: {}", p.call.what, why));
}

void DrainWaits::on_timer() {
  const auto now = Clock::now();
  std::vector<Parked> late;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->deadline <= now) {
      late.push_back(std::move(*it));
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& p : late) {
    spdlog::warn("{}: refused, the pages it needs were still held by reads in flight after {} ms", p.call.what,
                 limit_.count());
    p.call.refuse(make_error(ENOMEM,
                             "{}: pool exhausted: the pages it needs are those of unloaded models whose reads were "
                             "still in flight after {} ms (a slow or stalled disk); try again",
                             p.call.what, limit_.count()));
  }
  arm();
}

void DrainWaits::arm() {
  if (parked_.empty()) return;  // a stale expiry finds nothing late
  auto first = parked_.front().deadline;
  for (const auto& p : parked_) first = std::min(first, p.deadline);
  const auto delay = std::max<Clock::duration>(first - Clock::now(), std::chrono::milliseconds(1));
  if (auto st = timer_.arm(delay); !st) spdlog::error("drain waits: {}", st.error().message);
}

}  // namespace airs::daemon
