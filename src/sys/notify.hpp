// sd_notify(3) for Type=notify services: READY=1, STATUS=…, WATCHDOG=1,
// STOPPING=1. A no-op when NOTIFY_SOCKET is not set (not under systemd).
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace airs::sys {

void notify(const std::string& state);
// The watchdog interval systemd expects pings within (WatchdogSec), if any.
[[nodiscard]] std::optional<std::chrono::microseconds> watchdog_interval();

}  // namespace airs::sys
