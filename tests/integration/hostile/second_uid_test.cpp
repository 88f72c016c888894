// SPDX-License-Identifier: Apache-2.0
// The hostile-client suite: a second uid, a flood, an impossible
// load, a forced unload under every kind of holder, bad fds and hostile
// options, against a real airs-memd on a private bus. Root is the daemon's
// admin and trusted user; uid 65534 (nobody) is the other user. Every check
// is on what a caller gets: the named error, the fd's access mode, or the
// bytes (or SIGBUS) a client process reads.
#include <fcntl.h>
#include <grp.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sdbus-c++/sdbus-c++.h>

#include "daemon_fixture.hpp"
#include "harness.hpp"
#include "hostile_common.hpp"

using namespace airs::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uid_t kNobody = 65534;
const char* kModelIf = "org.aios.Airs1.Model";
const char* kManagerIf = "org.aios.Airs1.Manager";

using Dict = std::map<std::string, sdbus::Variant>;

int daemon_fd_count(pid_t pid) {
  int n = 0;
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return -1;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}


// Model.Open of `obj` on connection `c`, proving access with an fd of
// `proof` (opened here, read-only). Throws sdbus::Error.
struct Opened {
  sdbus::UnixFd region, status;
  uint64_t size = 0;
  Dict info;
};
Opened open_model(sdbus::IConnection& c, const std::string& obj, const std::string& proof, const Dict& opts = {}) {
  auto p = sdbus::createProxy(c, "org.aios.Airs1", obj);
  Opened o;
  p->callMethod("Open").onInterface(kModelIf).withTimeout(60s)
      .withArguments(sdbus::UnixFd(::open(proof.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd), opts)
      .storeResultsTo(o.region, o.size, o.status, o.info);
  return o;
}

// Manager.LoadModel of `path` on connection `c`. Throws sdbus::Error.
std::string load_model(sdbus::IConnection& c, const std::string& path) {
  auto mgr = sdbus::createProxy(c, "org.aios.Airs1", "/org/aios/Airs1");
  sdbus::ObjectPath obj;
  mgr->callMethod("LoadModel").onInterface(kManagerIf)
      .withArguments(sdbus::UnixFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd), Dict{})
      .storeResultsTo(obj);
  return obj;
}

// A userfaultfd after its UFFDIO_API handshake, or -1. `user_mode_only`:
// the kind an unprivileged process may create (vm.unprivileged_userfaultfd
// = 0 refuses it the other kind).
int make_uffd(bool user_mode_only) {
#ifndef UFFD_USER_MODE_ONLY
  constexpr int UFFD_USER_MODE_ONLY = 1;
#endif
  const int fd = static_cast<int>(
      ::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | (user_mode_only ? UFFD_USER_MODE_ONLY : 0)));
  if (fd < 0) return -1;
  uffdio_api api{};
  api.api = UFFD_API;
  if (::ioctl(fd, UFFDIO_API, &api) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Model.OpenLazy of `obj` on `c` with `proof`'s fd (opened with `flags`)
// and a fresh userfaultfd. Throws sdbus::Error.
Opened open_lazy(sdbus::IConnection& c, const std::string& obj, const std::string& proof, bool user_mode_only,
                 int flags = O_RDONLY) {
  auto p = sdbus::createProxy(c, "org.aios.Airs1", obj);
  const int u = make_uffd(user_mode_only);
  if (u < 0) throw std::runtime_error(std::string("userfaultfd: ") + std::strerror(errno));
  Opened o;
  p->callMethod("OpenLazy").onInterface(kModelIf).withTimeout(60s)
      .withArguments(sdbus::UnixFd(::open(proof.c_str(), flags | O_CLOEXEC), sdbus::adopt_fd),
                     sdbus::UnixFd(u, sdbus::adopt_fd), Dict{})
      .storeResultsTo(o.region, o.size, o.status, o.info);
  return o;
}

// "rdwr bytes-equal" when `region` (of `size` bytes) is an O_RDWR fd whose
// first `len` bytes are the file's at `path`; else what differs.
std::string writable_with_file_bytes(const sdbus::UnixFd& region, const std::string& path, size_t len) {
  std::string out = (::fcntl(region.get(), F_GETFL) & O_ACCMODE) == O_RDWR ? "rdwr " : "NOT-RDWR ";
  void* w = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, region.get(), 0);
  if (w == MAP_FAILED) return out + "mmap: " + std::strerror(errno);
  std::string file(len, '\0');
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const bool read_all = ::pread(fd, file.data(), len, 0) == static_cast<ssize_t>(len);
  ::close(fd);
  out += read_all && std::memcmp(w, file.data(), len) == 0 ? "bytes-equal" : "BYTES-DIFFER";
  ::munmap(w, len);
  return out;
}

// A group every Debian system has (base-passwd), for a test's
// daemon.trusted_group / admin_group. nobody's own gid is none of them.
gid_t group_id(const char* name) {
  const group* g = ::getgrnam(name);
  return g != nullptr ? g->gr_gid : static_cast<gid_t>(-1);
}

// "small-pages" → "small_pages": a mode as a gtest parameter name.
std::string mode_name(const ::testing::TestParamInfo<std::string>& i) {
  std::string n = i.param;
  for (auto& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

class Hostile2 : public ::testing::Test {
 protected:
  void SetUp() override {
    // Readable by the other user: the directory and the shared model.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  }

  // `daemon_toml`: lines of the [daemon] table (trusted_group is empty
  // unless they set it).
  bool start(uint64_t pool_mib, const std::string& extra_toml = "", const std::string& daemon_toml = "") {
    if (auto why = hugepages_missing(pool_mib * kMiB)) {
      ADD_FAILURE() << "huge pages missing: " << *why;
      return false;
    }
    bus_ = std::make_unique<PrivateBus>();
    // trusted_group is empty: root is the only trusted caller here, whatever
    // groups this machine has.
    const std::string daemon_table =
        daemon_toml.find("trusted_group") == std::string::npos ? "trusted_group = \"\"\n" + daemon_toml : daemon_toml;
    const std::string toml = "[daemon]\n" + daemon_table + "[pool]\nsize = \"" + std::to_string(pool_mib) +
                             "M\"\ngrow_nr_hugepages = false\n[pressure]\nresize_pool = false\n" + extra_toml;
    daemon_ = std::make_unique<DaemonProcess>(bus_->address(), toml);
    if (!daemon_->started()) {
      ADD_FAILURE() << "airs-memd did not start:\n" << daemon_->log();
      return false;
    }
    dbus_ = std::make_unique<BusClient>(bus_->address());
    return true;
  }

  void TearDown() override {
    dbus_.reset();
    if (daemon_ && daemon_->pid() > 0) {
      EXPECT_EQ(daemon_->stop(), 0) << "the daemon did not survive:\n" << daemon_->log();
    }
  }

  ModelFile model(const std::string& file, const std::string& name, uint64_t bytes, mode_t mode = 0644,
                  uint64_t seed = 1) {
    auto m = make_model(dir_, file, name, bytes, 8, seed);
    EXPECT_EQ(::chmod(m.path.c_str(), mode), 0);
    return m;
  }

  std::string load(const ModelFile& m) {
    std::string obj;
    auto e = dbus_->load_model(m.path, &obj);
    EXPECT_TRUE(e.ok()) << e.name << ": " << e.message;
    return obj;
  }

  std::vector<std::string> client(const ModelFile& m, std::vector<std::string> extra) {
    std::vector<std::string> a = {test_client_path(), "--bus", bus_->address(), "--file", m.path};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // A connection of the calling (child) process.
  std::unique_ptr<sdbus::IConnection> connect() { return sdbus::createSessionBusConnectionWithAddress(bus_->address()); }

  // `method` ("Open" on model `obj`, or "LoadModel") called with `fd`, from
  // this process: what came back ("opened, fd mode N", "loaded PATH"); a
  // refusal throws (as_user gives its name and message).
  std::string call_with_fd(const std::string& method, const std::string& obj, const sdbus::UnixFd& fd) {
    auto c = connect();
    if (method == "Open") {
      auto p = sdbus::createProxy(*c, "org.aios.Airs1", obj);
      sdbus::UnixFd region, status;
      uint64_t size = 0;
      Dict info;
      p->callMethod("Open").onInterface(kModelIf).withArguments(fd, Dict{}).storeResultsTo(region, size, status, info);
      return "opened, fd mode " + std::to_string(::fcntl(region.get(), F_GETFL) & O_ACCMODE);
    }
    auto mgr = sdbus::createProxy(*c, "org.aios.Airs1", "/org/aios/Airs1");
    sdbus::ObjectPath path;
    mgr->callMethod("LoadModel").onInterface(kManagerIf).withArguments(fd, Dict{}).storeResultsTo(path);
    return "loaded " + std::string(path);
  }

  TempDir dir_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<BusClient> dbus_;
};

// ---- 1. access proven on every call ----

TEST_F(Hostile2, AnotherUidCannotOpenAModelItCannotRead) {
  if (!start(64)) return;
  auto secret = model("secret.gguf", "secret", 16 * kMiB, 0600);
  auto mine = model("mine.gguf", "mine", 16 * kMiB, 0644, 2);
  const std::string obj = load(secret);
  ASSERT_TRUE(wait_until([&] { return model_in(dbus_->status(), obj).value("state", "") == "resident"; },
                                     20000ms));
  // nobody cannot open() the file itself.
  EXPECT_EQ(as_user(kNobody, [&] { return std::to_string(::open(secret.path.c_str(), O_RDONLY)); }), "-1");
  // Open with an fd of a file it can read: not the model's file.
  auto r = as_user(kNobody, [&] {
    (void)open_model(*connect(), obj, mine.path);
    return std::string("opened");
  });
  EXPECT_EQ(r.rfind("org.freedesktop.DBus.Error.AccessDenied", 0), 0u) << r;
  EXPECT_NE(r.find("not this model's GGUF file"), std::string::npos) << r;
  // An O_PATH fd of the 0600 file proves nothing: InvalidArgument, for Open
  // and for LoadModel (which must not hand back root's model either).
  for (const char* method : {"Open", "LoadModel"}) {
    auto o = as_user(kNobody, [&] {
      return call_with_fd(method, obj, sdbus::UnixFd(::open(secret.path.c_str(), O_PATH | O_CLOEXEC), sdbus::adopt_fd));
    });
    EXPECT_EQ(o.rfind("org.aios.Airs1.Error.InvalidArgument", 0), 0u) << method << ": " << o;
    EXPECT_NE(o.find("O_PATH"), std::string::npos) << method << ": " << o;
  }
  EXPECT_EQ(model_in(dbus_->status(), obj).value("refcount", 99u), 0u) << "a refused caller got a reference";
}

// Rule 1, write-only: a descriptor opened O_WRONLY proves no read access.
// The attack: a file that nobody may write but not read (mode 0602). Its
// O_WRONLY fd loads nothing, opens nothing, and proves nothing a session
// could rest on; root's O_WRONLY fd is refused by OpenLazy the same way.
TEST_F(Hostile2, WriteOnlyFdsAreInvalidArgument) {
  if (!start(64)) return;
  auto m = model("wo.gguf", "wo", 16 * kMiB, 0602);
  ASSERT_EQ(as_user(kNobody, [&] { return std::to_string(::open(m.path.c_str(), O_RDONLY)); }), "-1")
      << "the premise: nobody cannot read the file";
  const std::string obj = load(m);
  ASSERT_TRUE(wait_until([&] { return model_in(dbus_->status(), obj).value("state", "") == "resident"; }, 20000ms));
  const std::string inval = "org.aios.Airs1.Error.InvalidArgument";
  for (const char* method : {"LoadModel", "Open"}) {
    auto r = as_user(kNobody, [&] {
      sdbus::UnixFd fd(::open(m.path.c_str(), O_WRONLY | O_CLOEXEC), sdbus::adopt_fd);
      if (fd.get() < 0) return std::string("the premise: nobody cannot open the file O_WRONLY");
      return call_with_fd(method, obj, fd);
    });
    EXPECT_EQ(r, inval + ": " + method + ": gguf_fd: the descriptor is not open for reading") << method;
  }
  // Refused calls proved nothing: no reference, and no KV session on the model.
  EXPECT_EQ(model_in(dbus_->status(), obj).value("refcount", 99u), 0u) << "a refused caller got a reference";
  auto s = as_user(kNobody, [&] {
    auto c = connect();
    auto mgr = sdbus::createProxy(*c, "org.aios.Airs1", "/org/aios/Airs1");
    sdbus::ObjectPath session;
    sdbus::UnixFd arena, notice, event;
    Dict geometry;
    mgr->callMethod("CreateSession").onInterface(kManagerIf).withArguments(sdbus::ObjectPath(obj), "interactive", Dict{})
        .storeResultsTo(session, arena, notice, event, geometry);
    return std::string("session ") + std::string(session);
  });
  EXPECT_EQ(s.rfind("org.freedesktop.DBus.Error.AccessDenied", 0), 0u) << s;
  // Root is trusted and has a real userfaultfd: OpenLazy still wants a readable fd.
  try {
    (void)open_lazy(*connect(), obj, m.path, false, O_WRONLY);
    ADD_FAILURE() << "OpenLazy took a write-only fd";
  } catch (const sdbus::Error& e) {
    EXPECT_EQ(e.getName() + ": " + e.getMessage(), inval + ": Open: gguf_fd: the descriptor is not open for reading");
  }
}

// ---- 2. writable regions only for the trusted, read-only for the rest ----

TEST_F(Hostile2, UntrustedCallerGetsNoWritableRegionAndWaitsForResidency) {
  // Paced so the model is still loading when nobody asks.
  if (!start(64, "[models]\nwarmup_rate = \"8M\"\n")) return;
  auto m = model("m.gguf", "shared", 24 * kMiB);
  const std::string obj = load(m);
  // Root holds it: nobody's pending Open holds nothing until it is answered.
  ASSERT_TRUE(dbus_->hold_model(obj, m.path).ok());
  auto r = as_user(kNobody, [&] {
    auto c = connect();
    auto p = sdbus::createProxy(*c, "org.aios.Airs1", obj);
    sdbus::UnixFd region, status;
    uint64_t size = 0;
    Dict info;
    sdbus::UnixFd proof(::open(m.path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd);
    std::string out;
    try {
      // nobody cannot make a userfaultfd here; an eventfd stands in.
      sdbus::UnixFd fake(::open(m.path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd);
      p->callMethod("OpenLazy").onInterface(kModelIf).withArguments(proof, fake, Dict{}).storeResultsTo(region, size,
                                                                                                     status, info);
      out = "lazy-opened ";
    } catch (const sdbus::Error& e) {
      out = e.getName() + " ";
    }
    // The read-only path: the reply waits until the model is resident.
    p->callMethod("Open").onInterface(kModelIf).withTimeout(60s).withArguments(proof, Dict{}).storeResultsTo(
        region, size, status, info);
    const int fl = ::fcntl(region.get(), F_GETFL);
    out += (fl & O_ACCMODE) == O_RDONLY ? "rdonly " : "WRITABLE ";
    out += info.at("resident").get<bool>() ? "resident " : "not-resident ";
    void* w = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, region.get(), 0);
    out += w == MAP_FAILED ? "no-write-map" : "WRITE-MAPPED";
    return out;
  });
  EXPECT_EQ(r, "org.freedesktop.DBus.Error.AccessDenied rdonly resident no-write-map");
  // While it waited, root's lazy client read the right bytes.
  Child c(client(m, {"--order", "seq"}));
  ASSERT_TRUE(c.expect_line("verified", 30s)) << c.transcript();
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
}

// daemon.trusted_group: a member (here nobody, by a supplementary group the
// bus authenticates) gets what root gets, a writable region for its own
// userfaultfd, with the model's bytes in it; the same uid without the group
// is refused, naming what to do.
TEST_F(Hostile2, ATrustedGroupMemberGetsAWritableRegionAndOthersDoNot) {
  const gid_t trusted = group_id("users");
  ASSERT_NE(trusted, static_cast<gid_t>(-1)) << "no group 'users' (Debian's base-passwd has one)";
  ASSERT_NE(trusted, kNobody);
  if (!start(64, "", "trusted_group = \"users\"\n")) return;
  auto m = model("m.gguf", "lazy", 16 * kMiB);
  const std::string obj = load(m);
  ASSERT_TRUE(wait_until([&] { return model_in(dbus_->status(), obj).value("state", "") == "resident"; }, 20000ms));
  const size_t len = static_cast<size_t>(m.size());
  auto member = as_user(kNobody, {trusted}, [&] {
    auto o = open_lazy(*connect(), obj, m.path, true);
    return writable_with_file_bytes(o.region, m.path, len);
  });
  EXPECT_EQ(member, "rdwr bytes-equal");
  auto other = as_user(kNobody, [&] {
    (void)open_lazy(*connect(), obj, m.path, true);
    return std::string("lazy-opened");
  });
  EXPECT_EQ(other.rfind("org.freedesktop.DBus.Error.AccessDenied", 0), 0u) << other;
  EXPECT_NE(other.find("uid 65534 is not trusted with a writable region"), std::string::npos) << other;

  // The name was looked up once, at the start, not at each of these calls
  // (a lookup may ask a directory server); SIGHUP looks it up again, and
  // the member is still trusted.
  const std::string resolved = "daemon.trusted_group = \"users\": gid " + std::to_string(trusted) + "\n";
  auto count = [&] {
    const std::string log = daemon_->log();
    size_t n = 0;
    for (size_t at = log.find(resolved); at != std::string::npos; at = log.find(resolved, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count(), 1u) << daemon_->log();
  ASSERT_EQ(::kill(daemon_->pid(), SIGHUP), 0);
  EXPECT_TRUE(wait_until([&] { return count() == 2; }, 20000ms)) << daemon_->log();
  auto again = as_user(kNobody, {trusted}, [&] {
    auto o = open_lazy(*connect(), obj, m.path, true);
    return writable_with_file_bytes(o.region, m.path, len);
  });
  EXPECT_EQ(again, "rdwr bytes-equal");
}

// daemon.admin_group: a member may Evict and Unload root's models (admin
// methods) and is trusted too; the same uid without the group may do
// neither, and the refusal names the group.
TEST_F(Hostile2, AnAdminGroupMemberMayEvictAndUnloadRootsModelsAndOthersMayNot) {
  const gid_t admin = group_id("staff");
  ASSERT_NE(admin, static_cast<gid_t>(-1)) << "no group 'staff' (Debian's base-passwd has one)";
  ASSERT_NE(admin, kNobody);
  if (!start(64, "", "admin_group = \"staff\"\n")) return;
  auto a = model("a.gguf", "roots_a", 8 * kMiB, 0644, 21);
  auto b = model("b.gguf", "roots_b", 8 * kMiB, 0644, 22);
  const std::string a_obj = load(a), b_obj = load(b);
  ASSERT_TRUE(wait_until(
      [&] {
        auto st = dbus_->status();
        return model_in(st, a_obj).value("state", "") == "resident" &&
               model_in(st, b_obj).value("state", "") == "resident";
      },
      20000ms));
  auto evict = [&](const std::string& obj) {
    auto c = connect();
    auto mgr = sdbus::createProxy(*c, "org.aios.Airs1", "/org/aios/Airs1");
    Dict report;
    mgr->callMethod("Evict").onInterface(kManagerIf).withArguments(Dict{{"model", sdbus::Variant(sdbus::ObjectPath(obj))}}, false)
        .storeResultsTo(report);
    return "evicted " + std::to_string(report.at("freed_bytes").get<uint64_t>() > 0);
  };
  auto unload = [&](const std::string& obj) {
    auto c = connect();
    auto mgr = sdbus::createProxy(*c, "org.aios.Airs1", "/org/aios/Airs1");
    mgr->callMethod("Unload").onInterface(kManagerIf).withArguments(sdbus::ObjectPath(obj), false);
    return std::string("unloaded");
  };
  const std::string denied = "org.freedesktop.DBus.Error.AccessDenied: ";
  EXPECT_EQ(as_user(kNobody, [&] { return evict(a_obj); }),
            denied + "Evict is an admin method: uid 65534 is not root nor in group staff");
  EXPECT_EQ(as_user(kNobody, [&] { return unload(a_obj); }),
            denied + "Unload is an admin method: uid 65534 is not root nor in group staff");
  auto st = dbus_->status();
  ASSERT_TRUE(model_in(st, a_obj).is_object() && model_in(st, b_obj).is_object()) << st.dump(1);

  EXPECT_EQ(as_user(kNobody, {admin}, [&] { return evict(a_obj); }), "evicted 1");
  EXPECT_EQ(as_user(kNobody, {admin}, [&] { return unload(b_obj); }), "unloaded");
  st = dbus_->status();
  EXPECT_TRUE(model_in(st, a_obj).is_null()) << "Evict by an admin left the model: " << st.dump(1);
  EXPECT_TRUE(model_in(st, b_obj).is_null()) << "Unload by an admin left the model: " << st.dump(1);
  EXPECT_EQ(st["pool"]["model_bytes"].get<uint64_t>(), 0u) << st["pool"].dump();
  // An admin is trusted: OpenLazy gives it the writable region.
  auto c = model("c.gguf", "roots_c", 8 * kMiB, 0644, 23);
  const std::string c_obj = load(c);
  ASSERT_TRUE(wait_until([&] { return model_in(dbus_->status(), c_obj).value("state", "") == "resident"; }, 20000ms));
  EXPECT_EQ(as_user(kNobody, {admin}, [&] {
              return writable_with_file_bytes(open_lazy(*connect(), c_obj, c.path, true).region, c.path,
                                              static_cast<size_t>(c.size()));
            }),
            "rdwr bytes-equal");
}

// A caller's groups are the ones it had when it connected, as the bus took
// them from the socket, not what /proc/PID/status says at its first call. A
// process that connects and then gains a group (it hands its socket to a
// child and execs a setgid program, or it dies and its pid goes to a member
// of the group) gains no right by it. Here the client connects as nobody,
// keeping root as its saved uid, then takes staff (admin_group) as its egid
// and only group, and calls Evict: refused. A second connection made after
// the change, with the same ids, is an admin, which shows the group was
// really held.
TEST_F(Hostile2, AGroupGainedAfterConnectingGivesNoRight) {
  const gid_t admin = group_id("staff");
  ASSERT_NE(admin, static_cast<gid_t>(-1)) << "no group 'staff' (Debian's base-passwd has one)";
  ASSERT_NE(admin, kNobody);
  if (!start(64, "", "admin_group = \"staff\"\n")) return;
  auto a = model("a.gguf", "roots_a", 8 * kMiB, 0644, 31);
  const std::string a_obj = load(a);
  ASSERT_TRUE(wait_until([&] { return model_in(dbus_->status(), a_obj).value("state", "") == "resident"; }, 20000ms));
  auto evict = [&](sdbus::IConnection& c) -> std::string {
    try {
      auto mgr = sdbus::createProxy(c, "org.aios.Airs1", "/org/aios/Airs1");
      Dict report;
      mgr->callMethod("Evict")
          .onInterface(kManagerIf)
          .withArguments(Dict{{"model", sdbus::Variant(sdbus::ObjectPath(a_obj))}}, false)
          .storeResultsTo(report);
      return "evicted " + std::to_string(report.at("freed_bytes").get<uint64_t>() > 0);
    } catch (const sdbus::Error& e) {
      return e.getName() + ": " + e.getMessage();
    }
  };
  const std::string out = as_user(0, [&]() -> std::string {
    if (::setresgid(kNobody, kNobody, 0) != 0 || ::setresuid(kNobody, kNobody, 0) != 0)
      return std::string("setresuid: ") + std::strerror(errno);
    auto early = connect();
    // Root again only to change the groups, then nobody again.
    if (::seteuid(0) != 0 || ::setgroups(1, &admin) != 0 || ::setegid(admin) != 0 || ::seteuid(kNobody) != 0)
      return std::string("taking the group: ") + std::strerror(errno);
    gid_t groups[4];
    const int n = ::getgroups(4, groups);
    if (::geteuid() != kNobody || ::getegid() != admin || n != 1 || groups[0] != admin)
      return "the process does not show the group it took";
    std::string r = evict(*early);
    auto late = connect();
    return r + "; " + evict(*late);
  });
  EXPECT_EQ(out, "org.freedesktop.DBus.Error.AccessDenied: Evict is an admin method: uid 65534 is not root nor in "
                 "group staff; evicted 1");
}

TEST_F(Hostile2, WaitingOpensAreBoundedPerClient) {
  // Paced so the model stays loading while the Opens wait.
  // Three huge pages at least: with 32 MiB pages a 24 MiB model is one unit,
  // resident at once.
  const uint64_t size = std::max<uint64_t>(24 * kMiB, 3 * huge_page_size());
  if (!start(std::max<uint64_t>(64, round_up_pages(size) / kMiB), "[models]\nwarmup_rate = \"4M\"\n")) return;
  auto m = model("m.gguf", "slow", size);
  const std::string obj = load(m);
  // Root holds it (nobody's pending Opens hold nothing); the quota is per connection.
  ASSERT_TRUE(dbus_->hold_model(obj, m.path).ok());
  auto r = as_user(kNobody, [&] {
    // One connection (one client), six Opens in flight at once. The replies
    // are processed on this thread: a thread started in a child forked from
    // a process with threads is outside what ThreadSanitizer supports, and
    // sdbus-c++'s async calls race its event loop thread on the call's
    // bookkeeping, which an uninstrumented library build cannot show as
    // ordered.
    auto c = connect();
    auto p = sdbus::createProxy(*c, "org.aios.Airs1", obj);
    std::vector<std::string> got;
    for (int i = 0; i < 6; ++i) {
      p->callMethodAsync("Open").onInterface(kModelIf).withTimeout(60s)
          .withArguments(sdbus::UnixFd(::open(m.path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd), Dict{})
          .uponReplyInvoke([&](const sdbus::Error* e, sdbus::UnixFd, uint64_t, sdbus::UnixFd, Dict) {
            got.push_back(e == nullptr ? std::string("ok") : e->getName());
          });
    }
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (got.size() < 6 && std::chrono::steady_clock::now() < deadline) {
      if (c->processPendingRequest()) continue;
      const auto pd = c->getEventLoopPollData();
      pollfd pfd{pd.fd, pd.events, 0};
      ::poll(&pfd, 1, 100);
    }
    int ok = 0, quota = 0;
    for (auto& g : got) {
      ok += g == "ok";
      quota += g == "org.aios.Airs1.Error.QuotaExceeded";
    }
    return std::to_string(ok) + " ok, " + std::to_string(quota) + " quota";
  });
  EXPECT_EQ(r, "4 ok, 2 quota");
}

// The region fd a user gets cannot be turned writable: not by reopening it
// through /proc (memfds are created 0777; the daemon makes them 0600).
class ReadOnlyRegion : public Hostile2, public ::testing::WithParamInterface<std::string> {};

TEST_P(ReadOnlyRegion, CannotBeReopenedWritable) {
  if (!start(64, "[models]\nmode = \"" + GetParam() + "\"\n")) return;
  auto m = model("m.gguf", "ro", 16 * kMiB);
  const std::string obj = load(m);
  auto r = as_user(kNobody, [&] {
    Dict opts;
    if (GetParam() == "cooperative") opts["wait"] = sdbus::Variant(false);
    auto o = open_model(*connect(), obj, m.path, opts);
    std::string out;
    for (const auto* fd : {&o.region, &o.status}) {
      const std::string path = "/proc/self/fd/" + std::to_string(fd->get());
      const int w = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      out += w >= 0 ? "REOPENED-WRITABLE " : "refused ";
      if (w >= 0) ::close(w);
    }
    return out;
  });
  EXPECT_EQ(r, "refused refused ");
}

INSTANTIATE_TEST_SUITE_P(Modes, ReadOnlyRegion, ::testing::Values("full", "small-pages", "cooperative"),
                         mode_name);

// ---- 3. quotas and loads that cannot fit ----

TEST_F(Hostile2, AFloodOfModelsStopsAtTheQuotaAndEvictsNobodyElses) {
  // Room for root's model and the three allowed, a huge page each at least.
  if (!start(std::max<uint64_t>(64, 5 * huge_page_size() / kMiB), "[models]\nmax_models_per_uid = 3\n")) return;
  auto roots = model("root.gguf", "roots", 16 * kMiB, 0644, 9);
  const std::string root_obj = load(roots);
  const int fds_before = daemon_fd_count(daemon_->pid());
  std::vector<ModelFile> files;
  for (int i = 0; i < 6; ++i) {
    files.push_back(make_model(dir_, "f" + std::to_string(i) + ".gguf", "flood" + std::to_string(i), 4 * kMiB, 2,
                               100 + static_cast<uint64_t>(i)));
    ASSERT_EQ(::chmod(files.back().path.c_str(), 0644), 0);
  }
  auto r = as_user(kNobody, [&] {
    auto c = connect();
    std::string out;
    for (const auto& f : files) {
      try {
        (void)load_model(*c, f.path);
        out += "ok ";
      } catch (const sdbus::Error& e) {
        out += e.getName() + " ";
      }
    }
    return out;
  });
  const std::string q = "org.aios.Airs1.Error.QuotaExceeded";
  EXPECT_EQ(r, "ok ok ok " + q + " " + q + " " + q + " ");
  auto st = dbus_->status();
  EXPECT_EQ(st["models"].size(), 4u) << st.dump(1);
  EXPECT_FALSE(model_in(st, root_obj).is_null()) << "the flood evicted root's model";
  // The daemon holds a bounded number of fds per model, not per call.
  EXPECT_LE(daemon_fd_count(daemon_->pid()), fds_before + 3 * 8) << "fds grew with refused loads";
}

TEST_F(Hostile2, PoolShareBoundsWhatAnotherUidCanPushOut) {
  if (!start(64, "[models]\nmax_pool_bytes_per_uid = \"25%\"\n")) return;
  auto roots = model("root.gguf", "roots", 40 * kMiB, 0644, 3);
  const std::string root_obj = load(roots);
  ASSERT_TRUE(wait_until(
      [&] { return model_in(dbus_->status(), root_obj).value("state", "") == "resident"; }, 20000ms));
  // It would need root's idle model out, and is more than nobody's 16 MiB share.
  auto big = model("big.gguf", "big", 40 * kMiB, 0644, 4);
  ASSERT_GT(big.size(), 64 * kMiB - round_up_pages(roots.size())) << "the test model fits without an eviction";
  // Bigger than nobody's share: it is streamed within the share (or, if it
  // cannot stream in so little, refused naming the share). Either way
  // nobody holds no more than its share, and root's idle model stays.
  std::string big_obj;
  auto r = as_user(kNobody, [&] {
    big_obj = std::string(load_model(*connect(), big.path));
    return "loaded " + big_obj;
  });
  auto st = dbus_->status();
  ASSERT_TRUE(model_in(st, root_obj).is_object()) << "root's model was evicted for nobody's load: " << r << "\n"
                                                  << st.dump(1) << "\n" << daemon_->log();
  if (r.rfind("loaded ", 0) == 0) {
    const auto b = model_in(st, r.substr(7));
    ASSERT_TRUE(b.is_object()) << r << "\n" << st.dump(1) << "\n" << daemon_->log();
    EXPECT_EQ(b.value("streamed", false), true) << st.dump(1);
    EXPECT_LE(b.value("budget_bytes", uint64_t{0}), 16 * kMiB) << "more than nobody's share: " << st.dump(1);
  } else {
    EXPECT_EQ(r.rfind("org.aios.Airs1.Error.QuotaExceeded", 0), 0u) << r << "\n" << daemon_->log();
    EXPECT_NE(r.find("max_pool_bytes_per_uid"), std::string::npos) << r;
  }
  EXPECT_EQ(model_in(st, root_obj).value("state", ""), "resident") << "root's model was evicted for nobody's load";
}

TEST_F(Hostile2, AnImpossibleLoadFailsBeforeEvictingAnything) {
  // Sizes in units of 8 MiB or one huge page, whichever is larger (with
  // 32 MiB pages: a 224 MiB pool), so the pool is whole pages everywhere.
  // nobody's share is 1 MiB: too little to stream anything in.
  const uint64_t hp = std::max<uint64_t>(8 * kMiB, huge_page_size());
  const uint64_t pool = 7 * hp;
  if (!start(pool / kMiB, "[models]\nmax_pool_bytes_per_uid = \"1M\"\n")) return;
  auto roots = model("root.gguf", "roots", 2 * hp, 0644, 5);
  const std::string root_obj = load(roots);
  ASSERT_TRUE(wait_until(
      [&] { return model_in(dbus_->status(), root_obj).value("state", "") == "resident"; }, 20000ms));
  auto huge = model("huge.gguf", "huge", 12 * hp, 0644, 6);
  ASSERT_GT(huge.size(), pool);
  auto r = as_user(kNobody, [&] {
    (void)load_model(*connect(), huge.path);
    return std::string("loaded");
  });
  EXPECT_EQ(r.rfind("org.aios.Airs1.Error.QuotaExceeded", 0), 0u) << r;
  EXPECT_EQ(model_in(dbus_->status(), root_obj).value("state", ""), "resident")
      << "nobody evicted root's model for a load that could never fit";
  // A load that fits only without the idle model: it is evicted for it (and
  // the evicted model leaves the table).
  auto fits = model("fits.gguf", "fits", 6 * hp, 0644, 7);
  ASSERT_GT(round_up_pages(fits.size()), pool - round_up_pages(roots.size())) << fits.size() << " " << roots.size();
  ASSERT_LE(round_up_pages(fits.size()), pool);
  const std::string fits_obj = load(fits);
  auto st = dbus_->status();
  EXPECT_TRUE(model_in(st, root_obj).is_null()) << st.dump(1);
  EXPECT_FALSE(model_in(st, fits_obj).is_null()) << st.dump(1);
}

// ---- 4. a forced unload never gives zeros ----

class ForcedUnload : public Hostile2, public ::testing::WithParamInterface<std::string> {};

// Every kind of holder: root's lazy client (full, small-pages), a
// cooperative client, and nobody's plain read-only mapping (resident path).
// After `unload --force`, reading the same pointer again is SIGBUS.
TEST_P(ForcedUnload, EveryHolderGetsSigbusNeverZeros) {
  const std::string kind = GetParam();
  const std::string mode = kind == "plain" ? "full" : kind;
  if (!start(64, "[models]\nmode = \"" + mode + "\"\n")) return;
  auto m = model("m.gguf", "victim", 16 * kMiB);
  std::vector<std::string> args = {"--order", "seq", "--hold", "--recheck"};
  if (kind == "plain") args.insert(args.end(), {"--uid", std::to_string(kNobody)});
  Child c(client(m, args));
  auto o = c.expect_line("opened", 30s);
  ASSERT_TRUE(o) << c.transcript();
  ASSERT_TRUE(c.expect_line("holding", 30s)) << c.transcript();
  const std::string obj = field(*o, "object");
  auto e = dbus_->unload(obj, false);
  EXPECT_EQ(e.name, "org.aios.Airs1.Error.Busy") << "a held model was unloaded without force";
  e = dbus_->unload(obj, true);
  ASSERT_TRUE(e.ok()) << e.name << ": " << e.message;
  EXPECT_TRUE(model_in(dbus_->status(), obj).is_null()) << "an unloaded model stays listed";
  c.send("go");
  auto s = c.expect_line("sigbus", 30s);
  EXPECT_TRUE(s) << "the holder read its revoked mapping without SIGBUS\n" << c.transcript();
  EXPECT_EQ(c.transcript().find("mismatch"), std::string::npos) << "the holder read wrong bytes:\n" << c.transcript();
  EXPECT_EQ(c.wait().exit_code, 7) << c.transcript();
  // The pool has every page back, and the daemon serves on.
  auto st = dbus_->status();
  EXPECT_EQ(st["pool"]["model_bytes"].get<uint64_t>(), 0u) << st["pool"].dump();
}

// A clean daemon exit (SIGTERM: an upgrade, a restart) is not an unload:
// every holder keeps its mapping, byte for byte, until it unmaps.
TEST_P(ForcedUnload, ACleanDaemonExitLeavesEveryHolderItsBytes) {
  const std::string kind = GetParam();
  const std::string mode = kind == "plain" ? "full" : kind;
  if (!start(64, "[models]\nmode = \"" + mode + "\"\n")) return;
  auto m = model("m.gguf", "kept", 16 * kMiB);
  std::vector<std::string> args = {"--order", "seq", "--hold", "--recheck"};
  if (kind == "plain") args.insert(args.end(), {"--uid", std::to_string(kNobody)});
  Child c(client(m, args));
  ASSERT_TRUE(c.expect_line("opened", 30s)) << c.transcript();
  ASSERT_TRUE(c.expect_line("holding", 30s)) << c.transcript();
  EXPECT_EQ(daemon_->stop(), 0) << daemon_->log();
  c.send("go");
  EXPECT_TRUE(c.expect_line("reverified", 30s)) << "a holder lost its bytes when the daemon exited\n" << c.transcript();
  EXPECT_EQ(c.transcript().find("mismatch"), std::string::npos) << c.transcript();
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
  daemon_.reset();
}

INSTANTIATE_TEST_SUITE_P(Holders, ForcedUnload, ::testing::Values("full", "small-pages", "cooperative", "plain"),
                         mode_name);

// ---- 5. fds, options and names ----

TEST_F(Hostile2, OpenReleaseCyclesHitTheFdQuotaWhileTheFdsAreKept) {
  if (!start(64, "[kv]\nmax_fds_per_uid = 8\n")) return;
  auto m = model("m.gguf", "fds", 16 * kMiB);
  const std::string obj = load(m);
  ASSERT_TRUE(wait_until([&] { return model_in(dbus_->status(), obj).value("state", "") == "resident"; },
                                     20000ms));
  auto r = as_user(kNobody, [&] {
    auto c = connect();
    auto p = sdbus::createProxy(*c, "org.aios.Airs1", obj);
    std::vector<sdbus::UnixFd> kept;
    std::string out;
    for (int i = 0; i < 6; ++i) {
      try {
        auto o = open_model(*c, obj, m.path);
        p->callMethod("Release").onInterface(kModelIf);
        kept.push_back(o.region);  // a dup each: the client keeps what it was given
        kept.push_back(o.status);
        out += "ok ";
      } catch (const sdbus::Error& e) {
        out += e.getName() + " ";
      }
    }
    // Closing them gives the quota back.
    kept.clear();
    try {
      (void)open_model(*c, obj, m.path);
      out += "reopened";
    } catch (const sdbus::Error& e) {
      out += "after-close " + e.getName();
    }
    return out;
  });
  const std::string q = "org.aios.Airs1.Error.QuotaExceeded";
  EXPECT_EQ(r, "ok ok ok ok " + q + " " + q + " reopened");
}

TEST_F(Hostile2, HostileOptionsAndNamesAreRefusedNamingTheKey) {
  if (!start(64)) return;
  auto m = model("m.gguf", "opts", 16 * kMiB);
  auto conn = sdbus::createSessionBusConnectionWithAddress(bus_->address());
  auto proxy = sdbus::createProxy(*conn, "org.aios.Airs1", "/org/aios/Airs1");
  auto try_load = [&](Dict opts) -> std::string {
    try {
      sdbus::ObjectPath path;
      proxy->callMethod("LoadModel").onInterface(kManagerIf)
          .withArguments(sdbus::UnixFd(::open(m.path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd), opts)
          .storeResultsTo(path);
      return "ok";
    } catch (const sdbus::Error& e) {
      return e.getName() + ": " + e.getMessage();
    }
  };
  const std::string inval = "org.aios.Airs1.Error.InvalidArgument";
  auto r = try_load({{"name", sdbus::Variant(uint32_t{7})}});
  EXPECT_EQ(r.rfind(inval, 0), 0u) << r;
  EXPECT_NE(r.find("option 'name' must be of type s, got u"), std::string::npos) << r;
  r = try_load({{"lazy", sdbus::Variant(std::string("yes"))}});
  EXPECT_NE(r.find("unknown option 'lazy'"), std::string::npos) << r;
  r = try_load({{"name", sdbus::Variant(std::string("evil\n\x1b[31mred"))}});
  EXPECT_EQ(r.rfind(inval, 0), 0u) << r;
  EXPECT_EQ(r.find('\x1b'), std::string::npos) << "the error echoed the escape code";
  // A pipe and a closed or O_PATH fd are InvalidArgument, never Failed.
  int pp[2];
  ASSERT_EQ(::pipe2(pp, O_CLOEXEC), 0);
  try {
    sdbus::ObjectPath path;
    proxy->callMethod("LoadModel").onInterface(kManagerIf).withArguments(sdbus::UnixFd(pp[0]), Dict{}).storeResultsTo(path);
    ADD_FAILURE() << "a pipe was loaded";
  } catch (const sdbus::Error& e) {
    EXPECT_EQ(e.getName(), inval) << e.getMessage();
  }
  ::close(pp[0]);
  ::close(pp[1]);
  // A name from the file with escape codes is made printable: airsctl shows no escape.
  auto evil = make_model(dir_, "evil.gguf", "bad\x1b[2Jname\n", 4 * kMiB, 2, 11);
  EXPECT_EQ(try_load({}), "ok");
  std::string obj;
  ASSERT_TRUE(dbus_->load_model(evil.path, &obj).ok());
  auto out = run_process({airsctl_path(), "--bus", bus_->address(), "status"});
  EXPECT_EQ(out.out.find('\x1b'), std::string::npos) << "airsctl printed a raw escape code";
  const std::string name = model_in(dbus_->status(), obj).value("name", "");
  EXPECT_EQ(name.find('\x1b'), std::string::npos) << name;
  EXPECT_EQ(name.find('\n'), std::string::npos) << name;
}

}  // namespace

// ---- 6. the bytes served are the file's, whatever its owner does to it ----

// The owner loads its file, then changes it through a shared mapping: on
// tmpfs neither mtime nor ctime moves, so stat says "the same file". Root
// asking for the file must get the file's bytes: a copy of its own, never
// the owner's, which it may not open either.
TEST_F(Hostile2, AFileItsOwnerCanChangeIsNeverServedStaleToAnotherUid) {
  if (!start(64)) return;
  auto src = model("owned.gguf", "owned", 8 * kMiB);
  const std::string path = "/dev/shm/airs-owned-" + std::to_string(::getpid()) + ".gguf";
  struct Unlink {
    std::string p;
    ~Unlink() { ::unlink(p.c_str()); }
  } unlink_at_end{path};
  {
    std::ifstream in(src.path, std::ios::binary);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
  }
  ASSERT_EQ(::chown(path.c_str(), kNobody, kNobody), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  const std::string theirs = as_user(kNobody, [&] { return load_model(*connect(), path); });
  ASSERT_EQ(theirs.rfind("/org/aios/Airs1/", 0), 0u) << theirs;
  ASSERT_TRUE(wait_until([&] { return model_in(dbus_->status(), theirs).value("state", "") == "resident"; }, 20000ms));

  // The owner changes the file's last page through a shared mapping. A
  // write that faults stamps the file's times (the kernel's
  // file_update_time for a file system without page_mkwrite, as tmpfs);
  // one through a page already mapped writable and dirty does not. So the
  // pages are first written with their own bytes (that fault may stamp),
  // then the times are taken, then the bytes change: no fault, no stamp.
  struct stat before {};
  struct stat after {};
  const std::string wrote = as_user(kNobody, [&] {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) return std::string("open: ") + std::strerror(errno);
    const auto size = static_cast<size_t>(st.st_size);
    void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return std::string("mmap: ") + std::strerror(errno);
    auto* b = static_cast<volatile unsigned char*>(m);
    for (size_t i = size - 4096; i < size; ++i) b[i] = b[i];
    if (::fstat(fd, &before) != 0) return std::string("fstat: ") + std::strerror(errno);
    for (size_t i = size - 4096; i < size; ++i) b[i] = static_cast<unsigned char>(b[i] ^ 0x5a);
    if (::fstat(fd, &after) != 0) return std::string("fstat: ") + std::strerror(errno);
    ::munmap(m, size);
    ::close(fd);
    return fmt::format("written {} {} {} {}", before.st_ctim.tv_sec, before.st_ctim.tv_nsec, after.st_ctim.tv_sec,
                       after.st_ctim.tv_nsec);
  });
  ASSERT_EQ(wrote.rfind("written ", 0), 0u) << wrote;
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  {
    std::istringstream in(wrote.substr(8));
    int64_t b_sec = 0, b_nsec = 0, a_sec = 0, a_nsec = 0;
    in >> b_sec >> b_nsec >> a_sec >> a_nsec;
    EXPECT_EQ(a_sec * 1'000'000'000 + a_nsec, b_sec * 1'000'000'000 + b_nsec)
        << "the premise: a write through a mapped, dirty page of tmpfs moves no time";
    EXPECT_EQ(after.st_ctim.tv_sec * 1'000'000'000 + after.st_ctim.tv_nsec, a_sec * 1'000'000'000 + a_nsec)
        << "the file's times moved after its owner's write";
  }

  const std::string mine = load_model(*connect(), path);
  EXPECT_NE(mine, theirs) << "root was handed the owner's copy of a file the owner can change";
  auto opened = [&](const std::string& obj) -> std::string {
    try {
      (void)open_model(*connect(), obj, path);
      return "opened";
    } catch (const sdbus::Error& e) {
      return e.getName() + ": " + e.getMessage();
    }
  };
  const std::string r = opened(theirs);
  EXPECT_EQ(r.rfind("org.freedesktop.DBus.Error.AccessDenied", 0), 0u) << r;
  EXPECT_NE(r.find("can change its file in place"), std::string::npos) << r;

  ASSERT_TRUE(wait_until([&] { return model_in(dbus_->status(), mine).value("state", "") == "resident"; }, 20000ms));
  Opened o = open_model(*connect(), mine, path);
  const auto size = static_cast<size_t>(after.st_size);
  ASSERT_GE(o.size, size);
  void* region = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, o.region.get(), 0);
  ASSERT_NE(region, MAP_FAILED);
  std::string file(size, '\0');
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(::pread(fd, file.data(), size, 0), static_cast<ssize_t>(size));
  ::close(fd);
  EXPECT_EQ(std::memcmp(region, file.data(), size), 0) << "root's copy is not the file's bytes";
  ::munmap(region, size);
}
