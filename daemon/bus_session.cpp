#include "daemon/bus_session.hpp"

#include "daemon/daemon.hpp"
#include "daemon/kv_service.hpp"
#include "dbus/names.hpp"

namespace airs::daemon {

SessionObject::SessionObject(sdbus::IConnection& bus, Daemon& daemon, const std::string& path)
    : AdaptorInterfaces(bus, path), d_(daemon), path_(path) {
  registerAdaptor();
}

SessionObject::~SessionObject() { unregisterAdaptor(); }

KvSession& SessionObject::mine() {
  const auto& c = d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  auto s = d_.kv().get(path_, c);
  if (!s) dbus::throw_error(s.error());
  return **s;
}

std::vector<uint32_t> SessionObject::Allocate(const uint32_t& n) {
  auto r = d_.kv().allocate(mine(), n);
  if (!r) dbus::throw_error(r.error());
  return std::move(r).value();
}

uint32_t SessionObject::AllocateAt(const uint32_t& index) {
  auto r = d_.kv().allocate_at(mine(), index);
  if (!r) dbus::throw_error(r.error());
  return *r;
}

void SessionObject::Free(const std::vector<uint32_t>& blocks) {
  if (auto r = d_.kv().free(mine(), blocks); !r) dbus::throw_error(r.error());
}

void SessionObject::Commit(const std::vector<uint32_t>& blocks, const std::vector<uint64_t>& hashes) {
  if (auto r = d_.kv().commit(mine(), blocks, hashes); !r) dbus::throw_error(r.error());
}

std::vector<uint32_t> SessionObject::MatchPrefix(const std::vector<uint64_t>& hashes) {
  auto r = d_.kv().match_prefix(mine(), hashes);
  if (!r) dbus::throw_error(r.error());
  return std::move(r).value();
}

uint32_t SessionObject::PrepareWrite(const uint32_t& block) {
  auto r = d_.kv().prepare_write(mine(), block);
  if (!r) dbus::throw_error(r.error());
  return *r;
}

void SessionObject::SetLength(const uint32_t& tokens) {
  if (auto r = d_.kv().set_length(mine(), tokens); !r) dbus::throw_error(r.error());
}

void SessionObject::Close() {
  auto& s = mine();
  const auto& c = d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  // Deferred: this object is destroyed by close_session, after the reply.
  d_.close_session(s, c);
}

// Properties read the allocator's record of this one session.
std::string SessionObject::Priority() {
  auto i = d_.kv().info(path_);
  return i ? std::string(policy::to_string(i->priority)) : std::string();
}
uint32_t SessionObject::Blocks() {
  auto i = d_.kv().info(path_);
  return i ? i->blocks : 0;
}
uint32_t SessionObject::Tokens() {
  auto i = d_.kv().info(path_);
  return i ? i->length : 0;
}

}  // namespace airs::daemon
