// Prometheus text-format metrics for node_exporter's textfile collector:
// written atomically (temp file + rename) to daemon.metrics_file every
// daemon.metrics_interval.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "daemon/pressure_loop.hpp"
#include "kv/allocator.hpp"
#include "pager/pager.hpp"
#include "pool/accounting.hpp"

namespace airs::daemon {

// What the metrics say, typed (no dictionary lookups that could miss).
struct MetricsSnapshot {
  pool::PoolCounts pool;
  uint64_t mem_available = 0;
  struct Model {
    std::string name;
    uint64_t size = 0;
    uint32_t refcount = 0;
    pager::ModelStats stats;
  };
  std::vector<Model> models;
  kv::KvStats kv;
  std::optional<PressureLoop::Metrics> pressure;
};

// The exposition text. Pure: no I/O.
[[nodiscard]] std::string format_metrics(const MetricsSnapshot& s);

// Writes `text` to `path` atomically. Errors name the path.
[[nodiscard]] Status write_metrics_file(const std::string& path, const std::string& text);

}  // namespace airs::daemon
