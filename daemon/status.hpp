// SPDX-License-Identifier: Apache-2.0
// The daemon's state as plain structs: what GetStatus, ListModels,
// ListSessions, PressureChanged, CreateSession's geometry and the metrics
// file say. The core fills these; only daemon/bus_dicts.cpp turns them into
// D-Bus a{sv} dictionaries (its header lists every key), and
// daemon/metrics.cpp into Prometheus text. A field that is not set here is
// a compile error, not a silent 0 read back by key.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "daemon/kv_spill.hpp"
#include "kv/allocator.hpp"
#include "kv/geometry.hpp"
#include "pager/pager.hpp"
#include "policy/policy.hpp"
#include "pool/accounting.hpp"
#include "pool/backend.hpp"
#include "sys/psi.hpp"

namespace airs::daemon {

// One loaded model.
struct ModelStatus {
  std::string name;
  std::string object;  // its object path
  uint64_t size = 0;   // the GGUF's bytes
  uint32_t owner_uid = 0;
  uint32_t sessions = 0;  // KV sessions open on it
  bool preloaded = false;  // a models.preload entry
  bool adopted = false;    // its filled region came from the previous daemon
  std::string content_id;  // hex; empty until known
  uint32_t refcount = 0;
  uint32_t clients = 0;  // attached mappings
  bool pinned = false;
  uint64_t layers = 0;
  uint64_t tensors = 0;
  // The pager's view (none: the pager does not know the model: state "unknown").
  std::optional<pager::ModelStats> stats;
};

// The pool, when there is one (the cloud-only profile has none).
struct LocalPoolStatus {
  std::string backend;  // "hugetlbfs" or "shmem"
  std::string numa;     // the NUMA policy and the nodes it uses
  pool::PoolCounts counts;
  uint64_t raised_pages = 0;  // nr_hugepages the daemon added itself
  std::vector<std::string> unpinned;  // models with a unit mlock failed for (shmem)
  std::optional<pool::KernelView> kernel;  // none: the kernel's numbers were not readable
};

struct PoolStatus {
  uint64_t target_bytes = 0;  // the profile's pool size
  std::optional<LocalPoolStatus> local;
};

struct SpillTierStatus {
  std::string dir;
  SpillStats stats;
};

struct KvStatus {
  kv::KvStats totals;
  std::optional<SpillTierStatus> spill;  // none: the tier is off
  uint64_t arena_repairs = 0;  // arenas a client had resized or filled beyond its pages, put back
  uint64_t arenas_closed = 0;  // arenas cut by a client more than KvService::kCutRepairs times: closed, not refilled
};

// One KV session (ListSessions).
struct SessionStatus {
  std::string path;
  std::string owner;  // bus unique name of the creator
  uint32_t uid = 0;
  std::string model;
  policy::Priority priority = policy::Priority::Background;
  uint32_t blocks = 0;
  uint32_t shared_blocks = 0;
  uint32_t tokens = 0;
  double idle_s = 0;
  uint64_t evicted_blocks = 0;
  uint64_t restored_blocks = 0;
  // The share of its KV pages read per second, from its client's access
  // sampling (libairs); none while no current report says.
  std::optional<double> access_rate;
  uint64_t access_reports = 0;
  bool access_reports_refused = false;  // it sent a malformed one: no more are read
};

// CreateSession's geometry.
struct SessionGeometry {
  kv::KvGeometry geo;
  uint64_t arena_bytes = 0;
  std::string kv_type;
};

// The pressure loop's counters (since start).
struct PressureCounters {
  uint64_t evictions = 0;        // runs that executed at least one action or returned reserve pages
  uint64_t admin_evictions = 0;
  uint64_t actions = 0;
  uint64_t action_errors = 0;
  uint64_t evicted_bytes = 0;    // pool pages freed by actions
  uint64_t evicted_cached_bytes = 0;
  uint64_t evicted_kv_bytes = 0;
  uint64_t evicted_model_bytes = 0;
  uint64_t reserve_bytes = 0;    // free reserve handed back
  uint64_t returned_bytes = 0;   // to the kernel, all causes
  uint64_t grows = 0;
  uint64_t grown_bytes = 0;
  uint64_t resize_failures = 0;  // shrinks or grows the kernel did not (fully) do
};

// One remembered eviction action, newest first in PressureStatus.
struct RecentEviction {
  uint64_t age_ms = 0;
  std::string trigger;
  std::string kind;  // "cached-kv", "kv-blocks", "model"
  std::string object;
  uint64_t bytes = 0;  // freed
  std::string reason;
};

struct PressureStatus {
  std::string source;  // pressure::to_string(Source)
  std::string why;
  policy::Level level = policy::Level::None;      // effective (after the governor)
  policy::Level raw_level = policy::Level::None;  // the source's
  uint64_t level_for_ms = 0;
  std::optional<sys::PsiStats> psi;
  std::optional<uint64_t> source_mem_available;  // the meminfo poller's reading
  uint64_t some_events = 0;
  uint64_t full_events = 0;
  uint64_t spurious_events = 0;
  uint64_t level_changes = 0;
  uint64_t samples = 0;
  uint64_t source_errors = 0;
  std::string source_last_error;  // empty: none
  std::string decision;
  std::string damon;
  PressureCounters counters;
  std::string last_resize_error;
  uint64_t last_eviction_us = 0;
  uint64_t max_eviction_us = 0;
  bool resize_pool = false;
  uint64_t pool_target_bytes = 0;
  uint64_t pool_current_bytes = 0;
  uint64_t floor_bytes = 0;
  uint64_t target_some_bytes = 0;
  uint64_t target_full_bytes = 0;
  std::vector<RecentEviction> last_evictions;  // newest first
};

// PressureChanged's details.
struct PressureChange {
  policy::Level previous = policy::Level::None;
  policy::Level raw = policy::Level::None;
  std::string source;
  std::optional<sys::PsiStats> psi;
};

// Model.Open's and OpenLazy's info.
struct OpenInfo {
  std::string mode;  // the daemon's mode: how the client maps the region
  bool resident = false;
  uint64_t unit_size = 0;
  uint64_t file_size = 0;
  std::string name;
  uint64_t layers = 0;
  bool lazy = false;
  bool streamed = false;  // bigger than its budget of the pool: never resident
  bool expert_hints = false;  // a streamed mixture of experts: takes expert hints
};

// What Manager.Evict is asked to evict (each part narrows it).
struct EvictWhat {
  std::optional<policy::Priority> priority;
  std::optional<std::string> session;  // object path; "" if the bus gave another type
  std::optional<std::string> model;    // object path or name; "" if of another type
  std::optional<uint64_t> bytes;       // 0 if of another type (refused, as 0 is)
};

// The daemon's connection to its bus, which it keeps across the bus going
// away (daemon/bus_link.hpp).
struct BusStatus {
  std::string address;            // as configured: "system", "session" or a D-Bus address
  std::string state;              // "connected"; "waiting": not connected yet since start; "lost"
  std::string unique_name;        // while connected
  uint64_t state_for_ms = 0;      // since the state last changed
  uint64_t losses = 0;            // connections lost since start
  uint64_t failed_attempts = 0;   // attempts that failed since the last connection
  std::string last_loss;          // why the connection was last lost; empty: never
  std::string last_error;         // why the last attempt to connect failed; empty: none
  uint64_t last_offline_ms = 0;   // how long the last loss lasted, once reconnected (0: none yet)
  // Connections of a lost bus whose sessions and model references are kept
  // while their processes live (their unique names died with that bus).
  uint32_t lost_owners = 0;
};

// GetStatus; the metrics file is made from the same snapshot.
struct StatusSnapshot {
  std::string version;
  std::string profile;
  uint64_t uptime_s = 0;
  uint64_t loop_wakeups = 0;  // the main loop's epoll_wait returns since start
  uint64_t page_size = 0;
  std::string mode;
  std::string mode_reason;
  std::vector<std::string> advice;
  std::string read_error;  // "poison" or "sigbus"
  std::map<std::string, std::string> capabilities;
  PoolStatus pool;
  std::optional<uint64_t> mem_available;  // none: /proc/meminfo unreadable
  std::vector<ModelStatus> models;
  uint64_t keep_alive_s = 0;
  std::optional<KvStatus> kv;               // none without a local pool
  std::optional<PressureStatus> pressure;   // none without a local pool
  BusStatus bus;
};

}  // namespace airs::daemon
