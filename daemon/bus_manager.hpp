// org.aios.Airs1.Manager at /org/aios/Airs1: translates bus calls into
// Daemon operations and airs::Error into named D-Bus errors.
#pragma once

#include "dbus_gen/adaptor.h"

#include "dbus/variant.hpp"

namespace airs::daemon {

class Daemon;

class ManagerObject final
    : public sdbus::AdaptorInterfaces<org::aios::Airs1::Manager_adaptor, sdbus::Properties_adaptor> {
 public:
  ManagerObject(sdbus::IConnection& bus, Daemon& daemon);
  ~ManagerObject();

  using Manager_adaptor::emitEvicted;
  using Manager_adaptor::emitPressureChanged;

 private:
  dbus::Dict GetStatus() override;
  sdbus::ObjectPath LoadModel(const sdbus::UnixFd& gguf_fd, const dbus::Dict& options) override;
  std::vector<dbus::Dict> ListModels() override;
  void Unload(const sdbus::ObjectPath& model, const bool& force) override;
  dbus::Dict Evict(const dbus::Dict& what, const bool& dry_run) override;
  std::tuple<sdbus::ObjectPath, sdbus::UnixFd, sdbus::UnixFd, sdbus::UnixFd, dbus::Dict> CreateSession(
      const sdbus::ObjectPath& model, const std::string& priority, const dbus::Dict& options) override;
  std::vector<dbus::Dict> ListSessions() override;

  std::string Version() override;
  std::string Profile() override;
  std::string Mode() override;
  uint64_t PoolBytes() override;
  uint64_t PoolFreeBytes() override;
  uint64_t PageSize() override;
  std::string PressureLevel() override;

  Daemon& d_;
};

}  // namespace airs::daemon
