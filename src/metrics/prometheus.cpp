#include "metrics/prometheus.hpp"

#include <cmath>
#include <iterator>

#include <fmt/format.h>

namespace airs::metrics {
namespace {

// Prometheus floats: Go's strconv 'g'-style is accepted; fmt's shortest
// round-trip form ("0.25", "1e-05") is exact and parseable.
std::string num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

class Out {
 public:
  void family(const char* name, const char* type, const char* help) {
    fmt::format_to(std::back_inserter(s_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& name, const std::string& labels, const std::string& value) {
    if (labels.empty()) fmt::format_to(std::back_inserter(s_), "{} {}\n", name, value);
    else fmt::format_to(std::back_inserter(s_), "{}{{{}}} {}\n", name, labels, value);
  }
  void sample(const std::string& name, const std::string& labels, uint64_t v) { sample(name, labels, std::to_string(v)); }
  void comment(const std::string& text) { fmt::format_to(std::back_inserter(s_), "# {}\n", text); }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

std::string label(const char* key, const std::string& value) {
  return fmt::format("{}=\"{}\"", key, escape_label_value(value));
}

std::string histogram_defect(const Histogram& h) {
  if (h.upper_bounds_seconds.size() != h.counts.size())
    return fmt::format("{} bounds but {} bucket counts", h.upper_bounds_seconds.size(), h.counts.size());
  for (size_t i = 0; i < h.upper_bounds_seconds.size(); ++i) {
    if (!std::isfinite(h.upper_bounds_seconds[i])) return fmt::format("bound {} is not finite", i);
    if (i > 0 && !(h.upper_bounds_seconds[i] > h.upper_bounds_seconds[i - 1]))
      return fmt::format("bound {} ({}) is not above bound {}", i, num(h.upper_bounds_seconds[i]), i - 1);
    if (i > 0 && h.counts[i] < h.counts[i - 1]) return fmt::format("bucket {} count decreases (not cumulative)", i);
    if (h.counts[i] > h.count) return fmt::format("bucket {} count {} exceeds the total {}", i, h.counts[i], h.count);
  }
  return {};
}

}  // namespace

std::string escape_label_value(const std::string& v) {
  std::string r;
  r.reserve(v.size());
  for (char c : v) {
    if (c == '\\') r += "\\\\";
    else if (c == '"') r += "\\\"";
    else if (c == '\n') r += "\\n";
    else r += c;
  }
  return r;
}

std::string format_prometheus(const Snapshot& s) {
  Out o;
  o.family("airs_info", "gauge", "airs-memd build and running mode.");
  o.sample("airs_info",
           fmt::format("{},{},{},{}", label("version", s.version), label("profile", s.profile), label("mode", s.mode),
                       label("backend", s.backend)),
           uint64_t{1});
  o.family("airs_up_seconds", "gauge", "Seconds since the daemon started.");
  o.sample("airs_up_seconds", "", num(s.up_seconds));

  o.family("airs_pool_bytes", "gauge", "Model pool bytes by state.");
  o.sample("airs_pool_bytes", label("state", "total"), s.pool.total_bytes);
  o.sample("airs_pool_bytes", label("state", "free"), s.pool.free_bytes);
  o.sample("airs_pool_bytes", label("state", "models"), s.pool.model_bytes);
  o.sample("airs_pool_bytes", label("state", "kv"), s.pool.kv_bytes);
  o.family("airs_pool_page_bytes", "gauge", "Huge page size of the pool.");
  o.sample("airs_pool_page_bytes", "", s.pool.page_bytes);
  o.family("airs_pool_pinned", "gauge", "1 when pool memory can be neither swapped nor reclaimed.");
  o.sample("airs_pool_pinned", "", uint64_t{s.pool.pinned ? 1u : 0u});
  o.family("airs_pool_resize_pages_total", "counter", "Huge pages given back to (shrink) or taken from (grow) the kernel.");
  o.sample("airs_pool_resize_pages_total", label("direction", "shrink"), s.pool.shrunk_pages_total);
  o.sample("airs_pool_resize_pages_total", label("direction", "grow"), s.pool.grown_pages_total);

  o.family("airs_models", "gauge", "Models loaded.");
  o.sample("airs_models", "", uint64_t{s.models.size()});
  o.family("airs_model_bytes", "gauge", "Model region bytes: size, and resident in the pool.");
  for (const auto& m : s.models) {
    o.sample("airs_model_bytes", label("model", m.name) + "," + label("kind", "size"), m.size_bytes);
    o.sample("airs_model_bytes", label("model", m.name) + "," + label("kind", "resident"), m.resident_bytes);
  }
  o.family("airs_model_refcount", "gauge", "Clients holding a reference to the model.");
  for (const auto& m : s.models) o.sample("airs_model_refcount", label("model", m.name), uint64_t{m.refcount});
  o.family("airs_model_pinned", "gauge", "1 when the model is never evicted.");
  for (const auto& m : s.models) o.sample("airs_model_pinned", label("model", m.name), uint64_t{m.pinned ? 1u : 0u});

  o.family("airs_kv_sessions", "gauge", "Open KV sessions.");
  o.sample("airs_kv_sessions", "", uint64_t{s.kv.sessions});
  o.family("airs_kv_bytes", "gauge", "KV cache bytes by state.");
  o.sample("airs_kv_bytes", label("state", "used"), s.kv.used_bytes);
  o.sample("airs_kv_bytes", label("state", "cached"), s.kv.cached_bytes);
  o.sample("airs_kv_bytes", label("state", "free"), s.kv.free_bytes);

  o.family("airs_pressure_level", "gauge", "1 for the current memory pressure level.");
  for (const char* lvl : {"none", "some", "full"})
    o.sample("airs_pressure_level", label("level", lvl), uint64_t{s.pressure.level == lvl ? 1u : 0u});
  o.family("airs_pressure_stall_ratio", "gauge", "Share of the last 10 s with memory stalls (PSI avg10 / 100).");
  o.sample("airs_pressure_stall_ratio", label("kind", "some"), num(s.pressure.some_avg10 / 100.0));
  o.sample("airs_pressure_stall_ratio", label("kind", "full"), num(s.pressure.full_avg10 / 100.0));
  o.family("airs_pressure_events_total", "counter", "Pressure events acted on, by level.");
  o.sample("airs_pressure_events_total", label("kind", "some"), s.pressure.some_events_total);
  o.sample("airs_pressure_events_total", label("kind", "full"), s.pressure.full_events_total);

  o.family("airs_evictions_total", "counter", "Evictions by reason.");
  for (const auto& [reason, n] : s.evictions_total) o.sample("airs_evictions_total", label("reason", reason), n);
  o.family("airs_evicted_bytes_total", "counter", "Bytes freed by evictions.");
  o.sample("airs_evicted_bytes_total", "", s.evicted_bytes_total);

  const Histogram& h = s.fault_latency;
  if (auto defect = histogram_defect(h); !defect.empty()) {
    o.comment("airs_fault_latency_seconds left out: " + defect);
  } else {
    o.family("airs_fault_latency_seconds", "histogram", "Page fault to resume latency of lazily loaded models.");
    for (size_t i = 0; i < h.upper_bounds_seconds.size(); ++i)
      o.sample("airs_fault_latency_seconds_bucket", label("le", num(h.upper_bounds_seconds[i])), h.counts[i]);
    o.sample("airs_fault_latency_seconds_bucket", label("le", "+Inf"), h.count);
    o.sample("airs_fault_latency_seconds_sum", "", num(h.sum_seconds));
    o.sample("airs_fault_latency_seconds_count", "", h.count);
  }
  return o.take();
}

}  // namespace airs::metrics
