// SPDX-License-Identifier: Apache-2.0
// airsctl status [--json] [--watch SECONDS]: the daemon's view of the pool,
// models, KV and pressure.
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "airsctl/common.hpp"
#include "airsctl/subcommands.hpp"
#include "util/text.hpp"

namespace airs::cli {
namespace {

void print_status(const dbus::Dict& s) {
  fmt::print("airs-memd {}  profile {}  mode {}  up {} s\n", val<std::string>(s, "version"),
             val<std::string>(s, "profile"), val<std::string>(s, "mode", "-"), val<uint64_t>(s, "uptime_s"));
  if (auto why = dbus::get<std::string>(s, "mode_reason")) fmt::print("  mode: {}\n", *why);
  if (auto how = dbus::get<std::string>(s, "read_error"); how && val<std::string>(s, "mode") != "cooperative")
    fmt::print("  read errors: {}\n",
               *how == "poison" ? "UFFDIO_POISON: the faulting access gets SIGBUS (BUS_ADRERR)"
                                : "no UFFDIO_POISON (Linux < 6.6): the client process gets SIGBUS through its pidfd");
  if (auto adv = dbus::get<std::vector<std::string>>(s, "advice"))
    for (auto& a : *adv) fmt::print("  to enable more: {}\n", a);
  // Said only once the bus was lost (this call reached the daemon: it is
  // on its bus now).
  if (auto bus = dbus::get<dbus::Dict>(s, "bus"); bus && val<uint64_t>(*bus, "losses") > 0) {
    fmt::print("  bus: lost {} time(s), the last for {} ms ({})\n", val<uint64_t>(*bus, "losses"),
               val<uint64_t>(*bus, "last_offline_ms"), val<std::string>(*bus, "last_loss"));
    if (const auto kept = val<uint32_t>(*bus, "lost_owners"); kept > 0)
      fmt::print("  bus: {} connection(s) of a lost bus keep their sessions and models until their processes exit\n",
                 kept);
  }
  auto pool = val<dbus::Dict>(s, "pool");
  const uint64_t page = val<uint64_t>(s, "page_size");
  fmt::print("\nPOOL  {} pages of {}  ({})\n", val<uint64_t>(pool, "total_pages"), bytes(page),
             val<std::string>(pool, "backend", "-"));
  fmt::print("  total {:>12}  models {:>12}  kv {:>12}  free {:>12}\n", bytes(val<uint64_t>(pool, "total_bytes")),
             bytes(val<uint64_t>(pool, "model_bytes")), bytes(val<uint64_t>(pool, "kv_bytes")),
             bytes(val<uint64_t>(pool, "free_bytes")));
  if (auto numa = dbus::get<std::string>(pool, "numa")) fmt::print("  numa: {}\n", *numa);
  if (val<std::string>(pool, "backend") == "hugetlbfs" && pool.count("kernel_hugepages_total"))
    fmt::print("  kernel: HugePages_Total {}  Free {}  Rsvd {}\n", val<uint64_t>(pool, "kernel_hugepages_total"),
               val<uint64_t>(pool, "kernel_hugepages_free"), val<uint64_t>(pool, "kernel_hugepages_rsvd"));
  else if (pool.count("kernel_mlocked_bytes"))
    fmt::print("  kernel: Shmem {}  Mlocked {}\n", bytes(val<uint64_t>(pool, "kernel_shmem_bytes")),
               bytes(val<uint64_t>(pool, "kernel_mlocked_bytes")));
  if (pool.count("pinned"))
    fmt::print("  pinned: {} ({})\n", val<bool>(pool, "pinned") ? "yes" : "NO", val<std::string>(pool, "pinned_how"));
  auto models = val<std::vector<dbus::Dict>>(s, "models");
  const uint64_t keep_alive = val<uint64_t>(s, "keep_alive_s");
  fmt::print("\nMODELS ({})  keep-alive {}\n", models.size(),
             keep_alive == 0 ? std::string("off") : fmt::format("{} s", keep_alive));
  if (!models.empty())
    fmt::print("  {:<24} {:>10} {:>9} {:<10} {:>5} {:>7}\n", "NAME", "SIZE", "RESIDENT", "STATE", "REFS", "CLIENTS");
  for (auto& m : models) {
    const uint64_t size = val<uint64_t>(m, "size");
    // Residency is counted in whole huge pages of the region (the file
    // rounded up), so compare against the region, not the file.
    const uint64_t region = std::max<uint64_t>(1, val<uint64_t>(m, "region_bytes", size));
    const uint64_t res = val<uint64_t>(m, "resident_bytes");
    fmt::print("  {:<24} {:>10} {:>9} {:<10} {:>5} {:>7}{}\n", printable_name(val<std::string>(m, "name")), bytes(size),
               percent(static_cast<double>(std::min(res, region)) / static_cast<double>(region)), val<std::string>(m, "state"),
               val<uint32_t>(m, "refcount"), val<uint32_t>(m, "clients"),
               std::string(val<bool>(m, "pinned") ? "  pinned" : "") + (val<bool>(m, "preloaded") ? "  preloaded" : ""));
    if (val<bool>(m, "streamed"))
      fmt::print("    streamed through {} of the pool in units of {} (read-ahead {}): {} read per token, the optimum {}; "
                 "hit rate {}; {} tokens\n",
                 bytes(val<uint64_t>(m, "budget_bytes")), bytes(val<uint64_t>(m, "unit_bytes")),
                 bytes(val<uint64_t>(m, "stream_window_bytes")),
                 bytes(val<uint64_t>(m, "bytes_per_pass")), bytes(val<uint64_t>(m, "bytes_per_pass_min")),
                 percent(val<double>(m, "hit_rate")), val<uint64_t>(m, "passes"));
    if (val<uint64_t>(m, "expert_uses") > 0 || val<uint64_t>(m, "expert_hints_ignored") > 0)
      fmt::print("    experts: {} uses counted; {} hints, {} ignored; {} read on a hint\n", val<uint64_t>(m, "expert_uses"),
                 val<uint64_t>(m, "expert_hints"), val<uint64_t>(m, "expert_hints_ignored"),
                 bytes(val<uint64_t>(m, "hinted_bytes_read")));
    if (!val<std::string>(m, "access_source").empty())
      fmt::print("    what is hot, from: {} ({} touches of units that were in)\n", val<std::string>(m, "access_source"),
                 val<uint64_t>(m, "resident_touches"));
    if (val<uint64_t>(m, "expert_predictions") > 0)
      fmt::print("    experts: {} predictions; {} read on a prediction\n", val<uint64_t>(m, "expert_predictions"),
                 bytes(val<uint64_t>(m, "predicted_bytes_read")));
  }
  auto kv = val<dbus::Dict>(s, "kv");
  if (!kv.empty()) {
    fmt::print("\nKV  sessions {}  used {}  cached {}  free {}  waste {}\n", val<uint32_t>(kv, "sessions"),
               bytes(val<uint64_t>(kv, "used_bytes")), bytes(val<uint64_t>(kv, "cached_bytes")),
               bytes(val<uint64_t>(kv, "free_bytes")), percent(val<double>(kv, "waste_ratio")));
    auto sp = val<dbus::Dict>(kv, "spill");
    if (val<bool>(sp, "enabled")) {
      fmt::print("  spill tier {}  used {} of {} ({} entries)  hits {}  misses {}  rejected {}  written {}  read {}\n",
                 printable_name(val<std::string>(sp, "dir")), bytes(val<uint64_t>(sp, "used_bytes")),
                 bytes(val<uint64_t>(sp, "limit_bytes")), val<uint64_t>(sp, "entries"), val<uint64_t>(sp, "hits"),
                 val<uint64_t>(sp, "misses"), val<uint64_t>(sp, "rejected"), bytes(val<uint64_t>(sp, "written_bytes")),
                 bytes(val<uint64_t>(sp, "read_bytes")));
    } else if (!sp.empty()) {
      fmt::print("  spill tier off (no daemon.state_dir, or kv.spill_limit = 0): evicted prefixes are recomputed\n");
    }
  }
  auto pr = val<dbus::Dict>(s, "pressure");
  if (!pr.empty()) {
    fmt::print("\nPRESSURE  level {}  source {}\n", val<std::string>(pr, "level", "none"), val<std::string>(pr, "source", "-"));
    if (val<uint64_t>(pr, "floor_bytes") > 0)
      fmt::print("  security floor {} (the pinned primary model: the pool never shrinks below it)\n",
                 bytes(val<uint64_t>(pr, "floor_bytes")));
    if (pr.count("some_avg10"))
      fmt::print("  some avg10 {:.2f}  full avg10 {:.2f}  evictions {}  bytes evicted {}\n", val<double>(pr, "some_avg10"),
                 val<double>(pr, "full_avg10"), val<uint64_t>(pr, "evictions"), bytes(val<uint64_t>(pr, "evicted_bytes")));
  }
  fmt::print("\nMemAvailable {}\n", bytes(val<uint64_t>(s, "mem_available")));
}

}  // namespace

void add_status(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("status", "Show the pool, models, KV cache and memory pressure");
  auto watch = std::make_shared<double>(0.0);
  cmd->add_option("--watch", *watch, "Refresh every N seconds until interrupted");
  cmd->callback([&g, watch] {
    try {
      auto bus = connect(g);
      auto mgr = manager_proxy(*bus);
      for (;;) {
        const dbus::Dict s = mgr->GetStatus();
        if (*watch > 0) std::fputs("\033[H\033[2J", stdout);
        if (g.json) {
          auto j = dbus::to_json(s);
          j["schema"] = kJsonSchema;
          std::puts(j.dump(*watch > 0 ? 2 : -1).c_str());
        } else {
          print_status(s);
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
