// SPDX-License-Identifier: Apache-2.0
// airsctl load FILE [--name N] [--no-wait]: hand a GGUF to the daemon and
// show the fill with a progress bar (resident / total, MB/s).
// airsctl unload MODEL [--force]: drop a model (root).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "airsctl/common.hpp"
#include "airsctl/subcommands.hpp"
#include "util/text.hpp"
#include "sys/fd.hpp"
#include "sys/files.hpp"

namespace airs::cli {
namespace {

std::optional<dbus::Dict> find_model(dbus::ManagerCalls& mgr, const std::string& object) {
  const dbus::Dict s = mgr.GetStatus();
  auto models = dbus::get<std::vector<dbus::Dict>>(s, "models").value_or(std::vector<dbus::Dict>{});
  for (auto& m : models)
    if (std::string(dbus::get<sdbus::ObjectPath>(m, "object").value_or(sdbus::ObjectPath{})) == object) return m;
  return std::nullopt;
}

}  // namespace

void add_load(CLI::App& app, Globals& g) {
  struct Args {
    std::string path, name;
    bool no_wait = false;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("load", "Load a GGUF model into the pool (lazily) and show its progress");
  cmd->add_option("file", a->path, "GGUF model file")->required();
  cmd->add_option("--name", a->name, "Model name (default: general.name)");
  cmd->add_flag("--no-wait", a->no_wait, "Return once the model is registered, without waiting for it to be resident");
  cmd->callback([&g, a] {
    auto opened = sys::open_file(a->path, O_RDONLY);
    if (!opened) {
      std::fprintf(stderr, "airsctl: %s\n", opened.error().message.c_str());
      throw CLI::RuntimeError(1);
    }
    sys::UniqueFd fd = std::move(opened).value();
    try {
      auto bus = connect(g);
      auto mgr = manager_proxy(*bus);
      dbus::Dict opts;
      if (!a->name.empty()) opts["name"] = sdbus::Variant(a->name);
      const sdbus::ObjectPath path = mgr->LoadModel(sdbus::UnixFd(fd.get()), opts);
      const bool tty = ::isatty(STDOUT_FILENO) != 0 && !g.json;
      auto t0 = std::chrono::steady_clock::now();
      std::optional<dbus::Dict> m;
      for (;;) {
        m = find_model(*mgr, path);
        if (!m) throw sdbus::Error(dbus::kErrNotFound, "the model disappeared while loading");
        const auto state = dbus::get<std::string>(*m, "state").value_or("");
        const uint64_t size = dbus::get<uint64_t>(*m, "region_bytes").value_or(1);
        const uint64_t res = dbus::get<uint64_t>(*m, "resident_bytes").value_or(0);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (tty) {
          const int width = 40;
          const int filled = static_cast<int>(static_cast<double>(width) * static_cast<double>(res) / static_cast<double>(size));
          fmt::print("\r{} [{}{}] {:>5.1f}%  {} / {}  {:.0f} MB/s   ", printable_name(dbus::get<std::string>(*m, "name").value_or("")),
                     std::string(static_cast<size_t>(filled), '#'), std::string(static_cast<size_t>(width - filled), '.'),
                     100.0 * static_cast<double>(res) / static_cast<double>(size), bytes(res), bytes(size),
                     secs > 0 ? static_cast<double>(res) / 1e6 / secs : 0.0);
          std::fflush(stdout);
        }
        // A streamed model (bigger than its share of the pool) is never
        // resident: it is ready once loaded.
        const bool streamed = dbus::get<bool>(*m, "streamed").value_or(false);
        if (a->no_wait || streamed || state == "resident" || state == "failed") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (tty) std::puts("");
      if (g.json) {
        auto j = dbus::to_json(*m);
        j["schema"] = kJsonSchema;
        std::puts(j.dump().c_str());
      } else {
        const bool streamed = dbus::get<bool>(*m, "streamed").value_or(false);
        fmt::print("{} {} ({}) as {}{}\n", streamed ? std::string("streamed") : dbus::get<std::string>(*m, "state").value_or("?"),
                   printable_name(dbus::get<std::string>(*m, "name").value_or("?")), bytes(dbus::get<uint64_t>(*m, "size").value_or(0)),
                   std::string(path),
                   streamed ? fmt::format(", through {} of the pool", bytes(dbus::get<uint64_t>(*m, "budget_bytes").value_or(0)))
                            : std::string());
      }
      if (dbus::get<std::string>(*m, "state").value_or("") == "failed") throw CLI::RuntimeError(1);
    } catch (const sdbus::Error& e) {
      throw CLI::RuntimeError(report(e));
    }
  });

  struct UArgs {
    std::string model;
    bool force = false;
  };
  auto u = std::make_shared<UArgs>();
  auto* un = app.add_subcommand("unload", "Drop a model from the pool (root)");
  un->add_option("model", u->model, "Model name or object path")->required();
  un->add_flag("--force", u->force, "Unload even while clients hold references");
  un->callback([&g, u] {
    try {
      auto bus = connect(g);
      auto mgr = manager_proxy(*bus);
      std::string path = u->model;
      if (path.empty() || path[0] != '/') {
        const dbus::Dict s = mgr->GetStatus();
        for (auto& m : dbus::get<std::vector<dbus::Dict>>(s, "models").value_or(std::vector<dbus::Dict>{}))
          if (dbus::get<std::string>(m, "name").value_or("") == u->model)
            path = dbus::get<sdbus::ObjectPath>(m, "object").value_or(sdbus::ObjectPath{});
        if (path.empty() || path[0] != '/') throw sdbus::Error(dbus::kErrNotFound, "no model named " + u->model);
      }
      mgr->Unload(sdbus::ObjectPath(path), u->force);
      if (g.json) {
        nlohmann::json j{{"schema", kJsonSchema}, {"unloaded", u->model}, {"object", path}, {"forced", u->force}};
        std::puts(j.dump().c_str());
      } else {
        fmt::print("unloaded {}\n", u->model);
      }
    } catch (const sdbus::Error& e) {
      throw CLI::RuntimeError(report(e));
    }
  });
}

}  // namespace airs::cli
