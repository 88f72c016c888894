// SPDX-License-Identifier: Apache-2.0
#include "daemon/daemon.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/stat.h>

#include <csignal>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "daemon/bus_dicts.hpp"
#include "daemon/bus_manager.hpp"
#include "daemon/bus_model.hpp"
#include "daemon/bus_session.hpp"
#include "daemon/content_hasher.hpp"
#include "daemon/drain_waits.hpp"
#include "daemon/evictor.hpp"
#include "daemon/kept_models.hpp"
#include "daemon/kv_service.hpp"
#include "daemon/metrics.hpp"
#include "daemon/pressure_loop.hpp"
#include "pool/hugetlbfs_backend.hpp"
#include "pool/shmem_backend.hpp"
#include "probe/mode.hpp"
#include "probe/probe.hpp"
#include "dbus/names.hpp"
#include "sys/code_lock.hpp"
#include "sys/notify.hpp"
#include "sys/numa.hpp"
#include "sys/procfs.hpp"
#include "sys/uffd.hpp"
#include "sys/files.hpp"
#include "util/text.hpp"
#include "util/units.hpp"

namespace airs::daemon {
Daemon::Daemon(Options options)
    : cfg_(std::move(options.config)),
      bus_address_(std::move(options.bus_override)),
      access_(cfg_.daemon.admin_group, cfg_.daemon.trusted_group) {
  if (bus_address_.empty()) bus_address_ = cfg_.daemon.bus;
  fds_ = std::make_unique<FdQuota>(cfg_.kv.max_fds_per_uid, ids_, [this](sys::InodeSet& ours) {
    if (cloud_only()) return;
    models_->add_inodes(ours);
    kv_->add_inodes(ours);
  });
  started_ = std::chrono::steady_clock::now();
}

Daemon::~Daemon() {
  // Calls still waiting for pages or a header are refused while the bus is there.
  if (header_reader_) header_reader_->refuse_bus_calls("the daemon is shutting down");
  header_reader_.reset();
  drain_waits_.reset();
  // The pager may still finish reads while it drains: nothing above it may
  // hear about them any more.
  if (pager_) {
    pager_->set_state_listener({});
    pager_->set_drain_listener({});
  }
  // Clients outlive us: their mappings keep the pages they map (a clean
  // exit must not hand a resident client zeros; a restart can re-adopt).
  if (pool_) pool_->leave_regions_in_place();
  // Bus objects first (the link drops them, then its connection): they
  // refer to the state below.
  link_.reset();
  lost_callers_.reset();
  session_objects_.clear();
  retired_sessions_.clear();
  model_objects_.clear();
  manager_.reset();
  pressure_.reset();
  kv_.reset();
  models_.reset();
  pager_.reset();
  pool_.reset();
}

Result<std::unique_ptr<Daemon>> Daemon::create(Options options) {
  std::unique_ptr<Daemon> d(new Daemon(std::move(options)));
  AIRS_TRY(d->init());
  return d;
}

// Start-up, each step after what it needs: the profile says whether there
// is a pool at all; the loop carries everything after it; the mode decides
// the pool's backend; the services stand on the pool; the bus comes last,
// so that every model it shows is there already.
Status Daemon::init() {
  AIRS_TRY(read_profile());
  AIRS_TRY(start_loop());
  auto mode = choose_mode();
  if (!mode) return std::move(mode).error();
  if (cloud_only()) {
    // The one other path: no pool, no services on it; loads and sessions
    // are refused naming the profile (refuse_cloud_only).
    mode_ = "cloud-only";
    spdlog::info("profile {}: no local model pool (cloud inference only)", profile_);
  } else {
    AIRS_TRY(start_local(*mode));
  }
  AIRS_TRY(start_timers());
  lock_code();
  AIRS_TRY(start_bus());
  if (!cloud_only()) preload_models();
  return {};
}

Error Daemon::refuse_cloud_only(std::string_view what) const {
  return make_error(ENOTSUP, "no local model pool on this device (profile {}: cloud inference only){}", profile_, what);
}

Status Daemon::read_profile() {
  auto meminfo = sys::read_meminfo();
  if (!meminfo) return std::move(meminfo).error();
  const uint64_t mem_total = meminfo->count("MemTotal") ? meminfo->at("MemTotal") : 0;
  const auto prof = config::effective_profile(cfg_.pool, mem_total);
  profile_ = prof.name;
  pool_target_ = prof.pool_bytes;
  page_size_ = cfg_.pool.page_size;
  if (page_size_ == 0 && meminfo->count("Hugepagesize")) page_size_ = meminfo->at("Hugepagesize");
  spdlog::info("profile {} (MemTotal {}): pool {}, huge page {}", profile_, format_bytes(mem_total),
               format_bytes(pool_target_), format_bytes(page_size_));
  return {};
}

Status Daemon::start_loop() {
  auto loop = sys::EventLoop::create();
  if (!loop) return std::move(loop).error();
  loop_ = std::move(loop).value();

  // Signals become events on the loop; blocked before any thread exists.
  auto sigs = sys::SignalSource::create({SIGTERM, SIGINT, SIGHUP});
  if (!sigs) return std::move(sigs).error();
  signals_.emplace(std::move(sigs).value());
  AIRS_TRY(loop_->add(signals_->fd(), EPOLLIN, [this](uint32_t) { on_signal(); }));

  if (auto wd = sys::watchdog_interval()) {
    // Ping at half the interval from the loop itself: a wedged loop stops
    // the pings and systemd restarts us.
    auto t = sys::PeriodicTimer::create(*wd / 2);
    if (!t) return std::move(t).error();
    watchdog_.emplace(std::move(t).value());
    AIRS_TRY(loop_->add(watchdog_->fd(), EPOLLIN, [this](uint32_t) {
      watchdog_->acknowledge();
      sys::notify("WATCHDOG=1");
    }));
    spdlog::info("watchdog: pinging every {} ms", std::chrono::duration_cast<std::chrono::milliseconds>(*wd / 2).count());
  }
  return {};
}

// What the kernel offers decides the mode (full / small-pages /
// cooperative); status explains it and what would enable more.
Result<probe::Mode> Daemon::choose_mode() {
  auto caps = probe::probe(probe::ProbePaths{});
  spdlog::info("platform:\n{}", probe::format_report(caps));
  capabilities_ = probe::to_key_values(caps);
  auto choice = probe::choose_mode(caps, config::to_string(cfg_.models.mode));
  if (!choice) return std::move(choice).error();
  if (cfg_.pool.backend == config::Backend::Shmem && choice->mode == probe::Mode::Full) {
    choice->mode = probe::Mode::SmallPages;
    choice->reason = "pool.backend = \"shmem\" in the configuration: userfaultfd on shmem";
  }
  if (cfg_.pool.backend == config::Backend::Hugetlbfs && choice->mode != probe::Mode::Full)
    return make_error(ENOTSUP, "pool.backend = \"hugetlbfs\" needs the full mode, but the mode is {}: {}",
                      probe::to_string(choice->mode), choice->reason);
  mode_ = probe::to_string(choice->mode);
  mode_reason_ = choice->reason;
  for (auto& a : choice->advice) {
    advice_.push_back(a.text);
    spdlog::warn("{}", a.text);
  }
  spdlog::info("mode {}: {}", mode_, mode_reason_);
  // How a failed model read reaches a lazily mapped client (the pager's
  // sys::uffd_poison_or_sigbus): UFFDIO_POISON (Linux 6.6) makes the
  // faulting thread's access raise SIGBUS (BUS_ADRERR); without it the
  // daemon sends SIGBUS to the client process through its pidfd. Either way
  // the client never hangs and never reads zeros.
  read_error_ = caps.uffd.has(UFFD_FEATURE_POISON) ? "poison" : "sigbus";
  return choice->mode;
}

// The pool and what stands on it: its backend, the regions an earlier
// daemon filled (kept: their pages are in use, so the reserve is made
// without them), the pool, the services, then the kept models adopted.
Status Daemon::start_local(probe::Mode mode) {
  auto backend = make_backend(mode);
  if (!backend) return std::move(backend).error();
  open_state_dir();
  kept_ = std::make_unique<KeptModels>(cfg_.daemon.state_dir);
  auto kept = kept_->collect();
  uint64_t kept_bytes = 0;
  for (const auto& k : kept) kept_bytes += k.region_bytes;
  AIRS_TRY(make_pool(std::move(backend).value(), kept_bytes));
  AIRS_TRY(start_services(mode));
  adopt_kept(std::move(kept));
  // Pinned as status's pinned_how says: hugetlb pages by construction,
  // shmem pages only where each model's mlock works.
  const bool hugetlb = std::string_view(pool_->backend().name()) == "hugetlbfs";
  spdlog::info("pool: {} in {} pages of {} ({}), pinned: {}", format_bytes(pool_->counts().total_bytes()),
               pool_->counts().total_pages(), format_bytes(page_size_), pool_->backend().name(),
               hugetlb ? "hugetlb pages are never swapped or reclaimed"
                       : "shmem pages are locked with mlock per model (status says where that failed)");
  return {};
}

// full: huge pages from hugetlbfs. small-pages and cooperative: shmem (huge
// folios on a private tmpfs where the kernel allows, else memfds) pinned
// with mlock, for kernels without hugetlbfs or forced. Either on the
// configured NUMA nodes.
Result<std::unique_ptr<pool::PoolBackend>> Daemon::make_backend(probe::Mode mode) {
  const sys::NumaPolicy numa = cfg_.pool.numa_policy == config::NumaPolicy::Bind ? sys::NumaPolicy::Bind
                               : cfg_.pool.numa_policy == config::NumaPolicy::Interleave
                                   ? sys::NumaPolicy::Interleave
                                   : sys::NumaPolicy::Local;
  auto nodes = sys::resolve_numa_nodes(numa, cfg_.pool.numa_nodes);
  if (!nodes) return std::move(nodes).error();
  numa_ = numa == sys::NumaPolicy::Local ? std::string("local")
                                         : fmt::format("{} over {}", sys::to_string(numa), sys::format_node_list(*nodes));
  spdlog::info("pool NUMA policy: {} ({} node(s) with memory)", numa_, sys::numa_node_count());
  if (mode != probe::Mode::Full || cfg_.pool.backend == config::Backend::Shmem) {
    pool::ShmemOptions so;
    so.unit = cfg_.pool.page_size;
    so.numa_policy = numa;
    so.numa_nodes = cfg_.pool.numa_nodes;
    so.huge_dir = cfg_.pool.shmem_mount;
    auto b = pool::ShmemBackend::create(so);
    if (!b) return std::move(b).error();
    spdlog::info("pool: {}", (*b)->huge_folios_note());
    return std::unique_ptr<pool::PoolBackend>(std::move(b).value());
  }
  pool::HugetlbfsOptions ho;
  ho.page_size = cfg_.pool.page_size;
  ho.mount_path = cfg_.pool.hugetlbfs_mount;
  ho.numa_policy = numa;
  ho.numa_nodes = cfg_.pool.numa_nodes;
  auto b = pool::HugetlbfsBackend::create(ho);
  if (!b) return std::move(b).error();
  return std::unique_ptr<pool::PoolBackend>(std::move(b).value());
}

// Without its state directory the daemon still serves; it only keeps
// nothing across restarts (said once, here).
void Daemon::open_state_dir() {
  if (cfg_.daemon.state_dir.empty()) return;
  if (auto st = sys::make_dir(cfg_.daemon.state_dir, 0700); !st) {
    spdlog::warn("daemon.state_dir: {}; keeping nothing across restarts (no content-id cache, KV spill tier, "
                 "access orders or kept regions)",
                 st.error().message);
    cfg_.daemon.state_dir.clear();
  }
}

Status Daemon::make_pool(std::unique_ptr<pool::PoolBackend> backend, uint64_t kept_bytes) {
  pool::PoolOptions po;
  po.size_bytes = pool_target_ > kept_bytes ? pool_target_ - kept_bytes : backend->page_size();
  po.grow_nr_hugepages = cfg_.pool.grow_nr_hugepages;
  po.allow_partial = true;
  auto pool = pool::Pool::create(std::move(backend), po);
  if (!pool) return std::move(pool).error();
  pool_ = std::move(pool).value();
  page_size_ = pool_->page_size();
  if (pool_->counts().total_bytes() < pool_target_)
    spdlog::warn("pool: started with {} of its {} (the kernel had no more free {} pages now: memory fragmented or in "
                 "use); it grows toward its size as memory allows — status shows both",
                 format_bytes(pool_->counts().total_bytes()), format_bytes(pool_target_), format_bytes(page_size_));
  return {};
}

// The services on the pool, each after what it is built on: the loop's
// helpers, the pager, the model table, KV, the evictor over both, and the
// pressure loop that drives the evictor.
Status Daemon::start_services(probe::Mode mode) {
  auto waits = DrainWaits::create(*loop_, cfg_.models.drain_wait);
  if (!waits) return std::move(waits).error();
  drain_waits_ = std::move(waits).value();
  auto reader =
      HeaderReader::create(*loop_, cfg_.models.header_timeout, cfg_.models.direct_io != config::DirectIo::Off);
  if (!reader) return std::move(reader).error();
  header_reader_ = std::move(reader).value();
  AIRS_TRY(make_pager(mode));
  Models::Hooks mh;
  mh.dropped = [this](const ModelEntry& m, bool forced, const std::string& reason) {
    on_model_dropped(m, forced, reason);
  };
  models_ = std::make_unique<Models>(*pool_, *pager_, cfg_.models, mode == probe::Mode::Cooperative, std::move(mh));
  if (!cfg_.daemon.state_dir.empty()) {
    models_->set_content_ids(gguf::ContentIdCache(cfg_.daemon.state_dir + "/identity"));
    models_->set_access_orders(AccessOrders(cfg_.daemon.state_dir + "/order"));
  }
  auto hasher = ContentHasher::create(*loop_, [this](uint64_t model_id, Result<gguf::ContentId> id) {
    on_content_id(model_id, std::move(id));
  });
  if (!hasher) return std::move(hasher).error();
  hasher_ = std::move(hasher).value();
  make_kv();
  make_evictor();
  PressureLoop::Hooks hooks;
  hooks.level_changed = [this](policy::Level level, const PressureChange& details) {
    emit("PressureChanged", [&] {
      if (manager_) manager_->emitPressureChanged(policy::to_string(level), to_dict(details));
    });
  };
  auto pl = PressureLoop::create(*loop_, *pool_, *models_, *evictor_, cfg_, pool_target_, std::move(hooks));
  if (!pl) return std::move(pl).error();
  pressure_ = std::move(pl).value();
  return {};
}

// The pager's events go up to what is built on it (the model table, the
// pressure loop, the parked calls): none fires before a model is loaded,
// after start-up.
Status Daemon::make_pager(probe::Mode mode) {
  pager::PagerOptions pgo;
  pgo.queue_depth = cfg_.models.queue_depth;
  pgo.prefetch_window = cfg_.models.prefetch_window;
  pgo.warmup_bytes_per_s = cfg_.models.warmup_rate;
  pgo.allocate_ahead = cfg_.models.allocate_ahead;
  pgo.expert_unit = cfg_.models.stream_expert_unit;
  pgo.direct_io = cfg_.models.direct_io == config::DirectIo::On    ? pager::DirectIo::On
                  : cfg_.models.direct_io == config::DirectIo::Off ? pager::DirectIo::Off
                                                                   : pager::DirectIo::Auto;
  pgo.uffd_clients = mode != probe::Mode::Cooperative;
  pager::Pager::Listeners pl;
  pl.state = [this](pager::ModelId id, wire::ModelLoadState st) { on_model_state(id, st); };
  // An eviction's pages are back in the pool: what the pressure loop meant
  // to give the kernel goes now, then the calls parked for pages on their
  // way (DrainWaits) run again.
  pl.drain = [this](pager::ModelId, pager::Pager::Drained) {
    pressure_->pages_returned();
    drain_waits_->pages_returned();
  };
  // The pager is the record of who is attached: the table forgets a client
  // the pager let go (its process died, its socket hung up, a detach).
  pl.client_left = [this](pager::ModelId id, pager::ClientKey key) { models_->client_left(id, key); };
  auto pg = pager::Pager::create(*loop_, *pool_, pgo, std::move(pl));
  if (!pg) return std::move(pg).error();
  pager_ = std::move(pg).value();
  return {};
}

void Daemon::make_kv() {
  kv_ = std::make_unique<KvService>(
      *pool_, *models_, cfg_.kv,
      [this](const KvSession& s, const std::vector<uint32_t>& blocks, uint64_t bytes, const std::string& reason) {
        on_kv_evicted(s, blocks, bytes, reason);
      });
  kv_->watch_reports(*loop_);
  if (!cfg_.daemon.state_dir.empty() && cfg_.kv.spill_limit > 0) {
    // Without the tier the daemon still serves: evicted prefixes are recomputed.
    if (auto st = SpillStore::open(*loop_, cfg_.daemon.state_dir + "/kv", cfg_.kv.spill_limit))
      kv_->set_spill_store(std::move(st).value());
    else
      spdlog::warn("KV spill tier off: {}", st.error().message);
  }
}

// Eviction notices reach the client through its notice page and wake socket in
// any case; the signals are for the bus's other listeners.
void Daemon::on_kv_evicted(const KvSession& s, const std::vector<uint32_t>& blocks, uint64_t bytes,
                           const std::string& reason) {
  emit("Session.Evicted of " + s.path, [&] {
    if (auto it = session_objects_.find(s.path); it != session_objects_.end()) it->second->emitEvicted(blocks, reason);
  });
  emit("Manager.Evicted of " + s.path, [&] {
    if (manager_) manager_->emitEvicted(sdbus::ObjectPath(s.path), blocks, bytes, reason);
  });
}

// The one cycle among the services: a model load and a KV allocation ask
// the evictor for room, and the evictor reads and evicts the models and KV
// it is built on. So the two get their room maker once it exists.
void Daemon::make_evictor() {
  policy::Config pc;
  pc.idle_threshold = cfg_.kv.idle_threshold;
  pc.target_some_bytes = cfg_.pressure.target_some_bytes;
  pc.target_full_bytes = cfg_.pressure.target_full_bytes;
  evictor_ = std::make_unique<Evictor>(*pool_, *models_, *kv_, pc);
  Evictor& ev = *evictor_;
  models_->set_room_maker([&ev](uint64_t bytes, const std::string& why) {
    return ev.make_room(policy::Request::for_model_load(bytes), why);
  });
  kv_->set_room_maker([&ev](const policy::Request& r, const std::string& why) { return ev.make_room(r, why); });
}

Status Daemon::start_timers() {
  auto hk = sys::PeriodicTimer::create(std::chrono::milliseconds(250));
  if (!hk) return std::move(hk).error();
  housekeeping_.emplace(std::move(hk).value());
  AIRS_TRY(loop_->add(housekeeping_->fd(), EPOLLIN, [this](uint32_t) {
    housekeeping_->acknowledge();
    housekeeping();
  }));
  if (cfg_.daemon.metrics_file.empty()) return {};
  auto mt = sys::PeriodicTimer::create(cfg_.daemon.metrics_interval);
  if (!mt) return std::move(mt).error();
  metrics_timer_.emplace(std::move(mt).value());
  return loop_->add(metrics_timer_->fd(), EPOLLIN, [this](uint32_t) {
    metrics_timer_->acknowledge();
    write_metrics();
  });
}

// Its code stays resident: under pressure the loop must not wait for its
// own code to be read back from a disk that model reads keep busy. Locked
// once everything but the bus is set up, so that what the start loaded
// (the NSS modules of the group lookups among them) is locked too, and
// before the bus name is taken, so that a client finds it locked.
void Daemon::lock_code() {
  if (auto locked = sys::lock_loaded_code())
    spdlog::info("its code is locked in memory: {} in {} objects", format_bytes(locked->bytes), locked->objects);
  else
    spdlog::warn("{}; under memory pressure its loop may wait for its own code to be read back", locked.error().message);
}

// The bus: every model and session gets its object on each connection
// (attach_bus), so models adopted above, preloaded below or loaded while the
// bus is away are all reachable once it is there.
Status Daemon::start_bus() {
  lost_callers_ = std::make_unique<LostCallers>(*loop_, [this](const std::string& key) {
    caller_gone(key, "exited (its connection had died with a lost bus)");
  });
  BusLink::Hooks bh;
  bh.attach = [this](sdbus::IConnection& bus) { attach_bus(bus); };
  bh.detach = [this](bool lost) { detach_bus(lost); };
  bh.fatal = [this](const Error& e) {
    spdlog::critical("{}", e.message);
    exit_code_ = 1;
    loop_->stop();
  };
  auto link = BusLink::create(*loop_, bus_address_, std::move(bh));
  if (!link) return std::move(link).error();
  link_ = std::move(link).value();
  return link_->start(cfg_.daemon.start_without_bus);
}

void Daemon::write_metrics() {
  if (auto r = write_metrics_file(cfg_.daemon.metrics_file, format_metrics(status())); !r) {
    // Once per failure streak would be nicer; a warning per interval is
    // still readable and says exactly what to fix.
    spdlog::warn("{}", r.error().message);
  }
}

void Daemon::housekeeping() {
  // Session objects whose Close() replied are destroyed here, outside the handler.
  retired_sessions_.clear();
  if (cloud_only()) return;
  kv_->restore_arenas();
  close_cut_arenas();
  if (cfg_.models.keep_alive.count() == 0) return;
  // Keep-alive: an idle model gives its memory back (Ollama's keep_alive).
  const auto now = Clock::now();
  for (auto* m : models_->all()) {
    if (m->pinned || evictor_->users(*m) > 0) continue;
    if (now - m->last_used < cfg_.models.keep_alive) continue;
    const auto idle = std::chrono::duration_cast<std::chrono::seconds>(now - m->last_used).count();
    if (auto st = evictor_->unload(*m, false, fmt::format("idle for {} s (models.keep_alive)", idle)); !st)
      spdlog::warn("keep-alive: {}", st.error().message);
  }
}

void Daemon::on_model_state(pager::ModelId id, wire::ModelLoadState state) {
  ModelEntry* m = models_->find(id);  // the pager's id is the entry's
  if (m == nullptr) return;  // still being loaded (the listener runs inside Pager::load for tiny files)
  auto it = model_objects_.find(m->id);
  if (state == wire::ModelLoadState::Resident) {
    if (m->content_id) kept_->keep(*m, pager_->region_fd(m->pager_id), pager_->gguf_fd(m->pager_id));
    models_->access_order_done(*m);
    // What the fill read, in order (the tests of the replayed order read it).
    const auto reads = pager_->read_order(m->pager_id);
    spdlog::debug("model '{}': first reads (units in issue order): {}", m->name,
                  fmt::join(reads.begin(), reads.begin() + static_cast<long>(std::min<size_t>(reads.size(), 64)), " "));
    if (!m->content_id && !hasher_->pending(m->id)) {
      // The filled region holds the file's bytes: hash them there.
      if (auto fd = sys::dup_cloexec(pager_->region_fd(m->pager_id)))
        hasher_->submit(m->id, std::move(fd).value(), m->file.size);
      else
        spdlog::warn("model '{}': no content id: its region: {}", m->name, fd.error().message);
    }
    if (auto st = models_->stats(*m))
      spdlog::info("model '{}' fully resident: {} read at {:.0f} MB/s{}", m->name, format_bytes(st->bytes_read),
                   st->read_mb_per_s, st->direct_io ? " (O_DIRECT)" : "");
    if (it != model_objects_.end()) {
      it->second->complete_pending();
      emit("Resident of '" + m->name + "'", [&] { it->second->emitResident(); });
    }
  } else if (state == wire::ModelLoadState::Failed && it != model_objects_.end()) {
    it->second->complete_pending();
  }
}

void Daemon::adopt_kept(std::vector<KeptModel> kept) {
  for (auto& k : kept) {
    auto region = pool_->adopt_model_region(k.name, std::move(k.region));
    if (!region) {
      kept_->drop(k.key, region.error().message);
      continue;
    }
    AdoptRequest req;
    req.load.gguf_fd = k.gguf.get();
    req.load.name = k.name;
    req.load.uid = k.owner_uid;
    req.load.exempt = k.owner_exempt;
    req.region = std::move(region).value();
    req.content_id = k.content_id;
    // At start, before the loop serves: waited for, at most the stall limit.
    auto header = header_reader_->read_now(k.gguf.get(), "kept model '" + k.name + "'");
    if (!header) {
      kept_->drop(k.key, header.error().message);
      continue;
    }
    auto m = models_->adopt(std::move(req), std::move(header).value());
    if (!m) {
      kept_->drop(k.key, m.error().message);
      continue;
    }
    (*m)->kept_as = k.key;
    if ((*m)->pinned && pressure_) pressure_->raise_floor((*m)->region_bytes);
  }
}

void Daemon::on_content_id(uint64_t model_id, Result<gguf::ContentId> id) {
  ModelEntry* m = models_->find(model_id);
  if (m == nullptr) return;
  if (!id) {
    spdlog::warn("model '{}': content id not found: {}", m->name, id.error().message);
    return;
  }
  spdlog::info("model '{}': content id {}", m->name, id->hex());
  models_->content_id_found(*m, *id);
  kept_->keep(*m, pager_->region_fd(m->pager_id), pager_->gguf_fd(m->pager_id));
}

void Daemon::close_cut_arenas() {
  for (auto& path : kv_->close_cut_arenas()) {
    retire_session_object(path);
    spdlog::info("session {} closed: its KV arena was cut by a client too often", path);
  }
}

void Daemon::retire_session_object(const std::string& path) {
  if (auto it = session_objects_.find(path); it != session_objects_.end()) {
    retired_sessions_.push_back(std::move(it->second));
    session_objects_.erase(it);
  }
}

void Daemon::on_model_dropped(const ModelEntry& m, bool forced, const std::string& reason) {
  if (hasher_) hasher_->cancel(m.id);
  if (kept_) kept_->forget(m);
  for (auto& path : kv_->close_model(m.id, "model '" + m.name + "' unloaded: " + reason)) retire_session_object(path);
  if (auto it = model_objects_.find(m.id); it != model_objects_.end()) {
    it->second->fail_pending(fmt::format("model '{}' was unloaded: {}", m.name, reason));
    model_objects_.erase(it);
  }
  emit("Manager.Evicted of '" + m.name + "'", [&] {
    if (manager_)
      manager_->emitEvicted(sdbus::ObjectPath(m.object_path), std::vector<uint32_t>{}, m.region_bytes,
                            forced ? "forced unload: " + reason : reason);
  });
}

void Daemon::preload_models() {
  for (const auto& path : cfg_.models.preload) {
    auto fd = sys::open_file(path, O_RDONLY);
    if (!fd) {
      spdlog::error("models.preload: {}", fd.error().message);
      continue;
    }
    // At start, before the loop serves: waited for, at most the stall limit.
    auto header = header_reader_->read_now(fd->get(), "models.preload: " + path);
    if (!header) {
      spdlog::error("{}", header.error().message);
      continue;
    }
    auto held = std::make_shared<sys::UniqueFd>(std::move(fd).value());
    auto h = std::make_shared<const Header>(std::move(header).value());
    auto run = [this, path, held, h] { return preload(path, held->get(), *h); };
    if (!run())
      drain_waits_->park(DrainWaits::Call{"", "models.preload of " + path, run, [path](const Error& e) {
                                            spdlog::error("models.preload: {}: {}", path, e.message);
                                          }});
  }
}

bool Daemon::preload(const std::string& path, int gguf_fd, const Header& header) {
  LoadRequest req;
  req.gguf_fd = gguf_fd;
  req.uid = 0;
  req.exempt = true;
  auto m = models_->load(req, header);
  if (!m && m.error().code == EINPROGRESS) return false;
  if (!m) {
    spdlog::error("models.preload: {}: {}", path, m.error().message);
    return true;
  }
  add_model_object(**m);
  preloaded_.push_back((*m)->name);
  if ((*m)->pinned && pressure_) pressure_->raise_floor((*m)->region_bytes);
  spdlog::info("models.preload: '{}' from {}", (*m)->name, path);
  return true;
}

ModelStatus Daemon::model_status(const ModelEntry& m) const {
  ModelStatus d;
  d.name = m.name;
  d.object = m.object_path;
  d.size = m.file.size;
  d.owner_uid = static_cast<uint32_t>(m.owner_uid);
  d.sessions = kv_->sessions_on(m.id);
  d.preloaded = std::find(preloaded_.begin(), preloaded_.end(), m.name) != preloaded_.end();
  d.adopted = m.adopted;
  d.content_id = m.content_id ? m.content_id->hex() : std::string();
  d.refcount = m.refcount();
  d.pinned = m.pinned;
  d.layers = static_cast<uint64_t>(m.meta.n_layers);
  d.tensors = static_cast<uint64_t>(m.meta.tensors.size());
  d.stats = models_->stats(m);
  // Who is attached is the pager's record (ModelEntry::clients only says
  // whose keys they are).
  d.clients = d.stats ? d.stats->clients : 0;
  return d;
}

std::vector<ModelStatus> Daemon::model_statuses() const {
  std::vector<ModelStatus> out;
  if (cloud_only()) return out;
  for (auto* m : models_->all()) out.push_back(model_status(*m));
  return out;
}

Status Daemon::read_header(const dbus::Caller& caller, int gguf_fd, const std::string& what, HeaderDone done) {
  if (cloud_only()) return refuse_cloud_only();
  return header_reader_->read({caller.uid, access_.is_admin(caller), caller.name, what}, gguf_fd, std::move(done));
}

Result<std::string> Daemon::load_model(const dbus::Caller& caller, int gguf_fd, const std::string& name,
                                       const Header& header) {
  if (cloud_only()) return refuse_cloud_only();
  LoadRequest req;
  req.gguf_fd = gguf_fd;
  req.name = name;
  req.uid = caller.uid;
  req.exempt = access_.is_admin(caller);
  auto m = models_->load(req, header);
  if (!m) return std::move(m).error();
  if ((*m)->pinned && pressure_) pressure_->raise_floor((*m)->region_bytes);
  add_model_object(**m);
  spdlog::debug("{} (uid {}) loaded {}", caller.name, caller.uid, (*m)->object_path);
  return (*m)->object_path;
}

void Daemon::add_model_object(const ModelEntry& m) {
  // Without a bus it gets its object when the bus is there (attach_bus).
  if (auto* bus = link_ ? link_->connection() : nullptr) add_model_object(m, *bus);
}

void Daemon::add_model_object(const ModelEntry& m, sdbus::IConnection& bus) {
  if (model_objects_.contains(m.id)) return;
  try {
    model_objects_.emplace(m.id, std::make_unique<ModelObject>(
                                     bus, ModelServices{ids_, *models_, access_, *fds_, mode_}, m.id, m.object_path));
  } catch (const sdbus::Error& e) {
    // The model serves its clients anyway; the next connection tries again.
    link_->call_failed("registering the object of model '" + m.name + "' at " + m.object_path, e);
  }
}

Status Daemon::unload_model(const std::string& path, bool force, const std::string& who) {
  if (cloud_only()) return make_error(ENOENT, "no model {}", path);
  auto* m = models_->find_by_path(path);
  if (m == nullptr) m = models_->find_by_name(path);
  if (m == nullptr) return make_error(ENOENT, "no model {} is loaded", path);
  return evictor_->unload(*m, force, (force ? "forced unload by " : "unload by ") + who);
}

Result<ManagerOps::NewSession> Daemon::create_session(const dbus::Caller& caller, const std::string& model_path,
                                                     const std::string& priority) {
  if (cloud_only()) return refuse_cloud_only(": no KV sessions");
  auto prio = policy::parse_priority(priority);
  if (!prio)
    return make_error(EINVAL, "CreateSession: priority '{}' is not one of interactive, system, background", priority);
  auto* m = models_->find_by_path(model_path);
  if (m == nullptr) return make_error(ENOENT, "CreateSession: no model {} is loaded", model_path);
  // KV of a model is for those who may read it (SECURITY.md rule 5): the
  // same proof as Open, given once to LoadModel or Open by this uid.
  const bool admin = access_.is_admin(caller);
  if (!admin && !m->readers.contains(caller.uid))
    return make_error(EACCES,
                      "CreateSession on model '{}': uid {} has not proven it can read the model's file; call "
                      "LoadModel or Model.Open with its own fd of the GGUF first",
                      m->name, caller.uid);
  // An arena closing after too many cuts goes now, so this session gets a
  // fresh one (this is the Manager's call: no closed session is inside its own).
  close_cut_arenas();
  AIRS_TRY(fds_->take(caller, 3));
  auto r = kv_->create(*m, caller, *prio, admin);
  if (!r) {
    fds_->returned(caller, 3);
    return std::move(r).error();
  }
  auto& cs = *r;
  if (auto st = add_session_object(cs.session->path); !st) {
    (void)kv_->close(*cs.session);
    fds_->returned(caller, 3);
    return std::move(st).error();
  }
  return NewSession{cs.session->path, std::move(cs.arena_fd), std::move(cs.notice_fd), std::move(cs.event_fd),
                    std::move(cs.geometry)};
}

void Daemon::make_session_object(const std::string& path, sdbus::IConnection& bus) {
  if (session_objects_.contains(path)) return;
  SessionServices services{ids_, *kv_, *drain_waits_, [this](KvSession& s) { return close_session(s); }};
  session_objects_.emplace(path, std::make_unique<SessionObject>(bus, std::move(services), path));
}

Status Daemon::add_session_object(const std::string& path) {
  auto* bus = link_ ? link_->connection() : nullptr;
  if (bus == nullptr) return make_error(ENOTCONN, "session {}: no bus to put its object on", path);
  try {
    make_session_object(path, *bus);
  } catch (const sdbus::Error& e) {
    link_->call_failed("registering the object of session " + path, e);
    return make_error(EIO, "session {}: registering its bus object: {}", path, e.getMessage());
  }
  return {};
}

Status Daemon::close_session(KvSession& s) {
  const std::string path = s.path;
  AIRS_TRY(kv_->close(s));
  if (auto it = session_objects_.find(path); it != session_objects_.end()) {
    retired_sessions_.push_back(std::move(it->second));
    session_objects_.erase(it);
  }
  return {};
}

std::vector<SessionStatus> Daemon::list_sessions() const {
  return cloud_only() ? std::vector<SessionStatus>{} : kv_->sessions();
}

template <class F>
void Daemon::emit(const std::string& what, F&& send) {
  // No bus: nobody listens (the loss was said once); the clients' notice
  // pages and wake sockets still tell them what they need.
  if (link_ == nullptr || link_->connection() == nullptr) return;
  try {
    send();
  } catch (const sdbus::Error& e) {
    // A connection going away fails here first; prepare() and dispatch()
    // notice it and handle the loss.
    link_->call_failed("emitting " + what, e);
  }
}

void Daemon::attach_bus(sdbus::IConnection& bus) {
  ids_.set_bus(&bus);
  manager_ = std::make_unique<ManagerObject>(
      bus, ManagerServices{*this, ids_, access_, pressure_.get(), drain_waits_.get(), pool_.get(), profile_, mode_, page_size_});
  if (!cloud_only()) {
    for (auto* m : models_->all()) add_model_object(*m, bus);
    // Sessions kept across a lost bus: their objects again, at the same
    // paths (only their owners, which no new connection is, may use them).
    for (const auto& s : kv_->sessions()) make_session_object(s.path, bus);
  }
  bus.addMatch("type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',"
               "member='NameOwnerChanged'",
               [this](sdbus::Message& m) { on_name_owner_changed(m); }, sdbus::floating_slot);
}

void Daemon::detach_bus(bool lost) {
  // Replies still held refer to the connection: each caller gets its error
  // now (on a dead bus nobody hears it, and the sending fails quietly).
  const std::string why = lost ? "airs-memd lost its bus connection" : "airs-memd is leaving the bus";
  // Null not only when cloud-only: the destructor drops both before the
  // link, whose end detaches once more.
  if (drain_waits_) drain_waits_->refuse_bus_calls(why);
  if (header_reader_) header_reader_->refuse_bus_calls(why);
  for (auto& [id, obj] : model_objects_) obj->fail_pending(why);
  if (lost) keep_for_lost_callers();
  session_objects_.clear();
  retired_sessions_.clear();
  model_objects_.clear();
  manager_.reset();
  ids_.set_bus(nullptr);
}

void Daemon::keep_for_lost_callers() {
  const uint64_t loss = link_->status().losses;
  uint32_t kept = 0;
  for (const auto& name : ids_.names()) {
    // Keys of an earlier loss are tracked already.
    if (name.empty() || name[0] != ':') continue;
    const dbus::Caller* c = ids_.find(name);
    const pid_t pid = c != nullptr ? c->pid : 0;
    const std::string key = LostCallers::key_for(name, pid, loss);
    bool holds = false;
    if (!cloud_only()) {
      if (kv_->rename_caller(name, key)) holds = true;
      if (models_->rename_caller(name, key)) holds = true;
    }
    if (fds_->rename_caller(name, key)) holds = true;
    ids_.rename(name, key);
    if (!holds) {
      caller_gone(key, "held nothing when its connection died with the bus");
      continue;
    }
    if (auto st = lost_callers_->track(key, pid); !st) {
      caller_gone(key, "died with the bus, and so did its process (" + st.error().message + ")");
      continue;
    }
    ++kept;
  }
  if (kept > 0)
    spdlog::info("{} client connection(s) of the lost bus keep their KV sessions, model references and mappings "
                 "until their processes exit",
                 kept);
}

void Daemon::on_name_owner_changed(sdbus::Message& sig) {
  // A match handler: sdbus-c++ lets its exceptions through sd-bus, so none
  // may leave here.
  try {
    std::string name, old_owner, new_owner;
    sig >> name >> old_owner >> new_owner;
    if (!new_owner.empty() || name.empty() || name[0] != ':') return;
    // A client left the bus (exit or crash): everything it held goes.
    caller_gone(name, "left the bus");
  } catch (const std::exception& e) {
    spdlog::warn("bus: NameOwnerChanged: {}", e.what());
  }
}

void Daemon::caller_gone(const std::string& name, const std::string& why) {
  if (!cloud_only()) {
    for (auto& path : kv_->drop_caller(name)) {
      session_objects_.erase(path);
      spdlog::info("session {} released: its client {} {}", path, name, why);
    }
    models_->drop_caller(name);
    drain_waits_->caller_left(name);
    header_reader_->caller_left(name);
  }
  for (auto& [id, obj] : model_objects_) obj->forget_caller(name);
  fds_->caller_left(name);
  ids_.forget(name);
}

void Daemon::on_signal() {
  while (int s = signals_->read_signal()) {
    if (s == SIGTERM || s == SIGINT) {
      spdlog::info("{}: shutting down", strsignal(s));
      loop_->stop();
    } else if (s == SIGHUP) {
      spdlog::info("SIGHUP: looking up daemon.admin_group and daemon.trusted_group again (on a thread of its own); "
                   "the rest of the configuration is read at start: restart the service to apply changes");
      (void)access_.resolve_in_background(*loop_);
    }
  }
}

int Daemon::run() {
  while (!loop_->stopping()) {
    const int timeout_ms = link_->prepare();
    auto r = loop_->run_once(std::chrono::milliseconds(timeout_ms));
    if (!r) {
      spdlog::critical("event loop: {}", r.error().message);
      return 1;
    }
    link_->dispatch();
  }
  if (exit_code_ != 0) return exit_code_;
  sys::notify("STOPPING=1");
  if (!cloud_only()) (void)kv_->spill_all(std::chrono::steady_clock::now() + cfg_.kv.spill_stop_timeout);
  link_->stop();
  spdlog::info("stopped");
  return 0;
}

StatusSnapshot Daemon::status() {
  StatusSnapshot s;
  s.version = AIRS_VERSION;
  s.profile = profile_;
  s.uptime_s = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_).count());
  s.loop_wakeups = loop_ ? loop_->wakeups() : 0;
  s.page_size = page_size_;
  s.mode = mode_;
  s.mode_reason = mode_reason_;
  s.advice = advice_;
  s.read_error = read_error_;
  s.capabilities = capabilities_;
  s.pool.target_bytes = pool_target_;
  // What clients added to their arenas is given back before it is counted.
  if (!cloud_only()) {
    kv_->restore_arenas();
    LocalPoolStatus& p = s.pool.local.emplace();
    p.backend = pool_->backend().name();
    p.numa = numa_;
    p.counts = pool_->counts();
    p.raised_pages = pool_->raised_pages();
    for (auto* m : models_->all())
      if (auto st = models_->stats(*m); st && st->pin_failed) p.unpinned.push_back(m->name);
    if (auto kv = pool_->kernel_view()) p.kernel = std::move(kv).value();
  }
  if (auto m = sys::read_meminfo()) s.mem_available = m->count("MemAvailable") ? m->at("MemAvailable") : 0;
  s.models = model_statuses();
  s.keep_alive_s = static_cast<uint64_t>(cfg_.models.keep_alive.count());
  if (!cloud_only()) {
    s.kv = kv_->status();
    s.pressure = pressure_->status();
  }
  if (link_) s.bus = link_->status();
  s.bus.lost_owners = lost_callers_ ? static_cast<uint32_t>(lost_callers_->size()) : 0;
  return s;
}

}  // namespace airs::daemon
