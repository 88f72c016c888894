// SPDX-License-Identifier: Apache-2.0
// PSI under real memory pressure: a memcg-limited child refaulting a working
// set larger than its limit. The triggers are system-wide
// (/proc/pressure/memory) with 2 s windows: this VM withholds
// CAP_SYS_RESOURCE even from root, and 2 s windows are what the daemon can
// use here too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "memcg_stressor.hpp"
#include "pressure/pressure_monitor.hpp"

using namespace airs;
using namespace airs::pressure;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kLimit = 64 * kMiB;
constexpr uint64_t kWorkingSet = 256 * kMiB;

std::unique_ptr<test::MemcgStressor> make_stressor() {
  if (::geteuid() != 0) return nullptr;
  const auto t = Clock::now();
  auto s = test::MemcgStressor::create(kLimit, kWorkingSet);
  std::printf("the stressor's working set written in %lld ms\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count()));
  if (!s) {
    ADD_FAILURE() << "cannot set up memory pressure: " << s.error().message;
    return nullptr;
  }
  return std::move(*s);
}

struct LoopRun {
  std::unique_ptr<sys::EventLoop> loop;
  std::vector<std::pair<Level, Clock::time_point>> changes;
  LoopRun() {
    auto l = sys::EventLoop::create();
    EXPECT_TRUE(l.ok());
    loop = std::move(l).value();
  }
  PressureMonitor::Callback callback() {
    return [this](Level now, Level) { changes.emplace_back(now, Clock::now()); };
  }
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (!done()) {
      if (Clock::now() >= end) return false;
      EXPECT_TRUE(loop->run_once(50ms).ok());
    }
    return true;
  }
};

int64_t ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

// Pressure from other work on the machine would make a "fires" test pass
// for the wrong reason; start only from a quiet system. The level holds
// 4.5 s after the last event, so a previous test's stall (a guest under TCG
// compacting for huge pages) can keep it up for a while: the deadline is
// for a machine that never calms down, and the wait is printed.
bool wait_quiet(LoopRun& r, PressureMonitor& m) {
  const auto t = Clock::now();
  const bool quiet = r.run_until([&] { return m.level() == Level::None; }, 30s);
  std::printf("waited %lld ms for a quiet machine\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count()));
  return quiet;
}

}  // namespace

TEST(PsiPressure, TriggersFireUnderMemcgPressureAndDecay) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a memory cgroup";
  LoopRun r;
  // One stressor on an idle 2-CPU machine stalls ~75–160 ms/s "some" and
  // ~30–65 ms/s "full": thresholds well below that, so the test checks the
  // mechanism rather than how hard the stressor happens to push.
  Config c;
  c.source = Source::PsiTriggers;
  c.mild = {sys::PsiKind::Some, 50ms, 2s};
  c.severe = {sys::PsiKind::Full, 20ms, 2s};
  auto m = PressureMonitor::create(*r.loop, c, r.callback());
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_TRUE(wait_quiet(r, **m)) << "the machine stayed under memory pressure for 30 s";
  r.changes.clear();
  // PSI is system-wide: other work may add events, so counts are judged as
  // "at least one more", never as exact numbers.
  const uint64_t some_before = (*m)->status().some_events;
  const uint64_t full_before = (*m)->status().full_events;

  auto stress = make_stressor();
  ASSERT_TRUE(stress);
  const auto t0 = Clock::now();
  ASSERT_TRUE(stress->start().ok());
  // A trigger fires at most once per window. Kernels without "psi: Fix avg
  // trigger being fired unexpectedly" (this 6.18 among them) may spend the
  // first window's event on the first stall, below the threshold; the
  // monitor drops that one (spurious_events), so the real event can come a
  // window later: within three windows of the stall starting. The printout
  // shows the real latency.
  // How soon is printed, never asserted: under TCG on a busy 2-core host
  // the stressor's own start takes seconds. The deadline only decides when
  // a trigger that never fires has failed.
  ASSERT_TRUE(r.run_until([&] { return (*m)->level() != Level::None; }, 30s))
      << "no PSI event within 30 s of memcg pressure in " << stress->cgroup() << " (spurious first events dropped: "
      << (*m)->status().spurious_events << ")";
  const auto fired = r.changes.front().second;
  std::printf("PSI trigger (%s) fired %lld ms after the stressor started (window 2000 ms; spurious first events dropped: %llu)\n",
              to_string(r.changes.front().first), static_cast<long long>(ms_between(t0, fired)),
              static_cast<unsigned long long>((*m)->status().spurious_events));
  // A level above None says only that one trigger's event was processed,
  // usually the "full" one: the kernel wakes the two trigger fds one after
  // the other, the loop can return from epoll_wait between the two
  // wake-ups, and the "some" threshold (2.5 × the full one) may be crossed
  // only at the next evaluation, a window later. Reading some_events right
  // then raced that second event. So every count below is waited for on
  // the monitor's own loop until its event has been dispatched.
  //
  // Nor do the first events of an unprivileged trigger prove a threshold
  // crossing on this kernel: the trigger's window starts from the PSI_POLL
  // total instead of the PSI_AVGS one (a kernel bug), so the first stall
  // after creation fires it whatever the threshold, and the inflated growth
  // carries into the next window (measured: a "some 1999ms/2s" trigger
  // fired twice on ~100 ms/s of stall, and this test passed with it). A
  // third event needs stall past the threshold. So each trigger must fire
  // at least three times since the monitor was created, and once since the
  // stressor started (PSI is system-wide: other work may add events, so
  // never an exact count). The deadline covers three windows after the
  // first event plus room for reads that delay evaluations; a trigger that
  // never crosses its threshold fails here. Every window must cross for
  // three events in three windows; on a starved guest some do not, so the
  // deadline is for a trigger that stopped firing, not for a slow one.
  constexpr uint64_t kBeyondTheKernelsFreeEvents = 3;
  auto crossed = [&](uint64_t events, uint64_t before) { return events >= kBeyondTheKernelsFreeEvents && events > before; };
  EXPECT_TRUE(r.run_until(
      [&] {
        const auto& st = (*m)->status();
        return crossed(st.some_events, some_before) && crossed(st.full_events, full_before);
      },
      60s))
      << "within 60 s under memcg pressure in " << stress->cgroup() << " the triggers fired some " << (*m)->status().some_events
      << " / full " << (*m)->status().full_events << " times (at least " << kBeyondTheKernelsFreeEvents
      << " each needed; before the stressor: some " << some_before << " / full " << full_before << ")";
  // Sustained pressure keeps the level up (no flapping while it lasts):
  // every change the loop reported since the first, not one look at the
  // end, must stay above None.
  for (size_t i = 1; i < r.changes.size(); ++i)
    EXPECT_NE(r.changes[i].first, Level::None) << "the level dropped to none " << ms_between(t0, r.changes[i].second)
                                               << " ms after the stressor started, under sustained pressure";
  EXPECT_NE((*m)->level(), Level::None);
  (*m)->refresh();
  ASSERT_TRUE((*m)->status().psi.has_value());
  EXPECT_GT((*m)->status().psi->some.avg10, 0.0);
  std::printf("avg10 some %.2f full %.2f; events some %llu full %llu, the last %lld ms after the stressor started\n",
              (*m)->status().psi->some.avg10, (*m)->status().psi->full.avg10,
              static_cast<unsigned long long>((*m)->status().some_events),
              static_cast<unsigned long long>((*m)->status().full_events), static_cast<long long>(ms_between(t0, Clock::now())));

  // Pressure gone: the level decays by itself (hold 4.5 s after the last
  // event, which may come up to two windows after the stall stopped when
  // the pressure file was read; the deadline leaves room for a loaded
  // machine and only matters when the level never comes down).
  stress->stop();
  const auto t1 = Clock::now();
  ASSERT_TRUE(r.run_until([&] { return (*m)->level() == Level::None; }, 30s))
      << "the level never decayed after the stressor died (30 s)";
  std::printf("level back to none %lld ms after the stressor died\n", static_cast<long long>(ms_between(t1, Clock::now())));
}

TEST(PsiPressure, PollingFallbackSeesTheSamePressure) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a memory cgroup";
  LoopRun r;
  Config c;
  c.source = Source::PollPsi;
  c.poll_interval = 100ms;
  c.mild = {sys::PsiKind::Some, 50ms, 2s};
  c.severe = {sys::PsiKind::Full, 20ms, 2s};
  auto m = PressureMonitor::create(*r.loop, c, r.callback());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ((*m)->status().why, "polling /proc/pressure/memory every 100 ms: forced by config");
  ASSERT_TRUE(wait_quiet(r, **m)) << "the machine stayed under memory pressure for 30 s";
  r.changes.clear();

  auto stress = make_stressor();
  ASSERT_TRUE(stress);
  const auto t0 = Clock::now();
  ASSERT_TRUE(stress->start().ok());
  ASSERT_TRUE(r.run_until([&] { return (*m)->level() != Level::None; }, 30s))
      << "polling saw no pressure within 30 s of memcg pressure in " << stress->cgroup();
  std::printf("polling fallback reported %s %lld ms after the stressor started\n", to_string((*m)->level()),
              static_cast<long long>(ms_between(t0, r.changes.front().second)));
  EXPECT_GE((*m)->status().samples, 2u);  // the baseline and the tick that judged
  EXPECT_GE((*m)->status().some_events + (*m)->status().full_events, 1u);
  stress->stop();
  ASSERT_TRUE(r.run_until([&] { return (*m)->level() == Level::None; }, 30s))
      << "the polled level never decayed after the stressor died (30 s)";
}
