// SPDX-License-Identifier: Apache-2.0
// Who may do what on the bus, and how many of the daemon's descriptors a
// uid may hold: the two checks the bus objects share (daemon/bus_*.hpp hold
// references to these, not to the Daemon). Loop thread only (a background
// group lookup posts its result back to the loop).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "dbus/identity.hpp"
#include "sys/event_loop.hpp"
#include "sys/files.hpp"
#include "util/result.hpp"

namespace airs::daemon {

// daemon.admin_group and daemon.trusted_group of the configuration, as
// group ids. The names are looked up when the daemon starts and again on
// SIGHUP (resolve()), never on a bus call: a lookup goes through NSS, which
// may ask a directory server over the network (sssd, LDAP), and every
// client's call and fault would wait behind it on the loop.
class Access {
 public:
  // The gid of a group name; nothing when no such group exists; an error
  // when the lookup itself failed (a directory server that did not answer).
  using GroupLookup = std::function<Result<std::optional<gid_t>>(const std::string& name)>;
  static Result<std::optional<gid_t>> lookup_group(const std::string& name);

  Access(std::string admin_group, std::string trusted_group, GroupLookup lookup = lookup_group);
  ~Access();
  Access(const Access&) = delete;
  Access& operator=(const Access&) = delete;
  // Looks the two names up again (a group made or renumbered since); logs
  // each result, and a warning for a name that does not resolve. A lookup
  // that fails keeps the gid the name had. Waits for the lookups: at the
  // start, before the daemon serves anyone.
  void resolve();
  // The same, for SIGHUP, while the daemon serves: the lookups run on a
  // thread of their own and their results are taken on `loop` (the gids
  // stay the old ones until then), so a directory server that hangs holds
  // that thread, never the loop. A call while one runs starts no second
  // thread: one more lookup follows when it returns. False when no thread
  // could be had (logged; the gids stay).
  bool resolve_in_background(sys::EventLoop& loop);
  [[nodiscard]] bool resolving() const;
  // Root or a member of daemon.admin_group.
  [[nodiscard]] bool is_admin(const dbus::Caller& caller) const;
  // An admin or a member of daemon.trusted_group: may open models lazily
  // (a writable region fd).
  [[nodiscard]] bool is_trusted(const dbus::Caller& caller) const;
  // Admin methods: EACCES naming `method`, the uid and the group otherwise.
  [[nodiscard]] Status require_admin(const dbus::Caller& caller, const char* method) const;

 private:
  struct Group {
    std::string name;            // empty: none configured
    std::optional<gid_t> gid;    // unset: the name did not resolve
  };
  struct Mailbox;
  using Found = Result<std::optional<gid_t>>;
  void apply(Group& g, const char* key, Found found);
  bool start_lookup();
  void on_posted();
  GroupLookup lookup_;
  sys::EventLoop* loop_ = nullptr;    // where background results are taken (set by the first)
  std::shared_ptr<Mailbox> box_;      // shared with a lookup thread still running
  Group admin_;
  Group trusted_;
};

// Per-uid fd quota (kv.max_fds_per_uid) on the descriptors the uid's
// processes actually hold: every fd handed out counts until a recount of
// the processes' /proc/PID/fd shows it closed (Release and Close do not
// uncount: a client may keep what it was given).
class FdQuota {
 public:
  // The inodes of every fd the daemon hands out: pool regions, status and
  // notice pages, KV sessions' wake sockets.
  using InodesFn = std::function<void(sys::InodeSet& ours)>;
  FdQuota(uint32_t max_per_uid, const dbus::IdentityCache& ids, InodesFn inodes)
      : max_(max_per_uid), ids_(ids), inodes_(std::move(inodes)) {}
  // EDQUOT when `n` more would pass the limit; counts them otherwise.
  [[nodiscard]] Status take(const dbus::Caller& caller, uint32_t n);
  // `n` fds counted by take() were not handed out after all.
  void returned(const dbus::Caller& caller, uint32_t n);
  // `name` left the bus: what it held is no longer counted.
  void caller_left(const std::string& name);
  // What `from` holds is counted under `to` from now on (its bus is gone,
  // its process lives). True if it holds any.
  bool rename_caller(const std::string& from, const std::string& to);

 private:
  [[nodiscard]] uint32_t held_by_uid(uid_t uid);
  uint32_t max_;
  const dbus::IdentityCache& ids_;
  InodesFn inodes_;
  std::map<uid_t, uint32_t> by_uid_;
  std::map<std::string, std::pair<uid_t, uint32_t>> by_caller_;
};

}  // namespace airs::daemon
