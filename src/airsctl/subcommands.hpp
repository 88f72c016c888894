// SPDX-License-Identifier: Apache-2.0
// One function per subcommand file; main.cpp calls each to register it.
#pragma once

#include <CLI/CLI.hpp>

#include "airsctl/common.hpp"

namespace airs::cli {

void add_status(CLI::App& app, Globals& g);
void add_inspect(CLI::App& app, Globals& g);
void add_evict(CLI::App& app, Globals& g);
void add_load(CLI::App& app, Globals& g);
void add_read(CLI::App& app, Globals& g);
void add_sessions(CLI::App& app, Globals& g);
void add_residency(CLI::App& app, Globals& g);

}  // namespace airs::cli
