// SPDX-License-Identifier: Apache-2.0
// Prometheus text-format metrics for node_exporter's textfile collector:
// written atomically (temp file + rename) to daemon.metrics_file every
// daemon.metrics_interval.
#pragma once

#include <string>

#include "daemon/status.hpp"
#include "util/result.hpp"

namespace airs::daemon {

// The exposition text of the status snapshot (the metrics say a part of
// what GetStatus says, from the same typed fields). Pure: no I/O.
[[nodiscard]] std::string format_metrics(const StatusSnapshot& s);

// Writes `text` to `path` atomically. Errors name the path.
[[nodiscard]] Status write_metrics_file(const std::string& path, const std::string& text);

}  // namespace airs::daemon
