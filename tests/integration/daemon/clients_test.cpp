// SPDX-License-Identifier: Apache-2.0
// Who maps a model has one record, the pager's: status counts the clients
// the pager still serves, and a client it let go (here: a cooperative
// follower whose request socket hung up, its bus reference still held) is
// neither counted nor held against its caller's quota of request sockets.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>
#include <sdbus-c++/sdbus-c++.h>

#include "daemon_fixture.hpp"
#include "model_open.hpp"
#include "test_model.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

nlohmann::json status_json(const std::string& bus) {
  auto st = run_process({airsctl_path(), "--bus", bus, "--json", "status"});
  EXPECT_EQ(st.exit_code, 0) << st.err;
  return nlohmann::json::parse(st.out);
}

// A sealed memfd for the open-unit bits (wire/opened.hpp), big enough for
// any test model.
int opened_bits() {
  const int fd = ::memfd_create("opened", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, 1 << 20), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  return fd;
}

}  // namespace

TEST(DaemonClients, AFollowerWhoseSocketHungUpIsNoLongerCounted) {
  const TestModel tm = write_test_model("airs-clients", "followed", 4, 512);
  const std::string& model = tm.path;

  PrivateBus bus;
  DaemonProcess d(bus.address(), "[pool]\nsize = \"64M\"\n");
  ASSERT_TRUE(d.started()) << d.log();
  auto load = run_process({airsctl_path(), "--bus", bus.address(), "load", model});
  ASSERT_EQ(load.exit_code, 0) << load.err;
  auto before = status_json(bus.address());
  ASSERT_EQ(before["models"].size(), 1u) << before.dump(1);
  const std::string object = before["models"][0]["object"];

  auto conn = sdbus::createSessionBusConnectionWithAddress(bus.address());
  auto proxy = sdbus::createProxy(*conn, "org.aios.Airs1", object);
  const OpenReply reply = open_without_wait(*proxy, model);
  const int opened = opened_bits();
  // One request socket per reference: the daemon gets one end of a pair.
  auto follow = [&](int requests) {
    proxy->callMethod("Follow").onInterface("org.aios.Airs1.Model")
        .withArguments(sdbus::UnixFd(requests), sdbus::UnixFd(opened));
  };
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  follow(pair[1]);
  ::close(pair[1]);
  auto held = status_json(bus.address())["models"][0];
  EXPECT_EQ(held["refcount"], 1u) << held.dump();
  EXPECT_EQ(held["clients"], 1u) << held.dump();

  // Our end goes: the daemon's end hangs up and the pager lets the client
  // go. The reference stays (no Release, no exit), the client does not.
  ::close(pair[0]);
  nlohmann::json after;
  for (int i = 0; i < 1000; ++i) {
    after = status_json(bus.address())["models"][0];
    if (after["clients"] == 0u) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(after["clients"], 0u) << "status still counts the client the pager let go: " << after.dump();
  EXPECT_EQ(after["refcount"], 1u) << after.dump();

  // Nor is it held against the caller: its one reference may follow again.
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  EXPECT_NO_THROW(follow(pair[1])) << d.log();
  ::close(pair[1]);
  EXPECT_EQ(status_json(bus.address())["models"][0]["clients"], 1u);
  ::close(pair[0]);
  ::close(opened);

  proxy.reset();
  conn.reset();
  EXPECT_EQ(d.stop(), 0) << d.log();
  fs::remove_all(tm.dir);
}
