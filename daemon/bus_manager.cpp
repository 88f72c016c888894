#include "daemon/bus_manager.hpp"

#include "daemon/bus_dicts.hpp"
#include "daemon/daemon.hpp"
#include "daemon/pressure_loop.hpp"
#include "dbus/names.hpp"
#include "util/text.hpp"

namespace airs::daemon {

ManagerObject::ManagerObject(sdbus::IConnection& bus, Daemon& daemon)
    : AdaptorInterfaces(bus, dbus::kManagerPath), d_(daemon) {
  registerAdaptor();
}

ManagerObject::~ManagerObject() { unregisterAdaptor(); }

dbus::Dict ManagerObject::GetStatus() {
  (void)d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  return to_dict(d_.status());
}

sdbus::ObjectPath ManagerObject::LoadModel(const sdbus::UnixFd& gguf_fd, const dbus::Dict& options) {
  const auto& c = d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  dbus::check_options(options, {{"name", "s"}}, "LoadModel");
  const std::string name = dbus::get<std::string>(options, "name").value_or("");
  if (options.contains("name") && !is_valid_name(name))
    dbus::throw_error(dbus::kErrInvalidArgument,
                      fmt::format("LoadModel: option 'name' must be 1-{} printable characters without control "
                                  "characters, quotes or backslashes (got '{}')",
                                  kMaxNameBytes, printable_name(name)));
  auto r = d_.load_model(c, gguf_fd.get(), name);
  if (!r) dbus::throw_error(r.error());
  return sdbus::ObjectPath(*r);
}

std::vector<dbus::Dict> ManagerObject::ListModels() {
  (void)d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  std::vector<dbus::Dict> out;
  for (const auto& m : d_.model_statuses()) out.push_back(to_dict(m));
  return out;
}

void ManagerObject::Unload(const sdbus::ObjectPath& model, const bool& force) {
  const auto& c = d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  d_.require_admin(c, "Unload");
  auto r = d_.unload_model(model, force, fmt::format("uid {} ({})", c.uid, c.name));
  if (!r) dbus::throw_error(r.error());
}

dbus::Dict ManagerObject::Evict(const dbus::Dict& what, const bool& dry_run) {
  const auto& c = d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  d_.require_admin(c, "Evict");
  auto* p = d_.pressure();
  if (p == nullptr) dbus::throw_error(dbus::kErrUnsupported, "Evict: no local pool on this device: nothing to evict");
  auto w = evict_what_from_dict(what);
  if (!w) dbus::throw_error(w.error());
  auto r = p->admin_evict(*w, dry_run, fmt::format("uid {} ({})", c.uid, c.name));
  if (!r) dbus::throw_error(r.error());
  return to_dict(*r);
}

std::tuple<sdbus::ObjectPath, sdbus::UnixFd, sdbus::UnixFd, sdbus::UnixFd, dbus::Dict> ManagerObject::CreateSession(
    const sdbus::ObjectPath& model, const std::string& priority, const dbus::Dict& options) {
  const auto& c = d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  dbus::check_options(options, {}, "CreateSession");
  auto [path, arena, notice, event, geo] = d_.create_session(c, model, priority);
  return {sdbus::ObjectPath(path), sdbus::UnixFd(arena.release(), sdbus::adopt_fd),
          sdbus::UnixFd(notice.release(), sdbus::adopt_fd), sdbus::UnixFd(event.release(), sdbus::adopt_fd), to_dict(geo)};
}

std::vector<dbus::Dict> ManagerObject::ListSessions() {
  (void)d_.identities().of(*getObject().getCurrentlyProcessedMessage());
  return to_dicts(d_.list_sessions());
}

std::string ManagerObject::Version() { return AIRS_VERSION; }
std::string ManagerObject::Profile() { return d_.profile(); }
std::string ManagerObject::Mode() { return d_.mode(); }
uint64_t ManagerObject::PoolBytes() { return d_.pool_bytes(); }
uint64_t ManagerObject::PoolFreeBytes() { return d_.pool_free_bytes(); }
uint64_t ManagerObject::PageSize() { return d_.page_size(); }
std::string ManagerObject::PressureLevel() {
  return d_.pressure() ? policy::to_string(d_.pressure()->level()) : "none";
}

}  // namespace airs::daemon
