// SPDX-License-Identifier: Apache-2.0
// The daemon on a real (private) bus: start-up, status, configuration
// errors, clean shutdown.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon_fixture.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "sys/code_lock.hpp"
#include "sys/procfs.hpp"

using namespace airs::test;

namespace {
const char* kSmallPool = "[pool]\nsize = \"64M\"\n";
}

TEST(Daemon, ServesStatusOnItsBusAndStopsCleanly) {
  PrivateBus bus;
  DaemonProcess d(bus.address(), kSmallPool);
  ASSERT_TRUE(d.started()) << d.log();

  auto human = run_process({airsctl_path(), "--bus", bus.address(), "status"});
  ASSERT_EQ(human.exit_code, 0) << human.err;
  EXPECT_NE(human.out.find("POOL"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("airs-memd"), std::string::npos);

  auto js = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status"});
  ASSERT_EQ(js.exit_code, 0) << js.err;
  auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["version"], "0.1.0");
  EXPECT_EQ(j["pool"]["target_bytes"], 64u << 20);
  EXPECT_GT(j["page_size"].get<uint64_t>(), 0u);

  EXPECT_EQ(d.stop(), 0) << d.log();
  EXPECT_NE(d.log().find("stopped"), std::string::npos);
}

// Its code stays resident: every read-only mapping of its binary and of its
// libraries is locked (VmFlags "lo") and wholly in memory, so under pressure
// its loop never waits for its own code to be read back from a disk that
// model reads keep busy (a reclaimer takes the rarely run pages first: an
// exception's unwinder, its error paths).
TEST(Daemon, KeepsItsOwnCodeResident) {
  PrivateBus bus;
  DaemonProcess d(bus.address(), kSmallPool);
  ASSERT_TRUE(d.started()) << d.log();
  EXPECT_NE(d.log().find("its code is locked in memory"), std::string::npos) << d.log();
  const std::string proc = "/proc/" + std::to_string(d.pid());
  auto maps = airs::sys::read_text_file(proc + "/maps", 16u << 20);
  ASSERT_TRUE(maps) << maps.error().message;
  const auto ranges = airs::sys::code_ranges(*maps);
  const std::string exe = std::filesystem::read_symlink(proc + "/exe").string();
  EXPECT_TRUE(std::any_of(ranges.begin(), ranges.end(), [&](const auto& r) { return r.path == exe; }))
      << exe << " is not among the ranges to lock:\n" << *maps;
  // smaps: each mapping's header line, then its fields.
  struct Entry {
    uint64_t size_kb = 0, rss_kb = 0;
    std::string flags;
  };
  std::map<uintptr_t, Entry> smaps;
  {
    std::ifstream in(proc + "/smaps");
    Entry* cur = nullptr;
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string key;
      f >> key;
      if (auto header = airs::sys::parse_maps_line(line)) cur = &smaps[static_cast<uintptr_t>(header->start)];
      else if (key == "Size:") f >> cur->size_kb;
      else if (key == "Rss:") f >> cur->rss_kb;
      else if (key == "VmFlags:") std::getline(f, cur->flags);
    }
  }
  for (const auto& r : ranges) {
    auto it = smaps.find(r.start);
    ASSERT_NE(it, smaps.end()) << r.path << " at " << std::hex << r.start << " is not in smaps";
    EXPECT_NE((it->second.flags + " ").find(" lo "), std::string::npos)
        << r.path << " at " << std::hex << r.start << " is not locked: VmFlags" << it->second.flags;
    EXPECT_EQ(it->second.rss_kb, it->second.size_kb) << r.path << " at " << std::hex << r.start << " is not all resident";
  }
  EXPECT_EQ(d.stop(), 0) << d.log();
}

// A daemon that does not exit when told to: the fixture's stop() kills it
// after its timeout and first writes into the log where each of its
// threads is (state, kernel function, syscall, kernel stack), so a test that
// fails so says where the daemon hangs. Stopped (SIGSTOP), the SIGTERM stays
// pending and the process cannot exit.
TEST(Daemon, AStopThatTimesOutLogsWhereTheDaemonsThreadsAre) {
  PrivateBus bus;
  DaemonProcess d(bus.address(), kSmallPool);
  ASSERT_TRUE(d.started()) << d.log();
  ASSERT_EQ(::kill(d.pid(), SIGSTOP), 0);
  // Each thread stops when it is next scheduled: wait for all of them (on a
  // loaded machine that can take longer than the stop's timeout below).
  const std::string tasks = "/proc/" + std::to_string(d.pid()) + "/task";
  auto all_stopped = [&] {
    for (const auto& t : std::filesystem::directory_iterator(tasks)) {
      std::ifstream in(t.path() / "stat");
      const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto paren = stat.rfind(')');
      if (paren == std::string::npos || stat.compare(paren, 3, ") T") != 0) return false;
    }
    return true;
  };
  for (int i = 0; i < 1000 && !all_stopped(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(all_stopped());
  EXPECT_EQ(d.stop(std::chrono::milliseconds(300)), -SIGKILL);
  const std::string log = d.log();
  EXPECT_NE(log.find("has not exited 300 ms after SIGTERM; its threads:"), std::string::npos) << log;
  EXPECT_NE(log.find("(airs-memd) state T wchan "), std::string::npos) << log;
  // Every thread, not only the main one (a worker may not have named
  // itself yet when it stopped).
  size_t stopped_threads = 0;
  for (size_t at = log.find(") state T wchan "); at != std::string::npos; at = log.find(") state T wchan ", at + 1))
    ++stopped_threads;
  EXPECT_GE(stopped_threads, 2U) << log;
  EXPECT_NE(log.find("daemon_fixture: SIGKILL"), std::string::npos) << log;
  EXPECT_EQ(log.find("stopped\n"), std::string::npos) << log;
}

// A helper process that outlives its time limit is described before it is
// killed: where each thread waits (here: sleep's nanosleep).
TEST(DaemonFixture, AProcessPastItsTimeLimitIsDescribedThenKilled) {
  auto r = run_process({"/bin/sleep", "30"}, std::chrono::milliseconds(300));
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_NE(r.err.find("run_process: /bin/sleep (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("still running after 300 ms; its threads:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(sleep) state S wchan "), std::string::npos) << r.err;
  // A process that ends in time is not described.
  auto quick = run_process({"/bin/true"}, std::chrono::seconds(30));
  EXPECT_EQ(quick.exit_code, 0);
  EXPECT_EQ(quick.err.find("still running"), std::string::npos) << quick.err;
}

// A test daemon takes the machine's pressure as input only where the test
// names a source: the others run with source = "off", which the daemon
// reports.
TEST(DaemonFixture, APressureSourceIsOffUnlessTheTestNamesOne) {
  EXPECT_EQ(with_pressure_source("[pool]\nsize = \"64M\""), "[pool]\nsize = \"64M\"\n[pressure]\nsource = \"off\"\n");
  EXPECT_EQ(with_pressure_source("[pressure]\nresize_pool = false\n[kv]\nsource_x = 1\n"),
            "[pressure]\nsource = \"off\"\nresize_pool = false\n[kv]\nsource_x = 1\n");
  const std::string named = "[pool]\nsize = \"64M\"\n[pressure]\nresize_pool = false\nsource = \"psi\"\n";
  EXPECT_EQ(with_pressure_source(named), named);
  // A "source" in another table is not the pressure's.
  EXPECT_EQ(with_pressure_source("[pressure]\n[other]\nsource = \"psi\"\n"),
            "[pressure]\nsource = \"off\"\n[other]\nsource = \"psi\"\n");
  // A key that only starts with "source" names none.
  EXPECT_EQ(with_pressure_source("[pressure]\nsource_x = 1\n"), "[pressure]\nsource = \"off\"\nsource_x = 1\n");
  // A source named as a dotted key is named.
  EXPECT_EQ(with_pressure_source("pressure.source = \"psi\"\n"), "pressure.source = \"psi\"\n");
  // A configuration that does not parse goes to the daemon as written.
  EXPECT_EQ(with_pressure_source("[pool\nsize = 1\n"), "[pool\nsize = 1\n");

  PrivateBus bus;
  DaemonProcess d(bus.address(), "[pool]\nsize = \"16M\"\ngrow_nr_hugepages = false\n[pressure]\nresize_pool = false\n");
  ASSERT_TRUE(d.started()) << d.log();
  auto st = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status"});
  ASSERT_EQ(st.exit_code, 0) << st.err;
  const auto j = nlohmann::json::parse(st.out);
  EXPECT_EQ(j["pressure"]["source"], "off") << j["pressure"].dump();
  EXPECT_EQ(j["pressure"]["level"], "none") << j["pressure"].dump();
  EXPECT_NE(d.log().find("pressure: source off (off by config"), std::string::npos) << d.log();
}

TEST(Daemon, StatusWithoutDaemonSaysSo) {
  PrivateBus bus;
  auto r = run_process({airsctl_path(), "--bus", bus.address(), "status"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("is airs-memd running?"), std::string::npos) << r.err;
}

TEST(Daemon, CheckConfigPrintsEffectiveConfig) {
  auto r = run_process({airs_memd_path(), "--config", source_dir() + "/config/airs-memd.conf", "--check-config"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[pool]"), std::string::npos);
  EXPECT_NE(r.out.find("prefetch_window = 2"), std::string::npos);
}

TEST(Daemon, BadConfigIsRejectedNamingTheKey) {
  PrivateBus bus;
  DaemonProcess d(bus.address(), "[models]\nprefetch_window = -1\n");
  EXPECT_FALSE(d.started());
  EXPECT_NE(d.log().find("[models] prefetch_window: -1 is out of range"), std::string::npos) << d.log();
}

TEST(Daemon, MissingExplicitConfigIsAnError) {
  auto r = run_process({airs_memd_path(), "--config", "/nonexistent/airs.conf", "--check-config"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/airs.conf does not exist"), std::string::npos) << r.err;
}

// By default a daemon waits for its bus (tests/integration/client/bus_loss_test.cpp);
// configured not to, it says why it cannot start.
TEST(Daemon, UnreachableBusIsAClearStartupError) {
  DaemonProcess d("unix:path=/nonexistent/bus", std::string(kSmallPool) + "[daemon]\nstart_without_bus = \"fail\"\n");
  EXPECT_FALSE(d.started());
  EXPECT_NE(d.log().find("cannot serve org.aios.Airs1 on the bus at unix:path=/nonexistent/bus"), std::string::npos)
      << d.log();
}

TEST(Daemon, WritesPrometheusMetrics) {
  namespace fs = std::filesystem;
  airs::gguf::ModelSpec spec;
  spec.name = "metrics-model";
  auto plan = airs::gguf::plan_model(spec);
  ASSERT_TRUE(plan) << plan.error().message;
  const auto dir = fs::temp_directory_path() / ("airs-metrics-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto model = (dir / "m.gguf").string();
  ASSERT_TRUE(airs::gguf::write_model_file(*plan, model));
  const auto prom = (dir / "airs.prom").string();

  PrivateBus bus;
  DaemonProcess d(bus.address(), std::string(kSmallPool) + "[daemon]\nmetrics_file = \"" + prom +
                                     "\"\nmetrics_interval = \"100ms\"\n");
  ASSERT_TRUE(d.started()) << d.log();
  auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", model});
  ASSERT_EQ(load.exit_code, 0) << load.err;

  std::string text;
  for (int i = 0; i < 100; ++i) {
    std::ifstream in(prom);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    if (text.find("airs_model_resident_bytes{model=\"metrics-model\"}") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(text.find("airs_pool_bytes 67108864"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("airs_model_bytes{{model=\"metrics-model\"}} {}", plan->file_size)), std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE airs_fault_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("airs_kv_sessions 0"), std::string::npos);
  // Unloaded by name: the JSON says what went, and status lists no model.
  auto un = run_process({airsctl_path(), "--bus", bus.address(), "--json", "unload", "metrics-model"});
  ASSERT_EQ(un.exit_code, 0) << un.err;
  auto uj = nlohmann::json::parse(un.out);
  EXPECT_EQ(uj["unloaded"], "metrics-model");
  EXPECT_EQ(uj["object"].get<std::string>().rfind("/org/aios/Airs1/model/", 0), 0U) << un.out;
  EXPECT_EQ(uj["forced"], false);
  auto st = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status"});
  ASSERT_EQ(st.exit_code, 0) << st.err;
  EXPECT_TRUE(nlohmann::json::parse(st.out)["models"].empty()) << st.out;
  auto again = run_process({airsctl_path(), "--bus", bus.address(), "unload", "metrics-model"});
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.err.find("no model named metrics-model"), std::string::npos) << again.err;
  EXPECT_EQ(d.stop(), 0);
  fs::remove_all(dir);
}
