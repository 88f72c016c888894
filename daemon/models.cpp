#include "daemon/models.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "dbus/names.hpp"
#include "gguf/file_io.hpp"
#include "sys/proc_handles.hpp"
#include "util/units.hpp"

namespace airs::daemon {
namespace {

Result<sys::UniqueFd> dup_fd(int fd) {
  sys::UniqueFd r(::fcntl(fd, F_DUPFD_CLOEXEC, 3));
  if (!r) return make_error(errno, "dup: {}", std::strerror(errno));
  return r;
}

std::vector<pager::Extent> extents_of(const gguf::File& f) {
  std::vector<pager::Extent> ex;
  ex.reserve(f.tensors.size() + 1);
  // Ranks are layers, so the prefetch window counts layers: the header
  // (clients parse it before any weight) and token_embd first, blk.N next,
  // output_norm/output last.
  ex.push_back({0, f.data_offset, 0});
  for (const auto& t : f.tensors) {
    uint32_t rank = 0;
    if (t.slot == gguf::LayerSlot::kBlock) rank = static_cast<uint32_t>(t.layer) + 1;
    else if (t.slot == gguf::LayerSlot::kPost) rank = static_cast<uint32_t>(f.n_layers) + 1;
    ex.push_back({t.offset, t.nbytes, rank});
  }
  return ex;
}

}  // namespace

Models::Models(pool::Pool& pool, pager::Pager& pager, std::vector<std::string> pinned, bool cooperative)
    : pool_(pool), pager_(pager), pinned_(pinned.begin(), pinned.end()), cooperative_(cooperative) {}

Result<pager::ModelId> Models::load_with_room(pager::ModelSpec spec, uint64_t region_bytes) {
  // Make room first so the pager's reservation does not fail half-way.
  if (pool_.counts().free_bytes() < region_bytes) evict_lru(region_bytes);
  return pager_.load(std::move(spec));
}

Result<ModelEntry*> Models::load(int gguf_fd, const std::string& name_hint) {
  struct stat st {};
  if (::fstat(gguf_fd, &st) != 0) return make_error(errno, "LoadModel: fstat of the passed fd: {}", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return make_error(EINVAL, "LoadModel: the passed fd is not a regular file");
  const int fl = ::fcntl(gguf_fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) == O_WRONLY)
    return make_error(EINVAL, "LoadModel: the passed fd is not open for reading");
  const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  for (auto& [id, m] : models_) {
    if (m->dev == st.st_dev && m->ino == st.st_ino && m->file_size == static_cast<uint64_t>(st.st_size) &&
        m->mtime_ns == mtime)
      return m.get();
  }

  auto dup = dup_fd(gguf_fd);
  if (!dup) return std::move(dup).error();
  auto parse_fd = dup_fd(gguf_fd);
  if (!parse_fd) return std::move(parse_fd).error();
  auto src = gguf::FdSource::adopt(std::move(parse_fd).value(), "the passed GGUF");
  if (!src) return std::move(src).error();
  auto parsed = gguf::parse(*src);
  if (!parsed) return make_error(parsed.error().code, "LoadModel: {}", parsed.error().message);

  auto e = std::make_unique<ModelEntry>();
  e->id = next_id_++;
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  e->file_size = static_cast<uint64_t>(st.st_size);
  e->mtime_ns = mtime;
  e->meta = std::move(parsed).value();
  e->name = name_hint;
  if (e->name.empty()) {
    if (auto* n = e->meta.find("general.name"); n != nullptr && n->as_string()) e->name = std::string(*n->as_string());
  }
  if (e->name.empty()) e->name = "model-" + std::to_string(e->id);
  for (auto& [id, m] : models_)
    if (m->name == e->name) e->name += "-" + std::to_string(e->id);
  e->object_path = std::string(dbus::kModelPathPrefix) + std::to_string(e->id);
  e->pinned = pinned_.contains(e->name);
  e->last_used = Clock::now();

  pager::ModelSpec spec;
  spec.name = e->name;
  spec.gguf = std::move(dup).value();
  spec.file_size = e->file_size;
  spec.extents = extents_of(e->meta);
  const uint64_t region = round_up(e->file_size, pool_.page_size()).value_or(UINT64_MAX);
  auto pid = load_with_room(std::move(spec), region);
  if (!pid) return std::move(pid).error();
  e->pager_id = *pid;
  spdlog::info("model '{}' loaded: {} ({} tensors, {} layers) as {}{}", e->name, format_bytes(e->file_size),
               e->meta.tensors.size(), e->meta.n_layers, e->object_path, e->pinned ? ", pinned" : "");
  auto* raw = e.get();
  models_.emplace(e->id, std::move(e));
  return raw;
}

Result<OpenResult> Models::open(ModelEntry& m, const std::string& caller, bool lazy) {
  if (m.evicted) {
    const uint64_t region = round_up(m.file_size, pool_.page_size()).value_or(UINT64_MAX);
    if (pool_.counts().free_bytes() < region) evict_lru(region);
    if (auto s = pager_.ensure_loaded(m.pager_id); !s) return std::move(s).error();
    m.evicted = false;
    spdlog::info("model '{}' refilling after eviction", m.name);
  }
  auto st = pager_.stats(m.pager_id);
  if (!st) return std::move(st).error();
  const bool resident = st->state == client::ModelLoadState::Resident;
  if (!lazy && !resident)
    return make_error(EAGAIN,
                      "model '{}' is not resident yet ({} of {} bytes): attach lazily through libairs, or wait for "
                      "its Resident signal and open again",
                      m.name, st->resident_bytes, st->region_size);
  OpenResult r;
  // Writable only where a client must register a userfaultfd on it.
  auto region = (resident || cooperative_) ? sys::reopen(pager_.region_fd(m.pager_id), O_RDONLY | O_CLOEXEC)
                                           : dup_fd(pager_.region_fd(m.pager_id));
  if (!region) return std::move(region).error();
  auto status = sys::reopen(pager_.status_fd(m.pager_id), O_RDONLY | O_CLOEXEC);
  if (!status) return std::move(status).error();
  r.region = std::move(region).value();
  r.status = std::move(status).value();
  r.size = pager_.region_size(m.pager_id);
  r.resident = resident;
  r.unit_size = st->unit_size;
  ++m.refs[caller];
  m.last_used = Clock::now();
  return r;
}

Status Models::attach(ModelEntry& m, const dbus::Caller& caller, sys::UniqueFd notify, sys::UniqueFd uffd,
                      uint64_t addr, uint64_t length) {
  if (!m.refs.contains(caller.name))
    return make_error(EPERM, "Attach on model '{}': call Open first (the caller holds no reference)", m.name);
  const pager::ClientKey key = next_client_++;
  AIRS_TRY(pager_.attach(m.pager_id, key, caller.pid, std::move(uffd), std::move(notify), addr, length));
  m.clients[caller.name].push_back(key);
  m.last_used = Clock::now();
  return {};
}

Status Models::release(ModelEntry& m, const std::string& caller) {
  auto it = m.refs.find(caller);
  if (it == m.refs.end()) return make_error(ENOENT, "Release on model '{}': the caller holds no reference", m.name);
  if (--it->second == 0) {
    m.refs.erase(it);
    if (auto c = m.clients.find(caller); c != m.clients.end()) {
      for (auto key : c->second) pager_.detach(m.pager_id, key);
      m.clients.erase(c);
    }
  }
  m.last_used = Clock::now();
  return {};
}

void Models::drop_caller(const std::string& caller) {
  for (auto& [id, m] : models_) {
    if (auto c = m->clients.find(caller); c != m->clients.end()) {
      for (auto key : c->second) pager_.detach(m->pager_id, key);
      m->clients.erase(c);
    }
    if (m->refs.erase(caller) > 0) spdlog::debug("model '{}': references of {} dropped (left the bus)", m->name, caller);
  }
}

Status Models::evict(ModelEntry& m) {
  if (m.pinned) return make_error(EBUSY, "model '{}' is pinned in the configuration (models.pinned)", m.name);
  if (m.refcount() > 0) return make_error(EBUSY, "model '{}' has {} references", m.name, m.refcount());
  if (m.evicted) return {};
  AIRS_TRY(pager_.evict(m.pager_id));
  m.evicted = true;
  spdlog::info("model '{}' evicted: pages back to the pool", m.name);
  return {};
}

uint64_t Models::evict_lru(uint64_t bytes, std::vector<std::string>* evicted_names) {
  std::vector<ModelEntry*> cands;
  for (auto& [id, m] : models_)
    if (!m->pinned && !m->evicted && m->refcount() == 0) cands.push_back(m.get());
  std::sort(cands.begin(), cands.end(), [](auto* a, auto* b) { return a->last_used < b->last_used; });
  const uint64_t before = pool_.counts().free_bytes();
  for (auto* m : cands) {
    if (pool_.counts().free_bytes() >= bytes) break;
    if (evict(*m) && evicted_names != nullptr) evicted_names->push_back(m->name);
  }
  return pool_.counts().free_bytes() - before;
}

Status Models::unload(ModelEntry& m, bool force) {
  if (m.refcount() > 0 && !force)
    return make_error(EBUSY, "model '{}' has {} references (use force to unload anyway)", m.name, m.refcount());
  for (auto& [caller, keys] : m.clients)
    for (auto key : keys) pager_.detach(m.pager_id, key);
  AIRS_TRY(pager_.unload(m.pager_id));
  spdlog::info("model '{}' unloaded", m.name);
  models_.erase(m.id);
  return {};
}

ModelEntry* Models::find_by_path(const std::string& path) {
  for (auto& [id, m] : models_)
    if (m->object_path == path) return m.get();
  return nullptr;
}

ModelEntry* Models::find_by_name(const std::string& name) {
  for (auto& [id, m] : models_)
    if (m->name == name) return m.get();
  return nullptr;
}

std::vector<ModelEntry*> Models::all() {
  std::vector<ModelEntry*> v;
  for (auto& [id, m] : models_) v.push_back(m.get());
  return v;
}

std::optional<pager::ModelStats> Models::stats(const ModelEntry& m) const {
  auto s = pager_.stats(m.pager_id);
  if (!s) return std::nullopt;
  return std::move(s).value();
}

}  // namespace airs::daemon
