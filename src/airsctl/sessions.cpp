// SPDX-License-Identifier: Apache-2.0
// airsctl sessions: every KV session (owner, uid, priority, blocks, shared
// blocks, idle time, and how often its KV is read where its client
// samples).
#include <fmt/format.h>

#include "airsctl/common.hpp"
#include "airsctl/subcommands.hpp"
#include "util/text.hpp"

namespace airs::cli {

void add_sessions(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("sessions", "List KV-cache sessions");
  cmd->callback([&g] {
    try {
      auto bus = connect(g);
      auto mgr = manager_proxy(*bus);
      const std::vector<dbus::Dict> list = mgr->ListSessions();
      if (g.json) {
        nlohmann::json j = {{"schema", kJsonSchema}, {"sessions", nlohmann::json::array()}};
        for (auto& d : list) j["sessions"].push_back(dbus::to_json(d));
        std::puts(j.dump().c_str());
        return;
      }
      fmt::print("{:<28} {:<8} {:>6} {:<12} {:<16} {:>7} {:>7} {:>7} {:>8} {:>8}\n", "SESSION", "OWNER", "UID",
                 "PRIORITY", "MODEL", "BLOCKS", "SHARED", "TOKENS", "IDLE", "READ");
      for (auto& d : list) {
        // The share of its KV its client reads per sampling round, averaged
        // over the last seconds; "-": not measured, ranked by last use.
        const double rate = dbus::get<double>(d, "access_rate").value_or(-1.0);
        const std::string read = rate < 0 ? std::string("-") : fmt::format("{:.0f}%", rate * 100);
        fmt::print("{:<28} {:<8} {:>6} {:<12} {:<16} {:>7} {:>7} {:>7} {:>7.1f}s {:>8}\n",
                   std::string(dbus::get<sdbus::ObjectPath>(d, "session").value_or(sdbus::ObjectPath{})),
                   dbus::get<std::string>(d, "owner").value_or(""), dbus::get<uint32_t>(d, "uid").value_or(0),
                   dbus::get<std::string>(d, "priority").value_or(""), printable_name(dbus::get<std::string>(d, "model").value_or("")),
                   dbus::get<uint32_t>(d, "blocks").value_or(0), dbus::get<uint32_t>(d, "shared_blocks").value_or(0),
                   dbus::get<uint32_t>(d, "tokens").value_or(0), dbus::get<double>(d, "idle_s").value_or(0), read);
      }
      if (list.empty()) fmt::print("(no sessions)\n");
    } catch (const sdbus::Error& e) {
      throw CLI::RuntimeError(report(e));
    }
  });
}

}  // namespace airs::cli
