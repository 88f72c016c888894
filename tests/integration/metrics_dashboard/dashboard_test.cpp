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
  std::string text;
  for (int i = 0; i < 150; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream in(prom);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    if (text.find("airs_fault_latency_seconds_bucket{model=\"demo\"") != std::string::npos &&
        text.find("airs_kv_sessions 1") != std::string::npos && text.find("airs_evicted_bytes_total") != std::string::npos)
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
