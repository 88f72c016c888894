// SPDX-License-Identifier: Apache-2.0
// expert_bench: which experts a streamed mixture-of-experts model keeps.
// Replays expert traces (airs-generate --expert-trace, or a synthetic
// uniform one) through the daemon's own StreamPolicy and ExpertCache on
// the model's real unit layout (daemon/extents.cpp, ExpertLayout), for
// each cache policy, next to Belady's MIN (the offline optimum: the fewest
// unit reads any policy could do on the same trace and budget).
//
//   expert_bench --model M.gguf [--trace T.txt | --uniform TOKENS] [--unit BYTES]
//                [--ratio 2.3] [--ratio 1.5] [--budget BYTES] [--seed S]
//
// The budget is the file size over each --ratio (the model is that many
// times the pool), in whole units, or each --budget (a daemon's streaming
// budget, as `airsctl status` says it: bench/moe replays its run's trace
// at its run's budget). The dense part (every unit that is not
// only experts') is resident from the start, as the daemon's warm-up
// leaves it; the rest of the budget is the expert cache. A use of an
// expert reads its units that are not in (the daemon reads an expert's
// three slices together), each in place of the policy's victim.
//
// Two views per policy: "all uses" (the policy is told every use: what
// clients' expert hints give the daemon, airs_model_hint_experts) and
// "misses" (told only uses that find a unit missing: what the daemon sees
// without hints, a resident unit staying mapped in a lazy client and open
// in a cooperative one). bench_hints.sh measures the two end to end.
// Printed per decode token (prefill passes are replayed, not counted): the
// experts' hit rate (uses whose units were all in), MiB read, and that
// over MIN's. With --uniform, also the floor: the fewest reads any online
// policy can expect on such routing (online_floor), against MIN's. One
// run; ratios side by side.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/extents.hpp"
#include "gguf/file_io.hpp"
#include "gguf/gguf.hpp"
#include "pager/expert_layout.hpp"
#include "pager/fill_plan.hpp"
#include "pager/stream_policy.hpp"

namespace {

using namespace airs;
using pager::ExpertPolicy;

// One forward pass: per layer, the experts it chose.
struct Pass {
  bool decode = false;
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> layers;
};

std::vector<Pass> read_trace(const std::string& path) {
  std::vector<Pass> out;
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "expert_bench: cannot read %s\n", path.c_str());
    std::exit(1);
  }
  std::string line;
  uint32_t last_layer = UINT32_MAX;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    char phase = 0;
    uint32_t layer = 0;
    if (!(f >> phase >> layer)) continue;
    if (out.empty() || layer <= last_layer) out.push_back({phase == 'D', {}});
    last_layer = layer;
    std::vector<uint32_t> experts;
    for (uint32_t e = 0; f >> e;) experts.push_back(e);
    out.back().layers.emplace_back(layer, std::move(experts));
  }
  return out;
}

// Every layer chooses `used` distinct experts of `n` at random, the same
// for each: the worst case (nothing to learn, nothing hot).
std::vector<Pass> uniform_trace(uint32_t tokens, uint32_t layers, uint32_t n, uint32_t used, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Pass> out(tokens);
  std::vector<uint32_t> all(n);
  for (uint32_t t = 0; t < tokens; ++t) {
    out[t].decode = true;
    for (uint32_t l = 0; l < layers; ++l) {
      for (uint32_t e = 0; e < n; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), rng);
      std::vector<uint32_t> pick(all.begin(), all.begin() + used);
      std::sort(pick.begin(), pick.end());
      out[t].layers.emplace_back(l, std::move(pick));
    }
  }
  return out;
}

struct Count {
  uint64_t uses = 0, hits = 0, reads = 0;  // decode passes only
};

// The expert units each use reads, in trace order, with its pass.
struct Use {
  uint32_t key = 0;
  bool decode = false;
};

std::vector<Use> uses_of(const std::vector<Pass>& trace, const pager::ExpertLayout& l) {
  std::vector<Use> out;
  for (const Pass& p : trace)
    for (const auto& [layer, experts] : p.layers)
      for (uint32_t e : experts)
        if (auto k = l.find({layer, e})) out.push_back({*k, p.decode});
  return out;
}

// Through the daemon's StreamPolicy: `budget` units, the dense part in.
Count replay(const std::vector<Use>& uses, const std::vector<pager::Extent>& ex, uint64_t size, uint64_t unit,
              uint32_t budget, ExpertPolicy pol, bool misses_only) {
  pager::StreamPolicy p(pager::unit_steps(ex, size, unit), 2, pager::ExpertLayout(ex, size, unit), pol);
  const pager::ExpertLayout& l = p.experts();
  std::vector<bool> in(p.unit_count(), false);
  std::vector<uint32_t> resident;
  for (uint32_t u = 0; u < p.unit_count(); ++u)
    if (p.cyclic(u)) in[u] = true, resident.push_back(u);
  Count r;
  constexpr uint64_t kClient = 1;
  for (const Use& use : uses) {
    const auto& units = l.units_of(use.key);
    const bool hit = std::all_of(units.begin(), units.end(), [&](uint32_t u) { return in[u]; });
    if (!misses_only || !hit) p.touched_expert(kClient, use.key);
    if (use.decode) ++r.uses, r.hits += hit ? 1U : 0U;
    for (uint32_t u : units) {
      if (in[u]) {
        if (!misses_only) p.touched(kClient, u);
        continue;
      }
      p.touched(kClient, u);
      while (resident.size() >= budget) {
        const auto v = p.victim(resident, 0, true);
        if (!v) {
          std::fprintf(stderr, "expert_bench: no victim in a budget of %u\n", budget);
          std::exit(1);
        }
        in[*v] = false;
        resident.erase(std::find(resident.begin(), resident.end(), *v));
      }
      in[u] = true;
      resident.push_back(u);
      if (use.decode) ++r.reads;
    }
  }
  return r;
}

// Belady's MIN on the expert units' request sequence, `capacity` units
// (the budget less the dense part).
Count belady(const std::vector<Use>& uses, const pager::ExpertLayout& l, uint32_t units, uint32_t capacity) {
  struct Req {
    uint32_t unit;
    size_t use;
  };
  std::vector<Req> seq;
  for (size_t i = 0; i < uses.size(); ++i)
    for (uint32_t u : l.units_of(uses[i].key))
      if (l.expert_unit(u)) seq.push_back({u, i});
  std::vector<size_t> next(seq.size());
  std::vector<size_t> last(units, std::numeric_limits<size_t>::max());
  for (size_t i = seq.size(); i-- > 0;) {
    next[i] = last[seq[i].unit];
    last[seq[i].unit] = i;
  }
  std::vector<size_t> next_of(units, std::numeric_limits<size_t>::max());
  std::vector<bool> in(units, false);
  std::vector<uint32_t> resident;
  Count r;
  std::vector<bool> use_missed(uses.size(), false);
  for (size_t i = 0; i < seq.size(); ++i) {
    const uint32_t u = seq[i].unit;
    if (!in[u]) {
      use_missed[seq[i].use] = true;
      if (uses[seq[i].use].decode) ++r.reads;
      if (resident.size() >= capacity) {
        auto far = std::max_element(resident.begin(), resident.end(),
                                    [&](uint32_t a, uint32_t b) { return next_of[a] < next_of[b]; });
        in[*far] = false;
        *far = resident.back();
        resident.pop_back();
      }
      in[u] = true;
      resident.push_back(u);
    }
    next_of[u] = next[i];
  }
  for (size_t i = 0; i < uses.size(); ++i)
    if (uses[i].decode) ++r.uses, r.hits += use_missed[i] ? 0U : 1U;
  return r;
}

// The fewest units any online policy can read per decode token, in
// expectation, when every layer picks `used` of its `n` experts uniformly
// at random and independently of the past (the --uniform trace): a unit u
// that k experts of its layer hold is needed at its layer's step with
// probability q(u) = 1 - C(n - k, used) / C(n, used). A policy's choices
// cannot depend on the pick they precede, so a unit it holds at that step
// saves q(u) reads, and one that stays from one token to the next holds a
// unit of the cache for it. Reading a unit in between to have it at the
// step costs a read to save q(u) <= 1, never less than missing it. So the
// expected reads are at least the sum of q(u) over every expert unit less
// its `capacity` largest terms (the transient room a miss needs is not even
// charged). MIN is below it by what knowing the next picks is worth.
double online_floor(const pager::ExpertLayout& l, uint32_t units, uint32_t n, uint32_t used, uint32_t capacity) {
  std::vector<uint32_t> holders(units, 0);
  for (uint32_t k = 0; k < l.key_count(); ++k)
    for (uint32_t u : l.units_of(k))
      if (l.expert_unit(u)) ++holders[u];
  std::vector<double> q;
  for (uint32_t u = 0; u < units; ++u) {
    if (!l.expert_unit(u)) continue;
    double none = 1.0;  // C(n - k, used) / C(n, used): no pick holds u
    for (uint32_t i = 0; i < used; ++i)
      none *= holders[u] + i >= n ? 0.0 : static_cast<double>(n - holders[u] - i) / static_cast<double>(n - i);
    q.push_back(1.0 - none);
  }
  std::sort(q.begin(), q.end(), std::greater<>());
  double floor = 0;
  for (size_t i = std::min<size_t>(capacity, q.size()); i < q.size(); ++i) floor += q[i];
  return floor;
}

[[noreturn]] void usage() {
  std::fputs("usage: expert_bench --model M.gguf [--trace T.txt | --uniform TOKENS] [--unit BYTES] [--ratio R]... "
             "[--budget BYTES]... [--seed S]\n",
             stderr);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, trace_path;
  uint32_t uniform = 0;
  uint64_t unit = uint64_t{2} << 20, seed = 1;
  std::vector<double> ratios;
  std::vector<uint64_t> budgets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage();
    const char* v = argv[++i];
    if (a == "--model") model = v;
    else if (a == "--trace") trace_path = v;
    else if (a == "--uniform") uniform = static_cast<uint32_t>(std::strtoul(v, nullptr, 0));
    else if (a == "--unit") unit = std::strtoull(v, nullptr, 0);
    else if (a == "--ratio") ratios.push_back(std::strtod(v, nullptr));
    else if (a == "--budget") budgets.push_back(std::strtoull(v, nullptr, 0));
    else if (a == "--seed") seed = std::strtoull(v, nullptr, 0);
    else usage();
  }
  if (model.empty() || (trace_path.empty() == (uniform == 0)) || unit == 0) usage();
  if (ratios.empty() && budgets.empty()) ratios = {2.3};
  auto src = gguf::FdSource::open(model);
  if (!src) {
    std::fprintf(stderr, "expert_bench: %s: %s\n", model.c_str(), src.error().message.c_str());
    return 1;
  }
  auto file = gguf::parse(*src);
  if (!file) {
    std::fprintf(stderr, "expert_bench: %s: %s\n", model.c_str(), file.error().message.c_str());
    return 1;
  }
  const uint64_t size = file->file_size;
  const std::vector<pager::Extent> ex = daemon::extents_of(*file);
  const pager::ExpertLayout layout(ex, size, unit);
  if (layout.empty()) {
    std::fprintf(stderr, "expert_bench: %s has no experts\n", model.c_str());
    return 1;
  }
  const uint32_t n_expert = layout.key_count() / layout.layers();
  const uint64_t used = file->find_uint(file->architecture + ".expert_used_count").value_or(2);
  const std::vector<Pass> trace = uniform != 0 ? uniform_trace(uniform, layout.layers(), n_expert,
                                                               static_cast<uint32_t>(used), seed)
                                               : read_trace(trace_path);
  const std::vector<Use> uses = uses_of(trace, layout);
  const auto units = static_cast<uint32_t>((size + unit - 1) / unit);
  const pager::StreamPolicy probe(pager::unit_steps(ex, size, unit), 2, layout);
  uint32_t expert_units = 0;
  for (uint32_t u = 0; u < units; ++u) expert_units += layout.expert_unit(u) ? 1U : 0U;
  uint64_t tokens = 0;
  for (const Pass& p : trace) tokens += p.decode ? 1 : 0;
  std::printf("model %s: %.1f MiB, %u units of %.1f MiB: %u dense, %u only experts (%u layers x %u experts, %lu "
              "used); trace %s: %lu decode tokens\n",
              model.c_str(), static_cast<double>(size) / 1048576.0, units, static_cast<double>(unit) / 1048576.0,
              probe.cyclic_units(), expert_units, layout.layers(), n_expert, static_cast<unsigned long>(used),
              uniform != 0 ? "uniform (synthetic)" : trace_path.c_str(), static_cast<unsigned long>(tokens));
  const double mib = static_cast<double>(unit) / 1048576.0;
  // Each case: the budget in whole units, the model's size over the pool
  // (--ratio) or over the budget (--budget), and which of the two it is.
  struct Case {
    uint32_t budget;
    double ratio;
    const char* over;
  };
  std::vector<Case> cases;
  for (double ratio : ratios)
    cases.push_back({static_cast<uint32_t>(static_cast<double>(size) / ratio / static_cast<double>(unit)), ratio,
                     "model/pool"});
  for (uint64_t b : budgets)
    cases.push_back({static_cast<uint32_t>(b / unit),
                     static_cast<double>(size) / static_cast<double>(std::max<uint64_t>(b / unit * unit, 1)),
                     "model/budget"});
  for (const auto& [budget, ratio, over] : cases) {
    if (budget < probe.floor_units() || budget <= probe.cyclic_units()) {
      std::printf("%s %.2f: a budget of %u units is below the floor (%u)\n", over, ratio, budget,
                  probe.floor_units());
      continue;
    }
    const uint32_t cache = budget - probe.cyclic_units();
    const Count min = belady(uses, layout, units, cache);
    const double min_mib = static_cast<double>(min.reads) * mib / static_cast<double>(tokens);
    std::printf("\n%s %.2f: budget %u units, expert cache %u of %u units (%.0f%%)\n", over, ratio, budget, cache,
                expert_units, 100.0 * cache / expert_units);
    std::printf("  %-9s %-8s %8s %12s %8s\n", "policy", "view", "hit rate", "MiB/token", "/MIN");
    for (ExpertPolicy pol : {ExpertPolicy::Lru, ExpertPolicy::Lfu, ExpertPolicy::NextUse})
      for (bool misses : {false, true}) {
        const Count r = replay(uses, ex, size, unit, budget, pol, misses);
        const double m = static_cast<double>(r.reads) * mib / static_cast<double>(tokens);
        std::printf("  %-9s %-8s %8.3f %12.2f %8.2f\n", std::string(pager::expert_policy_name(pol)).c_str(),
                    misses ? "misses" : "all uses", static_cast<double>(r.hits) / static_cast<double>(r.uses), m,
                    m / min_mib);
      }
    std::printf("  %-9s %-8s %8.3f %12.2f %8.2f\n", "MIN", "offline",
                static_cast<double>(min.hits) / static_cast<double>(min.uses), min_mib, 1.0);
    if (uniform != 0) {
      const double floor_mib =
          online_floor(layout, units, n_expert, static_cast<uint32_t>(used), cache) * mib;
      std::printf("  %-9s %-8s %8s %12.2f %8.2f\n", "floor", "online", "-", floor_mib, floor_mib / min_mib);
    }
  }
  return 0;
}
