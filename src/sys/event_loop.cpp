// SPDX-License-Identifier: Apache-2.0
#include "sys/event_loop.hpp"

#include <sys/signalfd.h>
#include <sys/timerfd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace airs::sys {

Result<std::unique_ptr<EventLoop>> EventLoop::create() {
  UniqueFd ep(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep) return make_error(errno, "epoll_create1: {}", std::strerror(errno));
  return std::unique_ptr<EventLoop>(new EventLoop(std::move(ep)));
}

Status EventLoop::add(int fd, uint32_t events, Callback cb) {
  if (handlers_.contains(fd)) return make_error(EEXIST, "fd {} is already in the event loop", fd);
  auto h = std::make_shared<Handler>(Handler{std::move(cb), next_generation_++});
  epoll_event ev{};
  ev.events = events;
  // The generation travels with the event so an fd number reused after a
  // remove() within one epoll batch is not dispatched to the new handler.
  ev.data.u64 = (h->generation << 32) | static_cast<uint32_t>(fd);
  if (::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
    return make_error(errno, "epoll_ctl(ADD, fd {}): {}", fd, std::strerror(errno));
  handlers_.emplace(fd, std::move(h));
  return {};
}

Status EventLoop::modify(int fd, uint32_t events) {
  auto it = handlers_.find(fd);
  if (it == handlers_.end()) return make_error(ENOENT, "fd {} is not in the event loop", fd);
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = (it->second->generation << 32) | static_cast<uint32_t>(fd);
  if (::epoll_ctl(ep_.get(), EPOLL_CTL_MOD, fd, &ev) != 0)
    return make_error(errno, "epoll_ctl(MOD, fd {}): {}", fd, std::strerror(errno));
  return {};
}

void EventLoop::remove(int fd) {
  auto it = handlers_.find(fd);
  if (it == handlers_.end()) return;
  // EBADF/ENOENT are fine: the owner may have closed the fd already, which
  // removes it from the epoll set by itself.
  ::epoll_ctl(ep_.get(), EPOLL_CTL_DEL, fd, nullptr);
  handlers_.erase(it);
}

Result<int> EventLoop::run_once(std::chrono::milliseconds timeout) {
  epoll_event events[64];
  const int t = timeout.count() < 0 ? -1 : static_cast<int>(timeout.count());
  int n = ::epoll_wait(ep_.get(), events, 64, t);
  ++wakeups_;
  if (n < 0) {
    if (errno == EINTR) return 0;
    return make_error(errno, "epoll_wait: {}", std::strerror(errno));
  }
  for (int i = 0; i < n; ++i) {
    const int fd = static_cast<int>(events[i].data.u64 & 0xffffffffu);
    const uint64_t gen = events[i].data.u64 >> 32;
    auto it = handlers_.find(fd);
    if (it == handlers_.end() || (it->second->generation & 0xffffffffu) != gen) continue;
    auto h = it->second;  // keep alive across a self-remove
    h->cb(events[i].events);
  }
  return n;
}

Status EventLoop::run() {
  while (!stopping_) {
    auto r = run_once(std::chrono::milliseconds(-1));
    if (!r) return std::move(r).error();
  }
  return {};
}

Result<PeriodicTimer> PeriodicTimer::create(std::chrono::nanoseconds period) {
  UniqueFd fd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!fd) return make_error(errno, "timerfd_create: {}", std::strerror(errno));
  itimerspec its{};
  its.it_interval.tv_sec = static_cast<time_t>(period.count() / 1'000'000'000);
  its.it_interval.tv_nsec = static_cast<long>(period.count() % 1'000'000'000);
  its.it_value = its.it_interval;
  if (::timerfd_settime(fd.get(), 0, &its, nullptr) != 0)
    return make_error(errno, "timerfd_settime: {}", std::strerror(errno));
  return PeriodicTimer(std::move(fd));
}

uint64_t PeriodicTimer::acknowledge() {
  uint64_t n = 0;
  if (::read(fd_.get(), &n, sizeof n) != static_cast<ssize_t>(sizeof n)) return 0;
  return n;
}

Result<OneShotTimer> OneShotTimer::create() {
  UniqueFd fd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!fd) return make_error(errno, "timerfd_create: {}", std::strerror(errno));
  return OneShotTimer(std::move(fd));
}

Status OneShotTimer::arm(std::chrono::nanoseconds delay) {
  const int64_t ns = std::max<int64_t>(delay.count(), 1);  // 0 would disarm
  itimerspec its{};
  its.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
  its.it_value.tv_nsec = static_cast<long>(ns % 1'000'000'000);
  if (::timerfd_settime(fd_.get(), 0, &its, nullptr) != 0)
    return make_error(errno, "timerfd_settime: {}", std::strerror(errno));
  armed_ = true;
  return {};
}

void OneShotTimer::acknowledge() {
  uint64_t n = 0;
  (void)!::read(fd_.get(), &n, sizeof n);
  armed_ = false;
}

Result<SignalSource> SignalSource::create(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  if (::pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return make_error(EINVAL, "pthread_sigmask failed");
  UniqueFd fd(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!fd) return make_error(errno, "signalfd: {}", std::strerror(errno));
  return SignalSource(std::move(fd));
}

int SignalSource::read_signal() {
  signalfd_siginfo si{};
  if (::read(fd_.get(), &si, sizeof si) != static_cast<ssize_t>(sizeof si)) return 0;
  return static_cast<int>(si.ssi_signo);
}

}  // namespace airs::sys
