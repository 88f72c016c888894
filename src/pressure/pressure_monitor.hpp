// SPDX-License-Identifier: Apache-2.0
// PressureMonitor: turns the kernel's memory pressure signals into a level
// (None/Some/Full, policy::Level) with a callback on every change. It lives
// in the daemon's event loop and starts no threads.
//
// Sources, best first (Source::Auto picks the first that works and records
// why the better ones did not):
//   PsiTriggers  two PSI triggers on the pressure file: mild = `some`,
//                severe = `full`; event driven (EPOLLPRI), nothing polled.
//   PollPsi      a timer every `poll_interval` reads the pressure file and
//                compares the stall time (total delta) within each trigger's
//                window against its threshold, like the kernel does.
//   PollMeminfo  a timer reads MemAvailable; below the configured bounds
//                counts as Some/Full.
//   Off          no input (only when configured; Auto never picks it): the
//                level stays None, so nothing is freed for the machine's
//                sake, only for loads, KV and admins.
// A level holds for `hold` after its last event (the kernel signals at most
// once per window under sustained pressure), then decays by itself through a
// timer that exists only while the level is above None. Pressure files are
// never read more often than every 50 ms (totals come out wrong otherwise),
// and with triggers armed not more than once per window (reads delay
// unprivileged trigger events; see refresh()).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "policy/policy.hpp"
#include "sys/event_loop.hpp"
#include "sys/psi.hpp"
#include "util/result.hpp"

namespace airs::pressure {

using Clock = std::chrono::steady_clock;
using policy::Level;

enum class Source : uint8_t { Auto, PsiTriggers, PollPsi, PollMeminfo, Off };
[[nodiscard]] const char* to_string(Source s);

inline constexpr std::chrono::milliseconds kMinSampleInterval{50};

struct Config {
  // Auto in production; the others force a source (error if it cannot run),
  // so every path is testable on any machine.
  Source source = Source::Auto;
  std::string psi_path = "/proc/pressure/memory";
  std::string meminfo_path = "/proc/meminfo";
  sys::PsiTriggerSpec mild{sys::PsiKind::Some, std::chrono::milliseconds(150), std::chrono::seconds(2)};
  sys::PsiTriggerSpec severe{sys::PsiKind::Full, std::chrono::milliseconds(100), std::chrono::seconds(2)};
  // Polling fallback period; raised to kMinSampleInterval if smaller.
  std::chrono::milliseconds poll_interval{500};
  // MemAvailable fallback: Some when MemAvailable < max(fraction × MemTotal,
  // bytes); Full likewise with the full bounds. 0 disables a bound.
  double meminfo_some_fraction = 0.10;
  double meminfo_full_fraction = 0.05;
  uint64_t meminfo_some_bytes = 0;
  uint64_t meminfo_full_bytes = 0;
  // How long a level holds after its last event; 0 = 2.25 × that trigger's
  // window (the kernel repeats an event at most once per window, and readers
  // of the pressure file can push an unprivileged trigger's repeat to two
  // windows), plus one poll interval for the polling sources. Must exceed
  // both windows.
  std::chrono::milliseconds hold{0};
};

struct Snapshot {
  Source source = Source::Auto;  // the active one
  std::string why;               // "psi triggers on /proc/pressure/memory (some 150ms/2s, full 100ms/2s)"
  Level level = Level::None;
  Clock::time_point level_since{};
  std::optional<sys::PsiStats> psi;  // last reading of the pressure file (avg10 etc.), if readable
  std::optional<Clock::time_point> psi_read_at;
  std::optional<uint64_t> mem_available;  // PollMeminfo only
  std::optional<uint64_t> mem_total;
  uint64_t some_events = 0;   // trigger events (or polled threshold crossings)
  uint64_t full_events = 0;
  // Trigger events dropped as the kernel's spurious first firing: within the
  // first window after the triggers were armed, the stall total had not
  // grown by the threshold (kernels without "psi: Fix avg trigger being fired
  // unexpectedly" fire a new unprivileged trigger on its first stall,
  // whatever the threshold).
  uint64_t spurious_events = 0;
  uint64_t level_changes = 0;
  uint64_t samples = 0;       // files read by the polling source
  uint64_t read_errors = 0;
  std::string last_error;
};

class PressureMonitor {
 public:
  // Called from the event loop on every level change. Must not destroy the
  // monitor.
  using Callback = std::function<void(Level now, Level before)>;

  // Registers its fds with `loop`, which must outlive the monitor. Errors:
  // a forced source that cannot run, or (Auto) not even /proc/meminfo is
  // readable; messages carry every reason a source was passed over.
  static Result<std::unique_ptr<PressureMonitor>> create(sys::EventLoop& loop, Config config, Callback on_change);
  ~PressureMonitor();
  PressureMonitor(const PressureMonitor&) = delete;
  PressureMonitor& operator=(const PressureMonitor&) = delete;

  [[nodiscard]] Level level() const { return status_.level; }
  [[nodiscard]] const Snapshot& status() const { return status_; }
  // Re-reads the pressure file for fresh avg values, for status requests.
  // With triggers armed, at most once per trigger window: on this kernel a
  // read of the pressure file can stand in for the averaging update that
  // evaluates unprivileged triggers and delay their next event by a period.
  // Polling sources keep the values fresh themselves. Read errors go into
  // the snapshot.
  void refresh();

 private:
  PressureMonitor(sys::EventLoop& loop, Config config, Callback cb);
  Status start_triggers();
  Status start_polling(Source source, const std::string& why);
  void on_trigger(sys::PsiKind kind, uint32_t events);
  void on_poll_tick();
  void on_hold_tick();
  void poll_psi(Clock::time_point now);
  void poll_meminfo(Clock::time_point now);
  void note_event(sys::PsiKind kind, Clock::time_point now);
  void recompute(Clock::time_point now);
  void ensure_hold_timer();
  void drop_hold_timer();
  void stop_triggers();
  void read_psi_now(Clock::time_point now);
  [[nodiscard]] Clock::duration hold_for(const sys::PsiTriggerSpec& spec) const;
  [[nodiscard]] const sys::PsiTriggerSpec& spec(sys::PsiKind kind) const;

  sys::EventLoop& loop_;
  Config config_;
  Callback cb_;
  Snapshot status_;
  std::vector<sys::PsiTrigger> triggers_;
  std::optional<sys::PeriodicTimer> poll_timer_;
  std::optional<sys::PeriodicTimer> hold_timer_;
  std::optional<Clock::time_point> last_event_[2];  // by PsiKind
  // When the triggers were armed and the stall totals then (µs, by PsiKind).
  Clock::time_point armed_at_{};
  uint64_t armed_total_us_[2] = {0, 0};
  struct Sample {
    Clock::time_point at;
    uint64_t total_us[2];
  };
  std::deque<Sample> samples_;
};

}  // namespace airs::pressure
