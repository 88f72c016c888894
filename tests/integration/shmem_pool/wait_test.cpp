// SPDX-License-Identifier: Apache-2.0
// The cooperative-mode waits (client::wait_rank / wait_range / wait_resident)
// against a status page written by another thread with real futex wakes.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/lazy_map.hpp"
#include "wire/status_page.hpp"
#include "support/proc_threads.hpp"
#include "sys/proc_handles.hpp"

namespace airs::client {
namespace {

using namespace std::chrono_literals;

struct Page {
  // 3 ranks: rank 0 one unit (0), rank 5 two units (1, 2), rank 9 one unit (3).
  Page() : buf(wire::status_page_bytes(4, 3) / 8 + 1) {
    wire::RankEntry r[3] = {{0, 1, 0, 0}, {5, 2, 0, 0}, {9, 1, 0, 0}};
    w = wire::StatusPageWriter(buf.data(), buf.size() * 8);
    w.init(4096, 4 * 4096, 4, r, 3);
    w.reset(wire::ModelLoadState::Loading);
  }
  wire::StatusPageView view() const { return wire::StatusPageView(buf.data(), buf.size() * 8); }
  void ready(uint32_t unit, uint32_t rank_index) {
    w.set_ready(unit, rank_index);
    w.publish();
    sys::futex_wake_all(w.generation_word());
  }
  std::vector<uint64_t> buf;
  wire::StatusPageWriter w;
};

// Thread `tid` of this process sleeps on `word` as it is now.
bool sleeps_on(pid_t tid, const uint32_t* word) { return test::sleeps_on_futex(::getpid(), tid, word); }

// Waits (on the event; the bound only ends a broken run) until every
// thread of `tids` has published its id and sleeps on `word` as it is now.
template <size_t N>
bool all_sleep_on(const std::array<std::atomic<pid_t>, N>& tids, const uint32_t* word) {
  const auto end = std::chrono::steady_clock::now() + 60s;
  for (const auto& t : tids)
    while (t.load() == 0 || !sleeps_on(t.load(), word)) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::yield();
    }
  return true;
}

// The waiter is provably asleep before each unit becomes ready; a unit of
// another rank and half of its own rank wake it and it sleeps again; it
// returns only once the rank's last unit is ready. No clock is read.
TEST(CooperativeWait, WaitsForEveryUnitOfTheRankThenReturns) {
  Page p;
  ASSERT_TRUE(p.view().valid());
  const uint32_t* word = p.w.generation_word();
  std::array<std::atomic<pid_t>, 1> tid{};
  std::atomic<bool> returned{false};
  bool ok = false, last_unit_ready = false;
  std::thread waiter([&] {
    tid[0] = static_cast<pid_t>(::syscall(SYS_gettid));
    // A long bound: a lost wake fails the test (ETIMEDOUT), never hangs it.
    ok = static_cast<bool>(wait_rank(p.view(), 5, 300s));
    last_unit_ready = p.view().unit_ready(2);
    returned = true;
  });
  EXPECT_TRUE(all_sleep_on(tid, word)) << "the waiter never slept on the status page's futex word";
  EXPECT_FALSE(returned.load()) << "returned with no unit of the rank ready";
  p.ready(0, 0);  // another rank
  EXPECT_TRUE(all_sleep_on(tid, word)) << "the waiter did not sleep again after another rank's unit";
  EXPECT_FALSE(returned.load()) << "returned on another rank's unit";
  p.ready(1, 1);  // rank 5 half done: its waiter must sleep on
  EXPECT_TRUE(all_sleep_on(tid, word)) << "the waiter did not sleep again after half of its rank";
  EXPECT_FALSE(returned.load()) << "returned with half of the rank ready";
  p.ready(2, 1);
  waiter.join();
  EXPECT_TRUE(ok);
  EXPECT_TRUE(last_unit_ready) << "returned before the rank's last unit";
  // Rank 9 never comes: a timeout, not a hang or a false OK.
  auto st = wait_rank(p.view(), 9, 30ms);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ETIMEDOUT);
  // Byte ranges: units 0-2 are ready, unit 3 is not.
  EXPECT_TRUE(wait_range(p.view(), 100, 3 * 4096 - 200, 0ms));
  EXPECT_EQ(wait_range(p.view(), 3 * 4096 - 1, 2, 10ms).error().code, ETIMEDOUT);
  EXPECT_EQ(wait_range(p.view(), 4 * 4096, 1, 10ms).error().code, EINVAL);
  EXPECT_EQ(wait_resident(p.view(), 10ms).error().code, ETIMEDOUT);
}

// A streamed model is never resident: waiting for it is an error at once,
// and a waiter already asleep when the model turns out streamed wakes to it
// (no timeout, no hang).
TEST(CooperativeWait, AWaitForAStreamedModelToBeResidentIsRefusedAtOnce) {
  Page p;
  p.w.set_state(wire::ModelLoadState::Streaming);
  p.w.publish();
  auto st = wait_resident(p.view(), -1ns);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, EFBIG);
  EXPECT_NE(st.error().message.find("streams"), std::string::npos) << st.error().message;
  Page q;
  std::atomic<pid_t> tid{0};
  Status got;
  std::thread waiter([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    got = wait_resident(q.view(), -1ns);
  });
  while (tid.load() == 0 || !sleeps_on(tid.load(), q.w.generation_word())) std::this_thread::yield();
  q.w.set_state(wire::ModelLoadState::Streaming);
  q.w.publish();
  sys::futex_wake_all(q.w.generation_word());
  waiter.join();
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code, EFBIG);
}

// A wait for bytes of a streamed model asks the daemon for their units
// (the touch guard's Wait), one at a time as a touch does: the unit it
// stopped at, never the ones past it (the daemon protects the unit a client
// asked for last). A unit read and dropped again before the wait looked is
// asked for again, as is each unit the wait comes to.
TEST(CooperativeWait, ARangeWaitAsksForItsUnitsAndAgainForOneDropped) {
  Page p;
  p.ready(0, 0);
  p.ready(1, 1);
  const uint32_t* word = p.w.generation_word();
  std::array<std::atomic<pid_t>, 1> tid{};
  std::mutex mu;
  std::vector<uint32_t> asked;
  const auto asks_of = [&](uint32_t u) {
    std::lock_guard lk(mu);
    return std::count(asked.begin(), asked.end(), u);
  };
  bool ok = false;
  std::thread waiter([&] {
    tid[0] = static_cast<pid_t>(::syscall(SYS_gettid));
    // Units 1 (ready), 2 and 3; a long bound: a lost wake fails, never hangs.
    ok = static_cast<bool>(wait_range(p.view(), 4096 + 10, 3 * 4096 - 20, 300s, nullptr, [&](uint32_t u) {
      std::lock_guard lk(mu);
      asked.push_back(u);
    }));
  });
  ASSERT_TRUE(all_sleep_on(tid, word)) << "the waiter never slept";
  EXPECT_EQ(asks_of(1), 0) << "asked for a unit that was ready";
  EXPECT_EQ(asks_of(2), 1) << "the unit the wait stopped at was not asked for";
  EXPECT_EQ(asks_of(3), 0) << "asked for a unit past the one it waits for";
  // Unit 2 is read, then dropped again before the wait looked.
  p.w.set_ready(2, 1);
  p.w.publish();
  p.w.set_empty(2, 1);
  p.w.publish();
  sys::futex_wake_all(word);
  ASSERT_TRUE(all_sleep_on(tid, word)) << "the waiter returned with unit 2 gone";
  EXPECT_GE(asks_of(2), 2) << "unit 2, read and dropped before the wait saw it, was not asked for again";
  EXPECT_EQ(asks_of(3), 0);
  p.ready(2, 1);
  ASSERT_TRUE(all_sleep_on(tid, word)) << "the waiter returned before unit 3 was ready";
  EXPECT_GE(asks_of(3), 1) << "unit 3, which the wait came to, was not asked for";
  p.ready(3, 2);
  waiter.join();
  EXPECT_TRUE(ok);
}

// A failed load ends a waiter that is asleep on it (EIO), not only one that
// looks after the failure.
TEST(CooperativeWait, UnknownRankAndFailedLoadAreErrors) {
  Page p;
  EXPECT_EQ(wait_rank(p.view(), 4, 1s).error().code, EINVAL);
  std::array<std::atomic<pid_t>, 1> tid{};
  int code = 0;
  std::thread waiter([&] {
    tid[0] = static_cast<pid_t>(::syscall(SYS_gettid));
    auto st = wait_resident(p.view(), 300s);
    code = st ? 0 : st.error().code;
  });
  EXPECT_TRUE(all_sleep_on(tid, p.w.generation_word())) << "the waiter never slept on the status page's futex word";
  p.w.add_failed();
  p.w.set_state(wire::ModelLoadState::Failed);
  p.w.publish();
  sys::futex_wake_all(p.w.generation_word());
  waiter.join();
  EXPECT_EQ(code, EIO);
}

// Each waiter is provably asleep on the status page's futex word before a
// unit becomes ready; units that leave the model short of resident wake
// them and they sleep again; the last one wakes every one, none left behind.
TEST(CooperativeWait, ResidentWakesEveryWaiter) {
  Page p;
  const uint32_t* word = p.w.generation_word();
  std::array<std::atomic<pid_t>, 4> tids{};
  std::atomic<int> ok{0}, returned{0};
  std::vector<std::thread> ts;
  for (auto& tid : tids)
    ts.emplace_back([&] {
      tid = static_cast<pid_t>(::syscall(SYS_gettid));
      // A long bound: a lost wake fails the test (ETIMEDOUT), never hangs it.
      if (wait_resident(p.view(), 300s)) ++ok;
      ++returned;
    });
  const bool asleep = all_sleep_on(tids, word);
  const int early = returned.load();
  for (uint32_t u = 0; u < 3; ++u) p.ready(u, u == 0 ? 0 : 1);
  const bool asleep_again = asleep && all_sleep_on(tids, word);
  const int short_of_resident = returned.load();
  p.ready(3, 2);
  for (auto& t : ts) t.join();
  EXPECT_TRUE(asleep) << "a waiter never slept on the status page's futex word";
  EXPECT_EQ(early, 0);
  EXPECT_TRUE(asleep_again) << "a waiter did not sleep again after units short of residency";
  EXPECT_EQ(short_of_resident, 0) << "a waiter returned before the model was resident";
  EXPECT_EQ(ok.load(), 4);
}

}  // namespace
}  // namespace airs::client
