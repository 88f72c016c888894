// SPDX-License-Identifier: Apache-2.0
// bench/pressure: time from memory-pressure onset to memory back in
// MemAvailable, airs-memd's PSI-triggered loop next to earlyoom's approach
// (poll MemAvailable every 100 ms, act below a threshold) in the same run,
// alternating, with the same onset, the same victim and the same executor.
//
// Onset (both modes, at t0): a memcg-limited child starts refaulting past its
// limit (PSI stall) and this process touches 256 MiB of anonymous ballast
// (MemAvailable drops, which is what a MemAvailable poller can see).
//   psi   the daemon's own loop: PSI triggers (2 s windows) → evict → shrink.
//   poll  the daemon's loop is quiet (unreachable thresholds); a poller here
//         reads MemAvailable every 100 ms and, once it is 128 MiB below the
//         baseline, calls Manager.Evict(priority=background) → evict → shrink.
// "Back" = the first moment MemAvailable (sampled every 1 ms) rose by at
// least kBackBytes within 50 ms. Needs root. Usage: pressure_bench [runs]
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "airs/airs.hpp"
#include "daemon_fixture.hpp"
#include "memcg_stressor.hpp"
#include "scenario.hpp"

using namespace airs;
using namespace airs::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kBallast = 128 * kMiB;
constexpr uint64_t kPollDrop = 96 * kMiB;
constexpr uint64_t kBackBytes = 48 * kMiB;
constexpr uint32_t kVictimBlocks = 1024;  // 64 MiB of background KV

std::string config(bool psi) {
  const char* p = psi ? R"(source = "psi"
some_threshold = "50ms"
some_window = "2000ms"
full_threshold = "20ms"
full_window = "2000ms"
target_some_bytes = "64M"
target_full_bytes = "64M"
grow_after = "600s"
)"
                      : R"(source = "poll"
some_threshold = "1990ms"
some_window = "2000ms"
full_threshold = "1990ms"
full_window = "2000ms"
grow_after = "600s"
)";
  return fmt::format("[daemon]\nlog_level = \"warning\"\n[pool]\nprofile = \"custom\"\nsize = \"96M\"\n[pressure]\n{}", p);
}

struct Run {
  double onset_to_back_ms = -1;
  double onset_to_detect_ms = -1;  // psi: PressureChanged seen; poll: the poller fired
  double detect_to_back_ms = -1;
  double daemon_ms = -1;  // the daemon's own plan+evict+shrink time (status max_eviction_us)
};

double ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The first rise of kBackBytes within 50 ms that ends at or after `from`
// (the first Evicted signal: other work on the machine can free memory too,
// and only a rise after the daemon started evicting is ours).
std::optional<SteadyClock::time_point> first_rise(const std::vector<MemSampler::Sample>& s, SteadyClock::time_point from) {
  size_t lo = 0;
  for (size_t j = 0; j < s.size(); ++j) {
    while (s[j].at - s[lo].at > 50ms) ++lo;
    if (s[j].at < from - 20ms) continue;
    for (size_t i = lo; i < j; ++i)
      if (s[j].available >= s[i].available + kBackBytes) return s[j].at;
  }
  return std::nullopt;
}

Run one(bool psi, const std::string& model) {
  Run r;
  NrHugepagesGuard guard;
  PrivateBus bus;
  DaemonProcess d(bus.address(), config(psi));
  if (!d.started()) {
    std::fprintf(stderr, "daemon did not start:\n%s\n", d.log().c_str());
    return r;
  }
  Observer obs(bus.address());
  Client c(bus.address().c_str());
  Model m(c, model);
  Session victim(c, m, AIRS_PRIORITY_BACKGROUND);
  auto blocks = victim.allocate(kVictimBlocks);
  for (auto b : blocks) std::memset(victim.block(b), 0x5a, victim.geometry().block_bytes);
  // Start from a quiet machine: pressure left over from the last run
  // would fire at once.
  for (int i = 0; i < 100 && get_or<std::string>(obs.pressure(), "raw_level") != "none"; ++i)
    std::this_thread::sleep_for(200ms);
  std::this_thread::sleep_for(2500ms);

  auto stress = MemcgStressor::create(64 * kMiB, 256 * kMiB);
  if (!stress) {
    std::fprintf(stderr, "no memory cgroup: %s\n", stress.error().message.c_str());
    return r;
  }
  const uint64_t baseline = mem_available();
  MemSampler sampler(1ms);
  std::this_thread::sleep_for(20ms);

  const auto t0 = SteadyClock::now();
  (void)(*stress)->start();
  void* ballast = ::mmap(nullptr, kBallast, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (ballast != MAP_FAILED) std::memset(ballast, 1, kBallast);

  std::optional<SteadyClock::time_point> detected, evicted;
  auto next_poll = t0;
  const auto end = t0 + 15s;
  while (SteadyClock::now() < end) {
    obs.pump();
    if (psi && !detected && !obs.levels.empty()) detected = SteadyClock::now();
    if (!psi && !detected && SteadyClock::now() >= next_poll) {
      next_poll += 100ms;
      if (mem_available() + kPollDrop < baseline) {
        detected = SteadyClock::now();
        dbus::Dict what;
        what["priority"] = sdbus::Variant(std::string("background"));
        (void)obs.evict(what, false);
      }
    }
    if (!evicted && !obs.evicted.empty()) evicted = obs.evicted.front().at;
    if (evicted && first_rise(sampler.samples(), *evicted)) break;
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(20ms);
  sampler.stop();
  r.daemon_ms = static_cast<double>(get_or<uint64_t>(obs.pressure(), "max_eviction_us")) / 1000.0;
  (*stress)->stop();
  if (ballast != MAP_FAILED) ::munmap(ballast, kBallast);
  if (detected) r.onset_to_detect_ms = ms(*detected - t0);
  if (!evicted) return r;
  if (auto back = first_rise(sampler.samples(), *evicted)) {
    r.onset_to_back_ms = ms(*back - t0);
    if (detected) r.detect_to_back_ms = ms(*back - *detected);
  }
  return r;
}

Run one_safely(bool psi, const std::string& model, int n) {
  try {
    return one(psi, model);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run %d failed: %s\n", n, e.what());
    return Run{};
  }
}

struct Summary {
  double median = -1, min = -1, max = -1;
  size_t ok = 0;
};
Summary summarize(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return x < 0; }), v.end());
  Summary s;
  s.ok = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  s.min = v.front();
  s.max = v.back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (::geteuid() != 0) {
    std::fprintf(stderr, "pressure_bench: needs root (hugetlbfs pool, memory cgroups)\n");
    return 2;
  }
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  char tmpl[] = "/var/tmp/airs-pbench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string model = std::string(tmpl) + "/m.gguf";
  if (auto st = write_model(model, "bench-model", 1, 0); !st) {
    std::fprintf(stderr, "%s\n", st.error().message.c_str());
    return 1;
  }
  std::vector<double> back[2], detect[2], exec[2], work[2];
  for (int i = 0; i < runs; ++i) {
    for (int mode : {0, 1}) {  // 0 = psi, 1 = poll; alternating so drift hits both
      const Run r = one_safely(mode == 0, model, i + 1);
      back[mode].push_back(r.onset_to_back_ms);
      detect[mode].push_back(r.onset_to_detect_ms);
      exec[mode].push_back(r.detect_to_back_ms);
      work[mode].push_back(r.daemon_ms);
      std::printf("run %d %-5s detect %8.1f ms  back %8.1f ms  detect→back %6.1f ms  daemon work %6.1f ms\n", i + 1,
                  mode == 0 ? "psi" : "poll", r.onset_to_detect_ms, r.onset_to_back_ms, r.detect_to_back_ms, r.daemon_ms);
      std::fflush(stdout);
    }
  }
  std::printf("\nonset → +%s in MemAvailable (1 ms sampling), %d runs each, alternating\n", format_bytes(kBackBytes).c_str(),
              runs);
  std::printf("%-40s %4s %10s %10s %10s %12s %14s %12s\n", "mode", "ok", "median ms", "min ms", "max ms", "detect med",
              "detect→back med", "daemon med");
  const char* names[2] = {"airs-memd PSI triggers (2 s window)", "MemAvailable poll 100 ms + Evict"};
  Summary s[2];
  for (int mode : {0, 1}) {
    s[mode] = summarize(back[mode]);
    const Summary d = summarize(detect[mode]);
    const Summary x = summarize(exec[mode]);
    const Summary w = summarize(work[mode]);
    std::printf("%-40s %4zu %10.1f %10.1f %10.1f %12.1f %14.1f %12.1f\n", names[mode], s[mode].ok, s[mode].median,
                s[mode].min, s[mode].max, d.median, x.median, w.median);
  }
  if (s[0].median > 0 && s[1].median > 0) std::printf("ratio poll/psi (median): %.2f\n", s[1].median / s[0].median);
  std::filesystem::remove_all(tmpl);
  return 0;
}
