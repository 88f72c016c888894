// SPDX-License-Identifier: Apache-2.0
// Every metric the Grafana dashboard (docs/grafana) queries is one a real
// airs-memd writes, with the labels and values it writes, and every family
// it writes is on the dashboard (check_dashboard.py).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon_fixture.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

TEST(MetricsDashboard, QueriesOnlyWhatTheDaemonWritesAndShowsAllOfIt) {
  airs::gguf::ModelSpec spec;
  spec.name = "dash-model";  // airs-demo registers it as "demo"
  auto plan = airs::gguf::plan_model(spec);
  ASSERT_TRUE(plan) << plan.error().message;
  const auto dir = fs::temp_directory_path() / ("airs-dashboard-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto model = (dir / "m.gguf").string();
  ASSERT_TRUE(airs::gguf::write_model_file(*plan, model));
  // And one bigger than the pool: it is streamed (its budget and bytes per
  // token are on the dashboard too).
  airs::gguf::ModelSpec big;
  big.name = "dash-streamed";
  big.n_layers = 8;
  big.n_embd = 1024;
  big.n_ff = 2816;
  auto big_plan = airs::gguf::plan_model(big);
  ASSERT_TRUE(big_plan) << big_plan.error().message;
  const auto streamed = (dir / "big.gguf").string();
  ASSERT_TRUE(airs::gguf::write_model_file(*big_plan, streamed));
  ASSERT_GT(fs::file_size(streamed), 64U << 20) << "the streamed model must be bigger than the pool";
  const auto prom = (dir / "airs.prom").string();

  PrivateBus bus;
  DaemonProcess d(bus.address(), "[pool]\nsize = \"64M\"\n[daemon]\nmetrics_file = \"" + prom +
                                     "\"\nmetrics_interval = \"100ms\"\n");
  ASSERT_TRUE(d.started()) << d.log();
  // A client maps the model lazily, reads every tensor (faults: the latency
  // histogram gets samples), opens a KV session and holds both, so the
  // pressure loop cannot evict the model as idle while the file is read.
  ProcessResult demo;
  std::thread client([&] {
    demo = run_process({AIRS_DEMO_PATH, "--bus", bus.address(), "--hold", "4", model}, std::chrono::seconds(120));
  });
  // Once the demo's model is in, the big one, streamed (not waited for).
  for (int i = 0; i < 100; ++i) {
    auto st = run_process({airsctl_path(), "--bus", bus.address(), "status"});
    if (st.out.find("demo") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", streamed, "--no-wait"});
  EXPECT_EQ(load.exit_code, 0) << load.out << load.err << d.log();
  std::string text;
  for (int i = 0; i < 150; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(prom);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    if (text.find("airs_fault_latency_seconds_bucket{model=\"demo\"") != std::string::npos &&
        text.find("airs_kv_sessions 1") != std::string::npos && text.find("airs_evicted_bytes_total") != std::string::npos &&
        text.find("airs_model_budget_bytes{model=\"dash-streamed\"}") != std::string::npos)
      break;
  }
  client.join();
  EXPECT_EQ(demo.exit_code, 0) << demo.out << demo.err;
  ASSERT_NE(text.find("airs_fault_latency_seconds_bucket{model=\"demo\""), std::string::npos) << text;
  const auto snapshot = (dir / "snapshot.prom").string();
  std::ofstream(snapshot) << text;

  auto r = run_process({PYTHON3, CHECK_DASHBOARD, DASHBOARD_JSON, snapshot});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err << "\nmetrics file:\n" << text;
  EXPECT_NE(r.out.find("expressions"), std::string::npos) << r.out << r.err;
  EXPECT_EQ(d.stop(), 0) << d.log();
  fs::remove_all(dir);
}
