// SPDX-License-Identifier: Apache-2.0
#include "daemon/bus_manager.hpp"

#include "daemon/bus_dicts.hpp"
#include "daemon/bus_replies.hpp"
#include "daemon/access.hpp"
#include "daemon/pressure_loop.hpp"
#include "dbus/names.hpp"
#include "util/text.hpp"

namespace airs::daemon {

ManagerObject::ManagerObject(sdbus::IConnection& bus, ManagerServices services)
    : AdaptorInterfaces(bus, dbus::kManagerPath), svc_(std::move(services)) {
  registerAdaptor();
}

ManagerObject::~ManagerObject() { unregisterAdaptor(); }

const dbus::Caller& ManagerObject::caller() { return svc_.ids.of(*getObject().getCurrentlyProcessedMessage()); }

dbus::Dict ManagerObject::GetStatus() {
  return at_bus_edge("GetStatus", [&] {
    (void)caller();
    return to_dict(svc_.ops.status());
  });
}

void ManagerObject::LoadModel(sdbus::Result<sdbus::ObjectPath>&& result, sdbus::UnixFd gguf_fd, dbus::Dict options) {
  // Held from here: the reply is sent once the header is read, off the loop.
  auto held = std::make_shared<sdbus::Result<sdbus::ObjectPath>>(std::move(result));
  try {
    const dbus::Caller c = caller();
    dbus::check_options(options, {{"name", "s"}}, "LoadModel");
    const std::string name = dbus::get<std::string>(options, "name").value_or("");
    if (options.contains("name") && !is_valid_name(name))
      dbus::throw_error(dbus::kErrInvalidArgument,
                        fmt::format("LoadModel: option 'name' must be 1-{} printable characters without control "
                                    "characters, quotes or backslashes (got '{}')",
                                    kMaxNameBytes, printable_name(name)));
    // The caller's fd, kept while the call may wait (each run uses it).
    auto fd = std::make_shared<sys::UniqueFd>(take(gguf_fd));
    std::string what = fmt::format("LoadModel by uid {} ({})", c.uid, c.name);
    // Captures nothing of this object: it may be gone (the bus lost) when
    // the header is read; the Daemon and its DrainWaits outlive the read.
    auto loaded = [&ops = svc_.ops, drains = svc_.drains, c, fd, name, held,
                   what](Result<std::shared_ptr<const Header>> header) mutable {
      if (!header) return answer_error(*held, header.error(), what);
      answer_when_room(
          drains, std::move(*held), c.name, what,
          [&ops, c, fd, name, h = std::move(header).value()] { return ops.load_model(c, fd->get(), name, *h); },
          [](std::string path) { return std::tuple{sdbus::ObjectPath(std::move(path))}; });
    };
    if (auto st = svc_.ops.read_header(c, fd->get(), "LoadModel", std::move(loaded)); !st)
      answer_error(*held, st.error(), what);
  } catch (const sdbus::Error& e) {
    held->returnError(e);
  } catch (const std::exception& e) {
    held->returnError(edge_error("LoadModel", e));
  }
}

std::vector<dbus::Dict> ManagerObject::ListModels() {
  return at_bus_edge("ListModels", [&] {
    (void)caller();
    std::vector<dbus::Dict> out;
    for (const auto& m : svc_.ops.model_statuses()) out.push_back(to_dict(m));
    return out;
  });
}

void ManagerObject::Unload(const sdbus::ObjectPath& model, const bool& force) {
  at_bus_edge("Unload", [&] {
    const auto& c = caller();
    if (auto a = svc_.access.require_admin(c, "Unload"); !a) dbus::throw_error(a.error());
    auto r = svc_.ops.unload_model(model, force, fmt::format("uid {} ({})", c.uid, c.name));
    if (!r) dbus::throw_error(r.error());
  });
}

dbus::Dict ManagerObject::Evict(const dbus::Dict& what, const bool& dry_run) {
  return at_bus_edge("Evict", [&] {
    const auto& c = caller();
    if (auto a = svc_.access.require_admin(c, "Evict"); !a) dbus::throw_error(a.error());
    auto* p = svc_.pressure;
    if (p == nullptr)
      dbus::throw_error(dbus::kErrUnsupported,
                        fmt::format("Evict: no local model pool on this device (profile {}: cloud inference only): "
                                    "nothing to evict",
                                    svc_.profile));
    auto w = evict_what_from_dict(what);
    if (!w) dbus::throw_error(w.error());
    auto r = p->admin_evict(*w, dry_run, fmt::format("uid {} ({})", c.uid, c.name));
    if (!r) dbus::throw_error(r.error());
    return to_dict(*r);
  });
}

std::tuple<sdbus::ObjectPath, sdbus::UnixFd, sdbus::UnixFd, sdbus::UnixFd, dbus::Dict> ManagerObject::CreateSession(
    const sdbus::ObjectPath& model, const std::string& priority, const dbus::Dict& options) {
  return at_bus_edge("CreateSession", [&] {
    const auto& c = caller();
    dbus::check_options(options, {}, "CreateSession");
    auto s = svc_.ops.create_session(c, model, priority);
    if (!s) dbus::throw_error(s.error());
    return std::tuple{sdbus::ObjectPath(s->path), sdbus::UnixFd(s->arena.release(), sdbus::adopt_fd),
                      sdbus::UnixFd(s->notice.release(), sdbus::adopt_fd),
                      sdbus::UnixFd(s->event.release(), sdbus::adopt_fd), to_dict(s->geometry)};
  });
}

std::vector<dbus::Dict> ManagerObject::ListSessions() {
  return at_bus_edge("ListSessions", [&] {
    (void)caller();
    return to_dicts(svc_.ops.list_sessions());
  });
}

// Properties: the same edge (their getters run inside sd-bus's dispatch too).
std::string ManagerObject::Version() { return at_bus_edge("Version", [] { return std::string(AIRS_VERSION); }); }
std::string ManagerObject::Profile() { return at_bus_edge("Profile", [&] { return svc_.profile; }); }
std::string ManagerObject::Mode() { return at_bus_edge("Mode", [&] { return svc_.mode; }); }
uint64_t ManagerObject::PoolBytes() { return svc_.pool ? svc_.pool->counts().total_bytes() : 0; }
uint64_t ManagerObject::PoolFreeBytes() { return svc_.pool ? svc_.pool->counts().free_bytes() : 0; }
uint64_t ManagerObject::PageSize() { return svc_.page_size; }
std::string ManagerObject::PressureLevel() {
  return at_bus_edge("PressureLevel",
                     [&] { return svc_.pressure ? std::string(policy::to_string(svc_.pressure->level())) : "none"; });
}

}  // namespace airs::daemon
