// SPDX-License-Identifier: Apache-2.0
// The bus edge's one translation of the daemon's typed state into D-Bus
// a{sv} dictionaries (daemon/status.hpp in, dbus::Dict out). Pure: no I/O,
// no daemon state. Every key and its signature is listed here; airsctl, the
// client library and the tests read them, so a key is renamed only with all
// of its readers (tests/integration/daemon_core/bus_dicts_test.cpp checks
// each dictionary's keys and signatures exactly).
#pragma once

#include <vector>

#include "daemon/models.hpp"
#include "daemon/pressure_loop.hpp"
#include "daemon/status.hpp"
#include "dbus/variant.hpp"

namespace airs::daemon {

// The model's load state as status and Model.State say it: "loading",
// "resident", "evicted", "failed", "unloaded"; "unknown" without stats.
[[nodiscard]] std::string model_state_name(const std::optional<pager::ModelStats>& stats);

// One model (status "models" and ListModels): name s, object o, size t,
// owner_uid u, sessions u, preloaded b, state s, adopted b, content_id s,
// refcount u, clients u, pinned b, layers t, tensors t; with the pager's
// stats also resident_bytes t, pin_failed b, region_bytes t, bytes_read t,
// read_mb_per_s d, direct_io b, faults t, faults_waited t, units_failed u.
[[nodiscard]] dbus::Dict to_dict(const ModelStatus& m);

// Status "pool": target_bytes t; with a local pool also backend s, numa s,
// total_pages t, total_bytes t, free_bytes t, model_bytes t, kv_bytes t,
// free_pages t, raised_pages t, model_pages t, kv_pages t, pinned b,
// pinned_how s; with the kernel's view also kernel_hugepages_total t,
// kernel_hugepages_free t, kernel_hugepages_rsvd t, kernel_hugepages_surp t,
// files_pages t, and where known kernel_shmem_bytes t, kernel_mlocked_bytes t.
[[nodiscard]] dbus::Dict to_dict(const PoolStatus& p);

// Status "kv": sessions u, committed_bytes t, used_bytes t, cached_bytes t,
// free_bytes t, waste_bytes t, shared_blocks u, arena_repairs t,
// arenas_closed t, waste_ratio d, spill a{sv}
// {enabled b; when enabled also dir s, used_bytes t, limit_bytes t,
// entries t, hits t, misses t, rejected t, written_bytes t, read_bytes t,
// dropped t, inflight_bytes t}.
[[nodiscard]] dbus::Dict to_dict(const KvStatus& k);

// Status "pressure": source s, why s, level s, raw_level s, level_for_ms t;
// with PSI some_avg10 d, some_avg60 d, full_avg10 d, full_avg60 d,
// some_total_us t, full_total_us t; source_mem_available t where polled;
// some_events t, full_events t, spurious_events t, level_changes t,
// samples t, source_errors t, source_last_error s (only when set),
// decision s, damon s, evictions t, admin_evictions t, actions t,
// action_errors t, evicted_bytes t, evicted_cached_bytes t,
// evicted_kv_bytes t, evicted_model_bytes t, reserve_returned_bytes t,
// returned_bytes t, grows t, grown_bytes t, resize_failures t,
// last_resize_error s, last_eviction_us t, max_eviction_us t,
// resize_pool b, pool_target_bytes t, pool_current_bytes t, floor_bytes t,
// target_some_bytes t, target_full_bytes t, last_evictions aa{sv} of
// {age_ms t, trigger s, kind s, object s, bytes t, reason s}.
[[nodiscard]] dbus::Dict to_dict(const PressureStatus& p);

// Status "bus": address s, state s ("connected", "waiting", "lost"),
// unique_name s, state_for_ms t, losses t, failed_attempts t,
// last_loss s, last_error s, last_offline_ms t, lost_owners u.
[[nodiscard]] dbus::Dict to_dict(const BusStatus& b);

// GetStatus: version s, profile s, uptime_s t, page_size t, mode s,
// mode_reason s, advice as, read_error s, capabilities a{sv} (of s),
// pool a{sv}, mem_available t (when readable), models aa{sv},
// keep_alive_s t, bus a{sv}, and with a local pool kv a{sv} and
// pressure a{sv}.
[[nodiscard]] dbus::Dict to_dict(const StatusSnapshot& s);

// ListSessions entry: session o, owner s, uid u, model s, priority s,
// blocks u, shared_blocks u, tokens u, idle_s d, evicted_blocks t,
// restored_blocks t.
[[nodiscard]] dbus::Dict to_dict(const SessionStatus& s);
[[nodiscard]] std::vector<dbus::Dict> to_dicts(const std::vector<SessionStatus>& sessions);

// CreateSession's geometry: block_bytes u, tokens_per_block u,
// bytes_per_token t, arena_bytes t, chunk_bytes t, blocks_per_chunk u,
// kv_type s.
[[nodiscard]] dbus::Dict to_dict(const SessionGeometry& g);

// Open's and OpenLazy's info: mode s, resident b, unit_size t, file_size t,
// name s, layers t, lazy b.
[[nodiscard]] dbus::Dict to_dict(const OpenInfo& o);
// Model.Residency: rank, units, ready, in_flight, closing (au, one entry per
// load rank), unit_size t, streamed b, budget_bytes t.
[[nodiscard]] dbus::Dict to_dict(const Models::Residency& r);

// PressureChanged's details: previous s, raw s, source s; with PSI
// some_avg10 d, full_avg10 d.
[[nodiscard]] dbus::Dict to_dict(const PressureChange& c);

// Evict's `what`: "priority" s, "session" o|s, "model" o|s (path or name),
// "bytes" t. EINVAL for any other key and for a priority that is not one of
// interactive, system, background; the rest is checked by admin_evict.
[[nodiscard]] Result<EvictWhat> evict_what_from_dict(const dbus::Dict& what);

// Evict's report: dry_run b, trigger s, requested_bytes t, planned_bytes t,
// freed_bytes t, reserve_bytes t, returned_bytes t, satisfied b,
// shortfall s, resize_note s, duration_us t, actions aa{sv} of {kind s,
// object s, id t, blocks u, bytes t, freed_bytes t, reason s, error s}.
[[nodiscard]] dbus::Dict to_dict(const EvictionReport& r);

}  // namespace airs::daemon
