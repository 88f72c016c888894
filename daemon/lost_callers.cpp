// SPDX-License-Identifier: Apache-2.0
#include "daemon/lost_callers.hpp"

#include <sys/epoll.h>

#include <fmt/format.h>

#include "sys/proc_handles.hpp"

namespace airs::daemon {

LostCallers::~LostCallers() {
  for (auto& [key, fd] : watched_) loop_.remove(fd.get());
}

std::string LostCallers::key_for(const std::string& unique_name, pid_t pid, uint64_t loss) {
  return fmt::format("pid {} ({} before bus loss {})", pid, unique_name, loss);
}

Status LostCallers::track(const std::string& key, pid_t pid) {
  if (pid <= 0) return make_error(ESRCH, "{}: the bus never said its process id", key);
  auto fd = sys::pidfd_open(pid);
  if (!fd) return std::move(fd).error();
  const int raw = fd->get();
  AIRS_TRY(loop_.add(raw, EPOLLIN, [this, key](uint32_t) { exited(key); }));
  watched_.emplace(key, std::move(fd).value());
  return {};
}

void LostCallers::exited(const std::string& key) {
  auto it = watched_.find(key);
  if (it == watched_.end()) return;
  loop_.remove(it->second.get());
  watched_.erase(it);
  gone_(key);
}

}  // namespace airs::daemon
