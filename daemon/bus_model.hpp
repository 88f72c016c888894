// SPDX-License-Identifier: Apache-2.0
// org.aios.Airs1.Model at /org/aios/Airs1/model/<n>: Open/OpenLazy/Attach/
// Release for one model. The object lives as long as the model is loaded.
// An Open that must wait for residency is answered later (async reply),
// when the pager reports the model Resident, Failed or gone.
#pragma once

#include <string>
#include <vector>

#include "daemon/models.hpp"
#include "dbus/variant.hpp"
#include "dbus_gen/adaptor.h"

namespace airs::daemon {

class Access;
class FdQuota;

// What a model object uses of the daemon, and nothing else.
struct ModelServices {
  dbus::IdentityCache& ids;
  Models& models;
  const Access& access;  // OpenLazy and Attach: trusted callers only
  FdQuota& fds;          // two fds per Open
  std::string mode;      // "full", "small-pages" or "cooperative" (fixed at start)
};

class ModelObject final : public sdbus::AdaptorInterfaces<org::aios::Airs1::Model_adaptor, sdbus::Properties_adaptor> {
 public:
  using OpenReply = sdbus::Result<sdbus::UnixFd, uint64_t, sdbus::UnixFd, dbus::Dict>;

  ModelObject(sdbus::IConnection& bus, ModelServices services, uint64_t model_id, const std::string& path);
  ~ModelObject();
  using Model_adaptor::emitResident;

  // The model became resident (or failed): answer every waiting Open.
  void complete_pending();
  // The model is gone: every waiting Open gets NotFound with `why`.
  void fail_pending(const std::string& why);
  // `caller` left the bus: its waiting Opens (and their proof fds) go.
  void forget_caller(const std::string& caller);

 private:
  struct Pending {
    OpenReply reply;
    std::string caller;   // unique name
    sys::UniqueFd proof;  // the caller's GGUF fd, checked again on completion
  };
  void Open(OpenReply&& result, sdbus::UnixFd gguf_fd, dbus::Dict options) override;
  std::tuple<sdbus::UnixFd, uint64_t, sdbus::UnixFd, dbus::Dict> OpenLazy(const sdbus::UnixFd& gguf_fd,
                                                                         const sdbus::UnixFd& uffd,
                                                                         const dbus::Dict& options) override;
  void Attach(const sdbus::UnixFd& notify_fd, const sdbus::UnixFd& uffd, const uint64_t& addr,
              const uint64_t& length) override;
  void Follow(const sdbus::UnixFd& requests, const sdbus::UnixFd& opened) override;
  void Hints(const sdbus::UnixFd& socket) override;
  std::map<std::string, sdbus::Variant> Residency() override;
  void Release() override;
  std::string Name() override;
  uint64_t Size() override;
  uint64_t ResidentBytes() override;
  std::string State() override;
  uint32_t Refcount() override;
  bool Pinned() override;

  ModelEntry& entry();
  const dbus::Caller& caller();
  // Opens for `caller` (fd quota, proof, reference) and builds the reply.
  Result<std::tuple<sdbus::UnixFd, uint64_t, sdbus::UnixFd, dbus::Dict>> open_for(const dbus::Caller& c, int proof,
                                                                                bool lazy, bool nowait);

  ModelServices svc_;
  uint64_t id_;
  std::vector<Pending> pending_;
};

}  // namespace airs::daemon
