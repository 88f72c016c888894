// SPDX-License-Identifier: Apache-2.0
// The real llama.cpp (prebuilt libllama.so from npm, driven by llama-gen) on
// the pool through libairs-preload.so, against a private dbus-daemon and a
// real airs-memd. Every test compares greedy token ids with a direct load of
// the same file, and proves the pool was (or was not) used from the outside:
// the daemon's status, /proc/PID/maps|smaps|fd of the live process.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon_fixture.hpp"
#include "gguf/file_io.hpp"
#include "gguf/gguf.hpp"

namespace {

using airs::test::DaemonProcess;
using airs::test::PrivateBus;
using airs::test::ProcessResult;
using airs::test::run_process;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kWork = AIRS_LLAMA_WORK;    // setup.sh output (llama-gen, bins)
const std::string kPreload = AIRS_PRELOAD_LIB;
const std::string kMkmodel = AIRS_LLAMA_MKMODEL;

std::string llama_gen() { return kWork + "/llama-gen"; }
std::string backends() { return kWork + "/bins"; }

std::string model_path(const std::string& size, uint64_t seed) {
  const std::string dir = kWork + "/models";
  fs::create_directories(dir);
  const std::string p = dir + "/llama-" + size + "-s" + std::to_string(seed) + ".gguf";
  if (!fs::exists(p)) {
    auto r = run_process({kMkmodel, "--llama", "--out", p + ".tmp", "--size", size, "--seed", std::to_string(seed)}, 300s);
    if (r.exit_code != 0) throw std::runtime_error("airs-mkmodel --llama: " + r.err);
    fs::rename(p + ".tmp", p);
  }
  return p;
}

struct Gen {
  std::vector<std::string> env;  // NAME=VALUE added to the environment
  std::vector<std::string> args;
};

std::vector<std::string> gen_argv(const std::string& model, const std::vector<std::string>& extra) {
  std::vector<std::string> a = {llama_gen(), "--backends", backends(), "--model", model, "--n", "16", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Runs argv with extra environment entries (via env(1): the fixture's
// run_process inherits ours).
ProcessResult run_with_env(const std::vector<std::string>& env, std::vector<std::string> argv,
                           std::chrono::milliseconds timeout = 300s) {
  std::vector<std::string> a = {"/usr/bin/env"};
  a.insert(a.end(), env.begin(), env.end());
  a.insert(a.end(), argv.begin(), argv.end());
  return run_process(a, timeout);
}

std::vector<std::string> preload_env(const std::string& bus) {
  return {"LD_PRELOAD=" + kPreload, "AIRS_BUS=" + bus, "AIRS_PRELOAD_VERBOSE=1"};
}

std::string line_of(const std::string& out, const std::string& key) {
  std::istringstream in(out);
  std::string l;
  while (std::getline(in, l))
    if (l.rfind(key + " ", 0) == 0) return l.substr(key.size() + 1);
  return "";
}

std::string tokens_of(const ProcessResult& r) { return line_of(r.out, "tokens"); }

nlohmann::json status(const std::string& bus) {
  auto r = run_process({airs::test::airsctl_path(), "--bus", bus, "--json", "status"}, 30s);
  if (r.exit_code != 0) throw std::runtime_error("airsctl status: " + r.err);
  return nlohmann::json::parse(r.out);
}

std::optional<nlohmann::json> model_status(const std::string& bus) {
  auto s = status(bus);
  if (!s.contains("models") || s["models"].empty()) return std::nullopt;
  return s["models"][0];
}

// The first model's status; an empty object (whose fields compare unequal
// to anything) if there is none, so a test fails instead of crashing.
nlohmann::json first_model(const std::string& bus) {
  auto m = model_status(bus);
  return m ? *m : nlohmann::json::object();
}

std::string pool_toml(const std::string& size, const std::string& extra = "") {
  return "[pool]\nprofile = \"custom\"\nsize = \"" + size + "\"\n" + extra;
}

// A child process we start with a pipe on stdin (llama-gen --hold waits for
// EOF) and stdout/stderr to files.
class Held {
 public:
  Held(const std::vector<std::string>& env, const std::vector<std::string>& argv, const std::string& tag) {
    out_ = kWork + "/" + tag + ".out";
    err_ = kWork + "/" + tag + ".err";
    // Truncate before the fork: wait_holding() must never see an earlier
    // run's output.
    std::ofstream(out_, std::ios::trunc).close();
    std::ofstream(err_, std::ios::trunc).close();
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(p[0], 0);
      int o = ::open(out_.c_str(), O_WRONLY | O_APPEND);
      int e = ::open(err_.c_str(), O_WRONLY | O_APPEND);
      ::dup2(o, 1);
      ::dup2(e, 2);
      std::vector<std::string> a = {"/usr/bin/env"};
      a.insert(a.end(), env.begin(), env.end());
      a.insert(a.end(), argv.begin(), argv.end());
      std::vector<char*> c;
      for (auto& s : a) c.push_back(const_cast<char*>(s.c_str()));
      c.push_back(nullptr);
      ::execv(c[0], c.data());
      ::_exit(127);
    }
    ::close(p[0]);
    stdin_ = p[1];
  }
  ~Held() { finish(); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

  [[nodiscard]] pid_t pid() const { return pid_; }
  // Waits until llama-gen printed "holding" (its tokens are out).
  bool wait_holding(std::chrono::milliseconds timeout = 300s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (out().find("holding") != std::string::npos) return true;
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return false;
      }
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
  [[nodiscard]] std::string out() const { return slurp(out_); }
  [[nodiscard]] std::string err() const { return slurp(err_); }
  int finish() {
    if (stdin_ >= 0) ::close(stdin_);
    stdin_ = -1;
    if (exited_ || pid_ <= 0) return 0;
    int st = 0;
    ::waitpid(pid_, &st, 0);
    exited_ = true;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  }

  static std::string slurp(const std::string& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  bool exited_ = false;
  std::string out_, err_;
};

// Sum of a field ("Pss:", "Shared_Hugetlb:") over /proc/PID/smaps entries,
// or only those whose header line contains `path_part`.
uint64_t smaps_kb(pid_t pid, const std::string& field, const std::string& path_part = "") {
  std::ifstream f("/proc/" + std::to_string(pid) + "/smaps");
  std::string l;
  bool in = path_part.empty();
  uint64_t kb = 0;
  while (std::getline(f, l)) {
    const bool header = !l.empty() && std::isxdigit(static_cast<unsigned char>(l[0])) && l.find('-') < 17 &&
                        l.find(':') > l.find(' ');
    if (header) {
      in = path_part.empty() || l.find(path_part) != std::string::npos;
      continue;
    }
    if (in && l.rfind(field, 0) == 0) kb += std::stoull(l.substr(field.size()));
  }
  return kb;
}

uint64_t rollup_kb(pid_t pid, const std::string& field) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string l;
  while (std::getline(f, l))
    if (l.rfind(field, 0) == 0) return std::stoull(l.substr(field.size()));
  return 0;
}

bool has_userfaultfd(pid_t pid) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    const auto target = fs::read_symlink(e.path(), ec2);
    if (!ec2 && target.string().find("userfaultfd") != std::string::npos) return true;
  }
  return false;
}

// The model's pool region shows in /proc/PID/maps as a hugetlbfs file (or a
// memfd); the GGUF path must not be mapped at all.
bool maps_contain(pid_t pid, const std::string& s) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  std::string l;
  while (std::getline(f, l))
    if (l.find(s) != std::string::npos) return true;
  return false;
}

class LlamaPool : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(llama_gen())) << llama_gen() << " missing: the llama.setup fixture (npm install of "
                                         << "@node-llama-cpp/linux-x64 + build) did not run or failed";
  }
  ProcessResult direct(const std::string& model, const std::vector<std::string>& extra = {}) {
    auto r = run_process(gen_argv(model, extra), 300s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r;
  }
};

TEST_F(LlamaPool, DirectLoadGeneratesVariedTokens) {
  const auto model = model_path("4M", 11);
  const auto r = direct(model);
  const auto toks = tokens_of(r);
  ASSERT_FALSE(toks.empty()) << r.out;
  std::istringstream in(toks);
  std::vector<int> ids;
  for (int t; in >> t;) ids.push_back(t);
  ASSERT_EQ(ids.size(), 16U);
  // Random weights still give a varied, prompt-dependent sequence (a zero or
  // garbage model collapses to one token), so equality below means something.
  std::sort(ids.begin(), ids.end());
  EXPECT_GE(std::unique(ids.begin(), ids.end()) - ids.begin(), 3) << toks;
  const auto other = direct(model, {"--text", "Another prompt entirely"});
  EXPECT_NE(tokens_of(other), toks);
  // Both load modes of llama.cpp agree with each other.
  EXPECT_EQ(tokens_of(direct(model, {"--mode", "none"})), toks);
}

TEST_F(LlamaPool, FullyResidentModelNeedsNoUserfaultfd) {
  const auto model = model_path("24M", 14);
  const auto want = tokens_of(direct(model));
  PrivateBus bus;
  // Between the two processes nothing holds the model: the daemon names no
  // pressure source, so the machine's pressure (an unused model's fate) is
  // not an input here (with_pressure_source).
  DaemonProcess d(bus.address(), pool_toml("128M"));
  ASSERT_TRUE(d.started()) << d.log();
  // First process loads it; the daemon keeps it resident after release.
  auto first = run_with_env(preload_env(bus.address()), gen_argv(model, {}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  nlohmann::json m;
  for (int i = 0; i < 500; ++i) {
    m = first_model(bus.address());
    if (m["state"] == "resident") break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(m["state"], "resident") << m.dump();

  Held h(preload_env(bus.address()), gen_argv(model, {"--hold"}), "resident");
  ASSERT_TRUE(h.wait_holding()) << h.err();
  EXPECT_EQ(tokens_of(ProcessResult{0, 0, h.out(), ""}), want);
  EXPECT_NE(h.err().find("resident)"), std::string::npos) << h.err();
  EXPECT_FALSE(has_userfaultfd(h.pid())) << "a resident model was attached with a userfaultfd";
  EXPECT_EQ(h.finish(), 0);
}

// ---- every mode: full, small-pages and cooperative, forced ----

std::string mode_toml(const std::string& mode, const std::string& extra = "") {
  return "[models]\nmode = \"" + mode + "\"\n" + extra;
}

// The path part of a shmem model region in /proc/PID/smaps: "/memfd:airs-model:NAME"
// or, on the huge-folio tmpfs, "/airs-model:NAME".
constexpr const char* kRegionPath = "/airs-model:";
constexpr const char* kMemfdRegionPath = "/memfd:airs-model:";

// KiB of the pool region mapped into `pid`: hugetlb pages in full mode, the
// region's shmem file in the other two.
uint64_t region_kb(pid_t pid, const std::string& mode) {
  return mode == "full" ? smaps_kb(pid, "Shared_Hugetlb:")
                        : smaps_kb(pid, "Rss:", kRegionPath) + smaps_kb(pid, "Rss:", kMemfdRegionPath);
}

// The message a preloaded process prints when it outlives the daemon.
std::string fallback_message(const std::string& mode) {
  return mode == "cooperative" ? "from the GGUF file in this process" : "serving the remaining pages";
}

class LlamaModes : public LlamaPool, public ::testing::WithParamInterface<std::string> {};

// Tokens of a direct load, with a SIGSEGV handler the runtime installs after
// the load (through signal(): the preload keeps the pool's handler first),
// which must see none of the pool's faults and still get its own.
TEST_P(LlamaModes, PreloadGivesTheTokensOfADirectLoad) {
  const std::string mode = GetParam();
  const auto model = model_path("24M", 12);
  const auto want = tokens_of(direct(model));
  ASSERT_FALSE(want.empty());

  PrivateBus bus;
  DaemonProcess d(bus.address(), pool_toml("128M", mode_toml(mode)));
  ASSERT_TRUE(d.started()) << d.log();
  EXPECT_EQ(status(bus.address())["mode"], mode);
  Held h(preload_env(bus.address()), gen_argv(model, {"--hold", "--segv-handler", "after"}), "preload-" + mode);
  ASSERT_TRUE(h.wait_holding()) << h.err();
  EXPECT_EQ(tokens_of(ProcessResult{0, 0, h.out(), ""}), want) << h.err();
  EXPECT_EQ(line_of(h.out(), "own_segv"), "1 0") << h.out();
  EXPECT_NE(h.err().find("mapped from the pool"), std::string::npos) << h.err();
  // The process maps the pool region, never the GGUF itself.
  EXPECT_FALSE(maps_contain(h.pid(), model));
  EXPECT_GE(region_kb(h.pid(), mode) * 1024, fs::file_size(model) / 2);
  auto m = model_status(bus.address());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ((*m)["refcount"].get<uint64_t>(), 1U) << m->dump();
  EXPECT_EQ((*m)["size"].get<uint64_t>(), fs::file_size(model));
  EXPECT_EQ(h.finish(), 0) << h.err();
  // llama_model_free unmapped every fragment: the preload closed the model.
  auto after = model_status(bus.address());
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ((*after)["refcount"].get<uint64_t>(), 0U) << after->dump();
}

TEST_P(LlamaModes, TwoProcessesShareOneCopyAndTheSecondDoesNoModelIo) {
  const std::string mode = GetParam();
  const auto model = model_path("48M", 13);
  const auto want = tokens_of(direct(model, {"--no-repack"}));
  ASSERT_FALSE(want.empty());

  PrivateBus bus;
  DaemonProcess d(bus.address(), pool_toml("192M", mode_toml(mode)));
  ASSERT_TRUE(d.started()) << d.log();
  const auto gen = gen_argv(model, {"--hold", "--no-repack"});
  Held a(preload_env(bus.address()), gen, "share-a-" + mode);
  ASSERT_TRUE(a.wait_holding()) << a.err();
  // Let the first finish loading the whole model (background warm-up).
  nlohmann::json m1;
  for (int i = 0; i < 500; ++i) {
    m1 = first_model(bus.address());
    if (m1["state"] == "resident") break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(m1["state"], "resident") << m1.dump() << "\n" << a.err();
  const auto pool_before = status(bus.address());

  auto gen_b = gen;
  gen_b.insert(gen_b.end(), {"--segv-handler", "before"});
  Held b(preload_env(bus.address()), gen_b, "share-b-" + mode);
  ASSERT_TRUE(b.wait_holding()) << b.err();
  EXPECT_EQ(tokens_of(ProcessResult{0, 0, a.out(), ""}), want);
  EXPECT_EQ(tokens_of(ProcessResult{0, 0, b.out(), ""}), want);
  EXPECT_EQ(line_of(b.out(), "own_segv"), "1 0") << b.out();

  const auto m2 = first_model(bus.address());
  ASSERT_TRUE(m2.contains("refcount")) << m2.dump();
  EXPECT_EQ(m2["refcount"].get<uint64_t>(), 2U) << m2.dump();
  // "clients" counts userfaultfd attachments (cooperative mode: request
  // sockets): the second process found the model resident and mapped it
  // plainly, without one. (The first has one if it opened the model before
  // the load ended: under TCG the daemon can fill 48 MiB before a process
  // gets that far, and then it has none either.)
  EXPECT_EQ(m2["clients"], m1["clients"]) << m1.dump() << "\n" << m2.dump() << "\n" << d.log();
  // One copy: the second process added no model I/O and no pool pages.
  EXPECT_EQ(m2["bytes_read"], m1["bytes_read"]) << m1.dump() << "\n" << m2.dump();
  EXPECT_EQ(m2["resident_bytes"], m1["resident_bytes"]);
  const auto pool_after = status(bus.address());
  // (kernel_hugepages_* are machine-wide: other processes move them.)
  for (const char* k : {"free_bytes", "model_bytes", "free_pages", "model_pages"})
    EXPECT_EQ(pool_after["pool"][k], pool_before["pool"][k]) << k;

  // Both map the pool's pages: every model page they touched comes from the
  // region (hugetlb pages are outside Pss; smaps splits them Shared/Private).
  const uint64_t file_kb = fs::file_size(model) / 1024;
  for (pid_t p : {a.pid(), b.pid()}) {
    EXPECT_GE(region_kb(p, mode), file_kb * 9 / 10) << "pid " << p;
    EXPECT_FALSE(maps_contain(p, model)) << "pid " << p;
    if (mode == "full") {
      EXPECT_EQ(smaps_kb(p, "Private_Hugetlb:"), 0U) << "pid " << p;
      // The weights are not in either process's own memory.
      EXPECT_LT(rollup_kb(p, "Pss:"), file_kb) << "pid " << p;
    } else {
      // shmem pages the daemon and both processes map: none private to one.
      uint64_t private_kb = 0;
      for (const char* path : {kRegionPath, kMemfdRegionPath})
        private_kb += smaps_kb(p, "Private_Clean:", path) + smaps_kb(p, "Private_Dirty:", path);
      EXPECT_LT(private_kb, file_kb / 10)
          << "pid " << p;
    }
    std::fprintf(stderr, "%s pid %d: Pss %llu kB, region %llu kB, model file %llu kB\n", mode.c_str(), p,
                 static_cast<unsigned long long>(rollup_kb(p, "Pss:")),
                 static_cast<unsigned long long>(region_kb(p, mode)), static_cast<unsigned long long>(file_kb));
  }
  EXPECT_EQ(a.finish(), 0) << a.err();
  EXPECT_EQ(b.finish(), 0) << b.err();
}

TEST_P(LlamaModes, DaemonKilledDuringTheLoadStillGivesTheSameTokens) {
  const std::string mode = GetParam();
  const auto model = model_path("160M", 15);
  const auto want = tokens_of(direct(model));
  PrivateBus bus;
  // One read in flight at a time, no read-ahead window and a paced warm-up
  // (what the process does not touch comes slowly): the kill lands in the
  // middle of the load.
  DaemonProcess d(bus.address(), pool_toml("256M", mode_toml(mode, "queue_depth = 1\nprefetch_window = 0\n"
                                                                   "warmup_rate = \"32M\"\n")));
  ASSERT_TRUE(d.started()) << d.log();
  Held h(preload_env(bus.address()), gen_argv(model, {"--hold", "--segv-handler", "before"}), "killed-" + mode);
  // Kill as soon as the process is the model's client (attached: a lazy
  // mapping, or the touch guard's requests) and the model not yet resident.
  // A reference alone is not enough: a kill between the Open and the
  // Attach leaves the preload with no mapping, and it loads the normal way
  // without this test's subject, the client's own fill after the death.
  bool killed_mid_load = false;
  for (int i = 0; i < 2000 && !killed_mid_load; ++i) {
    auto m = model_status(bus.address());
    if (m && (*m)["clients"].get<uint64_t>() >= 1) {
      if ((*m)["state"] != "resident") {
        d.kill_hard();
        killed_mid_load = true;
        std::fprintf(stderr, "%s: killed airs-memd with %llu of %llu bytes resident\n", mode.c_str(),
                     static_cast<unsigned long long>((*m)["resident_bytes"].get<uint64_t>()),
                     static_cast<unsigned long long>((*m)["size"].get<uint64_t>()));
      }
      break;
    }
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(killed_mid_load) << "the load finished before the kill; use a slower load";
  ASSERT_TRUE(h.wait_holding()) << h.err();
  EXPECT_EQ(tokens_of(ProcessResult{0, 0, h.out(), ""}), want) << h.err();
  EXPECT_EQ(line_of(h.out(), "own_segv"), "1 0") << h.out();
  EXPECT_NE(h.err().find(fallback_message(mode)), std::string::npos) << h.err();
  EXPECT_EQ(h.finish(), 0) << h.err();
}

// A model 1.6 times the pool: loaded streamed (no option), and llama.cpp,
// unmodified, gives the tokens of a direct load while its units come and go
// through the budget: lazy clients in the userfaultfd modes, the touch
// guard's open/close protocol in cooperative mode. The daemon never holds
// more than the pool, and it drops units (it streamed).
TEST_P(LlamaModes, AModelBiggerThanThePoolStreamsWithTheTokensOfADirectLoad) {
  const std::string mode = GetParam();
  const auto model = model_path("100M", 16);
  const auto want = tokens_of(direct(model, {"--no-repack"}));
  ASSERT_FALSE(want.empty());
  PrivateBus bus;
  DaemonProcess d(bus.address(), pool_toml("60M", mode_toml(mode)));
  ASSERT_TRUE(d.started()) << d.log();
  const uint64_t pool_bytes = status(bus.address())["pool"]["total_bytes"].get<uint64_t>();
  ASSERT_GE(fs::file_size(model), pool_bytes * 3 / 2) << "the model must be bigger than the pool";
  Held h(preload_env(bus.address()), gen_argv(model, {"--hold", "--no-repack"}), "streamed-" + mode);
  // While it runs: what the daemon holds of the model, never more than the pool.
  uint64_t most = 0;
  nlohmann::json m;
  bool holding = false;
  for (int i = 0; i < 30000 && !holding; ++i) {
    if (auto ms = model_status(bus.address())) {
      m = *ms;
      most = std::max<uint64_t>(most, m.value("resident_bytes", uint64_t{0}));
    }
    holding = h.out().find("holding") != std::string::npos;
    if (!holding) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(h.wait_holding()) << h.err() << "\n" << d.log();
  EXPECT_EQ(tokens_of(ProcessResult{0, 0, h.out(), ""}), want) << h.err();
  m = first_model(bus.address());
  EXPECT_EQ(m["streamed"], true) << m.dump();
  EXPECT_EQ(m["state"], "streaming") << m.dump();
  EXPECT_LE(most, pool_bytes) << "the daemon held more of the model than the pool";
  EXPECT_LE(m["budget_bytes"].get<uint64_t>(), pool_bytes) << m.dump();
  EXPECT_GT(m["units_dropped"].get<uint64_t>(), 0U) << "nothing was dropped: it did not stream\n" << m.dump();
  EXPECT_FALSE(maps_contain(h.pid(), model)) << "the process maps the GGUF itself";
  std::fprintf(stderr, "%s: streamed %llu MiB through %llu MiB; %llu read; per token %llu (optimum %llu)\n",
               mode.c_str(), static_cast<unsigned long long>(fs::file_size(model) >> 20),
               static_cast<unsigned long long>(m["budget_bytes"].get<uint64_t>() >> 20),
               static_cast<unsigned long long>(m["bytes_read"].get<uint64_t>() >> 20),
               static_cast<unsigned long long>(m["bytes_per_pass"].get<uint64_t>() >> 20),
               static_cast<unsigned long long>(m["bytes_per_pass_min"].get<uint64_t>() >> 20));
  EXPECT_EQ(h.finish(), 0) << h.err();
}

INSTANTIATE_TEST_SUITE_P(, LlamaModes, ::testing::Values("full", "small-pages", "cooperative"),
                         [](const auto& p) {
                           std::string n = p.param;
                           std::erase(n, '-');
                           return n;
                         });

// Cooperative mode overlaps compute with the fill: with the warm-up paced
// far below what a reader asks for, llama.cpp's touches drive the fill (each
// touch of a unit not filled yet waits in libairs' handler and asks the
// daemon for it), and the touch trace shows llama.cpp touching weights past
// blk.0 (so blk.0 was computed: one thread computes the graph in layer order)
// while the last load rank (output) was not read yet. The open itself
// returned long before the model was resident.
TEST_F(LlamaPool, CooperativeComputeOverlapsThePacedFill) {
  const auto model = model_path("24M", 12);
  const auto want = tokens_of(direct(model, {"--no-repack"}));
  ASSERT_FALSE(want.empty());
  // Where blk.0's weights end, from the file itself.
  auto src = airs::gguf::FdSource::open(model);
  ASSERT_TRUE(src) << src.error().message;
  auto parsed = airs::gguf::parse(*src);
  ASSERT_TRUE(parsed) << parsed.error().message;
  uint64_t blk0_end = 0;
  for (const auto& t : parsed->tensors)
    if (t.name.rfind("blk.0.", 0) == 0) blk0_end = std::max(blk0_end, t.offset + t.nbytes);
  ASSERT_GT(blk0_end, 0U);

  PrivateBus bus;
  DaemonProcess d(bus.address(), pool_toml("128M", mode_toml("cooperative", "warmup_rate = \"256K\"\n")));
  ASSERT_TRUE(d.started()) << d.log();
  const std::string trace = kWork + "/touch-trace.txt";
  fs::remove(trace);
  auto env = preload_env(bus.address());
  env.push_back("AIRS_TOUCH_TRACE=" + trace);
  auto r = run_with_env(env, gen_argv(model, {"--no-repack"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tokens_of(r), want) << r.err;
  EXPECT_NE(r.err.find("lazy)"), std::string::npos) << "the preload waited for residency:\n" << r.err;

  const auto m = first_model(bus.address());
  std::istringstream in(Held::slurp(trace));
  int touches = 0;
  int past_blk0_before_last = 0;
  for (std::string l; std::getline(in, l);) {
    unsigned long long u = 0, off = 0, ready = 0, units = 0;
    int last = -1;
    if (std::sscanf(l.c_str(), "touch unit=%llu offset=%llu ready_units=%llu units=%llu last_rank_ready=%d", &u, &off,
                    &ready, &units, &last) != 5)
      continue;
    ++touches;
    if (off >= blk0_end && last == 0) ++past_blk0_before_last;
  }
  std::fprintf(stderr, "touches %d, past blk.0 with the last rank unread %d, status %s\n", touches,
               past_blk0_before_last, m.dump().c_str());
  EXPECT_GT(touches, 0) << Held::slurp(trace);
  EXPECT_GT(past_blk0_before_last, 0) << Held::slurp(trace);
  // The touches asked the daemon for their units (counted as faults).
  EXPECT_GT(m.value("faults", uint64_t{0}), 0U) << m.dump();
}

// The README's way: `airs-run -- llama-cli ...`. airs-run as installed
// (bin/airs-run beside lib/<triplet>/airs/libairs-preload.so, in a
// temporary prefix), with no LD_PRELOAD or AIRS_PRELOAD_LIB of ours: it
// finds the shim itself, and llama.cpp gets its tokens from the pool.
TEST_F(LlamaPool, AirsRunRunsItOnThePoolWithTheTokensOfADirectLoad) {
  const auto model = model_path("24M", 12);
  const auto want = tokens_of(direct(model));
  ASSERT_FALSE(want.empty());
  const fs::path prefix = kWork + "/airs-run-prefix";
  fs::remove_all(prefix);
  // The triplet as airs-run works it out.
  auto t = run_process({"/bin/sh", "-c", "dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo \"$(uname -m)-linux-gnu\""});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const std::string triplet = t.out.substr(0, t.out.find('\n'));
  fs::create_directories(prefix / "bin");
  fs::create_directories(prefix / "lib" / triplet / "airs");
  fs::copy_file(airs::test::source_dir() + "/scripts/airs-run", prefix / "bin" / "airs-run");
  fs::copy_file(kPreload, prefix / "lib" / triplet / "airs" / "libairs-preload.so");

  PrivateBus bus;
  DaemonProcess d(bus.address(), pool_toml("128M", "[pressure]\nresize_pool = false\n"));
  ASSERT_TRUE(d.started()) << d.log();
  std::vector<std::string> argv = {(prefix / "bin" / "airs-run").string(), "--bus", bus.address(), "--verbose", "--"};
  for (auto& a : gen_argv(model, {"--hold"})) argv.push_back(a);
  Held h({"-u", "LD_PRELOAD", "-u", "AIRS_PRELOAD_LIB", "-u", "AIRS_BUS", "-u", "AIRS_PRELOAD_VERBOSE"}, argv,
         "airs-run");
  ASSERT_TRUE(h.wait_holding()) << h.err();
  EXPECT_EQ(tokens_of(ProcessResult{0, 0, h.out(), ""}), want) << h.err();
  EXPECT_NE(h.err().find("mapped from the pool"), std::string::npos) << h.err();
  // airs-run exec'd llama.cpp in its own process: it maps the pool region,
  // never the GGUF, and holds the model's one reference.
  EXPECT_FALSE(maps_contain(h.pid(), model));
  EXPECT_TRUE(maps_contain(h.pid(), "libairs-preload.so"));
  auto m = model_status(bus.address());
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ((*m)["refcount"].get<uint64_t>(), 1U) << m->dump();
  EXPECT_EQ((*m)["size"].get<uint64_t>(), fs::file_size(model));
  EXPECT_EQ(h.finish(), 0) << h.err();
  fs::remove_all(prefix);
}

TEST_F(LlamaPool, WithoutADaemonItRunsNormallyAndSaysSoOnce) {
  const auto model = model_path("4M", 11);
  const auto want = tokens_of(direct(model));
  PrivateBus bus;  // a bus, but no airs-memd on it
  auto r = run_with_env(preload_env(bus.address()), gen_argv(model, {}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tokens_of(r), want);
  std::istringstream in(r.err);
  int lines = 0;
  for (std::string l; std::getline(in, l);) lines += l.find("airs-preload") != std::string::npos ? 1 : 0;
  EXPECT_EQ(lines, 1) << r.err;
  // And with no bus at all.
  auto r2 = run_with_env({"LD_PRELOAD=" + kPreload, "AIRS_BUS=unix:path=/nonexistent/bus"}, gen_argv(model, {}));
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(tokens_of(r2), want);
  EXPECT_NE(r2.err.find("airs-preload: airs-memd not reachable"), std::string::npos) << r2.err;
}

TEST_F(LlamaPool, NoMmapModeReadsTheFileAndLeavesThePoolAlone) {
  const auto model = model_path("4M", 11);
  const auto want = tokens_of(direct(model, {"--mode", "none"}));
  PrivateBus bus;
  DaemonProcess d(bus.address(), pool_toml("64M"));
  ASSERT_TRUE(d.started()) << d.log();
  auto r = run_with_env(preload_env(bus.address()), gen_argv(model, {"--mode", "none"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(tokens_of(r), want);
  EXPECT_EQ(r.err.find("airs-preload"), std::string::npos) << r.err;
  EXPECT_FALSE(model_status(bus.address()).has_value()) << status(bus.address()).dump();
}

}  // namespace
