// SPDX-License-Identifier: Apache-2.0
#include "daemon/access.hpp"

#include <grp.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "sys/proc_handles.hpp"

namespace airs::daemon {

Result<std::optional<gid_t>> Access::lookup_group(const std::string& name) {
  std::vector<char> buf(4096);
  for (;;) {
    struct group gr {};
    struct group* found = nullptr;
    const int e = ::getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found);
    if (e == ERANGE && buf.size() < (size_t{1} << 24)) {
      buf.resize(buf.size() * 4);
      continue;
    }
    if (found != nullptr) return std::optional<gid_t>(found->gr_gid);
    // getgrnam_r: 0 (or, with some NSS modules, ENOENT and the like) with no
    // entry means no such group; any other error is a failed lookup.
    if (e == 0 || e == ENOENT || e == ESRCH || e == EBADF || e == EPERM) return std::optional<gid_t>();
    return make_error(e, "the group lookup failed: {}", std::strerror(e));
  }
}

// What a lookup thread shares with the loop; the thread holds it too, so
// one that returns after the Access is gone finds it closed and posts nothing.
struct Access::Mailbox {
  std::mutex mu;
  sys::UniqueFd efd;  // signalled when the results are posted
  bool running = false;
  bool rerun = false;  // a SIGHUP came while running: look up once more after
  bool closed = false;
  std::optional<std::pair<Found, Found>> posted;  // admin, trusted
};

Access::Access(std::string admin_group, std::string trusted_group, GroupLookup lookup)
    : lookup_(std::move(lookup)), admin_{std::move(admin_group), {}}, trusted_{std::move(trusted_group), {}} {
  resolve();
}

Access::~Access() {
  if (!box_) return;
  if (loop_ != nullptr) loop_->remove(box_->efd.get());
  std::lock_guard lk(box_->mu);
  box_->closed = true;
}

void Access::resolve() {
  const auto look = [this](const Group& g) -> Found { return g.name.empty() ? Found(std::nullopt) : lookup_(g.name); };
  apply(admin_, "daemon.admin_group", look(admin_));
  apply(trusted_, "daemon.trusted_group", look(trusted_));
}

bool Access::resolving() const {
  if (!box_) return false;
  std::lock_guard lk(box_->mu);
  return box_->running;
}

bool Access::resolve_in_background(sys::EventLoop& loop) {
  if (!box_) {
    auto efd = sys::eventfd_create();
    if (!efd) {
      spdlog::warn("daemon.admin_group and daemon.trusted_group not looked up again: {}", efd.error().message);
      return false;
    }
    auto box = std::make_shared<Mailbox>();
    box->efd = std::move(efd).value();
    if (auto st = loop.add(box->efd.get(), EPOLLIN, [this](uint32_t) { on_posted(); }); !st) {
      spdlog::warn("daemon.admin_group and daemon.trusted_group not looked up again: {}", st.error().message);
      return false;
    }
    box_ = std::move(box);
    loop_ = &loop;
  }
  {
    std::lock_guard lk(box_->mu);
    if (box_->running) {
      // Its answer may predate what this SIGHUP is for (a group made just
      // now): one more lookup follows it, however many SIGHUPs come meanwhile.
      box_->rerun = true;
      spdlog::info("a group lookup is still running; another follows when it returns");
      return true;
    }
    box_->running = true;
  }
  return start_lookup();
}

bool Access::start_lookup() {
  try {
    std::thread([box = box_, lookup = lookup_, admin = admin_.name, trusted = trusted_.name] {
      sys::become_background_thread("airs-groups");
      const auto look = [&lookup](const std::string& name) -> Found {
        return name.empty() ? Found(std::nullopt) : lookup(name);
      };
      auto found = std::make_pair(look(admin), look(trusted));
      std::lock_guard lk(box->mu);
      if (box->closed) return;
      box->posted.emplace(std::move(found));
      (void)sys::eventfd_signal(box->efd.get());
    }).detach();
  } catch (const std::system_error& e) {
    std::lock_guard lk(box_->mu);
    box_->running = false;
    box_->rerun = false;
    spdlog::warn("daemon.admin_group and daemon.trusted_group not looked up again: no thread: {}", e.what());
    return false;
  }
  return true;
}

void Access::on_posted() {
  sys::eventfd_drain(box_->efd.get());
  std::optional<std::pair<Found, Found>> found;
  bool again = false;
  {
    std::lock_guard lk(box_->mu);
    found.swap(box_->posted);
    if (found) {
      again = std::exchange(box_->rerun, false);
      box_->running = again;
    }
  }
  if (!found) return;
  apply(admin_, "daemon.admin_group", std::move(found->first));
  apply(trusted_, "daemon.trusted_group", std::move(found->second));
  if (again) (void)start_lookup();
}

void Access::apply(Group& g, const char* key, Found r) {
  if (g.name.empty()) return;
  if (!r) {
    if (g.gid)
      spdlog::warn("{} = \"{}\": {}; its members stay those of gid {}", key, g.name, r.error().message, *g.gid);
    else
      spdlog::warn("{} = \"{}\": {}; no caller is a member until a lookup succeeds (SIGHUP or a restart)", key,
                   g.name, r.error().message);
    return;
  }
  g.gid = *r;
  if (g.gid)
    spdlog::info("{} = \"{}\": gid {}", key, g.name, *g.gid);
  else
    spdlog::warn("{} = \"{}\": no such group; no caller is a member until the group exists and the daemon gets "
                 "SIGHUP or restarts",
                 key, g.name);
}

bool Access::is_admin(const dbus::Caller& caller) const {
  return caller.uid == 0 || (admin_.gid && caller.in_group(*admin_.gid));
}

bool Access::is_trusted(const dbus::Caller& caller) const {
  return is_admin(caller) || (trusted_.gid && caller.in_group(*trusted_.gid));
}

Status Access::require_admin(const dbus::Caller& caller, const char* method) const {
  if (is_admin(caller)) return {};
  return make_error(EACCES, "{} is an admin method: uid {} is not root{}", method, caller.uid,
                    admin_.name.empty() ? "" : " nor in group " + admin_.name);
}

uint32_t FdQuota::held_by_uid(uid_t uid) {
  sys::InodeSet ours;
  if (inodes_) inodes_(ours);
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
    // Unreadable (another uid under a sandbox without CAP_SYS_PTRACE):
    // keep counting what was handed out.
    if (n) {
      c.second = *n;
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
