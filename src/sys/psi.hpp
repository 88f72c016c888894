// SPDX-License-Identifier: Apache-2.0
// Pressure stall information (PSI): reading /proc/pressure/memory (or a
// cgroup's memory.pressure) and creating PSI triggers.
//
// File format (Documentation/accounting/psi.rst):
//   some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//   full avg10=0.00 avg60=0.00 avg300=0.00 total=0
// avgN are percentages of wall time stalled over N seconds; total is
// cumulative stall time in microseconds.
//
// A trigger is a write of "<some|full> <threshold us> <window us>" to the
// open file; the fd then signals POLLPRI (EPOLLPRI) at most once per window
// when stall time within the window exceeds the threshold, and POLLERR when
// the file goes away (cgroup removed). Kernel rules (checked on 6.18):
//   - the written string must include its terminating NUL: the kernel
//     overwrites the last byte written with one, so "some 150000 2000000"
//     without it becomes a 200 ms window (EINVAL);
//   - window 500 ms .. 10 s, 0 < threshold <= window;
//   - without CAP_SYS_RESOURCE on the opener's credentials the window must be
//     a multiple of 2 s (EINVAL otherwise);
//   - one trigger per open file (EBUSY on a second write).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

struct PsiLine {
  double avg10 = 0;
  double avg60 = 0;
  double avg300 = 0;
  uint64_t total_us = 0;
};

struct PsiStats {
  PsiLine some;
  PsiLine full;
  bool has_full = false;  // /proc/pressure/cpu had no "full" line before 5.13
};

// Parses the text of a pressure file; `path` names it in errors.
[[nodiscard]] Result<PsiStats> parse_psi(std::string_view text, const std::string& path);
// Reads and parses `path`. ENOENT/EOPNOTSUPP come back with a message that
// tells the user to boot with psi=1.
[[nodiscard]] Result<PsiStats> read_psi(const std::string& path = "/proc/pressure/memory");

enum class PsiKind : uint8_t { Some, Full };
[[nodiscard]] const char* to_string(PsiKind k);

struct PsiTriggerSpec {
  PsiKind kind = PsiKind::Some;
  std::chrono::microseconds threshold{150000};
  std::chrono::microseconds window{2000000};
};
// "some 150ms/2s"
[[nodiscard]] std::string describe(const PsiTriggerSpec& spec);

// One PSI trigger; owns its fd (O_RDWR|O_NONBLOCK|O_CLOEXEC). Put fd() into
// the event loop with EPOLLPRI; there is nothing to read on an event.
class PsiTrigger {
 public:
  // Errors: ENOENT/EOPNOTSUPP (PSI disabled: boot with psi=1), EACCES/EPERM
  // (no permission to open the file for writing), EINVAL (window/threshold
  // out of range, or not a multiple of 2 s without CAP_SYS_RESOURCE; or a
  // path that is not on procfs/cgroup2, where a write "works" but never
  // fires). Each
  // message names the path, the trigger and what to do.
  static Result<PsiTrigger> create(const std::string& path, const PsiTriggerSpec& spec);

  [[nodiscard]] int fd() const { return fd_.get(); }
  [[nodiscard]] const PsiTriggerSpec& spec() const { return spec_; }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  PsiTrigger(UniqueFd fd, std::string path, PsiTriggerSpec spec)
      : fd_(std::move(fd)), path_(std::move(path)), spec_(spec) {}
  UniqueFd fd_;
  std::string path_;
  PsiTriggerSpec spec_;
};

}  // namespace airs::sys
