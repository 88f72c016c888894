// SPDX-License-Identifier: Apache-2.0
// sd_notify(3) for Type=notify services: READY=1, STATUS=…, WATCHDOG=1,
// STOPPING=1. A no-op when NOTIFY_SOCKET is not set (not under systemd).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::sys {

void notify(const std::string& state);
// The watchdog interval systemd expects pings within (WatchdogSec), if any.
[[nodiscard]] std::optional<std::chrono::microseconds> watchdog_interval();

// The service manager's file descriptor store (FileDescriptorStoreMax=):
// systemd keeps `fd` under `name` while the service runs or restarts, and
// hands it back at the next start (listen_fds_with_names); a stop empties
// it. ENOTSUP when not under systemd (no NOTIFY_SOCKET).
[[nodiscard]] Status fd_store(const std::string& name, int fd);
void fd_store_remove(const std::string& name);
// The fds passed at start (LISTEN_FDS/LISTEN_FDNAMES for this pid), each
// with its name, made close-on-exec; the environment is cleared so children
// do not see them. Empty when none were passed.
[[nodiscard]] std::vector<std::pair<std::string, UniqueFd>> listen_fds_with_names();

}  // namespace airs::sys
