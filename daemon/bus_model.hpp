// org.aios.Airs1.Model at /org/aios/Airs1/model/<n>: Open/Attach/Release
// for one model. The object lives as long as the model is loaded.
#pragma once

#include "daemon/models.hpp"
#include "dbus/variant.hpp"
#include "dbus_gen/adaptor.h"

namespace airs::daemon {

class Daemon;

class ModelObject final : public sdbus::AdaptorInterfaces<org::aios::Airs1::Model_adaptor, sdbus::Properties_adaptor> {
 public:
  ModelObject(sdbus::IConnection& bus, Daemon& daemon, uint64_t model_id, const std::string& path);
  ~ModelObject();
  using Model_adaptor::emitResident;

 private:
  std::tuple<sdbus::UnixFd, uint64_t, sdbus::UnixFd, dbus::Dict> Open(const dbus::Dict& options) override;
  void Attach(const sdbus::UnixFd& notify_fd, const sdbus::UnixFd& uffd, const uint64_t& addr,
              const uint64_t& length) override;
  void Watch(const sdbus::UnixFd& notify_fd) override;
  void Detach(const uint64_t& addr) override;
  void Release() override;
  std::string Name() override;
  uint64_t Size() override;
  uint64_t ResidentBytes() override;
  std::string State() override;
  uint32_t Refcount() override;
  bool Pinned() override;

  ModelEntry& entry();
  const dbus::Caller& caller();

  Daemon& d_;
  uint64_t id_;
};

}  // namespace airs::daemon
