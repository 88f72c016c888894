// SPDX-License-Identifier: Apache-2.0
// The bus edge's dictionaries (daemon/bus_dicts.hpp): a known snapshot in,
// every key and its D-Bus signature checked exactly, so a misspelt, missing
// or retyped key fails here instead of reading as a silent 0 in airsctl or
// a client. The metrics text comes from the same snapshot.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "daemon/bus_dicts.hpp"
#include "daemon/metrics.hpp"

namespace airs::daemon {
namespace {

using Signatures = std::map<std::string, std::string>;

Signatures signatures(const dbus::Dict& d) {
  Signatures out;
  for (const auto& [k, v] : d) out[k] = v.peekValueType();
  return out;
}

dbus::Dict sub(const dbus::Dict& d, const std::string& key) { return d.at(key).get<dbus::Dict>(); }

sys::PsiStats psi() {
  sys::PsiStats p;
  p.some = {1.5, 2.5, 3.5, 1000};
  p.full = {0.5, 0.25, 0.125, 400};
  p.has_full = true;
  return p;
}

pager::ModelStats model_stats() {
  pager::ModelStats st;
  st.state = wire::ModelLoadState::Resident;
  st.region_size = 4 << 20;
  st.resident_bytes = 3 << 20;
  st.bytes_read = 3 << 20;
  st.read_mb_per_s = 12.5;
  st.direct_io = true;
  st.pin_failed = false;
  st.faults = 7;
  st.faults_waited = 2;
  st.units_failed = 1;
  return st;
}

// Every optional part set: the full key set.
StatusSnapshot full_snapshot() {
  StatusSnapshot s;
  s.version = "1.2.3";
  s.profile = "desktop";
  s.uptime_s = 42;
  s.page_size = 2 << 20;
  s.mode = "full";
  s.mode_reason = "userfaultfd and hugetlbfs";
  s.advice = {"raise nr_hugepages"};
  s.read_error = "poison";
  s.capabilities = {{"uffd", "yes"}, {"psi", "triggers"}};
  s.pool.target_bytes = 8 << 20;
  auto& p = s.pool.local.emplace();
  p.backend = "hugetlbfs";
  p.numa = "local";
  p.counts = {.page_size = 2 << 20, .free_pages = 1, .model_pages = 2, .kv_pages = 1};
  p.raised_pages = 3;
  pool::KernelView k;
  k.total = 10;
  k.free = 4;
  k.reserved = 1;
  k.surplus = 0;
  k.files_pages = 4;
  k.shmem_bytes = 100;
  k.mlocked_bytes = 200;
  p.kernel = k;
  s.mem_available = 123456;
  ModelStatus m;
  m.name = "tiny";
  m.object = "/org/aios/Airs1/model/1";
  m.size = 3 << 20;
  m.owner_uid = 1000;
  m.sessions = 1;
  m.preloaded = true;
  m.content_id = "abcd";
  m.refcount = 2;
  m.clients = 1;
  m.layers = 4;
  m.tensors = 9;
  m.stats = model_stats();
  s.models.push_back(m);
  s.keep_alive_s = 300;
  KvStatus kv;
  kv.totals.committed_bytes = 2 << 20;
  kv.totals.used_bytes = 1 << 20;
  kv.totals.free_bytes = 1 << 19;
  kv.totals.sessions = 1;
  kv.totals.shared_blocks = 3;
  kv.spill = SpillTierStatus{"/var/lib/airs/kv", SpillStats{.used_bytes = 10, .limit_bytes = 20}};
  s.kv = kv;
  PressureStatus pr;
  pr.source = "psi-triggers";
  pr.why = "psi triggers on /proc/pressure/memory";
  pr.level = policy::Level::Some;
  pr.raw_level = policy::Level::Full;
  pr.psi = psi();
  pr.source_mem_available = 99;
  pr.source_last_error = "EIO";
  pr.counters.evictions = 5;
  pr.counters.evicted_bytes = 6 << 20;
  pr.counters.reserve_bytes = 77;
  pr.last_evictions.push_back({10, "pressure full", "model", "/org/aios/Airs1/model/2", 2 << 20, "unused"});
  s.pressure = pr;
  s.bus = BusStatus{"unix:path=/run/test-bus", "lost", "", 1500, 2, 3, "processing bus requests: reset",
                    "cannot connect: No such file or directory", 800, 1};
  return s;
}

TEST(BusDicts, StatusHasEveryKeyWithItsSignature) {
  const dbus::Dict d = to_dict(full_snapshot());
  EXPECT_EQ(signatures(d), (Signatures{{"version", "s"},      {"profile", "s"},      {"uptime_s", "t"},
                                       {"loop_wakeups", "t"},
                                       {"page_size", "t"},    {"mode", "s"},         {"mode_reason", "s"},
                                       {"advice", "as"},      {"read_error", "s"},   {"capabilities", "a{sv}"},
                                       {"pool", "a{sv}"},     {"mem_available", "t"}, {"models", "aa{sv}"},
                                       {"keep_alive_s", "t"}, {"kv", "a{sv}"},       {"pressure", "a{sv}"},
                                       {"bus", "a{sv}"}}));
  EXPECT_EQ(signatures(sub(d, "capabilities")), (Signatures{{"psi", "s"}, {"uffd", "s"}}));
  EXPECT_EQ(signatures(sub(d, "bus")),
            (Signatures{{"address", "s"}, {"state", "s"}, {"unique_name", "s"}, {"state_for_ms", "t"},
                        {"losses", "t"}, {"failed_attempts", "t"}, {"last_loss", "s"}, {"last_error", "s"},
                        {"last_offline_ms", "t"},
                        {"lost_owners", "u"}}));
  EXPECT_EQ(sub(d, "bus").at("state").get<std::string>(), "lost");
  EXPECT_EQ(sub(d, "bus").at("losses").get<uint64_t>(), 2u);
  EXPECT_EQ(sub(d, "bus").at("lost_owners").get<uint32_t>(), 1u);
  EXPECT_EQ(sub(d, "capabilities").at("psi").get<std::string>(), "triggers");
  EXPECT_EQ(d.at("mem_available").get<uint64_t>(), 123456u);
  EXPECT_EQ(d.at("keep_alive_s").get<uint64_t>(), 300u);
}

TEST(BusDicts, PoolKeysAndThePinnedTruth) {
  auto s = full_snapshot();
  const dbus::Dict pool = to_dict(s.pool);
  EXPECT_EQ(signatures(pool), (Signatures{{"target_bytes", "t"},
                                          {"backend", "s"},
                                          {"numa", "s"},
                                          {"total_pages", "t"},
                                          {"total_bytes", "t"},
                                          {"free_bytes", "t"},
                                          {"model_bytes", "t"},
                                          {"kv_bytes", "t"},
                                          {"free_pages", "t"},
                                          {"raised_pages", "t"},
                                          {"model_pages", "t"},
                                          {"kv_pages", "t"},
                                          {"pinned", "b"},
                                          {"pinned_how", "s"},
                                          {"kernel_hugepages_total", "t"},
                                          {"kernel_hugepages_free", "t"},
                                          {"kernel_hugepages_rsvd", "t"},
                                          {"kernel_hugepages_surp", "t"},
                                          {"files_pages", "t"},
                                          {"kernel_shmem_bytes", "t"},
                                          {"kernel_mlocked_bytes", "t"}}));
  EXPECT_EQ(pool.at("total_pages").get<uint64_t>(), 4u);
  EXPECT_EQ(pool.at("total_bytes").get<uint64_t>(), uint64_t{8} << 20);
  EXPECT_EQ(pool.at("kv_bytes").get<uint64_t>(), uint64_t{2} << 20);
  EXPECT_EQ(pool.at("kernel_hugepages_rsvd").get<uint64_t>(), 1u);
  EXPECT_TRUE(pool.at("pinned").get<bool>());
  EXPECT_EQ(pool.at("pinned_how").get<std::string>(), "hugetlb pages: never swapped or reclaimed");

  auto& l = *s.pool.local;
  l.backend = "shmem";
  EXPECT_EQ(to_dict(s.pool).at("pinned_how").get<std::string>(), "shmem pages locked with mlock: unevictable");
  l.unpinned = {"a", "b"};
  const dbus::Dict unpinned = to_dict(s.pool);
  EXPECT_FALSE(unpinned.at("pinned").get<bool>());
  EXPECT_EQ(unpinned.at("pinned_how").get<std::string>(),
            "NOT all pinned: mlock failed for model(s) a, b (RLIMIT_MEMLOCK? LimitMEMLOCK=infinity or "
            "CAP_IPC_LOCK): their pages may be swapped");

  l.kernel->shmem_bytes.reset();
  l.kernel->mlocked_bytes.reset();
  EXPECT_FALSE(to_dict(s.pool).contains("kernel_shmem_bytes"));
  EXPECT_FALSE(to_dict(s.pool).contains("kernel_mlocked_bytes"));
  l.kernel.reset();
  EXPECT_FALSE(to_dict(s.pool).contains("kernel_hugepages_total"));
  EXPECT_FALSE(to_dict(s.pool).contains("files_pages"));
}

TEST(BusDicts, ModelKeysWithAndWithoutThePagersStats) {
  auto m = full_snapshot().models.at(0);
  const dbus::Dict d = to_dict(m);
  const Signatures base{{"name", "s"},     {"object", "o"},   {"size", "t"},       {"owner_uid", "u"},
                        {"sessions", "u"}, {"preloaded", "b"}, {"state", "s"},     {"adopted", "b"},
                        {"content_id", "s"}, {"refcount", "u"}, {"clients", "u"},  {"pinned", "b"},
                        {"layers", "t"},   {"tensors", "t"}};
  Signatures with_stats = base;
  with_stats.insert({{"resident_bytes", "t"}, {"pin_failed", "b"}, {"region_bytes", "t"}, {"bytes_read", "t"},
                     {"read_mb_per_s", "d"}, {"direct_io", "b"}, {"faults", "t"}, {"faults_waited", "t"},
                     {"units_failed", "u"}, {"streamed", "b"}});
  EXPECT_EQ(signatures(d), with_stats);
  EXPECT_EQ(d.at("state").get<std::string>(), "resident");
  EXPECT_EQ(std::string(d.at("object").get<sdbus::ObjectPath>()), "/org/aios/Airs1/model/1");
  EXPECT_EQ(d.at("region_bytes").get<uint64_t>(), uint64_t{4} << 20);
  EXPECT_EQ(d.at("units_failed").get<uint32_t>(), 1u);
  EXPECT_DOUBLE_EQ(d.at("read_mb_per_s").get<double>(), 12.5);

  m.stats.reset();
  const dbus::Dict bare = to_dict(m);
  EXPECT_EQ(signatures(bare), base);
  EXPECT_EQ(bare.at("state").get<std::string>(), "unknown");
}

TEST(BusDicts, ModelStateNames) {
  auto st = model_stats();
  const std::pair<wire::ModelLoadState, const char*> names[] = {
      {wire::ModelLoadState::Loading, "loading"}, {wire::ModelLoadState::Resident, "resident"},
      {wire::ModelLoadState::Evicted, "evicted"}, {wire::ModelLoadState::Failed, "failed"},
      {wire::ModelLoadState::Unloaded, "unloaded"}};
  for (auto [state, name] : names) {
    st.state = state;
    EXPECT_EQ(model_state_name(st), name);
  }
  EXPECT_EQ(model_state_name(std::nullopt), "unknown");
}

TEST(BusDicts, KvKeysAndTheSpillTier) {
  auto kv = *full_snapshot().kv;
  const dbus::Dict d = to_dict(kv);
  EXPECT_EQ(signatures(d), (Signatures{{"sessions", "u"}, {"committed_bytes", "t"}, {"used_bytes", "t"},
                                       {"cached_bytes", "t"}, {"free_bytes", "t"}, {"waste_bytes", "t"},
                                       {"shared_blocks", "u"}, {"arena_repairs", "t"}, {"arenas_closed", "t"}, {"waste_ratio", "d"}, {"spill", "a{sv}"}}));
  EXPECT_DOUBLE_EQ(d.at("waste_ratio").get<double>(), 0.25);  // free 512 KiB of 2 MiB committed
  EXPECT_EQ(signatures(sub(d, "spill")),
            (Signatures{{"enabled", "b"}, {"dir", "s"}, {"used_bytes", "t"}, {"limit_bytes", "t"},
                        {"entries", "t"}, {"hits", "t"}, {"misses", "t"}, {"rejected", "t"},
                        {"written_bytes", "t"}, {"read_bytes", "t"}, {"dropped", "t"}, {"inflight_bytes", "t"}}));
  EXPECT_TRUE(sub(d, "spill").at("enabled").get<bool>());
  EXPECT_EQ(sub(d, "spill").at("limit_bytes").get<uint64_t>(), 20u);

  kv.spill.reset();
  kv.totals = {};
  const dbus::Dict off = to_dict(kv);
  EXPECT_EQ(signatures(sub(off, "spill")), (Signatures{{"enabled", "b"}}));
  EXPECT_FALSE(sub(off, "spill").at("enabled").get<bool>());
  EXPECT_DOUBLE_EQ(off.at("waste_ratio").get<double>(), 0.0);
}

TEST(BusDicts, PressureKeys) {
  auto pr = *full_snapshot().pressure;
  const dbus::Dict d = to_dict(pr);
  Signatures want{{"source", "s"},
                  {"why", "s"},
                  {"level", "s"},
                  {"raw_level", "s"},
                  {"level_for_ms", "t"},
                  {"some_avg10", "d"},
                  {"some_avg60", "d"},
                  {"full_avg10", "d"},
                  {"full_avg60", "d"},
                  {"some_total_us", "t"},
                  {"full_total_us", "t"},
                  {"source_mem_available", "t"},
                  {"some_events", "t"},
                  {"full_events", "t"},
                  {"spurious_events", "t"},
                  {"level_changes", "t"},
                  {"samples", "t"},
                  {"source_errors", "t"},
                  {"source_last_error", "s"},
                  {"decision", "s"},
                  {"damon", "s"},
                  {"evictions", "t"},
                  {"admin_evictions", "t"},
                  {"actions", "t"},
                  {"action_errors", "t"},
                  {"evicted_bytes", "t"},
                  {"evicted_cached_bytes", "t"},
                  {"evicted_kv_bytes", "t"},
                  {"evicted_model_bytes", "t"},
                  {"reserve_returned_bytes", "t"},
                  {"returned_bytes", "t"},
                  {"grows", "t"},
                  {"grown_bytes", "t"},
                  {"resize_failures", "t"},
                  {"last_resize_error", "s"},
                  {"last_eviction_us", "t"},
                  {"max_eviction_us", "t"},
                  {"resize_pool", "b"},
                  {"pool_target_bytes", "t"},
                  {"pool_current_bytes", "t"},
                  {"floor_bytes", "t"},
                  {"target_some_bytes", "t"},
                  {"target_full_bytes", "t"},
                  {"last_evictions", "aa{sv}"}};
  EXPECT_EQ(signatures(d), want);
  EXPECT_EQ(d.at("level").get<std::string>(), "some");
  EXPECT_EQ(d.at("raw_level").get<std::string>(), "full");
  EXPECT_DOUBLE_EQ(d.at("full_avg60").get<double>(), 0.25);
  EXPECT_EQ(d.at("reserve_returned_bytes").get<uint64_t>(), 77u);
  const auto last = d.at("last_evictions").get<std::vector<dbus::Dict>>();
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(signatures(last[0]), (Signatures{{"age_ms", "t"}, {"trigger", "s"}, {"kind", "s"}, {"object", "s"},
                                             {"bytes", "t"}, {"reason", "s"}}));
  EXPECT_EQ(last[0].at("kind").get<std::string>(), "model");

  pr.psi.reset();
  pr.source_mem_available.reset();
  pr.source_last_error.clear();
  for (const char* k : {"some_avg10", "some_avg60", "full_avg10", "full_avg60", "some_total_us", "full_total_us",
                        "source_mem_available", "source_last_error"})
    want.erase(k);
  EXPECT_EQ(signatures(to_dict(pr)), want);
}

TEST(BusDicts, WithoutALocalPoolStatusHasNoKvNorPressure) {
  StatusSnapshot s;
  s.pool.target_bytes = 0;
  const dbus::Dict d = to_dict(s);
  EXPECT_EQ(signatures(d), (Signatures{{"version", "s"}, {"profile", "s"}, {"uptime_s", "t"}, {"loop_wakeups", "t"},
                                       {"page_size", "t"},
                                       {"mode", "s"}, {"mode_reason", "s"}, {"advice", "as"}, {"read_error", "s"},
                                       {"capabilities", "a{sv}"}, {"pool", "a{sv}"}, {"models", "aa{sv}"},
                                       {"keep_alive_s", "t"}, {"bus", "a{sv}"}}));
  EXPECT_EQ(signatures(sub(d, "pool")), (Signatures{{"target_bytes", "t"}}));
}

TEST(BusDicts, SessionGeometryOpenInfoPressureChangeAndEvictionReport) {
  SessionStatus s;
  s.path = "/org/aios/Airs1/session/3";
  s.priority = policy::Priority::Interactive;
  s.idle_s = 1.5;
  const auto list = to_dicts({s, s});
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(signatures(list[0]), (Signatures{{"session", "o"}, {"owner", "s"}, {"uid", "u"}, {"model", "s"},
                                             {"priority", "s"}, {"blocks", "u"}, {"shared_blocks", "u"},
                                             {"tokens", "u"}, {"idle_s", "d"}, {"evicted_blocks", "t"},
                                             {"restored_blocks", "t"}, {"access_rate", "d"},
                                             {"access_reports", "t"}, {"access_reports_refused", "b"}}));
  EXPECT_EQ(list[0].at("priority").get<std::string>(), "interactive");

  SessionGeometry g;
  g.geo.block_bytes = 65536;
  g.geo.tokens_per_block = 16;
  g.arena_bytes = 1 << 30;
  g.kv_type = "f16";
  const dbus::Dict gd = to_dict(g);
  EXPECT_EQ(signatures(gd), (Signatures{{"block_bytes", "u"}, {"tokens_per_block", "u"}, {"bytes_per_token", "t"},
                                        {"arena_bytes", "t"}, {"chunk_bytes", "t"}, {"blocks_per_chunk", "u"},
                                        {"kv_type", "s"}}));
  EXPECT_EQ(gd.at("block_bytes").get<uint32_t>(), 65536u);

  const dbus::Dict od = to_dict(OpenInfo{"full", true, 2 << 20, 3 << 20, "tiny", 4, true, false, true});
  EXPECT_EQ(signatures(od), (Signatures{{"mode", "s"}, {"resident", "b"}, {"unit_size", "t"}, {"file_size", "t"},
                                        {"name", "s"}, {"layers", "t"}, {"lazy", "b"}, {"streamed", "b"},
                                        {"expert_hints", "b"}}));
  EXPECT_EQ(od.at("unit_size").get<uint64_t>(), uint64_t{2} << 20);
  EXPECT_TRUE(od.at("expert_hints").get<bool>());

  PressureChange c;
  c.previous = policy::Level::None;
  c.raw = policy::Level::Some;
  c.source = "psi-triggers";
  EXPECT_EQ(signatures(to_dict(c)), (Signatures{{"previous", "s"}, {"raw", "s"}, {"source", "s"}}));
  c.psi = psi();
  const dbus::Dict cd = to_dict(c);
  EXPECT_EQ(signatures(cd), (Signatures{{"previous", "s"}, {"raw", "s"}, {"source", "s"}, {"some_avg10", "d"},
                                        {"full_avg10", "d"}}));
  EXPECT_EQ(cd.at("raw").get<std::string>(), "some");

  EvictionReport r;
  r.trigger = "admin uid 0";
  r.plan.shortfall = "nothing idle";
  EvictionOutcome o;
  o.action.kind = policy::ActionKind::EvictBlocks;
  o.action.blocks = 4;
  o.object = "/org/aios/Airs1/session/3";
  r.outcomes.push_back(o);
  const dbus::Dict rd = to_dict(r);
  EXPECT_EQ(signatures(rd), (Signatures{{"dry_run", "b"}, {"trigger", "s"}, {"requested_bytes", "t"},
                                        {"planned_bytes", "t"}, {"freed_bytes", "t"}, {"reserve_bytes", "t"},
                                        {"returned_bytes", "t"}, {"satisfied", "b"}, {"shortfall", "s"},
                                        {"resize_note", "s"}, {"duration_us", "t"}, {"actions", "aa{sv}"}}));
  const auto actions = rd.at("actions").get<std::vector<dbus::Dict>>();
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(signatures(actions[0]), (Signatures{{"kind", "s"}, {"object", "s"}, {"id", "t"}, {"blocks", "u"},
                                                {"bytes", "t"}, {"freed_bytes", "t"}, {"reason", "s"},
                                                {"error", "s"}}));
  EXPECT_EQ(actions[0].at("kind").get<std::string>(), "kv-blocks");
  EXPECT_EQ(actions[0].at("blocks").get<uint32_t>(), 4u);
}

TEST(BusDicts, EvictWhatIsTypedAtTheEdge) {
  dbus::Dict what;
  what["priority"] = sdbus::Variant(std::string("background"));
  what["session"] = sdbus::Variant(sdbus::ObjectPath("/org/aios/Airs1/session/7"));
  what["model"] = sdbus::Variant(std::string("tiny"));
  what["bytes"] = sdbus::Variant(uint64_t{4096});
  auto w = evict_what_from_dict(what);
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_EQ(w->priority, policy::Priority::Background);
  EXPECT_EQ(w->session, "/org/aios/Airs1/session/7");
  EXPECT_EQ(w->model, "tiny");
  EXPECT_EQ(w->bytes, 4096u);

  // Present with another type: still said (the core refuses it by name).
  dbus::Dict odd;
  odd["session"] = sdbus::Variant(uint32_t{7});
  odd["model"] = sdbus::Variant(true);
  odd["bytes"] = sdbus::Variant(std::string("4096"));
  auto o = evict_what_from_dict(odd);
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->priority.has_value());
  EXPECT_EQ(o->session, "");
  EXPECT_EQ(o->model, "");
  EXPECT_EQ(o->bytes, 0u);
  EXPECT_FALSE(evict_what_from_dict({})->session.has_value());

  dbus::Dict unknown;
  unknown["byte"] = sdbus::Variant(uint64_t{1});
  auto u = evict_what_from_dict(unknown);
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.error().code, EINVAL);
  EXPECT_EQ(u.error().message, "Evict: unknown key 'byte' (accepted: priority, session, model, bytes)");
  dbus::Dict prio;
  prio["priority"] = sdbus::Variant(std::string("urgent"));
  EXPECT_EQ(evict_what_from_dict(prio).error().message,
            "Evict: priority must be a string, one of interactive, system, background (got 'urgent')");
  prio["priority"] = sdbus::Variant(uint32_t{1});
  EXPECT_EQ(evict_what_from_dict(prio).error().message,
            "Evict: priority must be a string, one of interactive, system, background (got 'a non-string')");
}

// The metrics read the same snapshot: a model the pager does not know has
// no series; no pressure part, no pressure gauges.
TEST(BusDicts, MetricsComeFromTheSameSnapshot) {
  auto s = full_snapshot();
  ModelStatus unknown = s.models[0];
  unknown.name = "unknown-to-the-pager";
  unknown.stats.reset();
  s.models.push_back(unknown);
  const std::string text = format_metrics(s);
  EXPECT_NE(text.find("\nairs_pool_bytes 8388608\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nairs_mem_available_bytes 123456\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nairs_model_resident_bytes{model=\"tiny\"} 3145728\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("unknown-to-the-pager"), std::string::npos) << text;
  EXPECT_NE(text.find("\nairs_kv_sessions 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nairs_pressure_level 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nairs_psi_full_avg10 0.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nairs_evictions_total 5\n"), std::string::npos) << text;
  s.pressure.reset();
  EXPECT_EQ(format_metrics(s).find("airs_pressure_level"), std::string::npos);
}

}  // namespace
}  // namespace airs::daemon
