// SPDX-License-Identifier: Apache-2.0
// airs-memd's state and its one event loop. The Daemon owns every subsystem
// (pool, pager, KV, pressure) and the bus objects that expose them; bus
// handlers, fault events, io completions, timers and signals all run on the
// loop thread, so no state here needs a lock. The bus may come and go
// (BusLink): the bus objects exist only while it is there, everything else
// lives on.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <sdbus-c++/sdbus-c++.h>

#include "config/config.hpp"
#include "daemon/access.hpp"
#include "daemon/bus_link.hpp"
#include "daemon/bus_manager.hpp"
#include "daemon/lost_callers.hpp"
#include "daemon/models.hpp"
#include "daemon/status.hpp"
#include "pager/pager.hpp"
#include "pool/pool.hpp"
#include "probe/mode.hpp"
#include "dbus/identity.hpp"
#include "dbus/variant.hpp"
#include "sys/event_loop.hpp"
#include "util/result.hpp"

namespace airs::daemon {

class ModelObject;
class SessionObject;
class KvService;
class PressureLoop;
class Evictor;
class DrainWaits;
class ContentHasher;
class KeptModels;
struct KvSession;

struct Options {
  config::Config config;
  std::string bus_override;  // --bus: takes precedence over daemon.bus
};

// The manager reaches it only through ManagerOps (daemon/bus_manager.hpp);
// the model and session objects get the few services they use.
class Daemon final : public ManagerOps {
 public:
  // Start-up: probes the machine, builds the pool and connects to the bus
  // (or starts waiting for it: daemon.start_without_bus). Errors say what
  // is missing and how to fix it.
  static Result<std::unique_ptr<Daemon>> create(Options options);
  ~Daemon() override;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Runs until SIGTERM/SIGINT (or a bus that refuses the name at start).
  // Returns the process exit code.
  int run();

  // --- ManagerOps: the manager's calls (loop thread) ---
  // Reads /proc/meminfo and the pool's kernel counters too.
  StatusSnapshot status() override;
  [[nodiscard]] std::vector<ModelStatus> model_statuses() const override;
  [[nodiscard]] std::vector<SessionStatus> list_sessions() const override;
  Status read_header(const dbus::Caller& caller, int gguf_fd, const std::string& what, HeaderDone done) override;
  Result<std::string> load_model(const dbus::Caller& caller, int gguf_fd, const std::string& name,
                                 const Header& header) override;
  Status unload_model(const std::string& path, bool force, const std::string& who) override;
  // The session object is registered on the bus.
  Result<NewSession> create_session(const dbus::Caller& caller, const std::string& model_path,
                                    const std::string& priority) override;

 private:
  explicit Daemon(Options options);
  // Start-up, in steps (daemon.cpp says their order).
  Status init();
  Status read_profile();
  Status start_loop();
  Result<probe::Mode> choose_mode();
  Status start_local(probe::Mode mode);
  Result<std::unique_ptr<pool::PoolBackend>> make_backend(probe::Mode mode);
  void open_state_dir();
  Status make_pool(std::unique_ptr<pool::PoolBackend> backend, uint64_t kept_bytes);
  Status start_services(probe::Mode mode);
  Status make_pager(probe::Mode mode);
  void make_kv();
  void make_evictor();
  Status start_timers();
  void lock_code();
  Status start_bus();
  // The cloud-only profile (no pool: its size is 0): no pool, pager, models,
  // KV or pressure loop exist, and what would need them is refused with
  // refuse_cloud_only (`what` is appended to its message).
  [[nodiscard]] bool cloud_only() const { return pool_target_ == 0; }
  [[nodiscard]] Error refuse_cloud_only(std::string_view what = {}) const;
  void on_kv_evicted(const KvSession& s, const std::vector<uint32_t>& blocks, uint64_t bytes,
                     const std::string& reason);
  // BusLink's hooks: the bus objects made on a new connection (manager,
  // every model's and session's object, the NameOwnerChanged match), and
  // dropped before it goes; on a lost bus, what its callers held moves to
  // LostCallers.
  void attach_bus(sdbus::IConnection& bus);
  void detach_bus(bool lost);
  void keep_for_lost_callers();
  void on_name_owner_changed(sdbus::Message& sig);
  // `name` (a bus unique name or a LostCallers key) is gone (`why`, for the
  // log): everything it held goes.
  void caller_gone(const std::string& name, const std::string& why);
  // Emits a signal at the bus edge: nothing while there is no bus; a
  // failure is logged naming `what` and never reaches the caller.
  template <class F>
  void emit(const std::string& what, F&& send);
  void on_signal();
  void housekeeping();
  void on_model_state(pager::ModelId id, wire::ModelLoadState state);
  void on_model_dropped(const ModelEntry& m, bool forced, const std::string& reason);
  // A closed session's bus object: destroyed at the next housekeeping (this may run inside its own call).
  void retire_session_object(const std::string& path);
  // KvService::close_cut_arenas, and their sessions' objects retired.
  void close_cut_arenas();
  void preload_models();
  // One models.preload entry; false while its room is on its way back.
  bool preload(const std::string& path, int gguf_fd, const Header& header);
  [[nodiscard]] ModelStatus model_status(const ModelEntry& m) const;
  // The bus object of a model just loaded or adopted (once per model and
  // connection; none while there is no bus).
  void add_model_object(const ModelEntry& m);
  void add_model_object(const ModelEntry& m, sdbus::IConnection& bus);
  // A new session's bus object. Errors: no bus, registration refused.
  Status add_session_object(const std::string& path);
  // Throws sdbus::Error when the bus refuses the object.
  void make_session_object(const std::string& path, sdbus::IConnection& bus);
  Status close_session(KvSession& s);

  config::Config cfg_;
  std::string bus_address_;
  std::string profile_;
  uint64_t pool_target_ = 0;
  uint64_t page_size_ = 0;
  std::chrono::steady_clock::time_point started_;

  std::unique_ptr<sys::EventLoop> loop_;
  std::optional<sys::SignalSource> signals_;
  std::optional<sys::PeriodicTimer> watchdog_;
  std::unique_ptr<BusLink> link_;
  std::unique_ptr<LostCallers> lost_callers_;
  int exit_code_ = 0;
  dbus::IdentityCache ids_;
  Access access_;
  std::unique_ptr<FdQuota> fds_;
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
  // Calls waiting for pages on their way back to the pool (LoadModel, KV
  // Allocate, models.preload): answered from the drain event.
  std::unique_ptr<DrainWaits> drain_waits_;
  // GGUF headers being read off the loop (LoadModel, models.preload, kept
  // models): the loop never waits for a file.
  std::unique_ptr<HeaderReader> header_reader_;
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
};

}  // namespace airs::daemon
