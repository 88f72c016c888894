// SPDX-License-Identifier: Apache-2.0
// airs_soak: a randomized soak of the whole promise. Two real airs-memd
// daemons on private buses (one lazy: "full" or "small-pages" by the seed;
// one "cooperative"), each with a model bigger than its pool (streamed) and
// a small one (resident), clients of every kind reading them at once
// (airs_test_client: lazy through libairs; cooperative waiting for
// residency, per layer, or on touch), and random events meanwhile: clients
// SIGKILLed, daemons SIGKILLed and started again on the same state
// directory (as systemd restarts one), forced unloads, model files replaced
// on disk (a new file renamed over the old path), and a memory hog in a
// small memory cgroup switched on and off (PSI pressure: the daemons' loops
// cut streamed budgets and evict idle models).
//
// Every byte every client reads is checked by the client itself against
// the file it opened (the fd it reads the file from is the one it opened
// the model with, so a replaced file is judged by the version it has). A
// client's right outcomes: exit 0 with every byte right; SIGBUS (exit 7)
// after a forced unload of its model or its documented cut-off; killed by
// the soak; an open refused while its daemon was down or its model was
// unloaded or replaced, or refused as "pool exhausted" (the pressure loop
// gave the pool's free pages back to the kernel). Anything else fails the soak: wrong bytes or zeros
// (exit 3), a hang (its alarm, SIGALRM), a wait that failed without cause,
// a daemon that died without being killed or did not stop cleanly. A
// failure prints the seed and the event log.
//
//   airs_soak [--seed N] [--duration SECONDS] [--max-clients N] [--keep]
//
// Exit: 0 passed, 1 failed, 77 skipped (not root, no hugetlbfs...).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon_fixture.hpp"
#include "harness.hpp"
#include "memcg_stressor.hpp"

using namespace airs;
using namespace airs::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kPool = 64 * kMiB;
constexpr uint64_t kBig = 128 * kMiB;  // about 1.7 pools once written: streamed
constexpr uint64_t kSmall = 12 * kMiB;  // resident
constexpr int kClientDeadlineS = 180;  // a client's alarm: a hang, not slowness

// Triggers that one memcg stressor crosses within seconds.
const char* const kPressure = airs::test::kStressorPsiTriggers;

struct Event {
  uint64_t seq = 0;
  double t = 0;
  std::string kind;
  std::string daemon;  // "L", "C" or ""
  std::string what;    // object, model, client...
};

struct Daemon {
  std::string name;  // "L" or "C"
  std::string mode;
  std::string state_dir;
  std::string config;
  std::unique_ptr<PrivateBus> bus;
  std::unique_ptr<DaemonProcess> proc;
  std::unique_ptr<BusClient> ctl;
  int generation = 0;
};

struct Model {
  std::string key;  // "L-big"...
  Daemon* d = nullptr;
  std::string path;
  uint64_t bytes = 0;
  uint64_t layers = 0;
  int version = 1;
};

struct Client {
  int id = 0;
  std::string kind;
  Model* m = nullptr;
  uint64_t spawn_seq = 0;
  int passes = 1;
  std::unique_ptr<Child> child;
  bool killed = false;
};

struct Stats {
  std::map<std::string, int> events;
  std::map<std::string, std::map<std::string, int>> clients;  // kind -> outcome -> n
  uint64_t bytes_verified = 0;
  uint64_t passes_verified = 0;
  int restarts = 0;
  std::map<std::string, std::string> examples;  // outcome -> the first client's message
};

class Soak {
 public:
  Soak(uint64_t seed, int duration_s, int max_clients, bool keep)
      : seed_(seed), duration_(duration_s), max_clients_(max_clients), keep_(keep), rng_(seed) {}

  int run() {
    std::printf("airs_soak: seed %" PRIu64 " duration %d s (replay: --seed %" PRIu64 ")\n", seed_, duration_, seed_);
    std::fflush(stdout);
    if (::geteuid() != 0) return skip("needs root (hugetlbfs pool, memory cgroups)");
    if (::access("/proc/sys/vm/nr_hugepages", W_OK) != 0) return skip("no hugetlbfs in this kernel");
    {
      std::ifstream in("/proc/sys/vm/nr_hugepages");
      in >> nr_hugepages_before_;
    }
    work_ = std::make_unique<TempDir>();
    try {
      setup();
      if (failed_.empty()) loop();
      if (failed_.empty()) drain();
      if (failed_.empty()) stop_daemons();
    } catch (const std::exception& e) {
      fail(std::string("soak error: ") + e.what());
    }
    for (auto& c : clients_) if (c.child) c.child->kill(SIGKILL);
    clients_.clear();
    hog_.reset();
    restore_hugepages();
    summary();
    if (!failed_.empty()) {
      std::printf("\nFAILED (seed %" PRIu64 "): %s\n\nevent log:\n", seed_, failed_.c_str());
      for (const auto& e : events_) print_event(e);
      for (auto& [n, d] : daemons_)
        if (d.proc) std::printf("\n--- daemon %s (generation %d) log tail:\n%s\n", n.c_str(), d.generation,
                                tail(d.proc->log(), 60).c_str());
      std::printf("\nlogs of earlier daemon generations: %s\nreplay: airs_soak --seed %" PRIu64 " --duration %d\n",
                  logs_dir_.c_str(), seed_, duration_);
      keep_ = true;
    }
    daemons_.clear();
    if (keep_) {
      // Kept for a post-mortem: the TempDir would remove it.
      const std::string kept = "/var/tmp/airs-soak-" + std::to_string(seed_);
      std::error_code ec;
      std::filesystem::remove_all(kept, ec);
      std::filesystem::rename(work_->path(), kept, ec);
      std::filesystem::create_directories(work_->path(), ec);
      std::printf("work directory kept in %s\n", kept.c_str());
    }
    return failed_.empty() ? 0 : 1;
  }

 private:
  int skip(const std::string& why) {
    std::printf("SKIP: %s\n", why.c_str());
    return 77;
  }

  double now_s() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  const Event& log_event(const std::string& kind, const std::string& daemon, const std::string& what,
                         bool count = true) {
    Event e{++seq_, now_s(), kind, daemon, what};
    events_.push_back(e);
    if (count) ++stats_.events[kind];
    return events_.back();
  }

  static void print_event(const Event& e) {
    std::printf("  #%-4" PRIu64 " %7.2fs %-16s %-2s %s\n", e.seq, e.t, e.kind.c_str(), e.daemon.c_str(),
                e.what.c_str());
  }

  void fail(const std::string& why) {
    if (failed_.empty()) failed_ = why;
    log_event("FAILURE", "", why, false);
  }

  static std::string tail(const std::string& s, int lines) {
    size_t pos = s.size();
    for (int i = 0; i < lines && pos > 0; ++i) pos = s.rfind('\n', pos - 1);
    return pos == std::string::npos || pos == 0 ? s : s.substr(pos + 1);
  }

  template <typename T>
  T pick(const std::vector<T>& v) {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng_)];
  }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  // ---- set-up ----

  void setup() {
    t0_ = Clock::now();
    logs_dir_ = work_->file("logs");
    std::filesystem::create_directories(logs_dir_);
    const std::string lazy_mode = uniform(0, 1) == 0 ? "full" : "small-pages";
    for (const auto& [name, mode] : {std::pair<std::string, std::string>{"L", lazy_mode}, {"C", "cooperative"}}) {
      Daemon& d = daemons_[name];
      d.name = name;
      d.mode = mode;
      d.state_dir = work_->file("state-" + name);
      d.config = "[daemon]\nstate_dir = \"" + d.state_dir + "\"\n[pool]\nprofile = \"custom\"\nsize = \"" +
                 std::to_string(kPool / kMiB) + "M\"\n[models]\nmode = \"" + mode + "\"\n[kv]\nidle_threshold = \"2s\"\n[pressure]\n" +
                 kPressure;
      d.bus = std::make_unique<PrivateBus>();
      for (const auto& [kind, bytes, layers] :
           {std::tuple<std::string, uint64_t, uint64_t>{"big", kBig, 16}, {"small", kSmall, 4}}) {
        auto m = std::make_unique<Model>();
        m->key = name + "-" + kind;
        m->d = &d;
        m->bytes = bytes;
        m->layers = layers;
        m->path = make_model(*work_, m->key + ".gguf", m->key, bytes, layers, seed_ * 1000 + models_.size()).path;
        models_.push_back(std::move(m));
      }
      start_daemon(d);
      if (!failed_.empty()) return;
    }
    auto hog = MemcgStressor::create(64 * kMiB, 256 * kMiB);
    if (hog) hog_ = std::move(hog).value();
    else std::printf("no memory hog (%s): the soak runs without PSI pressure\n", hog.error().message.c_str());
    log_event("setup", "", "lazy daemon mode " + lazy_mode + ", pool " + std::to_string(kPool / kMiB) +
                               " MiB, models " + std::to_string(kBig / kMiB) + " and " + std::to_string(kSmall / kMiB) +
                               " MiB",
              false);
  }

  void start_daemon(Daemon& d) {
    d.proc = std::make_unique<DaemonProcess>(d.bus->address(), d.config);
    ++d.generation;
    if (!d.proc->started()) {
      fail("daemon " + d.name + " (generation " + std::to_string(d.generation) + ") did not start: " +
           tail(d.proc->log(), 20));
      return;
    }
    if (!d.ctl) d.ctl = std::make_unique<BusClient>(d.bus->address());
    log_event("daemon-start", d.name, "pid " + std::to_string(d.proc->pid()) + " generation " +
                                          std::to_string(d.generation), false);
  }

  // ---- the loop ----

  void loop() {
    const auto end = t0_ + std::chrono::seconds(duration_);
    while (Clock::now() < end && failed_.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(uniform(50, 300)));
      reap();
      check_daemons();
      if (!failed_.empty()) return;
      if (hog_on_ && Clock::now() >= hog_off_at_) toggle_hog();
      const int alive = static_cast<int>(clients_.size());
      // Weighted choice of the next event.
      std::vector<std::pair<int, int>> w = {
          {0, alive < max_clients_ ? 40 : 0},  // spawn a client
          {1, alive > 0 ? 8 : 0},              // SIGKILL a client
          {2, 5},                              // forced unload
          {3, 3},                              // replace a model file
          {4, 3},                              // SIGKILL a daemon, start a new one
          {5, hog_ && !hog_on_ ? 2 : 0},       // memory hog on (off again by itself)
          {6, 20},                             // nothing
      };
      int total = 0;
      for (auto& [k, x] : w) total += x;
      int r = uniform(0, total - 1);
      int what = 6;
      for (auto& [k, x] : w) {
        if (r < x) {
          what = k;
          break;
        }
        r -= x;
      }
      switch (what) {
        case 0: spawn(); break;
        case 1: kill_client(); break;
        case 2: forced_unload(); break;
        case 3: replace_model(); break;
        case 4: restart_daemon(); break;
        case 5: toggle_hog(); break;
        default: break;
      }
    }
  }

  void spawn() {
    Model* m = models_[static_cast<size_t>(uniform(0, static_cast<int>(models_.size()) - 1))].get();
    Client c;
    c.id = ++next_client_;
    c.m = m;
    if (m->d->name == "L") c.kind = "lazy";
    else c.kind = pick(std::vector<std::string>{"coop-wait", "coop-layer", "coop-touch"});
    c.passes = uniform(1, 3);
    std::vector<std::string> argv = {test_client_path(), "--bus", m->d->bus->address(), "--file", m->path,
                                     "--order", "random:" + std::to_string(rng_()), "--passes",
                                     std::to_string(c.passes), "--sigbus-ok", "--deadline",
                                     std::to_string(kClientDeadlineS)};
    if (c.kind == "coop-layer") argv.push_back("--per-layer");
    if (c.kind == "coop-touch") argv.push_back("--on-touch");
    c.child = std::make_unique<Child>(argv);
    c.spawn_seq = log_event("spawn", m->d->name,
                            "client " + std::to_string(c.id) + " pid " + std::to_string(c.child->pid()) + " " +
                                c.kind + " " + m->key + " v" + std::to_string(m->version) + " passes " +
                                std::to_string(c.passes))
                      .seq;
    clients_.push_back(std::move(c));
  }

  void kill_client() {
    auto& c = clients_[static_cast<size_t>(uniform(0, static_cast<int>(clients_.size()) - 1))];
    if (c.killed) return;
    c.killed = true;
    c.child->kill(SIGKILL);
    log_event("kill-client", c.m->d->name, "client " + std::to_string(c.id) + " pid " + std::to_string(c.child->pid()));
  }

  void forced_unload() {
    Daemon& d = daemons_[uniform(0, 1) == 0 ? "L" : "C"];
    std::vector<std::string> objects;
    try {
      auto st = d.ctl->status();
      if (st.contains("models"))
        for (const auto& m : st["models"]) objects.push_back(m.value("object", ""));
    } catch (const std::exception& e) {
      log_event("unload-skipped", d.name, std::string("status: ") + e.what(), false);
      return;
    }
    if (objects.empty()) return;
    const std::string o = pick(objects);
    // Logged before the call: a client's SIGBUS may come before the reply.
    log_event("forced-unload", d.name, o);
    auto e = d.ctl->unload(o, true);
    if (!e.ok()) log_event("unload-refused", d.name, o + ": " + e.name + ": " + e.message, false);
  }

  void replace_model() {
    Model* m = models_[static_cast<size_t>(uniform(0, static_cast<int>(models_.size()) - 1))].get();
    const std::string tmp = m->key + ".gguf.new";
    auto f = make_model(*work_, tmp, m->key, m->bytes, m->layers, seed_ * 1000 + 100 * static_cast<uint64_t>(m->version + 1) + m->layers);
    if (::rename(f.path.c_str(), m->path.c_str()) != 0) {
      fail("rename " + f.path + ": " + std::strerror(errno));
      return;
    }
    ++m->version;
    log_event("replace-file", m->d->name, m->key + " now v" + std::to_string(m->version));
  }

  void restart_daemon() {
    Daemon& d = daemons_[uniform(0, 1) == 0 ? "L" : "C"];
    log_event("kill-daemon", d.name, "pid " + std::to_string(d.proc->pid()) + " generation " +
                                         std::to_string(d.generation));
    // Its log, kept before the fixture removes it with its directory.
    const std::string old_log = d.proc->log();
    d.proc->kill_hard();
    std::ofstream(logs_dir_ + "/" + d.name + "-" + std::to_string(d.generation) + ".log") << old_log;
    d.proc.reset();
    ++stats_.restarts;
    start_daemon(d);
  }

  void toggle_hog() {
    if (hog_on_) {
      hog_->stop();
      hog_on_ = false;
      log_event("hog-off", "", "");
    } else if (auto s = hog_->start(); s) {
      hog_on_ = true;
      const int secs = uniform(2, 8);
      hog_off_at_ = Clock::now() + std::chrono::seconds(secs);
      log_event("hog-on", "", "pid " + std::to_string(hog_->pid()) + " for " + std::to_string(secs) + " s in " +
                                  hog_->cgroup());
    } else {
      log_event("hog-failed", "", s.error().message, false);
    }
  }

  // ---- judging ----

  // Did an event of `kind` on this client's daemon happen during its life?
  bool during(const Client& c, const std::string& kind, const std::string& what = "") const {
    for (const auto& e : events_)
      if (e.seq >= c.spawn_seq && e.kind == kind && e.daemon == c.m->d->name && (what.empty() || e.what == what))
        return true;
    return false;
  }

  void reap() {
    for (auto it = clients_.begin(); it != clients_.end();) {
      if (it->child->running()) {
        ++it;
        continue;
      }
      judge(*it);
      it = clients_.erase(it);
    }
  }

  void judge(Client& c) {
    const auto ex = c.child->wait(10s);
    const std::string tr = c.child->transcript();
    std::istringstream lines(tr);
    std::string object;
    uint64_t bytes = 0;
    int passes = 0;
    for (std::string l; std::getline(lines, l);) {
      if (l.rfind("opened ", 0) == 0) object = field(l, "object");
      if (l.rfind("verified ", 0) == 0) {
        bytes += field_u64(l, "bytes");
        ++passes;
      }
    }
    stats_.bytes_verified += bytes;
    stats_.passes_verified += static_cast<uint64_t>(passes);
    std::string outcome, bad;
    const bool disrupted = during(c, "kill-daemon") || during(c, "forced-unload") || during(c, "replace-file");
    if (c.killed && ex.signal == SIGKILL) {
      outcome = "killed";
    } else if (ex.exit_code == 0) {
      outcome = passes == c.passes ? "ok" : "";
      if (outcome.empty()) bad = "exit 0 after " + std::to_string(passes) + " of " + std::to_string(c.passes) + " passes";
    } else if (ex.exit_code == 7) {
      if (!object.empty() && during(c, "forced-unload", object)) outcome = "sigbus-unloaded";
      else if (c.m->d->proc && c.m->d->proc->log().find("is cut off") != std::string::npos) outcome = "sigbus-cut-off";
      else bad = "SIGBUS without a forced unload of its model (" + (object.empty() ? "not opened" : object) + ")";
    } else if (ex.exit_code == 13 && c.child->err().find("pool exhausted") != std::string::npos) {
      // ENOMEM, named: under pressure the pool gave its free pages back to
      // the kernel (it grows again later), or the budgets of streamed
      // models in use are at their floors.
      outcome = "refused-pool-exhausted";
      std::string e = c.child->err();
      if (auto nl = e.find('\n'); nl != std::string::npos) e.resize(nl);
      stats_.examples.emplace(outcome, e);
    } else if (ex.exit_code == 13 && c.child->err().find("Unknown object") != std::string::npos &&
               c.m->d->proc && c.m->d->proc->log().find("' unused for ") != std::string::npos) {
      // LoadModel takes no reference, so the pressure loop may evict the
      // model as unused in the moment between libairs's LoadModel and its
      // Open; libairs then loads it again, three times in all. An open
      // that lost all three is counted apart, so it stays visible. Never
      // wrong bytes.
      outcome = "open-lost-to-eviction";
      std::string e = c.child->err();
      if (auto nl = e.find('\n'); nl != std::string::npos) e.resize(nl);
      stats_.examples.emplace(outcome, e);
    } else if (ex.exit_code == 12 || ex.exit_code == 13) {
      if (disrupted) outcome = "open-refused";
      else bad = "open failed with no daemon kill, unload or replacement during its life";
    } else if (ex.exit_code == 16) {
      if (!object.empty() && during(c, "forced-unload", object)) outcome = "wait-unloaded";
      else bad = "a wait failed without a forced unload of its model";
    } else if (ex.exit_code == 3) {
      bad = "WRONG BYTES";
    } else if (ex.signal == SIGALRM) {
      bad = "HANG: no end within " + std::to_string(kClientDeadlineS) + " s";
    } else if (ex.exit_code == -2) {
      bad = "HANG: did not exit";
    } else {
      bad = "exit " + std::to_string(ex.exit_code) + " signal " + std::to_string(ex.signal);
    }
    if (!bad.empty()) outcome = "FAILED";
    ++stats_.clients[c.kind][outcome];
    log_event("client-end", c.m->d->name,
              "client " + std::to_string(c.id) + " " + outcome + " (exit " + std::to_string(ex.exit_code) + " signal " +
                  std::to_string(ex.signal) + ", " + std::to_string(passes) + " passes, " +
                  std::to_string(bytes / kMiB) + " MiB verified)",
              false);
    if (!bad.empty())
      fail("client " + std::to_string(c.id) + " (" + c.kind + ", " + c.m->key + "): " + bad + "\n" + tr);
  }

  void check_daemons() {
    for (auto& [n, d] : daemons_) {
      if (!d.proc) continue;
      siginfo_t si{};
      if (::waitid(P_PID, static_cast<id_t>(d.proc->pid()), &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid != 0)
        fail("daemon " + n + " (pid " + std::to_string(d.proc->pid()) + ") died on its own: " +
             (si.si_code == CLD_EXITED ? "exit " : "signal ") + std::to_string(si.si_status));
    }
  }

  // After the events: every client still running ends on its own (its alarm
  // turns a hang into a failure).
  void drain() {
    if (hog_on_) {
      hog_->stop();
      hog_on_ = false;
      log_event("hog-off", "", "end of events");
    }
    log_event("drain", "", std::to_string(clients_.size()) + " clients still running", false);
    const auto deadline = Clock::now() + std::chrono::seconds(kClientDeadlineS + 30);
    while (!clients_.empty() && failed_.empty()) {
      reap();
      check_daemons();
      if (Clock::now() > deadline) {
        fail("clients still running " + std::to_string(kClientDeadlineS + 30) + " s after the events ended");
        return;
      }
      std::this_thread::sleep_for(20ms);
    }
  }

  void stop_daemons() {
    for (auto& [n, d] : daemons_) {
      if (!d.proc) continue;
      const int code = d.proc->stop(30s);
      log_event("daemon-stop", n, "exit " + std::to_string(code), false);
      if (code != 0) fail("daemon " + n + " did not stop cleanly on SIGTERM: " + std::to_string(code));
    }
  }

  void restore_hugepages() {
    std::ifstream in("/proc/sys/vm/nr_hugepages");
    uint64_t now = 0;
    in >> now;
    if (now < nr_hugepages_before_) std::ofstream("/proc/sys/vm/nr_hugepages") << nr_hugepages_before_;
  }

  void summary() {
    std::printf("\nairs_soak summary (seed %" PRIu64 ", %.1f s):\n  events:", seed_, now_s());
    for (auto& [k, n] : stats_.events) std::printf(" %s=%d", k.c_str(), n);
    std::printf("\n  daemon restarts: %d (lazy daemon mode %s)\n  clients:\n", stats_.restarts,
                daemons_.count("L") ? daemons_["L"].mode.c_str() : "?");
    for (auto& [kind, outs] : stats_.clients) {
      std::printf("    %-11s", kind.c_str());
      for (auto& [o, n] : outs) std::printf(" %s=%d", o.c_str(), n);
      std::printf("\n");
    }
    for (auto& [o, e] : stats_.examples) std::printf("  first %s: %s\n", o.c_str(), e.c_str());
    std::printf("  verified: %" PRIu64 " passes, %" PRIu64 " bytes (%.1f MiB), every byte against its file\n",
                stats_.passes_verified, stats_.bytes_verified,
                static_cast<double>(stats_.bytes_verified) / static_cast<double>(kMiB));
    std::fflush(stdout);
  }

  uint64_t seed_;
  int duration_;
  int max_clients_;
  bool keep_;
  std::mt19937_64 rng_;
  Clock::time_point t0_ = Clock::now();
  std::unique_ptr<TempDir> work_;
  std::string logs_dir_;
  std::map<std::string, Daemon> daemons_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<Client> clients_;
  std::unique_ptr<MemcgStressor> hog_;
  bool hog_on_ = false;
  Clock::time_point hog_off_at_;
  std::vector<Event> events_;
  uint64_t seq_ = 0;
  int next_client_ = 0;
  uint64_t nr_hugepages_before_ = 0;
  Stats stats_;
  std::string failed_;
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = std::random_device{}();
  int duration = 60, max_clients = 5;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seed") seed = std::stoull(next());
    else if (a == "--duration") duration = std::stoi(next());
    else if (a == "--max-clients") max_clients = std::max(1, std::stoi(next()));
    else if (a == "--keep") keep = true;
    else {
      std::fprintf(stderr, "usage: airs_soak [--seed N] [--duration SECONDS] [--max-clients N] [--keep]\n");
      return 2;
    }
  }
  // A killed client's or daemon's pipe must not end the soak.
  ::signal(SIGPIPE, SIG_IGN);
  return Soak(seed, duration, max_clients, keep).run();
}
