// SPDX-License-Identifier: Apache-2.0
// Shared plumbing for the pressure-loop tests and bench: synthetic models on
// disk, a bus observer that records the daemon's signals, block patterns,
// and a MemAvailable sampler. Real daemon, real bus, real kernel.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "dbus/names.hpp"
#include "dbus/variant.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "sys/procfs.hpp"
#include "util/units.hpp"

namespace airs::test {

using SteadyClock = std::chrono::steady_clock;

// Writes a llama-shaped model (about `bytes` big when nonzero) to `path`.
inline Status write_model(const std::string& path, const std::string& name, uint64_t seed, uint64_t bytes) {
  gguf::ModelSpec spec;
  spec.name = name;
  spec.seed = seed;
  if (bytes != 0) {
    auto s = gguf::spec_for_size(spec, bytes);
    if (!s) return std::move(s).error();
    spec = *s;
  }
  auto plan = gguf::plan_model(spec);
  if (!plan) return std::move(plan).error();
  return gguf::write_model_file(*plan, path);
}

struct EvictedSignal {
  std::string object;
  uint32_t blocks = 0;
  uint64_t bytes = 0;
  std::string reason;
  SteadyClock::time_point at;
};

// A second bus connection that watches Manager signals and makes calls.
// Processes its queue only when pump() is called (no thread).
class Observer {
 public:
  explicit Observer(const std::string& address)
      : bus_(sdbus::createSessionBusConnectionWithAddress(address)),
        mgr_(sdbus::createProxy(*bus_, dbus::kBusName, dbus::kManagerPath)) {
    mgr_->uponSignal("Evicted")
        .onInterface("org.aios.Airs1.Manager")
        .call([this](const sdbus::ObjectPath& o, const std::vector<uint32_t>& b, uint64_t bytes, const std::string& r) {
          evicted.push_back(EvictedSignal{o, static_cast<uint32_t>(b.size()), bytes, r, SteadyClock::now()});
        });
    mgr_->uponSignal("PressureChanged")
        .onInterface("org.aios.Airs1.Manager")
        .call([this](const std::string& level, const dbus::Dict&) { levels.push_back(level); });
    mgr_->finishRegistration();
  }
  void pump() {
    while (bus_->processPendingRequest()) {
    }
  }
  dbus::Dict status() {
    dbus::Dict s;
    mgr_->callMethod("GetStatus").onInterface("org.aios.Airs1.Manager").storeResultsTo(s);
    pump();
    return s;
  }
  dbus::Dict pressure() {
    auto s = status();
    return dbus::get<dbus::Dict>(s, "pressure").value_or(dbus::Dict{});
  }
  std::vector<dbus::Dict> sessions() {
    std::vector<dbus::Dict> v;
    mgr_->callMethod("ListSessions").onInterface("org.aios.Airs1.Manager").storeResultsTo(v);
    return v;
  }
  std::string load_model(const std::string& path, const std::string& name) {
    sdbus::UnixFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd);
    dbus::Dict opt;
    opt["name"] = sdbus::Variant(name);
    sdbus::ObjectPath o;
    mgr_->callMethod("LoadModel").onInterface("org.aios.Airs1.Manager").withArguments(fd, opt).storeResultsTo(o);
    return o;
  }
  dbus::Dict evict(const dbus::Dict& what, bool dry_run) {
    dbus::Dict r;
    mgr_->callMethod("Evict").onInterface("org.aios.Airs1.Manager").withArguments(what, dry_run).storeResultsTo(r);
    return r;
  }

  std::vector<EvictedSignal> evicted;
  std::vector<std::string> levels;

 private:
  std::unique_ptr<sdbus::IConnection> bus_;
  std::unique_ptr<sdbus::IProxy> mgr_;
};

template <typename T>
T get_or(const dbus::Dict& d, const char* k, T def = {}) {
  auto v = dbus::get<T>(d, k);
  return v ? *v : def;
}

// The pattern of block `block` of a session tagged `tag`: 64-bit words that
// differ per tag, block and offset, so a swapped, zeroed or shifted block
// shows.
inline uint64_t pattern_word(uint32_t tag, uint32_t block, uint64_t i) {
  return (uint64_t{tag} << 56) ^ (uint64_t{block} << 32) ^ (i * 0x9E3779B97F4A7C15ull);
}
inline void fill_block(void* p, uint64_t bytes, uint32_t tag, uint32_t block) {
  auto* w = static_cast<uint64_t*>(p);
  for (uint64_t i = 0; i < bytes / 8; ++i) w[i] = pattern_word(tag, block, i);
}
// Index of the first wrong word, or -1.
inline int64_t check_block(const void* p, uint64_t bytes, uint32_t tag, uint32_t block) {
  const auto* w = static_cast<const uint64_t*>(p);
  for (uint64_t i = 0; i < bytes / 8; ++i)
    if (w[i] != pattern_word(tag, block, i)) return static_cast<int64_t>(i);
  return -1;
}

inline bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

inline uint64_t mem_available() {
  auto m = sys::read_meminfo();
  return m && m->contains("MemAvailable") ? m->at("MemAvailable") : 0;
}

// Samples MemAvailable every `period` on its own thread (test side only).
class MemSampler {
 public:
  struct Sample {
    SteadyClock::time_point at;
    uint64_t available;
    uint64_t hugepages_total;  // HugePages_Total from the same read
  };
  explicit MemSampler(std::chrono::microseconds period) : thread_([this, period] {
      while (!stop_.load()) {
        auto m = sys::read_meminfo();
        const Sample s{SteadyClock::now(), m && m->contains("MemAvailable") ? m->at("MemAvailable") : 0,
                       m && m->contains("HugePages_Total") ? m->at("HugePages_Total") : 0};
        {
          std::lock_guard<std::mutex> g(mu_);
          samples_.push_back(s);
        }
        std::this_thread::sleep_for(period);
      }
    }) {}
  ~MemSampler() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<Sample> samples() {
    std::lock_guard<std::mutex> g(mu_);
    return samples_;
  }
  // The largest rise of MemAvailable between two samples at most `window`
  // apart, and when it ended.
  // The kernel's own moment of giving huge pages back: over every pair of
  // consecutive samples in which HugePages_Total fell, the MemAvailable
  // change and the pages that went. Both come from one read of
  // /proc/meminfo, so other work on the machine enters only through the
  // few milliseconds between two samples.
  std::pair<int64_t, uint64_t> rise_at_hugepage_drops(SteadyClock::time_point from, SteadyClock::time_point to) {
    auto s = samples();
    int64_t rise = 0;
    uint64_t pages = 0;
    // The kernel lowers HugePages_Total before it hands the pages to the
    // buddy allocator (and restores their vmemmap first), so MemAvailable
    // follows a little later: measure from the sample before the first drop
    // to the highest value within `settle` after the last.
    const std::chrono::milliseconds settle(250);
    std::optional<size_t> first, last;
    for (size_t i = 1; i < s.size(); ++i) {
      if (s[i].at < from || s[i].at > to || s[i].hugepages_total >= s[i - 1].hugepages_total) continue;
      pages += s[i - 1].hugepages_total - s[i].hugepages_total;
      if (!first) first = i;
      last = i;
    }
    if (!first) return {0, 0};
    uint64_t top = 0;
    for (size_t j = *first; j < s.size() && s[j].at <= s[*last].at + settle; ++j) top = std::max(top, s[j].available);
    rise = static_cast<int64_t>(top) - static_cast<int64_t>(s[*first - 1].available);
    return {rise, pages};
  }
  // Only samples within [from, to] count.
  std::pair<int64_t, SteadyClock::time_point> max_rise(std::chrono::milliseconds window,
                                                       SteadyClock::time_point from = {},
                                                       SteadyClock::time_point to = SteadyClock::time_point::max()) {
    auto all = samples();
    std::vector<Sample> s;
    for (auto& x : all)
      if (x.at >= from && x.at <= to) s.push_back(x);
    int64_t best = 0;
    SteadyClock::time_point when{};
    size_t lo = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      while (s[j].at - s[lo].at > window) ++lo;
      for (size_t i = lo; i < j; ++i) {
        const int64_t d = static_cast<int64_t>(s[j].available) - static_cast<int64_t>(s[i].available);
        if (d > best) {
          best = d;
          when = s[j].at;
        }
      }
    }
    return {best, when};
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<Sample> samples_;
  std::thread thread_;
};

// Restores the default-size nr_hugepages when the daemon under test lowered
// it and exited before growing the pool back (other tests on the machine
// count on the pages).
class NrHugepagesGuard {
 public:
  NrHugepagesGuard() {
    if (auto v = sys::read_u64_file(kPath)) before_ = *v;
  }
  ~NrHugepagesGuard() {
    auto now = sys::read_u64_file(kPath);
    if (before_ && now && *now < *before_) (void)sys::write_text_file(kPath, std::to_string(*before_));
  }

 private:
  static constexpr const char* kPath = "/proc/sys/vm/nr_hugepages";
  std::optional<uint64_t> before_;
};

}  // namespace airs::test
