// SPDX-License-Identifier: Apache-2.0
// A hostile or confused D-Bus caller gets a named error that says what was
// wrong, and the daemon goes on serving everyone else.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <sdbus-c++/sdbus-c++.h>

#include "daemon_fixture.hpp"
#include "hostile_common.hpp"
#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("airs-hostile-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    airs::gguf::ModelSpec spec;
    spec.name = "victim";
    auto plan = airs::gguf::plan_model(spec);
    ASSERT_TRUE(plan);
    model_ = (dir_ / "m.gguf").string();
    ASSERT_TRUE(airs::gguf::write_model_file(*plan, model_));
    bus_ = std::make_unique<PrivateBus>();
    daemon_ = std::make_unique<DaemonProcess>(bus_->address(), "[pool]\nsize = \"64M\"\n");
    ASSERT_TRUE(daemon_->started()) << daemon_->log();
    conn_ = sdbus::createSessionBusConnectionWithAddress(bus_->address());
    mgr_ = sdbus::createProxy(*conn_, "org.aios.Airs1", "/org/aios/Airs1");
  }
  void TearDown() override {
    mgr_.reset();
    conn_.reset();
    if (daemon_) {
      EXPECT_EQ(daemon_->stop(), 0) << "the daemon did not survive: " << daemon_->log();
    }
    daemon_.reset();
    bus_.reset();
    fs::remove_all(dir_);
  }
  sdbus::ObjectPath load(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    sdbus::ObjectPath p;
    mgr_->callMethod("LoadModel")
        .onInterface("org.aios.Airs1.Manager")
        .withArguments(sdbus::UnixFd(fd, sdbus::adopt_fd), std::map<std::string, sdbus::Variant>{})
        .storeResultsTo(p);
    return p;
  }
  void expect_still_serving() {
    std::map<std::string, sdbus::Variant> st;
    mgr_->callMethod("GetStatus").onInterface("org.aios.Airs1.Manager").storeResultsTo(st);
    EXPECT_TRUE(st.count("pool"));
  }

  fs::path dir_;
  std::string model_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<sdbus::IConnection> conn_;
  std::unique_ptr<sdbus::IProxy> mgr_;
};

}  // namespace

TEST_F(Hostile, LoadModelFromAPipeIsRefused) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  expect_error([&] {
    sdbus::ObjectPath o;
    mgr_->callMethod("LoadModel").onInterface("org.aios.Airs1.Manager")
        .withArguments(sdbus::UnixFd(p[0]), std::map<std::string, sdbus::Variant>{}).storeResultsTo(o);
  }, "org.aios.Airs1.Error.InvalidArgument", "not a regular file");
  ::close(p[0]);
  ::close(p[1]);
  expect_still_serving();
}

TEST_F(Hostile, MalformedGgufIsBadModelNamingTheDefect) {
  const auto bad = (dir_ / "bad.gguf").string();
  std::ofstream(bad, std::ios::binary) << std::string("GGUF\x01\x00\x00\x00", 8) << std::string(64, '\0');
  expect_error([&] { load(bad); }, "org.aios.Airs1.Error.Unsupported", "version 1");
  const auto trunc = (dir_ / "trunc.gguf").string();
  std::ifstream in(model_, std::ios::binary);
  std::string head(100, '\0');
  in.read(head.data(), 100);
  std::ofstream(trunc, std::ios::binary) << head;
  expect_error([&] { load(trunc); }, "org.aios.Airs1.Error.BadModel", "gguf:");
  expect_still_serving();
}

TEST_F(Hostile, AttachWithoutOpenOrWithAFakeUffdIsRefused) {
  auto path = load(model_);
  auto model = sdbus::createProxy(*conn_, "org.aios.Airs1", path);
  int efd = ::eventfd(0, EFD_CLOEXEC);
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  expect_error([&] {
    model->callMethod("Attach").onInterface("org.aios.Airs1.Model")
        .withArguments(sdbus::UnixFd(efd), sdbus::UnixFd(p[0]), uint64_t{0x7f0000000000}, uint64_t{1} << 21);
  }, "org.freedesktop.DBus.Error.AccessDenied", "call OpenLazy first");

  sdbus::UnixFd region, status;
  uint64_t size = 0;
  std::map<std::string, sdbus::Variant> info;
  sdbus::UnixFd proof(::open(model_.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd);
  sdbus::UnixFd uffd(static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)), sdbus::adopt_fd);
  model->callMethod("OpenLazy").onInterface("org.aios.Airs1.Model")
      .withArguments(proof, uffd, std::map<std::string, sdbus::Variant>{})
      .storeResultsTo(region, size, status, info);
  // A pipe is not a userfaultfd: the daemon must notice, not crash.
  try {
    model->callMethod("Attach").onInterface("org.aios.Airs1.Model")
        .withArguments(sdbus::UnixFd(efd), sdbus::UnixFd(p[0]), uint64_t{0x7f0000000000}, size);
  } catch (const sdbus::Error& e) {
    EXPECT_FALSE(e.getMessage().empty());
  }
  // A wrong length is refused with the expected size in the message.
  expect_error([&] {
    model->callMethod("Attach").onInterface("org.aios.Airs1.Model")
        .withArguments(sdbus::UnixFd(efd), sdbus::UnixFd(p[0]), uint64_t{0x7f0000000000}, size / 2);
  }, "org.aios.Airs1.Error.InvalidArgument", "expected the whole");
  ::close(efd);
  ::close(p[0]);
  ::close(p[1]);
  expect_still_serving();
}

// Model.Follow (the cooperative mode's request socket): refused without a
// reference, and in the userfaultfd modes, where a fault does its job.
// Follow (the touch guard's socket and open-unit bits, in every mode) takes
// only what it can use safely: a connected SOCK_SEQPACKET socket and a memfd
// sealed against shrinking (the daemon reads it: a client that truncated it
// must not crash the daemon), and only after Open.
TEST_F(Hostile, FollowWithoutOpenOrWithDescriptorsItCannotUseIsRefused) {
  auto path = load(model_);
  auto model = sdbus::createProxy(*conn_, "org.aios.Airs1", path);
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  int sp[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0);
  const int unsealed = ::memfd_create("opened", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, 1 << 20), 0);
  const int sealed = ::memfd_create("opened", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(sealed, 0);
  ASSERT_EQ(::ftruncate(sealed, 1 << 20), 0);
  ASSERT_EQ(::fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  const auto follow = [&](int requests, int opened) {
    model->callMethod("Follow").onInterface("org.aios.Airs1.Model")
        .withArguments(sdbus::UnixFd(requests), sdbus::UnixFd(opened));
  };
  expect_error([&] { follow(sp[0], sealed); }, "org.freedesktop.DBus.Error.AccessDenied", "call Open first");
  sdbus::UnixFd region, status;
  uint64_t size = 0;
  std::map<std::string, sdbus::Variant> info;
  sdbus::UnixFd proof(::open(model_.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd);
  model->callMethod("Open").onInterface("org.aios.Airs1.Model")
      .withArguments(proof, std::map<std::string, sdbus::Variant>{})
      .storeResultsTo(region, size, status, info);
  expect_error([&] { follow(p[0], sealed); }, "org.aios.Airs1.Error.InvalidArgument", "SOCK_SEQPACKET");
  expect_error([&] { follow(sp[0], unsealed); }, "org.aios.Airs1.Error.InvalidArgument", "not sealed");
  expect_error([&] { follow(sp[0], p[0]); }, "org.aios.Airs1.Error.InvalidArgument", "memfd");
  // Right descriptors: accepted in this (full) mode too.
  follow(sp[0], sealed);
  for (int fd : {p[0], p[1], sp[0], sp[1], unsealed, sealed}) ::close(fd);
  expect_still_serving();
}

TEST_F(Hostile, BadPriorityAndUnknownObjectsAreNamed) {
  auto path = load(model_);
  expect_error([&] {
    sdbus::ObjectPath s;
    sdbus::UnixFd a, b, c;
    std::map<std::string, sdbus::Variant> g;
    mgr_->callMethod("CreateSession").onInterface("org.aios.Airs1.Manager")
        .withArguments(path, std::string("urgent"), std::map<std::string, sdbus::Variant>{})
        .storeResultsTo(s, a, b, c, g);
  }, "org.aios.Airs1.Error.InvalidArgument", "'urgent'");
  expect_error([&] {
    sdbus::ObjectPath s;
    sdbus::UnixFd a, b, c;
    std::map<std::string, sdbus::Variant> g;
    mgr_->callMethod("CreateSession").onInterface("org.aios.Airs1.Manager")
        .withArguments(sdbus::ObjectPath("/org/aios/Airs1/model/999"), std::string("system"),
                       std::map<std::string, sdbus::Variant>{})
        .storeResultsTo(s, a, b, c, g);
  }, "org.aios.Airs1.Error.NotFound", "/org/aios/Airs1/model/999");
  auto model = sdbus::createProxy(*conn_, "org.aios.Airs1", path);
  expect_error([&] { model->callMethod("Release").onInterface("org.aios.Airs1.Model"); },
               "org.aios.Airs1.Error.NotFound", "holds no reference");
  expect_still_serving();
}
