// Prometheus text format (exposition format 0.0.4) for airs-memd's state,
// written to a file for node_exporter's textfile collector
// (daemon.metrics_file). Pure: the caller fills plain structs from the pool,
// models, KV service, pressure monitor and pager, and writes the text.
//
// Metric families (all prefixed airs_; bytes and seconds as base units):
//   airs_info{version,profile,mode,backend}            gauge 1
//   airs_up_seconds                                     gauge
//   airs_pool_bytes{state="total|free|models|kv"}       gauge
//   airs_pool_page_bytes                                gauge
//   airs_pool_pinned                                    gauge 0/1
//   airs_pool_resize_pages_total{direction="shrink|grow"} counter
//   airs_models                                         gauge
//   airs_model_bytes{model,kind="size|resident"}        gauge
//   airs_model_refcount{model}                          gauge
//   airs_model_pinned{model}                            gauge 0/1
//   airs_kv_sessions                                    gauge
//   airs_kv_bytes{state="used|cached|free"}             gauge
//   airs_pressure_level{level}                          gauge 1 for the current level
//   airs_pressure_stall_ratio{kind="some|full"}         gauge (avg10 / 100)
//   airs_pressure_events_total{kind="some|full"}        counter
//   airs_evictions_total{reason}                        counter
//   airs_evicted_bytes_total                            counter
//   airs_fault_latency_seconds                          histogram
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace airs::metrics {

struct PoolSample {
  uint64_t page_bytes = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t model_bytes = 0;
  uint64_t kv_bytes = 0;
  bool pinned = false;
  uint64_t shrunk_pages_total = 0;  // pages handed back to the kernel since start
  uint64_t grown_pages_total = 0;   // pages taken again since start
};

struct ModelSample {
  std::string name;
  uint64_t size_bytes = 0;
  uint64_t resident_bytes = 0;
  uint32_t refcount = 0;
  bool pinned = false;
};

struct KvSample {
  uint32_t sessions = 0;
  uint64_t used_bytes = 0;
  uint64_t cached_bytes = 0;
  uint64_t free_bytes = 0;
};

struct PressureSample {
  std::string level;            // "none" | "some" | "full" (the daemon's names)
  double some_avg10 = 0.0;      // percent, as in /proc/pressure/memory
  double full_avg10 = 0.0;
  uint64_t some_events_total = 0;
  uint64_t full_events_total = 0;
};

// Cumulative histogram as Prometheus wants it: counts[i] = observations
// <= upper_bounds_seconds[i] (non-decreasing); count = all observations
// (the +Inf bucket).
struct Histogram {
  std::vector<double> upper_bounds_seconds;  // strictly increasing, finite
  std::vector<uint64_t> counts;               // same size, cumulative
  uint64_t count = 0;
  double sum_seconds = 0.0;
};

struct Snapshot {
  std::string version;
  std::string profile;
  std::string mode;     // full | small-pages | cooperative | cloud-only
  std::string backend;  // hugetlbfs | shmem | none
  double up_seconds = 0.0;
  PoolSample pool;
  std::vector<ModelSample> models;
  KvSample kv;
  PressureSample pressure;
  std::map<std::string, uint64_t> evictions_total;  // by reason
  uint64_t evicted_bytes_total = 0;
  Histogram fault_latency;
};

// The whole exposition for `s`: HELP and TYPE lines, then samples, one
// family after the other in the order above, models in the given order,
// label values escaped (\\, \", \n), ending in a newline.
// Precondition (checked, not assumed): the histogram's bounds and counts
// have the same size, bounds strictly increasing and counts non-decreasing
// and <= count; otherwise the histogram family is left out and the text
// carries a comment naming the defect (the rest is still written: a metrics
// bug must not blank the operator's dashboard).
// Thread: any (no shared state); no I/O.
[[nodiscard]] std::string format_prometheus(const Snapshot& s);

// A label value escaped per the exposition format.
[[nodiscard]] std::string escape_label_value(const std::string& v);

}  // namespace airs::metrics
