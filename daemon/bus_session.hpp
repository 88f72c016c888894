// org.aios.Airs1.Session at /org/aios/Airs1/session/<n>: one KV session.
// Every method checks that the caller is the connection that created it.
#pragma once

#include "dbus/variant.hpp"
#include "dbus_gen/adaptor.h"

namespace airs::daemon {

class Daemon;
struct KvSession;

class SessionObject final
    : public sdbus::AdaptorInterfaces<org::aios::Airs1::Session_adaptor, sdbus::Properties_adaptor> {
 public:
  SessionObject(sdbus::IConnection& bus, Daemon& daemon, const std::string& path);
  ~SessionObject();
  using Session_adaptor::emitEvicted;

 private:
  std::vector<uint32_t> Allocate(const uint32_t& n) override;
  uint32_t AllocateAt(const uint32_t& index) override;
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

  Daemon& d_;
  std::string path_;
};

}  // namespace airs::daemon
