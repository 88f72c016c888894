// SPDX-License-Identifier: Apache-2.0
#include "pressure/pressure_monitor.hpp"

#include <sys/epoll.h>

#include <algorithm>

#include <fmt/format.h>

#include "sys/procfs.hpp"

namespace airs::pressure {
namespace {

size_t idx(sys::PsiKind k) { return k == sys::PsiKind::Full ? 1 : 0; }

}  // namespace

const char* to_string(Source s) {
  switch (s) {
    case Source::Auto: return "auto";
    case Source::PsiTriggers: return "psi-triggers";
    case Source::PollPsi: return "poll-psi";
    case Source::PollMeminfo: return "poll-meminfo";
    case Source::Off: return "off";
  }
  return "unknown";
}

PressureMonitor::PressureMonitor(sys::EventLoop& loop, Config config, Callback cb)
    : loop_(loop), config_(std::move(config)), cb_(std::move(cb)) {
  config_.poll_interval = std::max(config_.poll_interval, kMinSampleInterval);
  status_.level_since = Clock::now();
}

Result<std::unique_ptr<PressureMonitor>> PressureMonitor::create(sys::EventLoop& loop, Config config,
                                                                 Callback on_change) {
  if (config.mild.kind != sys::PsiKind::Some || config.severe.kind != sys::PsiKind::Full)
    return make_error(EINVAL, "pressure config: the mild trigger must be 'some' and the severe one 'full'");
  if (config.hold.count() > 0 && (config.hold <= config.mild.window || config.hold <= config.severe.window))
    return make_error(EINVAL,
                      "pressure config: hold ({} ms) must be longer than the trigger windows, or the level flaps "
                      "under sustained pressure (events come at most once per window)",
                      config.hold.count());
  std::unique_ptr<PressureMonitor> m(new PressureMonitor(loop, std::move(config), std::move(on_change)));
  const Config& c = m->config_;
  switch (c.source) {
    case Source::PsiTriggers:
      AIRS_TRY(m->start_triggers());
      break;
    case Source::PollPsi: {
      auto r = sys::read_psi(c.psi_path);
      if (!r) return make_error(r.error().code, "pressure source poll-psi (forced by config): {}", r.error().message);
      AIRS_TRY(m->start_polling(Source::PollPsi, "forced by config"));
      break;
    }
    case Source::PollMeminfo:
      AIRS_TRY(m->start_polling(Source::PollMeminfo, "forced by config"));
      break;
    case Source::Off:
      m->status_.source = Source::Off;
      m->status_.why = "off by config: nothing is freed for the machine's memory pressure";
      break;
    case Source::Auto: {
      auto t = m->start_triggers();
      if (t) break;
      auto r = sys::read_psi(c.psi_path);
      if (r) {
        AIRS_TRY(m->start_polling(Source::PollPsi, "cannot create PSI triggers: " + t.error().message));
        break;
      }
      // The read error says "PSI is disabled … boot with psi=1" where that
      // is the cause; the trigger error is then the same story.
      auto p = m->start_polling(Source::PollMeminfo, r.error().message);
      if (!p)
        return make_error(p.error().code, "no pressure source works: {}; {}; {}", t.error().message,
                          r.error().message, p.error().message);
      break;
    }
  }
  return m;
}

PressureMonitor::~PressureMonitor() {
  stop_triggers();
  if (poll_timer_) loop_.remove(poll_timer_->fd());
  drop_hold_timer();
}

Status PressureMonitor::start_triggers() {
  for (const auto* s : {&config_.mild, &config_.severe}) {
    auto t = sys::PsiTrigger::create(config_.psi_path, *s);
    if (!t) {
      stop_triggers();
      return std::move(t).error();
    }
    triggers_.push_back(std::move(*t));
  }
  for (auto& t : triggers_) {
    const sys::PsiKind kind = t.spec().kind;
    auto r = loop_.add(t.fd(), EPOLLPRI, [this, kind](uint32_t events) { on_trigger(kind, events); });
    if (!r) {
      stop_triggers();
      return make_error(r.error().code, "PSI trigger {}: {}", sys::describe(t.spec()), r.error().message);
    }
  }
  status_.source = Source::PsiTriggers;
  status_.why = fmt::format("psi triggers on {} ({}, {})", config_.psi_path, sys::describe(config_.mild),
                            sys::describe(config_.severe));
  read_psi_now(Clock::now());
  armed_at_ = Clock::now();
  if (status_.psi) {
    armed_total_us_[idx(sys::PsiKind::Some)] = status_.psi->some.total_us;
    armed_total_us_[idx(sys::PsiKind::Full)] = status_.psi->full.total_us;
  }
  return {};
}

void PressureMonitor::stop_triggers() {
  for (auto& t : triggers_) loop_.remove(t.fd());
  triggers_.clear();
}

Status PressureMonitor::start_polling(Source source, const std::string& why) {
  const Clock::time_point now = Clock::now();
  const std::string& path = source == Source::PollPsi ? config_.psi_path : config_.meminfo_path;
  if (source == Source::PollMeminfo) {
    auto mi = sys::read_meminfo(config_.meminfo_path);
    if (!mi) return std::move(mi).error();
    if (!mi->contains("MemAvailable") || !mi->contains("MemTotal"))
      return make_error(EINVAL, "{}: no MemAvailable/MemTotal (kernel older than 3.14?)", config_.meminfo_path);
  }
  auto timer = sys::PeriodicTimer::create(config_.poll_interval);
  if (!timer) return make_error(timer.error().code, "pressure polling timer: {}", timer.error().message);
  poll_timer_.emplace(std::move(*timer));
  auto r = loop_.add(poll_timer_->fd(), EPOLLIN, [this](uint32_t) { on_poll_tick(); });
  if (!r) {
    poll_timer_.reset();
    return r;
  }
  status_.source = source;
  status_.why = fmt::format("polling {} every {} ms: {}", path, config_.poll_interval.count(), why);
  samples_.clear();
  // The first PSI reading is the baseline the deltas are measured from; the
  // first judgement comes with the first tick, never inside create().
  if (source == Source::PollPsi) poll_psi(now);
  return {};
}

const sys::PsiTriggerSpec& PressureMonitor::spec(sys::PsiKind kind) const {
  return kind == sys::PsiKind::Full ? config_.severe : config_.mild;
}

Clock::duration PressureMonitor::hold_for(const sys::PsiTriggerSpec& s) const {
  if (config_.hold.count() > 0) return config_.hold;
  // Under sustained pressure the kernel repeats an event once per window at
  // best; an unprivileged (2 s-multiple) trigger is evaluated by the
  // averaging work, which anyone reading the pressure file can delay by a
  // period, so repeats may come two windows apart. Hold across that; a
  // polled event comes up to an interval later still.
  Clock::duration hold = 2 * s.window + s.window / 4;
  if (status_.source == Source::PollPsi || status_.source == Source::PollMeminfo) hold += config_.poll_interval;
  return hold;
}

void PressureMonitor::on_trigger(sys::PsiKind kind, uint32_t events) {
  const Clock::time_point now = Clock::now();
  if ((events & (EPOLLERR | EPOLLHUP)) != 0) {
    // The pressure file went away (a cgroup's file when the cgroup is
    // removed): keep watching through the fallback rather than go blind.
    const std::string why = fmt::format("PSI trigger {} on {} reported an error (file removed?)",
                                        sys::describe(spec(kind)), config_.psi_path);
    status_.last_error = why;
    ++status_.read_errors;
    stop_triggers();
    auto r = sys::read_psi(config_.psi_path);
    auto p = start_polling(r ? Source::PollPsi : Source::PollMeminfo, why);
    if (!p) {
      status_.last_error = why + "; fallback failed: " + p.error().message;
      status_.why = "no pressure source: " + status_.last_error;
    }
    return;
  }
  if ((events & EPOLLPRI) == 0) return;
  const auto& sp = spec(kind);
  if (now - armed_at_ < 2 * sp.window) {
    // In the first two windows the kernel may fire on the first stall alone
    // (see spurious_events): believe it only if the stall really reached the
    // threshold since the triggers were armed. One read, first windows only.
    if (auto r = sys::read_psi(config_.psi_path)) {
      const uint64_t total = kind == sys::PsiKind::Full ? r->full.total_us : r->some.total_us;
      const uint64_t grown = total - std::min(total, armed_total_us_[idx(kind)]);
      if (grown < static_cast<uint64_t>(sp.threshold.count())) {
        ++status_.spurious_events;
        return;
      }
    }
  }
  note_event(kind, now);
}

void PressureMonitor::note_event(sys::PsiKind kind, Clock::time_point now) {
  (kind == sys::PsiKind::Full ? status_.full_events : status_.some_events) += 1;
  last_event_[idx(kind)] = now;
  recompute(now);
  if (status_.level != Level::None && status_.source == Source::PsiTriggers) ensure_hold_timer();
}

void PressureMonitor::recompute(Clock::time_point now) {
  Level l = Level::None;
  if (last_event_[1] && now - *last_event_[1] < hold_for(config_.severe)) l = Level::Full;
  else if (last_event_[0] && now - *last_event_[0] < hold_for(config_.mild)) l = Level::Some;
  if (l != status_.level) {
    const Level before = status_.level;
    status_.level = l;
    status_.level_since = now;
    ++status_.level_changes;
    if (cb_) cb_(l, before);
  }
  if (status_.level == Level::None) drop_hold_timer();
}

void PressureMonitor::ensure_hold_timer() {
  if (hold_timer_) return;
  // Fine enough that the level decays within an eighth of the hold, coarse
  // enough to stay cheap and above the 50 ms sampling floor.
  const auto hold = std::min(hold_for(config_.mild), hold_for(config_.severe));
  const auto period = std::clamp<Clock::duration>(hold / 8, kMinSampleInterval, std::chrono::milliseconds(250));
  auto t = sys::PeriodicTimer::create(period);
  if (!t) {
    ++status_.read_errors;
    status_.last_error = "pressure hold timer: " + t.error().message + " (the level will decay only with the next event)";
    return;
  }
  hold_timer_.emplace(std::move(*t));
  auto r = loop_.add(hold_timer_->fd(), EPOLLIN, [this](uint32_t) { on_hold_tick(); });
  if (!r) {
    ++status_.read_errors;
    status_.last_error = "pressure hold timer: " + r.error().message;
    hold_timer_.reset();
  }
}

void PressureMonitor::drop_hold_timer() {
  if (!hold_timer_) return;
  loop_.remove(hold_timer_->fd());
  hold_timer_.reset();
}

void PressureMonitor::on_hold_tick() {
  hold_timer_->acknowledge();
  // No read of the pressure file here: a read can run the kernel's
  // averaging update in place of the one that evaluates unprivileged
  // triggers, delaying the next event by a whole period (measured: events
  // every 4 s instead of 2 s with reads every 200 ms).
  recompute(Clock::now());  // may drop the timer: touch nothing after this
}

void PressureMonitor::on_poll_tick() {
  poll_timer_->acknowledge();
  const Clock::time_point now = Clock::now();
  if (status_.source == Source::PollPsi) poll_psi(now);
  else poll_meminfo(now);
  recompute(now);
}

void PressureMonitor::poll_psi(Clock::time_point now) {
  auto r = sys::read_psi(config_.psi_path);
  if (!r) {
    ++status_.read_errors;
    status_.last_error = r.error().message;
    return;
  }
  ++status_.samples;
  status_.psi = *r;
  status_.psi_read_at = now;
  samples_.push_back(Sample{now, {r->some.total_us, r->full.total_us}});
  const auto longest = std::max(config_.mild.window, config_.severe.window);
  while (samples_.size() > 1 && now - samples_.front().at > longest) samples_.pop_front();
  for (sys::PsiKind k : {sys::PsiKind::Some, sys::PsiKind::Full}) {
    const auto& s = spec(k);
    // Stall within the window: from the oldest sample still inside it. This
    // misses at most one interval's worth of stall at the window's start,
    // never counts stall from before it.
    auto base = std::find_if(samples_.begin(), samples_.end(), [&](const Sample& x) { return now - x.at <= s.window; });
    if (base == samples_.end()) continue;
    const uint64_t a = base->total_us[idx(k)], b = samples_.back().total_us[idx(k)];
    const uint64_t stall = b > a ? b - a : 0;
    if (stall < static_cast<uint64_t>(s.threshold.count())) continue;
    // Like the kernel: at most one event per window; the hold covers the gap.
    if (last_event_[idx(k)] && now - *last_event_[idx(k)] < s.window) continue;
    note_event(k, now);
  }
}

void PressureMonitor::poll_meminfo(Clock::time_point now) {
  auto mi = sys::read_meminfo(config_.meminfo_path);
  if (!mi || !mi->contains("MemAvailable") || !mi->contains("MemTotal")) {
    ++status_.read_errors;
    status_.last_error = mi ? config_.meminfo_path + ": no MemAvailable/MemTotal" : mi.error().message;
    return;
  }
  ++status_.samples;
  const uint64_t avail = mi->at("MemAvailable"), total = mi->at("MemTotal");
  status_.mem_available = avail;
  status_.mem_total = total;
  auto bound = [total](double fraction, uint64_t bytes) {
    const auto f = static_cast<uint64_t>(fraction * static_cast<double>(total));
    return std::max(f, bytes);
  };
  const bool full = avail < bound(config_.meminfo_full_fraction, config_.meminfo_full_bytes);
  const bool some = full || avail < bound(config_.meminfo_some_fraction, config_.meminfo_some_bytes);
  // Below a bound is a condition, not an event: treat it like a trigger
  // that fires at most once per window while it lasts; the hold covers the
  // gap between two.
  for (auto [k, hit] : {std::pair{sys::PsiKind::Some, some}, {sys::PsiKind::Full, full}}) {
    if (!hit) continue;
    if (last_event_[idx(k)] && now - *last_event_[idx(k)] < spec(k).window) continue;
    note_event(k, now);
  }
}

void PressureMonitor::read_psi_now(Clock::time_point now) {
  // At most once per (shorter) window: see on_hold_tick for why reads are
  // not free while triggers are armed.
  const auto min_gap = std::max<Clock::duration>(kMinSampleInterval, std::min(config_.mild.window, config_.severe.window));
  if (status_.psi_read_at && now - *status_.psi_read_at < min_gap) return;
  auto r = sys::read_psi(config_.psi_path);
  if (!r) {
    ++status_.read_errors;
    status_.last_error = r.error().message;
    return;
  }
  status_.psi = *r;
  status_.psi_read_at = now;
}

void PressureMonitor::refresh() {
  // The polling sources keep their own readings fresh; a read here would
  // only shorten the interval the deltas are measured over.
  if (status_.source != Source::PsiTriggers) return;
  read_psi_now(Clock::now());
}

}  // namespace airs::pressure
