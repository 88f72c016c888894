// SPDX-License-Identifier: Apache-2.0
// org.aios.Airs1.Manager at /org/aios/Airs1: translates bus calls into
// daemon operations and airs::Error into named D-Bus errors.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/header_reader.hpp"
#include "daemon/status.hpp"
#include "dbus/identity.hpp"
#include "dbus/variant.hpp"
#include "dbus_gen/adaptor.h"
#include "pool/pool.hpp"
#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class Access;
class DrainWaits;
class PressureLoop;

// The manager's operations that span several services and the registry of
// bus objects (a loaded model gets its ModelObject, a session its
// SessionObject, a status reads every service): the Daemon implements
// them, so the manager depends on this and not on the Daemon class.
class ManagerOps {
 public:
  struct NewSession {
    std::string path;
    sys::UniqueFd arena, notice, event;
    SessionGeometry geometry;
  };
  virtual ~ManagerOps() = default;
  // Everything GetStatus and the metrics file say.
  virtual StatusSnapshot status() = 0;
  [[nodiscard]] virtual std::vector<ModelStatus> model_statuses() const = 0;
  [[nodiscard]] virtual std::vector<SessionStatus> list_sessions() const = 0;
  using HeaderDone = std::function<void(Result<std::shared_ptr<const Header>>)>;
  // A LoadModel's first half: reads the GGUF header of `gguf_fd` off the
  // loop (HeaderReader) and runs `done` on the loop with it, or with the
  // file's error or the stall. Errors at once (and `done` never runs): the
  // caller's or the daemon's bound of header reads, no local pool. `what`
  // starts every error.
  virtual Status read_header(const dbus::Caller& caller, int gguf_fd, const std::string& what, HeaderDone done) = 0;
  // Its second half, on the loop: the model's object path.
  virtual Result<std::string> load_model(const dbus::Caller& caller, int gguf_fd, const std::string& name,
                                         const Header& header) = 0;
  virtual Status unload_model(const std::string& path, bool force, const std::string& who) = 0;
  virtual Result<NewSession> create_session(const dbus::Caller& caller, const std::string& model_path,
                                            const std::string& priority) = 0;
};

// What the manager uses: the operations above and the few services it
// reads directly.
struct ManagerServices {
  ManagerOps& ops;
  dbus::IdentityCache& ids;
  const Access& access;    // Unload and Evict: admins only
  PressureLoop* pressure;  // Evict, PressureLevel (null without a local pool)
  DrainWaits* drains;      // a LoadModel waiting for pages on their way back (null without a local pool)
  const pool::Pool* pool;  // PoolBytes, PoolFreeBytes (null without a local pool)
  std::string profile;     // fixed at start, like the two below
  std::string mode;
  uint64_t page_size = 0;
};

class ManagerObject final
    : public sdbus::AdaptorInterfaces<org::aios::Airs1::Manager_adaptor, sdbus::Properties_adaptor> {
 public:
  ManagerObject(sdbus::IConnection& bus, ManagerServices services);
  ~ManagerObject();

  using Manager_adaptor::emitEvicted;
  using Manager_adaptor::emitPressureChanged;

 private:
  dbus::Dict GetStatus() override;
  // Answered once its header is read off the loop (HeaderReader), then at
  // once or once the pages its room is in are back (DrainWaits).
  void LoadModel(sdbus::Result<sdbus::ObjectPath>&& result, sdbus::UnixFd gguf_fd, dbus::Dict options) override;
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

  const dbus::Caller& caller();

  ManagerServices svc_;
};

}  // namespace airs::daemon
