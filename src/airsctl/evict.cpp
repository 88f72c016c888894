// SPDX-License-Identifier: Apache-2.0
// airsctl evict [--priority P] [--session S] [--model M] [--bytes N] [--dry-run]:
// asks airs-memd to evict KV blocks and/or models (Manager.Evict, root or
// daemon.admin_group only) and prints what was (or, with --dry-run, would
// be) evicted. Freed huge pages go back to the kernel.
//
// Exit codes: 0 done (or planned) and the request covered; 5 the request
// could not be covered (the shortfall is printed; what could go, went);
// 2 bad arguments; 3 access denied; 4 no such session/model; 1 other errors.
#include <fmt/format.h>

#include "airsctl/common.hpp"
#include "airsctl/subcommands.hpp"
#include "dbus/names.hpp"
#include "util/units.hpp"

namespace airs::cli {
namespace {


struct EvictArgs {
  std::string priority;
  std::string session;
  std::string model;
  std::string bytes;
  bool dry_run = false;
};

void print_plan(const dbus::Dict& r) {
  const bool dry = val<bool>(r, "dry_run");
  const auto actions = val<std::vector<dbus::Dict>>(r, "actions");
  if (dry) fmt::print("DRY RUN: nothing was changed. Plan:\n");
  if (actions.empty()) {
    fmt::print("nothing to evict\n");
  } else {
    fmt::print("  {:<3} {:<9} {:<36} {:>7} {:>10} {:>10}  {}\n", "#", "KIND", "OBJECT", "BLOCKS", "PLANNED",
               dry ? "" : "FREED", "REASON");
    size_t i = 0;
    for (const auto& a : actions) {
      const std::string err = val<std::string>(a, "error");
      fmt::print("  {:<3} {:<9} {:<36} {:>7} {:>10} {:>10}  {}{}\n", ++i, val<std::string>(a, "kind"),
                 val<std::string>(a, "object"), val<uint32_t>(a, "blocks"), bytes(val<uint64_t>(a, "bytes")),
                 dry ? "" : bytes(val<uint64_t>(a, "freed_bytes")), val<std::string>(a, "reason"),
                 err.empty() ? "" : "  FAILED: " + err);
    }
  }
  const uint64_t req = val<uint64_t>(r, "requested_bytes");
  fmt::print("requested {}  planned {}", req ? bytes(req) : std::string("everything matching"),
             bytes(val<uint64_t>(r, "planned_bytes")));
  if (!dry)
    fmt::print("  freed {}  back to the kernel {}", bytes(val<uint64_t>(r, "freed_bytes")),
               bytes(val<uint64_t>(r, "returned_bytes")));
  fmt::print("\n");
  if (auto s = val<std::string>(r, "shortfall"); !s.empty()) fmt::print("short: {}\n", s);
  if (auto s = val<std::string>(r, "resize_note"); !s.empty()) fmt::print("note: {}\n", s);
}

int run_evict(const Globals& g, const EvictArgs& a) {
  dbus::Dict what;
  if (!a.priority.empty()) what["priority"] = sdbus::Variant(a.priority);
  if (!a.session.empty()) {
    // A bare number is a session id; anything else must be its object path.
    const bool numeric = a.session.find_first_not_of("0123456789") == std::string::npos;
    what["session"] = sdbus::Variant(sdbus::ObjectPath(numeric ? dbus::kSessionPathPrefix + a.session : a.session));
  }
  if (!a.model.empty()) {
    if (a.model.front() == '/') what["model"] = sdbus::Variant(sdbus::ObjectPath(a.model));
    else what["model"] = sdbus::Variant(a.model);
  }
  if (!a.bytes.empty()) {
    auto b = parse_bytes(a.bytes);
    if (!b || *b == 0) {
      std::fprintf(stderr, "airsctl evict: --bytes '%s' is not a size (e.g. 512M, 2G, 1048576)\n", a.bytes.c_str());
      return kExitUsage;
    }
    what["bytes"] = sdbus::Variant(*b);
  }
  if (what.empty()) {
    std::fprintf(stderr, "airsctl evict: say what to evict: --priority, --session, --model and/or --bytes\n");
    return kExitUsage;
  }
  dbus::Dict result;
  try {
    auto bus = connect(g);
    auto mgr = manager_proxy(*bus);
    result = mgr->Evict(what, a.dry_run);
  } catch (const sdbus::Error& e) {
    return report(e);
  }
  if (g.json) {
    auto j = dbus::to_json(result);
    j["schema"] = kJsonSchema;
    std::puts(j.dump().c_str());
  } else {
    print_plan(result);
  }
  const bool covered = val<uint64_t>(result, "requested_bytes") == 0 || val<bool>(result, "satisfied");
  return covered ? 0 : kExitShortfall;
}

}  // namespace

void add_evict(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("evict", "Evict KV blocks or models and give the memory back (root only)");
  auto a = std::make_shared<EvictArgs>();
  cmd->add_option("--priority", a->priority, "Only KV of this priority: background, system or interactive (idle only)")
      ->check(CLI::IsMember({"background", "system", "interactive"}));
  cmd->add_option("--session", a->session, "Only this session (object path or id)");
  cmd->add_option("--model", a->model, "Only this model (name or object path); never one in use or pinned");
  cmd->add_option("--bytes", a->bytes, "Stop once this much is freed (512M, 2G, ...); default: everything matching");
  cmd->add_flag("--dry-run", a->dry_run, "Print the plan and change nothing");
  cmd->callback([&g, a] {
    const int rc = run_evict(g, *a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace airs::cli
