// SPDX-License-Identifier: Apache-2.0
// What connections of a lost bus held (KV sessions, model references,
// attached mappings, counted fds), kept while their processes live.
//
// A bus that goes away takes every unique name on it along: no
// NameOwnerChanged will ever say that those clients left. Yet their
// processes usually live on: a lazy client keeps faulting on its mapping,
// an inference process keeps its KV blocks mapped, and a plain reader's
// model must not be evicted under it (that would hand it zeros). So the
// daemon moves what each dead name held to a key of its own that no bus
// name can take (the next bus hands out ":1.N" names again) and watches the
// process with a pidfd; when it exits, everything goes exactly as when a
// client leaves the bus. Loop thread only.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>

#include "sys/event_loop.hpp"
#include "sys/fd.hpp"

namespace airs::daemon {

class LostCallers {
 public:
  // `gone(key)`: the process behind `key` exited; drop what it holds.
  using GoneFn = std::function<void(const std::string& key)>;
  LostCallers(sys::EventLoop& loop, GoneFn gone) : loop_(loop), gone_(std::move(gone)) {}
  ~LostCallers();
  LostCallers(const LostCallers&) = delete;
  LostCallers& operator=(const LostCallers&) = delete;

  // The key the holdings of `unique_name` (pid `pid`) move to at the
  // `loss`-th loss of the bus: never a bus name (those start with ':').
  [[nodiscard]] static std::string key_for(const std::string& unique_name, pid_t pid, uint64_t loss);
  // Watches `pid` for `key` until it exits. Errors: the process is gone
  // already (ESRCH) or cannot be watched; the caller drops its holdings now.
  [[nodiscard]] Status track(const std::string& key, pid_t pid);
  [[nodiscard]] size_t size() const { return watched_.size(); }

 private:
  void exited(const std::string& key);
  sys::EventLoop& loop_;
  GoneFn gone_;
  std::map<std::string, sys::UniqueFd> watched_;  // key → pidfd
};

}  // namespace airs::daemon
