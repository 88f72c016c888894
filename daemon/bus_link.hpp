// SPDX-License-Identifier: Apache-2.0
// The daemon's connection to its bus, kept across the bus going away.
//
// Clients need the bus to load and open models and to manage KV sessions,
// but never for their page faults (those go through their userfaultfd, the
// io_uring reads and the status page), fills, pressure or the watchdog. So a
// bus that goes away (dbus restarted on a package upgrade, a private bus
// stopped) is not fatal: the link says so once (log, service STATUS=,
// status), drops everything made on the dead connection (the Hooks), and
// connects again with backoff until the bus answers, then takes the name
// again and has the bus objects made anew.
//
// Nothing here waits on the loop thread for a bus that is not there: each
// attempt first proves with a dbus::BusProbe (driven by the loop) that the
// bus answers, and only then opens the sdbus-c++ connection, whose own
// handshake then takes one round trip. The connection is dropped only at
// safe points (prepare(), dispatch(), the timer), never inside sd-bus's
// dispatch, so no handler ever runs on a destroyed connection.
//
// Every sdbus-c++ exception of the connection itself (poll data, request
// processing, requesting the name, opening it) is caught here, named in the
// log and handled as a lost or failed connection. Loop thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <sdbus-c++/sdbus-c++.h>

#include "config/config.hpp"
#include "daemon/status.hpp"
#include "dbus/bus_probe.hpp"
#include "sys/event_loop.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class BusLink {
 public:
  struct Hooks {
    // A new connection, before the name is requested and before any of
    // its requests is processed: make the bus objects and matches on it.
    // May throw sdbus::Error (the attempt then fails: detach runs).
    std::function<void(sdbus::IConnection&)> attach;
    // The connection is going: drop everything made on it (bus objects,
    // replies still held) before it is destroyed. `lost`: the bus went away
    // or the connection broke (its callers' unique names are dead);
    // otherwise a shutdown or a failed attempt. Must not throw.
    std::function<void(bool lost)> detach;
    // A bus that answers but where the daemon cannot serve at start (the
    // name is refused: no policy, another owner): the daemon stops with
    // this error.
    std::function<void(const Error&)> fatal;
  };

  // Backoff between attempts: first, doubled after each failure, at most
  // kMaxRetry. An attempt whose bus accepted the connection but has not
  // answered its Hello within kAttemptLimit is given up and retried.
  static constexpr std::chrono::milliseconds kFirstRetry{100};
  static constexpr std::chrono::milliseconds kMaxRetry{3200};
  static constexpr std::chrono::milliseconds kAttemptLimit{5000};

  // `address`: "system", "session" or a D-Bus address. Errors: timerfd.
  static Result<std::unique_ptr<BusLink>> create(sys::EventLoop& loop, std::string address, Hooks hooks);
  ~BusLink();
  BusLink(const BusLink&) = delete;
  BusLink& operator=(const BusLink&) = delete;

  // The first connection. NoBus::Fail: connects now (blocking, as at any
  // start) and returns the error naming the address if there is no bus or
  // the name is refused. NoBus::Wait: starts an attempt and returns; the
  // loop finishes it, or waits for the bus with backoff (said once in the
  // log and in STATUS=). READY=1 goes to the service manager once the
  // name is owned.
  [[nodiscard]] Status start(config::NoBus no_bus);

  // Before each wait of the loop: the bus fd's events as sd-bus wants them
  // now; returns how long the loop may wait for sd-bus (ms, -1: no limit).
  // A connection that fails here is lost (handled here).
  int prepare();
  // After each wait of the loop (and on the bus fd): every request sd-bus
  // has queued is handled. A connection that fails here is lost.
  void dispatch();
  // A call into sdbus-c++ outside dispatch() failed (a signal, a late
  // reply): logged, naming `what`. The connection itself is checked by
  // prepare() and dispatch(); nothing else is needed.
  void call_failed(const std::string& what, const sdbus::Error& e) const;

  // The connection, or null while there is none.
  [[nodiscard]] sdbus::IConnection* connection() const { return conn_.get(); }
  [[nodiscard]] BusStatus status() const;

  // Shutdown: releases the name, drops the connection (detach(false)) and
  // stops trying. Idempotent.
  void stop();

 private:
  enum class State : uint8_t { Waiting, Connected, Lost };
  using Clock = std::chrono::steady_clock;
  BusLink(sys::EventLoop& loop, sys::OneShotTimer timer, std::string address, Hooks hooks);

  void attempt();
  void on_probe();
  void on_timer();
  void drop_probe();
  // The sdbus-c++ connection once the probe proved the bus answers.
  // `at_start`: a refused name is fatal instead of retried.
  Status open(bool at_start);
  std::unique_ptr<sdbus::IConnection> open_connection() const;
  void attempt_failed(const std::string& why);
  void lose(const std::string& why);
  void set_state(State s);
  void notify_waiting(std::chrono::milliseconds next) const;
  [[nodiscard]] std::chrono::milliseconds backoff() const;

  sys::EventLoop& loop_;
  sys::OneShotTimer timer_;  // the next attempt, or the deadline of the one under way
  std::string address_;
  Hooks hooks_;
  std::unique_ptr<sdbus::IConnection> conn_;
  int conn_fd_ = -1;
  std::string unique_name_;
  std::unique_ptr<dbus::BusProbe> probe_;
  int probe_fd_ = -1;
  State state_ = State::Waiting;
  Clock::time_point state_since_;
  bool ever_connected_ = false;
  bool stopped_ = false;
  uint64_t losses_ = 0;
  uint64_t failed_attempts_ = 0;
  std::string last_loss_;
  std::string last_error_;
  uint64_t last_offline_ms_ = 0;
};

}  // namespace airs::daemon
