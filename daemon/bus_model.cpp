#include "daemon/bus_model.hpp"

#include <fcntl.h>

#include "daemon/daemon.hpp"
#include "dbus/names.hpp"

namespace airs::daemon {
namespace {
// Takes ownership of a dup of a received fd (sdbus::UnixFd closes its own).
sys::UniqueFd take(const sdbus::UnixFd& fd) { return sys::UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3)); }
}  // namespace

ModelObject::ModelObject(sdbus::IConnection& bus, Daemon& daemon, uint64_t model_id, const std::string& path)
    : AdaptorInterfaces(bus, path), d_(daemon), id_(model_id) {
  registerAdaptor();
}

ModelObject::~ModelObject() { unregisterAdaptor(); }

ModelEntry& ModelObject::entry() {
  for (auto* m : d_.models().all())
    if (m->id == id_) return *m;
  dbus::throw_error(dbus::kErrNotFound, "model " + getObject().getObjectPath() + " is no longer loaded");
}

const dbus::Caller& ModelObject::caller() { return d_.identities().of(*getObject().getCurrentlyProcessedMessage()); }

std::tuple<sdbus::UnixFd, uint64_t, sdbus::UnixFd, dbus::Dict> ModelObject::Open(const dbus::Dict& options) {
  const auto& c = caller();
  d_.check_fd_quota(c, 2);
  auto& m = entry();
  const bool lazy = dbus::get<bool>(options, "lazy").value_or(true);
  auto r = d_.models().open(m, c.name, lazy);
  if (!r) {
    d_.fds_returned(c, 2);  // nothing was handed out
    dbus::throw_error(r.error());
  }
  dbus::Dict info;
  info["mode"] = sdbus::Variant(d_.mode());
  info["resident"] = sdbus::Variant(r->resident);
  info["unit_size"] = sdbus::Variant(r->unit_size);
  info["file_size"] = sdbus::Variant(m.file_size);
  info["name"] = sdbus::Variant(m.name);
  info["layers"] = sdbus::Variant(static_cast<uint64_t>(m.meta.n_layers));
  // sdbus::UnixFd(fd, adopt_fd) takes ownership and closes after sending.
  return {sdbus::UnixFd(r->region.release(), sdbus::adopt_fd), r->size, sdbus::UnixFd(r->status.release(), sdbus::adopt_fd),
          std::move(info)};
}

void ModelObject::Attach(const sdbus::UnixFd& notify_fd, const sdbus::UnixFd& uffd, const uint64_t& addr,
                         const uint64_t& length) {
  const auto& c = caller();
  auto& m = entry();
  auto s = d_.models().attach(m, c, take(notify_fd), take(uffd), addr, length);
  if (!s) dbus::throw_error(s.error());
}

void ModelObject::Watch(const sdbus::UnixFd&) {
  dbus::throw_error(dbus::kErrUnsupported,
                    "Watch is for the cooperative mode; this daemon runs in mode '" + d_.mode() + "': use Attach");
}

void ModelObject::Detach(const uint64_t&) {
  dbus::throw_error(dbus::kErrUnsupported, "Detach: release the model instead (Release drops its mappings)");
}

void ModelObject::Release() {
  const auto& c = caller();
  auto s = d_.models().release(entry(), c.name);
  if (!s) dbus::throw_error(s.error());
  d_.fds_returned(c, 2);
}

std::string ModelObject::Name() { return entry().name; }
uint64_t ModelObject::Size() { return entry().file_size; }
uint64_t ModelObject::ResidentBytes() {
  auto s = d_.models().stats(entry());
  return s ? s->resident_bytes : 0;
}
std::string ModelObject::State() { return d_.model_state(entry()); }
uint32_t ModelObject::Refcount() { return entry().refcount(); }
bool ModelObject::Pinned() { return entry().pinned; }

}  // namespace airs::daemon
