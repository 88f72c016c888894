// Prometheus text-format metrics for node_exporter's textfile collector:
// written atomically (temp file + rename) to daemon.metrics_file every
// daemon.metrics_interval.
#pragma once

#include <string>

#include "dbus/variant.hpp"
#include "pager/pager.hpp"

namespace airs::daemon {

// The exposition text for a status dictionary (see Daemon::status()) plus
// each model's fault-latency histograms. Pure: no I/O.
[[nodiscard]] std::string format_metrics(const dbus::Dict& status,
                                         const std::vector<std::pair<std::string, pager::ModelStats>>& models);

// Writes `text` to `path` atomically. Errors name the path.
[[nodiscard]] Status write_metrics_file(const std::string& path, const std::string& text);

}  // namespace airs::daemon
