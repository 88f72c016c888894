// SPDX-License-Identifier: Apache-2.0
#include "dbus/identity.hpp"

#include <algorithm>
#include <cerrno>

#include "dbus/names.hpp"

namespace airs::dbus {

bool Caller::in_group(gid_t g) const { return gid == g || std::find(groups.begin(), groups.end(), g) != groups.end(); }

const Caller& IdentityCache::of(const sdbus::Message& msg) {
  const std::string sender = msg.getSender();
  if (auto it = cache_.find(sender); it != cache_.end()) return it->second;
  Caller c;
  c.name = sender;
  try {
    // Effective ids as authenticated by the bus (not /proc, which is racy).
    c.uid = msg.getCredsEuid();
    c.gid = msg.getCredsEgid();
    c.pid = msg.getCredsPid();
    c.groups = msg.getCredsSupplementaryGids();
  } catch (const sdbus::Error& e) {
    throw sdbus::Error(kErrAccessDenied, "cannot authenticate caller " + sender + ": " + e.getMessage());
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
