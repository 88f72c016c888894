// SPDX-License-Identifier: Apache-2.0
// airsctl: the operator's tool for airs-memd. Wiring only; each subcommand
// is in its own file.
//
// Exit status (airsctl(1), EXIT STATUS; the same scheme as airs-memd's for
// 0-2): 0 success; 1 failure (daemon unreachable, bad file, daemon error);
// 2 usage error (any command line the parser or a subcommand rejects);
// 3 access denied; 4 no such model, session or tensor; 5 evict could not
// cover the request. Errors go to stderr only; stdout carries results.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "airsctl/subcommands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"airsctl — inspect and control airs-memd"};
  app.require_subcommand(1);
  // Global options (--bus, --json) may also follow the subcommand.
  app.fallthrough();
  airs::cli::Globals g;
  app.add_option("--bus", g.bus, "D-Bus to use: system (default), session, or an address")->capture_default_str();
  app.add_flag("--json", g.json, "Machine-readable output (one JSON document)");
  app.set_version_flag("--version", std::string("airsctl ") + AIRS_VERSION);
  airs::cli::add_status(app, g);
  airs::cli::add_inspect(app, g);
  airs::cli::add_evict(app, g);
  airs::cli::add_load(app, g);
  airs::cli::add_read(app, g);
  airs::cli::add_sessions(app, g);
  airs::cli::add_residency(app, g);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a subcommand's own status; it printed why
  } catch (const CLI::ParseError& e) {
    // --help and --version (status 0) print to stdout; every parse error
    // (CLI11 would exit 105-109) prints its message to stderr and is a
    // usage error.
    const int rc = app.exit(e);
    return rc == 0 ? 0 : airs::cli::kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "airsctl: %s\n", e.what());
    return airs::cli::kExitFailure;
  }
  return 0;
}
