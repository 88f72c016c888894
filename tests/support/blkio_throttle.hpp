// SPDX-License-Identifier: Apache-2.0
// Limits block-device reads of the processes moved into it, on the disk
// holding `file`: a cgroup v2 io.max rule where the io controller is on the
// v2 hierarchy (stock Debian 12 and Raspberry Pi OS have only v2), else the
// cgroup v1 blkio throttle (hybrid hierarchies bind io to v1; both are the
// kernel's blk-throttle underneath). The daemon reads models with O_DIRECT,
// which the throttle slows (buffered reads of cached pages it does not).
// available() is false (with why()) where neither controller is there.
//
// A very low rate holds reads in the device queue until set_rate() lifts it:
// the kernel dispatches the queued bios as soon as the rule changes, so a
// test can order "reads in flight" against other events without timing.
// While reads are held, a held process must not page anything in from that
// disk (its binary, its libraries): the page-in queues behind the held
// reads. Lock those mappings first, or run every code path once before.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace airs::test {

class BlkioThrottle {
 public:
  BlkioThrottle(const std::string& file, uint64_t bytes_per_s);
  ~BlkioThrottle();
  BlkioThrottle(const BlkioThrottle&) = delete;
  BlkioThrottle& operator=(const BlkioThrottle&) = delete;
  [[nodiscard]] bool available() const { return !dir_.empty(); }
  [[nodiscard]] const std::string& why() const { return why_; }
  // "cgroup v2 io.max" or "cgroup v1 blkio" (empty when unavailable).
  [[nodiscard]] const char* kind() const { return dir_.empty() ? "" : v2_ ? "cgroup v2 io.max" : "cgroup v1 blkio"; }
  // Moves the process (every thread, io_uring workers included) in.
  bool add(pid_t pid);
  // A new limit for the group; 0 removes it (queued reads go at once).
  bool set_rate(uint64_t bytes_per_s);

 private:
  std::string root_;    // the hierarchy's root group (where processes go back)
  std::string dir_;
  std::string device_;  // "major:minor" of the throttled disk
  std::string why_;
  bool v2_ = false;
};

}  // namespace airs::test
