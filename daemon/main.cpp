// SPDX-License-Identifier: Apache-2.0
// airs-memd: the model-memory daemon. Wiring only: parse the command line,
// load and validate the configuration, build the Daemon, run its loop.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "config/config.hpp"
#include "daemon/daemon.hpp"
#include "sys/files.hpp"
#include "sys/numa.hpp"
#include "sys/procfs.hpp"
#include "util/log.hpp"

namespace {

// What config::check_machine checks against, read from this host. A fact
// that cannot be read stays unknown (that check is skipped; the daemon's
// start reports the real failure).
airs::config::MachineFacts read_machine_facts() {
  airs::config::MachineFacts m;
  if (auto mi = airs::sys::read_meminfo(); mi && mi->count("MemTotal")) m.mem_total = mi->at("MemTotal");
  if (auto nodes = airs::sys::read_node_list(airs::sys::kNodeHasMemory)) m.nodes_with_memory = *nodes;
  m.check_file = [](const std::string& path) { return airs::sys::check_readable_file(path); };
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"airs-memd — huge-page model pool, lazy GGUF loading and paged KV cache for on-device LLM inference"};
  std::string config_path = "/etc/airs/airs-memd.conf";
  std::string dropin_dir;
  std::string bus;
  std::string log_level;
  std::string state_dir;
  bool check_config = false;
  app.add_option("-c,--config", config_path, "Configuration file")->capture_default_str();
  app.add_option("--config-dir", dropin_dir, "Drop-in directory (default: <config>.d)");
  app.add_option("--bus", bus, "D-Bus to serve on: system, session, or an address (overrides daemon.bus)");
  app.add_option("--log-level", log_level, "trace, debug, info, warning, error (overrides daemon.log_level)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warning", "error"}));
  app.add_option("--state-dir", state_dir, "Directory for what outlives the daemon (overrides daemon.state_dir)");
  app.add_flag("--check-config", check_config, "Validate the configuration, print the effective one, and exit");
  app.set_version_flag("--version", std::string("airs-memd ") + AIRS_VERSION);
  // Exit status (airs-memd(8)): 0 stopped cleanly or --check-config,
  // --help, --version; 1 start-up or event loop failure; 2 usage error (the
  // command line or the configuration is rejected; CLI11 alone would exit
  // 105-109 for the command line).
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // help and version to stdout, errors to stderr
    return rc == 0 ? 0 : 2;
  }

  if (dropin_dir.empty()) dropin_dir = config_path + ".d";
  // The shipped default path may be absent (nothing installed yet): defaults
  // apply then. An explicitly given file must exist.
  const bool explicit_config = app.count("--config") > 0;
  auto cfg = airs::config::load(config_path, dropin_dir, !explicit_config);
  if (!cfg) {
    std::fprintf(stderr, "airs-memd: configuration: %s\n", cfg.error().message.c_str());
    return 2;
  }
  if (app.count("--state-dir") > 0) {
    cfg->daemon.state_dir = state_dir;
    if (auto st = airs::config::validate(*cfg); !st) {
      std::fprintf(stderr, "airs-memd: --state-dir: %s\n", st.error().message.c_str());
      return 2;
    }
  }
  // The host-dependent checks (NUMA nodes, pool size against MemTotal,
  // preload files) run for --check-config and at start alike.
  if (auto st = airs::config::check_machine(*cfg, read_machine_facts()); !st) {
    std::fprintf(stderr, "airs-memd: configuration: %s\n", st.error().message.c_str());
    return 2;
  }
  if (check_config) {
    std::printf("# effective configuration (from: %s)\n%s",
                cfg->sources.empty() ? "defaults" : fmt::format("{}", fmt::join(cfg->sources, ", ")).c_str(),
                airs::config::to_toml(*cfg).c_str());
    return 0;
  }
  airs::init_logging("airs-memd", log_level.empty() ? cfg->daemon.log_level : log_level);
  // Every socket write says MSG_NOSIGNAL, and no pipe is written; a log
  // stream whose reader died must not kill the daemon either.
  std::signal(SIGPIPE, SIG_IGN);
  airs::daemon::Options opts{std::move(cfg).value(), bus};
  auto d = airs::daemon::Daemon::create(std::move(opts));
  if (!d) {
    spdlog::critical("{}", d.error().message);
    return 1;
  }
  return (*d)->run();
}
