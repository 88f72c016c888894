// SPDX-License-Identifier: Apache-2.0
// The cooperative-mode waits (client::wait_rank / wait_range / wait_resident)
// against a status page written by another thread with real futex wakes.
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/lazy_map.hpp"
#include "wire/status_page.hpp"
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

TEST(CooperativeWait, WaitsForEveryUnitOfTheRankThenReturns) {
  Page p;
  ASSERT_TRUE(p.view().valid());
  std::thread filler([&] {
    std::this_thread::sleep_for(20ms);
    p.ready(0, 0);
    std::this_thread::sleep_for(20ms);
    p.ready(1, 1);  // rank 5 half done: its waiter must sleep on
    std::this_thread::sleep_for(30ms);
    p.ready(2, 1);
  });
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(wait_rank(p.view(), 5, 5s));
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(p.view().unit_ready(2)) << "returned before the rank's last unit";
  EXPECT_GE(waited, 60ms);
  filler.join();
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

TEST(CooperativeWait, UnknownRankAndFailedLoadAreErrors) {
  Page p;
  EXPECT_EQ(wait_rank(p.view(), 4, 1s).error().code, EINVAL);
  std::thread failer([&] {
    std::this_thread::sleep_for(20ms);
    p.w.add_failed();
    p.w.set_state(wire::ModelLoadState::Failed);
    p.w.publish();
    sys::futex_wake_all(p.w.generation_word());
  });
  auto st = wait_resident(p.view(), 5s);
  failer.join();
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, EIO);
}

// True when thread `tid` of this process sleeps in futex(2) on `word`
// (/proc/self/task/TID/syscall: the call's number, then its arguments).
bool sleeps_on(pid_t tid, const uint32_t* word) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long nr = -1;
  std::string addr;
  if (!(f >> nr >> addr) || nr != SYS_futex) return false;
  return std::stoull(addr, nullptr, 16) == reinterpret_cast<uintptr_t>(word);
}

// Waits (on the event; the bound only ends a broken run) until every
// thread of `tids` has published its id and sleeps on `word`.
bool all_sleep_on(const std::array<std::atomic<pid_t>, 4>& tids, const uint32_t* word) {
  const auto end = std::chrono::steady_clock::now() + 60s;
  for (const auto& t : tids)
    while (t.load() == 0 || !sleeps_on(t.load(), word)) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::yield();
    }
  return true;
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
