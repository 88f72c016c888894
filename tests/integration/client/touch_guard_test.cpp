// SPDX-License-Identifier: Apache-2.0
// The touch guard (libairs' cooperative mode) on an unloaded model: a touch
// is let through, to take the truncated region's SIGBUS, only once the
// region really is truncated. A region still its full length has holes
// where a streamed model's units were dropped or a load had not reached:
// reading one there would give zeros, so the process ends with SIGBUS
// instead. Real memfds, real mappings, the real SIGSEGV handler, each in a
// forked child.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "client/touch_guard.hpp"
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

}  // namespace
