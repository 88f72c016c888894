// SPDX-License-Identifier: Apache-2.0
// The bus going away under a running airs-memd (a real private dbus-daemon
// stopped with SIGTERM, then started again at the same address), and a
// daemon started before its bus. The daemon must keep serving what needs no
// bus (faults, fills, the metrics timer), fail the calls that were in flight,
// keep what the dead connections' processes hold until they exit, and come
// back to the bus. Real client processes (airs_test_client, airs_test_kv_client)
// check the bytes they read against the GGUF file. Ordered on events (log
// lines, client output, the metrics file), never on sleeps.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "daemon_fixture.hpp"
#include "harness.hpp"

using namespace airs::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

int daemon_uffd_fds(pid_t pid) {
  int n = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char link[256] = {};
    const ssize_t len = ::readlink((dir + "/" + e->d_name).c_str(), link, sizeof link - 1);
    if (len > 0 && std::string(link) == "anon_inode:[userfaultfd]") ++n;
  }
  ::closedir(d);
  return n;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

class BusLoss : public ::testing::Test {
 protected:
  // The bus's socket: a bus started again at this path is the same
  // address to the daemon and to every client.
  [[nodiscard]] std::string socket() const { return dir_.file("bus"); }
  [[nodiscard]] std::string address() const { return "unix:path=" + socket(); }
  [[nodiscard]] std::string metrics_path() const { return dir_.file("metrics.prom"); }

  // A paced warm-up (1 MiB/s; a client's faults are not paced) so a load
  // lasts tens of seconds however slowly processes start (sanitizers), and
  // a metrics file written every 100 ms: the one place that speaks while
  // the bus is away. Pinned: nothing evicts the model under the test; and
  // the pool is not given back to the kernel under memory pressure (a busy
  // machine has real PSI events), so the KV client always finds room.
  [[nodiscard]] std::string config(const std::string& extra = "") const {
    return "[pool]\nsize = \"64M\"\ngrow_nr_hugepages = false\n"
           "[models]\nqueue_depth = 1\nwarmup_rate = \"1M\"\npinned = [\"busloss\"]\n"
           "[pressure]\nresize_pool = false\n"
           "[daemon]\nmetrics_file = \"" +
           metrics_path() + "\"\nmetrics_interval = \"100ms\"\n" + extra;
  }

  bool huge_pages_ready() {
    if (auto why = hugepages_missing(64 * kMiB)) {
      ADD_FAILURE() << "huge pages missing: " << *why;
      return false;
    }
    return true;
  }

  [[nodiscard]] bool logged(const std::string& what) const {
    return daemon_ && daemon_->log().find(what) != std::string::npos;
  }

  // A value of the metrics file ("name value" or "name{labels} value").
  [[nodiscard]] std::optional<double> metric(const std::string& series) const {
    std::ifstream in(metrics_path());
    for (std::string line; std::getline(in, line);)
      if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
    return std::nullopt;
  }

  std::vector<std::string> client(const ModelFile& m, std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {test_client_path(), "--bus", address(), "--file", m.path};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  void expect_verified_by_the_daemon(Child& c, const ModelFile& m) {
    auto v = c.expect_line("verified", 60s);
    ASSERT_TRUE(v) << c.transcript();
    EXPECT_EQ(field_u64(*v, "tensors"), m.plan.tensors.size()) << *v;
    // 0: the daemon served every fault, the library never fell back to
    // reading the file itself (its path when the daemon dies).
    EXPECT_EQ(field(*v, "fallback"), "0") << *v;
  }

  void TearDown() override {
    if (daemon_ && daemon_->pid() > 0) {
      const int rc = daemon_->stop();
      EXPECT_EQ(rc, 0) << "airs-memd did not stop cleanly:\n" << daemon_->log();
    }
  }

  TempDir dir_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// The bus is stopped while the daemon fills a model for a lazy client that
// has not read yet, while another client holds a KV session, and while a
// third waits in Model.Open for residency. The lazy client then reads every
// byte through the daemon; the waiting call fails; the fill goes on. A new
// bus at the same address: airsctl status reaches the daemon again, a new
// client loads and reads, the kept session is listed but no new connection
// may use it, and once the old clients exit nothing they held is left.
TEST_F(BusLoss, ClientsMidLoadReadEveryByteAndANewBusAtTheSameAddressReachesTheDaemon) {
  if (!huge_pages_ready()) return;
  auto m = make_model(dir_, "m.gguf", "busloss", 32 * kMiB, 8);
  bus_ = std::make_unique<PrivateBus>(socket());
  daemon_ = std::make_unique<DaemonProcess>(address(), config());
  ASSERT_TRUE(daemon_->started()) << daemon_->log();
  const pid_t daemon_pid = daemon_->pid();
  const uint64_t region = round_up_pages(m.size());

  // A lazy client attached, holding back its reads.
  Child lazy(client(m, {"--order", "seq", "--wait-go"}));
  auto o = lazy.expect_line("opened");
  ASSERT_TRUE(o) << lazy.transcript();
  const std::string object = field(*o, "object");
  EXPECT_EQ(field(*o, "resident"), "0") << *o;
  EXPECT_GT(field_u64(*o, "uffd_fds"), 0u) << "the client did not attach lazily: " << *o;
  ASSERT_TRUE(lazy.expect_line("waiting")) << lazy.transcript();

  // A KV client: the model (lazily) and one session with 2 blocks written.
  uint64_t kv_bytes_before = 0;
  {
    BusClient c(address());
    kv_bytes_before = c.status()["pool"]["kv_bytes"].get<uint64_t>();
  }
  Child kv({AIRS_TEST_KV_CLIENT_PATH, "hold", "--bus", address(), "--file", m.path, "--sessions", "1", "--blocks",
            "2"});
  ASSERT_TRUE(kv.expect_line("ready", 60s)) << kv.transcript();

  // A call in flight: Open (read-only) waits until the model is resident.
  std::optional<CallError> waited;
  std::thread opener([&] {
    BusClient c(address());
    waited = c.open_model(object, m.path, false);
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{opener};
  ASSERT_TRUE(wait_until([&] { return logged("waits until it is resident"); }, 60s)) << daemon_->log();

  {
    BusClient c(address());
    auto ms = model_in(c.status(), object);
    ASSERT_EQ(ms.value("state", std::string()), "loading") << ms.dump();
    ASSERT_LT(ms.value("resident_bytes", region), region) << ms.dump();
    EXPECT_EQ(ms.value("refcount", 0u), 2u) << ms.dump();
  }

  // The bus goes (dbus-daemon exits on SIGTERM, closing every connection).
  bus_.reset();
  ASSERT_TRUE(wait_until([&] { return logged("lost the bus at " + address()); }, 30s)) << daemon_->log();
  opener.join();
  ASSERT_TRUE(waited.has_value());
  EXPECT_FALSE(waited->ok()) << "an Open in flight when the bus went answered as if nothing happened";

  // The fill goes on without the bus: the metrics file (written by a timer
  // of the same loop) says the bus is gone, and resident bytes grow.
  ASSERT_TRUE(wait_until([&] { return metric("airs_bus_connected") == 0.0; }, 30s)) << daemon_->log();
  const std::string resident_series = "airs_model_resident_bytes{model=\"busloss\"}";
  const double at_loss = metric(resident_series).value_or(0);
  EXPECT_LT(at_loss, static_cast<double>(region)) << "the model was resident before the test could read it";
  EXPECT_TRUE(wait_until([&] { return metric(resident_series).value_or(0) > at_loss; }, 60s))
      << "the fill stopped with the bus\n" << daemon_->log();
  EXPECT_EQ(metric("airs_bus_losses_total"), 1.0);
  // The lazy client and the KV client hold what they held; the opener's
  // connection held nothing (its Open never completed).
  EXPECT_EQ(metric("airs_bus_lost_owners"), 2.0);

  // The lazy client reads every byte now: the daemon serves its faults.
  ASSERT_TRUE(lazy.send("go"));
  expect_verified_by_the_daemon(lazy, m);
  EXPECT_EQ(lazy.wait(30s).exit_code, 0) << lazy.transcript();
  EXPECT_EQ(::kill(daemon_pid, 0), 0) << "airs-memd died with its bus:\n" << daemon_->log();
  EXPECT_EQ(count_of(daemon_->log(), "lost the bus at"), 1u) << "the loss is said once\n" << daemon_->log();

  // A new bus at the same address: the daemon takes its name again.
  bus_ = std::make_unique<PrivateBus>(socket());
  ASSERT_TRUE(wait_until([&] { return count_of(daemon_->log(), "serving org.aios.Airs1 on " + address()) == 2; }, 60s))
      << daemon_->log();
  auto st = airsctl_status(address());
  EXPECT_EQ(st["bus"]["state"], "connected") << st["bus"].dump();
  EXPECT_EQ(st["bus"]["losses"], 1) << st["bus"].dump();
  EXPECT_NE(st["bus"]["last_loss"].get<std::string>().find("processing bus requests"), std::string::npos)
      << st["bus"].dump();
  ASSERT_NE(model_in(st, object), nullptr) << st.dump(1);
  auto text = run_process({airsctl_path(), "--bus", address(), "status"});
  EXPECT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("bus: lost 1 time(s), the last for "), std::string::npos) << text.out;

  // The lazy client has exited: only the KV client holds the model now.
  BusClient dbus(address());
  ASSERT_TRUE(wait_until([&] { return model_in(dbus.status(), object).value("refcount", 99u) == 1; }, 30s))
      << model_in(dbus.status(), object).dump();
  EXPECT_EQ(dbus.status()["bus"]["lost_owners"], 1) << dbus.status()["bus"].dump();
  auto sessions = dbus.list_sessions();
  ASSERT_EQ(sessions.size(), 1u) << sessions.dump();
  const std::string session = sessions[0]["session"].get<std::string>();
  // Its two blocks, or those the pressure loop evicted meanwhile (background
  // KV goes first under memory pressure on a busy machine; the client
  // learns it from its notice page, bus or no bus).
  EXPECT_EQ(sessions[0]["blocks"].get<uint32_t>() + sessions[0]["evicted_blocks"].get<uint64_t>(), 2u)
      << sessions[0].dump();
  EXPECT_EQ(sessions[0]["owner"].get<std::string>().rfind("pid " + std::to_string(kv.pid()) + " (", 0), 0u)
      << sessions[0].dump();
  // Kept for its process, which no new connection is.
  auto denied = dbus.allocate(session, 1);
  EXPECT_EQ(denied.name, "org.freedesktop.DBus.Error.AccessDenied") << denied.name << ": " << denied.message;

  // A new client loads and reads the model over the new bus.
  Child late(client(m, {"--order", "random:3"}));
  expect_verified_by_the_daemon(late, m);
  EXPECT_EQ(late.wait(30s).exit_code, 0) << late.transcript();

  // The KV client exits: its session, reference and fds go as if it had
  // left the bus. Nothing is left of any client.
  kv.kill(SIGKILL);
  (void)kv.wait(10s);
  ASSERT_TRUE(wait_until([&] { return dbus.list_sessions().empty(); }, 30s)) << dbus.list_sessions().dump();
  ASSERT_TRUE(wait_until([&] { return model_in(dbus.status(), object).value("refcount", 99u) == 0; }, 30s));
  auto after = dbus.status();
  EXPECT_EQ(after["bus"]["lost_owners"], 0) << after["bus"].dump();
  EXPECT_EQ(after["pool"]["kv_bytes"].get<uint64_t>(), kv_bytes_before) << after["pool"].dump();
  EXPECT_EQ(model_in(after, object).value("clients", 99u), 0u);
  EXPECT_TRUE(wait_until([&] { return daemon_uffd_fds(daemon_pid) == 0; }, 30s))
      << "the daemon still holds client userfaultfds";
}

// A daemon told to stop while its bus is gone, holding what a live client
// of the lost bus holds: it stops cleanly (exit 0; under the sanitizers
// nothing leaked), and the client still reads the file's bytes.
TEST_F(BusLoss, StopsCleanlyWhileTheBusIsGone) {
  if (!huge_pages_ready()) return;
  auto m = make_model(dir_, "m.gguf", "busloss", 8 * kMiB, 4);
  bus_ = std::make_unique<PrivateBus>(socket());
  daemon_ = std::make_unique<DaemonProcess>(address(), config());
  ASSERT_TRUE(daemon_->started()) << daemon_->log();
  Child kv({AIRS_TEST_KV_CLIENT_PATH, "hold", "--bus", address(), "--file", m.path, "--sessions", "1", "--blocks",
            "1"});
  ASSERT_TRUE(kv.expect_line("ready", 60s)) << kv.transcript();
  bus_.reset();
  ASSERT_TRUE(wait_until([&] { return logged("lost the bus at " + address()); }, 30s)) << daemon_->log();
  ASSERT_TRUE(wait_until([&] { return metric("airs_bus_lost_owners") == 1.0; }, 30s)) << daemon_->log();
  EXPECT_EQ(daemon_->stop(), 0) << daemon_->log();
  // The client closes without an error (its calls on the dead bus fail
  // quietly).
  ASSERT_TRUE(kv.send("go"));
  EXPECT_TRUE(kv.expect_line("closed", 30s)) << kv.transcript();
  EXPECT_EQ(kv.wait(30s).exit_code, 0) << kv.transcript();
}

// No bus at start: the daemon builds its pool, says it waits (log, metrics
// file), and serves once a bus appears at its address.
TEST_F(BusLoss, WithoutABusAtStartTheDaemonWaitsThenServes) {
  if (!huge_pages_ready()) return;
  auto m = make_model(dir_, "m.gguf", "busloss", 8 * kMiB, 4);
  daemon_ = std::make_unique<DaemonProcess>(address(), config(), std::vector<std::string>{}, "no bus yet");
  ASSERT_TRUE(daemon_->started()) << daemon_->log();
  EXPECT_TRUE(logged("daemon.start_without_bus = \"wait\"")) << daemon_->log();
  ASSERT_TRUE(wait_until([&] { return metric("airs_bus_connected") == 0.0; }, 30s)) << daemon_->log();
  EXPECT_FALSE(logged("serving org.aios.Airs1"));

  bus_ = std::make_unique<PrivateBus>(socket());
  ASSERT_TRUE(wait_until([&] { return logged("serving org.aios.Airs1 on " + address() + " as"); }, 60s))
      << daemon_->log();
  auto st = airsctl_status(address());
  EXPECT_EQ(st["bus"]["state"], "connected") << st["bus"].dump();
  EXPECT_EQ(st["bus"]["losses"], 0) << st["bus"].dump();
  Child c(client(m, {"--order", "random:5"}));
  expect_verified_by_the_daemon(c, m);
  EXPECT_EQ(c.wait(30s).exit_code, 0) << c.transcript();
  EXPECT_TRUE(wait_until([&] { return metric("airs_bus_connected") == 1.0; }, 30s));
}

// A socket that accepts the daemon's connection but never answers (a bus
// restarted behind the socket systemd holds, or a hung bus): the daemon's
// loop goes on meanwhile (its metrics timer writes the file again after the
// connection was accepted), the attempt is given up, and a real bus started
// at that path is then connected to. A loop waiting in sd-bus's handshake
// would write nothing until its 90 s authentication timeout.
TEST_F(BusLoss, ABusThatAcceptsButNeverAnswersDoesNotHoldTheLoop) {
  if (!huge_pages_ready()) return;
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0) << std::strerror(errno);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  ASSERT_LT(socket().size(), sizeof sa.sun_path);
  std::memcpy(sa.sun_path, socket().c_str(), socket().size());
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(listener, 8), 0) << std::strerror(errno);

  daemon_ = std::make_unique<DaemonProcess>(address(), config(), std::vector<std::string>{}, "profile ");
  ASSERT_TRUE(daemon_->started()) << daemon_->log();
  pollfd pf{listener, POLLIN, 0};
  ASSERT_EQ(::poll(&pf, 1, 60000), 1) << "the daemon never connected\n" << daemon_->log();
  const int peer = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(peer, 0) << std::strerror(errno);
  // Accepted, never answered: the daemon's loop must go on.
  std::filesystem::remove(metrics_path());
  EXPECT_TRUE(wait_until([&] { return metric("airs_bus_connected") == 0.0; }, 30s))
      << "the loop did not run while a connection attempt waited\n" << daemon_->log();
  EXPECT_TRUE(wait_until([&] { return logged("did not answer within"); }, 60s)) << daemon_->log();
  EXPECT_FALSE(logged("serving org.aios.Airs1"));
  ::close(peer);
  ::close(listener);

  bus_ = std::make_unique<PrivateBus>(socket());
  ASSERT_TRUE(wait_until([&] { return logged("serving org.aios.Airs1 on " + address() + " as"); }, 60s))
      << daemon_->log();
  EXPECT_EQ(airsctl_status(address())["bus"]["state"], "connected");
}

// Configured not to wait, a daemon without its bus exits on its own, with
// status 1 and a message naming the bus address and the key.
TEST_F(BusLoss, WithoutABusAtStartAndStartWithoutBusFailTheDaemonExitsNamingTheAddress) {
  const std::string conf = dir_.file("airs-memd.conf");
  std::ofstream(conf) << "[pool]\nsize = \"8M\"\ngrow_nr_hugepages = false\n[daemon]\nstart_without_bus = \"fail\"\n";
  auto r = run_process({airs_memd_path(), "--config", conf, "--bus", address(), "--state-dir", dir_.file("state")},
                       120s);
  EXPECT_EQ(r.exit_code, 1) << "signal " << r.signal << "\n" << r.err;
  EXPECT_NE(r.err.find("cannot serve org.aios.Airs1 on the bus at " + address()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("daemon.start_without_bus = \"fail\""), std::string::npos) << r.err;
}

}  // namespace
