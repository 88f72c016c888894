// airs-memd's state and its one event loop. The Daemon owns every subsystem
// (pool, pager, KV, pressure) and the bus objects that expose them; bus
// handlers, fault events, io completions, timers and signals all run on the
// loop thread, so no state here needs a lock.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <sdbus-c++/sdbus-c++.h>

#include "config/config.hpp"
#include "dbus/identity.hpp"
#include "dbus/variant.hpp"
#include "sys/event_loop.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class ManagerObject;

struct Options {
  config::Config config;
  std::string bus_override;  // --bus: takes precedence over daemon.bus
};

class Daemon {
 public:
  // Start-up: probes the machine, builds the pool and connects to the bus.
  // Errors say what is missing and how to fix it.
  static Result<std::unique_ptr<Daemon>> create(Options options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Runs until SIGTERM/SIGINT. Returns the process exit code.
  int run();

  // --- used by the bus objects (loop thread) ---
  [[nodiscard]] dbus::Dict status();
  [[nodiscard]] const config::Config& config() const { return cfg_; }
  [[nodiscard]] const std::string& profile() const { return profile_; }
  [[nodiscard]] uint64_t pool_target_bytes() const { return pool_target_; }
  [[nodiscard]] uint64_t page_size() const { return page_size_; }
  dbus::IdentityCache& identities() { return ids_; }

 private:
  explicit Daemon(Options options);
  Status init();
  Status connect_bus();
  void pump_bus();
  void on_name_owner_changed(sdbus::Message& sig);
  void on_signal();

  config::Config cfg_;
  std::string bus_address_;
  std::string profile_;
  uint64_t pool_target_ = 0;
  uint64_t page_size_ = 0;
  std::chrono::steady_clock::time_point started_;

  std::unique_ptr<sys::EventLoop> loop_;
  std::optional<sys::SignalSource> signals_;
  std::optional<sys::PeriodicTimer> watchdog_;
  std::unique_ptr<sdbus::IConnection> bus_;
  int bus_fd_ = -1;
  dbus::IdentityCache ids_;
  std::unique_ptr<ManagerObject> manager_;
};

}  // namespace airs::daemon
