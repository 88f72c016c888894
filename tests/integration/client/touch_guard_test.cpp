// SPDX-License-Identifier: Apache-2.0
// The touch guard (libairs' cooperative mode) on an unloaded model: a touch
// is let through, to take the truncated region's SIGBUS, only once the
// region really is truncated. A region still its full length has holes
// where a streamed model's units were dropped or a load had not reached:
// reading one there would give zeros, so the process ends with SIGBUS
// instead. Real memfds, real mappings, the real SIGSEGV handler, each in a
// forked child.
//
// And on a streamed model, what a touch asks the daemon for while it waits:
// a unit read and dropped again before the touch opened it is asked for
// again, or the thread would wait for ever.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "client/touch_guard.hpp"
#include "support/proc_threads.hpp"
#include "sys/proc_handles.hpp"
#include "wire/opened.hpp"
#include "wire/requests.hpp"
#include "wire/status_page.hpp"

namespace {

namespace wire = airs::wire;

constexpr uint32_t kUnits = 4;

std::string describe(int st) {
  if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("signal ") + strsignal(WTERMSIG(st));
  return "status " + std::to_string(st);
}

struct Region {
  uint64_t unit = 16 * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  int fd = -1;
  int status_fd = -1;
  void* status = nullptr;
  uint64_t status_len = 0;

  // Units 0 and 1 hold 0xAB; units 2 and 3 are holes. The status page says
  // `state`, with no unit ready.
  explicit Region(wire::ModelLoadState state) {
    fd = ::memfd_create("airs-test-region", MFD_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(kUnits * unit)), 0);
    std::string bytes(2 * unit, '\xab');
    EXPECT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    status_len = wire::status_page_bytes(kUnits, 1);
    status = ::mmap(nullptr, status_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(status, MAP_FAILED);
    wire::StatusPageWriter w(status, status_len);
    const wire::RankEntry rank{0, kUnits, 0, 0};
    w.init(unit, kUnits * unit, kUnits, &rank, 1);
    w.reset(state);
    w.publish();
  }
  ~Region() {
    ::munmap(status, status_len);
    ::close(fd);
  }

  // Forks a child that guards a PROT_NONE mapping of the region and reads
  // one byte of `unit_index`: exit 3 if it read zero, 4 if another value.
  int touch_in_child(uint32_t unit_index, bool give_region_fd) const {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(30);
      // The kernel's SIGBUS ends the child, not a sanitizer's report of it.
      ::signal(SIGBUS, SIG_DFL);
      void* base = ::mmap(nullptr, kUnits * unit, PROT_NONE, MAP_SHARED, fd, 0);
      if (base == MAP_FAILED) _exit(20);
      airs::client::TouchGuardSpec spec;
      spec.base = base;
      spec.size = kUnits * unit;
      spec.status = wire::StatusPageView(status, status_len);
      spec.gguf_fd = fd;
      spec.region_fd = give_region_fd ? fd : -1;
      auto g = airs::client::TouchGuard::create(spec);
      if (!g) _exit(21);
      const auto* p = static_cast<volatile const unsigned char*>(base) + uint64_t{unit_index} * unit;
      _exit(*p == 0 ? 3 : 4);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    return st;
  }
};

TEST(TouchGuardUnloaded, AHoleOfARegionNotYetTruncatedIsSigbusNotZeros) {
  Region r(wire::ModelLoadState::Unloaded);
  const int st = r.touch_in_child(2, true);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) << describe(st) << " (exit 3: it read the hole's zeros)";
}

TEST(TouchGuardUnloaded, AUnitWithBytesOfARegionNotYetTruncatedIsSigbusToo) {
  // Its bytes are still there, but the model is gone: nothing is opened.
  Region r(wire::ModelLoadState::Unloaded);
  const int st = r.touch_in_child(0, true);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) << describe(st);
}

TEST(TouchGuardUnloaded, ATruncatedRegionGivesTheKernelsSigbus) {
  Region r(wire::ModelLoadState::Unloaded);
  ASSERT_EQ(::ftruncate(r.fd, 0), 0);
  for (bool give : {true, false}) {
    const int st = r.touch_in_child(1, give);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) << describe(st) << " region fd given: " << give;
  }
}

// Waits (on the event; the bound only ends a broken run) until `pid` sleeps
// on `word` as it is now.
bool wait_asleep(pid_t pid, const uint32_t* word) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!airs::test::sleeps_on_futex(pid, pid, word)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

// The request words waiting in `fd` now (none blocks).
std::vector<airs::wire::Request> pending_requests(int fd) {
  std::vector<airs::wire::Request> out;
  uint32_t w = 0;
  while (::recv(fd, &w, sizeof w, MSG_DONTWAIT) == static_cast<ssize_t>(sizeof w))
    out.push_back(airs::wire::decode_request(w));
  return out;
}

size_t waits_for(const std::vector<airs::wire::Request>& rs, uint32_t unit) {
  size_t n = 0;
  for (const auto& r : rs) n += r.kind == airs::wire::RequestKind::Wait && r.unit == unit ? 1 : 0;
  return n;
}

// A streamed model's unit is read (READY) and dropped again (another
// client's read needed the room) between the wake of a touch waiting for
// it and its open. The daemon's read answered the touch's ask, so unless
// the touch asks again nothing reads the unit and the thread waits for
// ever (the soak saw three cooperative clients hang so under a budget cut
// to the floor). It asks again, once per change of the page, and reads the
// unit's bytes once it is ready. The child's waits are observed in
// /proc, never timed.
TEST(TouchGuardStreamed, AUnitReadAndDroppedBeforeTheTouchOpenedItIsAskedForAgain) {
  Region r(wire::ModelLoadState::Streaming);
  wire::StatusPageWriter w(r.status, r.status_len);
  const uint32_t* word = w.generation_word();
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  const uint64_t opened_len = wire::opened_bytes(kUnits);
  void* opened = ::mmap(nullptr, opened_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(opened, MAP_FAILED);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(120);
    void* base = ::mmap(nullptr, kUnits * r.unit, PROT_NONE, MAP_SHARED, r.fd, 0);
    if (base == MAP_FAILED) _exit(20);
    airs::client::TouchGuardSpec spec;
    spec.base = base;
    spec.size = kUnits * r.unit;
    spec.status = wire::StatusPageView(r.status, r.status_len);
    spec.gguf_fd = r.fd;
    spec.region_fd = r.fd;
    spec.request_fd = sv[1];
    spec.opened = opened;
    auto g = airs::client::TouchGuard::create(spec);
    if (!g) _exit(21);
    const auto* p = static_cast<volatile const unsigned char*>(base) + r.unit + 5;
    _exit(*p == 0xab ? 4 : *p == 0 ? 3 : 5);
  }
  ::close(sv[1]);
  ASSERT_TRUE(wait_asleep(pid, word)) << "the touch never waited on the status page";
  auto rs = pending_requests(sv[0]);
  EXPECT_EQ(waits_for(rs, 1), 1U) << "the touch did not ask for its unit once";
  // Read, then dropped before the touch looked: one publish, so the touch
  // cannot see the unit ready in between, however its wait slices fall.
  w.set_ready(1, 0);
  w.set_empty(1, 0);
  w.publish();
  airs::sys::futex_wake_all(w.generation_word());
  ASSERT_TRUE(wait_asleep(pid, word)) << "the touch did not wait again";
  rs = pending_requests(sv[0]);
  EXPECT_EQ(waits_for(rs, 1), 1U) << "the unit, read and dropped before the touch opened it, was not asked for again";
  // No change of the page, no ask: a wait slice that ends asks nothing.
  ::usleep(3 * airs::client::TouchGuard::kSliceNs / 1000);
  ASSERT_TRUE(wait_asleep(pid, word));
  EXPECT_EQ(waits_for(pending_requests(sv[0]), 1), 0U) << "asked again with nothing changed";
  // Now it is read for good: the touch opens it (and says so) and reads its bytes.
  w.set_ready(1, 0);
  w.publish();
  airs::sys::futex_wake_all(w.generation_word());
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 4) << describe(st) << " (exit 3: zeros, 5: other bytes)";
  rs = pending_requests(sv[0]);
  bool said_opened = false;
  for (const auto& q : rs) said_opened = said_opened || (q.kind == wire::RequestKind::Opened && q.unit == 1);
  EXPECT_TRUE(said_opened) << "the touch opened unit 1 without telling the daemon";
  ::close(sv[0]);
  ::munmap(opened, opened_len);
}

}  // namespace
