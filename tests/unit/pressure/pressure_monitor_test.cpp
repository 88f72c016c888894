// SPDX-License-Identifier: Apache-2.0
#include "pressure/pressure_monitor.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "fixture.hpp"

using namespace airs;
using namespace airs::pressure;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

namespace {

struct Change {
  Level now;
  Level before;
  bool operator==(const Change&) const = default;
};

struct Harness {
  std::unique_ptr<sys::EventLoop> loop;
  std::vector<Change> changes;
  Harness() {
    auto l = sys::EventLoop::create();
    EXPECT_TRUE(l.ok());
    loop = std::move(*l);
  }
  PressureMonitor::Callback callback() {
    return [this](Level now, Level before) { changes.push_back({now, before}); };
  }
  // Runs the loop until `done` or `limit` passes; returns whether done.
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (!done()) {
      if (Clock::now() >= end) return false;
      auto r = loop->run_once(10ms);
      EXPECT_TRUE(r.ok());
    }
    return true;
  }
  // Runs the loop for `d` regardless.
  void run_for(std::chrono::milliseconds d) { run_until([] { return false; }, d); }
  // Runs the loop until the monitor has read its file `n` more times. A
  // tick dispatched after a fixture write reads the new text, so after this
  // the monitor has judged it: a check of "nothing happened" is then about
  // the monitor, not about how soon the loop got to the timer.
  bool run_samples(const PressureMonitor& m, uint64_t n, std::chrono::milliseconds limit = 5s) {
    const uint64_t want = m.status().samples + n;
    return run_until([&] { return m.status().samples >= want; }, limit);
  }
};

Config poll_psi_config(const test::FixtureDir& d) {
  Config c;
  c.source = Source::PollPsi;
  c.psi_path = d.path("memory");
  c.mild = {sys::PsiKind::Some, 20ms, 400ms};
  c.severe = {sys::PsiKind::Full, 50ms, 400ms};
  c.poll_interval = 50ms;
  // The daemon's own hold: 2 × 400 ms + 100 ms + one interval = 950 ms,
  // twice a window and more past the kernel-like at most one event per
  // window, so a loaded machine that is late to a tick does not flap it.
  c.hold = 0ms;
  return c;
}

}  // namespace

TEST(PressureMonitor, PollPsiRisesWithStallTimeAndDecays) {
  test::FixtureDir d("pm-poll-psi");
  d.write("memory", test::psi_text(1000, 500));
  Harness h;
  auto m = PressureMonitor::create(*h.loop, poll_psi_config(d), h.callback());
  ASSERT_TRUE(m) << m.error().message;
  auto& mon = **m;
  EXPECT_EQ(mon.status().source, Source::PollPsi);
  EXPECT_EQ(mon.status().why, "polling " + d.path("memory") + " every 50 ms: forced by config");
  EXPECT_EQ(mon.level(), Level::None);

  // Stall below the mild threshold: nothing, once ticks have read it.
  d.write("memory", test::psi_text(1000 + 19000, 500));
  ASSERT_TRUE(h.run_samples(mon, 2));
  EXPECT_EQ(mon.level(), Level::None);
  EXPECT_TRUE(h.changes.empty());

  // 30 ms of `some` stall within the window: Some; avg10 is picked up.
  d.write("memory", test::psi_text(1000 + 19000 + 30000, 500, 12.5, 0.0));
  ASSERT_TRUE(h.run_until([&] { return mon.level() == Level::Some; }, 5s));
  ASSERT_TRUE(mon.status().psi.has_value());
  EXPECT_DOUBLE_EQ(mon.status().psi->some.avg10, 12.5);
  EXPECT_EQ(mon.status().some_events, 1u);  // a fixture file: nothing else stalls in it

  // 60 ms of `full` stall: Full.
  d.write("memory", test::psi_text(1000 + 19000 + 30000, 500 + 60000));
  ASSERT_TRUE(h.run_until([&] { return mon.level() == Level::Full; }, 5s));
  EXPECT_EQ(mon.status().full_events, 1u);

  // No more stall: back to None once the hold passed.
  ASSERT_TRUE(h.run_until([&] { return mon.level() == Level::None; }, 5s));
  EXPECT_EQ(h.changes, (std::vector<Change>{{Level::Some, Level::None}, {Level::Full, Level::Some}, {Level::None, Level::Full}}));
  EXPECT_EQ(mon.status().level_changes, 3u);
  EXPECT_GE(mon.status().samples, 5u);
}

TEST(PressureMonitor, PollPsiHoldsUnderSustainedStall) {
  test::FixtureDir d("pm-poll-sustained");
  uint64_t some = 0;
  d.write("memory", test::psi_text(some, 0));
  Harness h;
  auto m = PressureMonitor::create(*h.loop, poll_psi_config(d), h.callback());
  ASSERT_TRUE(m) << m.error().message;
  const auto start = Clock::now();
  // Stalled a fifth of the time, as measured by the clock and not counted
  // per tick (a loaded machine may run a 50 ms tick half a second late, and
  // a fixed amount per tick would then look like the stall had eased):
  // 80 ms per 400 ms window, above 20 ms however late the loop is. Stall
  // goes on until four events were counted (about 1.3 s when the loop is on
  // time); the deadline only matters if events stop coming.
  const auto end = start + 10s;
  auto written = start;
  while ((*m)->status().some_events < 4 && Clock::now() < end) {
    const auto now = Clock::now();
    some += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(now - written).count() / 5);
    written = now;
    d.write("memory", test::psi_text(some, 0));
    h.run_for(50ms);
  }
  const auto elapsed = Clock::now() - start;
  ASSERT_GE((*m)->status().some_events, 4u) << "events stopped under sustained stall";
  EXPECT_EQ((*m)->level(), Level::Some);
  ASSERT_EQ(h.changes.size(), 1u) << "the level flapped";
  // At most one event per window, like the kernel, however late the loop
  // was: n events span at least n - 1 windows.
  EXPECT_LE((*m)->status().some_events, 1 + static_cast<uint64_t>(elapsed / 400ms));
}

TEST(PressureMonitor, SampleIntervalNeverBelow50ms) {
  test::FixtureDir d("pm-floor");
  d.write("memory", test::psi_text(0, 0));
  Harness h;
  auto c = poll_psi_config(d);
  c.poll_interval = 5ms;
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_THAT((*m)->status().why, HasSubstr("every 50 ms"));
  ASSERT_EQ((*m)->status().samples, 1u);  // the baseline, read in create()
  ASSERT_TRUE((*m)->status().psi_read_at.has_value());
  const auto baseline = *(*m)->status().psi_read_at;
  // Judged on the monitor's own read times, not on how many ticks a
  // possibly late loop got through in a fixed time: after the baseline,
  // every read is at least 50 ms after the one before (5 ms would put five
  // reads within ~25 ms).
  ASSERT_TRUE(h.run_samples(**m, 5));
  const uint64_t n = (*m)->status().samples;
  EXPECT_GE(*(*m)->status().psi_read_at - baseline, static_cast<int64_t>(n - 1) * kMinSampleInterval)
      << n << " reads in " << std::chrono::duration_cast<std::chrono::milliseconds>(*(*m)->status().psi_read_at - baseline).count()
      << " ms";
}

TEST(PressureMonitor, PollMeminfoUsesMemAvailableBounds) {
  test::FixtureDir d("pm-meminfo");
  auto meminfo = [&](uint64_t avail_kb) {
    d.write("meminfo", "MemTotal:        1000000 kB\nMemFree:          1000 kB\nMemAvailable:   " +
                           std::to_string(avail_kb) + " kB\n");
  };
  meminfo(500000);
  Harness h;
  Config c;
  c.source = Source::PollMeminfo;
  c.meminfo_path = d.path("meminfo");
  c.poll_interval = 50ms;
  c.hold = 0ms;  // the daemon's own: 950 ms (see poll_psi_config)
  c.mild.window = 400ms;
  c.severe.window = 400ms;
  c.meminfo_some_fraction = 0.10;
  c.meminfo_full_fraction = 0.05;
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_TRUE(m) << m.error().message;
  auto& mon = **m;
  EXPECT_EQ(mon.status().why, "polling " + d.path("meminfo") + " every 50 ms: forced by config");
  // No reading in create(): the first comes with the first tick.
  ASSERT_TRUE(h.run_samples(mon, 2));
  EXPECT_EQ(mon.level(), Level::None);
  ASSERT_TRUE(mon.status().mem_available.has_value());
  EXPECT_EQ(*mon.status().mem_available, 500000u * 1024);
  EXPECT_EQ(*mon.status().mem_total, 1000000u * 1024);

  meminfo(100000);  // exactly 10 %: not below
  ASSERT_TRUE(h.run_samples(mon, 2));
  EXPECT_EQ(mon.level(), Level::None);
  meminfo(99999);
  ASSERT_TRUE(h.run_until([&] { return mon.level() == Level::Some; }, 5s));
  meminfo(30000);
  ASSERT_TRUE(h.run_until([&] { return mon.level() == Level::Full; }, 5s));
  meminfo(600000);
  ASSERT_TRUE(h.run_until([&] { return mon.level() == Level::None; }, 5s));
  EXPECT_EQ(h.changes, (std::vector<Change>{{Level::Some, Level::None}, {Level::Full, Level::Some}, {Level::None, Level::Full}}));
}

TEST(PressureMonitor, MeminfoByteBoundsBeatFractions) {
  test::FixtureDir d("pm-meminfo-bytes");
  d.write("meminfo", "MemTotal: 1000000 kB\nMemAvailable: 400000 kB\n");
  Harness h;
  Config c;
  c.source = Source::PollMeminfo;
  c.meminfo_path = d.path("meminfo");
  c.poll_interval = 50ms;
  c.meminfo_some_bytes = 512 * 1024 * 1024;  // 512 MiB > 400000 kB
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_TRUE(m) << m.error().message;
  ASSERT_TRUE(h.run_until([&] { return (*m)->level() == Level::Some; }, 5s));
}

TEST(PressureMonitor, AutoFallsBackToMeminfoWhenPsiIsDisabled) {
  test::FixtureDir d("pm-auto-nopsi");
  d.write("meminfo", "MemTotal: 1000000 kB\nMemAvailable: 900000 kB\n");
  Harness h;
  Config c;
  c.psi_path = d.path("pressure/memory");  // as on a Raspberry Pi kernel without psi=1
  c.meminfo_path = d.path("meminfo");
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ((*m)->status().source, Source::PollMeminfo);
  EXPECT_THAT((*m)->status().why, HasSubstr("polling " + d.path("meminfo") + " every 500 ms: PSI is disabled"));
  EXPECT_THAT((*m)->status().why, HasSubstr("boot with psi=1"));
}

TEST(PressureMonitor, AutoPollsThePsiFileWhenTriggersCannotBeCreated) {
  test::FixtureDir d("pm-auto-poll");
  d.write("memory", test::psi_text(0, 0));
  Harness h;
  Config c;
  c.psi_path = d.path("memory");  // readable, but no trigger can be put on it
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ((*m)->status().source, Source::PollPsi);
  EXPECT_THAT((*m)->status().why, HasSubstr("every 500 ms: cannot create PSI triggers: "));
  EXPECT_THAT((*m)->status().why, HasSubstr("not a kernel pressure file"));
}

TEST(PressureMonitor, NothingReadableIsAnError) {
  test::FixtureDir d("pm-none");
  Harness h;
  Config c;
  c.psi_path = d.path("pressure/memory");
  c.meminfo_path = d.path("meminfo");
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_FALSE(m);
  EXPECT_THAT(m.error().message, HasSubstr("no pressure source works"));
  EXPECT_THAT(m.error().message, HasSubstr("meminfo"));
}

TEST(PressureMonitor, ForcedTriggersFailLoudly) {
  test::FixtureDir d("pm-forced");
  Harness h;
  Config c;
  c.source = Source::PsiTriggers;
  c.psi_path = d.path("pressure/memory");
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_FALSE(m);
  EXPECT_THAT(m.error().message, HasSubstr("psi=1"));
}

TEST(PressureMonitor, RealTriggersAreTheAutoChoiceHere) {
  Harness h;
  auto m = PressureMonitor::create(*h.loop, Config{}, h.callback());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ((*m)->status().source, Source::PsiTriggers);
  EXPECT_EQ((*m)->status().why, "psi triggers on /proc/pressure/memory (some 150ms/2s, full 100ms/2s)");
  EXPECT_TRUE((*m)->status().psi.has_value());
  // Destruction takes its fds out of the loop: the loop keeps working.
  m = make_error(0, "gone");
  EXPECT_TRUE(h.loop->run_once(0ms).ok());
}

TEST(PressureMonitor, HoldShorterThanAWindowIsRefused) {
  Harness h;
  Config c;
  c.source = Source::PollMeminfo;
  c.hold = 2000ms;  // == the default 2 s windows
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, EINVAL);
  EXPECT_THAT(m.error().message, HasSubstr("must be longer than the trigger windows"));
}

TEST(PressureMonitor, MildMustBeSomeAndSevereFull) {
  Harness h;
  Config c;
  c.mild.kind = sys::PsiKind::Full;
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_FALSE(m);
  EXPECT_EQ(m.error().code, EINVAL);
}

TEST(PressureMonitor, OffReadsNothingAndStaysAtNone) {
  test::FixtureDir d("pm-off");
  d.write("memory", test::psi_text(0, 0));
  Harness h;
  Config c = poll_psi_config(d);
  c.source = Source::Off;
  auto m = PressureMonitor::create(*h.loop, c, h.callback());
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ((*m)->status().source, Source::Off);
  EXPECT_STREQ(to_string((*m)->status().source), "off");
  EXPECT_EQ((*m)->status().why, "off by config: nothing is freed for the machine's memory pressure");
  // A stall that the polling source turns into Full within one tick
  // (PollPsiRisesWithStallTimeAndDecays): here nothing reads it.
  d.write("memory", test::psi_text(900000, 900000));
  h.run_for(300ms);
  (*m)->refresh();
  EXPECT_EQ((*m)->level(), Level::None);
  EXPECT_TRUE(h.changes.empty());
  EXPECT_EQ((*m)->status().samples, 0u);
  EXPECT_EQ((*m)->status().some_events + (*m)->status().full_events, 0u);
  EXPECT_FALSE((*m)->status().psi.has_value());
}
