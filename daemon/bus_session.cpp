// SPDX-License-Identifier: Apache-2.0
#include "daemon/bus_session.hpp"

#include "daemon/bus_replies.hpp"
#include "daemon/kv_service.hpp"
#include "dbus/names.hpp"

namespace airs::daemon {

SessionObject::SessionObject(sdbus::IConnection& bus, SessionServices services, const std::string& path)
    : AdaptorInterfaces(bus, path), svc_(std::move(services)), path_(path) {
  registerAdaptor();
}

SessionObject::~SessionObject() { unregisterAdaptor(); }

KvSession& SessionObject::mine() {
  const auto& c = svc_.ids.of(*getObject().getCurrentlyProcessedMessage());
  auto s = svc_.kv.get(path_, c);
  if (!s) dbus::throw_error(s.error());
  return **s;
}

void SessionObject::Allocate(sdbus::Result<std::vector<uint32_t>>&& result, uint32_t n) {
  try {
    const dbus::Caller c = svc_.ids.of(*getObject().getCurrentlyProcessedMessage());
    (void)mine();
    answer_when_room(
        &svc_.drains, std::move(result), c.name, fmt::format("Allocate of {} KV blocks on {}", n, path_),
        [&kv = svc_.kv, path = path_, c, n]() -> Result<std::vector<uint32_t>> {
          auto s = kv.get(path, c);
          if (!s) return std::move(s).error();
          return kv.allocate(**s, n);
        },
        [](std::vector<uint32_t> blocks) { return std::tuple{std::move(blocks)}; });
  } catch (const sdbus::Error& e) {
    result.returnError(e);
  } catch (const std::exception& e) {
    result.returnError(edge_error("Allocate", e));
  }
}

void SessionObject::AllocateAt(sdbus::Result<uint32_t>&& result, uint32_t index) {
  try {
    const dbus::Caller c = svc_.ids.of(*getObject().getCurrentlyProcessedMessage());
    (void)mine();
    answer_when_room(
        &svc_.drains, std::move(result), c.name, fmt::format("AllocateAt {} of KV on {}", index, path_),
        [&kv = svc_.kv, path = path_, c, index]() -> Result<uint32_t> {
          auto s = kv.get(path, c);
          if (!s) return std::move(s).error();
          return kv.allocate_at(**s, index);
        },
        [](uint32_t block) { return std::tuple{block}; });
  } catch (const sdbus::Error& e) {
    result.returnError(e);
  } catch (const std::exception& e) {
    result.returnError(edge_error("AllocateAt", e));
  }
}

void SessionObject::Free(const std::vector<uint32_t>& blocks) {
  at_bus_edge("Free", [&] {
    if (auto r = svc_.kv.free(mine(), blocks); !r) dbus::throw_error(r.error());
  });
}

void SessionObject::Commit(const std::vector<uint32_t>& blocks, const std::vector<uint64_t>& hashes) {
  at_bus_edge("Commit", [&] {
    if (auto r = svc_.kv.commit(mine(), blocks, hashes); !r) dbus::throw_error(r.error());
  });
}

std::vector<uint32_t> SessionObject::MatchPrefix(const std::vector<uint64_t>& hashes) {
  return at_bus_edge("MatchPrefix", [&] {
    auto r = svc_.kv.match_prefix(mine(), hashes);
    if (!r) dbus::throw_error(r.error());
    return std::move(r).value();
  });
}

uint32_t SessionObject::PrepareWrite(const uint32_t& block) {
  return at_bus_edge("PrepareWrite", [&] {
    auto r = svc_.kv.prepare_write(mine(), block);
    if (!r) dbus::throw_error(r.error());
    return *r;
  });
}

void SessionObject::SetLength(const uint32_t& tokens) {
  at_bus_edge("SetLength", [&] {
    if (auto r = svc_.kv.set_length(mine(), tokens); !r) dbus::throw_error(r.error());
  });
}

void SessionObject::Close() {
  // Deferred: this object is destroyed after the reply.
  at_bus_edge("Close", [&] {
    if (auto r = svc_.close(mine()); !r) dbus::throw_error(r.error());
  });
}

// Properties read the allocator's record of this one session (the same
// edge: their getters run inside sd-bus's dispatch too).
std::string SessionObject::Priority() {
  return at_bus_edge("Priority", [&] {
    auto i = svc_.kv.info(path_);
    return i ? std::string(policy::to_string(i->priority)) : std::string();
  });
}
uint32_t SessionObject::Blocks() {
  return at_bus_edge("Blocks", [&] {
    auto i = svc_.kv.info(path_);
    return i ? i->blocks : 0U;
  });
}
uint32_t SessionObject::Tokens() {
  return at_bus_edge("Tokens", [&] {
    auto i = svc_.kv.info(path_);
    return i ? i->length : 0U;
  });
}

}  // namespace airs::daemon
