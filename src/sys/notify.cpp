#include "sys/notify.hpp"

#include <systemd/sd-daemon.h>

namespace airs::sys {

void notify(const std::string& state) { (void)sd_notify(0, state.c_str()); }

std::optional<std::chrono::microseconds> watchdog_interval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::nullopt;
  return std::chrono::microseconds(static_cast<int64_t>(usec));
}

}  // namespace airs::sys
