// SPDX-License-Identifier: Apache-2.0
#include "daemon/models.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "daemon/extents.hpp"
#include "dbus/names.hpp"
#include "sys/proc_handles.hpp"
#include "util/text.hpp"
#include "util/units.hpp"

namespace airs::daemon {

namespace {

// The pager's own copy of the header's O_DIRECT reopen, or why there is
// none: a dup, never a reopen, so the loop asks the file system nothing (a
// load that waits for room runs again with the same header).
std::optional<Result<sys::UniqueFd>> direct_of(const Header& h) {
  if (h.direct_refused) return Result<sys::UniqueFd>(*h.direct_refused);
  if (!h.direct) return std::nullopt;
  auto d = sys::dup_cloexec(h.direct.get());
  if (!d) return Result<sys::UniqueFd>(std::move(d).error());
  return Result<sys::UniqueFd>(std::move(d).value());
}

}  // namespace

Models::Models(pool::Pool& pool, pager::Pager& pager, const config::ModelsConfig& cfg, bool cooperative, Hooks hooks)
    : pool_(pool),
      pager_(pager),
      pinned_(cfg.pinned.begin(), cfg.pinned.end()),
      max_models_per_uid_(cfg.max_models_per_uid),
      max_pool_share_(cfg.max_pool_bytes_per_uid),
      hooks_(std::move(hooks)),
      cooperative_(cooperative) {}

Charge Models::charged_to(uid_t uid) const {
  Charge c;
  for (const auto& [id, m] : models_) {
    if (m->owner_exempt || m->owner_uid != uid) continue;
    ++c.models;
    c.bytes += m->region_bytes;
  }
  return c;
}

bool Models::may_share(const ModelEntry& m, const sys::FileId& now, uid_t uid) {
  // The bytes in the pool are the file's as the loader read them. Another
  // uid may use them only if nobody but root and itself could have
  // changed the file since: stat cannot tell a rewrite through a shared
  // mapping from no change at all.
  return m.owner_uid == uid || !now.writable_by_others_than(uid);
}

uint64_t Models::share_left(const LoadRequest& req) const {
  if (req.exempt) return UINT64_MAX;
  const uint64_t limit = max_pool_share_.resolve(pool_.counts().total_bytes());
  const Charge c = charged_to(req.uid);
  return limit > c.bytes ? limit - c.bytes : 0;
}

Status Models::check_quota(const LoadRequest& req, uint64_t region_bytes) const {
  if (req.exempt) return {};
  const Charge c = charged_to(req.uid);
  if (max_models_per_uid_ != 0 && c.models >= max_models_per_uid_)
    return make_error(EDQUOT,
                      "LoadModel: uid {} has {} models loaded, its limit (models.max_models_per_uid = {}); models "
                      "that nobody uses are evicted under pressure, or ask an admin to unload one",
                      req.uid, c.models, max_models_per_uid_);
  const uint64_t limit = max_pool_share_.resolve(pool_.counts().total_bytes());
  if (region_bytes > limit || c.bytes > limit - region_bytes)
    return make_error(EDQUOT,
                      "LoadModel: uid {} would hold {} of the pool in models it loaded ({} now + {}), more than its "
                      "share (models.max_pool_bytes_per_uid: {})",
                      req.uid, format_bytes(c.bytes + region_bytes), format_bytes(c.bytes), format_bytes(region_bytes),
                      format_bytes(limit));
  return {};
}

Result<ModelEntry*> Models::load(const LoadRequest& req, const Header& header) {
  const sys::FileId* id = &header.id;
  bool unshared = false;
  for (auto& [mid, m] : models_) {
    if (!m->file.same_version(*id)) continue;
    if (!may_share(*m, *id, req.uid)) {
      unshared = true;
      continue;
    }
    m->last_used = Clock::now();
    m->readers.insert(req.uid);
    return m.get();
  }
  if (unshared)
    spdlog::info("LoadModel by uid {}: its file can be changed in place by uid {} or through its write bits ({:o}): "
                 "uid {} gets a copy it loaded itself (a file only root can write is shared by all)",
                 req.uid, id->owner, id->mode & 07777, req.uid);
  const uint64_t region = round_up(id->size, pool_.page_size()).value_or(UINT64_MAX);
  // A model bigger than the pool, or than what the caller's share leaves,
  // is streamed: it gets a budget of pool pages and its units move in and
  // out of it. Quota and room are checked before any parsing cost or
  // eviction: a load that cannot be had fails having changed nothing.
  const uint64_t room = std::min(pool_.counts().total_bytes(), share_left(req));
  // A streamed model leaves an eighth of the pool to KV and other models
  // (pressure and KV allocations can cut its budget further).
  const uint64_t page = pool_.page_size();
  uint64_t budget = region > room ? std::min(room, pool_.counts().total_bytes() / 8 * 7) / page * page : 0;
  AIRS_TRY(check_quota(req, budget != 0 ? budget : region));

  auto dup = sys::dup_cloexec(req.gguf_fd);
  if (!dup) return std::move(dup).error();
  // A copy: a load that waits for room (EINPROGRESS) runs again with the same header.
  auto e = new_entry(header.id, header.st, header.file, req);
  e->content_id = content_ids_.lookup(e->file_stat);

  pager::ModelSpec spec;
  spec.name = e->name;
  spec.gguf = std::move(dup).value();
  spec.gguf_direct = direct_of(header);
  spec.async_reads = header.reads_may_hang;
  spec.file_size = id->size;
  spec.extents = extents_of(e->meta);
  if (budget != 0) {
    const uint64_t floor = pager_.stream_floor_bytes(spec);
    const auto& c = pool_.counts();
    if (budget < floor && room < c.total_bytes())
      return make_error(EDQUOT,
                        "LoadModel: model '{}' ({}) is bigger than the {} uid {} may hold of the pool, and streaming it "
                        "needs at least {} (its largest layer and the read-ahead); ask an admin to load it, or raise "
                        "models.max_pool_bytes_per_uid",
                        e->name, format_bytes(id->size), format_bytes(budget), req.uid, format_bytes(floor));
    if (budget < floor)
      return make_error(ENOSPC,
                        "LoadModel: pool exhausted: model '{}' ({}) is bigger than the pool ({} in {} pages of {}, {} "
                        "free of them), and streaming it needs at least {} (its largest layer and the read-ahead); "
                        "grow the pool (pool size in the config)",
                        e->name, format_bytes(id->size), format_bytes(c.total_bytes()), c.total_pages(),
                        format_bytes(c.page_size), c.free_pages, format_bytes(floor));
  }
  const std::string why = "load of model '" + e->name + "'";
  if (budget == 0 && pool_.counts().free_bytes() < region && make_room_)
    AIRS_TRY(make_room_(region - pool_.counts().free_bytes(), why));
  if (budget != 0 && !req.exempt) {
    // A user's streamed model takes the free pages (within its share) and
    // pushes out others' idle models only as far as it must to stream at
    // all: a smaller budget streams more, it does not fail.
    const uint64_t floor = pager_.stream_floor_bytes(spec);
    budget = std::min(budget, std::max(pool_.counts().free_bytes() / page * page, floor));
  }
  if (budget != 0 && pool_.counts().free_bytes() < budget && make_room_) {
    // An admin's streamed model takes what eviction can free for it, down
    // to what is free, never below its floor.
    auto st = make_room_(budget - pool_.counts().free_bytes(), why);
    if (!st && st.error().code != ENOMEM) return std::move(st).error();
    if (!st) {
      const uint64_t have = pool_.counts().free_bytes() / page * page;
      if (have < pager_.stream_floor_bytes(spec)) return std::move(st).error();
      spdlog::info("model '{}': {} of pool for its streaming budget ({} asked: {})", e->name, format_bytes(have),
                   format_bytes(budget), st.error().message);
      budget = have;
    }
  }
  const uint64_t charge = budget != 0 ? budget : region;
  const auto units = static_cast<uint32_t>(pool::pages_for(id->size, pool_.page_size()));
  OrderPlan order = orders_.plan_for(e->name, e->content_id, pool_.page_size(), units);
  spec.warmup_order = std::move(order.warmup_order);
  spec.record_access = order.record;
  spec.id = e->id;
  spec.budget_bytes = budget;
  // Reads that may never end (a FUSE or network file) hold their slots for
  // ever; a user's such model reads within that user's share of them.
  if (!req.exempt && header.reads_may_hang) spec.capped_owner = req.uid;
  auto pid = pager_.load(std::move(spec));
  if (!pid) return std::move(pid).error();
  e->pager_id = *pid;
  e->region_bytes = charge;
  e->budget_at_load = budget;
  spdlog::info("model '{}' loaded by uid {}: {} ({} tensors, {} layers) as {}{}{}", e->name, req.uid,
               format_bytes(id->size), e->meta.tensors.size(), e->meta.n_layers, e->object_path,
               e->pinned ? ", pinned" : "",
               budget != 0 ? fmt::format(", streamed through {} of the pool", format_bytes(budget)) : "");
  auto* raw = e.get();
  models_.emplace(e->id, std::move(e));
  return raw;
}

std::unique_ptr<ModelEntry> Models::new_entry(const sys::FileId& file, const struct stat& st, gguf::File meta,
                                              const LoadRequest& req) {
  auto e = std::make_unique<ModelEntry>();
  e->id = next_id_++;
  e->file = file;
  e->file_stat = st;
  e->region_bytes = round_up(file.size, pool_.page_size()).value_or(UINT64_MAX);
  e->meta = std::move(meta);
  e->owner_uid = req.uid;
  e->readers.insert(req.uid);  // it passed its fd of the file (or owned it before a restart)
  e->owner_exempt = req.exempt;
  e->name = req.name;
  if (e->name.empty()) {
    // From the file: anything it says is made printable (the caller's own
    // names are checked at the bus edge).
    if (auto* n = e->meta.find("general.name"); n != nullptr && n->as_string() && !n->as_string()->empty())
      e->name = printable_name(*n->as_string(), kMaxNameBytes - 12);
  }
  if (e->name.empty()) e->name = "model-" + std::to_string(e->id);
  for (auto& [mid, m] : models_)
    if (m->name == e->name) e->name = printable_name(e->name, kMaxNameBytes - 12) + "-" + std::to_string(e->id);
  e->object_path = std::string(dbus::kModelPathPrefix) + std::to_string(e->id);
  // Pins are the admin's: only a load by an admin (or models.preload) takes
  // a configured pinned name's pin, so nobody can squat it.
  e->pinned = req.exempt && pinned_.contains(e->name);
  e->last_used = Clock::now();
  return e;
}

Result<ModelEntry*> Models::adopt(AdoptRequest req, Header header) {
  const sys::FileId* id = &header.id;
  auto dup = sys::dup_cloexec(req.load.gguf_fd);
  if (!dup) return std::move(dup).error();
  auto e = new_entry(header.id, header.st, std::move(header.file), req.load);
  e->content_id = req.content_id;
  pager::ModelSpec spec;
  spec.name = e->name;
  spec.gguf = std::move(dup).value();
  spec.gguf_direct = direct_of(header);
  spec.async_reads = header.reads_may_hang;
  spec.file_size = id->size;
  spec.extents = extents_of(e->meta);
  spec.id = e->id;
  if (!e->owner_exempt && header.reads_may_hang) spec.capped_owner = e->owner_uid;
  auto pid = pager_.adopt(std::move(spec), std::move(req.region));
  if (!pid) return std::move(pid).error();
  e->pager_id = *pid;
  e->adopted = true;
  spdlog::info("model '{}' (uid {}) adopted from the previous daemon: {} resident, nothing read, as {}{}", e->name,
               e->owner_uid, format_bytes(id->size), e->object_path, e->pinned ? ", pinned" : "");
  auto* raw = e.get();
  models_.emplace(e->id, std::move(e));
  return raw;
}

uint64_t Models::spare_bytes(const ModelEntry& m) const {
  const uint64_t floor = pager_.floor_bytes(m.pager_id);
  if (floor == 0) return 0;
  return m.region_bytes > floor ? m.region_bytes - floor : 0;
}

Status Models::shrink(ModelEntry& m, uint64_t bytes, const std::string& reason) {
  const uint64_t spare = spare_bytes(m);
  if (spare == 0) return make_error(EINVAL, "model '{}' has no budget to give back", m.name);
  const uint64_t target = m.region_bytes - std::min(spare, bytes);
  auto r = pager_.set_budget(m.pager_id, target);
  if (!r) return std::move(r).error();
  spdlog::info("model '{}': streaming budget {} -> {} ({})", m.name, format_bytes(m.region_bytes), format_bytes(target),
               reason);
  m.region_bytes = target;
  return {};
}

bool Models::budgets_below_load() const {
  for (const auto& [id, m] : models_)
    if (m->budget_at_load > m->region_bytes) return true;
  return false;
}

void Models::restore_budgets() {
  const uint64_t page = pool_.page_size();
  for (auto& [id, m] : models_) {
    if (m->budget_at_load <= m->region_bytes) continue;
    // A cut still on its way (cooperative clients closing units) ends
    // first: the next quiet period gives the pages back.
    if (pager_.budget_cut_pending(m->pager_id)) continue;
    const uint64_t free = pool_.counts().free_bytes() / page * page;
    uint64_t give = std::min(m->budget_at_load - m->region_bytes, free);
    if (!m->owner_exempt) {
      // Within its owner's share as it is now (the uid may hold more since).
      const uint64_t limit = max_pool_share_.resolve(pool_.counts().total_bytes());
      const uint64_t held = charged_to(m->owner_uid).bytes;
      give = std::min(give, limit > held ? limit - held : 0);
    }
    give = give / page * page;
    if (give == 0) continue;
    const uint64_t target = m->region_bytes + give;
    if (auto r = pager_.set_budget(m->pager_id, target); !r) {
      spdlog::warn("model '{}': its streaming budget not restored: {}", m->name, r.error().message);
      continue;
    }
    spdlog::info("model '{}': streaming budget {} -> {} (no pressure: back toward its {} at load)", m->name,
                 format_bytes(m->region_bytes), format_bytes(target), format_bytes(m->budget_at_load));
    m->region_bytes = target;
  }
}

void Models::content_id_found(ModelEntry& m, const gguf::ContentId& id) {
  m.content_id = id;
  if (auto st = content_ids_.store(m.file_stat, id); !st)
    spdlog::warn("model '{}': content id {} not remembered: {}", m.name, id.hex(), st.error().message);
  if (m.unstored_order) {
    auto order = std::move(*m.unstored_order);
    m.unstored_order.reset();
    store_order(m, order);
  }
}

void Models::access_order_done(ModelEntry& m) {
  auto order = pager_.take_access_order(m.pager_id);
  if (!order) return;
  if (!m.content_id) {
    m.unstored_order = std::move(order);
    return;
  }
  store_order(m, *order);
}

void Models::store_order(const ModelEntry& m, const std::vector<uint32_t>& order) {
  if (!orders_.enabled() || !m.content_id) return;
  if (order.empty()) {
    spdlog::info("model '{}': no access order recorded (no client faulted on it)", m.name);
    return;
  }
  const auto units = static_cast<uint32_t>(pool::pages_for(m.file.size, pool_.page_size()));
  if (auto st = orders_.store(*m.content_id, pool_.page_size(), units, order); !st)
    spdlog::warn("model '{}': access order not stored: {}", m.name, st.error().message);
  else
    spdlog::info("model '{}': access order of {} of {} units stored as {}", m.name, order.size(), units,
                 orders_.path_of(*m.content_id));
}

Result<OpenResult> Models::open(ModelEntry& m, const dbus::Caller& caller, int proof_fd, bool lazy, bool nowait) {
  // On the loop: the caller's file may be on a FUSE mount it serves itself.
  auto id = sys::readable_file_identity(proof_fd, "Open: gguf_fd", sys::Attributes::Cached);
  if (!id) return std::move(id).error();
  if (!id->same_inode(m.file))
    return make_error(EACCES, "Open on model '{}': the passed fd is not this model's GGUF file; pass an fd of the file "
                              "itself, opened for reading",
                      m.name);
  if (!id->same_version(m.file))
    return make_error(ENOENT, "Open on model '{}': the file changed since the model was loaded from it; LoadModel "
                              "loads the file as it is now",
                      m.name);
  if (!may_share(m, *id, caller.uid))
    return make_error(EACCES, "Open on model '{}': uid {} can change its file in place, so uid {} gets only a copy it "
                              "loaded itself: LoadModel with the fd loads one",
                      m.name, id->owner, caller.uid);
  m.readers.insert(caller.uid);  // proven, whether or not the open succeeds now
  auto st = pager_.stats(m.pager_id);
  if (!st) return std::move(st).error();
  const bool resident = st->state == wire::ModelLoadState::Resident;
  if (st->state == wire::ModelLoadState::Failed)
    return make_error(EIO, "model '{}' failed to load ({} units could not be read); an admin can unload it", m.name,
                      st->units_failed);
  if (lazy && cooperative_)
    return make_error(ENOTSUP, "model '{}': the daemon runs in cooperative mode (no userfaultfd): use Open", m.name);
  // A streamed model's units come and go: only a client that handles that
  // may map it (a lazy client's userfaultfd, or the touch guard's
  // cooperative protocol: Open without waiting, then Follow). A plain
  // mapper would read a dropped unit as zeros.
  if (!lazy && !nowait && st->streamed)
    return make_error(ENOTSUP,
                      "model '{}' is streamed (bigger than its {} of the pool): it is never resident, and only "
                      "clients that handle its units coming and going may map it: libairs (airs_model_open) "
                      "lazily or with its touch guard, not a plain Open that waits for residency",
                      m.name, format_bytes(st->stream.budget_units * st->unit_size));
  if (!lazy && !resident && !nowait)
    return make_error(EAGAIN, "model '{}' is not resident yet ({} of {} bytes)", m.name, st->resident_bytes,
                      st->region_size);
  OpenResult r;
  // Writable only where a client must register a userfaultfd on it.
  auto region = lazy ? sys::dup_cloexec(pager_.region_fd(m.pager_id)) : sys::reopen(pager_.region_fd(m.pager_id), O_RDONLY);
  if (!region) return std::move(region).error();
  auto status = sys::reopen(pager_.status_fd(m.pager_id), O_RDONLY);
  if (!status) return std::move(status).error();
  r.region = std::move(region).value();
  r.status = std::move(status).value();
  r.size = pager_.region_size(m.pager_id);
  r.resident = resident;
  r.unit_size = st->unit_size;
  r.streamed = st->streamed;
  r.expert_hints = pager_.takes_hints(m.pager_id);
  ++m.refs[caller.name];
  m.last_used = Clock::now();
  return r;
}

Status Models::attach(ModelEntry& m, const dbus::Caller& caller, sys::UniqueFd notify, sys::UniqueFd uffd,
                      uint64_t addr, uint64_t length) {
  if (!m.refs.contains(caller.name))
    return make_error(EPERM, "Attach on model '{}': call OpenLazy first (the caller holds no reference)", m.name);
  const pager::ClientKey key = next_client_++;
  AIRS_TRY(pager_.attach(m.pager_id, key, caller.pid, std::move(uffd), std::move(notify), addr, length));
  m.clients[caller.name].push_back(key);
  m.last_used = Clock::now();
  return {};
}

Status Models::follow(ModelEntry& m, const dbus::Caller& caller, sys::UniqueFd requests, sys::UniqueFd opened) {
  auto ref = m.refs.find(caller.name);
  if (ref == m.refs.end())
    return make_error(EPERM, "Follow on model '{}': call Open first (the caller holds no reference)", m.name);
  auto& keys = m.clients[caller.name];
  if (keys.size() >= ref->second)
    return make_error(EDQUOT, "Follow on model '{}': one request socket per reference ({} already)", m.name, keys.size());
  const pager::ClientKey key = next_client_++;
  AIRS_TRY(pager_.follow(m.pager_id, key, caller.pid, std::move(requests), std::move(opened)));
  keys.push_back(key);
  return {};
}

Status Models::hints(ModelEntry& m, const dbus::Caller& caller, sys::UniqueFd socket) {
  auto ref = m.refs.find(caller.name);
  if (ref == m.refs.end())
    return make_error(EPERM, "Hints on model '{}': call Open or OpenLazy first (the caller holds no reference)", m.name);
  auto& keys = m.clients[caller.name];
  if (keys.size() >= 2 * uint64_t{ref->second})
    return make_error(EDQUOT, "Hints on model '{}': a mapping and a hint socket per reference ({} channels already)",
                      m.name, keys.size());
  const pager::ClientKey key = next_client_++;
  if (auto st = pager_.hints(m.pager_id, key, caller.pid, std::move(socket)); !st) {
    if (keys.empty()) m.clients.erase(caller.name);
    return st;
  }
  keys.push_back(key);
  return {};
}

Status Models::release(ModelEntry& m, const std::string& caller) {
  auto it = m.refs.find(caller);
  if (it == m.refs.end()) return make_error(ENOENT, "Release on model '{}': the caller holds no reference", m.name);
  if (--it->second == 0) {
    m.refs.erase(it);
    detach_all(m, caller);
  }
  m.last_used = Clock::now();
  return {};
}

void Models::drop_caller(const std::string& caller) {
  for (auto& [id, m] : models_) {
    detach_all(*m, caller);
    if (m->refs.erase(caller) > 0) spdlog::debug("model '{}': references of {} dropped (left the bus)", m->name, caller);
  }
}

void Models::detach_all(ModelEntry& m, const std::string& caller) {
  // Out of the entry first: each detach is told back (client_left).
  auto node = m.clients.extract(caller);
  if (node)
    for (auto key : node.mapped()) pager_.detach(m.pager_id, key);
}

void Models::client_left(pager::ModelId id, pager::ClientKey key) {
  ModelEntry* m = find(id);  // the pager's id is the entry's
  if (m == nullptr) return;
  for (auto c = m->clients.begin(); c != m->clients.end(); ++c) {
    auto& keys = c->second;
    if (std::erase(keys, key) == 0) continue;
    if (keys.empty()) m->clients.erase(c);
    return;
  }
}

bool Models::rename_caller(const std::string& from, const std::string& to) {
  bool any = false;
  for (auto& [id, m] : models_) {
    if (auto n = m->refs.extract(from)) {
      n.key() = to;
      m->refs.insert(std::move(n));
      any = true;
    }
    if (auto n = m->clients.extract(from)) {
      n.key() = to;
      m->clients.insert(std::move(n));
      any = true;
    }
  }
  return any;
}

Status Models::unload(ModelEntry& m, bool force, bool in_use, const std::string& reason) {
  if (!force) {
    if (m.pinned) return make_error(EBUSY, "model '{}' is pinned in the configuration (models.pinned)", m.name);
    if (m.refcount() > 0)
      return make_error(EBUSY, "model '{}' has {} references (use force to unload anyway)", m.name, m.refcount());
    if (in_use) return make_error(EBUSY, "model '{}' has open KV sessions (use force to unload anyway)", m.name);
  }
  // Never resident: what it faulted on so far is the best recording there is.
  access_order_done(m);
  if (hooks_.dropped) hooks_.dropped(m, force, reason);
  // The pager revokes the region and wakes every client still attached
  // (their blocked faults then end in SIGBUS), then detaches them.
  const uint64_t id = m.id;
  const std::string name = m.name;
  const uint32_t refs = m.refcount();
  auto st = pager_.unload(m.pager_id);
  models_.erase(id);
  if (!st) return std::move(st).error();
  spdlog::info("model '{}' unloaded ({}){}{}", name, reason,
               refs > 0 ? fmt::format(": {} references revoked, their mappings now get SIGBUS", refs) : std::string(),
               *st == pager::Pager::Drain::Pending ? "; its pages return once its reads in flight landed" : "");
  return {};
}

ModelEntry* Models::find(uint64_t id) {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.get();
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

Result<Models::Residency> Models::residency(const ModelEntry& m) const {
  auto ranks = pager_.residency(m.pager_id);
  if (!ranks) return std::move(ranks).error();
  auto st = pager_.stats(m.pager_id);
  if (!st) return std::move(st).error();
  Residency r;
  r.ranks = std::move(ranks).value();
  r.unit_size = st->unit_size;
  r.streamed = st->streamed;
  r.budget_bytes = st->streamed ? st->stream.budget_units * st->unit_size : st->region_size;
  return r;
}

std::optional<pager::ModelStats> Models::stats(const ModelEntry& m) const {
  auto s = pager_.stats(m.pager_id);
  if (!s) return std::nullopt;
  return std::move(s).value();
}

void Models::add_inodes(sys::InodeSet& out) const {
  for (const auto& [id, m] : models_) {
    for (int fd : {pager_.region_fd(m->pager_id), pager_.status_fd(m->pager_id)})
      if (auto i = sys::inode_of(fd)) out.insert(*i);
  }
}

}  // namespace airs::daemon
