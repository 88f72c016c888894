// SPDX-License-Identifier: Apache-2.0
// airsctl inspect FILE.gguf [--json]: what the daemon would see in a model
// file, without a daemon: tensors, layers, pool footprint, KV per token.
#include "airsctl/inspect.hpp"
#include "airsctl/subcommands.hpp"
#include "sys/procfs.hpp"

namespace airs::cli {

void add_inspect(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("inspect", "Show a GGUF file's tensors, layers, pool footprint and KV geometry");
  struct Args {
    std::string path;
    uint64_t tokens_per_block = 16;
    uint64_t page = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("file", a->path, "GGUF model file")->required();
  cmd->add_option("--tokens-per-block", a->tokens_per_block, "KV block size in tokens")->capture_default_str();
  cmd->add_option("--page-size", a->page, "Huge page size in bytes (default: the kernel's)");
  cmd->callback([&g, a] {
    InspectOptions o;
    o.tokens_per_block = a->tokens_per_block;
    o.huge_page_bytes = a->page;
    if (o.huge_page_bytes == 0) {
      auto m = sys::read_meminfo();
      o.huge_page_bytes = (m && m->count("Hugepagesize")) ? m->at("Hugepagesize") : uint64_t{2} << 20;
    }
    int rc = run_inspect(a->path, g.json, stdout, stderr, o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace airs::cli
