#include "daemon/daemon.hpp"

#include <poll.h>
#include <sys/epoll.h>

#include <csignal>

#include <spdlog/spdlog.h>

#include "daemon/bus_manager.hpp"
#include "dbus/names.hpp"
#include "sys/notify.hpp"
#include "sys/procfs.hpp"
#include "util/units.hpp"

namespace airs::daemon {

Daemon::Daemon(Options options) : cfg_(std::move(options.config)), bus_address_(std::move(options.bus_override)) {
  if (bus_address_.empty()) bus_address_ = cfg_.daemon.bus;
  started_ = std::chrono::steady_clock::now();
}

Daemon::~Daemon() {
  // Bus objects first: they refer to the state below.
  manager_.reset();
  if (bus_) {
    if (loop_ && bus_fd_ >= 0) loop_->remove(bus_fd_);
    bus_.reset();
  }
}

Result<std::unique_ptr<Daemon>> Daemon::create(Options options) {
  std::unique_ptr<Daemon> d(new Daemon(std::move(options)));
  AIRS_TRY(d->init());
  return d;
}

Status Daemon::init() {
  auto meminfo = sys::read_meminfo();
  if (!meminfo) return std::move(meminfo).error();
  const uint64_t mem_total = meminfo->count("MemTotal") ? meminfo->at("MemTotal") : 0;

  auto prof = config::profile_for_memory(mem_total);
  if (cfg_.pool.profile != "auto" && cfg_.pool.profile != "custom") prof = *config::profile_by_name(cfg_.pool.profile);
  profile_ = cfg_.pool.profile == "custom" ? "custom" : prof.name;
  pool_target_ = cfg_.pool.size.value_or(prof.pool_bytes);
  page_size_ = cfg_.pool.page_size;
  if (page_size_ == 0 && meminfo->count("Hugepagesize")) page_size_ = meminfo->at("Hugepagesize");
  spdlog::info("profile {} (MemTotal {}): pool {}, huge page {}", profile_, format_bytes(mem_total),
               format_bytes(pool_target_), format_bytes(page_size_));

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

  AIRS_TRY(connect_bus());
  return {};
}

Status Daemon::connect_bus() {
  try {
    if (bus_address_ == "system") {
      bus_ = sdbus::createSystemBusConnection();
    } else if (bus_address_ == "session") {
      bus_ = sdbus::createSessionBusConnection();
    } else {
      bus_ = sdbus::createSessionBusConnectionWithAddress(bus_address_);
    }
    manager_ = std::make_unique<ManagerObject>(*bus_, *this);
    bus_->addMatch("type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',"
                   "member='NameOwnerChanged'",
                   [this](sdbus::Message& m) { on_name_owner_changed(m); },
                   sdbus::floating_slot);
    bus_->requestName(dbus::kBusName);
  } catch (const sdbus::Error& e) {
    return make_error(EIO,
                      "cannot serve {} on the {} bus: {} ({}). Is a D-Bus daemon running, and does its policy let "
                      "this user own the name (install systemd/org.aios.Airs1.conf)?",
                      dbus::kBusName, bus_address_, e.getMessage(), e.getName());
  }
  auto pd = bus_->getEventLoopPollData();
  bus_fd_ = pd.fd;
  AIRS_TRY(loop_->add(bus_fd_, static_cast<uint32_t>(pd.events), [this](uint32_t) { pump_bus(); }));
  spdlog::info("serving {} on {} as {}", dbus::kBusName, bus_address_, bus_->getUniqueName());
  return {};
}

void Daemon::pump_bus() {
  // Drain everything sd-bus has queued; handlers run here, on the loop thread.
  try {
    while (bus_->processPendingRequest()) {
    }
  } catch (const std::exception& e) {
    spdlog::error("bus: {}", e.what());
  }
}

void Daemon::on_name_owner_changed(sdbus::Message& sig) {
  std::string name, old_owner, new_owner;
  sig >> name >> old_owner >> new_owner;
  if (!new_owner.empty() || name.empty() || name[0] != ':') return;
  // A client left the bus (exit or crash): everything it held goes.
  ids_.forget(name);
}

void Daemon::on_signal() {
  while (int s = signals_->read_signal()) {
    if (s == SIGTERM || s == SIGINT) {
      spdlog::info("{}: shutting down", strsignal(s));
      loop_->stop();
    } else if (s == SIGHUP) {
      spdlog::info("SIGHUP: configuration is read at start; restart the service to apply changes");
    }
  }
}

int Daemon::run() {
  sys::notify("READY=1\nSTATUS=serving " + std::string(dbus::kBusName));
  while (!loop_->stopping()) {
    // sd-bus may want POLLOUT or have a timeout pending; refresh before waiting.
    auto pd = bus_->getEventLoopPollData();
    (void)loop_->modify(bus_fd_, static_cast<uint32_t>(pd.events));
    int timeout_ms = pd.getPollTimeout();
    auto r = loop_->run_once(std::chrono::milliseconds(timeout_ms));
    if (!r) {
      spdlog::critical("event loop: {}", r.error().message);
      return 1;
    }
    pump_bus();
  }
  sys::notify("STOPPING=1");
  try {
    bus_->releaseName(dbus::kBusName);
  } catch (const sdbus::Error&) {
    // The bus may be gone already; nothing to release then.
  }
  spdlog::info("stopped");
  return 0;
}

dbus::Dict Daemon::status() {
  dbus::Dict s;
  s["version"] = sdbus::Variant(std::string(AIRS_VERSION));
  s["profile"] = sdbus::Variant(profile_);
  s["uptime_s"] = sdbus::Variant(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_).count()));
  s["page_size"] = sdbus::Variant(page_size_);
  dbus::Dict pool;
  pool["target_bytes"] = sdbus::Variant(pool_target_);
  if (auto m = sys::read_meminfo()) {
    pool["kernel_hugepages_total"] = sdbus::Variant(m->count("HugePages_Total") ? m->at("HugePages_Total") : 0);
    pool["kernel_hugepages_free"] = sdbus::Variant(m->count("HugePages_Free") ? m->at("HugePages_Free") : 0);
    s["mem_available"] = sdbus::Variant(m->count("MemAvailable") ? m->at("MemAvailable") : 0);
  }
  s["pool"] = sdbus::Variant(pool);
  return s;
}

}  // namespace airs::daemon
