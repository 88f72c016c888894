#include "metrics/prometheus.hpp"

#include <gtest/gtest.h>

namespace airs::metrics {
namespace {

Snapshot sample_snapshot() {
  Snapshot s;
  s.version = "0.1.0";
  s.profile = "8gb";
  s.mode = "full";
  s.backend = "hugetlbfs";
  s.up_seconds = 12.5;
  s.pool = {2097152, 67108864, 33554432, 25165824, 8388608, true, 3, 1};
  s.models = {{"llama-7b", 4194304, 2097152, 2, true}};
  s.kv = {4, 6291456, 1048576, 1048576};
  s.pressure = {"some", 12.5, 0.0, 7, 1};
  s.evictions_total = {{"pressure", 5}, {"allocation", 2}};
  s.evicted_bytes_total = 10485760;
  s.fault_latency = {{0.0001, 0.001, 0.01}, {10, 90, 99}, 100, 0.25};
  return s;
}

TEST(Prometheus, WholeExpositionByteForByte) {
  const std::string want =
      "# HELP airs_info airs-memd build and running mode.\n"
      "# TYPE airs_info gauge\n"
      "airs_info{version=\"0.1.0\",profile=\"8gb\",mode=\"full\",backend=\"hugetlbfs\"} 1\n"
      "# HELP airs_up_seconds Seconds since the daemon started.\n"
      "# TYPE airs_up_seconds gauge\n"
      "airs_up_seconds 12.5\n"
      "# HELP airs_pool_bytes Model pool bytes by state.\n"
      "# TYPE airs_pool_bytes gauge\n"
      "airs_pool_bytes{state=\"total\"} 67108864\n"
      "airs_pool_bytes{state=\"free\"} 33554432\n"
      "airs_pool_bytes{state=\"models\"} 25165824\n"
      "airs_pool_bytes{state=\"kv\"} 8388608\n"
      "# HELP airs_pool_page_bytes Huge page size of the pool.\n"
      "# TYPE airs_pool_page_bytes gauge\n"
      "airs_pool_page_bytes 2097152\n"
      "# HELP airs_pool_pinned 1 when pool memory can be neither swapped nor reclaimed.\n"
      "# TYPE airs_pool_pinned gauge\n"
      "airs_pool_pinned 1\n"
      "# HELP airs_pool_resize_pages_total Huge pages given back to (shrink) or taken from (grow) the kernel.\n"
      "# TYPE airs_pool_resize_pages_total counter\n"
      "airs_pool_resize_pages_total{direction=\"shrink\"} 3\n"
      "airs_pool_resize_pages_total{direction=\"grow\"} 1\n"
      "# HELP airs_models Models loaded.\n"
      "# TYPE airs_models gauge\n"
      "airs_models 1\n"
      "# HELP airs_model_bytes Model region bytes: size, and resident in the pool.\n"
      "# TYPE airs_model_bytes gauge\n"
      "airs_model_bytes{model=\"llama-7b\",kind=\"size\"} 4194304\n"
      "airs_model_bytes{model=\"llama-7b\",kind=\"resident\"} 2097152\n"
      "# HELP airs_model_refcount Clients holding a reference to the model.\n"
      "# TYPE airs_model_refcount gauge\n"
      "airs_model_refcount{model=\"llama-7b\"} 2\n"
      "# HELP airs_model_pinned 1 when the model is never evicted.\n"
      "# TYPE airs_model_pinned gauge\n"
      "airs_model_pinned{model=\"llama-7b\"} 1\n"
      "# HELP airs_kv_sessions Open KV sessions.\n"
      "# TYPE airs_kv_sessions gauge\n"
      "airs_kv_sessions 4\n"
      "# HELP airs_kv_bytes KV cache bytes by state.\n"
      "# TYPE airs_kv_bytes gauge\n"
      "airs_kv_bytes{state=\"used\"} 6291456\n"
      "airs_kv_bytes{state=\"cached\"} 1048576\n"
      "airs_kv_bytes{state=\"free\"} 1048576\n"
      "# HELP airs_pressure_level 1 for the current memory pressure level.\n"
      "# TYPE airs_pressure_level gauge\n"
      "airs_pressure_level{level=\"none\"} 0\n"
      "airs_pressure_level{level=\"some\"} 1\n"
      "airs_pressure_level{level=\"full\"} 0\n"
      "# HELP airs_pressure_stall_ratio Share of the last 10 s with memory stalls (PSI avg10 / 100).\n"
      "# TYPE airs_pressure_stall_ratio gauge\n"
      "airs_pressure_stall_ratio{kind=\"some\"} 0.125\n"
      "airs_pressure_stall_ratio{kind=\"full\"} 0\n"
      "# HELP airs_pressure_events_total Pressure events acted on, by level.\n"
      "# TYPE airs_pressure_events_total counter\n"
      "airs_pressure_events_total{kind=\"some\"} 7\n"
      "airs_pressure_events_total{kind=\"full\"} 1\n"
      "# HELP airs_evictions_total Evictions by reason.\n"
      "# TYPE airs_evictions_total counter\n"
      "airs_evictions_total{reason=\"allocation\"} 2\n"
      "airs_evictions_total{reason=\"pressure\"} 5\n"
      "# HELP airs_evicted_bytes_total Bytes freed by evictions.\n"
      "# TYPE airs_evicted_bytes_total counter\n"
      "airs_evicted_bytes_total 10485760\n"
      "# HELP airs_fault_latency_seconds Page fault to resume latency of lazily loaded models.\n"
      "# TYPE airs_fault_latency_seconds histogram\n"
      "airs_fault_latency_seconds_bucket{le=\"0.0001\"} 10\n"
      "airs_fault_latency_seconds_bucket{le=\"0.001\"} 90\n"
      "airs_fault_latency_seconds_bucket{le=\"0.01\"} 99\n"
      "airs_fault_latency_seconds_bucket{le=\"+Inf\"} 100\n"
      "airs_fault_latency_seconds_sum 0.25\n"
      "airs_fault_latency_seconds_count 100\n";
  EXPECT_EQ(format_prometheus(sample_snapshot()), want);
}

TEST(Prometheus, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  Snapshot s = sample_snapshot();
  s.models = {{"we\"ird\\name\n", 1, 0, 0, false}};
  const std::string out = format_prometheus(s);
  EXPECT_NE(out.find("airs_model_refcount{model=\"we\\\"ird\\\\name\\n\"} 0\n"), std::string::npos) << out;
}

TEST(Prometheus, NoModelsKeepsTheFamilyHeaders) {
  Snapshot s = sample_snapshot();
  s.models.clear();
  const std::string out = format_prometheus(s);
  EXPECT_NE(out.find("airs_models 0\n"), std::string::npos);
  EXPECT_NE(out.find("# TYPE airs_model_bytes gauge\n# HELP airs_model_refcount"), std::string::npos) << out;
}

TEST(Prometheus, MalformedHistogramIsLeftOutAndNamed) {
  Snapshot s = sample_snapshot();
  s.fault_latency.counts = {10, 5, 99};  // not cumulative
  std::string out = format_prometheus(s);
  EXPECT_EQ(out.find("airs_fault_latency_seconds_bucket"), std::string::npos);
  EXPECT_NE(out.find("# airs_fault_latency_seconds left out: bucket 1 count decreases (not cumulative)\n"),
            std::string::npos)
      << out;
  // The rest is still there.
  EXPECT_NE(out.find("airs_evicted_bytes_total 10485760\n"), std::string::npos);

  s = sample_snapshot();
  s.fault_latency.counts.pop_back();
  EXPECT_NE(format_prometheus(s).find("left out: 3 bounds but 2 bucket counts"), std::string::npos);
  s = sample_snapshot();
  s.fault_latency.upper_bounds_seconds = {0.001, 0.001, 0.01};
  EXPECT_NE(format_prometheus(s).find("left out: bound 1 (0.001) is not above bound 0"), std::string::npos);
  s = sample_snapshot();
  s.fault_latency.count = 50;
  EXPECT_NE(format_prometheus(s).find("left out: bucket 1 count 90 exceeds the total 50"), std::string::npos);
}

TEST(Prometheus, EmptyHistogramHasOnlyTheInfBucket) {
  Snapshot s = sample_snapshot();
  s.fault_latency = {};
  const std::string out = format_prometheus(s);
  EXPECT_NE(out.find("airs_fault_latency_seconds_bucket{le=\"+Inf\"} 0\n"
                     "airs_fault_latency_seconds_sum 0\n"
                     "airs_fault_latency_seconds_count 0\n"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace airs::metrics
