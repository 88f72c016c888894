// airs-memd's state and its one event loop. The Daemon owns every subsystem
// (pool, pager, KV, pressure) and the bus objects that expose them; bus
// handlers, fault events, io completions, timers and signals all run on the
// loop thread, so no state here needs a lock.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <sdbus-c++/sdbus-c++.h>

#include "config/config.hpp"
#include "daemon/models.hpp"
#include "daemon/status.hpp"
#include "pager/pager.hpp"
#include "pool/pool.hpp"
#include "dbus/identity.hpp"
#include "dbus/variant.hpp"
#include "sys/event_loop.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class ManagerObject;
class ModelObject;
class SessionObject;
class KvService;
class PressureLoop;
class Evictor;
class ContentHasher;
class KeptModels;
struct KvSession;

struct Options {
  config::Config config;
  std::string bus_override;  // --bus: takes precedence over daemon.bus
};

class Daemon {
 public:
  // Start-up: probes the machine, builds the pool and connects to the bus.
  // Errors say what is missing and how to fix it.
  static Result<std::unique_ptr<Daemon>> create(Options options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Runs until SIGTERM/SIGINT. Returns the process exit code.
  int run();

  // --- used by the bus objects (loop thread) ---
  // Everything GetStatus and the metrics file say (reads /proc/meminfo and
  // the pool's kernel counters).
  [[nodiscard]] StatusSnapshot status();
  [[nodiscard]] const config::Config& config() const { return cfg_; }
  [[nodiscard]] const std::string& profile() const { return profile_; }
  [[nodiscard]] uint64_t pool_target_bytes() const { return pool_target_; }
  [[nodiscard]] uint64_t page_size() const { return page_size_; }
  [[nodiscard]] uint64_t pool_bytes() const { return pool_ ? pool_->counts().total_bytes() : 0; }
  [[nodiscard]] uint64_t pool_free_bytes() const { return pool_ ? pool_->counts().free_bytes() : 0; }
  dbus::IdentityCache& identities() { return ids_; }
  Models& models() { return *models_; }
  KvService& kv() { return *kv_; }
  // The pressure loop (null without a local pool).
  PressureLoop* pressure() { return pressure_.get(); }
  // CreateSession for `caller`: the session object is registered on the bus.
  std::tuple<std::string, sys::UniqueFd, sys::UniqueFd, sys::UniqueFd, SessionGeometry> create_session(
      const dbus::Caller& caller, const std::string& model_path, const std::string& priority);
  void close_session(KvSession& s, const dbus::Caller& caller);
  [[nodiscard]] std::vector<SessionStatus> list_sessions() const;
  [[nodiscard]] const std::string& mode() const { return mode_; }
  [[nodiscard]] ModelStatus model_status(const ModelEntry& m) const;
  [[nodiscard]] std::vector<ModelStatus> model_statuses() const;

  // LoadModel on behalf of `caller`: returns the model's object path.
  Result<std::string> load_model(const dbus::Caller& caller, int gguf_fd, const std::string& name);
  Status unload_model(const std::string& path, bool force, const std::string& who);
  // Root, daemon.admin_group or daemon.trusted_group: may open models
  // lazily (a writable region fd).
  [[nodiscard]] bool is_trusted(const dbus::Caller& caller) const;
  [[nodiscard]] bool is_admin(const dbus::Caller& caller) const;

  // Per-uid fd quota (kv.max_fds_per_uid) on the descriptors the uid's
  // processes actually hold: every fd handed out counts until a recount of
  // the processes' /proc/PID/fd shows it closed (Release and Close do not
  // uncount: a client may keep what it was given). Throws QuotaExceeded when
  // `n` more would pass the limit; counts them otherwise.
  void check_fd_quota(const dbus::Caller& caller, uint32_t n);
  // `n` fds counted by check_fd_quota were not handed out after all.
  void fds_returned(const dbus::Caller& caller, uint32_t n);
  // Admin methods: root, or a member of daemon.admin_group. Throws AccessDenied.
  void require_admin(const dbus::Caller& caller, const char* method);

 private:
  explicit Daemon(Options options);
  Status init();
  Status connect_bus();
  void pump_bus();
  void on_name_owner_changed(sdbus::Message& sig);
  void on_signal();
  void housekeeping();
  void on_model_state(pager::ModelId id, client::ModelLoadState state);
  void on_model_dropped(const ModelEntry& m, bool forced, const std::string& reason);
  void preload_models();
  [[nodiscard]] bool in_group(const dbus::Caller& caller, const std::string& group) const;
  [[nodiscard]] uint32_t fds_held_by_uid(uid_t uid);

  config::Config cfg_;
  std::string bus_address_;
  std::string profile_;
  uint64_t pool_target_ = 0;
  uint64_t page_size_ = 0;
  std::chrono::steady_clock::time_point started_;

  std::unique_ptr<sys::EventLoop> loop_;
  std::optional<sys::SignalSource> signals_;
  std::optional<sys::PeriodicTimer> watchdog_;
  std::unique_ptr<sdbus::IConnection> bus_;
  int bus_fd_ = -1;
  dbus::IdentityCache ids_;
  std::unique_ptr<ManagerObject> manager_;

  std::string mode_ = "full";
  std::string numa_;  // the pool's NUMA policy and the nodes it uses, for status
  std::string mode_reason_;
  std::vector<std::string> advice_;
  std::string read_error_;  // "poison" or "sigbus": what a lazy client gets on a failed read
  std::map<std::string, std::string> capabilities_;
  std::unique_ptr<pool::Pool> pool_;
  std::unique_ptr<pager::Pager> pager_;
  std::unique_ptr<Models> models_;
  std::map<uint64_t, std::unique_ptr<ModelObject>> model_objects_;
  std::unique_ptr<KvService> kv_;
  std::unique_ptr<Evictor> evictor_;
  std::unique_ptr<ContentHasher> hasher_;
  std::unique_ptr<KeptModels> kept_;
  void adopt_kept(std::vector<struct KeptModel> kept);
  void on_content_id(uint64_t model_id, Result<gguf::ContentId> id);
  std::unique_ptr<PressureLoop> pressure_;
  std::map<std::string, std::unique_ptr<SessionObject>> session_objects_;
  std::vector<std::unique_ptr<SessionObject>> retired_sessions_;
  std::optional<sys::PeriodicTimer> housekeeping_;
  std::optional<sys::PeriodicTimer> metrics_timer_;
  void write_metrics();
  std::vector<std::string> preloaded_;  // names of models.preload entries loaded at start
  std::map<uid_t, uint32_t> fds_by_uid_;
  std::map<std::string, std::pair<uid_t, uint32_t>> fds_by_caller_;
};

}  // namespace airs::daemon
