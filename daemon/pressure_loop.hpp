// SPDX-License-Identifier: Apache-2.0
// The pressure loop: memory pressure in, memory back to the system out.
//
//   PressureMonitor (PSI triggers / polling) ──level──► Governor (hysteresis,
//   rate limit) ──Evict──► snapshot (KV + models) ──► policy::plan_eviction
//   ──► execute (KvService::execute, Models::evict) ──► Pool::shrink
//   (lowers nr_hugepages: the freed pages become MemAvailable)
//                 ──Grow (quiet for grow_after)──► Pool::grow back to target
//
// Per pressure event (a new PSI trigger event or polled crossing) the loop
// frees the level's target bytes: first pages already free in the pool's
// reserve (nothing is destroyed for them), then by the policy's order for
// the rest; everything freed goes back to the kernel in one nr_hugepages
// write. Admin eviction (`airsctl evict`) goes through the same executor and
// shares the governor's rate limit; both have a dry run that plans only.
//
// Everything runs on the daemon's event loop thread; the loop owns no
// thread and wakes only on pressure events and on one timer that exists
// while pressure is high, a grow is pending or the rate limit holds.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "daemon/status.hpp"
#include "policy/governor.hpp"
#include "policy/policy.hpp"
#include "pool/pool.hpp"
#include "pressure/pressure_monitor.hpp"
#include "sys/event_loop.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class Models;
class Evictor;

// One executed (or, in a dry run, planned) action.
struct EvictionOutcome {
  policy::Action action;
  std::string object;       // session/model object path, or "kv-arena:<id>" for cached prefix blocks
  uint64_t freed_bytes = 0; // pool pages this action freed (0 in a dry run)
  std::string error;        // empty on success
};

// "cached-kv", "kv-blocks" or "model": an action's kind in logs, status and Evict's report.
[[nodiscard]] const char* action_kind_name(policy::ActionKind k);

struct EvictionReport {
  bool dry_run = false;
  std::string trigger;              // "pressure full", "admin uid 0", ...
  uint64_t requested_bytes = 0;     // 0 = everything the filters allow
  policy::Plan plan;
  std::vector<EvictionOutcome> outcomes;
  uint64_t reserve_bytes = 0;       // free pool pages handed back without evicting anything
  uint64_t freed_bytes = 0;         // pool pages the actions freed
  uint64_t returned_bytes = 0;      // pages the kernel took back (nr_hugepages lowered by this much)
  std::string resize_note;          // why fewer went back than asked, if so
  uint64_t duration_us = 0;         // plan + actions + shrink, on the loop thread
};

class PressureLoop {
 public:
  struct Hooks {
    // The effective pressure level changed (emit PressureChanged).
    std::function<void(policy::Level level, const PressureChange& details)> level_changed;
  };

  // Starts the pressure source on `loop`. All references must outlive the
  // loop object. `pool_target_bytes` is the pool's configured size (what a
  // grow restores). Errors: no pressure source works (messages from the
  // monitor), or a timer cannot be created.
  static Result<std::unique_ptr<PressureLoop>> create(sys::EventLoop& loop, pool::Pool& pool, Models& models,
                                                      Evictor& evictor, const config::Config& cfg,
                                                      uint64_t pool_target_bytes, Hooks hooks);
  ~PressureLoop();
  PressureLoop(const PressureLoop&) = delete;
  PressureLoop& operator=(const PressureLoop&) = delete;

  // Admin eviction (Manager.Evict; `what` from evict_what_from_dict). At
  // least one part; without bytes everything the filters allow goes. `who`
  // names the caller for logs. Errors: EINVAL (nothing said, bytes 0),
  // ENOENT (no such session/model). A dry run only plans. Loop thread.
  Result<EvictionReport> admin_evict(const EvictWhat& what, bool dry_run, const std::string& who);

  // The pressure part of status and of the metrics (refreshes PSI averages
  // at most once per trigger window).
  [[nodiscard]] PressureStatus status();
  [[nodiscard]] policy::Level level() const { return governor_.level(); }
  // The seed's security floor: giving pages back never shrinks the pool below
  // `bytes` (the pinned primary model's footprint), so it can always be
  // loaded again. Only ever raised.
  void raise_floor(uint64_t bytes) { floor_pages_ = std::max(floor_pages_, pool::pages_for(bytes, pool_.page_size())); }
  // A model's drain ended (pager::Pager::DrainListener): pages an eviction
  // meant to give back to the kernel, still held by reads in flight when it
  // ran, go back now.
  void pages_returned();

 private:
  PressureLoop(sys::EventLoop& loop, pool::Pool& pool, Models& models, Evictor& evictor, const config::Config& cfg,
               uint64_t pool_target_bytes, Hooks hooks);
  void on_level(policy::Level now, policy::Level before);
  void evaluate();
  void schedule(policy::Clock::time_point at);
  void cancel_timer();
  void note_effective_level(policy::Level before);
  void pressure_evict(policy::Level level);
  void grow();
  EvictionReport run(const std::optional<policy::Request>& req, uint64_t reserve_pages, bool dry_run, std::string trigger);
  void remember(const EvictionReport& r);
  [[nodiscard]] bool pool_below_target() const;
  // The pool below its size, or a streamed model below its budget at load.
  [[nodiscard]] bool below_target() const;
  // Free pool pages plus those on their way back (Models::returning_pages),
  // less those already promised to the kernel (owed_pages_).
  [[nodiscard]] uint64_t available_pages() const;
  // Shrinks the pool by up to `pages`, never below the floor. Returns the
  // pages the kernel took; failures are counted and noted.
  uint64_t give_back(uint64_t pages, std::string& note);
  [[nodiscard]] uint64_t events_seen() const;

  sys::EventLoop& loop_;
  pool::Pool& pool_;
  Models& models_;
  Evictor& evictor_;
  config::PressureConfig cfg_;
  uint64_t pool_target_pages_ = 0;
  uint64_t floor_pages_ = 0;
  // Pages a run meant to give back that were still on their way to the
  // pool (a drain): given back by pages_returned().
  uint64_t owed_pages_ = 0;
  Hooks hooks_;
  std::unique_ptr<pressure::PressureMonitor> monitor_;
  policy::Governor governor_;
  std::optional<sys::PeriodicTimer> timer_;  // one-shot: removed when it fires
  uint64_t events_at_last_eviction_ = 0;
  std::string damon_;
  std::string last_decision_;

  PressureCounters counters_;
  std::string last_resize_error_;
  uint64_t last_duration_us_ = 0;
  uint64_t max_duration_us_ = 0;
  struct Record {
    policy::Clock::time_point at;
    std::string trigger;
    EvictionOutcome outcome;
  };
  std::deque<Record> last_;  // newest last, bounded
};

}  // namespace airs::daemon
