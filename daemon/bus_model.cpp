// SPDX-License-Identifier: Apache-2.0
#include "daemon/bus_model.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "daemon/bus_dicts.hpp"
#include "daemon/bus_replies.hpp"
#include "daemon/access.hpp"
#include "dbus/names.hpp"
#include "sys/files.hpp"
#include "sys/uffd.hpp"

namespace airs::daemon {
namespace {
constexpr std::ptrdiff_t kMaxPendingPerCaller = 4;
constexpr size_t kMaxPending = 256;
}  // namespace

ModelObject::ModelObject(sdbus::IConnection& bus, ModelServices services, uint64_t model_id, const std::string& path)
    : AdaptorInterfaces(bus, path), svc_(std::move(services)), id_(model_id) {
  registerAdaptor();
}

ModelObject::~ModelObject() {
  fail_pending("the daemon is shutting down");
  unregisterAdaptor();
}

ModelEntry& ModelObject::entry() {
  if (auto* m = svc_.models.find(id_)) return *m;
  dbus::throw_error(dbus::kErrNotFound, "model " + getObject().getObjectPath() + " is no longer loaded");
}

const dbus::Caller& ModelObject::caller() { return svc_.ids.of(*getObject().getCurrentlyProcessedMessage()); }

Result<std::tuple<sdbus::UnixFd, uint64_t, sdbus::UnixFd, dbus::Dict>> ModelObject::open_for(const dbus::Caller& c,
                                                                                           int proof, bool lazy,
                                                                                           bool nowait) {
  auto* m = svc_.models.find(id_);
  if (m == nullptr) return make_error(ENOENT, "model {} is no longer loaded", getObject().getObjectPath());
  AIRS_TRY(svc_.fds.take(c, 2));
  auto r = svc_.models.open(*m, c, proof, lazy, nowait);
  if (!r) {
    svc_.fds.returned(c, 2);  // nothing was handed out
    return std::move(r).error();
  }
  OpenInfo info{svc_.mode, r->resident, r->unit_size, m->file.size, m->name, static_cast<uint64_t>(m->meta.n_layers),
                lazy, r->streamed, r->expert_hints};
  // sdbus::UnixFd(fd, adopt_fd) takes ownership and closes after sending.
  return std::tuple{sdbus::UnixFd(r->region.release(), sdbus::adopt_fd), r->size,
                    sdbus::UnixFd(r->status.release(), sdbus::adopt_fd), to_dict(info)};
}

void ModelObject::Open(OpenReply&& result, sdbus::UnixFd gguf_fd, dbus::Dict options) {
  try {
    const auto& c = caller();
    dbus::check_options(options, {{"wait", "b"}}, "Open");
    const bool wait = dbus::get<bool>(options, "wait").value_or(true);
    (void)entry();
    auto r = open_for(c, gguf_fd.get(), false, !wait);
    if (r) return result.returnResults(std::get<0>(*r), std::get<1>(*r), std::get<2>(*r), std::get<3>(*r));
    if (r.error().code != EAGAIN) return result.returnError(bus_error(r.error()));
    // Not resident yet: answer once it is (the proof fd is checked again
    // then). Each waiting Open holds a dup of its proof fd: bounded per
    // connection and per model, so waiting cannot exhaust the daemon's fds.
    const auto mine = std::count_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.caller == c.name; });
    if (mine >= kMaxPendingPerCaller || pending_.size() >= kMaxPending)
      return result.returnError(sdbus::Error(
          dbus::kErrQuotaExceeded, fmt::format("Open on model '{}': {} Opens of this client already wait for it to be "
                                               "resident (at most {} per client, {} in all)",
                                               entry().name, mine, kMaxPendingPerCaller, kMaxPending)));
    spdlog::debug("Open on model '{}' by {} (uid {}) waits until it is resident", entry().name, c.name, c.uid);
    pending_.push_back(Pending{std::move(result), c.name, take(gguf_fd)});
  } catch (const sdbus::Error& e) {
    result.returnError(e);
  } catch (const std::exception& e) {
    result.returnError(edge_error("Open", e));
  }
}

void ModelObject::complete_pending() {
  auto waiting = std::move(pending_);
  pending_.clear();
  for (auto& p : waiting) {
    // Runs on the loop, outside any handler: neither the bus refusing a
    // reply (a connection going away) nor building it may leave here. What
    // the caller took goes when it leaves the bus, as for any caller gone
    // before its reply.
    try {
      const dbus::Caller* c = svc_.ids.find(p.caller);
      if (c == nullptr) continue;  // left the bus meanwhile
      auto r = open_for(*c, p.proof.get(), false, false);
      if (!r && r.error().code == EAGAIN) {
        pending_.push_back(std::move(p));
        continue;
      }
      if (r)
        p.reply.returnResults(std::get<0>(*r), std::get<1>(*r), std::get<2>(*r), std::get<3>(*r));
      else
        p.reply.returnError(bus_error(r.error()));
    } catch (const std::exception& e) {
      spdlog::warn("answering a waiting Open on model {} for {}: {}", getObject().getObjectPath(), p.caller, e.what());
    }
  }
}

void ModelObject::forget_caller(const std::string& caller) {
  std::erase_if(pending_, [&](const Pending& p) { return p.caller == caller; });
}

void ModelObject::fail_pending(const std::string& why) {
  auto waiting = std::move(pending_);
  pending_.clear();
  for (auto& p : waiting) {
    try {
      p.reply.returnError(sdbus::Error(dbus::kErrNotFound, why));
    } catch (const sdbus::Error& e) {
      spdlog::debug("answering a waiting Open: {}", e.getMessage());
    }
  }
}

std::tuple<sdbus::UnixFd, uint64_t, sdbus::UnixFd, dbus::Dict> ModelObject::OpenLazy(const sdbus::UnixFd& gguf_fd,
                                                                                    const sdbus::UnixFd& uffd,
                                                                                    const dbus::Dict& options) {
  return at_bus_edge("OpenLazy", [&] {
    const auto& c = caller();
    dbus::check_options(options, {}, "OpenLazy");
    auto& m = entry();
    if (!svc_.access.is_trusted(c))
      dbus::throw_error(dbus::kErrAccessDenied,
                        fmt::format("OpenLazy on model '{}': uid {} is not trusted with a writable region (root, "
                                    "daemon.trusted_group or daemon.admin_group only); use Open, which waits until "
                                    "the model is resident",
                                    m.name, c.uid));
    if (!sys::is_userfaultfd(uffd.get()))
      dbus::throw_error(dbus::kErrInvalidArgument,
                        "OpenLazy: the uffd argument is not a userfaultfd; a client that cannot create one uses Open");
    auto r = open_for(c, gguf_fd.get(), true, false);
    if (!r) dbus::throw_error(r.error());
    return std::move(*r);
  });
}

void ModelObject::Attach(const sdbus::UnixFd& notify_fd, const sdbus::UnixFd& uffd, const uint64_t& addr,
                         const uint64_t& length) {
  at_bus_edge("Attach", [&] {
    const auto& c = caller();
    auto& m = entry();
    if (!svc_.access.is_trusted(c))
      dbus::throw_error(dbus::kErrAccessDenied,
                        fmt::format("Attach on model '{}': uid {} is not trusted", m.name, c.uid));
    auto s = svc_.models.attach(m, c, take(notify_fd), take(uffd), addr, length);
    if (!s) dbus::throw_error(s.error());
  });
}

void ModelObject::Follow(const sdbus::UnixFd& requests, const sdbus::UnixFd& opened) {
  at_bus_edge("Follow", [&] {
    const auto& c = caller();
    auto s = svc_.models.follow(entry(), c, take(requests), take(opened));
    if (!s) dbus::throw_error(s.error());
  });
}

void ModelObject::Hints(const sdbus::UnixFd& socket) {
  at_bus_edge("Hints", [&] {
    const auto& c = caller();
    auto s = svc_.models.hints(entry(), c, take(socket));
    if (!s) dbus::throw_error(s.error());
  });
}

std::map<std::string, sdbus::Variant> ModelObject::Residency() {
  return at_bus_edge("Residency", [&] {
    const auto& c = caller();
    auto& m = entry();
    if (!svc_.access.is_admin(c) && !m.readers.contains(c.uid))
      dbus::throw_error(dbus::kErrAccessDenied,
                        fmt::format("Residency of model '{}': uid {} has not proven it can read the model's file "
                                    "(LoadModel or Open with its own fd of it first)",
                                    m.name, c.uid));
    auto r = svc_.models.residency(m);
    if (!r) dbus::throw_error(r.error());
    return to_dict(*r);
  });
}

void ModelObject::Release() {
  at_bus_edge("Release", [&] {
    const auto& c = caller();
    auto s = svc_.models.release(entry(), c.name);
    if (!s) dbus::throw_error(s.error());
  });
}

// Properties: the same edge (their getters run inside sd-bus's dispatch too).
std::string ModelObject::Name() { return at_bus_edge("Name", [&] { return entry().name; }); }
uint64_t ModelObject::Size() { return at_bus_edge("Size", [&] { return entry().file.size; }); }
uint64_t ModelObject::ResidentBytes() {
  return at_bus_edge("ResidentBytes", [&] {
    auto s = svc_.models.stats(entry());
    return s ? s->resident_bytes : uint64_t{0};
  });
}
std::string ModelObject::State() {
  return at_bus_edge("State", [&] { return model_state_name(svc_.models.stats(entry())); });
}
uint32_t ModelObject::Refcount() { return at_bus_edge("Refcount", [&] { return entry().refcount(); }); }
bool ModelObject::Pinned() { return at_bus_edge("Pinned", [&] { return entry().pinned; }); }

}  // namespace airs::daemon
