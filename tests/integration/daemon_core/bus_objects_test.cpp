// SPDX-License-Identifier: Apache-2.0
// The manager object below the process: registered on a real private
// dbus-daemon with a fake ManagerOps (it needs no Daemon now), and called
// from client processes. An admin method from another uid is refused before
// any daemon operation runs; root's reaches the operation, and a call any
// user may make is answered from the operations.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/access.hpp"
#include "daemon/bus_manager.hpp"
#include "daemon_fixture.hpp"
#include "dbus/names.hpp"

namespace airs::daemon {
namespace {

constexpr uid_t kNobody = 65534;

class FakeOps final : public ManagerOps {
 public:
  StatusSnapshot status() override {
    StatusSnapshot s;
    s.version = "fake-ops";
    s.profile = "test";
    return s;
  }
  [[nodiscard]] std::vector<ModelStatus> model_statuses() const override { return {}; }
  [[nodiscard]] std::vector<SessionStatus> list_sessions() const override { return {}; }
  Status read_header(const dbus::Caller&, int, const std::string&, HeaderDone) override {
    return make_error(ENOTSUP, "fake");
  }
  Result<std::string> load_model(const dbus::Caller&, int, const std::string&, const Header&) override {
    return make_error(ENOTSUP, "fake");
  }
  Status unload_model(const std::string& path, bool force, const std::string& who) override {
    unloads.push_back(path + (force ? " force " : " ") + who);
    return {};
  }
  Result<NewSession> create_session(const dbus::Caller&, const std::string&, const std::string&) override {
    return make_error(ENOTSUP, "fake");
  }
  std::vector<std::string> unloads;
};

// A client process (as `uid`) that calls Unload and GetStatus on `dest`
// and prints one line per call on `out`: "<method> ok [detail]" or
// "<method> <error name>". pid < 0: it could not be started.
struct Client {
  pid_t pid = -1;
  int out = -1;
};
Client call_as(uid_t uid, const std::string& address, const std::string& dest) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    std::string out;
    if (uid != 0 && (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0)) {
      out = "setuid failed\n";
    } else {
      try {
        auto bus = sdbus::createSessionBusConnectionWithAddress(address);
        auto proxy = sdbus::createProxy(*bus, dest, dbus::kManagerPath);
        const char* iface = "org.aios.Airs1.Manager";
        try {
          proxy->callMethod("Unload").onInterface(iface).withArguments(sdbus::ObjectPath("/org/aios/Airs1/model/7"),
                                                                        false);
          out += "Unload ok\n";
        } catch (const sdbus::Error& e) {
          out += "Unload " + e.getName() + "\n";
        }
        try {
          dbus::Dict st;
          proxy->callMethod("GetStatus").onInterface(iface).storeResultsTo(st);
          out += "GetStatus ok " + st.at("version").get<std::string>() + "\n";
        } catch (const sdbus::Error& e) {
          out += "GetStatus " + e.getName() + "\n";
        }
      } catch (const std::exception& e) {
        out += std::string("bus: ") + e.what() + "\n";
      }
    }
    (void)!::write(p[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(p[1]);
  return {pid, p[0]};
}

class BusObjects : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = sdbus::createSessionBusConnectionWithAddress(bus_.address());
    ids_.set_bus(server_.get());
    manager_ = std::make_unique<ManagerObject>(
        *server_, ManagerServices{ops_, ids_, access_, nullptr, nullptr, nullptr, "test", "full", 2u << 20});
  }
  void TearDown() override {
    manager_.reset();
    ids_.set_bus(nullptr);
    server_.reset();
  }

  // Runs a client process as `uid` and serves its calls on this thread
  // until it exits; returns what it printed.
  std::string serve(uid_t uid) {
    const auto [pid, out] = call_as(uid, bus_.address(), server_->getUniqueName());
    if (pid < 0) {
      if (out >= 0) ::close(out);
      return "no client process";
    }
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      while (server_->processPendingRequest()) {
      }
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        text = "timed out\n";
        break;
      }
      auto pd = server_->getEventLoopPollData();
      pollfd fd{pd.fd, static_cast<short>(pd.events), 0};
      (void)::poll(&fd, 1, 10);
    }
    char buf[4096];
    for (ssize_t n; (n = ::read(out, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    ::close(out);
    return text;
  }

  test::PrivateBus bus_;
  std::unique_ptr<sdbus::IConnection> server_;
  FakeOps ops_;
  dbus::IdentityCache ids_;
  Access access_{"", ""};
  std::unique_ptr<ManagerObject> manager_;
};

TEST_F(BusObjects, AnotherUidsAdminCallIsRefusedBeforeAnyDaemonOperation) {
  EXPECT_EQ(serve(kNobody), std::string("Unload ") + dbus::kErrAccessDenied + "\nGetStatus ok fake-ops\n");
  EXPECT_TRUE(ops_.unloads.empty()) << "a refused Unload reached the daemon: " << ops_.unloads.front();
}

TEST_F(BusObjects, RootsAdminCallReachesTheOperationNamingItsCaller) {
  EXPECT_EQ(serve(0), "Unload ok\nGetStatus ok fake-ops\n");
  ASSERT_EQ(ops_.unloads.size(), 1U);
  EXPECT_EQ(ops_.unloads[0].rfind("/org/aios/Airs1/model/7 uid 0 (:", 0), 0U) << ops_.unloads[0];
}

}  // namespace
}  // namespace airs::daemon
