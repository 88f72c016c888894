#include "daemon/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "sys/fd.hpp"
#include "util/text.hpp"

namespace airs::daemon {
namespace {

// Label values: names are checked where they enter the daemon; made
// printable here again so a label can never carry a control character.
std::string escape(const std::string& v) { return printable_name(v); }

template <typename T>
T num(const dbus::Dict& d, const char* k) {
  return dbus::get<T>(d, k).value_or(T{});
}

void gauge(std::string& out, const char* name, const char* help, double v, const std::string& labels = "") {
  out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{}{} {}\n", name, help, name, name, labels, v);
}

}  // namespace

std::string format_metrics(const dbus::Dict& s, const std::vector<std::pair<std::string, pager::ModelStats>>& models) {
  std::string out;
  const auto pool = num<dbus::Dict>(s, "pool");
  gauge(out, "airs_pool_bytes", "Pool size in bytes", static_cast<double>(num<uint64_t>(pool, "total_bytes")));
  out += "# HELP airs_pool_kind_bytes Pool bytes by kind\n# TYPE airs_pool_kind_bytes gauge\n";
  for (auto k : {"free", "model", "kv"})
    out += fmt::format("airs_pool_kind_bytes{{kind=\"{}\"}} {}\n", k, num<uint64_t>(pool, (std::string(k) + "_bytes").c_str()));
  gauge(out, "airs_pool_page_bytes", "Huge page size of the pool", static_cast<double>(num<uint64_t>(s, "page_size")));
  gauge(out, "airs_mem_available_bytes", "MemAvailable seen by the daemon", static_cast<double>(num<uint64_t>(s, "mem_available")));

  const auto ms = num<std::vector<dbus::Dict>>(s, "models");
  out += "# HELP airs_model_bytes Model file size\n# TYPE airs_model_bytes gauge\n";
  for (auto& m : ms)
    out += fmt::format("airs_model_bytes{{model=\"{}\"}} {}\n", escape(num<std::string>(m, "name")), num<uint64_t>(m, "size"));
  out += "# HELP airs_model_resident_bytes Model bytes resident in the pool\n# TYPE airs_model_resident_bytes gauge\n";
  for (auto& m : ms)
    out += fmt::format("airs_model_resident_bytes{{model=\"{}\"}} {}\n", escape(num<std::string>(m, "name")),
                       num<uint64_t>(m, "resident_bytes"));
  out += "# HELP airs_model_refcount References held by clients\n# TYPE airs_model_refcount gauge\n";
  for (auto& m : ms)
    out += fmt::format("airs_model_refcount{{model=\"{}\"}} {}\n", escape(num<std::string>(m, "name")), num<uint32_t>(m, "refcount"));
  out += "# HELP airs_model_read_bytes_total Bytes read from the GGUF since the last (re)load\n# TYPE airs_model_read_bytes_total counter\n";
  for (auto& m : ms)
    out += fmt::format("airs_model_read_bytes_total{{model=\"{}\"}} {}\n", escape(num<std::string>(m, "name")),
                       num<uint64_t>(m, "bytes_read"));

  out += "# HELP airs_fault_latency_seconds Fault to resume latency\n# TYPE airs_fault_latency_seconds histogram\n";
  for (auto& [name, st] : models) {
    for (auto [kind, h] : {std::pair{"ready", &st.ready_latency}, std::pair{"waited", &st.wait_latency}}) {
      uint64_t cum = 0;
      for (size_t i = 0; i < pager::LatencyHistogram::kUpperUs.size(); ++i) {
        cum += h->counts[i];
        out += fmt::format("airs_fault_latency_seconds_bucket{{model=\"{}\",page=\"{}\",le=\"{}\"}} {}\n", escape(name), kind,
                           static_cast<double>(pager::LatencyHistogram::kUpperUs[i]) / 1e6, cum);
      }
      out += fmt::format("airs_fault_latency_seconds_bucket{{model=\"{}\",page=\"{}\",le=\"+Inf\"}} {}\n", escape(name), kind,
                         h->samples);
      out += fmt::format("airs_fault_latency_seconds_sum{{model=\"{}\",page=\"{}\"}} {}\n", escape(name), kind,
                         static_cast<double>(h->sum_us) / 1e6);
      out += fmt::format("airs_fault_latency_seconds_count{{model=\"{}\",page=\"{}\"}} {}\n", escape(name), kind, h->samples);
    }
  }

  const auto kv = num<dbus::Dict>(s, "kv");
  gauge(out, "airs_kv_sessions", "Open KV sessions", num<uint32_t>(kv, "sessions"));
  out += "# HELP airs_kv_bytes KV bytes by use\n# TYPE airs_kv_bytes gauge\n";
  for (auto k : {"used", "cached", "free", "waste"})
    out += fmt::format("airs_kv_bytes{{use=\"{}\"}} {}\n", k, num<uint64_t>(kv, (std::string(k) + "_bytes").c_str()));

  const auto pr = num<dbus::Dict>(s, "pressure");
  if (!pr.empty()) {
    const std::string lvl = num<std::string>(pr, "level");
    gauge(out, "airs_pressure_level", "Pressure level: 0 none, 1 some, 2 full",
          lvl == "full" ? 2.0 : lvl == "some" ? 1.0 : 0.0);
    gauge(out, "airs_psi_some_avg10", "PSI memory some avg10", num<double>(pr, "some_avg10"));
    gauge(out, "airs_psi_full_avg10", "PSI memory full avg10", num<double>(pr, "full_avg10"));
    out += fmt::format("# HELP airs_evictions_total Eviction runs of the pressure loop and admin Evict\n# TYPE airs_evictions_total counter\nairs_evictions_total {}\n",
                       num<uint64_t>(pr, "evictions"));
    out += fmt::format("# HELP airs_evicted_bytes_total Bytes evicted\n# TYPE airs_evicted_bytes_total counter\nairs_evicted_bytes_total {}\n",
                       num<uint64_t>(pr, "evicted_bytes"));
  }
  return out;
}

Status write_metrics_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  sys::UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return make_error(errno, "metrics: cannot write {}: {}", tmp, std::strerror(errno));
  for (size_t off = 0; off < text.size();) {
    ssize_t n = ::write(fd.get(), text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(errno, "metrics: writing {}: {}", tmp, std::strerror(errno));
    }
    off += static_cast<size_t>(n);
  }
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error(errno, "metrics: rename to {}: {}", path, std::strerror(errno));
  return {};
}

}  // namespace airs::daemon
