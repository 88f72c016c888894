// SPDX-License-Identifier: Apache-2.0
// airsctl residency MODEL [--watch SECONDS]: what of a model is in the pool,
// one line per layer: a bar for the share of its units that are in, and
// what is being read or dropped now. For a streamed model (bigger than its
// budget of the pool) this is what the residency policy keeps and streams.
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "airsctl/common.hpp"
#include "airsctl/subcommands.hpp"
#include "util/text.hpp"

namespace airs::cli {
namespace {

// The model's object path: MODEL itself, or the one whose name it is.
std::string object_of(dbus::ManagerCalls& mgr, const std::string& model) {
  if (model.starts_with("/")) return model;
  const dbus::Dict s = mgr.GetStatus();
  for (const auto& m : dbus::get<std::vector<dbus::Dict>>(s, "models").value_or(std::vector<dbus::Dict>{}))
    if (dbus::get<std::string>(m, "name").value_or("") == model)
      return std::string(dbus::get<sdbus::ObjectPath>(m, "object").value_or(sdbus::ObjectPath{}));
  throw CLI::RuntimeError(fmt::format("airsctl: no model named '{}' is loaded (airsctl status lists them)",
                                      printable_name(model)),
                          2);
}

std::string layer_name(uint32_t rank, uint32_t last) {
  if (rank == 0) return "embed";
  if (rank == last && rank > 1) return "output";
  return fmt::format("blk.{}", rank - 1);
}

void print_human(const std::string& name, const dbus::Dict& r) {
  const auto v = [&](const char* k) { return dbus::get<std::vector<uint32_t>>(r, k).value_or(std::vector<uint32_t>{}); };
  const auto rank = v("rank"), units = v("units"), ready = v("ready"), in_flight = v("in_flight"), closing = v("closing");
  const uint64_t unit = dbus::get<uint64_t>(r, "unit_size").value_or(0);
  const bool streamed = dbus::get<bool>(r, "streamed").value_or(false);
  uint64_t in = 0, all = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    in += i < ready.size() ? ready[i] : 0;
    all += units[i];
  }
  fmt::print("{}  {} of {} in the pool{}\n", printable_name(name), bytes(in * unit), bytes(all * unit),
             streamed ? fmt::format("  (streamed through a budget of {})",
                                    bytes(dbus::get<uint64_t>(r, "budget_bytes").value_or(0)))
                      : std::string());
  constexpr int kWidth = 40;
  const uint32_t last = rank.empty() ? 0 : rank.back();
  for (size_t i = 0; i < rank.size() && i < units.size() && i < ready.size(); ++i) {
    const double share = units[i] == 0 ? 0 : static_cast<double>(ready[i]) / units[i];
    const int full = static_cast<int>(share * kWidth + 0.5);
    std::string bar(static_cast<size_t>(full), '#');
    bar.resize(kWidth, '.');
    std::string now;
    if (i < in_flight.size() && in_flight[i] > 0) now += fmt::format("  reading {}", in_flight[i]);
    if (i < closing.size() && closing[i] > 0) now += fmt::format("  dropping {}", closing[i]);
    fmt::print("  {:<8} [{}] {:>3}/{:<3}{}\n", layer_name(rank[i], last), bar, ready[i], units[i], now);
  }
}

}  // namespace

void add_residency(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("residency", "Show what of a model is in the pool, layer by layer");
  auto model = std::make_shared<std::string>();
  auto watch = std::make_shared<double>(0.0);
  cmd->add_option("MODEL", *model, "The model's name or object path")->required();
  cmd->add_option("--watch", *watch, "Refresh every N seconds until interrupted");
  cmd->callback([&g, model, watch] {
    try {
      auto bus = connect(g);
      auto mgr = manager_proxy(*bus);
      const std::string path = object_of(*mgr, *model);
      dbus::ModelCalls m(*bus, path);
      for (;;) {
        const dbus::Dict r = m.Residency();
        if (*watch > 0) std::fputs("\033[H\033[2J", stdout);
        if (g.json) {
          auto j = dbus::to_json(r);
          j["schema"] = kJsonSchema;
          j["model"] = path;
          std::puts(j.dump().c_str());
        } else {
          print_human(*model, r);
        }
        std::fflush(stdout);
        if (*watch <= 0) break;
        std::this_thread::sleep_for(std::chrono::duration<double>(*watch));
      }
    } catch (const sdbus::Error& e) {
      throw CLI::RuntimeError(report(e));
    }
  });
}

}  // namespace airs::cli
