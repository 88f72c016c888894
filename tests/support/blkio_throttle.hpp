// Limits block-device reads of the processes moved into it (cgroup v1 blkio
// throttle on the device holding `file`). The daemon reads models with
// O_DIRECT, which the throttle slows (buffered reads of cached pages it does
// not). available() is false (with why()) where the controller is missing.
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
  // Moves the process (every thread, io_uring workers included) in.
  bool add(pid_t pid);
  // A new limit for the group; 0 removes it (queued reads go at once).
  bool set_rate(uint64_t bytes_per_s);

 private:
  std::string dir_;
  std::string device_;  // "major:minor" of the throttled disk
  std::string why_;
};

}  // namespace airs::test
