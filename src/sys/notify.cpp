// SPDX-License-Identifier: Apache-2.0
#include "sys/notify.hpp"

#include <fcntl.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <systemd/sd-daemon.h>

namespace airs::sys {

void notify(const std::string& state) { (void)sd_notify(0, state.c_str()); }

std::optional<std::chrono::microseconds> watchdog_interval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::nullopt;
  return std::chrono::microseconds(static_cast<int64_t>(usec));
}

Status fd_store(const std::string& name, int fd) {
  if (std::getenv("NOTIFY_SOCKET") == nullptr) return make_error(ENOTSUP, "not under systemd (no NOTIFY_SOCKET)");
  const std::string state = "FDSTORE=1\nFDNAME=" + name;
  const int r = sd_pid_notify_with_fds(0, 0, state.c_str(), &fd, 1);
  if (r < 0) return make_error(-r, "storing fd '{}' with the service manager: {}", name, std::strerror(-r));
  if (r == 0) return make_error(ENOTSUP, "not under systemd (no NOTIFY_SOCKET)");
  return {};
}

void fd_store_remove(const std::string& name) {
  if (std::getenv("NOTIFY_SOCKET") == nullptr) return;
  (void)sd_notify(0, ("FDSTOREREMOVE=1\nFDNAME=" + name).c_str());
}

std::vector<std::pair<std::string, UniqueFd>> listen_fds_with_names() {
  std::vector<std::pair<std::string, UniqueFd>> out;
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(1, &names);
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
    out.emplace_back(names != nullptr && names[i] != nullptr ? names[i] : "", UniqueFd(fd));
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(names);
  }
  return out;
}

}  // namespace airs::sys
