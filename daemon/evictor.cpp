// SPDX-License-Identifier: Apache-2.0
#include "daemon/evictor.hpp"

#include <spdlog/spdlog.h>

#include "daemon/kv_service.hpp"
#include "daemon/models.hpp"
#include "dbus/names.hpp"
#include "util/units.hpp"

namespace airs::daemon {

Evictor::Evictor(pool::Pool& pool, Models& models, KvService& kv, policy::Config cfg)
    : pool_(pool), models_(models), kv_(kv), cfg_(cfg) {}

policy::PoolState Evictor::snapshot() const {
  policy::PoolState s = kv_.snapshot();
  s.total_bytes = pool_.counts().total_bytes();
  // Pages of unloaded models on their way back are as good as free: a
  // plan that ignored them would evict a second model for the same need.
  s.free_bytes = available_bytes();
  s.unit_bytes = pool_.page_size();
  for (ModelEntry* m : models_.all()) {
    policy::ModelState ms;
    ms.id = m->id;
    ms.name = m->name;
    // The whole region's pages come back when a model goes, filled or not.
    ms.resident_bytes = m->region_bytes;
    ms.refcount = users(*m);
    ms.pinned = m->pinned;
    ms.last_used = m->last_used;
    ms.spare_bytes = models_.spare_bytes(*m);
    s.models.push_back(std::move(ms));
  }
  return s;
}

policy::Plan Evictor::plan(const policy::Request& req) const {
  return policy::plan_eviction(snapshot(), req, Clock::now(), cfg_);
}

Result<uint64_t> Evictor::execute(const policy::Action& a) {
  if (a.kind != policy::ActionKind::EvictModel && a.kind != policy::ActionKind::ShrinkModel) return kv_.execute(a);
  ModelEntry* m = models_.find(a.id);
  if (m == nullptr) return make_error(ENOENT, "model {} is gone", a.id);
  const uint64_t before = available_bytes();
  if (a.kind == policy::ActionKind::ShrinkModel) AIRS_TRY(models_.shrink(*m, a.bytes, a.reason));
  else AIRS_TRY(unload(*m, false, a.reason));
  const uint64_t after = available_bytes();
  return after > before ? after - before : 0;
}

uint32_t Evictor::users(const ModelEntry& m) const { return m.refcount() + kv_.sessions_on(m.id); }

Status Evictor::unload(ModelEntry& m, bool force, const std::string& reason) {
  return models_.unload(m, force, kv_.sessions_on(m.id) > 0, reason);
}

uint64_t Evictor::available_bytes() const {
  return pool_.counts().free_bytes() + models_.returning_pages() * pool_.page_size();
}

Status Evictor::make_room(const policy::Request& req, const std::string& why) {
  const uint64_t want_free = pool_.counts().free_bytes() + req.bytes;
  // Pages on their way back cover that much of the need: plan the rest only.
  policy::Request rest = req;
  rest.bytes -= std::min(rest.bytes, models_.returning_pages() * pool_.page_size());
  if (rest.bytes > 0 || req.bytes == 0) {
    auto p = plan(rest);
    if (!p.satisfied) return make_error(ENOMEM, "{}: pool exhausted: {}", why, p.shortfall);
    for (const auto& a : p.actions) {
      if (auto r = execute(a); !r)
        spdlog::warn("{}: evicting {} failed: {}", why, object_of(a), r.error().message);
      else
        spdlog::info("{}: evicted {} ({})", why, object_of(a), a.reason);
    }
  }
  // The rest is on its way: the caller is answered once it is back
  // (DrainWaits), the loop does not wait for it.
  if (pool_.counts().free_bytes() < want_free && models_.returning_pages() > 0)
    return make_error(EINPROGRESS, "{}: waiting for {} on their way back to the pool (reads in flight of unloaded models)",
                      why, format_bytes(models_.returning_pages() * pool_.page_size()));
  return {};
}

bool Evictor::has_session(uint64_t id) const { return kv_.find_id(id) != nullptr; }

std::string Evictor::object_of(const policy::Action& a) const {
  switch (a.kind) {
    case policy::ActionKind::DropCached: return fmt::format("kv-arena:{}", a.id);
    case policy::ActionKind::EvictBlocks:
      if (const KvSession* s = kv_.find_id(a.id)) return s->path;
      return fmt::format("{}{}", dbus::kSessionPathPrefix, a.id);
    case policy::ActionKind::EvictModel:
    case policy::ActionKind::ShrinkModel:
      if (ModelEntry* m = models_.find(a.id)) return m->object_path;
      return fmt::format("{}{}", dbus::kModelPathPrefix, a.id);
  }
  return "?";
}

}  // namespace airs::daemon
