// SPDX-License-Identifier: Apache-2.0
#include "dbus/identity.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <map>
#include <optional>

#include <spdlog/spdlog.h>

#include "dbus/names.hpp"

namespace airs::dbus {

bool Caller::in_group(gid_t g) const { return std::find(groups.begin(), groups.end(), g) != groups.end(); }

IdentityCache::IdentityCache() = default;
IdentityCache::~IdentityCache() = default;

void IdentityCache::set_bus(sdbus::IConnection* bus) {
  driver_.reset();
  // A proxy on a connection the daemon dispatches itself: no thread of its
  // own, and a call made on the loop is a plain blocking sd_bus_call.
  if (bus != nullptr) driver_ = sdbus::createProxy(*bus, "org.freedesktop.DBus", "/org/freedesktop/DBus");
}

const Caller& IdentityCache::of(const sdbus::Message& msg) {
  const std::string sender = msg.getSender();
  if (auto it = cache_.find(sender); it != cache_.end()) return it->second;
  auto refuse = [&](const std::string& why) {
    return sdbus::Error(kErrAccessDenied, "cannot authenticate caller " + sender + ": " + why);
  };
  if (!driver_) throw refuse("airs-memd has no bus connection");
  std::map<std::string, sdbus::Variant> creds;
  try {
    driver_->callMethod("GetConnectionCredentials")
        .onInterface("org.freedesktop.DBus")
        .withTimeout(std::chrono::seconds(5))
        .withArguments(sender)
        .storeResultsTo(creds);
  } catch (const sdbus::Error& e) {
    throw refuse(e.getName() + ": " + e.getMessage());
  }
  auto u32 = [&](const char* key) -> std::optional<uint32_t> {
    auto it = creds.find(key);
    if (it == creds.end() || !it->second.containsValueOfType<uint32_t>()) return std::nullopt;
    return it->second.get<uint32_t>();
  };
  const auto uid = u32("UnixUserID");
  const auto pid = u32("ProcessID");
  if (!uid || !pid) throw refuse("the bus did not say its UnixUserID and ProcessID");
  Caller c;
  c.name = sender;
  c.uid = static_cast<uid_t>(*uid);
  c.pid = static_cast<pid_t>(*pid);
  auto groups = creds.find("UnixGroupIDs");
  if (groups != creds.end() && groups->second.containsValueOfType<std::vector<uint32_t>>()) {
    for (uint32_t g : groups->second.get<std::vector<uint32_t>>()) c.groups.push_back(static_cast<gid_t>(g));
  } else if (!warned_no_groups_) {
    warned_no_groups_ = true;
    spdlog::warn("bus: the bus daemon does not say which groups its callers are in (no UnixGroupIDs: "
                 "an older dbus-daemon?): daemon.admin_group and daemon.trusted_group give no rights, "
                 "only root is admin and trusted");
  }
  return cache_.emplace(sender, std::move(c)).first->second;
}

std::vector<std::string> IdentityCache::names() const {
  std::vector<std::string> out;
  out.reserve(cache_.size());
  for (const auto& [name, c] : cache_) out.push_back(name);
  return out;
}

void IdentityCache::rename(const std::string& from, const std::string& to) {
  auto n = cache_.extract(from);
  if (!n) return;
  n.key() = to;
  n.mapped().name = to;
  cache_.insert(std::move(n));
}

void throw_error(const char* name, const std::string& message) { throw sdbus::Error(name, message); }

void throw_error(const Error& e) {
  const char* name = kErrFailed;
  switch (e.code) {
    case EINVAL:
    case ERANGE:
    case E2BIG:
      name = kErrInvalidArgument;
      break;
    case EBADMSG:
    case ENOEXEC:
      name = kErrBadModel;
      break;
    case ENOMEM:
    case ENOSPC:
      name = kErrPoolExhausted;
      break;
    case EDQUOT:
    case EMFILE:
      name = kErrQuotaExceeded;
      break;
    case ENOENT:
      name = kErrNotFound;
      break;
    case EBUSY:
    case EAGAIN:
      name = kErrBusy;
      break;
    case ENOTSUP:
    case ENOSYS:
      name = kErrUnsupported;
      break;
    case EACCES:
    case EPERM:
      name = kErrAccessDenied;
      break;
    default:
      break;
  }
  throw sdbus::Error(name, e.message);
}

}  // namespace airs::dbus
