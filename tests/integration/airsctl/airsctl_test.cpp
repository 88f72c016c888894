// SPDX-License-Identifier: Apache-2.0
// airsctl's contract with scripts and people, against a real airs-memd on a
// private bus: one exit-code scheme (usage errors 2, nothing on stdout,
// the reason on stderr), a "schema" member in every --json document,
// `sessions` listing a live session (and how often its KV is read), `status --watch` refreshing, and the
// progress bar of `load` as a terminal shows it (a pty under script(1)).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "airs/airs.h"
#include "daemon_fixture.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

const char* kPool = "[pool]\nsize = \"64M\"\n";

#ifndef UFFD_FEATURE_POISON
#define UFFD_FEATURE_POISON (1 << 14)
#endif

// Whether this kernel's userfaultfd offers POISON (Linux 6.6), asked here
// directly (UFFDIO_API), not through the daemon's probe; nullopt when this
// process cannot create a userfaultfd.
std::optional<bool> kernel_has_uffd_poison() {
  const int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) return std::nullopt;
  uffdio_api api{};
  api.api = UFFD_API;
  const int rc = ::ioctl(fd, UFFDIO_API, &api);
  ::close(fd);
  if (rc != 0) return std::nullopt;
  return (api.features & UFFD_FEATURE_POISON) != 0;
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

// A model file in a fresh directory, removed with the fixture.
class ModelDir {
 public:
  explicit ModelDir(const std::string& name, uint64_t n_layers = 4) {
    dir_ = fs::temp_directory_path() / ("airsctl-test-" + std::to_string(::getpid()) + "-" + name);
    fs::create_directories(dir_);
    airs::gguf::ModelSpec spec;
    spec.name = name;
    spec.n_layers = n_layers;
    auto plan = airs::gguf::plan_model(spec);
    ok_ = plan && airs::gguf::write_model_file(*plan, path());
    if (plan && !plan->tensors.empty()) tensor_ = plan->tensors.front().name;
  }
  ~ModelDir() { fs::remove_all(dir_); }
  [[nodiscard]] bool ok() const { return ok_; }
  [[nodiscard]] std::string path() const { return (dir_ / "m.gguf").string(); }
  [[nodiscard]] const std::string& tensor() const { return tensor_; }

 private:
  fs::path dir_;
  bool ok_ = false;
  std::string tensor_;
};

}  // namespace

TEST(Airsctl, UsageErrorsExit2WithTheReasonOnStderrOnly) {
  const std::vector<std::vector<std::string>> cases = {
      {},                                   // no subcommand
      {"frobnicate"},                       // unknown subcommand
      {"--bogus", "status"},                // unknown global option
      {"status", "--watch", "soon"},        // not a number
      {"load"},                             // missing argument
      {"evict", "--priority", "urgent"},    // not an accepted value
      {"evict"},                            // airsctl's own check: nothing named
      {"evict", "--bytes", "lots"},         // airsctl's own check: not a size
      {"read", "only-one-argument"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv{airsctl_path(), "--bus", "unix:path=/nonexistent/airsctl-test"};
    argv.insert(argv.end(), c.begin(), c.end());
    auto r = run_process(argv);
    std::string shown;
    for (const auto& a : c) shown += a + " ";
    EXPECT_EQ(r.exit_code, 2) << "airsctl " << shown << "\nstderr: " << r.err;
    EXPECT_TRUE(r.out.empty()) << "airsctl " << shown << "\nstdout: " << r.out;
    EXPECT_FALSE(r.err.empty()) << "airsctl " << shown;
  }
}

TEST(Airsctl, HelpAndVersionExit0OnStdout) {
  for (const std::string flag : {"--help", "--version"}) {
    auto r = run_process({airsctl_path(), flag});
    EXPECT_EQ(r.exit_code, 0) << flag << ": " << r.err;
    EXPECT_FALSE(r.out.empty()) << flag;
    EXPECT_TRUE(r.err.empty()) << flag << ": " << r.err;
  }
  auto d = run_process({airs_memd_path(), "--no-such-option"});
  EXPECT_EQ(d.exit_code, 2) << "airs-memd uses the same usage status: " << d.err;
  EXPECT_TRUE(d.out.empty()) << d.out;
}

TEST(Airsctl, NoDaemonIsFailure1WithNothingOnStdout) {
  PrivateBus bus;
  for (const std::vector<std::string>& c : {std::vector<std::string>{"status"}, {"--json", "status"}, {"sessions"},
                                           {"--json", "sessions"}, {"unload", "x"}}) {
    std::vector<std::string> argv{airsctl_path(), "--bus", bus.address()};
    argv.insert(argv.end(), c.begin(), c.end());
    auto r = run_process(argv);
    EXPECT_EQ(r.exit_code, 1) << c.back() << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_NE(r.err.find("is airs-memd running?"), std::string::npos) << r.err;
  }
}

TEST(Airsctl, EveryJsonDocumentHasSchema1AndSessionsListsALiveSession) {
  ModelDir model("json-model");
  ASSERT_TRUE(model.ok());
  PrivateBus bus;
  DaemonProcess d(bus.address(), kPool);
  ASSERT_TRUE(d.started()) << d.log();
  auto ctl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{airsctl_path(), "--bus", bus.address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, std::chrono::seconds(60));
  };
  auto json_of = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "--json");
    auto r = ctl(args);
    EXPECT_EQ(r.exit_code, 0) << args[1] << ": " << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << args[1] << " printed no JSON: " << r.out;
    EXPECT_TRUE(j.is_object()) << r.out;
    if (j.is_object()) {
      EXPECT_EQ(j.value("schema", 0), 1) << args[1] << ": " << r.out;
    }
    return j;
  };

  json_of({"status"});
  auto none = json_of({"sessions"});
  EXPECT_TRUE(none["sessions"].empty()) << none.dump();
  auto human_none = ctl({"sessions"});
  EXPECT_EQ(human_none.exit_code, 0);
  EXPECT_NE(human_none.out.find("(no sessions)"), std::string::npos) << human_none.out;

  auto ins = json_of({"inspect", model.path()});
  EXPECT_FALSE(ins["tensors"].empty());
  auto ld = json_of({"load", "--name", "json-model", model.path()});
  EXPECT_EQ(ld["state"], "resident") << ld.dump();

  // A live client with a KV session (this process, through libairs).
  airs_client* c = nullptr;
  airs_model* m = nullptr;
  airs_session* s = nullptr;
  ASSERT_EQ(airs_connect(bus.address().c_str(), &c), 0) << airs_last_error();
  ASSERT_EQ(airs_model_open(c, model.path().c_str(), nullptr, &m), 0) << airs_last_error();
  // KV access sampling in rounds of 20 ms (a second by default), read when
  // the client makes its first session.
  ASSERT_EQ(::setenv("AIRS_KV_SAMPLE_MS", "20", 1), 0);
  const int created = airs_session_create(c, m, AIRS_PRIORITY_BACKGROUND, &s);
  ::unsetenv("AIRS_KV_SAMPLE_MS");
  ASSERT_EQ(created, 0) << airs_last_error();
  uint32_t blocks[2];
  ASSERT_EQ(airs_session_allocate(s, 2, blocks), 0) << airs_last_error();

  auto ss = json_of({"sessions"});
  ASSERT_EQ(ss["sessions"].size(), 1U) << ss.dump();
  const auto& one = ss["sessions"][0];
  EXPECT_EQ(one["priority"], "background") << one.dump();
  EXPECT_EQ(one["blocks"], 2) << one.dump();
  EXPECT_EQ(one["uid"], ::getuid()) << one.dump();
  EXPECT_EQ(one["model"], "json-model") << one.dump();
  auto human = ctl({"sessions"});
  ASSERT_EQ(human.exit_code, 0) << human.err;
  EXPECT_NE(human.out.find("SESSION"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find(one["session"].get<std::string>()), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("background"), std::string::npos) << human.out;

  // How often its KV is read: this process writes its blocks until a
  // report of the sampling says they were touched; then the rate is in the
  // JSON, and READ shows a share where it showed "-" (not measured).
  EXPECT_NE(human.out.find("READ"), std::string::npos) << human.out;
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);;) {
    for (const uint32_t b : blocks) static_cast<volatile uint8_t*>(airs_session_block_ptr(s, b))[0] = 1;
    auto now = json_of({"sessions"});
    ASSERT_EQ(now["sessions"].size(), 1U) << now.dump();
    if (now["sessions"][0].value("access_rate", -1.0) > 0) {
      EXPECT_GT(now["sessions"][0].value("access_reports", uint64_t{0}), 0U) << now.dump();
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no KV access report in 60 s: " << now.dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto rated = ctl({"sessions"});
  ASSERT_EQ(rated.exit_code, 0) << rated.err;
  {
    std::istringstream lines(rated.out);
    std::string line, last;
    while (std::getline(lines, line))
      if (line.find(one["session"].get<std::string>()) != std::string::npos) last = line.substr(line.rfind(' ') + 1);
    char* end = nullptr;
    const double shown = std::strtod(last.c_str(), &end);
    EXPECT_TRUE(!last.empty() && end != last.c_str() && std::string(end) == "%" && shown >= 0 && shown <= 100)
        << "READ is not a share: '" << last << "'\n" << rated.out;
  }

  auto rd = json_of({"read", model.path(), model.tensor()});
  EXPECT_EQ(rd["tensor"], model.tensor());
  EXPECT_EQ(rd["xxh64"].get<std::string>().size(), 16U) << rd.dump();
  auto ev = json_of({"evict", "--priority", "background", "--dry-run"});
  EXPECT_EQ(ev["dry_run"], true) << ev.dump();

  airs_session_close(s);
  airs_model_close(m);
  airs_disconnect(c);
  auto un = json_of({"unload", "--force", "json-model"});
  EXPECT_EQ(un["unloaded"], "json-model");
  EXPECT_EQ(d.stop(), 0) << d.log();
}

// Debian 12's 6.1 has no UFFDIO_POISON: status names the fallback
// (SIGBUS through the client's pidfd) there, and POISON on 6.6 and later.
TEST(Airsctl, StatusSaysHowAReadErrorReachesALazyClientOnThisKernel) {
  const auto poison = kernel_has_uffd_poison();
  if (!poison) GTEST_SKIP() << "this process cannot create a userfaultfd: no lazy mode to report on";
  PrivateBus bus;
  DaemonProcess d(bus.address(), kPool);
  ASSERT_TRUE(d.started()) << d.log();
  auto j = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status"}, std::chrono::seconds(60));
  ASSERT_EQ(j.exit_code, 0) << j.err;
  auto doc = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << j.out;
  EXPECT_EQ(doc.value("read_error", ""), *poison ? "poison" : "sigbus") << j.out;
  auto h = run_process({airsctl_path(), "--bus", bus.address(), "status"}, std::chrono::seconds(60));
  ASSERT_EQ(h.exit_code, 0) << h.err;
  if (doc.value("mode", "") != "cooperative") {
    EXPECT_NE(h.out.find(*poison ? "read errors: UFFDIO_POISON: the faulting access gets SIGBUS (BUS_ADRERR)"
                                 : "read errors: no UFFDIO_POISON (Linux < 6.6): the client process gets SIGBUS "
                                   "through its pidfd"),
              std::string::npos)
        << h.out;
  }
  EXPECT_EQ(d.stop(), 0) << d.log();
}

TEST(Airsctl, StatusWatchRefreshesUntilInterrupted) {
  PrivateBus bus;
  DaemonProcess d(bus.address(), kPool);
  ASSERT_TRUE(d.started()) << d.log();
  // Killed at the timeout (as ^C would stop it): every 0.3 s a cleared
  // screen and a whole status.
  auto r = run_process({airsctl_path(), "--bus", bus.address(), "status", "--watch", "0.3"}, std::chrono::milliseconds(2000));
  EXPECT_EQ(r.exit_code, -1) << "--watch ended by itself: " << r.err;
  const size_t frames = count(r.out, "\033[H\033[2J");
  EXPECT_GE(frames, 3U) << r.out;
  EXPECT_LE(frames, 8U) << r.out;
  EXPECT_EQ(count(r.out, "POOL "), frames) << r.out;
  auto j = run_process({airsctl_path(), "--bus", bus.address(), "--json", "status", "--watch", "0.3"},
                       std::chrono::milliseconds(1200));
  EXPECT_GE(count(j.out, "\"schema\": 1"), 2U) << j.out;
}

TEST(Airsctl, LoadShowsAProgressBarOnATerminalOnly) {
  if (::access("/usr/bin/script", X_OK) != 0) GTEST_SKIP() << "script(1) (util-linux) is not installed";
  ModelDir model("bar-model");
  ASSERT_TRUE(model.ok());
  PrivateBus bus;
  DaemonProcess d(bus.address(), kPool);
  ASSERT_TRUE(d.started()) << d.log();
  // A pty, as a person sees it: script runs airsctl on one and copies what
  // it writes.
  const std::string cmd = "'" + airsctl_path() + "' --bus '" + bus.address() + "' load --name bar-model '" + model.path() + "'";
  auto tty = run_process({"/usr/bin/script", "-qefc", cmd, "/dev/null"}, std::chrono::seconds(60));
  ASSERT_EQ(tty.exit_code, 0) << tty.out << tty.err;
  // Redrawn in place (carriage returns), ending full: 40 '#' and 100.0%.
  EXPECT_GE(count(tty.out, "\r"), 1U) << tty.out;
  EXPECT_NE(tty.out.find("bar-model [" + std::string(40, '#') + "] 100.0%"), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("MB/s"), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("resident bar-model"), std::string::npos) << tty.out;
  // Into a pipe (a script): no bar, just the result line.
  auto un = run_process({airsctl_path(), "--bus", bus.address(), "unload", "bar-model"});
  ASSERT_EQ(un.exit_code, 0) << un.err;
  auto pipe = run_process({airsctl_path(), "--bus", bus.address(), "load", "--name", "bar-model", model.path()},
                          std::chrono::seconds(60));
  ASSERT_EQ(pipe.exit_code, 0) << pipe.err;
  EXPECT_EQ(pipe.out.find('\r'), std::string::npos) << pipe.out;
  EXPECT_EQ(pipe.out.find('#'), std::string::npos) << pipe.out;
  EXPECT_EQ(pipe.out.rfind("resident bar-model", 0), 0U) << pipe.out;
  EXPECT_EQ(d.stop(), 0) << d.log();
}

// A model bigger than the pool streams: it is never resident, so load
// returns once it is loaded (it used to wait for residency for ever), and
// says it streams and through how much of the pool.
TEST(Airsctl, LoadOfAModelBiggerThanThePoolReturnsSayingItStreams) {
  ModelDir model("big-model", 24);
  ASSERT_TRUE(model.ok());
  ASSERT_GT(fs::file_size(model.path()), uint64_t{16} << 20);
  PrivateBus bus;
  DaemonProcess d(bus.address(), "[pool]\nsize = \"16M\"\n");
  ASSERT_TRUE(d.started()) << d.log();
  auto r = run_process({airsctl_path(), "--bus", bus.address(), "load", "--name", "big-model", model.path()},
                       std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << d.log();
  EXPECT_EQ(r.out.rfind("streamed big-model", 0), 0U) << r.out;
  EXPECT_NE(r.out.find("of the pool"), std::string::npos) << r.out;
  EXPECT_EQ(d.stop(), 0) << d.log();
}
