// airsctl: the operator's tool for airs-memd. Wiring only; each subcommand
// is in its own file.
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
  CLI11_PARSE(app, argc, argv);
  return 0;
}
