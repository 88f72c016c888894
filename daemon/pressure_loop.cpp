// SPDX-License-Identifier: Apache-2.0
#include "daemon/pressure_loop.hpp"

#include <sys/epoll.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "daemon/evictor.hpp"
#include "daemon/models.hpp"
#include "dbus/names.hpp"
#include "sys/procfs.hpp"
#include "util/units.hpp"

namespace airs::daemon {
namespace {

using policy::Clock;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

constexpr size_t kLastEvictions = 32;
constexpr const char* kDamonAdmin = "/sys/kernel/mm/damon/admin/kdamonds";

pressure::Config monitor_config(const config::PressureConfig& c) {
  pressure::Config m;
  m.source = c.source == config::PressureSource::Psi    ? pressure::Source::PsiTriggers
             : c.source == config::PressureSource::Poll ? pressure::Source::PollPsi
             : c.source == config::PressureSource::Off  ? pressure::Source::Off
                                                        : pressure::Source::Auto;
  m.mild = {sys::PsiKind::Some, c.some_threshold, c.some_window};
  m.severe = {sys::PsiKind::Full, c.full_threshold, c.full_window};
  m.poll_interval = c.poll_interval;
  if (c.mem_available_low != 0) {
    // An explicit bound replaces the MemTotal fractions; half of it is severe.
    m.meminfo_some_fraction = 0;
    m.meminfo_full_fraction = 0;
    m.meminfo_some_bytes = c.mem_available_low;
    m.meminfo_full_bytes = c.mem_available_low / 2;
  }
  return m;
}

// Whether DAMON can rank KV arenas here. It needs virtual-address monitoring
// of the client processes' arena mappings; only reads sysfs, never starts a
// kdamond (they are a machine-wide resource other tools may own).
std::string probe_damon() {
  auto nr = sys::read_u64_file(std::string(kDamonAdmin) + "/nr_kdamonds");
  if (!nr)
    return "unavailable: no DAMON sysfs interface (/sys/kernel/mm/damon/admin; kernel without CONFIG_DAMON_SYSFS); "
           "idle KV is ranked by the access rates libairs' sampling reports, and by last use where none is reported";
  if (*nr == 0)
    return "unavailable: DAMON sysfs present but the daemon does not start kdamonds of its own (KV arenas are "
           "mapped at client addresses it does not track); idle KV is ranked by the access rates libairs' sampling "
           "reports, and by last use where none is reported";
  auto ops = sys::read_text_file(std::string(kDamonAdmin) + "/0/contexts/0/avail_operations");
  std::string o = ops ? *ops : std::string("?");
  while (!o.empty() && (o.back() == '\n' || o.back() == ' ')) o.pop_back();
  for (auto& ch : o)
    if (ch == '\n') ch = ',';
  if (o.find("vaddr") == std::string::npos)
    return "unavailable: the kernel offers only '" + o +
           "' DAMON operations (no CONFIG_DAMON_VADDR), so client KV mappings cannot be monitored; idle KV is ranked "
           "by the access rates libairs' sampling reports, and by last use where none is reported";
  return "unavailable: kdamonds exist but belong to another owner, and the daemon does not track client arena "
         "addresses; idle KV is ranked by the access rates libairs' sampling reports, and by last use where none is "
         "reported";
}


int64_t ms_since(Clock::time_point t, Clock::time_point now) { return duration_cast<milliseconds>(now - t).count(); }

}  // namespace

const char* action_kind_name(policy::ActionKind k) {
  switch (k) {
    case policy::ActionKind::DropCached: return "cached-kv";
    case policy::ActionKind::EvictBlocks: return "kv-blocks";
    case policy::ActionKind::EvictModel: return "model";
    case policy::ActionKind::ShrinkModel: return "model-budget";
  }
  return "unknown";
}

PressureLoop::PressureLoop(sys::EventLoop& loop, pool::Pool& pool, Models& models, Evictor& evictor,
                           const config::Config& cfg, uint64_t pool_target_bytes, Hooks hooks)
    : loop_(loop),
      pool_(pool),
      models_(models),
      evictor_(evictor),
      cfg_(cfg.pressure),
      pool_target_pages_(pool::pages_for(pool_target_bytes, pool.page_size())),
      hooks_(std::move(hooks)),
      governor_(policy::GovernorConfig{cfg.pressure.min_eviction_interval, milliseconds(5000),
                                       duration_cast<milliseconds>(cfg.pressure.grow_after)},
                Clock::now()) {
}

PressureLoop::~PressureLoop() {
  cancel_timer();
  monitor_.reset();
}

Result<std::unique_ptr<PressureLoop>> PressureLoop::create(sys::EventLoop& loop, pool::Pool& pool, Models& models,
                                                           Evictor& evictor, const config::Config& cfg,
                                                           uint64_t pool_target_bytes, Hooks hooks) {
  std::unique_ptr<PressureLoop> p(new PressureLoop(loop, pool, models, evictor, cfg, pool_target_bytes, std::move(hooks)));
  auto mc = monitor_config(cfg.pressure);
  auto m = pressure::PressureMonitor::create(loop, mc, [raw = p.get()](policy::Level now, policy::Level before) {
    raw->on_level(now, before);
  });
  if (!m && cfg.pressure.source == config::PressureSource::Poll) {
    // "poll" means the PSI file if it can be read, else MemAvailable.
    mc.source = pressure::Source::PollMeminfo;
    m = pressure::PressureMonitor::create(loop, mc, [raw = p.get()](policy::Level now, policy::Level before) {
      raw->on_level(now, before);
    });
  }
  if (!m) return make_error(m.error().code, "pressure loop: {}", m.error().message);
  p->monitor_ = std::move(m).value();
  p->damon_ = probe_damon();
  const auto& st = p->monitor_->status();
  spdlog::info("pressure: source {} ({}); targets some {} / full {}; pool {} resize {}", pressure::to_string(st.source),
               st.why, format_bytes(cfg.pressure.target_some_bytes), format_bytes(cfg.pressure.target_full_bytes),
               cfg.pressure.resize_pool ? "with" : "without", "nr_hugepages");
  spdlog::info("pressure: damon {}", p->damon_);
  // A pool that started short grows toward its size once it has been quiet.
  if (p->pool_below_target()) p->schedule(Clock::now() + cfg.pressure.grow_after);
  return p;
}

// ---- event handling -------------------------------------------------------

void PressureLoop::on_level(policy::Level now_level, policy::Level before) {
  const auto now = Clock::now();
  const policy::Level eff_before = governor_.level();
  governor_.observe(now_level, now);
  spdlog::info("pressure: raw level {} → {} ({})", policy::to_string(before), policy::to_string(now_level),
               monitor_->status().why);
  note_effective_level(eff_before);
  evaluate();
}

void PressureLoop::note_effective_level(policy::Level before) {
  const policy::Level after = governor_.level();
  if (after == before) return;
  spdlog::info("pressure: effective level {} → {}", policy::to_string(before), policy::to_string(after));
  if (!hooks_.level_changed) return;
  const auto& st = monitor_->status();
  PressureChange c;
  c.previous = before;
  c.raw = governor_.raw_level();
  c.source = pressure::to_string(st.source);
  c.psi = st.psi;
  hooks_.level_changed(after, c);
}

uint64_t PressureLoop::events_seen() const {
  const auto& st = monitor_->status();
  return st.some_events + st.full_events;
}

bool PressureLoop::pool_below_target() const { return pool_.counts().total_pages() < pool_target_pages_; }

bool PressureLoop::below_target() const { return pool_below_target() || models_.budgets_below_load(); }

void PressureLoop::evaluate() {
  const auto now = Clock::now();
  const policy::Level before = governor_.level();
  governor_.tick(now);
  note_effective_level(before);
  // Below target: shrunk under pressure, or started with what the kernel
  // had; or a streamed model's budget was cut.
  const auto d = governor_.decide(now, below_target());
  last_decision_ = fmt::format("{}: {}", policy::to_string(d.kind), d.reason);
  switch (d.kind) {
    case policy::Decision::Kind::Evict:
      // Target bytes are per pressure event: a level that merely holds
      // between two kernel events frees nothing more.
      if (events_seen() != events_at_last_eviction_) {
        events_at_last_eviction_ = events_seen();
        pressure_evict(d.level);
      } else {
        last_decision_ = "wait: no new pressure event since the last eviction";
      }
      // While pressure lasts, look again after the rate limit: for new
      // events, and for the governor's step down.
      schedule(now + cfg_.min_eviction_interval);
      return;
    case policy::Decision::Kind::Grow:
      if (pool_below_target()) grow();
      models_.restore_budgets();
      // Short of the target still (the kernel or the pool had too few
      // pages): try again after another quiet period.
      if (below_target()) schedule(Clock::now() + cfg_.grow_after);
      return;
    case policy::Decision::Kind::Wait:
      if (d.retry_at) {
        schedule(*d.retry_at);
      } else if (governor_.level() != policy::Level::None) {
        schedule(now + cfg_.min_eviction_interval);
      } else {
        cancel_timer();
      }
      return;
  }
}

void PressureLoop::schedule(Clock::time_point at) {
  cancel_timer();
  const auto delay = std::max<Clock::duration>(at - Clock::now(), milliseconds(1));
  auto t = sys::PeriodicTimer::create(delay);
  if (!t) {
    spdlog::error("pressure: cannot arm the loop's timer ({}); the loop acts on the next pressure change only",
                  t.error().message);
    return;
  }
  timer_.emplace(std::move(t).value());
  auto r = loop_.add(timer_->fd(), EPOLLIN, [this](uint32_t) {
    // One-shot: drop the timer before acting (evaluate() may arm a new one).
    cancel_timer();
    evaluate();
  });
  if (!r) {
    spdlog::error("pressure: cannot watch the loop's timer: {}", r.error().message);
    timer_.reset();
  }
}

void PressureLoop::cancel_timer() {
  if (!timer_) return;
  loop_.remove(timer_->fd());
  timer_.reset();
}

// ---- eviction ---------------------------------------------------------------

EvictionReport PressureLoop::run(const std::optional<policy::Request>& req, uint64_t reserve_pages, bool dry_run,
                                 std::string trigger) {
  const auto now = Clock::now();
  const uint64_t ps = pool_.page_size();
  EvictionReport r;
  r.dry_run = dry_run;
  r.trigger = std::move(trigger);
  r.reserve_bytes = reserve_pages * ps;
  if (req) {
    r.requested_bytes = req->everything ? 0 : req->bytes;
    r.plan = evictor_.plan(*req);
  } else {
    r.plan.satisfied = true;
  }
  for (const auto& a : r.plan.actions) r.outcomes.push_back(EvictionOutcome{a, evictor_.object_of(a), 0, {}});
  if (dry_run) return r;

  // Pages of models whose reads were in flight come back when those land
  // (a drain): counted as freed now, given back to the kernel then.
  const uint64_t free_before = available_pages();
  for (auto& o : r.outcomes) {
    auto freed = evictor_.execute(o.action);
    if (!freed) {
      o.error = freed.error().message;
      ++counters_.action_errors;
      spdlog::warn("pressure: {} {} failed: {}", action_kind_name(o.action.kind), o.object, o.error);
      continue;
    }
    o.freed_bytes = *freed;
  }
  const uint64_t free_after = available_pages();
  const uint64_t freed_pages = free_after > free_before ? free_after - free_before : 0;
  r.freed_bytes = freed_pages * ps;

  // The pages sit free in the pool now (or soon); only a lower nr_hugepages
  // turns them into memory the rest of the system can use. One write for
  // the reserve share and everything just freed that is back already.
  uint64_t give = std::min(free_after, reserve_pages + freed_pages);
  const uint64_t total = pool_.counts().total_pages();
  if (total - std::min(total, give) < floor_pages_) {
    give = total > floor_pages_ ? total - floor_pages_ : 0;
    r.resize_note = fmt::format("the pool stays at the pinned primary model's footprint ({} pages): the security floor",
                                floor_pages_);
  }
  if (cfg_.resize_pool && give > 0) {
    const uint64_t back = std::min(give, pool_.counts().free_pages);
    owed_pages_ += give - back;
    r.returned_bytes = give_back(back, r.resize_note) * ps;
    if (!r.resize_note.empty()) {
      last_resize_error_ = r.resize_note;
      spdlog::warn("pressure: {}", r.resize_note);
    }
  }
  governor_.record_eviction(Clock::now());
  r.duration_us = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - now).count());
  last_duration_us_ = r.duration_us;
  max_duration_us_ = std::max(max_duration_us_, r.duration_us);
  remember(r);
  return r;
}

uint64_t PressureLoop::available_pages() const {
  const uint64_t have = pool_.counts().free_pages + models_.returning_pages();
  return have - std::min(have, owed_pages_);
}

uint64_t PressureLoop::give_back(uint64_t pages, std::string& note) {
  if (pages == 0) return 0;
  auto took = pool_.shrink(pages);
  if (!took) {
    ++counters_.resize_failures;
    note = "giving pages back failed: " + took.error().message;
    return 0;
  }
  if (*took < pages) {
    ++counters_.resize_failures;
    note = fmt::format("the kernel took back {} of {} free huge pages (another process holds or reserved free pages?)",
                       *took, pages);
  }
  return *took;
}

void PressureLoop::pages_returned() {
  if (owed_pages_ == 0) return;
  const uint64_t total = pool_.counts().total_pages();
  uint64_t n = std::min(owed_pages_, pool_.counts().free_pages);
  if (total - std::min(total, n) < floor_pages_) n = total > floor_pages_ ? total - floor_pages_ : 0;
  // Still owed: what is still on its way; the rest (the floor) is forgotten.
  owed_pages_ = std::min(owed_pages_ - std::min(owed_pages_, n), models_.returning_pages());
  std::string note;
  const uint64_t took = give_back(n, note);
  counters_.returned_bytes += took * pool_.page_size();
  if (!note.empty()) {
    last_resize_error_ = note;
    spdlog::warn("pressure: {}", note);
  }
  if (took > 0)
    spdlog::info("pressure: {} back to the kernel now that the evicted models' reads landed",
                 format_bytes(took * pool_.page_size()));
}

void PressureLoop::remember(const EvictionReport& r) {
  const auto now = Clock::now();
  uint64_t executed = 0;
  for (const auto& o : r.outcomes) {
    if (!o.error.empty()) continue;
    ++executed;
    ++counters_.actions;
    switch (o.action.kind) {
      case policy::ActionKind::DropCached: counters_.evicted_cached_bytes += o.freed_bytes; break;
      case policy::ActionKind::EvictBlocks: counters_.evicted_kv_bytes += o.freed_bytes; break;
      case policy::ActionKind::EvictModel:
      case policy::ActionKind::ShrinkModel: counters_.evicted_model_bytes += o.freed_bytes; break;
    }
    last_.push_back(Record{now, r.trigger, o});
    if (last_.size() > kLastEvictions) last_.pop_front();
  }
  counters_.evicted_bytes += r.freed_bytes;
  counters_.returned_bytes += r.returned_bytes;
  counters_.reserve_bytes += std::min(r.reserve_bytes, r.returned_bytes);
  if (executed > 0 || r.returned_bytes > 0) ++counters_.evictions;
  spdlog::info("pressure: {}: {} actions freed {} in the pool, {} of it and {} of free reserve back to the kernel "
               "(requested {}){}",
               r.trigger, executed, format_bytes(r.freed_bytes),
               format_bytes(r.returned_bytes - std::min(r.returned_bytes, r.reserve_bytes)),
               format_bytes(std::min(r.reserve_bytes, r.returned_bytes)),
               r.requested_bytes ? format_bytes(r.requested_bytes) : std::string("everything allowed"),
               r.plan.shortfall.empty() ? "" : "; " + r.plan.shortfall);
}

void PressureLoop::pressure_evict(policy::Level level) {
  const uint64_t ps = pool_.page_size();
  const uint64_t target = level == policy::Level::Full ? cfg_.target_full_bytes : cfg_.target_some_bytes;
  // Free pool pages first: handing them back destroys nothing.
  // Pages on their way back from an earlier eviction count: planning more
  // for them would evict twice for one need.
  const uint64_t reserve_pages = cfg_.resize_pool ? std::min(available_pages(), target / ps) : 0;
  const uint64_t rest = target - std::min(target, reserve_pages * ps);
  std::optional<policy::Request> req;
  // When the reserve covers the target nothing is planned (a request for 0
  // bytes would mean the level's whole target).
  if (rest > 0) {
    req.emplace();
    req->level = level;
    req->bytes = rest;
  }
  (void)run(req, reserve_pages, false, fmt::format("pressure {}", policy::to_string(level)));
}

void PressureLoop::grow() {
  const uint64_t have = pool_.counts().total_pages();
  if (have >= pool_target_pages_) return;
  const uint64_t want = pool_target_pages_ - have;
  auto got = pool_.grow(want);
  governor_.record_grow(Clock::now());
  ++counters_.grows;
  const uint64_t ps = pool_.page_size();
  if (!got) {
    ++counters_.resize_failures;
    last_resize_error_ = fmt::format("growing the pool back by {} pages failed: {}", want, got.error().message);
    spdlog::warn("pressure: {}", last_resize_error_);
    return;
  }
  counters_.grown_bytes += *got * ps;
  if (*got < want) {
    ++counters_.resize_failures;
    last_resize_error_ = fmt::format(
        "growing the pool back: the kernel gave {} of {} huge pages of {} (memory is fragmented or in use); the pool "
        "stays at {} of {}; retrying after {} s without pressure",
        *got, want, format_bytes(ps), format_bytes(pool_.counts().total_bytes()),
        format_bytes(pool_target_pages_ * ps), cfg_.grow_after.count());
    spdlog::warn("pressure: {}", last_resize_error_);
  } else {
    spdlog::info("pressure: pool grown back by {} to {}", format_bytes(*got * ps), format_bytes(pool_.counts().total_bytes()));
  }
}

// ---- admin ------------------------------------------------------------------

Result<EvictionReport> PressureLoop::admin_evict(const EvictWhat& what, bool dry_run, const std::string& who) {
  policy::Request req;
  bool any = false;
  if (what.priority) {
    req.priorities = {*what.priority};
    any = true;
  }
  if (what.session) {
    const std::string& path = *what.session;
    const std::string prefix = dbus::kSessionPathPrefix;
    uint64_t id = 0;
    bool ok = path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0;
    if (ok) {
      try {
        size_t used = 0;
        id = std::stoull(path.substr(prefix.size()), &used);
        ok = used == path.size() - prefix.size();
      } catch (const std::exception&) {
        ok = false;
      }
    }
    if (!ok || !evictor_.has_session(id))
      return make_error(ENOENT, "Evict: no session '{}' (see airsctl sessions)", path);
    req.sessions = {id};
    any = true;
  }
  if (what.model) {
    ModelEntry* m = models_.find_by_path(*what.model);
    if (m == nullptr) m = models_.find_by_name(*what.model);
    if (m == nullptr) return make_error(ENOENT, "Evict: no model '{}' is loaded (see airsctl status)", *what.model);
    req.models = {m->id};
    any = true;
  }
  if (what.bytes) {
    if (*what.bytes == 0) return make_error(EINVAL, "Evict: bytes must be a positive uint64 (t)");
    req.bytes = *what.bytes;
    any = true;
  }
  if (!any) return make_error(EINVAL, "Evict: say what to evict: priority, session, model and/or bytes");
  const bool targeted = !req.sessions.empty() || !req.models.empty();
  // A priority names KV of that priority only; a target names only itself.
  if (!req.priorities.empty() || targeted) req.include_cached = false;
  if (!req.priorities.empty() && req.models.empty()) req.include_models = false;
  req.everything = req.bytes == 0;
  auto r = run(req, 0, dry_run, "admin " + who);
  if (!dry_run) ++counters_.admin_evictions;
  // A budget it cut comes back after a quiet period, as after pressure.
  if (!dry_run && !timer_ && below_target()) schedule(Clock::now() + cfg_.grow_after);
  return r;
}

// ---- status -----------------------------------------------------------------

PressureStatus PressureLoop::status() {
  monitor_->refresh();
  const auto now = Clock::now();
  const auto& st = monitor_->status();
  PressureStatus p;
  p.source = pressure::to_string(st.source);
  p.why = st.why;
  p.level = governor_.level();
  p.raw_level = st.level;
  p.level_for_ms = static_cast<uint64_t>(std::max<int64_t>(0, ms_since(governor_.level_since(), now)));
  p.psi = st.psi;
  p.source_mem_available = st.mem_available;
  p.some_events = st.some_events;
  p.full_events = st.full_events;
  p.spurious_events = st.spurious_events;
  p.level_changes = st.level_changes;
  p.samples = st.samples;
  p.source_errors = st.read_errors;
  p.source_last_error = st.last_error;
  p.decision = last_decision_;
  p.damon = damon_;
  p.counters = counters_;
  p.last_resize_error = last_resize_error_;
  p.last_eviction_us = last_duration_us_;
  p.max_eviction_us = max_duration_us_;
  p.resize_pool = cfg_.resize_pool;
  p.pool_target_bytes = pool_target_pages_ * pool_.page_size();
  p.pool_current_bytes = pool_.counts().total_bytes();
  p.floor_bytes = floor_pages_ * pool_.page_size();
  p.target_some_bytes = cfg_.target_some_bytes;
  p.target_full_bytes = cfg_.target_full_bytes;
  for (auto it = last_.rbegin(); it != last_.rend(); ++it)
    p.last_evictions.push_back({static_cast<uint64_t>(std::max<int64_t>(0, ms_since(it->at, now))), it->trigger,
                                action_kind_name(it->outcome.action.kind), it->outcome.object,
                                it->outcome.freed_bytes, it->outcome.action.reason});
  return p;
}

}  // namespace airs::daemon
