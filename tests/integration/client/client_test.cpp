// SPDX-License-Identifier: Apache-2.0
// End to end: models through the real airs-memd, a private D-Bus and
// the real kernel (hugetlbfs, userfaultfd, io_uring), used by real client
// processes (airs_test_client, linking libairs) that compare every tensor
// they read with the GGUF file. Loads are slowed with a blkio throttle on the
// daemon (its O_DIRECT reads) where a test needs to act mid-load.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "daemon_fixture.hpp"
#include "gguf/writer.hpp"
#include "harness.hpp"
#include "sys/fd.hpp"
#include "util/sanitizers.hpp"

using namespace airs::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
// How long a test waits for the references of clients that exited to go:
// only the end of a test that would otherwise wait for ever. A reference
// goes when the daemon hears that the client's connection closed, which is
// milliseconds, unless the host starves a TCG guest for seconds (it runs at
// nice 19 beside the TSan tests): slow, not wrong, so never a clock check.
constexpr auto kRefsGone = std::chrono::seconds(20);

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

// A model file copied to a tmpfs (/dev/shm): the daemon's reads of it come
// from memory, which a blkio throttle on the disk does not slow.
struct TmpfsModel {
  explicit TmpfsModel(ModelFile disk) : m(std::move(disk)) {
    const std::string to = "/dev/shm/airs-ctest-" + std::to_string(::getpid()) + "-" + m.plan.spec.name + ".gguf";
    std::error_code ec;
    std::filesystem::copy_file(m.path, to, std::filesystem::copy_options::overwrite_existing, ec);
    if (!ec) m.path = to;
    ok = !ec;
  }
  ~TmpfsModel() {
    if (ok) ::unlink(m.path.c_str());
  }
  ModelFile m;
  bool ok = false;
};

// A file's pages locked in the page cache while it lives: mapped and
// mlocked with the system call itself (sanitizer runtimes make mlock(3) a
// no-op).
struct LockedInCache {
  explicit LockedInCache(const std::string& path) {
    airs::sys::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) {
      why = path + ": " + std::strerror(errno);
      return;
    }
    len = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
      why = std::string("mmap: ") + std::strerror(errno);
      return;
    }
    addr = p;
    if (::syscall(SYS_mlock, addr, len) != 0) why = std::string("mlock: ") + std::strerror(errno);
  }
  ~LockedInCache() {
    if (addr != nullptr) ::munmap(addr, len);
  }
  LockedInCache(const LockedInCache&) = delete;
  LockedInCache& operator=(const LockedInCache&) = delete;
  [[nodiscard]] bool ok() const { return addr != nullptr && why.empty(); }
  void* addr = nullptr;
  size_t len = 0;
  std::string why;
};

class ClientIntegration : public ::testing::Test {
 protected:
  // Starts a private bus and airs-memd with a pool of pool_mib MiB. With
  // throttle_bps > 0 the daemon's block reads are limited to that rate.
  // Returns false when the test was skipped (reason logged).
  bool start(uint64_t pool_mib, const std::string& extra_toml = "", uint64_t throttle_bps = 0) {
    if (auto why = hugepages_missing(pool_mib * kMiB)) {
      ADD_FAILURE() << "huge pages missing: " << *why;
      return false;
    }
    if (throttle_bps > 0) {
      throttle_ = std::make_unique<BlkioThrottle>(dir_.path(), throttle_bps);
      if (!throttle_->available()) {
        skip("cannot slow the daemon's reads: " + throttle_->why());
        return false;
      }
    }
    // Under a throttle the daemon's own files are on a tmpfs: only its
    // model reads go through the slowed disk.
    std::string files_in = "/tmp";
    if (throttle_) {
      files_in = "/dev/shm";
      if (::access(files_in.c_str(), W_OK) != 0) {
        skip("no tmpfs at /dev/shm for the daemon's log and state beside the throttled disk");
        return false;
      }
    }
    bus_ = std::make_unique<PrivateBus>();
    const std::string toml = "[pool]\nsize = \"" + std::to_string(pool_mib) + "M\"\ngrow_nr_hugepages = false\n" + extra_toml;
    daemon_ = std::make_unique<DaemonProcess>(bus_->address(), toml, std::vector<std::string>{},
                                              "serving org.aios.Airs1", files_in);
    if (!daemon_->started()) {
      ADD_FAILURE() << "airs-memd did not start:\n" << daemon_->log();
      return false;
    }
    if (throttle_ && !throttle_->add(daemon_->pid())) {
      ADD_FAILURE() << "cannot move airs-memd into the blkio group";
      return false;
    }
    dbus_ = std::make_unique<BusClient>(bus_->address());
    return true;
  }

  std::vector<std::string> client(const ModelFile& m, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {test_client_path(), "--bus", bus_->address(), "--file", m.path};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  nlohmann::json model_status(const std::string& object) { return model_in(dbus_->status(), object); }

  // The model's object path (LoadModel is idempotent per file).
  std::string load(const ModelFile& m) {
    std::string obj;
    auto e = dbus_->load_model(m.path, &obj);
    EXPECT_TRUE(e.ok()) << e.name << ": " << e.message << "\n" << daemon_->log();
    return obj;
  }

  // With a throttle the test relies on O_DIRECT reads (buffered reads of a
  // cached file are not slowed).
  bool require_direct_io(const std::string& object) {
    auto ms = model_status(object);
    if (!ms.is_null() && ms.value("direct_io", false)) return true;
    skip("the daemon reads this file system buffered: the blkio throttle cannot slow the load");
    return false;
  }

  // Records a loud skip; the caller returns.
  void skip(const std::string& why) { GTEST_SKIP() << why; }

  uint32_t tensors(const ModelFile& m) const { return static_cast<uint32_t>(m.plan.tensors.size()); }

  void expect_verified(Child& c, const ModelFile& m, const std::string& fallback = "0",
                       std::chrono::milliseconds timeout = 30s) {
    auto v = c.expect_line("verified", timeout);
    ASSERT_TRUE(v) << c.transcript();
    EXPECT_EQ(field_u64(*v, "tensors"), tensors(m)) << *v;
    EXPECT_EQ(field(*v, "fallback"), fallback) << *v;
  }

  void TearDown() override {
    // A clean exit: no sanitizer report, no crash at shutdown.
    dbus_.reset();
    if (daemon_ && daemon_->pid() > 0) {
      const int rc = daemon_->stop();
      EXPECT_EQ(rc, 0) << "airs-memd did not stop cleanly:\n" << daemon_->log();
    }
  }

  // The object a client opened ("" and a failure if it did not).
  std::string opened_object(Child& c) {
    auto o = c.expect_line("opened");
    EXPECT_TRUE(o) << c.transcript();
    return o ? field(*o, "object") : std::string();
  }

  void with_a_held_drain(const std::string& drain_wait,
                         const std::function<void(const ModelFile&)>& during);

  // Makes `warm` resident and unloads it (every daemon path below runs once
  // unthrottled), then loads `held` with its reads held in the device
  // (4 KiB/s, hold_reads) and unloads it: its pages are on their way back to
  // the pool until the test lifts the throttle. `paced` (a daemon with a
  // crawling warm-up): clients' faults read both models, `held` through one
  // killed while it waits for its fault. *free_held: the pool's free bytes
  // meanwhile. False when the test was skipped or failed.
  bool hold_a_drain(const ModelFile& warm, const ModelFile& held, bool paced, uint64_t* free_held) {
    std::string w;
    if (paced) {
      Child c(client(warm, {"--order", "seq"}));
      w = opened_object(c);
      if (w.empty()) return false;
      expect_verified(c, warm);
      EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
      EXPECT_TRUE(wait_until([&] { return model_status(w).value("refcount", 99u) == 0; }, 30000ms));
    } else {
      w = load(warm);
    }
    EXPECT_TRUE(wait_until([&] { return model_status(w).value("state", std::string()) == "resident"; }, 30000ms));
    EXPECT_TRUE(dbus_->unload(w, false).ok());
    EXPECT_TRUE(wait_until([&] { return dbus_->status()["models"].empty(); }, 30000ms));
    if (::testing::Test::HasFailure()) return false;
    EXPECT_TRUE(hold_reads());
    std::string obj;
    if (paced) {
      Child c(client(held, {"--order", "seq"}));
      obj = opened_object(c);
      if (obj.empty() || !require_direct_io(obj)) return false;
      EXPECT_TRUE(wait_until([&] { return c.thread_waits_in("handle_userfault"); }, 30000ms)) << c.transcript();
      // The daemon took the fault (and with it issued the held read): a
      // client killed before the daemon read its fault leaves nothing in
      // flight, and nothing to drain.
      EXPECT_TRUE(wait_until([&] { return model_status(obj).value("faults_waited", uint64_t{0}) >= 1; }, 30000ms))
          << model_status(obj).dump();
      c.kill(SIGKILL);
      (void)c.wait();
      EXPECT_TRUE(wait_until([&] { return model_status(obj).value("refcount", 99u) == 0; }, 30000ms));
    } else {
      obj = load(held);
      if (!require_direct_io(obj)) return false;
    }
    EXPECT_NE(model_status(obj).value("state", std::string()), "resident") << "the held load finished";
    *free_held = dbus_->status()["pool"]["free_bytes"].get<uint64_t>();
    auto e = dbus_->unload(obj, false);
    EXPECT_TRUE(e.ok()) << e.name << ": " << e.message;
    auto st = dbus_->status();
    EXPECT_TRUE(st["models"].empty()) << st.dump(1);
    EXPECT_EQ(st["pool"]["free_bytes"].get<uint64_t>(), *free_held)
        << "the held reads landed: nothing drains\n" << daemon_->log();
    return !::testing::Test::HasFailure();
  }

  // Holds the daemon's reads in the disk (4 KiB/s) until set_rate(0).
  // What the daemon reads through the page cache meanwhile (a GGUF header)
  // must not go to the disk behind the held reads, and a reclaimer may drop
  // any clean page at any moment (a DAMON pageout scheme takes a page read a
  // second ago if its region is cold): every file in dir_ is locked in the
  // page cache first. Its code the daemon locks itself.
  [[nodiscard]] bool hold_reads() {
    for (const auto& f : std::filesystem::directory_iterator(dir_.path())) {
      if (!f.is_regular_file() || f.file_size() == 0) continue;
      auto m = std::make_unique<LockedInCache>(f.path().string());
      if (!m->ok()) {
        ADD_FAILURE() << "cannot lock " << f.path() << " in the page cache: " << m->why;
        return false;
      }
      cached_.push_back(std::move(m));
    }
    return throttle_->set_rate(4096);
  }

  // True once the daemon logged that a call waits for a drain.
  bool a_call_waits() { return daemon_->log().find("waits for the reads in flight") != std::string::npos; }

  TempDir dir_;
  std::vector<std::unique_ptr<LockedInCache>> cached_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<BlkioThrottle> throttle_;  // outlives the daemon in it
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<BusClient> dbus_;
};

// ---- 1. in order, random order, 2 and 4 concurrent processes ----

// Ordered on events, not on a race between the client's start and the
// load: the warm-up crawls (4 KiB/s) and nothing is read ahead of a fault,
// so the model is resident only once the client has faulted every unit in,
// however slowly the client starts (TCG).
// The warm-up's first read goes at once (its bucket starts empty, not in
// debt) and leaves it in debt for hours, so only a model of two units or more
// is still loading until its client faults: fault_driven_size() gives one.
constexpr const char* kFaultDrivenOnly = "[models]\nwarmup_rate = \"4K\"\nprefetch_window = 0\n";
uint64_t fault_driven_size(uint64_t at_least) { return std::max(at_least, 2 * huge_page_size()); }
// A pool for one such model.
uint64_t pool_mib_for(uint64_t size) { return std::max<uint64_t>(64, round_up_pages(size) / kMiB); }

TEST_F(ClientIntegration, OneClientTouchesLayersInOrderDuringTheLoad) {
  auto m = make_model(dir_, "m.gguf", "inorder", fault_driven_size(24 * kMiB));
  if (!start(pool_mib_for(m.size()), kFaultDrivenOnly, 48 * kMiB)) return;
  Child c(client(m, {"--order", "seq"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  const std::string obj = field(*o, "object");
  if (!require_direct_io(obj)) return;
  EXPECT_EQ(field(*o, "resident"), "0") << "the throttled load finished before the client attached";
  expect_verified(c, m);
  auto e = c.wait();
  EXPECT_EQ(e.exit_code, 0) << c.transcript();
  auto ms = model_status(obj);
  EXPECT_GT(ms.value("faults_waited", 0u), 0u) << "no fault waited for a read: the fill was not lazy " << ms.dump();
  EXPECT_EQ(ms.value("units_failed", 1u), 0u);
}

TEST_F(ClientIntegration, OneClientInRandomOrder) {
  auto m = make_model(dir_, "m.gguf", "random", 24 * kMiB);
  if (!start(64, "", 48 * kMiB)) return;
  Child c(client(m, {"--order", "random:7"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  if (!require_direct_io(field(*o, "object"))) return;
  expect_verified(c, m);
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
}

class ConcurrentClients : public ClientIntegration, public ::testing::WithParamInterface<int> {};

TEST_P(ConcurrentClients, AllReadTheRightBytesAndShareOneCopy) {
  const int n = GetParam();
  auto m = make_model(dir_, "m.gguf", "shared", fault_driven_size(24 * kMiB));
  if (!start(pool_mib_for(m.size()), kFaultDrivenOnly, 32 * kMiB)) return;
  std::vector<std::unique_ptr<Child>> cs;
  for (int i = 0; i < n; ++i)
    cs.push_back(std::make_unique<Child>(
        client(m, {"--order", i % 2 == 0 ? "seq" : "random:" + std::to_string(i), "--hold"})));
  std::string obj;
  uint32_t lazy = 0;
  for (auto& c : cs) {
    auto o = c->expect_line("opened");
    ASSERT_TRUE(o) << c->transcript();
    obj = field(*o, "object");
    // Attached lazily (its own userfaultfd) or mapped a resident model plainly.
    lazy += field_u64(*o, "uffd_fds") > 0 ? 1u : 0u;
  }
  if (!require_direct_io(obj)) return;
  for (auto& c : cs) {
    expect_verified(*c, m);
    ASSERT_TRUE(c->expect_line("holding")) << c->transcript();
  }
  // airsctl's view while all of them hold the model: one model, n
  // references, one client mapping per lazy attach, its bytes once.
  auto st = airsctl_status(bus_->address());
  ASSERT_EQ(st["models"].size(), 1u) << st.dump(1);
  const auto& mm = st["models"][0];
  EXPECT_EQ(mm["refcount"].get<uint32_t>(), static_cast<uint32_t>(n)) << mm.dump();
  EXPECT_EQ(mm["clients"].get<uint32_t>(), lazy) << mm.dump();
  EXPECT_GT(lazy, 0u) << "every client found the model resident: the load was not slowed";
  EXPECT_EQ(st["pool"]["model_bytes"].get<uint64_t>(), round_up_pages(m.size())) << st["pool"].dump();
  EXPECT_EQ(mm["resident_bytes"].get<uint64_t>(), round_up_pages(m.size()));
  EXPECT_GT(mm["faults_waited"].get<uint64_t>(), 0u);
  for (auto& c : cs) c->send("go");
  for (auto& c : cs) EXPECT_EQ(c->wait().exit_code, 0) << c->transcript();
  auto dropped = wait_until([&] { return model_status(obj).value("refcount", 99u) == 0; }, kRefsGone);
  EXPECT_TRUE(dropped) << model_status(obj).dump();
  EXPECT_EQ(model_status(obj).value("clients", 99u), 0u);
}

INSTANTIATE_TEST_SUITE_P(, ConcurrentClients, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param) + "Processes"; });

// ---- 2. attach halfway through warm-up ----

// The warm-up is paced (warmup_rate 4 MiB/s: 16 s for the model, faults are
// not paced) so the rest of it outlasts a client's start by an order of
// magnitude even where processes start slowly (TCG); the throttle alone
// finished it in 1 s, which a slowed client's start could miss. Pinned: for
// those seconds no client maps it, and memory pressure on the machine
// (PSI full) would evict it as unused (seen under TSan on a busy host).
TEST_F(ClientIntegration, ClientAttachesHalfwayThroughWarmup) {
  auto m = make_model(dir_, "big.gguf", "big", 64 * kMiB, 16);
  if (!start(96, "[models]\nqueue_depth = 1\nwarmup_rate = \"4M\"\npinned = [\"big\"]\n", 64 * kMiB)) return;
  const std::string obj = load(m);  // starts the warm-up, nobody attached
  if (!require_direct_io(obj)) return;
  const uint64_t region = round_up_pages(m.size());
  auto quarter = wait_until([&] { return model_status(obj).value("resident_bytes", uint64_t{0}) >= region / 4; }, 60s);
  ASSERT_TRUE(quarter) << model_status(obj).dump();
  Child c(client(m, {"--order", "seq"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  const uint64_t at_attach = model_status(obj).value("resident_bytes", uint64_t{0});
  EXPECT_EQ(field(*o, "resident"), "0");
  EXPECT_LT(at_attach, region) << "the warm-up finished before the client attached";
  expect_verified(c, m);
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
  EXPECT_TRUE(wait_until([&] { return model_status(obj).value("state", "") == "resident"; }, 10s));
}

// ---- 3. kill -9 of a client mid-fault ----

// In order, not by timing: the two survivors open and wait (no reads yet),
// then the victim starts reading; the warm-up crawls (warmup_rate 1 MiB/s)
// so the victim's own faults are what fills, each a throttled read of a
// unit it waits in. However slowly the processes start (TCG), the victim
// faults before the model is resident. Pinned: no client maps it until the
// survivors have started, and memory pressure would evict it as unused.
TEST_F(ClientIntegration, KillDashNineOfAClientMidFault) {
  auto m = make_model(dir_, "m.gguf", "victim", 32 * kMiB);
  if (!start(64, "[models]\nqueue_depth = 1\nwarmup_rate = \"1M\"\npinned = [\"victim\"]\n", 16 * kMiB)) return;
  const std::string obj = load(m);
  if (!require_direct_io(obj)) return;
  const auto pool0 = dbus_->status()["pool"];

  Child a(client(m, {"--order", "seq", "--wait-go", "--hold"}));
  Child b(client(m, {"--order", "random:5", "--wait-go", "--hold"}));
  for (Child* c : {&a, &b}) ASSERT_TRUE(c->expect_line("waiting")) << c->transcript();
  Child victim(client(m, {"--order", "random:3"}));
  ASSERT_TRUE(victim.expect_line("opened")) << victim.transcript();
  ASSERT_TRUE(victim.expect_line("verifying")) << victim.transcript();
  EXPECT_EQ(model_status(obj).value("refcount", 0u), 3u);
  // Blocked in a fault on a page the daemon is still reading.
  auto in_fault = wait_until([&] { return victim.thread_waits_in("handle_userfault"); }, 30s);
  ASSERT_TRUE(in_fault) << "the victim never waited in a fault\n" << victim.transcript();
  const auto t_kill = std::chrono::steady_clock::now();
  victim.kill(SIGKILL);
  auto ve = victim.wait(5s);
  EXPECT_EQ(ve.signal, SIGKILL);
  // Dropped with the client, not with the load: the warm-up crawls at
  // 1 MiB/s and the survivors read nothing yet, so the model is still
  // loading when the reference goes. Ordered on that, not on a clock
  // (kRefsGone); the latency is printed.
  nlohmann::json at_drop;
  auto dropped = wait_until(
      [&] {
        at_drop = model_status(obj);
        return at_drop.value("refcount", 99u) == 2;
      },
      kRefsGone);
  const auto since_kill =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t_kill).count();
  EXPECT_TRUE(dropped) << "the dead client's reference was never dropped: " << at_drop.dump();
  EXPECT_EQ(at_drop.value("state", ""), "loading") << "the reference outlived the load: " << at_drop.dump();
  std::printf("[ info ] reference of the killed client dropped %lld ms after the kill\n",
              static_cast<long long>(since_kill));
  for (Child* c : {&a, &b}) c->send("go");
  for (Child* c : {&a, &b}) {
    expect_verified(*c, m);
    ASSERT_TRUE(c->expect_line("holding")) << c->transcript();
    c->send("go");
    EXPECT_EQ(c->wait().exit_code, 0) << c->transcript();
  }
  // The daemon keeps serving: a new client reads everything right.
  Child late(client(m, {"--order", "random:9"}));
  expect_verified(late, m);
  EXPECT_EQ(late.wait().exit_code, 0) << late.transcript();
  // Nothing leaked: no references, no mappings, no client uffd, pool as before.
  ASSERT_TRUE(wait_until([&] { return model_status(obj).value("refcount", 99u) == 0; }, kRefsGone));
  auto st = dbus_->status();
  EXPECT_EQ(model_in(st, obj).value("clients", 99u), 0u);
  EXPECT_EQ(st["pool"]["model_bytes"], pool0["model_bytes"]);
  EXPECT_EQ(st["pool"]["free_bytes"], pool0["free_bytes"]);
  EXPECT_EQ(st["pool"]["kv_bytes"], pool0["kv_bytes"]);
  EXPECT_EQ(daemon_uffd_fds(daemon_->pid()), 0) << "the daemon still holds client userfaultfds";
}

// ---- 4. kill -9 of the daemon mid-load ----

// Both userfaultfd modes: the library's fallback server answers the faults.
class DaemonDeath : public ClientIntegration, public ::testing::WithParamInterface<std::string> {};

// In order, not by timing: the idle client opens (the load starts, its
// warm-up crawling at warmup_rate 1 MiB/s), then the faulting one starts
// and the daemon is killed while it waits in a throttled fault. Four units
// at least, so one unit is never half the model (32 MiB pages on 16 KiB).
TEST_P(DaemonDeath, KillDashNineOfTheDaemonMidLoad) {
  const uint64_t size = std::max<uint64_t>(32 * kMiB, 4 * huge_page_size());
  auto m = make_model(dir_, "m.gguf", "orphan", size);
  if (!start(std::max<uint64_t>(64, 2 * round_up_pages(size) / kMiB),
             "[models]\nqueue_depth = 1\nwarmup_rate = \"1M\"\nmode = \"" + GetParam() + "\"\n", 8 * kMiB))
    return;
  Child idle(client(m, {"--order", "random:11", "--wait-go"}));
  auto o = idle.expect_line("opened");
  ASSERT_TRUE(o) << idle.transcript();
  if (!require_direct_io(field(*o, "object"))) return;
  ASSERT_TRUE(idle.expect_line("waiting")) << idle.transcript();
  Child faulting(client(m, {"--order", "seq"}));
  ASSERT_TRUE(faulting.expect_line("opened")) << faulting.transcript();
  ASSERT_TRUE(wait_until([&] { return faulting.thread_waits_in("handle_userfault"); }, 30s))
      << faulting.transcript();
  const uint64_t resident = model_status(field(*o, "object")).value("resident_bytes", uint64_t{0});
  EXPECT_LT(resident, round_up_pages(m.size()) / 2) << "most of the model was loaded before the kill";
  const auto t0 = std::chrono::steady_clock::now();
  daemon_->kill_hard();
  idle.send("go");
  // No hang: both finish on their own fallback, and the bytes are the file's.
  expect_verified(faulting, m, "1");
  expect_verified(idle, m, "1");
  EXPECT_EQ(faulting.wait(10s).exit_code, 0) << faulting.transcript();
  EXPECT_EQ(idle.wait(10s).exit_code, 0) << idle.transcript();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  std::printf("[ info ] both clients done %lld ms after the daemon died\n", static_cast<long long>(took.count()));
  EXPECT_NE(faulting.err().find("serving the remaining pages"), std::string::npos) << faulting.err();
}

INSTANTIATE_TEST_SUITE_P(LazyModes, DaemonDeath, ::testing::Values("full", "small-pages"), [](const auto& p) {
  return std::string(p.param == "full" ? "Full" : "SmallPages");
});

// Cooperative mode (no userfaultfd): the daemon dies while the paced fill
// is a quarter done. A client waiting per tensor and one blocked in open
// (waiting for residency) both swap the GGUF file in and read its bytes.
// The fill is paced at 1 MiB/s (32 s for 32 MiB; waits do not pull it), so
// the second client opens long before half of it, however slowly it starts
// (TCG). Four units at least, so one unit is never half the model.
TEST_F(ClientIntegration, CooperativeClientsOutliveTheDaemonMidLoad) {
  const uint64_t size = std::max<uint64_t>(32 * kMiB, 4 * huge_page_size());
  auto m = make_model(dir_, "m.gguf", "orphan-coop", size);
  if (!start(std::max<uint64_t>(64, 2 * round_up_pages(size) / kMiB),
             "[models]\nmode = \"cooperative\"\nwarmup_rate = \"1M\"\n"))
    return;
  Child per_layer(client(m, {"--per-layer", "--order", "seq"}));
  auto o = per_layer.expect_line("opened");
  ASSERT_TRUE(o) << per_layer.transcript();
  EXPECT_EQ(field(*o, "resident"), "0") << *o;
  Child blocked(client(m, {"--order", "random:5"}));
  const std::string object = field(*o, "object");
  // Both opened (the second is now waiting for residency inside open).
  ASSERT_TRUE(wait_until([&] { return model_status(object).value("refcount", 0U) >= 2; }, 60s))
      << model_status(object).dump();
  EXPECT_EQ(dbus_->status().value("mode", std::string()), "cooperative");
  const auto ms = model_status(object);
  EXPECT_LT(ms.value("resident_bytes", uint64_t{0}), round_up_pages(m.size()) / 2)
      << "most of the model was loaded before the kill";
  daemon_->kill_hard();
  expect_verified(per_layer, m, "1");
  expect_verified(blocked, m, "1");
  EXPECT_EQ(per_layer.wait(10s).exit_code, 0) << per_layer.transcript();
  EXPECT_EQ(blocked.wait(10s).exit_code, 0) << blocked.transcript();
  for (Child* c : {&per_layer, &blocked})
    EXPECT_NE(c->err().find("from the GGUF file in this process"), std::string::npos) << c->err();
}

// Cooperative mode, wait_on_touch: open returns at once with the
// fill barely started; the client reads every tensor with no wait of its own
// (each touch of a unit not filled yet waits in libairs' SIGSEGV handler) and
// gets the file's bytes. A "runtime" SIGSEGV handler installed before the
// open never sees the model's touches and still gets its own fault; one
// installed after (chaining, as airs.h asks) works too. The touches asked
// the daemon for their units (request pipe: counted as faults), and the
// second client shares the one copy.
TEST_F(ClientIntegration, CooperativeTouchWaitsForEachUnitAndKeepsOtherHandlers) {
  auto m = make_model(dir_, "m.gguf", "touchy", 32 * kMiB);
  // Paced far below what the readers ask for: the touches drive the fill.
  if (!start(64, "[models]\nmode = \"cooperative\"\nwarmup_rate = \"1M\"\n")) return;
  Child before(client(m, {"--on-touch", "--order", "seq", "--own-segv", "before", "--hold"}));
  auto o = before.expect_line("opened");
  ASSERT_TRUE(o) << before.transcript();
  EXPECT_EQ(field(*o, "resident"), "0") << *o;
  Child after(client(m, {"--on-touch", "--order", "random:3", "--own-segv", "after", "--hold"}));
  expect_verified(before, m, "0", 60s);
  expect_verified(after, m, "0", 60s);
  auto ob = before.expect_line("own-segv");
  ASSERT_TRUE(ob) << before.transcript();
  EXPECT_EQ(field(*ob, "handled"), "1") << *ob;
  EXPECT_EQ(field(*ob, "foreign"), "0") << *ob;
  auto oa = after.expect_line("own-segv");
  ASSERT_TRUE(oa) << after.transcript();
  EXPECT_EQ(field(*oa, "handled"), "1") << *oa;
  const auto ms = model_status(field(*o, "object"));
  EXPECT_GT(ms.value("faults", uint64_t{0}), 0U) << ms.dump();
  EXPECT_EQ(ms.value("refcount", 0U), 2U) << ms.dump();
  EXPECT_LE(ms.value("resident_bytes", uint64_t{0}), round_up_pages(m.size())) << ms.dump();
  for (Child* c : {&before, &after}) {
    ASSERT_TRUE(c->expect_line("holding")) << c->transcript();
    c->send("go");
    EXPECT_EQ(c->wait(10s).exit_code, 0) << c->transcript();
  }
}

// The daemon dies mid-load under touch-waiting clients: the waiting touch
// maps the GGUF file in place and every byte is the file's.
TEST_F(ClientIntegration, CooperativeTouchOutlivesTheDaemonMidLoad) {
  auto m = make_model(dir_, "m.gguf", "touch-orphan", 32 * kMiB);
  if (!start(64, "[models]\nmode = \"cooperative\"\nwarmup_rate = \"4M\"\nqueue_depth = 1\nprefetch_window = 0\n")) return;
  Child c(client(m, {"--on-touch", "--wait-go", "--order", "seq"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  EXPECT_EQ(field(*o, "resident"), "0") << *o;
  ASSERT_TRUE(c.expect_line("waiting")) << c.transcript();
  EXPECT_LT(model_status(field(*o, "object")).value("resident_bytes", uint64_t{0}), round_up_pages(m.size()) / 2);
  daemon_->kill_hard();
  c.send("go");
  expect_verified(c, m, "1", 60s);
  EXPECT_EQ(c.wait(10s).exit_code, 0) << c.transcript();
  EXPECT_NE(c.err().find("from the GGUF file in this process"), std::string::npos) << c.err();
}

// A forked child inherits the guarded mapping and the handler: its touches
// wait for their units like its parent's (the lazy modes give it no mapping
// at all, MADV_DONTFORK; here there is nothing unsafe to hide).
TEST_F(ClientIntegration, CooperativeTouchServesAForkedChild) {
  auto m = make_model(dir_, "m.gguf", "touch-fork", 24 * kMiB);
  if (!start(64, "[models]\nmode = \"cooperative\"\nwarmup_rate = \"1M\"\n")) return;
  Child c(client(m, {"--on-touch", "--fork-child", "--order", "seq"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  EXPECT_EQ(field(*o, "resident"), "0") << *o;
  auto ch = c.expect_line("child");
  ASSERT_TRUE(ch) << c.transcript();
  EXPECT_EQ(*ch, "child-read-ok") << c.transcript();
  auto ce = c.expect_line("child exit");
  ASSERT_TRUE(ce);
  EXPECT_EQ(field(*ce, "exit"), "9") << *ce;
  expect_verified(c, m, "0", 60s);
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
}

// ---- 4b. a streamed model: the daemon killed mid-token, a forced unload mid-stream ----

// A model three times the pool, in 16 layers of three units: it streams, and
// every pass (a token) drops units and reads them again. The client reads
// every tensor three times and stops half-way through the second pass.
class StreamedClients : public ClientIntegration, public ::testing::WithParamInterface<std::string> {
 protected:
  bool start_streaming(ModelFile& m, const std::string& name) {
    const uint64_t unit = huge_page_size();
    m = make_model(dir_, name + ".gguf", name, 48 * unit, 16);
    return start(16 * unit / kMiB, "[models]\nmode = \"" + GetParam() + "\"\n");
  }

  // Half-way through pass 2, after units were dropped: returns the object.
  std::string reach_mid_token(Child& c, const ModelFile& m) {
    auto o = c.expect_line("opened");
    EXPECT_TRUE(o) << c.transcript();
    if (!o) return "";
    const std::string obj = field(*o, "object");
    expect_verified(c, m, "0", 120s);  // pass 1, through the daemon
    EXPECT_TRUE(c.expect_line("mid pass=2", 120s)) << c.transcript();
    const auto ms = model_status(obj);
    EXPECT_EQ(ms.value("streamed", false), true) << ms.dump();
    EXPECT_GT(ms.value("units_dropped", uint64_t{0}), 0U) << "nothing was dropped yet: nothing tested\n" << ms.dump();
    return obj;
  }

  // What the process's main thread sleeps in (its wchan).
  static std::string main_thread_wchan(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/wchan");
    std::string s;
    std::getline(f, s);
    return s;
  }
};

// The daemon stops answering (SIGSTOP) and the client goes on into the
// units that are not in the region; once its reading thread sleeps for one
// (a userfaultfd fault, or the touch guard's wait), the daemon is killed.
// The client maps the GGUF file in the region's place and every byte of the
// rest of its three passes is the file's.
TEST_P(StreamedClients, KillDashNineOfTheDaemonMidToken) {
  ModelFile m;
  if (!start_streaming(m, "orphan-stream")) return;
  Child c(client(m, {"--passes", "3", "--pause", "2"}));
  const std::string obj = reach_mid_token(c, m);
  ASSERT_FALSE(obj.empty());
  ASSERT_EQ(::kill(daemon_->pid(), SIGSTOP), 0);
  ASSERT_TRUE(c.send("go"));
  const bool lazy = GetParam() != "cooperative";
  std::string wchan;
  const bool waits = wait_until(
      [&] {
        wchan = main_thread_wchan(c.pid());
        return lazy ? wchan == "handle_userfault" : wchan.starts_with("futex");
      },
      60s).has_value();
  if (!waits) ::kill(daemon_->pid(), SIGCONT);
  ASSERT_TRUE(waits) << "the client never waited for a unit (last wchan " << wchan << ")\n" << c.transcript();
  daemon_->kill_hard();
  expect_verified(c, m, "1", 120s);  // pass 2, finished on the file
  expect_verified(c, m, "1", 120s);  // pass 3
  EXPECT_EQ(c.wait(30s).exit_code, 0) << c.transcript();
  EXPECT_NE(c.err().find("from the GGUF file in this process"), std::string::npos) << c.err();
}

// A forced unload half-way through a token: the client's next read of the
// model is SIGBUS (exit 7), never a wrong byte (exit 3); the pool gets every
// page back and the daemon goes on serving.
TEST_P(StreamedClients, AForcedUnloadMidStreamIsSigbusNeverZeros) {
  ModelFile m;
  if (!start_streaming(m, "unloaded-stream")) return;
  const auto pool0 = dbus_->status()["pool"];
  Child c(client(m, {"--passes", "3", "--pause", "2"}));
  const std::string obj = reach_mid_token(c, m);
  ASSERT_FALSE(obj.empty());
  auto e = dbus_->unload(obj, true);
  ASSERT_TRUE(e.ok()) << e.name << ": " << e.message;
  ASSERT_TRUE(c.send("go"));
  auto sb = c.expect_line("sigbus", 60s);
  EXPECT_TRUE(sb) << c.transcript();
  EXPECT_EQ(c.wait(30s).exit_code, 7) << c.transcript();
  ASSERT_TRUE(wait_until([&] { return dbus_->status()["models"].empty(); }, 30000ms)) << dbus_->status().dump(1);
  ASSERT_TRUE(wait_until([&] { return dbus_->status()["pool"]["free_bytes"] == pool0["free_bytes"]; }, 30000ms))
      << dbus_->status().dump(1);
  // The daemon streams the model again for a new client, byte-exact.
  Child late(client(m, {"--passes", "2"}));
  expect_verified(late, m, "0", 120s);
  expect_verified(late, m, "0", 120s);
  EXPECT_EQ(late.wait(30s).exit_code, 0) << late.transcript();
}

// A runtime that waits for each tensor's bytes before it reads them
// (airs_model_wait_range; cooperative mode) and reads them in any order, as
// a mixture of experts reads the experts its router chose: a wait for bytes
// far from where the client is, in units the read-ahead does not reach,
// with the budget full, is served (the wait asks for its units, as a touch
// does), never left to time out. In the other modes the same reads fault.
// A wait for the whole model to be resident, which it never is, is refused
// at once (-EFBIG), not left to its minute, and so is a wait for a layer of
// it in cooperative mode (no layer is kept, and nothing would read one
// nobody touches: the wait lasted its whole timeout); in the other modes
// a layer wait returns at once (faults do the waiting).
TEST_P(StreamedClients, WaitsForRangesInAnyOrderAreServed) {
  ModelFile m;
  if (!start_streaming(m, "scattered-stream")) return;
  Child c(client(m, {"--per-layer", "--order", "random:11", "--passes", "2", "--wait-resident", "60000",
                     "--wait-layer", "7"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  auto r = c.expect_line("resident rc", 120s);
  ASSERT_TRUE(r) << c.transcript();
  EXPECT_EQ(field(*r, "rc"), std::to_string(-EFBIG)) << *r;
  auto l = c.expect_line("layer rc", 120s);
  ASSERT_TRUE(l) << c.transcript();
  EXPECT_EQ(field(*l, "rc"), GetParam() == "cooperative" ? std::to_string(-EFBIG) : "0") << *l;
  expect_verified(c, m, "0", 120s);
  expect_verified(c, m, "0", 120s);
  EXPECT_EQ(c.wait(30s).exit_code, 0) << c.transcript();
}

// A streamed model's budget cut (by pressure, or here by an admin's Evict
// of the model while a client streams it) comes back once the machine has
// been quiet for grow_after: a cut is not for ever. The client streams
// through both, byte-exact.
TEST_P(StreamedClients, ACutBudgetComesBackWhenTheMachineIsQuiet) {
  const uint64_t unit = huge_page_size();
  auto m = make_model(dir_, "cut.gguf", "cut-stream", 48 * unit, 16);
  if (!start(16 * unit / kMiB, "[models]\nmode = \"" + GetParam() + "\"\n[pressure]\ngrow_after = \"1s\"\n")) return;
  Child c(client(m, {"--passes", "3", "--pause", "2"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  const std::string obj = field(*o, "object");
  expect_verified(c, m, "0", 120s);
  ASSERT_TRUE(c.expect_line("mid pass=2", 120s)) << c.transcript();
  const auto budget = [&] { return model_status(obj).value("budget_bytes", uint64_t{0}); };
  const uint64_t at_load = budget();
  ASSERT_GT(at_load, 0U) << model_status(obj).dump();
  auto e = dbus_->evict_model(obj);
  ASSERT_TRUE(e.ok()) << e.name << ": " << e.message;
  ASSERT_TRUE(c.send("go"));
  expect_verified(c, m, "0", 120s);  // pass 2, on the cut budget
  EXPECT_TRUE(wait_until([&] { return budget() == at_load; }, 30000ms))
      << "the budget stayed at " << budget() << " of " << at_load << "\n" << dbus_->status().dump(1);
  // The pages went (the pager's cut ended: in cooperative mode once the
  // client closed its units, which the status shows only then), then came
  // back.
  const std::string log = daemon_->log();
  const auto went = log.find("streaming budget cut to");
  const auto back = log.find("(no pressure: back toward");
  EXPECT_NE(went, std::string::npos) << log;
  EXPECT_NE(back, std::string::npos) << log;
  EXPECT_LT(went, back) << log;
  expect_verified(c, m, "0", 120s);  // pass 3
  EXPECT_EQ(c.wait(30s).exit_code, 0) << c.transcript();
}

INSTANTIATE_TEST_SUITE_P(StreamModes, StreamedClients, ::testing::Values("full", "small-pages", "cooperative"),
                         [](const auto& p) {
                           std::string n = p.param;
                           std::erase(n, '-');
                           return n;
                         });

// ---- 5. a forked child of a client ----

TEST_F(ClientIntegration, ForkedChildGetsSigsegvNeverZeros) {
  auto m = make_model(dir_, "m.gguf", "forky", fault_driven_size(24 * kMiB));
  // Fault-driven: the last page, which the child touches first, is still
  // missing at the fork however slowly the client starts.
  if (!start(pool_mib_for(m.size()), std::string(kFaultDrivenOnly) + "queue_depth = 1\n")) return;
  Child c(client(m, {"--fork-child", "--order", "seq"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  if (!require_direct_io(field(*o, "object"))) return;
  EXPECT_EQ(field(*o, "resident"), "0");
  auto ch = c.expect_line("child");
  ASSERT_TRUE(ch) << c.transcript();
  EXPECT_EQ(*ch, "child-segv") << c.transcript();
  auto ce = c.expect_line("child exit");
  ASSERT_TRUE(ce);
  EXPECT_EQ(field(*ce, "exit"), "9") << *ce;
  // The child's touch put no zero page into the shared page cache.
  expect_verified(c, m);
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
}

// Built without sanitizers only: a sanitizer build's client cannot
// mlockall(MCL_CURRENT) (its shadow memory is terabytes of reserved address
// space), so there it could only skip; the plain build runs it.
#if !defined(AIRS_ASAN) && !defined(AIRS_TSAN)
// Huge-page bytes process `pid` maps (smaps_rollup), in KiB.
uint64_t hugetlb_kb(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/smaps_rollup");
  uint64_t kb = 0;
  for (std::string l; std::getline(f, l);)
    if (l.rfind("Shared_Hugetlb:", 0) == 0 || l.rfind("Private_Hugetlb:", 0) == 0)
      kb += std::stoull(l.substr(l.find(':') + 1));
  return kb;
}

// mlockall(MCL_CURRENT | MCL_FUTURE) before opening: locking faults a
// mapping in at mmap, so a lazy one would hold zero pages before the daemon
// filled them. The locked client gets the read-only path instead; its lock
// does fault every page of the region in before the fill (seen in its
// smaps), and still: it reads the file's bytes, and so does a lazy client
// that was waiting to read while that happened, and one after.
TEST_F(ClientIntegration, MlockallFutureClientReadsTheFileNeverZeros) {
  // Three huge pages at least, loaded by faults only: the model stays
  // loading until the lazy client is told to read, however slowly the
  // clients start (the locked one faults nothing through the daemon).
  const uint64_t size = std::max<uint64_t>(12 * kMiB, 3 * huge_page_size());
  auto m = make_model(dir_, "m.gguf", "locked", size);
  if (!start(std::max<uint64_t>(64, 2 * round_up_pages(size) / kMiB),
             std::string(kFaultDrivenOnly) + "[pressure]\nresize_pool = false\n"))
    return;
  const std::string obj = load(m);
  ASSERT_EQ(model_status(obj).value("state", ""), "loading") << model_status(obj).dump();
  if (dbus_->status().value("mode", "") != "full") GTEST_SKIP() << "the region is not on huge pages here";
  Child lazy(client(m, {"--wait-go", "--order", "seq"}));
  ASSERT_TRUE(lazy.expect_line("waiting", 60s)) << lazy.transcript();
  Child locked(client(m, {"--mlockall", "--order", "seq"}));
  ASSERT_TRUE(wait_until([&] { return hugetlb_kb(locked.pid()) * 1024 >= round_up_pages(size); }, 60000ms))
      << "the locked client never faulted the region in: " << hugetlb_kb(locked.pid()) << " KiB\n"
      << locked.transcript();
  ASSERT_EQ(model_status(obj).value("state", ""), "loading") << "the premise: the lock ran before the fill ended";
  lazy.send("go");
  expect_verified(lazy, m, "0", 60s);
  EXPECT_EQ(lazy.wait().exit_code, 0) << lazy.transcript();
  auto o = locked.expect_line("opened", 60s);
  ASSERT_TRUE(o) << locked.transcript();
  expect_verified(locked, m, "0", 60s);
  EXPECT_EQ(locked.wait().exit_code, 0) << locked.transcript();
  Child after(client(m, {"--order", "random:5"}));
  expect_verified(after, m);
  EXPECT_EQ(after.wait().exit_code, 0) << after.transcript();
  EXPECT_EQ(model_status(obj).value("units_failed", 1u), 0u);
}

#endif

// ---- 6. a read error during the load ----

TEST_F(ClientIntegration, FileTruncatedDuringTheLoadGivesSigbusNotZeros) {
  // Eight huge pages at least, so the load (fault-driven only) is whole
  // units short of the new end when the file shrinks (a unit is a huge page: 32 MiB with
  // 16 KiB base pages, where a 32 MiB model is one unit).
  const uint64_t size = std::max<uint64_t>(32 * kMiB, 8 * huge_page_size());
  auto m = make_model(dir_, "m.gguf", "shrinking", size);
  if (!start(std::max<uint64_t>(64, 2 * round_up_pages(size) / kMiB),
             std::string(kFaultDrivenOnly) + "queue_depth = 1\n", 8 * kMiB))
    return;
  const uint64_t last = m.size() - 1;
  Child c(client(m, {"--order", "none", "--wait-go", "--touch", std::to_string(last)}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  const std::string obj = field(*o, "object");
  if (!require_direct_io(obj)) return;
  ASSERT_TRUE(c.expect_line("waiting"));
  const uint64_t new_size = m.size() / 2;
  ASSERT_EQ(::truncate(m.path.c_str(), static_cast<off_t>(new_size)), 0);
  ASSERT_LT(model_status(obj).value("resident_bytes", uint64_t{0}), new_size)
      << "the load passed the new end before the truncation: the test proves nothing";
  c.send("go");
  auto s = c.expect_line("sigbus", 20s);
  EXPECT_TRUE(s) << "a page past the new end did not raise SIGBUS\n" << c.transcript();
  auto e = c.wait();
  EXPECT_EQ(e.exit_code, 7) << c.transcript();
  EXPECT_EQ(c.transcript().find("touched value"), std::string::npos) << "the client read bytes past the end";
  EXPECT_TRUE(wait_until([&] { return model_status(obj).value("units_failed", 0u) > 0; }, 10s))
      << model_status(obj).dump();
  // The daemon keeps serving.
  EXPECT_TRUE(dbus_->status().contains("pool"));
}

// ---- 7. evict then refill ----

TEST_F(ClientIntegration, EvictedByAnotherModelThenRefilledLazily) {
  auto a = make_model(dir_, "a.gguf", "first", fault_driven_size(24 * kMiB), 8, 1);
  auto b = make_model(dir_, "b.gguf", "second", fault_driven_size(40 * kMiB), 8, 2);
  // A pool that holds either model but not both: one huge page short of
  // both (half of the first model is no whole page when a page is 32 MiB).
  const uint64_t pool_mib = (round_up_pages(b.size()) + round_up_pages(a.size()) - huge_page_size()) / kMiB;
  ASSERT_GT(round_up_pages(a.size()) + round_up_pages(b.size()), pool_mib * kMiB);
  // Fault-driven, so the refill after the eviction is still to come when
  // the client reports, however slowly it starts.
  if (!start(pool_mib, kFaultDrivenOnly)) return;
  std::string obj_a;
  {
    Child c(client(a, {"--order", "seq"}));
    auto o = c.expect_line("opened");
    ASSERT_TRUE(o) << c.transcript();
    obj_a = field(*o, "object");
    expect_verified(c, a);
    ASSERT_EQ(c.wait().exit_code, 0) << c.transcript();
  }
  ASSERT_TRUE(wait_until([&] { return model_status(obj_a).value("refcount", 99u) == 0; }, kRefsGone));
  // Loading the second model needs the first one's pages: LRU eviction.
  // An evicted model leaves the table (one record of model state: a model
  // is listed exactly while its region is in the pool).
  const std::string obj_b = load(b);
  auto st = dbus_->status();
  EXPECT_TRUE(model_in(st, obj_a).is_null()) << "an evicted model stays listed: " << st.dump(1);
  EXPECT_EQ(st["models"].size(), 1u) << st.dump(1);
  EXPECT_EQ(st["pool"]["model_bytes"].get<uint64_t>(), round_up_pages(b.size())) << st["pool"].dump();
  // Opening the first again loads it anew and refills it lazily (evicting
  // the unused second).
  std::string obj_a2;
  {
    Child c(client(a, {"--order", "random:1"}));
    auto o = c.expect_line("opened");
    ASSERT_TRUE(o) << c.transcript();
    obj_a2 = field(*o, "object");
    EXPECT_NE(obj_a2, obj_a) << "a dropped model's object path was reused";
    EXPECT_EQ(field(*o, "resident"), "0");
    expect_verified(c, a);
    ASSERT_EQ(c.wait().exit_code, 0) << c.transcript();
  }
  st = dbus_->status();
  EXPECT_TRUE(model_in(st, obj_b).is_null()) << st.dump(1);
  EXPECT_FALSE(model_in(st, obj_a2).is_null()) << st.dump(1);
  EXPECT_EQ(st["pool"]["model_bytes"].get<uint64_t>(), round_up_pages(a.size())) << st["pool"].dump();
}

TEST_F(ClientIntegration, UnloadThenReopenRefills) {
  auto a = make_model(dir_, "a.gguf", "unloaded", fault_driven_size(16 * kMiB));
  // The reopened model is still loading at the open.
  if (!start(pool_mib_for(a.size()), kFaultDrivenOnly)) return;
  const std::string obj = load(a);
  {
    Child c(client(a, {"--order", "seq"}));
    expect_verified(c, a);
    ASSERT_EQ(c.wait().exit_code, 0) << c.transcript();
  }
  ASSERT_TRUE(wait_until([&] { return model_status(obj).value("refcount", 99u) == 0; }, kRefsGone));
  auto e = dbus_->unload(obj, false);
  ASSERT_TRUE(e.ok()) << e.name << ": " << e.message;
  auto st = dbus_->status();
  EXPECT_TRUE(st["models"].empty()) << st.dump(1);
  EXPECT_EQ(st["pool"]["model_bytes"].get<uint64_t>(), 0u);
  Child c(client(a, {"--order", "random:2"}));
  auto o = c.expect_line("opened");
  ASSERT_TRUE(o) << c.transcript();
  EXPECT_EQ(field(*o, "resident"), "0");
  expect_verified(c, a);
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
}

// An unload while the model's reads are held in the device (4 KiB/s until
// the test lifts the throttle): the call answers at once, and the daemon
// keeps answering the bus while those reads drain (its status shows the
// pages not yet free: they come back only once the reads landed). A model
// that needs those pages loads, with its own bytes, once they did.
TEST_F(ClientIntegration, UnloadAnswersAtOnceWhileTheModelsReadsDrain) {
  auto w = make_model(dir_, "w.gguf", "warm", 14 * kMiB);
  auto a = make_model(dir_, "a.gguf", "held", 20 * kMiB);
  auto b = make_model(dir_, "b.gguf", "next", 20 * kMiB);
  if (!start(32, "", uint64_t{1} << 40)) return;  // room for one of a and b at a time
  // Every daemon code path below runs once unthrottled first.
  const std::string warm = load(w);
  ASSERT_TRUE(wait_until([&] { return model_status(warm).value("state", std::string()) == "resident"; }, 30000ms));
  ASSERT_TRUE(dbus_->unload(warm, false).ok());
  ASSERT_TRUE(wait_until([&] { return dbus_->status()["models"].empty(); }, 30000ms));
  ASSERT_TRUE(hold_reads());
  const std::string obj = load(a);
  if (!require_direct_io(obj)) return;
  auto before = dbus_->status();
  const uint64_t total = before["pool"]["total_bytes"].get<uint64_t>();
  const uint64_t free_loaded = before["pool"]["free_bytes"].get<uint64_t>();
  ASSERT_LT(free_loaded, total);
  ASSERT_NE(model_status(obj).value("state", std::string()), "resident") << "the held load finished";
  auto e = dbus_->unload(obj, false);
  ASSERT_TRUE(e.ok()) << e.name << ": " << e.message;
  auto during = dbus_->status();
  EXPECT_TRUE(during["models"].empty()) << during.dump(1);
  EXPECT_EQ(during["pool"]["free_bytes"].get<uint64_t>(), free_loaded)
      << "the pages came back while the reads were held: nothing was drained on the loop";
  ASSERT_TRUE(throttle_->set_rate(0));
  ASSERT_TRUE(wait_until([&] { return dbus_->status()["pool"]["free_bytes"].get<uint64_t>() == total; }, 30000ms))
      << dbus_->status().dump(1);
  Child c(client(b, {"--order", "random:4"}));
  expect_verified(c, b);
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
}

// A LoadModel whose room is the pages of an unloaded model whose reads are
// held in the device: the call waits (parked, its reply held) while the
// daemon answers GetStatus and serves another client's faults (that model
// is on a tmpfs, which the throttle does not slow; its warm-up crawls, so
// the client faults); once the reads land the load is answered from the
// drain event, and the pool holds exactly the two models. The load may wait
// as long as the test holds the reads (drain_wait): the faulting client's
// run takes what it takes, under TCG or a sanitizer too.
TEST_F(ClientIntegration, ALoadWaitingForDrainingPagesLetsTheDaemonServeOthers) {
  const uint64_t h = huge_page_size();
  auto w = make_model(dir_, "w.gguf", "warm", 13 * kMiB);
  auto a = make_model(dir_, "a.gguf", "held", 20 * kMiB, 12);
  auto b = make_model(dir_, "b.gguf", "next", 27 * kMiB, 16, 2);
  TmpfsModel c(make_model(dir_, "c.gguf", "faulted", 13 * kMiB, 8, 3));
  if (!c.ok) return skip("no tmpfs at /dev/shm for a model the throttle does not slow");
  const uint64_t A = round_up_pages(a.size()), B = round_up_pages(b.size()), C = round_up_pages(c.m.size());
  // b fits only with a's pages back; c fits beside a's held pages.
  const uint64_t pool = B + C;
  if (pool - A >= B || C > pool - A)
    return skip("in pages of " + std::to_string(h) + " bytes the models are " + std::to_string(A) + ", " +
                std::to_string(B) + " and " + std::to_string(C) + " bytes: b would not need a's pages");
  if (!start(pool / kMiB,
             "[models]\nwarmup_rate = \"1M\"\npinned = [\"faulted\", \"next\"]\ndrain_wait = \"600s\"\n",
             uint64_t{1} << 40))
    return;
  uint64_t free_held = 0;
  if (!hold_a_drain(w, a, true, &free_held)) return;
  ASSERT_EQ(free_held, pool - A);

  std::atomic<bool> answered{false};
  CallError waited;
  std::string obj_b;
  std::thread loader([&] {
    BusClient other(bus_->address());
    waited = other.load_model(b.path, &obj_b, 600s);
    answered = true;
  });
  // However this test ends, the held reads go and the loader is joined.
  struct Release {
    std::thread& t;
    BlkioThrottle& throttle;
    ~Release() {
      (void)throttle.set_rate(0);
      if (t.joinable()) t.join();
    }
  } release{loader, *throttle_};
  ASSERT_TRUE(wait_until([&] { return a_call_waits(); }, 30000ms)) << daemon_->log();

  // The loop serves: status, and another client's faults on its own model.
  auto during = dbus_->status();
  EXPECT_TRUE(during["models"].empty()) << during.dump(1);
  EXPECT_EQ(during["pool"]["free_bytes"].get<uint64_t>(), pool - A) << "the waiting load holds pages";
  {
    Child cc(client(c.m, {"--order", "random:5"}));
    auto o = cc.expect_line("opened");
    ASSERT_TRUE(o) << cc.transcript();
    EXPECT_EQ(field(*o, "resident"), "0") << "the faulting client's model was resident already: no fault served";
    expect_verified(cc, c.m);
    EXPECT_EQ(cc.wait().exit_code, 0) << cc.transcript();
  }
  EXPECT_FALSE(answered) << "the load was answered before the pages it needs were back";

  ASSERT_TRUE(throttle_->set_rate(0));
  loader.join();
  ASSERT_TRUE(waited.ok()) << waited.name << ": " << waited.message << "\n" << daemon_->log();
  auto after = dbus_->status();
  EXPECT_EQ(after["models"].size(), 2U) << after.dump(1);
  EXPECT_FALSE(model_status(obj_b).is_null()) << after.dump(1);
  EXPECT_EQ(after["pool"]["model_bytes"].get<uint64_t>(), B + C) << after["pool"].dump();
  EXPECT_EQ(after["pool"]["free_bytes"].get<uint64_t>(), pool - B - C) << after["pool"].dump();
  Child cb(client(b, {"--order", "random:6"}));
  expect_verified(cb, b);
  EXPECT_EQ(cb.wait().exit_code, 0) << cb.transcript();
}

// A daemon with `drain_wait`, in a pool b fits in only with a's pages, and
// a's reads held in the disk with those pages on their way back (unpaced
// hold_a_drain): runs `during(b)`, checks that the waiting calls held no
// page, then lets the reads land and checks that the pool is whole again
// and that no model was loaded for them.
void ClientIntegration::with_a_held_drain(const std::string& drain_wait,
                                          const std::function<void(const ModelFile&)>& during) {
  auto w = make_model(dir_, "w.gguf", "warm", 13 * kMiB);
  auto a = make_model(dir_, "a.gguf", "held", 20 * kMiB, 12);
  auto b = make_model(dir_, "b.gguf", "next", 27 * kMiB, 16, 2);
  const uint64_t A = round_up_pages(a.size()), B = round_up_pages(b.size());
  const uint64_t pool = B;
  if (A >= B) return skip("in pages of " + std::to_string(huge_page_size()) + " bytes b is no larger than a");
  if (!start(pool / kMiB, "[models]\ndrain_wait = \"" + drain_wait + "\"\n", uint64_t{1} << 40)) return;
  uint64_t free_held = 0;
  if (!hold_a_drain(w, a, false, &free_held)) return;
  ASSERT_EQ(free_held, pool - A);
  // However this ends, the held reads go; not before the checks below,
  // which need them held.
  struct Release {
    BlkioThrottle& throttle;
    ~Release() { (void)throttle.set_rate(0); }
  } release{*throttle_};
  during(b);
  if (HasFatalFailure()) return;
  auto st = dbus_->status();
  EXPECT_TRUE(st["models"].empty()) << st.dump(1);
  EXPECT_EQ(st["pool"]["free_bytes"].get<uint64_t>(), pool - A) << "a waiting call holds pages";
  ASSERT_TRUE(throttle_->set_rate(0));
  ASSERT_TRUE(wait_until([&] { return dbus_->status()["pool"]["free_bytes"].get<uint64_t>() == pool; }, 30000ms))
      << dbus_->status().dump(1);
  EXPECT_TRUE(dbus_->status()["models"].empty()) << "a model was loaded for a call nobody waits for";
}

// A LoadModel waiting for draining pages whose caller leaves the bus is
// dropped, holding nothing. Its wait (drain_wait) is longer than the test,
// so it is the caller's leaving that ends it.
TEST_F(ClientIntegration, AWaitingLoadIsDroppedWithItsCallerHoldingNothing) {
  with_a_held_drain("600s", [&](const ModelFile& b) {
    {
      // A client process whose LoadModel waits, killed meanwhile.
      Child gone(client(b));
      ASSERT_TRUE(wait_until([&] { return a_call_waits(); }, 30000ms)) << daemon_->log();
      gone.kill(SIGKILL);
      (void)gone.wait();
    }
    ASSERT_TRUE(wait_until([&] { return daemon_->log().find("dropped: it left the bus") != std::string::npos; },
                           30000ms))
        << daemon_->log();
    EXPECT_EQ(daemon_->log().find("still held by reads in flight after"), std::string::npos)
        << "the call was refused for its wait, not dropped with its caller\n" << daemon_->log();
  });
}

// One that waits longer than drain_wait is refused naming why, holding
// nothing.
TEST_F(ClientIntegration, AWaitingLoadIsRefusedAfterItsLimitHoldingNothing) {
  with_a_held_drain("1s", [&](const ModelFile& b) {
    auto e = dbus_->load_model(b.path);
    EXPECT_EQ(e.name, "org.aios.Airs1.Error.PoolExhausted") << e.message;
    EXPECT_NE(e.message.find("reads were still in flight after 1000 ms"), std::string::npos) << e.message;
  });
}

// ---- 8. pool too small ----

// A model bigger than the pool streams through it; one that cannot stream
// even through the whole pool (its largest layer and the read-ahead do not
// fit) is refused, naming both.
TEST_F(ClientIntegration, PoolTooSmallIsAClearErrorAndNothingIsHalfMade) {
  // Two units of pool; the model three times that, at least 40 MiB (with
  // 32 MiB units its largest layer and the read-ahead are three units).
  const uint64_t pool_mib = std::max<uint64_t>(4, huge_page_size() / kMiB * 2);
  auto m = make_model(dir_, "m.gguf", "toolarge", std::max<uint64_t>(40, 3 * pool_mib) * kMiB);
  if (!start(pool_mib)) return;
  auto before = dbus_->status();
  auto e = dbus_->load_model(m.path);
  EXPECT_EQ(e.name, "org.aios.Airs1.Error.PoolExhausted") << e.message;
  // Names what it needs and what there is.
  const std::string pages = std::to_string(before["pool"]["total_pages"].get<uint64_t>()) + " pages";
  EXPECT_NE(e.message.find("pool exhausted"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find(pages), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("free of"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("streaming it needs at least"), std::string::npos) << e.message;
  auto after = dbus_->status();
  EXPECT_EQ(after["models"], before["models"]);
  EXPECT_EQ(after["pool"]["free_bytes"], before["pool"]["free_bytes"]);
  EXPECT_EQ(after["pool"]["model_bytes"], before["pool"]["model_bytes"]);
  EXPECT_EQ(after["pool"]["files_pages"], before["pool"]["files_pages"]);
  // Through the library: -ENOMEM and the same text.
  Child c(client(m));
  auto f = c.expect_line("open-failed");
  ASSERT_TRUE(f) << c.transcript();
  EXPECT_EQ(field(*f, "rc"), std::to_string(-ENOMEM));
  EXPECT_EQ(c.wait().exit_code, 13) << c.err();
  EXPECT_NE(c.err().find("pool exhausted"), std::string::npos) << c.err();
  EXPECT_EQ(dbus_->status()["models"], before["models"]);
}

// ---- 9. malformed GGUF ----

TEST_F(ClientIntegration, MalformedGgufIsBadModelNamingTheDefectAndTheDaemonKeepsServing) {
  auto good = make_model(dir_, "good.gguf", "good", 8 * kMiB);
  if (!start(64)) return;
  struct Case {
    std::string file;
    std::vector<std::byte> bytes;
    std::string defect;
  };
  std::vector<Case> cases;
  {
    airs::gguf::Builder b;
    b.u32(0x46554747 ^ 0xff).u32(3).u64(0).u64(0);  // wrong magic
    cases.push_back({"magic.gguf", b.take(), "magic at byte 0"});
  }
  {
    airs::gguf::Builder b;
    b.header(3, 0, 2).kv_str("general.architecture", "llama");
    b.str("bad.flag").u32(7).u8(2);  // BOOL (type 7) holding 2
    cases.push_back({"bool.gguf", b.take(), "BOOL value is 2"});
  }
  {
    // A real model cut inside its data section: tensors past the end.
    std::vector<std::byte> head(good.plan.header.begin(), good.plan.header.end());
    head.resize(head.size() + 4096);
    cases.push_back({"cut.gguf", head, "extends past the end of the file"});
  }
  for (auto& c : cases) {
    const std::string p = dir_.file(c.file);
    {
      const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(::write(fd, c.bytes.data(), c.bytes.size()), static_cast<ssize_t>(c.bytes.size()));
      ::close(fd);
    }
    auto e = dbus_->load_model(p);
    EXPECT_EQ(e.name, "org.aios.Airs1.Error.BadModel") << c.file << ": " << e.message;
    EXPECT_NE(e.message.find(c.defect), std::string::npos) << c.file << ": " << e.message;
  }
  auto st = dbus_->status();
  EXPECT_TRUE(st["models"].empty()) << st.dump(1);
  EXPECT_EQ(st["pool"]["model_bytes"].get<uint64_t>(), 0u);
  Child c(client(good, {"--order", "seq"}));
  expect_verified(c, good);
  EXPECT_EQ(c.wait().exit_code, 0) << c.transcript();
}

// ---- 10. a fully resident model needs no userfaultfd ----

TEST_F(ClientIntegration, ResidentModelIsMappedWithoutUserfaultfd) {
  auto m = make_model(dir_, "m.gguf", "warm", fault_driven_size(16 * kMiB));
  // Fault-driven: the first client's open comes before its faults, so it
  // sees a model still loading however slowly it starts.
  if (!start(pool_mib_for(m.size()), kFaultDrivenOnly)) return;
  // A lazy client first (control: the count below can see a uffd).
  Child first(client(m, {"--order", "seq", "--hold"}));
  auto o1 = first.expect_line("opened");
  ASSERT_TRUE(o1) << first.transcript();
  const std::string obj = field(*o1, "object");
  if (!require_direct_io(obj)) return;
  EXPECT_EQ(field(*o1, "resident"), "0");
  EXPECT_GE(field_u64(*o1, "uffd_fds"), 1u) << *o1;
  ASSERT_TRUE(wait_until([&] { return model_status(obj).value("state", "") == "resident"; }, 10s));
  Child second(client(m, {"--order", "random:4"}));
  auto o2 = second.expect_line("opened");
  ASSERT_TRUE(o2) << second.transcript();
  EXPECT_EQ(field(*o2, "resident"), "1");
  EXPECT_EQ(field(*o2, "uffd_fds"), "0") << *o2;
  expect_verified(second, m);
  auto s2 = second.expect_line("state");
  ASSERT_TRUE(s2);
  EXPECT_EQ(field(*s2, "uffd_fds"), "0");
  EXPECT_EQ(second.wait().exit_code, 0) << second.transcript();
  // The lazy client unregistered once resident and still reads right.
  expect_verified(first, m);
  first.send("go");
  EXPECT_EQ(first.wait().exit_code, 0) << first.transcript();
}

// ---- accounting and quota probes ----

TEST_F(ClientIntegration, ManagerPoolPropertiesAgreeWithStatus) {
  auto m = make_model(dir_, "m.gguf", "props", 16 * kMiB);
  if (!start(64)) return;
  const std::string obj = load(m);
  auto st = dbus_->status();
  const uint64_t free_bytes = st["pool"]["free_bytes"].get<uint64_t>();
  EXPECT_EQ(free_bytes + st["pool"]["model_bytes"].get<uint64_t>(), st["pool"]["total_bytes"].get<uint64_t>());
  EXPECT_EQ(dbus_->property_u64("/org/aios/Airs1", "org.aios.Airs1.Manager", "PoolBytes"),
            st["pool"]["total_bytes"].get<uint64_t>());
  EXPECT_EQ(dbus_->property_u64("/org/aios/Airs1", "org.aios.Airs1.Manager", "PoolFreeBytes"), free_bytes)
      << "PoolFreeBytes does not report the pool's free bytes";
  EXPECT_EQ(dbus_->property_u64(obj, "org.aios.Airs1.Model", "Size"), m.size());
}

TEST_F(ClientIntegration, FailedOpenDoesNotChargeTheFdQuota) {
  // Open hands out 2 fds; a refused Open hands out none and must not count.
  auto m = make_model(dir_, "m.gguf", "quota", 32 * kMiB);
  if (!start(64, "[models]\nqueue_depth = 1\n[kv]\nmax_fds_per_uid = 4\n", 8 * kMiB)) return;
  const std::string obj = load(m);
  if (!require_direct_io(obj)) return;
  auto other = make_model(dir_, "other.gguf", "other", 16 * kMiB);
  for (int i = 0; i < 3; ++i) {
    // The proof fd is another file: refused (AccessDenied), nothing handed out.
    auto e = dbus_->open_model(obj, other.path, true);
    EXPECT_EQ(e.name, "org.freedesktop.DBus.Error.AccessDenied") << "attempt " << i << ": " << e.message;
  }
  EXPECT_EQ(model_status(obj).value("refcount", 99u), 0u);
  auto ok = dbus_->open_model(obj, m.path, true);
  EXPECT_TRUE(ok.ok()) << "a uid holding no fds was refused: " << ok.name << ": " << ok.message;
  if (ok.ok()) {
    EXPECT_TRUE(dbus_->release_model(obj).ok());
  }
}

}  // namespace
