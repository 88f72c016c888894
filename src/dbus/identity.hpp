// SPDX-License-Identifier: Apache-2.0
// Caller identity from the bus, looked up once per connection (unique name)
// and forgotten when the name leaves the bus. Looking credentials up on every
// call costs ~220 µs (GetConnectionCredentials round trip, measured with a private
// dbus-daemon and sdbus-c++ 1.2); a cached lookup costs a hash probe.
//
// Every id comes from the bus daemon, which took it from the socket when the
// caller connected (SO_PEERCRED, SO_PEERGROUPS). None comes from /proc: sd-bus
// fills what the bus does not send (the egid, and the groups libsystemd 252
// does not parse) from /proc/PID/status, and that is whatever process has the
// pid now. A caller that connects, hands its socket to a child and then execs
// a setgid program, or whose pid is reused, would get the groups of that
// program or process, and with them admin_group's or trusted_group's rights.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "util/result.hpp"

namespace airs::dbus {

struct Caller {
  std::string name;  // unique bus name, ":1.42"
  uid_t uid = static_cast<uid_t>(-1);  // the effective uid when it connected
  pid_t pid = 0;
  // Its effective gid and supplementary groups when it connected (the bus's
  // UnixGroupIDs); empty when the bus does not say (an older dbus-daemon):
  // then no group gives it a right.
  std::vector<gid_t> groups;
  [[nodiscard]] bool in_group(gid_t g) const;
};

class IdentityCache {
 public:
  IdentityCache();
  ~IdentityCache();
  IdentityCache(const IdentityCache&) = delete;
  IdentityCache& operator=(const IdentityCache&) = delete;
  // The connection whose bus daemon is asked (null: none, and every lookup
  // is refused). Set on each new connection, cleared before it goes.
  void set_bus(sdbus::IConnection* bus);
  // The caller of the message being processed. Throws sdbus::Error
  // (AccessDenied) when the bus cannot authenticate it. Loop thread only.
  const Caller& of(const sdbus::Message& msg);
  // The cached caller of `unique_name`, or null.
  [[nodiscard]] const Caller* find(const std::string& unique_name) const {
    auto it = cache_.find(unique_name);
    return it == cache_.end() ? nullptr : &it->second;
  }
  // Drops a unique name (call on NameOwnerChanged to "").
  void forget(const std::string& unique_name) { cache_.erase(unique_name); }
  // Every cached unique name (the bus is gone: each is renamed or forgotten).
  [[nodiscard]] std::vector<std::string> names() const;
  // The entry of `from` is kept under `to` (Caller::name becomes `to`); a
  // no-op for an unknown `from`.
  void rename(const std::string& from, const std::string& to);
  [[nodiscard]] size_t size() const { return cache_.size(); }

 private:
  std::unordered_map<std::string, Caller> cache_;
  std::unique_ptr<sdbus::IProxy> driver_;  // org.freedesktop.DBus on the bus of set_bus()
  bool warned_no_groups_ = false;
};

// Throws the named D-Bus error for an airs::Error (maps errno codes to
// org.aios.Airs1.Error.* names).
[[noreturn]] void throw_error(const Error& e);
[[noreturn]] void throw_error(const char* name, const std::string& message);

}  // namespace airs::dbus
