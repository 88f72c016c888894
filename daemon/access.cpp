// SPDX-License-Identifier: Apache-2.0
#include "daemon/access.hpp"

#include <grp.h>

#include <set>

#include <fmt/format.h>

namespace airs::daemon {
namespace {
bool in_group(const dbus::Caller& caller, const std::string& group) {
  if (group.empty()) return false;
  auto* gr = ::getgrnam(group.c_str());
  return gr != nullptr && caller.in_group(gr->gr_gid);
}
}  // namespace

bool Access::is_admin(const dbus::Caller& caller) const { return caller.uid == 0 || in_group(caller, admin_group_); }

bool Access::is_trusted(const dbus::Caller& caller) const {
  return is_admin(caller) || in_group(caller, trusted_group_);
}

Status Access::require_admin(const dbus::Caller& caller, const char* method) const {
  if (is_admin(caller)) return {};
  return make_error(EACCES, "{} is an admin method: uid {} is not root{}", method, caller.uid,
                    admin_group_.empty() ? "" : " nor in group " + admin_group_);
}

uint32_t FdQuota::held_by_uid(uid_t uid) {
  sys::InodeSet ours, notices;
  if (inodes_) inodes_(ours, notices);
  uint32_t total = 0;
  std::set<pid_t> counted;  // a process with two connections holds its fds once
  for (auto& [name, c] : by_caller_) {
    if (c.first != uid) continue;
    const dbus::Caller* who = ids_.find(name);
    if (who != nullptr && counted.contains(who->pid)) {
      c.second = 0;
      continue;
    }
    auto n = who != nullptr ? sys::count_fds_referring_to(who->pid, ours) : Result<uint32_t>(make_error(ESRCH, "gone"));
    // A held notice page counts twice: itself and its session's eventfd.
    auto k = who != nullptr ? sys::count_fds_referring_to(who->pid, notices) : Result<uint32_t>(make_error(ESRCH, "gone"));
    // Unreadable (another uid under a sandbox without CAP_SYS_PTRACE):
    // keep counting what was handed out.
    if (n && k) {
      c.second = *n + 2 * *k;
      counted.insert(who->pid);
    }
    total += c.second;
  }
  return total;
}

Status FdQuota::take(const dbus::Caller& caller, uint32_t n) {
  uint32_t& used = by_uid_[caller.uid];
  if (used + n > max_) used = held_by_uid(caller.uid);
  if (used + n > max_)
    return make_error(EDQUOT,
                      "uid {} holds {} of its {} file descriptors from airs-memd (kv.max_fds_per_uid); close the fds "
                      "of released models and closed sessions, or disconnect",
                      caller.uid, used, max_);
  used += n;
  auto& c = by_caller_[caller.name];
  c.first = caller.uid;
  c.second += n;
  return {};
}

void FdQuota::returned(const dbus::Caller& caller, uint32_t n) {
  auto& used = by_uid_[caller.uid];
  used -= std::min(used, n);
  auto& c = by_caller_[caller.name];
  c.second -= std::min(c.second, n);
}

bool FdQuota::rename_caller(const std::string& from, const std::string& to) {
  auto n = by_caller_.extract(from);
  if (!n) return false;
  const bool holds = n.mapped().second > 0;
  n.key() = to;
  by_caller_.insert(std::move(n));
  return holds;
}

void FdQuota::caller_left(const std::string& name) {
  auto it = by_caller_.find(name);
  if (it == by_caller_.end()) return;
  auto& used = by_uid_[it->second.first];
  used -= std::min(used, it->second.second);
  by_caller_.erase(it);
}

}  // namespace airs::daemon
