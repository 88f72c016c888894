// SPDX-License-Identifier: Apache-2.0
// org.aios.Airs1.Session at /org/aios/Airs1/session/<n>: one KV session.
// Every method checks that the caller is the connection that created it.
#pragma once

#include <functional>
#include <string>

#include "dbus/identity.hpp"
#include "dbus/variant.hpp"
#include "dbus_gen/adaptor.h"
#include "util/result.hpp"

namespace airs::daemon {

class DrainWaits;
class KvService;
struct KvSession;

// What a session object uses of the daemon, and nothing else.
struct SessionServices {
  dbus::IdentityCache& ids;
  KvService& kv;
  DrainWaits& drains;  // an allocation waiting for pages on their way back
  // Close: the session ends (KvService::close) and its bus object is
  // retired, destroyed after the reply (never inside its own handler).
  std::function<Status(KvSession&)> close;
};

class SessionObject final
    : public sdbus::AdaptorInterfaces<org::aios::Airs1::Session_adaptor, sdbus::Properties_adaptor> {
 public:
  SessionObject(sdbus::IConnection& bus, SessionServices services, const std::string& path);
  ~SessionObject();
  using Session_adaptor::emitEvicted;

 private:
  // Both answered at once, or once the pages their room is in are back.
  void Allocate(sdbus::Result<std::vector<uint32_t>>&& result, uint32_t n) override;
  void AllocateAt(sdbus::Result<uint32_t>&& result, uint32_t index) override;
  void Free(const std::vector<uint32_t>& blocks) override;
  void Commit(const std::vector<uint32_t>& blocks, const std::vector<uint64_t>& hashes) override;
  std::vector<uint32_t> MatchPrefix(const std::vector<uint64_t>& hashes) override;
  uint32_t PrepareWrite(const uint32_t& block) override;
  void SetLength(const uint32_t& tokens) override;
  void Close() override;
  std::string Priority() override;
  uint32_t Blocks() override;
  uint32_t Tokens() override;

  KvSession& mine();

  SessionServices svc_;
  std::string path_;
};

}  // namespace airs::daemon
