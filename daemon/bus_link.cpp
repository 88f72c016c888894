// SPDX-License-Identifier: Apache-2.0
#include "daemon/bus_link.hpp"

#include <sys/epoll.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "dbus/names.hpp"
#include "sys/notify.hpp"

namespace airs::daemon {
namespace {
// "System.Error.ENOTCONN" and the like: sd-bus's errno, for the log.
std::string describe(const sdbus::Error& e) { return fmt::format("{} ({})", e.getMessage(), e.getName()); }
}  // namespace

Result<std::unique_ptr<BusLink>> BusLink::create(sys::EventLoop& loop, std::string address, Hooks hooks) {
  auto t = sys::OneShotTimer::create();
  if (!t) return std::move(t).error();
  std::unique_ptr<BusLink> l(new BusLink(loop, std::move(t).value(), std::move(address), std::move(hooks)));
  AIRS_TRY(loop.add(l->timer_.fd(), EPOLLIN, [p = l.get()](uint32_t) {
    p->timer_.acknowledge();
    p->on_timer();
  }));
  return l;
}

BusLink::BusLink(sys::EventLoop& loop, sys::OneShotTimer timer, std::string address, Hooks hooks)
    : loop_(loop), timer_(std::move(timer)), address_(std::move(address)), hooks_(std::move(hooks)),
      state_since_(Clock::now()) {}

BusLink::~BusLink() {
  stop();
  loop_.remove(timer_.fd());
}

Status BusLink::start(config::NoBus no_bus) {
  if (no_bus == config::NoBus::Fail) {
    // No socket, or a refused one, fails here: sdbus-c++ leaks its half-made
    // sd_bus when its own connect fails, so it is asked only once the
    // connection can at least start.
    if (auto p = dbus::BusProbe::start(address_); !p)
      return make_error(p.error().code,
                        "cannot serve {} on the bus at {}: {}. Is a D-Bus daemon running there? "
                        "(daemon.start_without_bus = \"fail\": not waiting for it)",
                        dbus::kBusName, address_, p.error().message);
    if (auto st = open(true); !st)
      return make_error(st.error().code, "{} (daemon.start_without_bus = \"fail\": not waiting for it)",
                        st.error().message);
    return {};
  }
  attempt();
  return {};
}

std::unique_ptr<sdbus::IConnection> BusLink::open_connection() const {
  if (address_ == "system") return sdbus::createSystemBusConnection();
  if (address_ == "session") return sdbus::createSessionBusConnection();
  return sdbus::createSessionBusConnectionWithAddress(address_);
}

void BusLink::attempt() {
  if (stopped_ || conn_ || probe_) return;
  auto p = dbus::BusProbe::start(address_);
  if (!p) return attempt_failed(p.error().message);
  probe_ = std::move(p).value();
  probe_fd_ = probe_->fd();
  if (auto st = loop_.add(probe_fd_, probe_->events(), [this](uint32_t) { on_probe(); }); !st) {
    drop_probe();
    return attempt_failed(st.error().message);
  }
  if (auto st = timer_.arm(kAttemptLimit); !st) spdlog::error("bus: {}", st.error().message);
}

void BusLink::on_probe() {
  if (!probe_) return;
  auto ready = probe_->advance();
  if (!ready) {
    drop_probe();
    return attempt_failed(ready.error().message);
  }
  if (!*ready) {
    (void)loop_.modify(probe_fd_, probe_->events());
    return;
  }
  // The bus answered: the real connection's handshake is one round trip.
  drop_probe();
  const bool at_start = !ever_connected_;
  if (auto st = open(at_start); !st) {
    if (at_start && st.error().code == EACCES) return hooks_.fatal(st.error());
    attempt_failed(st.error().message);
  }
}

void BusLink::drop_probe() {
  if (!probe_) return;
  loop_.remove(probe_fd_);
  probe_fd_ = -1;
  probe_.reset();
}

void BusLink::on_timer() {
  if (stopped_ || conn_) return;
  if (probe_) {
    drop_probe();
    return attempt_failed(fmt::format("the bus at {} accepted the connection but did not answer within {} ms",
                                      address_, kAttemptLimit.count()));
  }
  attempt();
}

Status BusLink::open(bool at_start) {
  std::unique_ptr<sdbus::IConnection> c;
  try {
    c = open_connection();
  } catch (const sdbus::Error& e) {
    return make_error(EIO, "cannot serve {} on the bus at {}: connecting: {}. Is a D-Bus daemon running there?",
                      dbus::kBusName, address_, describe(e));
  }
  sdbus::IConnection::PollData pd{};
  std::string unique;
  try {
    hooks_.attach(*c);
    c->requestName(dbus::kBusName);
    pd = c->getEventLoopPollData();
    unique = c->getUniqueName();
  } catch (const sdbus::Error& e) {
    // Objects made on it go before it does.
    hooks_.detach(false);
    c.reset();
    // The bus is there but does not let us serve: at start that is a
    // configuration to fix, not a bus to wait for.
    return make_error(at_start ? EACCES : EIO,
                      "cannot serve {} on the bus at {}: {}. Does the bus policy let this user own the name "
                      "(install systemd/org.aios.Airs1.conf), and is no other airs-memd serving it?",
                      dbus::kBusName, address_, describe(e));
  }
  if (auto st = loop_.add(pd.fd, static_cast<uint32_t>(pd.events), [this](uint32_t) { dispatch(); }); !st) {
    hooks_.detach(false);
    return st;
  }
  conn_ = std::move(c);
  conn_fd_ = pd.fd;
  unique_name_ = unique;
  // (A deadline or retry still armed finds a connection and does nothing.)
  const bool again = ever_connected_;
  const auto offline = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - state_since_);
  const uint64_t attempts = failed_attempts_ + 1;
  failed_attempts_ = 0;
  ever_connected_ = true;
  set_state(State::Connected);
  if (again) {
    last_offline_ms_ = static_cast<uint64_t>(offline.count());
    spdlog::info("serving {} on {} as {} again, after {} ms without the bus ({} attempt(s)); clients of the lost "
                 "bus keep what they hold until their processes exit",
                 dbus::kBusName, address_, unique, offline.count(), attempts);
    sys::notify(fmt::format("STATUS=serving {} on {} (reconnected after losing the bus {} time(s))", dbus::kBusName,
                            address_, losses_));
  } else {
    if (attempts > 1)
      spdlog::info("the bus at {} answered after {} ms ({} attempts)", address_, offline.count(), attempts);
    spdlog::info("serving {} on {} as {}", dbus::kBusName, address_, unique);
    sys::notify(fmt::format("READY=1\nSTATUS=serving {} on {}", dbus::kBusName, address_));
  }
  return {};
}

std::chrono::milliseconds BusLink::backoff() const {
  const uint64_t shift = std::min<uint64_t>(failed_attempts_ == 0 ? 0 : failed_attempts_ - 1, 5);
  const auto delay = std::chrono::milliseconds(kFirstRetry.count() << shift);
  return std::min(delay, kMaxRetry);
}

void BusLink::attempt_failed(const std::string& why) {
  if (stopped_) return;
  ++failed_attempts_;
  last_error_ = why;
  const auto next = backoff();
  if (state_ == State::Waiting && failed_attempts_ == 1)
    spdlog::warn("no bus yet: {}; the daemon serves without it and connects as soon as it answers, trying again "
                 "with backoff (daemon.start_without_bus = \"wait\")",
                 why);
  else
    spdlog::debug("bus: attempt {} failed: {}; next in {} ms", failed_attempts_, why, next.count());
  if (auto st = timer_.arm(next); !st) spdlog::error("bus: {}", st.error().message);
  notify_waiting(next);
}

void BusLink::notify_waiting(std::chrono::milliseconds next) const {
  if (state_ == State::Lost)
    sys::notify(fmt::format("STATUS=lost the bus at {} ({}); serving faults and fills meanwhile; reconnecting: "
                            "attempt {} failed ({}), next in {} ms",
                            address_, last_loss_, failed_attempts_, last_error_, next.count()));
  else
    sys::notify(fmt::format("STATUS=waiting for the bus at {}: attempt {} failed ({}), next in {} ms", address_,
                            failed_attempts_, last_error_, next.count()));
}

void BusLink::lose(const std::string& why) {
  if (!conn_) return;
  loop_.remove(conn_fd_);
  conn_fd_ = -1;
  ++losses_;
  last_loss_ = why;
  failed_attempts_ = 0;
  set_state(State::Lost);
  spdlog::warn("lost the bus at {}: {}. Faults, fills, pressure and the watchdog go on; calls in flight fail for "
               "their callers; reconnecting with backoff",
               address_, why);
  // Everything made on the connection goes before it does.
  hooks_.detach(true);
  conn_.reset();
  unique_name_.clear();
  if (auto st = timer_.arm(kFirstRetry); !st) spdlog::error("bus: {}", st.error().message);
  sys::notify(fmt::format("STATUS=lost the bus at {} ({}); serving faults and fills meanwhile; reconnecting in {} ms",
                          address_, why, kFirstRetry.count()));
}

int BusLink::prepare() {
  if (!conn_) return -1;
  try {
    // sd-bus may want POLLOUT or have a timeout pending: refresh before waiting.
    const auto pd = conn_->getEventLoopPollData();
    (void)loop_.modify(conn_fd_, static_cast<uint32_t>(pd.events));
    return pd.getPollTimeout();
  } catch (const sdbus::Error& e) {
    lose("getting its poll data: " + describe(e));
    return -1;
  }
}

void BusLink::dispatch() {
  if (!conn_) return;
  // Handlers run here, on the loop thread.
  try {
    while (conn_->processPendingRequest()) {
    }
  } catch (const sdbus::Error& e) {
    lose("processing bus requests: " + describe(e));
  } catch (const std::exception& e) {
    // Only an exception a handler let through sd-bus gets here: it left
    // sd-bus mid-dispatch, so the connection cannot be used any more.
    lose(fmt::format("a bus handler let an exception through sd-bus ({}); the connection is unusable", e.what()));
  }
}

void BusLink::call_failed(const std::string& what, const sdbus::Error& e) const {
  spdlog::warn("bus: {}: {}", what, describe(e));
}

void BusLink::set_state(State s) {
  state_ = s;
  state_since_ = Clock::now();
}

BusStatus BusLink::status() const {
  BusStatus s;
  s.address = address_;
  s.state = state_ == State::Connected ? "connected" : state_ == State::Lost ? "lost" : "waiting";
  s.unique_name = unique_name_;
  s.state_for_ms =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - state_since_).count());
  s.losses = losses_;
  s.failed_attempts = failed_attempts_;
  s.last_loss = last_loss_;
  s.last_error = last_error_;
  s.last_offline_ms = last_offline_ms_;
  return s;
}

void BusLink::stop() {
  if (stopped_) return;
  stopped_ = true;
  drop_probe();
  if (!conn_) return;
  try {
    conn_->releaseName(dbus::kBusName);
  } catch (const sdbus::Error& e) {
    spdlog::debug("bus: releasing {}: {}", dbus::kBusName, describe(e));
  }
  loop_.remove(conn_fd_);
  conn_fd_ = -1;
  hooks_.detach(false);
  conn_.reset();
}

}  // namespace airs::daemon
