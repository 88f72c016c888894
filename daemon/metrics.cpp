// SPDX-License-Identifier: Apache-2.0
#include "daemon/metrics.hpp"

#include <vector>

#include <fmt/format.h>

#include "sys/files.hpp"
#include "util/text.hpp"

namespace airs::daemon {
namespace {

// Label values: names are checked where they enter the daemon; made
// printable here again so a label can never carry a control character.
std::string escape(const std::string& v) { return printable_name(v); }

void gauge(std::string& out, const char* name, const char* help, double v, const std::string& labels = "") {
  out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{}{} {}\n", name, help, name, name, labels, v);
}

}  // namespace

std::string format_metrics(const StatusSnapshot& s) {
  std::string out;
  const pool::PoolCounts pool = s.pool.local ? s.pool.local->counts : pool::PoolCounts{};
  gauge(out, "airs_pool_bytes", "Pool size in bytes", static_cast<double>(pool.total_bytes()));
  out += "# HELP airs_pool_kind_bytes Pool bytes by kind\n# TYPE airs_pool_kind_bytes gauge\n";
  for (auto [k, v] : {std::pair{"free", pool.free_bytes()}, std::pair{"model", pool.model_bytes()},
                      std::pair{"kv", pool.kv_bytes()}})
    out += fmt::format("airs_pool_kind_bytes{{kind=\"{}\"}} {}\n", k, v);
  gauge(out, "airs_pool_page_bytes", "Huge page size of the pool", static_cast<double>(pool.page_size));
  gauge(out, "airs_mem_available_bytes", "MemAvailable seen by the daemon", static_cast<double>(s.mem_available.value_or(0)));
  // Written while the bus is away too: the one place that says so then.
  gauge(out, "airs_bus_connected", "1 while the daemon owns its name on its bus, 0 while it waits for the bus",
        s.bus.state == "connected" ? 1.0 : 0.0);
  out += fmt::format("# HELP airs_bus_losses_total Times the daemon lost its bus connection\n"
                     "# TYPE airs_bus_losses_total counter\nairs_bus_losses_total {}\n",
                     s.bus.losses);
  gauge(out, "airs_bus_lost_owners", "Connections of a lost bus whose holdings are kept while their processes live",
        static_cast<double>(s.bus.lost_owners));

  // Models the pager knows (with stats).
  std::vector<const ModelStatus*> models;
  for (const auto& m : s.models)
    if (m.stats) models.push_back(&m);
  out += "# HELP airs_model_bytes Model file size\n# TYPE airs_model_bytes gauge\n";
  for (const auto* m : models) out += fmt::format("airs_model_bytes{{model=\"{}\"}} {}\n", escape(m->name), m->size);
  out += "# HELP airs_model_resident_bytes Model bytes resident in the pool\n# TYPE airs_model_resident_bytes gauge\n";
  for (const auto* m : models)
    out += fmt::format("airs_model_resident_bytes{{model=\"{}\"}} {}\n", escape(m->name), m->stats->resident_bytes);
  out += "# HELP airs_model_refcount References held by clients\n# TYPE airs_model_refcount gauge\n";
  for (const auto* m : models) out += fmt::format("airs_model_refcount{{model=\"{}\"}} {}\n", escape(m->name), m->refcount);
  out += "# HELP airs_model_read_bytes_total Bytes read from the GGUF since the last (re)load\n# TYPE airs_model_read_bytes_total counter\n";
  for (const auto* m : models)
    out += fmt::format("airs_model_read_bytes_total{{model=\"{}\"}} {}\n", escape(m->name), m->stats->bytes_read);

  // Streamed models (bigger than their budget of the pool): what they hold,
  // what a token reads, and what the offline optimum would read.
  out += "# HELP airs_model_budget_bytes Pool bytes a streamed model may hold\n# TYPE airs_model_budget_bytes gauge\n";
  for (const auto* m : models)
    if (m->stats->streamed)
      out += fmt::format("airs_model_budget_bytes{{model=\"{}\"}} {}\n", escape(m->name),
                         m->stats->stream.budget_units * m->stats->unit_size);
  out += "# HELP airs_model_token_read_bytes Bytes a streamed model read for its last token\n"
         "# TYPE airs_model_token_read_bytes gauge\n";
  for (const auto* m : models)
    if (m->stats->streamed) {
      const auto& st = m->stats->stream;
      const uint64_t unit = m->stats->unit_size;
      out += fmt::format("airs_model_token_read_bytes{{model=\"{}\",of=\"measured\"}} {}\n", escape(m->name),
                         st.last_pass_units_read * unit);
      out += fmt::format("airs_model_token_read_bytes{{model=\"{}\",of=\"optimum\"}} {}\n", escape(m->name),
                         st.cyclic_units > st.budget_units ? (st.cyclic_units - st.budget_units) * unit : 0);
    }

  out += "# HELP airs_fault_latency_seconds Fault to resume latency\n# TYPE airs_fault_latency_seconds histogram\n";
  for (const auto* m : models) {
    const std::string name = escape(m->name);
    for (auto [kind, h] : {std::pair{"ready", &m->stats->ready_latency}, std::pair{"waited", &m->stats->wait_latency}}) {
      uint64_t cum = 0;
      for (size_t i = 0; i < pager::LatencyHistogram::kUpperUs.size(); ++i) {
        cum += h->counts[i];
        out += fmt::format("airs_fault_latency_seconds_bucket{{model=\"{}\",page=\"{}\",le=\"{}\"}} {}\n", name, kind,
                           static_cast<double>(pager::LatencyHistogram::kUpperUs[i]) / 1e6, cum);
      }
      out += fmt::format("airs_fault_latency_seconds_bucket{{model=\"{}\",page=\"{}\",le=\"+Inf\"}} {}\n", name, kind,
                         h->samples);
      out += fmt::format("airs_fault_latency_seconds_sum{{model=\"{}\",page=\"{}\"}} {}\n", name, kind,
                         static_cast<double>(h->sum_us) / 1e6);
      out += fmt::format("airs_fault_latency_seconds_count{{model=\"{}\",page=\"{}\"}} {}\n", name, kind, h->samples);
    }
  }

  const kv::KvStats kv = s.kv ? s.kv->totals : kv::KvStats{};
  gauge(out, "airs_kv_sessions", "Open KV sessions", kv.sessions);
  out += "# HELP airs_kv_bytes KV bytes by use\n# TYPE airs_kv_bytes gauge\n";
  for (auto [k, v] : {std::pair{"used", kv.used_bytes}, std::pair{"cached", kv.cached_bytes},
                      std::pair{"free", kv.free_bytes}, std::pair{"waste", kv.waste_bytes()}})
    out += fmt::format("airs_kv_bytes{{use=\"{}\"}} {}\n", k, v);

  if (const auto& pr = s.pressure) {
    gauge(out, "airs_pressure_level", "Pressure level: 0 none, 1 some, 2 full",
          pr->level == policy::Level::Full ? 2.0 : pr->level == policy::Level::Some ? 1.0 : 0.0);
    gauge(out, "airs_psi_some_avg10", "PSI memory some avg10", pr->psi ? pr->psi->some.avg10 : 0.0);
    gauge(out, "airs_psi_full_avg10", "PSI memory full avg10", pr->psi ? pr->psi->full.avg10 : 0.0);
    out += fmt::format("# HELP airs_evictions_total Eviction runs of the pressure loop and admin Evict\n# TYPE airs_evictions_total counter\nairs_evictions_total {}\n",
                       pr->counters.evictions);
    out += fmt::format("# HELP airs_evicted_bytes_total Bytes evicted\n# TYPE airs_evicted_bytes_total counter\nairs_evicted_bytes_total {}\n",
                       pr->counters.evicted_bytes);
  }
  return out;
}

Status write_metrics_file(const std::string& path, const std::string& text) {
  // node_exporter runs as another user: world-readable. No fsync: the
  // loop writes it (every metrics_interval), and a file a crash loses is
  // written again at the next tick; readers never see a torn one.
  if (auto st = sys::write_file_atomic(path, text, 0644, sys::Durability::Readers); !st)
    return make_error(st.error().code, "metrics: cannot write {}", st.error().message);
  return {};
}

}  // namespace airs::daemon
