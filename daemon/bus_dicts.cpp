// SPDX-License-Identifier: Apache-2.0
#include "daemon/bus_dicts.hpp"

#include <unistd.h>

#include <algorithm>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace airs::daemon {
namespace {

template <typename T>
sdbus::Variant v(T x) {
  return sdbus::Variant(std::move(x));
}
sdbus::Variant v(const char* s) { return sdbus::Variant(std::string(s)); }

// Why the expert cache learns from `source`, and why not from the kernel:
// DAMON's virtual-address monitoring is not used (Debian 12's 6.1 and
// stock Raspberry Pi OS have no DAMON at all), so libairs samples alike on
// every kernel. Whether this kernel has DAMON is read once. The daemon
// cannot tell a sampled touch from a client's first touch of a unit that
// was in, so it names what it counts, not whether a client samples.
std::string access_source_why(std::string_view source) {
  static const bool damon = ::access("/sys/kernel/mm/damon/admin", F_OK) == 0;
  const char* kernel = damon ? "this kernel has DAMON, which airs-memd does not use: sampling works on every kernel"
                             : "this kernel has no DAMON";
  if (source == "expert hints") return "its clients tell which experts each layer reads (expert hints)";
  return fmt::format("no client sends expert hints, and a unit that is in takes no fault: the cache counts the "
                     "misses, and the hits it sees (resident_touches), which libairs' access sampling adds (on by "
                     "default in small-pages mode, anywhere with AIRS_SAMPLE_MS) ({})",
                     kernel);
}

}  // namespace

std::string model_state_name(const std::optional<pager::ModelStats>& stats) {
  if (!stats) return "unknown";
  switch (stats->state) {
    case wire::ModelLoadState::Loading: return "loading";
    case wire::ModelLoadState::Resident: return "resident";
    case wire::ModelLoadState::Evicted: return "evicted";
    case wire::ModelLoadState::Failed: return "failed";
    case wire::ModelLoadState::Unloaded: return "unloaded";
    case wire::ModelLoadState::Streaming: return "streaming";
  }
  return "unknown";
}

dbus::Dict to_dict(const ModelStatus& m) {
  dbus::Dict d;
  d["name"] = v(m.name);
  d["object"] = v(sdbus::ObjectPath(m.object));
  d["size"] = v(m.size);
  d["owner_uid"] = v(m.owner_uid);
  d["sessions"] = v(m.sessions);
  d["preloaded"] = v(m.preloaded);
  d["state"] = v(model_state_name(m.stats));
  d["adopted"] = v(m.adopted);
  d["content_id"] = v(m.content_id);
  d["refcount"] = v(m.refcount);
  d["clients"] = v(m.clients);
  d["pinned"] = v(m.pinned);
  d["layers"] = v(m.layers);
  d["tensors"] = v(m.tensors);
  if (const auto& st = m.stats) {
    d["resident_bytes"] = v(st->resident_bytes);
    d["pin_failed"] = v(st->pin_failed);
    d["region_bytes"] = v(st->region_size);
    d["bytes_read"] = v(st->bytes_read);
    d["read_mb_per_s"] = v(st->read_mb_per_s);
    d["direct_io"] = v(st->direct_io);
    d["faults"] = v(st->faults);
    d["faults_waited"] = v(st->faults_waited);
    d["units_failed"] = v(st->units_failed);
    d["streamed"] = v(st->streamed);
    if (st->streamed) {
      // What the residency policy keeps and streams (docs/streaming.md).
      const auto& s = st->stream;
      const uint64_t unit = st->unit_size;
      d["budget_bytes"] = v(s.budget_units * unit);
      d["unit_bytes"] = v(unit);  // per model: a mixture of experts on shmem streams in smaller units
      d["stream_window_bytes"] = v(uint64_t{s.window} * unit);
      d["passes"] = v(s.passes);
      d["bytes_per_pass"] = v(s.last_pass_units_read * unit);
      d["bytes_per_pass_min"] = v(s.cyclic_units > s.budget_units ? (s.cyclic_units - s.budget_units) * unit : 0);
      // The share of a token's units that were in when it came to them.
      d["hit_rate"] = v(s.passes == 0 || s.cyclic_units == 0
                            ? 0.0
                            : 1.0 - std::min(1.0, static_cast<double>(s.last_pass_units_read) / s.cyclic_units));
      d["units_dropped"] = v(s.units_dropped);
      d["drops_refused"] = v(s.drops_refused);
      // A mixture of experts: the uses its expert cache counted, and its
      // clients' expert hints (docs/streaming.md).
      d["expert_uses"] = v(s.expert_uses);
      d["hinted_bytes_read"] = v(s.hinted_units_read * unit);
      d["predicted_bytes_read"] = v(s.predicted_units_read * unit);
      d["expert_hints"] = v(st->hints.taken - st->hints.predictions);
      d["expert_predictions"] = v(st->hints.predictions);
      d["expert_hints_ignored"] = v(st->hints.refused);
      if (s.expert_keys > 0) {
        // Where its expert cache learns which experts are hot: a unit that
        // is in takes no fault, so without hints or sampling it sees misses
        // only (docs/streaming.md).
        d["resident_touches"] = v(s.resident_touches);
        const bool hinted = st->hints.taken > st->hints.predictions;
        const char* source = hinted ? "expert hints" : "faults";
        d["access_source"] = v(std::string(source));
        d["access_source_why"] = v(access_source_why(source));
      }
    }
  }
  return d;
}

dbus::Dict to_dict(const PoolStatus& p) {
  dbus::Dict d;
  d["target_bytes"] = v(p.target_bytes);
  if (!p.local) return d;
  const auto& l = *p.local;
  const auto& c = l.counts;
  d["backend"] = v(l.backend);
  d["numa"] = v(l.numa);
  d["total_pages"] = v(c.total_pages());
  d["total_bytes"] = v(c.total_bytes());
  d["free_bytes"] = v(c.free_bytes());
  d["model_bytes"] = v(c.model_bytes());
  d["kv_bytes"] = v(c.kv_bytes());
  d["free_pages"] = v(c.free_pages);
  d["raised_pages"] = v(l.raised_pages);
  d["model_pages"] = v(c.model_pages);
  d["kv_pages"] = v(c.kv_pages);
  // hugetlb pages are never swapped or reclaimed: pinned by construction.
  // shmem pages are pinned only where mlock worked: say so as it is.
  d["pinned"] = v(l.unpinned.empty());
  d["pinned_how"] = v(l.backend == "hugetlbfs" ? std::string("hugetlb pages: never swapped or reclaimed")
                      : l.unpinned.empty()
                          ? std::string("shmem pages locked with mlock: unevictable")
                          : fmt::format("NOT all pinned: mlock failed for model(s) {} (RLIMIT_MEMLOCK? "
                                        "LimitMEMLOCK=infinity or CAP_IPC_LOCK): their pages may be swapped",
                                        fmt::join(l.unpinned, ", ")));
  if (const auto& k = l.kernel) {
    d["kernel_hugepages_total"] = v(k->total);
    d["kernel_hugepages_free"] = v(k->free);
    d["kernel_hugepages_rsvd"] = v(k->reserved);
    d["kernel_hugepages_surp"] = v(k->surplus);
    d["files_pages"] = v(k->files_pages);
    if (k->shmem_bytes) d["kernel_shmem_bytes"] = v(*k->shmem_bytes);
    if (k->mlocked_bytes) d["kernel_mlocked_bytes"] = v(*k->mlocked_bytes);
  }
  return d;
}

dbus::Dict to_dict(const KvStatus& k) {
  const auto& t = k.totals;
  dbus::Dict d;
  d["sessions"] = v(t.sessions);
  d["committed_bytes"] = v(t.committed_bytes);
  d["used_bytes"] = v(t.used_bytes);
  d["cached_bytes"] = v(t.cached_bytes);
  d["free_bytes"] = v(t.free_bytes);
  d["waste_bytes"] = v(t.waste_bytes());
  d["shared_blocks"] = v(t.shared_blocks);
  d["arena_repairs"] = v(k.arena_repairs);
  d["arenas_closed"] = v(k.arenas_closed);
  d["waste_ratio"] = v(t.committed_bytes ? static_cast<double>(t.waste_bytes()) / static_cast<double>(t.committed_bytes)
                                         : 0.0);
  dbus::Dict sp;
  sp["enabled"] = v(k.spill.has_value());
  if (const auto& s = k.spill) {
    const SpillStats& st = s->stats;
    sp["dir"] = v(s->dir);
    sp["used_bytes"] = v(st.used_bytes);
    sp["limit_bytes"] = v(st.limit_bytes);
    sp["entries"] = v(st.entries);
    sp["hits"] = v(st.hits);
    sp["misses"] = v(st.misses);
    sp["rejected"] = v(st.rejected);
    sp["written_bytes"] = v(st.written_bytes);
    sp["read_bytes"] = v(st.read_bytes);
    sp["dropped"] = v(st.dropped);
    sp["inflight_bytes"] = v(st.inflight_bytes);
  }
  d["spill"] = v(sp);
  return d;
}

dbus::Dict to_dict(const PressureStatus& p) {
  dbus::Dict d;
  d["source"] = v(p.source);
  d["why"] = v(p.why);
  d["level"] = v(policy::to_string(p.level));
  d["raw_level"] = v(policy::to_string(p.raw_level));
  d["level_for_ms"] = v(p.level_for_ms);
  if (const auto& psi = p.psi) {
    d["some_avg10"] = v(psi->some.avg10);
    d["some_avg60"] = v(psi->some.avg60);
    d["full_avg10"] = v(psi->full.avg10);
    d["full_avg60"] = v(psi->full.avg60);
    d["some_total_us"] = v(psi->some.total_us);
    d["full_total_us"] = v(psi->full.total_us);
  }
  if (p.source_mem_available) d["source_mem_available"] = v(*p.source_mem_available);
  d["some_events"] = v(p.some_events);
  d["full_events"] = v(p.full_events);
  d["spurious_events"] = v(p.spurious_events);
  d["level_changes"] = v(p.level_changes);
  d["samples"] = v(p.samples);
  d["source_errors"] = v(p.source_errors);
  if (!p.source_last_error.empty()) d["source_last_error"] = v(p.source_last_error);
  d["decision"] = v(p.decision);
  d["damon"] = v(p.damon);
  const auto& c = p.counters;
  d["evictions"] = v(c.evictions);
  d["admin_evictions"] = v(c.admin_evictions);
  d["actions"] = v(c.actions);
  d["action_errors"] = v(c.action_errors);
  d["evicted_bytes"] = v(c.evicted_bytes);
  d["evicted_cached_bytes"] = v(c.evicted_cached_bytes);
  d["evicted_kv_bytes"] = v(c.evicted_kv_bytes);
  d["evicted_model_bytes"] = v(c.evicted_model_bytes);
  d["reserve_returned_bytes"] = v(c.reserve_bytes);
  d["returned_bytes"] = v(c.returned_bytes);
  d["grows"] = v(c.grows);
  d["grown_bytes"] = v(c.grown_bytes);
  d["resize_failures"] = v(c.resize_failures);
  d["last_resize_error"] = v(p.last_resize_error);
  d["last_eviction_us"] = v(p.last_eviction_us);
  d["max_eviction_us"] = v(p.max_eviction_us);
  d["resize_pool"] = v(p.resize_pool);
  d["pool_target_bytes"] = v(p.pool_target_bytes);
  d["pool_current_bytes"] = v(p.pool_current_bytes);
  d["floor_bytes"] = v(p.floor_bytes);
  d["target_some_bytes"] = v(p.target_some_bytes);
  d["target_full_bytes"] = v(p.target_full_bytes);
  std::vector<dbus::Dict> last;
  for (const auto& r : p.last_evictions) {
    dbus::Dict e;
    e["age_ms"] = v(r.age_ms);
    e["trigger"] = v(r.trigger);
    e["kind"] = v(r.kind);
    e["object"] = v(r.object);
    e["bytes"] = v(r.bytes);
    e["reason"] = v(r.reason);
    last.push_back(std::move(e));
  }
  d["last_evictions"] = v(last);
  return d;
}

dbus::Dict to_dict(const BusStatus& b) {
  dbus::Dict d;
  d["address"] = v(b.address);
  d["state"] = v(b.state);
  d["unique_name"] = v(b.unique_name);
  d["state_for_ms"] = v(b.state_for_ms);
  d["losses"] = v(b.losses);
  d["failed_attempts"] = v(b.failed_attempts);
  d["last_loss"] = v(b.last_loss);
  d["last_error"] = v(b.last_error);
  d["last_offline_ms"] = v(b.last_offline_ms);
  d["lost_owners"] = v(b.lost_owners);
  return d;
}

dbus::Dict to_dict(const StatusSnapshot& s) {
  dbus::Dict d;
  d["version"] = v(s.version);
  d["profile"] = v(s.profile);
  d["uptime_s"] = v(s.uptime_s);
  d["loop_wakeups"] = v(s.loop_wakeups);
  d["page_size"] = v(s.page_size);
  d["mode"] = v(s.mode);
  d["mode_reason"] = v(s.mode_reason);
  d["advice"] = v(s.advice);
  d["read_error"] = v(s.read_error);
  dbus::Dict caps;
  for (const auto& [k, val] : s.capabilities) caps[k] = v(val);
  d["capabilities"] = v(caps);
  if (s.mem_available) d["mem_available"] = v(*s.mem_available);
  d["pool"] = v(to_dict(s.pool));
  std::vector<dbus::Dict> models;
  for (const auto& m : s.models) models.push_back(to_dict(m));
  d["models"] = v(models);
  d["keep_alive_s"] = v(s.keep_alive_s);
  d["bus"] = v(to_dict(s.bus));
  if (s.kv) d["kv"] = v(to_dict(*s.kv));
  if (s.pressure) d["pressure"] = v(to_dict(*s.pressure));
  return d;
}

dbus::Dict to_dict(const SessionStatus& s) {
  dbus::Dict d;
  d["session"] = v(sdbus::ObjectPath(s.path));
  d["owner"] = v(s.owner);
  d["uid"] = v(s.uid);
  d["model"] = v(s.model);
  d["priority"] = v(policy::to_string(s.priority));
  d["blocks"] = v(s.blocks);
  d["shared_blocks"] = v(s.shared_blocks);
  d["tokens"] = v(s.tokens);
  d["idle_s"] = v(s.idle_s);
  d["evicted_blocks"] = v(s.evicted_blocks);
  d["restored_blocks"] = v(s.restored_blocks);
  // Negative: not measured (no current report), ranked by last use.
  d["access_rate"] = v(s.access_rate.value_or(-1.0));
  d["access_reports"] = v(s.access_reports);
  d["access_reports_refused"] = v(s.access_reports_refused);
  return d;
}

std::vector<dbus::Dict> to_dicts(const std::vector<SessionStatus>& sessions) {
  std::vector<dbus::Dict> out;
  out.reserve(sessions.size());
  for (const auto& s : sessions) out.push_back(to_dict(s));
  return out;
}

dbus::Dict to_dict(const SessionGeometry& g) {
  dbus::Dict d;
  d["block_bytes"] = v(static_cast<uint32_t>(g.geo.block_bytes));
  d["tokens_per_block"] = v(g.geo.tokens_per_block);
  d["bytes_per_token"] = v(g.geo.bytes_per_token);
  d["arena_bytes"] = v(g.arena_bytes);
  d["chunk_bytes"] = v(g.geo.chunk_bytes);
  d["blocks_per_chunk"] = v(g.geo.blocks_per_chunk);
  d["kv_type"] = v(g.kv_type);
  return d;
}

dbus::Dict to_dict(const OpenInfo& o) {
  dbus::Dict d;
  d["mode"] = v(o.mode);
  d["resident"] = v(o.resident);
  d["unit_size"] = v(o.unit_size);
  d["file_size"] = v(o.file_size);
  d["name"] = v(o.name);
  d["layers"] = v(o.layers);
  d["lazy"] = v(o.lazy);
  d["streamed"] = v(o.streamed);
  d["expert_hints"] = v(o.expert_hints);
  return d;
}

dbus::Dict to_dict(const Models::Residency& r) {
  std::vector<uint32_t> rank, units, ready, in_flight, closing;
  for (const auto& x : r.ranks) {
    rank.push_back(x.rank);
    units.push_back(x.units);
    ready.push_back(x.ready);
    in_flight.push_back(x.in_flight);
    closing.push_back(x.closing);
  }
  dbus::Dict d;
  d["rank"] = v(std::move(rank));
  d["units"] = v(std::move(units));
  d["ready"] = v(std::move(ready));
  d["in_flight"] = v(std::move(in_flight));
  d["closing"] = v(std::move(closing));
  d["unit_size"] = v(r.unit_size);
  d["streamed"] = v(r.streamed);
  d["budget_bytes"] = v(r.budget_bytes);
  return d;
}

dbus::Dict to_dict(const PressureChange& c) {
  dbus::Dict d;
  d["previous"] = v(policy::to_string(c.previous));
  d["raw"] = v(policy::to_string(c.raw));
  d["source"] = v(c.source);
  if (const auto& psi = c.psi) {
    d["some_avg10"] = v(psi->some.avg10);
    d["full_avg10"] = v(psi->full.avg10);
  }
  return d;
}

Result<EvictWhat> evict_what_from_dict(const dbus::Dict& what) {
  for (const auto& [k, val] : what) {
    if (k != "priority" && k != "session" && k != "model" && k != "bytes")
      return make_error(EINVAL, "Evict: unknown key '{}' (accepted: priority, session, model, bytes)", k);
  }
  // A path as o or s; another type reads as "" (no such object).
  auto path_of = [&](const char* key) {
    if (auto o = dbus::get<sdbus::ObjectPath>(what, key)) return std::string(*o);
    return dbus::get<std::string>(what, key).value_or("");
  };
  EvictWhat w;
  if (what.count("priority")) {
    auto s = dbus::get<std::string>(what, "priority");
    auto p = s ? policy::parse_priority(*s) : std::nullopt;
    if (!p)
      return make_error(EINVAL, "Evict: priority must be a string, one of interactive, system, background (got '{}')",
                        s.value_or("a non-string"));
    w.priority = *p;
  }
  if (what.count("session")) w.session = path_of("session");
  if (what.count("model")) w.model = path_of("model");
  if (what.count("bytes")) w.bytes = dbus::get<uint64_t>(what, "bytes").value_or(0);
  return w;
}

dbus::Dict to_dict(const EvictionReport& r) {
  dbus::Dict d;
  d["dry_run"] = v(r.dry_run);
  d["trigger"] = v(r.trigger);
  d["requested_bytes"] = v(r.requested_bytes);
  d["planned_bytes"] = v(r.plan.bytes);
  d["freed_bytes"] = v(r.freed_bytes);
  d["reserve_bytes"] = v(r.reserve_bytes);
  d["returned_bytes"] = v(r.returned_bytes);
  d["satisfied"] = v(r.plan.satisfied);
  d["shortfall"] = v(r.plan.shortfall);
  d["resize_note"] = v(r.resize_note);
  d["duration_us"] = v(r.duration_us);
  std::vector<dbus::Dict> actions;
  for (const auto& o : r.outcomes) {
    dbus::Dict a;
    a["kind"] = v(action_kind_name(o.action.kind));
    a["object"] = v(o.object);
    a["id"] = v(o.action.id);
    a["blocks"] = v(o.action.blocks);
    a["bytes"] = v(o.action.bytes);
    a["freed_bytes"] = v(o.freed_bytes);
    a["reason"] = v(o.action.reason);
    a["error"] = v(o.error);
    actions.push_back(std::move(a));
  }
  d["actions"] = v(actions);
  return d;
}

}  // namespace airs::daemon
