// SPDX-License-Identifier: Apache-2.0
// Logging set-up shared by airs-memd and the tools. Under systemd (stderr
// connected to the journal, JOURNAL_STREAM set by systemd) lines carry a
// "<N>" syslog priority prefix and no timestamp, which journald turns into
// the entry's priority; on a terminal they get a timestamp and level.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

namespace airs {

// Configures the default spdlog logger. `level` as in the config
// ("trace".."error"); unknown names fall back to info.
void init_logging(std::string_view program, std::string_view level);

}  // namespace airs
