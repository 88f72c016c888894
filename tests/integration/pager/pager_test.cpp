// SPDX-License-Identifier: Apache-2.0
// Pool + Pager + LazyMapping on the real kernel: real hugetlbfs pages, real
// userfaultfd, real io_uring. The "daemon" runs in this process on an
// EventLoop (or in a forked process where it must die); clients are separate
// processes (pager_test_client) that check every byte against the file.
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pager/pager.hpp"
#include "pool/hugetlbfs_backend.hpp"
#include "pool/shmem_backend.hpp"
#include "pool/pool.hpp"
#include "sys/event_loop.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/procfs.hpp"
#include "sys/proc_handles.hpp"
#include "sys/uffd.hpp"
#include "util/sanitizers.hpp"
#include "blkio_throttle.hpp"
#include "proc_threads.hpp"
#include "wire.hpp"
#include "wire/hints.hpp"
#include "wire/opened.hpp"
#include "wire/requests.hpp"
#include "sys/files.hpp"

namespace airs {
namespace {

using namespace std::chrono_literals;
using pager::ModelId;
using pager::PagerOptions;

uint64_t g_unit = 0;
std::string g_src;            // the test model
uint64_t g_file_size = 0;
std::vector<pager::Extent> g_extents;
int64_t g_raised = 0;         // nr_hugepages we added for the suite
std::string g_nr_path;

constexpr uint64_t kPoolPages = 48;
// ASan and TSan intercept mlock/munlock and make them no-ops: VmLck stays 0.
#if defined(AIRS_ASAN) || defined(AIRS_TSAN)
constexpr bool kMlockWorks = false;
#else
constexpr bool kMlockWorks = true;
#endif
// The pool backend the suite's daemons use (the mode under test):
// hugetlbfs = full mode, shmem = small-pages mode (and cooperative), on
// huge folios where the kernel gives them; ShmemMemfd: shmem forced onto
// memfds of base pages (a kernel without transparent huge pages, as stock
// Raspberry Pi OS).
// ShmemExpertUnits: the Shmem pool with streamed mixtures of experts cut in
// quarter pages (PagerOptions::expert_unit); every other backing streams
// in pool pages.
enum class Backing { Hugetlbfs, Shmem, ShmemMemfd, ShmemExpertUnits };
Backing g_backing = Backing::Hugetlbfs;
bool shmem() { return g_backing != Backing::Hugetlbfs; }
// The unit a streamed mixture of experts is cut in.
uint64_t moe_unit() { return g_backing == Backing::ShmemExpertUnits ? g_unit / 4 : g_unit; }
bool g_cooperative = false;
std::vector<pid_t> g_children;  // killed at the end of each test if still alive

std::string nr_path() {
  return "/sys/kernel/mm/hugepages/hugepages-" + std::to_string(g_unit / 1024) + "kB/nr_hugepages";
}
uint64_t read_sys(const std::string& f) {
  auto v = sys::read_u64_file("/sys/kernel/mm/hugepages/hugepages-" + std::to_string(g_unit / 1024) + "kB/" + f);
  return v ? *v : 0;
}

// `salt` shifts the pattern: files of different salts differ in every word.
void write_source(const std::string& path, uint64_t size, uint64_t salt = 0) {
  sys::UniqueFd fd(::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644));
  ASSERT_TRUE(fd.valid());
  std::vector<uint64_t> buf(1 << 17);
  for (uint64_t off = 0; off < size; off += buf.size() * 8) {
    for (uint64_t i = 0; i < buf.size(); ++i) buf[i] = test::pattern_word(off / 8 + i + salt);
    const uint64_t n = std::min<uint64_t>(buf.size() * 8, size - off);
    ASSERT_EQ(::pwrite(fd.get(), buf.data(), n, static_cast<off_t>(off)), static_cast<ssize_t>(n));
  }
  ::fsync(fd.get());
}

class PagerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto ps = sys::default_huge_page_size();
    ASSERT_TRUE(ps && *ps > 0) << "no default huge page size";
    g_unit = *ps;
    g_nr_path = nr_path();
    // 32 full units and a partial last one: EOF inside the last unit.
    g_file_size = 32 * g_unit + 12345;
    g_src = "/var/tmp/airs-pager-test-" + std::to_string(::getpid()) + ".bin";
    write_source(g_src, g_file_size);
    // A header rank 0, ten "layers" in order after it.
    g_extents.push_back({0, 4096, 0});
    const uint64_t layer = (g_file_size - 4096) / 10;
    for (uint32_t i = 0; i < 10; ++i) {
      const uint64_t off = 4096 + i * layer;
      g_extents.push_back({off, i == 9 ? g_file_size - off : layer, i + 1});
    }
    // Enough free pages for one pool and a margin (the daemon-kill test's
    // forked daemon has its own pool while ours is gone).
    const uint64_t want = kPoolPages + 8;
    const uint64_t avail = read_sys("free_hugepages") - std::min(read_sys("free_hugepages"), read_sys("resv_hugepages"));
    if (avail < want) {
      const uint64_t nr = read_sys("nr_hugepages");
      ASSERT_TRUE(sys::write_text_file(g_nr_path, std::to_string(nr + want - avail)));
      g_raised = static_cast<int64_t>(read_sys("nr_hugepages")) - static_cast<int64_t>(nr);
    }
  }
  static void TearDownTestSuite() {
    ::unlink(g_src.c_str());
    if (g_raised > 0) {
      const uint64_t nr = read_sys("nr_hugepages");
      (void)sys::write_text_file(g_nr_path, std::to_string(nr - std::min<uint64_t>(nr, static_cast<uint64_t>(g_raised))));
    }
  }

  void TearDown() override {
    // A failed test must not leave a client holding pool pages for the next.
    for (pid_t p : g_children) {
      if (::kill(p, SIGKILL) == 0) ::waitpid(p, nullptr, 0);
    }
    g_children.clear();
  }

  void SetUp() override {
    ASSERT_GE(read_sys("free_hugepages") - read_sys("resv_hugepages"), kPoolPages)
        << "not enough free huge pages on this machine";
  }

  struct Daemon {
    std::unique_ptr<sys::EventLoop> loop;
    std::unique_ptr<pool::Pool> pool;
    std::unique_ptr<pager::Pager> pager;
  };

  static Daemon make_daemon(uint64_t pages, PagerOptions opts) {
    Daemon d;
    auto loop = sys::EventLoop::create();
    EXPECT_TRUE(loop.ok());
    d.loop = std::move(loop).value();
    std::unique_ptr<pool::PoolBackend> backend;
    if (shmem()) {
      // The same unit as the huge page so the suite's sizes carry over.
      pool::ShmemOptions so;
      so.unit = g_unit;
      so.huge_folios = g_backing == Backing::Shmem || g_backing == Backing::ShmemExpertUnits;
      auto b = pool::ShmemBackend::create(so);
      EXPECT_TRUE(b.ok()) << b.error().message;
      backend = std::move(b).value();
    } else {
      auto b = pool::HugetlbfsBackend::create({});
      EXPECT_TRUE(b.ok()) << b.error().message;
      backend = std::move(b).value();
    }
    auto p = pool::Pool::create(std::move(backend), {pages * g_unit, false});
    EXPECT_TRUE(p.ok()) << p.error().message;
    d.pool = std::move(p).value();
    opts.uffd_clients = !g_cooperative;
    opts.expert_unit = g_backing == Backing::ShmemExpertUnits ? g_unit / 4 : 0;
    auto pg = pager::Pager::create(*d.loop, *d.pool, opts);
    EXPECT_TRUE(pg.ok());
    d.pager = std::move(pg).value();
    return d;
  }

  static pager::ModelSpec spec_of(std::string name, sys::UniqueFd fd, uint64_t size, std::vector<pager::Extent> extents) {
    pager::ModelSpec spec;
    spec.name = std::move(name);
    spec.gguf = std::move(fd);
    spec.file_size = size;
    spec.extents = std::move(extents);
    return spec;
  }

  static ModelId load(Daemon& d, const std::string& path, const std::string& name = "m",
                      std::vector<uint32_t> warmup_order = {}, bool record_access = false, uint64_t budget_bytes = 0) {
    sys::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    EXPECT_TRUE(fd.valid());
    pager::ModelSpec spec;
    spec.name = name;
    spec.gguf = std::move(fd);
    spec.file_size = g_file_size;
    spec.extents = g_extents;
    spec.warmup_order = std::move(warmup_order);
    spec.record_access = record_access;
    spec.budget_bytes = budget_bytes;
    auto id = d.pager->load(std::move(spec));
    EXPECT_TRUE(id.ok()) << id.error().message;
    return id.ok() ? *id : 0;
  }

  struct Child {
    pid_t pid = -1;
    sys::UniqueFd sock;
  };

  static Child spawn(const std::string& mode, const std::string& src = g_src) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    Child c;
    c.pid = ::fork();
    if (c.pid == 0) {
      ::fcntl(sv[1], F_SETFD, 0);
      // Some tests expect the client to die by SIGSEGV/SIGBUS: under ASan
      // or TSan the sanitizer must not turn those into exit(1).
      ::setenv("ASAN_OPTIONS", "handle_segv=0:handle_sigbus=0", 1);
      ::setenv("TSAN_OPTIONS", "handle_segv=0:handle_sigbus=0", 1);
      const std::string fd = std::to_string(sv[1]);
      ::execl(PAGER_TEST_CLIENT, PAGER_TEST_CLIENT, fd.c_str(), mode.c_str(), src.c_str(), nullptr);
      _exit(127);
    }
    ::close(sv[1]);
    g_children.push_back(c.pid);
    c.sock.reset(sv[0]);
    timeval tv{20, 0};
    ::setsockopt(c.sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return c;
  }

  // Tells a client whose loop-still steps wait for it that the daemon's
  // loop is still now (test_client.cpp's wait_go).
  static void send_go(Child& c) {
    const char go = 'g';
    ASSERT_EQ(::send(c.sock.get(), &go, 1, MSG_NOSIGNAL), 1) << std::strerror(errno);
  }

  // One byte from a client's socket; a signal that interrupts the wait
  // does not end it (the socket's own 20 s timeout does).
  static ssize_t recv_byte(int fd, char* b) {
    ssize_t r;
    do r = ::recv(fd, b, 1, 0);
    while (r < 0 && errno == EINTR);
    return r;
  }

  // Cooperative mode: hand out an O_RDONLY region fd and the status page;
  // nothing comes back (no uffd).
  static Status hand_out(Daemon& d, ModelId id, Child& c) {
    auto ro = sys::reopen(d.pager->region_fd(id), O_RDONLY);
    if (!ro) return std::move(ro).error();
    test::Hello h{d.pager->region_size(id), g_file_size, ::getpid(), test::kBackingCooperative};
    if (!test::send_msg(c.sock.get(), &h, sizeof h, {ro->get(), d.pager->status_fd(id)}))
      return make_error(EIO, "send hello");
    return {};
  }

  // The touch guard's client (coop-touch:N, any mode): a read-only region
  // fd and the status page, then its request socket and open-unit bits come
  // back and it follows the model.
  static Status hand_out_touch(Daemon& d, ModelId id, Child& c, pager::ClientKey key) {
    auto ro = sys::reopen(d.pager->region_fd(id), O_RDONLY);
    if (!ro) return std::move(ro).error();
    test::Hello h{d.pager->region_size(id), g_file_size, ::getpid(), test::kBackingCooperative};
    if (!test::send_msg(c.sock.get(), &h, sizeof h, {ro->get(), d.pager->status_fd(id)}))
      return make_error(EIO, "send hello");
    test::AttachMsg am{};
    std::vector<int> fds;
    if (!test::recv_msg(c.sock.get(), &am, sizeof am, fds, 2) || fds.size() != 2)
      return make_error(EIO, "client {} sent no request socket", c.pid);
    return d.pager->follow(id, key, c.pid, sys::UniqueFd(fds[0]), sys::UniqueFd(fds[1]));
  }

  // Hand the region to the client and attach the uffd it sends back.
  static Status attach(Daemon& d, ModelId id, Child& c, pager::ClientKey key, uint64_t file_size = g_file_size) {
    if (g_cooperative) return hand_out(d, id, c);
    test::Hello h{d.pager->region_size(id), file_size, ::getpid(),
                  shmem() ? test::kBackingShmem : test::kBackingHugetlbfs};
    if (!test::send_msg(c.sock.get(), &h, sizeof h, {d.pager->region_fd(id), d.pager->status_fd(id)}))
      return make_error(EIO, "send hello");
    test::AttachMsg am{};
    std::vector<int> fds;
    if (!test::recv_msg(c.sock.get(), &am, sizeof am, fds, 2)) {
      const int err = errno;
      int st = 0;
      const pid_t r = ::waitpid(c.pid, &st, WNOHANG);
      return make_error(EIO, "client {} did not attach (errno {}, {})", c.pid, err,
                        r == c.pid ? describe(st) : std::string("still running"));
    }
    return d.pager->attach(id, key, c.pid, sys::UniqueFd(fds[0]), sys::UniqueFd(fds[1]), am.addr, am.len);
  }

  // Forks a daemon (made by `make`) whose block reads are held in the
  // device (HeldReads: nothing it reads arrives until this process lets it
  // go), hands the test model to two clients in `client_mode` and serves
  // them until `waiting(d, id, clients)` says a client waits for the load;
  // then the daemon is killed (SIGKILL) and its held reads are let go (its
  // exit waits for them). So the clients wait first and the daemon dies
  // second, however slowly they start (TCG). The clients start before the
  // daemon's reads are held: their own reads (the fallback's) are not.
  // Returns the clients' wait statuses, or `skip` says why the test cannot
  // run. The caller must be a child subreaper so the clients
  // (grandchildren) come back to it.
  struct KilledMidLoad {
    std::vector<int> statuses;
    std::string skip;
  };
  using WaitingPred = std::function<bool(Daemon&, ModelId, std::vector<Child>&)>;
  static KilledMidLoad kill_daemon_under_clients(const std::function<Daemon()>& make, const std::string& client_mode,
                                                 const WaitingPred& waiting) {
    HeldReads held(g_src);
    if (!held.throttle.available()) return {{}, "cannot hold reads in the device: " + held.throttle.why()};
    enum : int32_t { kWaiting, kNoHold, kNoDirectIo, kNoAttach, kNeverWaited };
    struct Report {
      int32_t code;
      pid_t pids[2];
    };
    int pipefd[2];
    EXPECT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
    const pid_t test_pid = ::getpid();
    const pid_t daemon = ::fork();
    if (daemon == 0) {
      // It serves until this process kills it: if this process dies first
      // (a failure, ctest's time limit), it goes too, and does not hold the
      // test's output open for ever.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != test_pid) _exit(3);
      ::close(pipefd[0]);
      Daemon d = make();
      std::vector<Child> cs;
      for (int i = 0; i < 2; ++i) cs.push_back(spawn(client_mode));
      Report r{kWaiting, {cs[0].pid, cs[1].pid}};
      const auto report = [&](int32_t code) {
        r.code = code;
        if (::write(pipefd[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(3);
      };
      if (!held.start()) {
        report(kNoHold);
        _exit(0);
      }
      const ModelId id = load(d, g_src);
      if (!stats(d, id).direct_io) {
        report(kNoDirectIo);
        _exit(0);
      }
      for (size_t i = 0; i < cs.size(); ++i) {
        if (!attach(d, id, cs[i], static_cast<pager::ClientKey>(i + 1))) {
          report(kNoAttach);
          _exit(2);
        }
      }
      report(run_until(d, [&] { return waiting(d, id, cs); }, 120s) ? kWaiting : kNeverWaited);
      for (;;) (void)d.loop->run_once(5ms);
    }
    ::close(pipefd[1]);
    g_children.push_back(daemon);
    Report r{};
    // The forked daemon reports within its own 120 s wait (plus its start);
    // one that does not is described before it is killed, not waited for
    // until ctest's limit.
    pollfd pfd{pipefd[0], POLLIN, 0};
    int ready;
    do ready = ::poll(&pfd, 1, 240'000);
    while (ready < 0 && errno == EINTR);
    const bool got = ready == 1 && ::read(pipefd[0], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
    ::close(pipefd[0]);
    if (!got) ADD_FAILURE() << "the forked daemon sent no report in 240 s; its threads:\n" << test::describe_threads(daemon);
    if (got) g_children.insert(g_children.end(), r.pids, r.pids + 2);
    ::kill(daemon, SIGKILL);
    const bool released = held.release();
    // Its exit waits for its reads in the device, which the release lets go.
    const auto dead_by = std::chrono::steady_clock::now() + 60s;
    while (::waitpid(daemon, nullptr, WNOHANG) != daemon) {
      if (std::chrono::steady_clock::now() > dead_by) {
        ADD_FAILURE() << "the killed daemon did not exit in 60 s (reads released: " << released
                      << "); its threads:\n" << test::describe_threads(daemon);
        return {};
      }
      std::this_thread::sleep_for(5ms);
    }
    if (got && r.code == kNoDirectIo) return {{}, g_src + " takes no O_DIRECT: its reads would come from the page cache"};
    if (got && r.code == kNoHold) return {{}, "the daemon could not lock its mappings and join the throttled group"};
    EXPECT_TRUE(got && r.code == kWaiting) << "the forked daemon did not report waiting clients (report "
                                           << (got ? std::to_string(r.code) : std::string("none")) << ")";
    if (!got || r.code != kWaiting) return {};
    std::vector<int> out;
    for (pid_t p : r.pids) out.push_back(wait_child(nullptr, p));
    return {out, ""};
  }

  // Run the daemon's loop until pred() or timeout.
  static bool run_until(Daemon& d, const std::function<bool()>& pred, std::chrono::milliseconds timeout = 30s) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      auto r = d.loop->run_once(5ms);
      if (!r) return false;
    }
    return true;
  }

  // Wait for a child to exit while serving it. Returns its wait status.
  static int wait_child(Daemon* d, pid_t pid, std::chrono::milliseconds timeout = 60s) {
    int st = -1;
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      const pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid) return st;
      if (d != nullptr) {
        (void)d->loop->run_once(2ms);
      } else {
        std::this_thread::sleep_for(1ms);
      }
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    ADD_FAILURE() << "child " << pid << " timed out";
    return -1;
  }

  static std::string describe(int st) {
    if (WIFEXITED(st)) return "exit " + std::to_string(WEXITSTATUS(st));
    if (WIFSIGNALED(st)) return std::string("signal ") + strsignal(WTERMSIG(st));
    return "status " + std::to_string(st);
  }

  // A private hugetlbfs mount with a size= limit: its statfs counts exactly
  // what our files hold or reserve, whatever other processes on the machine
  // do with huge pages (the global HugePages_* counters are shared).
  struct TempMount {
    std::string dir;
    explicit TempMount(uint64_t pages) {
      if (pages == 0) return;
      char d[] = "/tmp/airs-hugetlbfs-XXXXXX";
      if (::mkdtemp(d) == nullptr) return;
      const std::string o = "pagesize=" + std::to_string(g_unit / 1024) + "K,size=" + std::to_string(pages * g_unit);
      if (::mount("none", d, "hugetlbfs", 0, o.c_str()) != 0) {
        ::rmdir(d);
        return;
      }
      dir = d;
    }
    ~TempMount() {
      if (dir.empty()) return;
      ::umount2(dir.c_str(), MNT_DETACH);
      ::rmdir(dir.c_str());
    }
    [[nodiscard]] uint64_t used_pages() const {
      auto u = sys::fs_usage(dir);
      return u ? u->blocks - u->blocks_free : UINT64_MAX;
    }
  };

  static Daemon make_daemon_on(const std::string& mount, uint64_t pages, PagerOptions opts) {
    Daemon d;
    d.loop = std::move(sys::EventLoop::create()).value();
    pool::HugetlbfsOptions ho;
    ho.mount_path = mount;
    auto backend = pool::HugetlbfsBackend::create(ho);
    EXPECT_TRUE(backend.ok()) << backend.error().message;
    auto p = pool::Pool::create(std::move(backend).value(), {pages * g_unit, false});
    EXPECT_TRUE(p.ok()) << p.error().message;
    d.pool = std::move(p).value();
    d.pager = std::move(pager::Pager::create(*d.loop, *d.pool, opts)).value();
    return d;
  }

  // Once every drain ended: the pool holds exactly what it held at `counts0`
  // / `kv0`, and our files hold exactly the pool.
  static void expect_pool_as(Daemon& d, const pool::PoolCounts& counts0, const pool::KernelView& kv0) {
    ASSERT_TRUE(d.pager->finish_drains(std::chrono::steady_clock::now() + 30s));
    EXPECT_EQ(d.pool->counts(), counts0) << "pool pages leaked";
    auto kv1 = d.pool->kernel_view();
    ASSERT_TRUE(kv1.ok());
    // Global Free/Rsvd are not compared: other processes on the machine may
    // use huge pages meanwhile.
    EXPECT_EQ(kv1->files_pages, kv0.files_pages);
    EXPECT_EQ(kv1->files_pages, counts0.total_pages());
  }

  // Holds this process's block reads in the device (a blkio throttle of
  // 4 KiB/s on the disk of `file`) while held; the destructor lets them go,
  // so the pager can drain whatever fails. Spawn clients before start():
  // children inherit the group. start() first locks every page of the files
  // this process maps (its binary, its libraries): a page-in queued behind
  // held reads would wait for them, and the test with it.
  struct HeldReads {
    test::BlkioThrottle throttle;
    std::vector<std::pair<void*, size_t>> locked;
    explicit HeldReads(const std::string& file) : throttle(file, 4096) {}
    ~HeldReads() {
      (void)throttle.set_rate(0);
      for (auto [addr, len] : locked) ::munlock(addr, len);
    }
    HeldReads(const HeldReads&) = delete;
    HeldReads& operator=(const HeldReads&) = delete;
    bool start() {
      auto maps = sys::read_text_file("/proc/self/maps", 16 << 20);
      if (!maps) return false;
      std::istringstream in(*maps);
      std::string line;
      while (std::getline(in, line)) {
        unsigned long lo = 0, hi = 0;
        char path[4096] = {};
        if (std::sscanf(line.c_str(), "%lx-%lx %*s %*s %*s %*s %4095s", &lo, &hi, path) != 3 || path[0] != '/')
          continue;
        struct stat st {};
        // Only files on a block device can need a read from it.
        if (::stat(path, &st) != 0 || !S_ISREG(st.st_mode) || major(st.st_dev) == 0) continue;
        void* addr = reinterpret_cast<void*>(lo);
        if (::mlock(addr, hi - lo) != 0) return false;
        locked.emplace_back(addr, hi - lo);
      }
      return throttle.add(::getpid());
    }
    bool hold() { return throttle.set_rate(4096); }
    bool release() { return throttle.set_rate(0); }
  };

  static pager::ModelStats stats(Daemon& d, ModelId id) {
    auto s = d.pager->stats(id);
    EXPECT_TRUE(s.ok());
    return s.ok() ? *s : pager::ModelStats{};
  }

  struct StreamRun {
    uint32_t max_held = 0;
    pager::ModelStats last;
  };

  static constexpr uint64_t kStreamBudget = 12;  // units; the file has 33

  static StreamRun serve_streamed(Daemon& d, ModelId id, const std::vector<pid_t>& pids) {
    StreamRun run;
    std::vector<bool> done(pids.size(), false);
    const auto end = std::chrono::steady_clock::now() + 120s;
    while (std::find(done.begin(), done.end(), false) != done.end() && std::chrono::steady_clock::now() < end) {
      (void)d.loop->run_once(2ms);
      auto s = d.pager->stats(id);
      if (s) {
        run.max_held = std::max(run.max_held, s->units_ready + s->units_in_flight);
        run.last = *s;
      }
      for (size_t i = 0; i < pids.size(); ++i) {
        int st = 0;
        if (done[i] || ::waitpid(pids[i], &st, WNOHANG) != pids[i]) continue;
        done[i] = true;
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "client " << pids[i] << ": " << describe(st);
      }
    }
    EXPECT_EQ(std::find(done.begin(), done.end(), false), done.end()) << "clients still running after 120 s";
    return run;
  }

  void run_clients(PagerOptions opts, const std::vector<std::string>& modes) {
    Daemon d = make_daemon(kPoolPages, opts);
    const ModelId id = load(d, g_src);
    std::vector<Child> cs;
    for (size_t i = 0; i < modes.size(); ++i) {
      cs.push_back(spawn(modes[i]));
      auto st = attach(d, id, cs.back(), i + 1);
      ASSERT_TRUE(st) << modes[i] << ": " << st.error().message;
    }
    for (size_t i = 0; i < cs.size(); ++i) {
      const int st = wait_child(&d, cs[i].pid);
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << modes[i] << ": " << describe(st);
    }
    ASSERT_TRUE(run_until(d, [&] { return stats(d, id).clients == 0; }, 5s)) << "exited clients not dropped";
  }
};

// The byte-exact suite in every loading mode that uses userfaultfd: full
// (hugetlbfs) and small-pages (shmem).
class PagerModeTest : public PagerTest, public ::testing::WithParamInterface<Backing> {
 protected:
  void SetUp() override {
    g_backing = GetParam();
    g_cooperative = false;
    PagerTest::SetUp();
  }
  void TearDown() override {
    PagerTest::TearDown();
    g_backing = Backing::Hugetlbfs;
  }
};

std::string backing_name(const ::testing::TestParamInfo<Backing>& p) {
  switch (p.param) {
    case Backing::Hugetlbfs: return "Full";
    case Backing::Shmem: return "SmallPages";
    case Backing::ShmemMemfd: return "SmallPagesMemfd";
    case Backing::ShmemExpertUnits: return "SmallPagesExpertUnits";
  }
  return "?";
}

INSTANTIATE_TEST_SUITE_P(Modes, PagerModeTest,
                         ::testing::Values(Backing::Hugetlbfs, Backing::Shmem, Backing::ShmemMemfd), backing_name);

TEST_P(PagerModeTest, OneClientInOrderWithWarmup) { run_clients({}, {"seq"}); }

TEST_P(PagerModeTest, OneClientInOrderFaultDriven) {
  PagerOptions o;
  o.background_warmup = false;
  Daemon d = make_daemon(kPoolPages, o);
  const ModelId id = load(d, g_src);
  Child c = spawn("seq");
  ASSERT_TRUE(attach(d, id, c, 1));
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  const auto s = stats(d, id);
  EXPECT_GT(s.faults_waited, 0U) << "no fault ever waited for a read: the fault path was not exercised";
  EXPECT_EQ(s.units_ready, s.units);
  EXPECT_EQ(s.bytes_read, g_file_size);
}

// A client's thread asleep on a fault whose range is no longer registered
// (docs/kernel-facts.md: UFFDIO_UNREGISTER can miss a fault queued under
// the per-VMA lock; the test client replaces the VMA, which wakes nobody):
// the daemon's CONTINUE for it fails with ENOENT, and the daemon must still
// wake the thread, which then reads the file's bytes. Without the wake it
// sleeps for good and the client never exits.
TEST_P(PagerModeTest, AFaultLeftAsleepOnARangeNoLongerRegisteredIsWoken) {
  PagerOptions o;
  o.background_warmup = false;
  Daemon d = make_daemon(kPoolPages, o);
  const ModelId id = load(d, g_src);
  Child c = spawn("stale-fault");
  ASSERT_TRUE(attach(d, id, c, 1));
  // The loop stays still until the client's reader sleeps and its range is
  // replaced: only then may the daemon read the fault.
  char go = 0;
  const ssize_t got = recv_byte(c.sock.get(), &go);
  ASSERT_EQ(got, 1) << "the client did not get its reader asleep (recv: " << std::strerror(errno)
                    << "): " << describe(wait_child(nullptr, c.pid, 15s));
  const int st = wait_child(&d, c.pid, 30s);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  EXPECT_EQ(stats(d, id).clients, 0U) << "the client whose range is gone stays attached";
}

// The same sleeper, woken by libairs itself: LazyMapping::unregister wakes
// the range after unregistering (the daemon, which would wake it too, reads
// nothing meanwhile: its loop stays still until the client exits).
TEST_P(PagerModeTest, UnregisterWakesAFaultLeftAsleep) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src);
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).state == wire::ModelLoadState::Resident; }));
  Child c = spawn("stale-unregister");
  ASSERT_TRUE(attach(d, id, c, 1));
  // The attach has answered what was queued; from here the loop is still.
  send_go(c);
  const int st = wait_child(nullptr, c.pid, 30s);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
}

// A unit left partly mapped in a client (on shmem: a CONTINUE cut short by
// a fatal signal, as when the daemon is killed inside the ioctl, or a client
// dropping part of its entries) is answered with the faulting page mapped:
// the unit's CONTINUE alone stops at the mapped start and skips the rest, and
// the thread would fault on the same page for ever. Answered by the daemon,
// then by the client's own fallback server. Without the fix both clients
// spin until the 30 s limit; with it they read every byte of the file.
TEST_P(PagerModeTest, APartlyMappedUnitIsAnsweredWithTheFaultingPage) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src);
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).state == wire::ModelLoadState::Resident; }));
  Child c = spawn("partial");
  ASSERT_TRUE(attach(d, id, c, 1));
  int st = wait_child(&d, c.pid, 30s);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "answered by the daemon: " << describe(st);
  Child f = spawn("partial-fallback");
  ASSERT_TRUE(attach(d, id, f, 2));
  send_go(f);
  st = wait_child(nullptr, f.pid, 30s);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "answered by the fallback server: " << describe(st);
}

TEST_P(PagerModeTest, RandomOrderFaultDriven) {
  PagerOptions o;
  o.background_warmup = false;
  o.prefetch_window = 0;
  run_clients(o, {"random:7"});
}

TEST_P(PagerModeTest, TwoConcurrentClients) { run_clients({}, {"random:1", "seq"}); }

TEST_P(PagerModeTest, FourConcurrentClientsFaultDriven) {
  PagerOptions o;
  o.background_warmup = false;
  run_clients(o, {"random:1", "random:2", "seq", "random:3"});
}

// Recording: every first touch is seen, also of units the
// warm-up read before the client got there (they are not mapped ahead while
// recording), in the client's own order.
TEST_P(PagerModeTest, RecordsTheOrderAClientFirstTouchesUnits) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src, "m", {}, true);
  Child c = spawn("random:5");
  ASSERT_TRUE(attach(d, id, c, 1));
  const int st = wait_child(&d, c.pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  // The client's order (test_client.cpp "random:SEED").
  const uint32_t units = stats(d, id).units;
  std::vector<uint64_t> touched(units);
  std::iota(touched.begin(), touched.end(), uint64_t{0});
  std::mt19937_64 rng(5);
  std::shuffle(touched.begin(), touched.end(), rng);
  auto order = d.pager->take_access_order(id);
  ASSERT_TRUE(order.has_value());
  EXPECT_EQ(std::vector<uint64_t>(order->begin(), order->end()), touched);
  EXPECT_FALSE(d.pager->take_access_order(id).has_value()) << "recording did not end";
}

// Replay: the warm-up reads the recorded units first, in their order, then
// the rest in load order (the suite's extents rank units in index order).
TEST_P(PagerModeTest, WarmupReadsTheReplayedOrderFirst) {
  Daemon d = make_daemon(kPoolPages, {});
  const std::vector<uint32_t> recorded{32, 5, 17, 0, 9};
  const ModelId id = load(d, g_src, "m", recorded);
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).state == wire::ModelLoadState::Resident; }));
  std::vector<uint32_t> want = recorded;
  for (uint32_t u = 0; u < stats(d, id).units; ++u)
    if (std::find(recorded.begin(), recorded.end(), u) == recorded.end()) want.push_back(u);
  EXPECT_EQ(d.pager->read_order(id), want);
  // A client still reads the file's bytes everywhere.
  Child c = spawn("seq");
  ASSERT_TRUE(attach(d, id, c, 1));
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
}

// An order that does not fit the model is ignored: layer order.
TEST_P(PagerModeTest, AnOrderThatDoesNotFitIsIgnored) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src, "m", {3, 99});
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).state == wire::ModelLoadState::Resident; }));
  std::vector<uint32_t> want(stats(d, id).units);
  std::iota(want.begin(), want.end(), 0U);
  EXPECT_EQ(d.pager->read_order(id), want);
}

TEST_P(PagerModeTest, ThreadsOfOneClientFaultTheSamePages) {
  PagerOptions o;
  o.background_warmup = false;
  run_clients(o, {"threads:4"});
}

TEST_P(PagerModeTest, ResidentNotificationThenUnregister) { run_clients({}, {"resident"}); }

TEST_P(PagerModeTest, ClientAttachesHalfwayThroughWarmup) {
  PagerOptions o;
  o.queue_depth = 2;
  Daemon d = make_daemon(kPoolPages, o);
  const ModelId id = load(d, g_src);
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).units_ready >= 12; }));
  const auto before = stats(d, id);
  ASSERT_LT(before.units_ready, before.units) << "warm-up finished before the attach: nothing tested";
  Child c = spawn("random:5");
  auto ast = attach(d, id, c, 1);
  ASSERT_TRUE(ast) << ast.error().message;
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
}

TEST_P(PagerModeTest, WarmupRatePacesTheBackgroundButNeverAFault) {
  constexpr uint64_t kRate = 8 << 20;
  PagerOptions o;
  o.warmup_bytes_per_s = kRate;
  o.prefetch_window = 0;
  Daemon d = make_daemon(kPoolPages, o);
  const auto t0 = std::chrono::steady_clock::now();
  const ModelId id = load(d, g_src);
  // The last full unit (a late layer): its fault is read at once although
  // the paced warm-up is seconds away from it.
  Child c = spawn("touch:31");
  ASSERT_TRUE(attach(d, id, c, 1));
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  (void)run_until(d, [] { return false; }, 1000ms);
  const auto s = stats(d, id);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s.units_ready, s.units) << "the whole model was read in " << secs << " s at 8 MiB/s";
  EXPECT_GT(s.faults_waited, 0U) << "the fault found its unit ready: it did not go past the warm-up";
  // Never above the rate: rate × time, the 100 ms the bucket saves, one
  // unit of debt, and the fault's layer (a fault reads its whole layer at
  // once: units 29..32, the last extent).
  const uint64_t fault_layer = (g_file_size + g_unit - 1) / g_unit - g_extents.back().offset / g_unit;
  const double allowed =
      static_cast<double>(kRate) * (secs + 0.1) + static_cast<double>((1 + fault_layer) * g_unit);
  EXPECT_LE(static_cast<double>(s.bytes_read), allowed) << "read " << s.bytes_read << " bytes in " << secs << " s";
  EXPECT_GE(s.bytes_read, 2 * g_unit) << "the warm-up did not run at all";
}

// Pages allocated ahead of their reads sit zeroed in the region's page cache;
// a client touching one gets a MINOR fault that must wait for the read, not
// be answered with the zeros. The loop does not run before the client's
// fault, so unit 5 is allocated but certainly not read yet.
TEST_P(PagerModeTest, UnitAllocatedAheadOfItsReadWaitsForTheRead) {
  PagerOptions o;
  o.queue_depth = 1;
  o.allocate_ahead = 8;
  o.copy_fill = false;  // a copy fill allocates nothing ahead
  // The warm-up paced to 1 MiB/s (populates are not paced): unit 5 is still
  // unread when a slow client (sanitizer builds start in seconds) faults it.
  o.warmup_bytes_per_s = 1 << 20;
  Daemon d = make_daemon(kPoolPages, o);
  const ModelId id = load(d, g_src);
  const int rfd = d.pager->region_fd(id);
  auto allocated = [&] {
    struct stat st {};
    EXPECT_EQ(::fstat(rfd, &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  // Unit 0's read and the populates of units 1..8 run in the kernel without
  // the loop.
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (allocated() < 9 * g_unit && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
  ASSERT_GE(allocated(), 9 * g_unit) << "the pages of the next units were not allocated ahead: nothing tested";
  ASSERT_EQ(stats(d, id).units_ready, 0U);
  Child c = spawn("first:5");
  auto ast = attach(d, id, c, 1);
  ASSERT_TRUE(ast) << ast.error().message;
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  EXPECT_GE(stats(d, id).faults_waited, 1U);
}

TEST_P(PagerModeTest, ForkedChildOfAClientNeverSeesZeros) { run_clients({}, {"fork"}); }

TEST_P(PagerModeTest, KillDashNineOfAClientMidFault) {
  PagerOptions o;
  o.background_warmup = false;
  o.prefetch_window = 0;
  Daemon d = make_daemon(kPoolPages, o);
  const auto counts0 = d.pool->counts();
  auto kv0 = d.pool->kernel_view();
  ASSERT_TRUE(kv0.ok());
  const ModelId id = load(d, g_src);
  Child victim = spawn("loop");
  ASSERT_TRUE(attach(d, id, victim, 1));
  Child good = spawn("seq");
  ASSERT_TRUE(attach(d, id, good, 2));
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).faults >= 6; }));
  ::kill(victim.pid, SIGKILL);
  const int vst = wait_child(&d, victim.pid);
  EXPECT_TRUE(WIFSIGNALED(vst) && WTERMSIG(vst) == SIGKILL);
  const int gst = wait_child(&d, good.pid);
  EXPECT_TRUE(WIFEXITED(gst) && WEXITSTATUS(gst) == 0) << describe(gst);
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).clients == 0; }, 5s));
  ASSERT_TRUE(d.pager->unload(id));
  expect_pool_as(d, counts0, *kv0);
}

TEST_P(PagerModeTest, ReadErrorGivesSigbusNotZeros) {
  const std::string copy = g_src + ".trunc";
  write_source(copy, g_file_size);
  PagerOptions o;
  o.background_warmup = false;
  o.prefetch_window = 0;
  Daemon d = make_daemon(kPoolPages, o);
  const ModelId id = load(d, copy);
  Child first = spawn("touch:0", copy);
  ASSERT_TRUE(attach(d, id, first, 1));
  int st = wait_child(&d, first.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  // The file shrinks under the load.
  ASSERT_EQ(::truncate(copy.c_str(), static_cast<off_t>(4 * g_unit)), 0);
  Child late = spawn("touch:30", g_src);  // compares with the intact source
  ASSERT_TRUE(attach(d, id, late, 2));
  st = wait_child(&d, late.pid);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) << "expected SIGBUS, got " << describe(st);
  const auto s = stats(d, id);
  EXPECT_GE(s.units_failed, 1U);
  EXPECT_EQ(s.state, wire::ModelLoadState::Failed);
  ::unlink(copy.c_str());
}

// A model three times its budget of pool pages, streamed: units come and
// go while clients read every byte of it, token after token (each a pass in
// layer order). The budget is never exceeded, units are dropped and read
// again, and every byte each client reads is the file's.
TEST_P(PagerModeTest, AStreamedModelGivesEveryByteThroughABudgetAThirdOfItsSize) {
  Daemon d = make_daemon(kPoolPages, {});
  const auto counts0 = d.pool->counts();
  const auto kv0 = d.pool->kernel_view();
  ASSERT_TRUE(kv0.ok());
  const ModelId id = load(d, g_src, "m", {}, false, kStreamBudget * g_unit);
  ASSERT_TRUE(d.pager->streamed(id));
  EXPECT_EQ(d.pool->counts().model_pages, kStreamBudget) << "a streamed model is charged its budget only";
  EXPECT_EQ(stats(d, id).state, wire::ModelLoadState::Streaming);
  Child c = spawn("tokens:3");
  ASSERT_TRUE(attach(d, id, c, 1));
  const StreamRun run = serve_streamed(d, id, {c.pid});
  EXPECT_LE(run.max_held, kStreamBudget) << "more units held than the budget";
  const auto& st = run.last.stream;
  EXPECT_GT(st.units_dropped, 0U) << "nothing was dropped: nothing streamed";
  // Three passes over 33 units through 12: the policy keeps what fits and
  // streams the rest; plain LRU would read all 99.
  EXPECT_LT(st.units_read, 3 * pool::pages_for(g_file_size, g_unit)) << "every unit read every pass";
  std::printf("[ info ] streamed: %lu units read for 3 passes over %lu units through %lu; %lu dropped\n",
              static_cast<unsigned long>(st.units_read), static_cast<unsigned long>(pool::pages_for(g_file_size, g_unit)),
              static_cast<unsigned long>(kStreamBudget), static_cast<unsigned long>(st.units_dropped));
  ASSERT_TRUE(d.pager->unload(id));
  expect_pool_as(d, counts0, *kv0);
}

TEST_P(PagerModeTest, TwoProcessesOnAStreamedModelShareItsUnits) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src, "m", {}, false, kStreamBudget * g_unit);
  Child a = spawn("tokens:2");
  Child b = spawn("tokens:2");
  ASSERT_TRUE(attach(d, id, a, 1));
  ASSERT_TRUE(attach(d, id, b, 2));
  const StreamRun run = serve_streamed(d, id, {a.pid, b.pid});
  EXPECT_LE(run.max_held, kStreamBudget);
  // Two private copies would read each unit at least once per process.
  EXPECT_LT(run.last.stream.units_read, 4 * pool::pages_for(g_file_size, g_unit));
}

// The touch guard's clients (read-only fd, PROT_NONE, opened on touch): the
// daemon asks them to close a unit before it goes, and they answer.
TEST_P(PagerModeTest, TouchGuardClientsReadAStreamedModelRight) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src, "m", {}, false, kStreamBudget * g_unit);
  Child a = spawn("coop-touch:3");
  Child b = spawn("tokens:2");
  ASSERT_TRUE(hand_out_touch(d, id, a, 1));
  ASSERT_TRUE(attach(d, id, b, 2));
  const StreamRun run = serve_streamed(d, id, {a.pid, b.pid});
  EXPECT_LE(run.max_held, kStreamBudget);
  EXPECT_GT(run.last.stream.units_dropped, 0U);
  EXPECT_EQ(run.last.stream.drops_refused, 0U) << "a client that answers never refuses";
}

// Three touch-guard clients, each reading the units in its own random
// order, through a budget cut to the model's floor: a read for one of them
// can drop the unit another was woken for before that one opened it. Each
// asks again (the touch guard does at each change of the status page), so
// all of them finish, every byte the file's. A touch that asked only once
// waited for ever once its unit went so: the soak saw three cooperative
// clients hang under a budget cut to the floor.
TEST_P(PagerModeTest, TouchGuardClientsInRandomOrderAllFinishAtTheFloor) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src, "m", {}, false, kStreamBudget * g_unit);
  const uint64_t floor = d.pager->floor_bytes(id) / g_unit;
  ASSERT_LT(floor, kStreamBudget);
  ASSERT_TRUE(d.pager->set_budget(id, floor * g_unit));
  ASSERT_TRUE(run_until(d, [&] { return !d.pager->budget_cut_pending(id); })) << "the cut did not end";
  std::vector<Child> cs;
  std::vector<pid_t> pids;
  for (uint32_t i = 0; i < 3; ++i) {
    cs.push_back(spawn("coop-touch:3:" + std::to_string(11 * (i + 1))));
    ASSERT_TRUE(hand_out_touch(d, id, cs.back(), i + 1));
    pids.push_back(cs.back().pid);
  }
  const StreamRun run = serve_streamed(d, id, pids);
  EXPECT_LE(run.max_held, floor);
  EXPECT_GT(run.last.stream.units_dropped, 0U) << "nothing was dropped: nothing streamed";
}

// A mixture of experts on the test file: the header and a dense layer
// (attention, router) in units 0-1, then one MoE layer's three expert
// tensors (gate, up, down) of five experts each, whose slices (2 units and
// 96 bytes: 32-byte aligned, as GGUF tensor data) share their edge units
// with their neighbours, then a dense output.
constexpr uint32_t kMoeExperts = 5;
struct MoeFile {
  std::vector<pager::Extent> extents;
  uint64_t first = 0, slice = 0;  // the first slice's offset; each slice's bytes
  // File offset of byte `at` of expert e's slice in tensor t (0 gate, 1 up, 2 down).
  [[nodiscard]] uint64_t at(uint32_t t, uint32_t e, uint64_t off) const { return first + (t * kMoeExperts + e) * slice + off; }
};
MoeFile moe_file() {
  MoeFile f;
  f.first = g_unit + g_unit / 2 + 32;
  f.slice = 2 * g_unit + 96;
  f.extents.push_back({0, 4096, 0, pager::Access::Once});
  f.extents.push_back({4096, f.first - 4096, 1});
  for (uint32_t t = 0; t < 3; ++t)
    for (uint32_t e = 0; e < kMoeExperts; ++e) f.extents.push_back({f.at(t, e, 0), f.slice, 1, pager::Access::Expert, 0, e});
  const uint64_t end = f.at(2, kMoeExperts - 1, f.slice);
  f.extents.push_back({end, g_file_size - end, 2});
  return f;
}
// The units expert e's three slices overlap.
std::set<uint32_t> moe_units(const MoeFile& f, uint32_t e) {
  std::set<uint32_t> s;
  for (uint32_t t = 0; t < 3; ++t)
    for (uint64_t u = f.at(t, e, 0) / moe_unit(); u <= (f.at(t, e, f.slice) - 1) / moe_unit(); ++u) s.insert(static_cast<uint32_t>(u));
  return s;
}
// The units of the dense part (any byte of a non-expert extent).
std::set<uint32_t> moe_dense_units(const MoeFile& f) {
  std::set<uint32_t> s;
  for (const auto& e : f.extents)
    if (e.access != pager::Access::Expert)
      for (uint64_t u = e.offset / moe_unit(); u <= (e.offset + e.length - 1) / moe_unit(); ++u) s.insert(static_cast<uint32_t>(u));
  return s;
}

class MoeStreamTest : public PagerModeTest {
 protected:
  // Streamed through its floor, `more` units and two pool pages; `budget`
  // in units.
  static ModelId load_moe(Daemon& d, const MoeFile& f, uint32_t* budget, uint32_t more = 0) {
    sys::UniqueFd fd(::open(g_src.c_str(), O_RDONLY | O_CLOEXEC));
    EXPECT_TRUE(fd.valid());
    pager::ModelSpec spec = spec_of("moe", std::move(fd), g_file_size, f.extents);
    const uint64_t per_page = g_unit / moe_unit();
    const uint64_t pages = d.pager->stream_floor_bytes(spec) / g_unit + (more + per_page - 1) / per_page + 2;
    EXPECT_LT(pages + 8, pool::pages_for(g_file_size, g_unit)) << "the test needs a model well over its budget";
    *budget = static_cast<uint32_t>(pages * per_page);
    spec.budget_bytes = pages * g_unit;
    auto id = d.pager->load(std::move(spec));
    EXPECT_TRUE(id.ok()) << id.error().message;
    return id.ok() ? *id : 0;
  }
  static std::set<uint32_t> ready_units(Daemon& d, ModelId id) {
    const int fd = d.pager->status_fd(id);
    const off_t len = ::lseek(fd, 0, SEEK_END);
    void* p = ::mmap(nullptr, static_cast<size_t>(len), PROT_READ, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    std::set<uint32_t> out;
    if (p == MAP_FAILED) return out;
    const wire::StatusPageView v(p, static_cast<uint64_t>(len));
    for (uint32_t u = 0; u < v.unit_count(); ++u)
      if (v.unit_ready(u)) out.insert(u);
    ::munmap(p, static_cast<size_t>(len));
    return out;
  }
  static void settle(Daemon& d, ModelId id) {
    ASSERT_TRUE(run_until(d, [&] { return stats(d, id).units_in_flight == 0; }));
    (void)run_until(d, [] { return false; }, 200ms);
    ASSERT_TRUE(run_until(d, [&] { return stats(d, id).units_in_flight == 0; }));
  }
  // A streamed mixture of experts loaded through its floor and settled, and
  // the units in at that point.
  struct Loaded {
    MoeFile f;
    uint32_t budget = 0;
    ModelId id = 0;
    std::set<uint32_t> before;
  };
  static Loaded load_settled(Daemon& d) {
    Loaded l;
    l.f = moe_file();
    l.id = load_moe(d, l.f, &l.budget);
    settle(d, l.id);
    l.before = ready_units(d, l.id);
    return l;
  }
  // After a hint or a guess of `expert`: every unit of its slices is in, and
  // nothing else came in since `before`. Returns how many of its units were
  // not in before (the reads it took).
  static uint64_t expect_only_expert_read(Daemon& d, const MoeFile& f, ModelId id, const std::set<uint32_t>& before,
                                          uint32_t expert) {
    const std::set<uint32_t> mine = moe_units(f, expert);
    const std::set<uint32_t> after = ready_units(d, id);
    for (uint32_t u : mine) EXPECT_TRUE(after.contains(u)) << "unit " << u << " of expert " << expert << " is not in";
    for (uint32_t u : after) EXPECT_TRUE(before.contains(u) || mine.contains(u)) << "unit " << u << " was not asked for";
    uint64_t fresh = 0;
    for (uint32_t u : mine) fresh += before.contains(u) ? 0U : 1U;
    return fresh;
  }

  // A client reads `expert`'s three slices: the file's bytes, and its
  // touches read nothing (every unit was in).
  static void expect_expert_read_without_reads(Daemon& d, const MoeFile& f, ModelId id, uint32_t expert) {
    const auto reads_before = d.pager->read_order(id).size();
    std::string ranges;
    for (uint32_t t = 0; t < 3; ++t)
      ranges += (t ? "," : "") + std::to_string(f.at(t, expert, 0)) + "-" + std::to_string(f.at(t, expert, f.slice));
    Child c = spawn("range:" + ranges);
    ASSERT_TRUE(attach(d, id, c, 1));
    const int cst = wait_child(&d, c.pid);
    EXPECT_TRUE(WIFEXITED(cst) && WEXITSTATUS(cst) == 0) << describe(cst);
    EXPECT_EQ(d.pager->read_order(id).size(), reads_before) << "a touch read a unit again";
  }
};

INSTANTIATE_TEST_SUITE_P(Modes, MoeStreamTest,
                         ::testing::Values(Backing::Hugetlbfs, Backing::Shmem, Backing::ShmemMemfd,
                                           Backing::ShmemExpertUnits),
                         backing_name);

// One byte of expert 1's up slice: its gate, up and down units are read
// together on that one touch (the client touched nothing else), and no
// unit that holds only another expert's bytes is. Before it, only the
// dense part was read (experts are never read ahead).
TEST_P(MoeStreamTest, TouchingOneByteOfAnExpertReadsItsThreeSlicesAndNotItsNeighbours) {
  Daemon d = make_daemon(kPoolPages, {});
  const MoeFile f = moe_file();
  uint32_t budget = 0;
  const ModelId id = load_moe(d, f, &budget);
  ASSERT_TRUE(d.pager->streamed(id));
  settle(d, id);
  const std::set<uint32_t> dense = moe_dense_units(f);
  const std::set<uint32_t> before = ready_units(d, id);
  for (uint32_t u : before) EXPECT_TRUE(dense.contains(u)) << "unit " << u << " holds only experts: read ahead";
  const std::set<uint32_t> mine = moe_units(f, 1);
  // The middle of a unit inside expert 1's up slice (on hugetlbfs a fault
  // says the unit, not the byte: a unit two experts share tells neither).
  const uint64_t inner = (f.at(1, 1, 0) + moe_unit() - 1) / moe_unit();
  ASSERT_LE((inner + 1) * moe_unit(), f.at(1, 1, f.slice));
  const uint64_t off = inner * moe_unit() + moe_unit() / 2 + 7;
  // The client stays until its expert's reads are done: the reads queued
  // for a client go with it, and at quarter units the expert has more
  // units than there are read slots.
  Child c = spawn("byte-hold:" + std::to_string(off));
  ASSERT_TRUE(attach(d, id, c, 1));
  ASSERT_TRUE(run_until(d, [&] { return ready_units(d, id).contains(static_cast<uint32_t>(inner)); }))
      << "the touched unit was not read";
  settle(d, id);
  send_go(c);
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  const std::set<uint32_t> after = ready_units(d, id);
  for (uint32_t u : mine) EXPECT_TRUE(after.contains(u)) << "unit " << u << " of expert 1 is not in";
  for (uint32_t e : {0U, 2U, 3U, 4U}) {
    for (uint32_t u : moe_units(f, e)) {
      if (!mine.contains(u) && !dense.contains(u)) {
        EXPECT_FALSE(after.contains(u)) << "unit " << u << " of expert " << e;
      }
    }
  }
  for (uint32_t u : after) EXPECT_TRUE(before.contains(u) || mine.contains(u)) << "unit " << u;
  // Its units came in one batch: every one of them was read once.
  const auto reads = d.pager->read_order(id);
  for (uint32_t u : mine) {
    if (!before.contains(u)) {
      EXPECT_EQ(std::count(reads.begin(), reads.end(), u), 1) << "unit " << u;
    }
  }
}

// Every byte right while experts come and go through a budget well under
// the model, in every mode: a lazy client (full, small-pages) and the
// touch guard's (cooperative) at once, each reading every unit in order
// (every expert, every token: the worst case); the budget holds the dense
// part and an expert for each, and the dense part is read once only.
TEST_P(MoeStreamTest, EveryByteIsTheFilesWhileExpertsComeAndGo) {
  Daemon d = make_daemon(kPoolPages, {});
  const MoeFile f = moe_file();
  uint32_t budget = 0;
  const ModelId id = load_moe(d, f, &budget, static_cast<uint32_t>(moe_units(f, 1).size()));
  std::vector<Child> cs;
  for (const char* mode : {"tokens:3", "coop-touch:3"}) cs.push_back(spawn(mode));
  ASSERT_TRUE(attach(d, id, cs[0], 1));
  ASSERT_TRUE(hand_out_touch(d, id, cs[1], 2));
  const StreamRun run = serve_streamed(d, id, {cs[0].pid, cs[1].pid});
  EXPECT_LE(run.max_held, budget);
  EXPECT_GT(run.last.stream.units_dropped, 0U) << "nothing was dropped: nothing streamed";
  EXPECT_EQ(run.last.stream.drops_refused, 0U);
  const auto reads = d.pager->read_order(id);
  for (uint32_t u : moe_dense_units(f))
    EXPECT_EQ(std::count(reads.begin(), reads.end(), u), 1) << "dense unit " << u << " was dropped and read again";
}

// A hint socket of this process (the test is the client): the pager holds
// one end, the test sends on the other.
struct HintSocket {
  sys::UniqueFd mine;
  template <class Daemon>
  static HintSocket open(Daemon& d, ModelId id, pager::ClientKey key, Status* st) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    HintSocket h;
    h.mine.reset(sv[1]);
    *st = d.pager->hints(id, key, ::getpid(), sys::UniqueFd(sv[0]));
    return h;
  }
  [[nodiscard]] bool send(const void* p, size_t n) const {
    return ::send(mine.get(), p, n, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(n);
  }
  [[nodiscard]] bool hint(uint32_t layer, std::vector<uint32_t> experts, bool predicted = false) const {
    alignas(uint32_t) std::byte buf[wire::kMaxHintBytes];
    const size_t n = wire::encode_hint(layer, experts, buf, predicted);
    return n > 0 && send(buf, n);
  }
};

// Client 9's hint socket on model `id` (the test fails where the pager
// refuses it).
template <class Daemon>
HintSocket hint_socket(Daemon& d, ModelId id) {
  Status st;
  HintSocket h = HintSocket::open(d, id, 9, &st);
  EXPECT_TRUE(st) << st.error().message;
  return h;
}

// This process as a cooperative client (Follow) of model `id` with key
// `key`: its request socket (the test's end), its open-unit bits (mapped
// here, so the test can mark units open), and its hints on that socket.
struct Follower {
  sys::UniqueFd mine;
  void* bits_map = MAP_FAILED;
  size_t bits_len = 0;
  wire::OpenedBits open_bits;
  Follower() = default;
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;
  ~Follower() {
    if (bits_map != MAP_FAILED) ::munmap(bits_map, bits_len);
  }
  template <class Daemon>
  [[nodiscard]] bool follow(Daemon& d, ModelId id, pager::ClientKey key) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return false;
    mine.reset(sv[1]);
    sys::UniqueFd theirs(sv[0]);
    const auto units = static_cast<uint32_t>(pool::pages_for(g_file_size, moe_unit()));
    bits_len = wire::opened_bytes(units);
    auto bits = sys::memfd_create_sealable("opened", bits_len);
    if (!bits.ok() || !sys::seal_size(bits->get(), "opened")) return false;
    bits_map = ::mmap(nullptr, bits_len, PROT_READ | PROT_WRITE, MAP_SHARED, bits->get(), 0);
    if (bits_map == MAP_FAILED) return false;
    open_bits = wire::OpenedBits(bits_map, units);
    auto st = d.pager->follow(id, key, ::getpid(), std::move(theirs), std::move(bits).value());
    EXPECT_TRUE(st) << st.error().message;
    return st.ok();
  }
  [[nodiscard]] bool ask(wire::RequestKind kind, uint32_t unit) const {
    const uint32_t w = wire::encode_request({kind, unit});
    return ::send(mine.get(), &w, sizeof w, MSG_DONTWAIT) == static_cast<ssize_t>(sizeof w);
  }
  [[nodiscard]] bool hint(uint32_t layer, uint32_t expert) const {
    alignas(uint32_t) std::byte buf[wire::kMaxHintBytes];
    const size_t n = wire::encode_hint(layer, std::span<const uint32_t>(&expert, 1), buf);
    return n > 0 && ::send(mine.get(), buf, n, MSG_DONTWAIT) == static_cast<ssize_t>(n);
  }
};

// A touch of one expert while another is protected (a client's hint) and
// the free room holds less than the touched expert: the touched unit is
// read (a client waits for it), its other units only into free room and in
// place of what no client protects. Neither the dense part every token
// reads nor the hinted expert makes room for them (the other units used to
// be read as urgently as the touched one, and pushed both out).
TEST_P(MoeStreamTest, ATouchedExpertsOtherUnitsNeverPushOutTheDensePart) {
  Daemon d = make_daemon(kPoolPages, {});
  const auto [f, budget, id, before] = load_settled(d);
  HintSocket h = hint_socket(d, id);
  ASSERT_TRUE(h.hint(0, {1}));
  ASSERT_TRUE(run_until(d, [&, id = id] { return stats(d, id).hints.taken == 1; }));
  settle(d, id);
  const std::set<uint32_t> mid = ready_units(d, id);
  const std::set<uint32_t> one = moe_units(f, 1), three = moe_units(f, 3);
  for (uint32_t u : one) ASSERT_TRUE(mid.contains(u)) << "unit " << u << " of expert 1 is not in";
  uint64_t fresh = 0;
  for (uint32_t u : three) {
    ASSERT_FALSE(one.contains(u)) << "the test needs experts that share no unit";
    fresh += mid.contains(u) ? 0U : 1U;
  }
  ASSERT_GT(fresh, budget - mid.size() + 1) << "expert 3 fits in the free room: nothing is tested";
  // One byte in the middle of a unit of expert 3's up slice.
  const uint64_t inner = (f.at(1, 3, 0) + moe_unit() - 1) / moe_unit();
  ASSERT_LE((inner + 1) * moe_unit(), f.at(1, 3, f.slice));
  // Attached until the reads it caused are done (they go with the client).
  Child c = spawn("byte-hold:" + std::to_string(inner * moe_unit() + moe_unit() / 2));
  ASSERT_TRUE(attach(d, id, c, 1));
  ASSERT_TRUE(run_until(d, [&, id = id] { return ready_units(d, id).contains(static_cast<uint32_t>(inner)); }))
      << "the touched unit was not read";
  settle(d, id);
  send_go(c);
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  const std::set<uint32_t> after = ready_units(d, id);
  EXPECT_TRUE(after.contains(static_cast<uint32_t>(inner))) << "the touched unit is not in";
  for (uint32_t u : before) EXPECT_TRUE(after.contains(u)) << "dense unit " << u << " was pushed out";
  for (uint32_t u : one) EXPECT_TRUE(after.contains(u)) << "unit " << u << " of the hinted expert 1 was pushed out";
  EXPECT_EQ(after.size(), budget) << "the free room was not used";
  for (uint32_t u : after) EXPECT_TRUE(mid.contains(u) || three.contains(u)) << "unit " << u << " was not asked for";
}

// A client reads the units only expert 3 holds, in each of its three
// slices: one use, counted once, and each of the expert's units read once.
// Every later touch of the same use (the slices' other units, as they come
// in or are met) counts nothing (each touch used to count a use: as many
// as the units a client faulted on, which access sampling makes a matter
// of chance).
TEST_P(MoeStreamTest, AnExpertsUseIsCountedOnceHoweverManyOfItsUnitsAreTouched) {
  Daemon d = make_daemon(kPoolPages, {});
  const auto [f, budget, id, before] = load_settled(d);
  const uint64_t uses0 = stats(d, id).stream.expert_uses;
  const auto reads0 = d.pager->read_order(id).size();
  const uint64_t unit = moe_unit();
  std::string ranges;
  for (uint32_t t = 0; t < 3; ++t) {
    const uint64_t lo = (f.at(t, 3, 0) + unit - 1) / unit * unit, hi = f.at(t, 3, f.slice) / unit * unit;
    ASSERT_LT(lo, hi) << "slice " << t << " has no unit of its own";
    ranges += (t ? "," : "") + std::to_string(lo) + "-" + std::to_string(hi);
  }
  Child c = spawn("range:" + ranges);
  ASSERT_TRUE(attach(d, id, c, 1));
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  settle(d, id);
  const auto s1 = stats(d, id);
  ASSERT_GE(s1.faults, 3U) << "the client touched too few units: nothing tested";
  EXPECT_EQ(s1.stream.expert_uses, uses0 + 1);
  const auto reads = d.pager->read_order(id);
  ASSERT_GT(reads.size(), reads0) << "expert 3 was in before: nothing tested";
  for (uint32_t u : moe_units(f, 3))
    EXPECT_EQ(std::count(reads.begin(), reads.end(), u), before.contains(u) ? 0 : 1) << "unit " << u;
}

// A cooperative client asks again for a unit it waits for (its touch
// guard at each change of the status page, since the unit may be read and
// dropped before it opens it; its range waits at each look): the same
// wait, not another fault or expert use, and no second read of a unit in
// or on its way. Its asks for a unit only expert 3 holds, one before the
// read and one after, count one fault and one use, and read the unit once.
TEST_P(MoeStreamTest, AnAskRepeatedWhileTheClientWaitsIsNotAnotherTouch) {
  Daemon d = make_daemon(kPoolPages, {});
  const auto [f, budget, id, before] = load_settled(d);
  Follower c;
  ASSERT_TRUE(c.follow(d, id, 5));
  const auto inner = [&file = f](uint32_t e) {
    const uint64_t u = (file.at(1, e, 0) + moe_unit() - 1) / moe_unit();
    EXPECT_LE((u + 1) * moe_unit(), file.at(1, e, file.slice)) << "expert " << e << " has no unit of its own";
    return static_cast<uint32_t>(u);
  };
  const uint32_t u = inner(3), v = inner(5);
  ASSERT_FALSE(before.contains(u) || before.contains(v)) << "the units were in: nothing tested";
  const auto s0 = stats(d, id);
  const auto reads0 = d.pager->read_order(id).size();
  ASSERT_TRUE(c.ask(wire::RequestKind::Wait, u));
  ASSERT_TRUE(c.ask(wire::RequestKind::Wait, u));  // read with the first: the unit is not in yet
  ASSERT_TRUE(run_until(d, [&, id = id] { return ready_units(d, id).contains(u); })) << "the unit was not read";
  ASSERT_TRUE(c.ask(wire::RequestKind::Wait, u));
  // One socket, read in order: once the ask for expert 5's unit counted,
  // every ask before it was taken.
  ASSERT_TRUE(c.ask(wire::RequestKind::Wait, v));
  ASSERT_TRUE(run_until(d, [&, id = id] { return stats(d, id).faults >= s0.faults + 2; }));
  settle(d, id);
  const auto s1 = stats(d, id);
  EXPECT_EQ(s1.faults, s0.faults + 2) << "a repeated ask counted as a fault";
  EXPECT_EQ(s1.faults_waited, s0.faults_waited + 2);
  EXPECT_EQ(s1.stream.expert_uses, s0.stream.expert_uses + 2) << "a repeated ask counted as a use";
  const auto reads = d.pager->read_order(id);
  EXPECT_EQ(std::count(reads.begin() + static_cast<long>(reads0), reads.end(), u), 1) << "unit " << u;
  EXPECT_EQ(std::count(reads.begin() + static_cast<long>(reads0), reads.end(), v), 1) << "unit " << v;
}

// An expert hint, before any touch: the hinted expert's three slices are
// read (and nothing only a neighbour holds), the cache counts the use; then
// a client reads the slices byte for byte, the file's bytes, and nothing is
// read again for its touches.
TEST_P(MoeStreamTest, AHintReadsTheExpertsSlicesBeforeAnyTouch) {
  Daemon d = make_daemon(kPoolPages, {});
  const auto [f, budget, id, before] = load_settled(d);
  const uint64_t uses0 = stats(d, id).stream.expert_uses;
  HintSocket h = hint_socket(d, id);
  ASSERT_TRUE(h.hint(0, {3}));
  ASSERT_TRUE(run_until(d, [&, id = id] { return stats(d, id).hints.taken == 1; })) << "the hint was not taken";
  settle(d, id);
  const uint64_t fresh = expect_only_expert_read(d, f, id, before, 3);
  const auto s1 = stats(d, id);
  EXPECT_EQ(s1.stream.expert_uses, uses0 + 1) << "the hint is a use the cache counts";
  EXPECT_EQ(s1.stream.hinted_units_read, fresh);
  EXPECT_EQ(s1.hints.refused, 0U);
  expect_expert_read_without_reads(d, f, id, 3);
  const auto reads = d.pager->read_order(id);
  for (uint32_t u : moe_units(f, 3))
    EXPECT_EQ(std::count(reads.begin(), reads.end(), u), before.contains(u) ? 0 : 1) << u;
}

// A prediction (a guess at what a later layer reads): the expert's three
// slices are read ahead as for a hint, but the cache counts no use of a
// guess; a hint of the same expert then reads nothing again, and the
// client reads the file's bytes without a read for its touches.
TEST_P(MoeStreamTest, APredictionReadsTheExpertAheadAndCountsNoUse) {
  Daemon d = make_daemon(kPoolPages, {});
  const auto [f, budget, id, before] = load_settled(d);
  const uint64_t uses0 = stats(d, id).stream.expert_uses;
  HintSocket h = hint_socket(d, id);
  ASSERT_TRUE(h.hint(0, {4}, true));
  ASSERT_TRUE(run_until(d, [&, id = id] { return stats(d, id).hints.taken == 1; })) << "the prediction was not taken";
  settle(d, id);
  const uint64_t fresh = expect_only_expert_read(d, f, id, before, 4);
  const auto s1 = stats(d, id);
  EXPECT_EQ(s1.hints.predictions, 1U);
  EXPECT_EQ(s1.stream.expert_uses, uses0) << "a guess is not a use";
  ASSERT_GT(fresh, 0U) << "the expert was in before the prediction: nothing tested";
  EXPECT_EQ(s1.stream.predicted_units_read, fresh);
  EXPECT_EQ(s1.stream.hinted_units_read, 0U);
  // The hint that follows the guess: a use, and no read.
  const auto reads_before = d.pager->read_order(id).size();
  ASSERT_TRUE(h.hint(0, {4}));
  ASSERT_TRUE(run_until(d, [&, id = id] { return stats(d, id).hints.taken == 2; }));
  settle(d, id);
  EXPECT_EQ(stats(d, id).stream.expert_uses, uses0 + 1);
  EXPECT_EQ(d.pager->read_order(id).size(), reads_before) << "the hinted expert was read again";
  expect_expert_read_without_reads(d, f, id, 4);
}

// Hints that are not hints, or name what the model does not have, are
// ignored and counted, read nothing, and the daemon goes on: a flood of
// them ends (the loop is not held), and a client then reads every byte
// right. Hints for a model without experts, or one that fits, are refused
// at the door.
TEST_P(MoeStreamTest, HostileHintsAreIgnoredAndReadNothing) {
  Daemon d = make_daemon(kPoolPages, {});
  const auto [f, budget, id, before] = load_settled(d);
  const auto reads0 = d.pager->read_order(id).size();
  Status st;
  HintSocket h = HintSocket::open(d, id, 9, &st);
  ASSERT_TRUE(st) << st.error().message;
  uint64_t bad = 0;
  const uint32_t word = wire::encode_request({wire::RequestKind::Wait, 3});
  EXPECT_TRUE(h.send(&word, sizeof word)) << "a request word on a hint socket";
  EXPECT_TRUE(h.send(&word, 3));
  const uint32_t magic_wrong[4] = {0xdeadbeef, 0, 1, 1};
  EXPECT_TRUE(h.send(magic_wrong, sizeof magic_wrong));
  const uint32_t count_wrong[5] = {wire::kHintMagic, 0, 3, 1, 2};
  EXPECT_TRUE(h.send(count_wrong, sizeof count_wrong));
  std::vector<uint32_t> too_long(wire::kMaxHintBytes / 4 + 64, wire::kHintMagic);
  EXPECT_TRUE(h.send(too_long.data(), too_long.size() * 4));
  bad += 5;
  EXPECT_TRUE(h.hint(1, {0})) << "a layer without experts";
  EXPECT_TRUE(h.hint(UINT32_MAX, {0}));
  EXPECT_TRUE(h.hint(0, {kMoeExperts}));
  EXPECT_TRUE(h.hint(0, {UINT32_MAX}));
  EXPECT_TRUE(h.hint(0, {2, 2}));
  EXPECT_TRUE(h.hint(0, {1, kMoeExperts})) << "one good expert does not make a bad hint good";
  EXPECT_TRUE(h.hint(0, {kMoeExperts}, true)) << "a prediction is checked as a hint is";
  EXPECT_TRUE(h.hint(1, {0}, true));
  bad += 8;
  ASSERT_TRUE(run_until(d, [&, id = id] { return stats(d, id).hints.refused == bad; })) << stats(d, id).hints.refused;
  settle(d, id);
  EXPECT_EQ(stats(d, id).hints.taken, 0U);
  EXPECT_EQ(ready_units(d, id), before) << "a refused hint read something";
  EXPECT_EQ(d.pager->read_order(id).size(), reads0);
  // A flood: as many good hints as the socket takes, every expert in turn
  // (each names what the budget cannot all hold), and bad ones between.
  uint64_t good = 0;
  for (uint32_t i = 0;; ++i) {
    if (i % 2 == 0 ? !h.hint(0, {i / 2 % kMoeExperts}) : !h.send(&word, sizeof word)) break;
    (i % 2 == 0 ? good : bad) += 1;
  }
  ASSERT_GT(good, 50U) << "the socket took too few to flood";
  ASSERT_TRUE(run_until(d, [&, id = id] {
    const auto s = stats(d, id);
    return s.hints.taken == good && s.hints.refused == bad;
  }, 60s)) << "the flood was not all read";
  // The daemon goes on: every byte of the model, read by a client, is
  // the file's, and the budget held.
  Child c = spawn("tokens:1");
  ASSERT_TRUE(attach(d, id, c, 1));
  const StreamRun run = serve_streamed(d, id, {c.pid});
  EXPECT_LE(run.max_held, budget);
  // A model without experts, and one that fits, take no hints.
  const ModelId dense = load(d, g_src, "dense", {}, false, kStreamBudget * g_unit);
  HintSocket h2 = HintSocket::open(d, dense, 10, &st);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ENOTSUP) << st.error().message;
  ASSERT_TRUE(d.pager->unload(dense));
  ASSERT_TRUE(d.pager->unload(id));
  ASSERT_TRUE(d.pager->finish_drains(std::chrono::steady_clock::now() + 30s));
  const ModelId fits = load(d, g_src, "fits");
  HintSocket h3 = HintSocket::open(d, fits, 11, &st);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ENOTSUP) << st.error().message;
}

// A cooperative client sends its hints on its request socket (Follow),
// between its request words: taken the same.
TEST_P(MoeStreamTest, ACooperativeClientHintsOnItsRequestSocket) {
  Daemon d = make_daemon(kPoolPages, {});
  const MoeFile f = moe_file();
  uint32_t budget = 0;
  const ModelId id = load_moe(d, f, &budget);
  settle(d, id);
  const std::set<uint32_t> before = ready_units(d, id);
  Follower c;
  ASSERT_TRUE(c.follow(d, id, 5));
  ASSERT_TRUE(c.hint(0, 2));
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).hints.taken == 1; }));
  settle(d, id);
  const std::set<uint32_t> after = ready_units(d, id);
  for (uint32_t u : moe_units(f, 2)) EXPECT_TRUE(after.contains(u)) << "unit " << u;
  for (uint32_t u : after) EXPECT_TRUE(before.contains(u) || moe_units(f, 2).contains(u)) << "unit " << u;
}

// Making room for a hinted read can drop the client that hinted: a unit
// to drop is open in that client, and its socket takes no message (it shut
// its reading side: the daemon's send fails at once, and nothing tells it
// before). The client's queued reads go with it; the pump reads none of
// them (it used to take the front of the emptied queue). Reads into free
// room came first: exactly those of the client's units were read.
TEST_P(MoeStreamTest, AClientDroppedWhileRoomIsMadeTakesItsQueuedReadsWithIt) {
  Daemon d = make_daemon(kPoolPages, {});
  const auto [f, budget, id, before] = load_settled(d);
  Follower c;
  ASSERT_TRUE(c.follow(d, id, 5));
  // Expert 0 in, and open in the client.
  ASSERT_TRUE(c.hint(0, 0));
  ASSERT_TRUE(run_until(d, [&, id = id] { return stats(d, id).hints.taken == 1; }));
  settle(d, id);
  const std::set<uint32_t> dense = moe_dense_units(f);
  for (uint32_t u : moe_units(f, 0)) {
    ASSERT_TRUE(ready_units(d, id).contains(u)) << "unit " << u << " of expert 0 is not in";
    if (!dense.contains(u)) c.open_bits.set(u);
  }
  const std::set<uint32_t> mid = ready_units(d, id);
  ASSERT_LT(mid.size(), budget);
  const uint64_t room = budget - mid.size();
  const std::set<uint32_t> three = moe_units(f, 3);
  uint64_t fresh = 0;
  for (uint32_t u : three) fresh += mid.contains(u) ? 0U : 1U;
  ASSERT_GT(fresh, room) << "expert 3 fits in the free room: nothing has to be dropped";
  // Expert 3 next: expert 0 is no longer protected, and making room for
  // expert 3 past the free room drops one of its units, open in the client.
  ASSERT_EQ(::shutdown(c.mine.get(), SHUT_RD), 0);
  const auto reads0 = d.pager->read_order(id).size();
  ASSERT_TRUE(c.hint(0, 3));
  ASSERT_TRUE(run_until(d, [&, id = id] { return stats(d, id).clients == 0; })) << "the client was not dropped";
  settle(d, id);
  const auto reads = d.pager->read_order(id);
  ASSERT_GE(reads.size(), reads0);
  std::vector<uint32_t> after(reads.begin() + static_cast<long>(reads0), reads.end());
  EXPECT_EQ(after.size(), room) << "reads after the drop of the client whose hint queued them";
  for (uint32_t u : after) EXPECT_TRUE(three.contains(u) && !mid.contains(u)) << "unit " << u << " was not asked for";
}

TEST_P(PagerModeTest, ABudgetCutDropsUnitsAndGivesThePagesBack) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src, "m", {}, false, kStreamBudget * g_unit);
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).units_ready == kStreamBudget; }))
      << "the warm-up did not fill the budget";
  const uint64_t free0 = d.pool->counts().free_pages;
  const uint64_t floor = d.pager->floor_bytes(id) / g_unit;
  ASSERT_LT(floor, kStreamBudget);
  auto below = d.pager->set_budget(id, (floor - 1) * g_unit);
  ASSERT_FALSE(below);
  EXPECT_EQ(below.error().code, EINVAL) << below.error().message;
  auto cut = d.pager->set_budget(id, floor * g_unit);
  ASSERT_TRUE(cut) << cut.error().message;
  ASSERT_TRUE(d.pager->finish_drains(std::chrono::steady_clock::now() + 30s));
  EXPECT_EQ(d.pool->counts().free_pages, free0 + kStreamBudget - floor);
  EXPECT_LE(stats(d, id).units_ready, floor);
  EXPECT_EQ(stats(d, id).stream.budget_units, floor);
  // The model still streams right through its smaller budget.
  Child c = spawn("tokens:1");
  ASSERT_TRUE(attach(d, id, c, 1));
  const StreamRun run = serve_streamed(d, id, {c.pid});
  EXPECT_LE(run.max_held, floor);
}

// A budget cut while the warm-up's reads are in flight, and no client:
// their units hold pages of the budget and cannot be dropped before they
// land, so the cut waits for them, and ends once they landed, with the
// pages back in the pool. It used to wait for a read that some client
// asked for: for ever on a model nobody read (the pages kept, and the
// daemon's restore of the budget waiting for the cut to end).
TEST_P(PagerModeTest, ABudgetCutWhileReadsAreInFlightEndsOnceTheyLanded) {
  Daemon d = make_daemon(kPoolPages, {});
  const uint64_t free0 = d.pool->counts().free_pages;
  const ModelId id = load(d, g_src, "m", {}, false, kStreamBudget * g_unit);
  ASSERT_GT(stats(d, id).units_in_flight, 0U) << "no read in flight: nothing tested";
  const uint64_t floor = d.pager->floor_bytes(id) / g_unit;
  ASSERT_LT(floor, kStreamBudget);
  auto cut = d.pager->set_budget(id, floor * g_unit);
  ASSERT_TRUE(cut) << cut.error().message;
  ASSERT_EQ(*cut, pager::Pager::Drain::Pending) << "the cut waited for nothing: nothing tested";
  ASSERT_TRUE(run_until(d, [&] { return !d.pager->budget_cut_pending(id); })) << "the cut never ended";
  const auto s = stats(d, id);
  EXPECT_EQ(s.stream.budget_units, floor);
  EXPECT_LE(s.units_ready + s.units_in_flight, floor);
  EXPECT_EQ(d.pool->counts().free_pages, free0 - floor) << "the pages of the cut are not back in the pool";
}

// A budget cut while reads are in flight, every unit open in a cooperative
// client (the test), so each drop waits for the client's Closed: the cut
// asks for the closes it needs, and the model never holds fewer units than
// its new budget. The units still closing count as going: the cut goes on
// at every event (reads landing, closes, refusals), and counted as held
// they made it start another drop at each, past its budget. (The read-ahead
// may swap a unit for one needed sooner meanwhile: one drop, one read.)
TEST_P(PagerModeTest, ABudgetCutDropsOnlyWhatItMustWhileAClientClosesUnits) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src, "m", {}, false, kStreamBudget * g_unit);
  Follower c;
  ASSERT_TRUE(c.follow(d, id, 5));
  const auto units = static_cast<uint32_t>(pool::pages_for(g_file_size, g_unit));
  for (uint32_t u = 0; u < units; ++u) c.open_bits.set(u);
  const auto s0 = stats(d, id);
  ASSERT_GT(s0.units_in_flight, 0U) << "no read in flight: nothing tested";
  const uint32_t held0 = s0.units_ready + s0.units_in_flight;
  const uint64_t floor = d.pager->floor_bytes(id) / g_unit;
  ASSERT_LT(floor, held0);
  auto cut = d.pager->set_budget(id, floor * g_unit);
  ASSERT_TRUE(cut) << cut.error().message;
  ASSERT_EQ(*cut, pager::Pager::Drain::Pending);
  uint64_t asked = 0, least_held = held0;
  ASSERT_TRUE(run_until(d, [&] {
    const auto s = stats(d, id);
    least_held = std::min<uint64_t>(least_held, s.units_ready + s.units_in_flight);
    uint32_t w = 0;
    while (::recv(c.mine.get(), &w, sizeof w, MSG_DONTWAIT) == static_cast<ssize_t>(sizeof w))
      if (const auto q = wire::decode_request(w); q.kind == wire::RequestKind::Close) {
        ++asked;
        c.open_bits.clear(q.unit);
        EXPECT_TRUE(c.ask(wire::RequestKind::Closed, q.unit));
      }
    return !d.pager->budget_cut_pending(id);
  })) << "the cut never ended";
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).units_in_flight == 0; }));
  const auto s = stats(d, id);
  EXPECT_GE(asked, held0 - floor) << "units asked to close";
  EXPECT_GE(least_held, floor) << "the cut dropped past its budget";
  EXPECT_EQ(s.units_ready, floor);
  EXPECT_EQ(s.stream.units_dropped - s0.stream.units_dropped, asked) << "a unit asked to close was not dropped";
}

TEST_P(PagerModeTest, AReadErrorWhileStreamingGivesSigbusNotZeros) {
  // The file shrinks under the daemon: the units past its new end cannot
  // be read; a client that comes to them gets SIGBUS. It compares with the
  // intact source, so right bytes before that point are checked too.
  const std::string copy = g_src + ".shrink";
  write_source(copy, g_file_size);
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, copy, "m", {}, false, kStreamBudget * g_unit);
  ASSERT_EQ(::truncate(copy.c_str(), static_cast<off_t>(20 * g_unit)), 0);
  Child c = spawn("tokens:1", g_src);
  ASSERT_TRUE(attach(d, id, c, 1));
  const int st = wait_child(&d, c.pid);
  ::unlink(copy.c_str());
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) << describe(st) << " (exit 3: wrong bytes)";
}

TEST_F(PagerTest, DirectIoSettingIsObeyed) {
  const std::pair<pager::DirectIo, bool> cases[] = {
      {pager::DirectIo::Off, false}, {pager::DirectIo::On, true}, {pager::DirectIo::Auto, true}};
  for (const auto& [setting, direct] : cases) {
    PagerOptions o;
    o.direct_io = setting;
    Daemon d = make_daemon(kPoolPages, o);
    const ModelId id = load(d, g_src);
    EXPECT_EQ(stats(d, id).direct_io, direct) << "setting " << static_cast<int>(setting);
    Child c = spawn("seq");
    ASSERT_TRUE(attach(d, id, c, 1));
    const int st = wait_child(&d, c.pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
    EXPECT_EQ(stats(d, id).bytes_read, g_file_size);
  }
}

// Unload right after the load, while the first read and the populates of
// the next units (allocated ahead) are in the kernel. Ordered on events,
// not on a pause: finish_drains returns once every read and populate of the
// model completed (the ring's completions), and only then is the pool
// checked, against the kernel's count too: nothing a late populate could
// leave behind. Then the pool is whole: the model loads again and a client
// reads the file's bytes.
TEST_P(PagerModeTest, UnloadWhileAllocatingAheadLeavesNoPage) {
  PagerOptions o;
  o.queue_depth = 1;
  o.allocate_ahead = 16;
  o.copy_fill = false;  // a copy fill allocates nothing ahead
  Daemon d = make_daemon(kPoolPages, o);
  const auto counts0 = d.pool->counts();
  auto kv0 = d.pool->kernel_view();
  ASSERT_TRUE(kv0.ok());
  const ModelId id = load(d, g_src);
  auto un = d.pager->unload(id);
  ASSERT_TRUE(un) << un.error().message;
  ASSERT_TRUE(d.pager->finish_drains(std::chrono::steady_clock::now() + 60s)) << "a read or populate never completed";
  EXPECT_FALSE(d.pager->draining(id));
  EXPECT_EQ(d.pager->returning_pages(), 0U);
  expect_pool_as(d, counts0, *kv0);
  const ModelId again = load(d, g_src);
  Child c = spawn("random:3");
  ASSERT_TRUE(attach(d, again, c, 1));
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  ASSERT_TRUE(d.pager->unload(again));
  expect_pool_as(d, counts0, *kv0);
}

// Unload while the model's O_DIRECT reads are held in the block device (a
// blkio throttle at 4 KiB/s until the test lifts it: events are ordered, no
// time is measured). The unload returns at once and revokes at once: the
// model's client gets SIGBUS, never zeros, while its reads are still in the
// device. The truncation does not wait for them (docs/retire.md): they
// write pages that no file or mapping holds any more. Meanwhile the loop
// fills and serves another model, and the pool counts the unloaded pages
// free only once the reads landed: a load that needs them fails before and
// succeeds after, with its own bytes.
TEST_P(PagerModeTest, UnloadDoesNotWaitForReadsInTheDevice) {
  if (g_cooperative) GTEST_SKIP() << "userfaultfd modes only";
  const uint64_t a_pages = pool::pages_for(g_file_size, g_unit);
  // B: a small model on tmpfs (memory: no block device, never throttled).
  const std::string b_src = "/dev/shm/airs-pager-b-" + std::to_string(::getpid()) + ".bin";
  const uint64_t b_size = 3 * g_unit + 777;
  write_source(b_src, b_size, 1 << 20);
  // C: as large as A, other bytes, on A's device (read after the drain).
  const std::string c_src = g_src + ".other";
  write_source(c_src, g_file_size, 1 << 21);
  struct Cleanup {
    std::string b, c;
    ~Cleanup() {
      ::unlink(b.c_str());
      ::unlink(c.c_str());
    }
  } cleanup{b_src, c_src};
  const uint64_t b_pages = pool::pages_for(b_size, g_unit);
  PagerOptions o;
  o.background_warmup = false;  // A reads only what its client faults on (and the window)
  Daemon d = make_daemon(a_pages + b_pages, o);
  std::vector<std::pair<ModelId, pager::Pager::Drained>> drained;
  d.pager->set_drain_listener([&](ModelId id, pager::Pager::Drained how) { drained.emplace_back(id, how); });
  const auto counts0 = d.pool->counts();
  auto kv0 = d.pool->kernel_view();
  ASSERT_TRUE(kv0.ok());

  HeldReads held(g_src);
  if (!held.throttle.available()) GTEST_SKIP() << "cannot hold reads in the device: " << held.throttle.why();
  Child ca = spawn("touch:0");
  Child cb = spawn("seq", b_src);
  Child cc = spawn("seq", c_src);
  ASSERT_TRUE(held.start());

  const ModelId a = load(d, g_src, "a");
  if (!stats(d, a).direct_io) GTEST_SKIP() << g_src << " takes no O_DIRECT: its reads would come from the page cache";
  ASSERT_TRUE(attach(d, a, ca, 1));
  // Its fault on unit 0 sent reads into the device, where they stay.
  ASSERT_TRUE(run_until(d, [&] { return stats(d, a).faults_waited >= 1 && stats(d, a).units_in_flight >= 1; }));

  auto un = d.pager->unload(a);
  ASSERT_TRUE(un) << un.error().message;
  EXPECT_EQ(*un, pager::Pager::Drain::Pending) << "the unload waited for the reads";
  EXPECT_TRUE(d.pager->draining(a));
  EXPECT_FALSE(d.pager->stats(a).ok()) << "the unloaded model is still in the table";
  EXPECT_EQ(d.pager->region_fd(a), -1);
  EXPECT_EQ(d.pager->returning_pages(), a_pages);
  EXPECT_EQ(d.pool->counts().model_pages, a_pages) << "pages counted free while reads still write them";
  EXPECT_EQ(d.pool->counts().free_pages, counts0.free_pages - a_pages);

  // A's client, blocked in its fault, ends in SIGBUS while the reads are held.
  const int ast = wait_child(&d, ca.pid);
  EXPECT_TRUE(WIFSIGNALED(ast) && WTERMSIG(ast) == SIGBUS) << "expected SIGBUS, got " << describe(ast);
  EXPECT_TRUE(d.pager->draining(a));

  // The loop fills B and serves its client's faults meanwhile.
  sys::UniqueFd bfd(::open(b_src.c_str(), O_RDONLY | O_CLOEXEC));
  auto b = d.pager->load(spec_of("b", std::move(bfd), b_size, {{0, b_size, 0}}));
  ASSERT_TRUE(b.ok()) << b.error().message;
  ASSERT_TRUE(attach(d, *b, cb, 2, b_size));
  const int bst = wait_child(&d, cb.pid);
  EXPECT_TRUE(WIFEXITED(bst) && WEXITSTATUS(bst) == 0) << describe(bst);
  EXPECT_GE(stats(d, *b).faults, 1U);
  EXPECT_TRUE(d.pager->draining(a)) << "A's reads landed before the throttle was lifted: nothing was proven";
  EXPECT_TRUE(drained.empty());

  // C needs A's pages: not before they are back.
  sys::UniqueFd cfd(::open(c_src.c_str(), O_RDONLY | O_CLOEXEC));
  auto early = d.pager->load(spec_of("c", std::move(cfd), g_file_size, g_extents));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().code, ENOSPC) << early.error().message;

  ASSERT_TRUE(held.release());
  ASSERT_TRUE(run_until(d, [&] { return !drained.empty(); }));
  ASSERT_EQ(drained.size(), 1U);
  EXPECT_EQ(drained[0].first, a);
  EXPECT_EQ(drained[0].second, pager::Pager::Drained::Unloaded);
  EXPECT_FALSE(d.pager->draining(a));
  EXPECT_EQ(d.pager->returning_pages(), 0U);
  EXPECT_EQ(d.pool->counts().free_pages, counts0.free_pages - b_pages) << "A's pages did not all come back";
  EXPECT_EQ(d.pool->counts().model_pages, b_pages);

  sys::UniqueFd cfd2(::open(c_src.c_str(), O_RDONLY | O_CLOEXEC));
  auto c = d.pager->load(spec_of("c", std::move(cfd2), g_file_size, g_extents));
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_TRUE(attach(d, *c, cc, 3));
  const int cst = wait_child(&d, cc.pid);
  EXPECT_TRUE(WIFEXITED(cst) && WEXITSTATUS(cst) == 0) << "C's client saw other bytes than C's: " << describe(cst);

  for (ModelId id : {*b, *c}) ASSERT_TRUE(d.pager->unload(id));
  expect_pool_as(d, counts0, *kv0);
}

// Evict while reads are held in the device: it returns at once, the pages
// stay counted until the reads landed, then the region is punched. A fault
// on the model meanwhile gives the eviction up instead (the fill goes on).
TEST_F(PagerTest, PoolTooSmallGivesAClearErrorAndLeavesNothing) {
  Daemon d = make_daemon(8, {});
  const auto counts0 = d.pool->counts();
  auto kv0 = d.pool->kernel_view();
  ASSERT_TRUE(kv0.ok());
  sys::UniqueFd fd(::open(g_src.c_str(), O_RDONLY | O_CLOEXEC));
  auto id = d.pager->load(spec_of("big", std::move(fd), g_file_size, g_extents));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.error().code, ENOSPC);
  EXPECT_NE(id.error().message.find("pool exhausted"), std::string::npos) << id.error().message;
  EXPECT_NE(id.error().message.find("'big'"), std::string::npos) << id.error().message;
  EXPECT_EQ(d.pool->counts(), counts0);
  auto kv1 = d.pool->kernel_view();
  ASSERT_TRUE(kv1.ok());
  EXPECT_EQ(kv1->files_pages, kv0->files_pages);
  EXPECT_EQ(kv1->free, kv0->free);
  EXPECT_EQ(kv1->reserved, kv0->reserved);
  EXPECT_TRUE(d.pager->models().empty());
}

TEST_F(PagerTest, PoolThatCannotBeHadSaysHowToFixIt) {
  const uint64_t nr0 = read_sys("nr_hugepages");
  const uint64_t free0 = read_sys("free_hugepages");
  auto backend = pool::HugetlbfsBackend::create({});
  ASSERT_TRUE(backend.ok());
  const uint64_t pages = free0 + 1000000;  // more than the machine has
  auto p = pool::Pool::create(std::move(backend).value(), {pages * g_unit, false});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code, ENOMEM);
  const std::string want_nr = "vm.nr_hugepages=" + std::to_string(nr0 + pages - (free0 - read_sys("resv_hugepages")));
  EXPECT_NE(p.error().message.find("sysctl -w " + want_nr), std::string::npos) << p.error().message;
  EXPECT_NE(p.error().message.find("hugepages="), std::string::npos) << p.error().message;
  EXPECT_NE(p.error().message.find("cmdline.txt"), std::string::npos) << p.error().message;
  EXPECT_EQ(read_sys("nr_hugepages"), nr0);
  EXPECT_EQ(read_sys("free_hugepages"), free0);
}

// The pool's counts against the kernel's: st_blocks of our files and the
// statfs of a private mount (exact); the global HugePages_* counters are
// shared with every process on the machine and only printed.
TEST_F(PagerTest, AccountingAgreesWithTheKernel) {
  TempMount mnt(kPoolPages + 8);
  ASSERT_FALSE(mnt.dir.empty()) << "cannot mount hugetlbfs";
  PagerOptions o;
  o.background_warmup = false;
  std::optional<Daemon> dd(make_daemon_on(mnt.dir, kPoolPages, o));
  Daemon& d = *dd;
  const auto c0 = d.pool->counts();
  EXPECT_EQ(c0.total_pages(), kPoolPages);
  EXPECT_EQ(c0.free_pages, kPoolPages);
  auto kv = d.pool->kernel_view();
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->files_pages, kPoolPages);  // pre-touched
  ASSERT_TRUE(kv->mount.has_value());
  EXPECT_EQ(mnt.used_pages(), kPoolPages);
  const ModelId id = load(d, g_src);
  const uint64_t m = pool::pages_for(g_file_size, g_unit);
  EXPECT_EQ(d.pool->counts().model_pages, m);
  EXPECT_EQ(d.pool->counts().free_pages, kPoolPages - m);
  kv = d.pool->kernel_view();
  ASSERT_TRUE(kv.ok());
  // Reserved but not filled: the pages left the reserve file, the mount
  // still counts them (reservation).
  EXPECT_EQ(kv->files_pages, kPoolPages - m);
  EXPECT_EQ(mnt.used_pages(), kPoolPages);
  Child c = spawn("seq");
  ASSERT_TRUE(attach(d, id, c, 1));
  const int st = wait_child(&d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  kv = d.pool->kernel_view();
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->files_pages, kPoolPages);
  EXPECT_EQ(mnt.used_pages(), kPoolPages);
  std::printf("kernel: HugePages total %lu free %lu rsvd %lu surp %lu; ours %lu in files\n",
              static_cast<unsigned long>(kv->total), static_cast<unsigned long>(kv->free),
              static_cast<unsigned long>(kv->reserved), static_cast<unsigned long>(kv->surplus),
              static_cast<unsigned long>(kv->files_pages));
  // Unload: pages back into the reserve file.
  ASSERT_TRUE(run_until(d, [&] { return stats(d, id).clients == 0; }, 5s));
  ASSERT_TRUE(d.pager->unload(id));
  ASSERT_TRUE(d.pager->finish_drains(std::chrono::steady_clock::now() + 30s));
  EXPECT_EQ(d.pool->counts(), c0);
  EXPECT_EQ(d.pool->kernel_view()->files_pages, kPoolPages);
  EXPECT_EQ(mnt.used_pages(), kPoolPages);
  // Shrink gives pages back to the kernel, grow takes them again.
  auto took = d.pool->shrink(4);
  ASSERT_TRUE(took.ok()) << took.error().message;
  EXPECT_EQ(*took, 4U);
  EXPECT_EQ(d.pool->counts().total_pages(), kPoolPages - 4);
  EXPECT_EQ(mnt.used_pages(), kPoolPages - 4);
  auto grew = d.pool->grow(4);
  ASSERT_TRUE(grew.ok()) << grew.error().message;
  EXPECT_EQ(*grew, 4U);
  EXPECT_EQ(d.pool->counts().total_pages(), kPoolPages);
  EXPECT_EQ(d.pool->kernel_view()->files_pages, kPoolPages);
  EXPECT_EQ(mnt.used_pages(), kPoolPages);
  dd.reset();
  EXPECT_EQ(mnt.used_pages(), 0U) << "pages left behind after the daemon's pool went away";
}

TEST_F(PagerTest, PoolOnAHugetlbfsMountAgreesWithStatfs) {
  char dir[] = "/tmp/airs-hugetlbfs-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string opts = "pagesize=" + std::to_string(g_unit / 1024) + "K,size=" + std::to_string(16 * g_unit);
  ASSERT_EQ(::mount("none", dir, "hugetlbfs", 0, opts.c_str()), 0) << std::strerror(errno);
  {
    pool::HugetlbfsOptions ho;
    ho.mount_path = dir;
    auto backend = pool::HugetlbfsBackend::create(ho);
    ASSERT_TRUE(backend.ok()) << backend.error().message;
    EXPECT_EQ((*backend)->mount(), dir);
    auto p = pool::Pool::create(std::move(backend).value(), {12 * g_unit, false});
    ASSERT_TRUE(p.ok()) << p.error().message;
    auto region = (*p)->create_model_region("on-mount", 3 * g_unit + 1);
    ASSERT_TRUE(region.ok()) << region.error().message;
    // Fill two pages through the daemon mapping.
    std::memset((*region)->data(), 0x5a, 2 * g_unit);
    auto kv = (*p)->kernel_view();
    ASSERT_TRUE(kv.ok());
    ASSERT_TRUE(kv->mount.has_value()) << "statfs of a size= mount must report blocks";
    const uint64_t used = kv->mount->blocks - kv->mount->blocks_free;
    // statfs counts pages in files plus reservations of the mount's subpool.
    EXPECT_EQ(kv->files_pages, 12U - 4U + 2U);
    EXPECT_EQ(used, 12U) << "the mount's statfs disagrees with the pool's 12 pages";
    EXPECT_EQ((*p)->counts().total_pages(), 12U);
    EXPECT_EQ((*p)->counts().model_pages, 4U);
    // Nothing is visible on the mount: files are unlinked from the start.
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()), 0);
    region->reset();
    EXPECT_EQ((*p)->counts().free_pages, 12U);
  }
  ASSERT_EQ(::umount(dir), 0) << std::strerror(errno);
  ::rmdir(dir);
}

TEST_P(PagerModeTest, KillDashNineOfTheDaemonMidLoad) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const bool on_shmem = shmem();
  TempMount mnt(on_shmem ? 0 : kPoolPages + 8);
  ASSERT_TRUE(on_shmem || !mnt.dir.empty()) << "cannot mount hugetlbfs";
  // The daemon: fault-driven only, so most of the model is still missing
  // when it dies. It dies while a client waits in a fault whose read is
  // held in the device; the clients then serve their own faults (exit 6:
  // the daemon outlived a client's pass, nothing tested).
  PagerOptions o;
  o.background_warmup = false;
  o.prefetch_window = 0;
  const auto killed = kill_daemon_under_clients(
      [&] { return on_shmem ? make_daemon(kPoolPages, o) : make_daemon_on(mnt.dir, kPoolPages, o); }, "fallback:0",
      [](Daemon& d, ModelId id, std::vector<Child>&) {
        const auto s = stats(d, id);
        return s.faults_waited >= 1 && s.units_in_flight >= 1;
      });
  if (!killed.skip.empty()) GTEST_SKIP() << killed.skip;
  ASSERT_EQ(killed.statuses.size(), 2U);
  for (int st : killed.statuses) EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  // Everything the dead daemon and its clients held is back in the kernel
  // (hugetlbfs: the private mount counts it exactly; shmem pages have no
  // such private counter). A read the daemon had in flight when it died
  // (held in the device until the throttle was lifted) keeps its page until
  // the kernel's io_uring teardown, which runs in a worker after the reap,
  // has seen it complete: the count falls to 0 then, and must (seen once
  // under ASan: 1 page still in use right after the reap).
  if (!on_shmem) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (mnt.used_pages() != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(mnt.used_pages(), 0U) << "a page of the dead daemon's pool was never given back";
  }
}

// --- I/O priorities, as the device sees them --------------------------------

// A read-only loop device over a copy of the test model padded to whole
// units (a block device ends on a sector; the padding is zeros, what the
// region holds past EOF), so the model's O_DIRECT reads are requests of a
// device of their own.
struct LoopDevice {
  std::string img, dev, why;
  unsigned major = 0, minor = 0;
  LoopDevice() {
    img = "/var/tmp/airs-ioprio-" + std::to_string(::getpid()) + ".img";
    std::filesystem::copy_file(g_src, img, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(img, (g_file_size + g_unit - 1) / g_unit * g_unit);
    FILE* p = ::popen(("losetup --find --show --read-only " + img + " 2>&1").c_str(), "r");
    char line[256] = {};
    if (p == nullptr || std::fgets(line, sizeof line, p) == nullptr) line[0] = 0;
    const int rc = p != nullptr ? ::pclose(p) : -1;
    std::string out(line);
    while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
    struct stat st {};
    if (rc != 0 || ::stat(out.c_str(), &st) != 0 || !S_ISBLK(st.st_mode)) {
      why = "losetup --find --show: " + (out.empty() ? std::string("no output") : out);
      return;
    }
    dev = out;
    major = ::major(st.st_rdev);
    minor = ::minor(st.st_rdev);
  }
  ~LoopDevice() {
    if (!dev.empty() && std::system(("losetup -d " + dev).c_str()) != 0) std::fprintf(stderr, "losetup -d %s failed\n", dev.c_str());
    ::unlink(img.c_str());
  }
};

// block_rq_issue on one device, in a tracing instance of our own (the
// global buffer and other tracers are left alone).
struct RqTrace {
  std::string dir, why;
  explicit RqTrace(const LoopDevice& dev) {
    std::string root = "/sys/kernel/tracing";
    if (::access((root + "/instances").c_str(), F_OK) != 0 &&
        ::mount("nodev", root.c_str(), "tracefs", 0, nullptr) != 0) {
      why = "tracefs is not mounted and cannot be (" + std::string(std::strerror(errno)) + ")";
      return;
    }
    auto fmt = sys::read_text_file(root + "/events/block/block_rq_issue/format");
    if (!fmt || fmt->find("field:unsigned short ioprio;") == std::string::npos) {
      why = "this kernel's block_rq_issue event has no ioprio field (added in Linux 6.10)";
      return;
    }
    const std::string d = root + "/instances/airs-ioprio-" + std::to_string(::getpid());
    if (::mkdir(d.c_str(), 0700) != 0) {
      why = "mkdir " + d + ": " + std::strerror(errno);
      return;
    }
    dir = d;
    const std::string ev = dir + "/events/block/block_rq_issue/";
    const std::string filter = "dev == " + std::to_string((uint64_t{dev.major} << 20) | dev.minor);
    if (!sys::write_text_file(ev + "filter", filter) || !sys::write_text_file(ev + "enable", "1")) why = "cannot enable " + ev;
  }
  ~RqTrace() {
    if (dir.empty()) return;
    (void)sys::write_text_file(dir + "/events/block/block_rq_issue/enable", "0");
    ::rmdir(dir.c_str());
  }
  struct Rq {
    uint64_t offset = 0, bytes = 0;
    std::string cls;  // none, rt, be, idle
    unsigned level = 0;
  };
  // The reads issued since the last take (and forgets them).
  std::vector<Rq> take() {
    std::vector<Rq> out;
    auto text = sys::read_text_file(dir + "/trace");
    (void)sys::write_text_file(dir + "/trace", "");
    if (!text) return out;
    std::istringstream in(*text);
    for (std::string l; std::getline(in, l);) {
      const auto at = l.find("block_rq_issue: ");
      if (at == std::string::npos) continue;
      // "7,3 R 0 () 2048 + 2560 be,0,7 [comm]"
      std::istringstream f(l.substr(at + 16));
      std::string devs, rwbs, bytes, cmd, plus, prio;
      uint64_t sector = 0, sectors = 0;
      if (!(f >> devs >> rwbs >> bytes >> cmd >> sector >> plus >> sectors >> prio)) continue;
      if (rwbs.find('R') == std::string::npos) continue;
      Rq r;
      r.offset = sector * 512;
      r.bytes = sectors * 512;
      const auto c1 = prio.find(','), c2 = prio.rfind(',');
      r.cls = prio.substr(0, c1);
      r.level = static_cast<unsigned>(std::stoul(prio.substr(c2 + 1)));
      out.push_back(r);
    }
    return out;
  }
};

std::string describe_rqs(const std::vector<RqTrace::Rq>& rqs) {
  std::string s;
  for (const auto& r : rqs)
    s += "  unit " + std::to_string(r.offset / g_unit) + " +" + std::to_string(r.offset % g_unit) + " " +
         std::to_string(r.bytes) + " B " + r.cls + "," + std::to_string(r.level) + "\n";
  return s;
}

// Each class of read reaches the device at its own I/O priority (the
// request's ioprio as the block layer's trace event records it, on a loop
// device that holds only the model): a fault's layer best-effort 0, the
// layers prefetched past it best-effort 7, the background warm-up idle.
// Without sqe->ioprio every request carries the process's priority.
TEST_F(PagerTest, EachReadClassReachesTheDeviceAtItsIoPriority) {
  LoopDevice loop;
  if (loop.dev.empty()) GTEST_SKIP() << "no loop device: " << loop.why;
  RqTrace trace(loop);
  if (!trace.why.empty()) GTEST_SKIP() << "cannot trace block requests: " << trace.why;
  constexpr uint32_t kTouched = 12;
  {
    // A fault, and the prefetch it starts; no warm-up.
    PagerOptions o;
    o.background_warmup = false;
    o.prefetch_window = 2;
    o.direct_io = pager::DirectIo::On;
    Daemon d = make_daemon(kPoolPages, o);
    const ModelId id = load(d, loop.dev);
    Child c = spawn("touch:" + std::to_string(kTouched));
    ASSERT_TRUE(attach(d, id, c, 1));
    const int st = wait_child(&d, c.pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
    ASSERT_TRUE(run_until(d, [&] { return stats(d, id).units_in_flight == 0; }));
    const auto rqs = trace.take();
    bool fault_seen = false, prefetch_seen = false, ok = true;
    for (const auto& r : rqs) {
      const uint64_t u = r.offset / g_unit;
      if (u == kTouched) fault_seen = true;
      const bool be0 = r.cls == "be" && r.level == 0, be7 = r.cls == "be" && r.level == 7;
      if (be7 && u > kTouched) prefetch_seen = true;
      ok = ok && (be0 || be7) && (u != kTouched || be0);
    }
    EXPECT_TRUE(fault_seen && prefetch_seen && ok)
        << "the faulted unit " << kTouched << " at be,0, units past it prefetched at be,7, no other class; got:\n"
        << describe_rqs(rqs);
  }
  {
    // Only the warm-up.
    PagerOptions o;
    o.background_warmup = true;
    o.direct_io = pager::DirectIo::On;
    (void)trace.take();
    Daemon d = make_daemon(kPoolPages, o);
    const ModelId id = load(d, loop.dev);
    ASSERT_TRUE(run_until(d, [&] { return stats(d, id).state == wire::ModelLoadState::Resident; }));
    const auto rqs = trace.take();
    uint64_t idle_bytes = 0;
    bool ok = !rqs.empty();
    for (const auto& r : rqs) {
      ok = ok && r.cls == "idle";
      if (r.cls == "idle") idle_bytes += r.bytes;
    }
    EXPECT_TRUE(ok) << "every warm-up read at the idle class; got:\n" << describe_rqs(rqs);
    EXPECT_GE(idle_bytes, g_file_size - g_unit) << "the warm-up read less than the model at the idle class";
  }
}

// Cooperative mode: shmem pool, no userfaultfd anywhere; clients map an
// O_RDONLY region fd and wait on the status page. On huge folios and on
// memfds of base pages (filled by copy).
class CooperativeTest : public PagerTest, public ::testing::WithParamInterface<Backing> {
 protected:
  void SetUp() override {
    g_backing = GetParam();
    g_cooperative = true;
    PagerTest::SetUp();
  }
  void TearDown() override {
    PagerTest::TearDown();
    g_backing = Backing::Hugetlbfs;
    g_cooperative = false;
  }
  // Serve the loop slowly (one read in flight, a pause per turn) so the
  // client really waits for ranks that are still being filled.
  static int wait_child_slowly(Daemon& d, pid_t pid) {
    int st = -1;
    const auto end = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < end) {
      if (::waitpid(pid, &st, WNOHANG) == pid) return st;
      (void)d.loop->run_once(1ms);
      std::this_thread::sleep_for(10ms);
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &st, 0);
    ADD_FAILURE() << "child " << pid << " timed out";
    return -1;
  }
  static uint64_t locked_bytes() {
    if (!kMlockWorks) return kPoolPages * g_unit;
    auto t = sys::read_text_file("/proc/self/status");
    if (!t) return 0;
    const auto pos = t->find("VmLck:");
    return pos == std::string::npos ? 0 : std::stoull(t->substr(pos + 6)) * 1024;
  }
};

TEST_P(CooperativeTest, UffdAttachIsRefused) {
  Daemon d = make_daemon(kPoolPages, {});
  const ModelId id = load(d, g_src);
  auto uffd = sys::uffd_create();
  ASSERT_TRUE(uffd.ok()) << uffd.error().message;
  auto st = d.pager->attach(id, 1, ::getpid(), std::move(uffd).value(), sys::UniqueFd(), 0, d.pager->region_size(id));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ENOTSUP);
  EXPECT_NE(st.error().message.find("cooperative"), std::string::npos) << st.error().message;
}

// Ordered on events, not on time: the fill moves only while this test runs
// the daemon's loop (a read's completion is handled there), and the loop
// does not run until the client says it waits for a rank that is not
// ready. So the client waits on every run, whoever starts first.
TEST_P(CooperativeTest, ClientWaitsPerRankWhileTheFillRuns) {
  PagerOptions o;
  o.queue_depth = 1;
  Daemon d = make_daemon(kPoolPages, o);
  const ModelId id = load(d, g_src);
  ASSERT_NE(stats(d, id).state, wire::ModelLoadState::Resident);
  Child c = spawn("coop-ranks");
  ASSERT_TRUE(attach(d, id, c, 1));
  pollfd p{c.sock.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 60'000), 1) << "the client never said it waits";
  char said = 0;
  ASSERT_EQ(recv_byte(c.sock.get(), &said), 1) << std::strerror(errno);
  EXPECT_EQ(said, 'w');
  const int st = wait_child_slowly(d, c.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << describe(st) << " (exit 7: the model was resident before the client waited, nothing tested)";
  EXPECT_EQ(stats(d, id).state, wire::ModelLoadState::Resident);
}

TEST_P(CooperativeTest, KillDashNineOfTheDaemonMidLoad) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  // The fill's reads are held in the device: no unit becomes ready. The
  // daemon dies once both clients said (one byte on their socket) that
  // they wait for a rank that is not ready.
  std::vector<bool> said(2, false);
  const auto killed = kill_daemon_under_clients(
      [&] { return make_daemon(kPoolPages, {}); }, "coop-fallback", [&](Daemon&, ModelId, std::vector<Child>& cs) {
        for (size_t i = 0; i < cs.size(); ++i) {
          char b = 0;
          if (!said[i] && ::recv(cs[i].sock.get(), &b, 1, MSG_DONTWAIT) == 1) said[i] = true;
        }
        return std::find(said.begin(), said.end(), false) == said.end();
      });
  if (!killed.skip.empty()) GTEST_SKIP() << killed.skip;
  ASSERT_EQ(killed.statuses.size(), 2U);
  for (int st : killed.statuses)
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
        << describe(st) << " (exit 7: resident before the daemon died, nothing tested)";
}

TEST_P(CooperativeTest, PlainMapperThatWaitsForResidencyNeverSeesZeros) {
  PagerOptions o;
  o.queue_depth = 2;
  Daemon d = make_daemon(kPoolPages, o);
  EXPECT_EQ(locked_bytes(), kPoolPages * g_unit) << "the shmem reserve is not mlocked";
  const ModelId id = load(d, g_src);
  Child a = spawn("coop-resident");
  ASSERT_TRUE(attach(d, id, a, 1));
  Child b = spawn("coop-resident");
  ASSERT_TRUE(attach(d, id, b, 2));
  for (pid_t p : {a.pid, b.pid}) {
    const int st = wait_child(&d, p);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
  }
  // Filled units are pinned as they complete; with the reserve that is the
  // whole pool again.
  EXPECT_EQ(locked_bytes(), kPoolPages * g_unit) << "filled units are not mlocked";
  ASSERT_TRUE(d.pager->unload(id));
  ASSERT_TRUE(d.pager->finish_drains(std::chrono::steady_clock::now() + 30s));
  EXPECT_EQ(locked_bytes(), kPoolPages * g_unit) << "unloaded pages did not go back to the locked reserve";
}

// The mapping that starts at `addr` in /proc/self/smaps: its Rss in bytes,
// and whether its VmFlags say locked ("lo"). (Its "Locked:" line is a
// proportional share, halved by a second mapping of the same pages.)
struct VmaLock {
  uint64_t rss = 0;
  bool locked = false;
};
std::optional<VmaLock> vma_lock(const void* addr) {
  auto t = sys::read_text_file("/proc/self/smaps");
  if (!t) return std::nullopt;
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(addr));
  size_t pos = t->find(std::string("\n") + start);
  if (pos == std::string::npos && t->rfind(start, 0) == 0) pos = 0;
  if (pos == std::string::npos) return std::nullopt;
  const size_t rss = t->find("\nRss:", pos), flags = t->find("\nVmFlags:", pos);
  if (rss == std::string::npos || flags == std::string::npos) return std::nullopt;
  VmaLock v;
  v.rss = std::stoull(t->substr(rss + 5)) * 1024;
  const std::string f = t->substr(flags + 9, t->find('\n', flags + 1) - flags - 9) + " ";
  v.locked = f.find(" lo ") != std::string::npos;
  return v;
}

TEST_P(CooperativeTest, AnAdoptedFilledRegionIsResidentByteExactAndLocked) {
  // A restarted daemon adopts the region the previous one filled (its fd
  // kept): resident at once, nothing read, and pinned like a fresh fill.
  // shmem pages were never faulted into the new daemon's mapping, so a
  // lock-on-fault mapping alone would leave every one of them swappable.
  Daemon first = make_daemon(kPoolPages, {});
  const ModelId id1 = load(first, g_src);
  ASSERT_TRUE(run_until(first, [&] { return stats(first, id1).state == wire::ModelLoadState::Resident; }));
  sys::UniqueFd kept(::fcntl(first.pager->region_fd(id1), F_DUPFD_CLOEXEC, 3));
  ASSERT_TRUE(kept.valid());

  Daemon second = make_daemon(kPoolPages, {});
  auto region = second.pool->adopt_model_region("m", std::move(kept));
  ASSERT_TRUE(region.ok()) << region.error().message;
  const std::byte* data = (*region)->data();
  const uint64_t size = (*region)->size();
  sys::UniqueFd gguf(::open(g_src.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(gguf.valid());
  auto id2 = second.pager->adopt(spec_of("m", std::move(gguf), g_file_size, g_extents), std::move(region).value());
  ASSERT_TRUE(id2.ok()) << id2.error().message;
  const auto st = stats(second, *id2);
  EXPECT_EQ(st.state, wire::ModelLoadState::Resident);
  EXPECT_EQ(st.bytes_read, 0U) << "an adopted region was read again";
  EXPECT_FALSE(st.pin_failed);
  // Locked before anything here reads it (a read would fault pages in, and
  // lock them on fault).
  if (kMlockWorks) {
    auto v = vma_lock(data);
    ASSERT_TRUE(v) << "no mapping at the adopted region's address in /proc/self/smaps";
    EXPECT_TRUE(v->locked) << "the adopted region's mapping is not mlocked";
    EXPECT_EQ(v->rss, size) << "pages of the adopted region are not in the new daemon's locked mapping";
  }
  // Byte for byte the file, through the new daemon's own mapping.
  const auto* words = reinterpret_cast<const uint64_t*>(data);
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < g_file_size / 8; ++i) wrong += words[i] != test::pattern_word(i);
  EXPECT_EQ(wrong, 0U);
}

INSTANTIATE_TEST_SUITE_P(Files, CooperativeTest, ::testing::Values(Backing::Shmem, Backing::ShmemMemfd),
                         [](const ::testing::TestParamInfo<Backing>& p) {
                           return p.param == Backing::Shmem ? "HugeFolios" : "Memfd";
                         });

// The mapping of this process whose path in /proc/self/smaps ends with
// `suffix`: its Rss in bytes and whether it is locked (VmFlags "lo").
std::optional<VmaLock> vma_lock_named(const std::string& suffix) {
  auto t = sys::read_text_file("/proc/self/smaps", 64 << 20);
  if (!t) return std::nullopt;
  std::istringstream in(*t);
  std::string line;
  std::optional<VmaLock> v;
  bool in_it = false;
  while (std::getline(in, line)) {
    const bool header = !line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
                        line.find('-') != std::string::npos && line.find(':') > line.find(' ');
    if (header) {
      if (v && in_it) return v;
      in_it = line.size() >= suffix.size() && line.compare(line.size() - suffix.size(), suffix.size(), suffix) == 0;
      if (in_it) v = VmaLock{};
    } else if (in_it && line.rfind("Rss:", 0) == 0) {
      v->rss = std::stoull(line.substr(4)) * 1024;
    } else if (in_it && line.rfind("VmFlags:", 0) == 0) {
      v->locked = (line + " ").find(" lo ") != std::string::npos;
    }
  }
  return in_it ? v : std::nullopt;
}

// The copy fill (memfds of base pages: read into a bounce buffer, written
// into the region, populated into the daemon's locked mapping), in both
// modes that use it: every byte a client reads is the file's, every page of
// the region ends up in the daemon's locked mapping, and a unit that cannot
// be read is never shown: a small-pages client touching it gets SIGBUS, a
// cooperative client's wait fails, and the status page never calls it
// ready.
TEST_F(PagerTest, CopyFillOnMemfdsGivesTheFileBytesAndAReadErrorNeverZeros) {
  struct Restore {
    ~Restore() {
      g_backing = Backing::Hugetlbfs;
      g_cooperative = false;
    }
  } restore;
  g_backing = Backing::ShmemMemfd;
  const std::string cut = g_src + ".cut";
  write_source(cut, g_file_size);
  // Four whole units, then EOF where the model says there is more.
  ASSERT_EQ(::truncate(cut.c_str(), static_cast<off_t>(4 * g_unit)), 0);
  PagerOptions copy;
  copy.copy_fill = true;
  for (const bool cooperative : {false, true}) {
    SCOPED_TRACE(cooperative ? "cooperative" : "small-pages");
    g_cooperative = cooperative;
    {
      Daemon d = make_daemon(kPoolPages, copy);
      const std::string name = cooperative ? "copy-coop" : "copy-uffd";
      const ModelId id = load(d, g_src, name);
      ASSERT_TRUE(stats(d, id).copy_fill) << "the model is not filled by copy: nothing tested";
      Child c = spawn(cooperative ? "coop-resident" : "seq");
      ASSERT_TRUE(attach(d, id, c, 1));
      const int st = wait_child(&d, c.pid);
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
      ASSERT_TRUE(run_until(d, [&] { return stats(d, id).state == wire::ModelLoadState::Resident; }));
      // Pinned: every page is mapped in the daemon's locked mapping.
      auto v = vma_lock_named("/memfd:airs-model:" + name + " (deleted)");
      ASSERT_TRUE(v) << "no mapping of the region in this process";
      EXPECT_EQ(v->rss, d.pager->region_size(id)) << "pages of the copied region are not in the daemon's mapping";
      if (kMlockWorks) {
        EXPECT_TRUE(v->locked) << "the daemon's mapping of the region is not locked";
      }
    }
    {
      PagerOptions o = copy;
      o.background_warmup = false;  // small-pages: only what faults (cooperative forces the warm-up on)
      o.prefetch_window = 0;
      Daemon d = make_daemon(kPoolPages, o);
      const ModelId id = load(d, cut, "copy-cut");
      ASSERT_TRUE(stats(d, id).copy_fill);
      if (cooperative) {
        Child c = spawn("coop-resident", g_src);
        ASSERT_TRUE(attach(d, id, c, 1));
        const int st = wait_child(&d, c.pid);
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 53) << "expected the wait to fail (exit 53), got "
                                                             << describe(st);
      } else {
        Child good = spawn("touch:0", g_src);
        ASSERT_TRUE(attach(d, id, good, 1));
        int st = wait_child(&d, good.pid);
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << describe(st);
        Child late = spawn("touch:30", g_src);
        ASSERT_TRUE(attach(d, id, late, 2));
        st = wait_child(&d, late.pid);
        EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS) << "expected SIGBUS, got " << describe(st);
      }
      ASSERT_TRUE(run_until(d, [&] { return stats(d, id).units_in_flight == 0; }));
      const auto s = stats(d, id);
      EXPECT_EQ(s.state, wire::ModelLoadState::Failed);
      EXPECT_GE(s.units_failed, 1U);
      // Only units that hold the file's bytes are ever ready: the first four.
      sys::UniqueFd sp(::dup(d.pager->status_fd(id)));
      struct stat sst {};
      ASSERT_EQ(::fstat(sp.get(), &sst), 0);
      void* page = ::mmap(nullptr, static_cast<size_t>(sst.st_size), PROT_READ, MAP_SHARED, sp.get(), 0);
      ASSERT_NE(page, MAP_FAILED);
      wire::StatusPageView view(page, static_cast<uint64_t>(sst.st_size));
      for (uint32_t u = 4; u < view.unit_count(); ++u) EXPECT_FALSE(view.unit_ready(u)) << "unit " << u;
      ::munmap(page, static_cast<size_t>(sst.st_size));
    }
  }
  ::unlink(cut.c_str());
}

}  // namespace
}  // namespace airs
