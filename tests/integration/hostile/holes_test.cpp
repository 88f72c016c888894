// SPDX-License-Identifier: Apache-2.0
// What a client can do to the descriptors the daemon hands it, and to the
// files it proves, must never crash the daemon, make it hold memory that
// status does not count, spin its loop, or serve bytes the file does not
// have. Every test runs with a watcher on the loop: GetStatus every 100 ms
// from its own connection; a call that is never answered (a loop stuck on
// a descriptor the attack handed it) fails the test. How long answers took
// is printed, not bounded: on a loaded machine (a sanitizer beside a TCG
// guest) any bound on a latency is a race.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <systemd/sd-bus.h>
#include <sdbus-c++/sdbus-c++.h>

#include "daemon_fixture.hpp"
#include "hostile_common.hpp"
#include "model_open.hpp"
#include "gguf/writer.hpp"

using namespace airs::test;
namespace fs = std::filesystem;

namespace {

using Dict = std::map<std::string, sdbus::Variant>;

constexpr const char* kManager = "org.aios.Airs1.Manager";
constexpr const char* kSession = "org.aios.Airs1.Session";

// GetStatus every 100 ms on its own connection while the test runs, and
// once more when it stops; counts the calls answered and those that were
// not (60 s each, far beyond any slow machine: a loop that never answers),
// and keeps the slowest answer to print. Plain sd-bus on its own thread:
// sdbus-c++ 1.2 shares one pseudo connection between threads to read
// variants, a race TSan reports, and the answer's contents do not matter
// here.
class LoopWatcher {
 public:
  explicit LoopWatcher(const std::string& address) : thread_([this, address] { run(address); }) {}
  ~LoopWatcher() { stop(); }
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // After stop().
  [[nodiscard]] int answered() const { return answered_; }
  [[nodiscard]] int unanswered() const { return unanswered_; }
  [[nodiscard]] int64_t slowest_ms() const { return slowest_ms_; }

 private:
  void run(const std::string& address) {
    sd_bus* bus = nullptr;
    int r = sd_bus_new(&bus);
    if (r >= 0) r = sd_bus_set_address(bus, address.c_str());
    if (r >= 0) r = sd_bus_set_bus_client(bus, 1);
    if (r >= 0) r = sd_bus_set_method_call_timeout(bus, 60'000'000);
    if (r >= 0) r = sd_bus_start(bus);
    do {
      const auto t0 = std::chrono::steady_clock::now();
      sd_bus_error err{};  // SD_BUS_ERROR_NULL, which C++ has no compound literal for
      sd_bus_message* reply = nullptr;
      if (r >= 0 && sd_bus_call_method(bus, "org.aios.Airs1", "/org/aios/Airs1", kManager, "GetStatus", &err, &reply,
                                       "") >= 0) {
        ++answered_;
        const int64_t ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        slowest_ms_ = std::max(slowest_ms_, ms);
      } else {
        ++unanswered_;
      }
      sd_bus_message_unref(reply);
      sd_bus_error_free(&err);
      if (!done_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } while (!done_);
    sd_bus_flush_close_unref(bus);
  }
  std::atomic<bool> done_{false};
  int answered_ = 0;
  int unanswered_ = 0;
  int64_t slowest_ms_ = 0;
  std::thread thread_;
};

class Holes : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("airs-holes-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    airs::gguf::ModelSpec spec;
    spec.name = "victim";
    auto plan = airs::gguf::plan_model(spec);
    ASSERT_TRUE(plan);
    model_ = (dir_ / "m.gguf").string();
    ASSERT_TRUE(airs::gguf::write_model_file(*plan, model_));
    bus_ = std::make_unique<PrivateBus>();
    daemon_ = std::make_unique<DaemonProcess>(bus_->address(),
                                              "[pool]\nsize = \"64M\"\nbackend = \"" + GetParam() + "\"\n");
    ASSERT_TRUE(daemon_->started()) << daemon_->log();
    conn_ = sdbus::createSessionBusConnectionWithAddress(bus_->address());
    mgr_ = sdbus::createProxy(*conn_, "org.aios.Airs1", "/org/aios/Airs1");
    watcher_ = std::make_unique<LoopWatcher>(bus_->address());
  }
  void TearDown() override {
    if (watcher_) {
      watcher_->stop();
      EXPECT_EQ(watcher_->unanswered(), 0) << "GetStatus went unanswered while the attack ran";
      EXPECT_GT(watcher_->answered(), 0) << "no GetStatus was answered while the attack ran";
      std::cout << "GetStatus while the attack ran: " << watcher_->answered() << " answered, the slowest in "
                << watcher_->slowest_ms() << " ms\n";
    }
    mgr_.reset();
    conn_.reset();
    if (daemon_) {
      EXPECT_EQ(daemon_->stop(), 0) << "the daemon did not survive: " << daemon_->log();
    }
    daemon_.reset();
    bus_.reset();
    fs::remove_all(dir_);
  }
  sdbus::ObjectPath load() {
    sdbus::ObjectPath p;
    mgr_->callMethod("LoadModel")
        .onInterface(kManager)
        .withArguments(sdbus::UnixFd(::open(model_.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd), Dict{})
        .storeResultsTo(p);
    return p;
  }
  struct Session {
    std::unique_ptr<sdbus::IProxy> proxy;
    sdbus::UnixFd arena;
    sdbus::UnixFd event;  // the session's wake-up socket: POLLHUP once the daemon closed the session
    uint64_t arena_bytes = 0;
    uint64_t chunk_bytes = 0;
    uint32_t block_bytes = 0;
    uint32_t tokens_per_block = 0;
  };
  Session create(const sdbus::ObjectPath& model) {
    Session s;
    sdbus::ObjectPath path;
    sdbus::UnixFd notice;
    Dict geo;
    mgr_->callMethod("CreateSession")
        .onInterface(kManager)
        .withArguments(model, std::string("interactive"), Dict{})
        .storeResultsTo(path, s.arena, notice, s.event, geo);
    s.arena_bytes = geo.at("arena_bytes").get<uint64_t>();
    s.chunk_bytes = geo.at("chunk_bytes").get<uint64_t>();
    s.block_bytes = geo.at("block_bytes").get<uint32_t>();
    s.tokens_per_block = geo.at("tokens_per_block").get<uint32_t>();
    s.proxy = sdbus::createProxy(*conn_, "org.aios.Airs1", path);
    return s;
  }
  Dict kv_status() {
    Dict st;
    mgr_->callMethod("GetStatus").onInterface(kManager).storeResultsTo(st);
    return st.at("kv").get<Dict>();
  }
  // The attack's calls are answered; now the loop must be idle. Over a
  // second in which only the watcher's GetStatus calls arrive (ten), an
  // idle loop wakes a few times per call; one that spins on a descriptor
  // the attack left wakes thousands of times, however slow the machine.
  // The loop's own count (status loop_wakeups), not its CPU time: a guest
  // emulated on a busy host charged an idle daemon 0.54 s of a second.
  void expect_idle_loop() {
    const uint64_t w0 = loop_wakeups();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_LT(loop_wakeups() - w0, 500u) << "the daemon's loop spins";
  }
  uint64_t loop_wakeups() {
    Dict st;
    mgr_->callMethod("GetStatus").onInterface(kManager).storeResultsTo(st);
    return st.at("loop_wakeups").get<uint64_t>();
  }
  Dict pool_status() {
    Dict st;
    mgr_->callMethod("GetStatus").onInterface(kManager).storeResultsTo(st);
    return st.at("pool").get<Dict>();
  }

  fs::path dir_;
  std::string model_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<sdbus::IConnection> conn_;
  std::unique_ptr<sdbus::IProxy> mgr_;
  std::unique_ptr<LoopWatcher> watcher_;
};

uint64_t allocated_bytes(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

}  // namespace

// A client cuts its arena to nothing, then asks for a copy-on-write of a
// block it shares: the daemon's copy reads the cut file. It must answer,
// put the arena back to its size, and go on serving.
TEST_P(Holes, AnArenaCutByItsClientCannotCrashTheDaemon) {
  const auto model = load();
  auto a = create(model);
  std::vector<uint32_t> blocks;
  a.proxy->callMethod("Allocate").onInterface(kSession).withArguments(uint32_t{1}).storeResultsTo(blocks);
  ASSERT_EQ(blocks.size(), 1u);
  a.proxy->callMethod("SetLength").onInterface(kSession).withArguments(a.tokens_per_block);
  a.proxy->callMethod("Commit").onInterface(kSession).withArguments(blocks, std::vector<uint64_t>{42});
  auto b = create(model);
  std::vector<uint32_t> shared;
  b.proxy->callMethod("MatchPrefix").onInterface(kSession).withArguments(std::vector<uint64_t>{42}).storeResultsTo(shared);
  ASSERT_EQ(shared, blocks);

  ASSERT_EQ(::ftruncate(b.arena.get(), 0), 0);
  uint32_t written = 0;
  try {
    b.proxy->callMethod("PrepareWrite").onInterface(kSession).withArguments(uint32_t{0}).storeResultsTo(written);
  } catch (const sdbus::Error& e) {
    ADD_FAILURE() << "PrepareWrite: " << e.getName() << ": " << e.getMessage();
  }
  EXPECT_NE(written, blocks[0]) << "a shared block is copied before it is written";
  const auto kv = kv_status();
  EXPECT_GE(kv.at("arena_repairs").get<uint64_t>(), 1u);
  struct stat st {};
  ASSERT_EQ(::fstat(b.arena.get(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), b.arena_bytes) << "the arena is back to its size";
  // The blocks the pool holds are pages again: writing one from the
  // mapping works (no SIGBUS in the client either).
  void* m = ::mmap(nullptr, b.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, b.arena.get(), 0);
  ASSERT_NE(m, MAP_FAILED);
  static_cast<volatile char*>(m)[0] = 1;
  ::munmap(m, b.arena_bytes);
  auto c = create(model);  // the daemon goes on serving sessions
  EXPECT_NE(c.arena_bytes, 0u);
}

// A cut costs the client one ftruncate and the daemon the allocation (and
// zeroing) of every page it held past the cut. So a client that cuts its
// arena again and again gets it refilled twice, then loses it: the third
// cut closes the arena and its sessions, and nothing is refilled again. A
// cut grown back to the arena's size before the daemon looked is a cut too.
TEST_P(Holes, AnArenaCutAgainAndAgainIsClosedNotRefilled) {
  const auto model = load();
  auto s = create(model);
  auto other = create(model);  // the same uid's second session on the same arena
  std::vector<uint32_t> blocks;
  s.proxy->callMethod("Allocate").onInterface(kSession).withArguments(uint32_t{1}).storeResultsTo(blocks);
  ASSERT_EQ(blocks.size(), 1u);
  const uint64_t held = allocated_bytes(s.arena.get());
  ASSERT_EQ(held, s.chunk_bytes);

  for (uint64_t cut = 1; cut <= 2; ++cut) {
    ASSERT_EQ(::ftruncate(s.arena.get(), 0), 0);
    if (cut == 2) {
      ASSERT_EQ(::ftruncate(s.arena.get(), static_cast<off_t>(s.arena_bytes)), 0) << "grown back";
    }
    const auto kv = kv_status();  // taken after the repair
    EXPECT_EQ(kv.at("arena_repairs").get<uint64_t>(), cut);
    EXPECT_EQ(kv.at("arenas_closed").get<uint64_t>(), 0u);
    struct stat st {};
    ASSERT_EQ(::fstat(s.arena.get(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), s.arena_bytes) << "cut " << cut << " is repaired";
    EXPECT_EQ(allocated_bytes(s.arena.get()), held) << "cut " << cut << ": the pool's chunk is allocated again";
  }

  ASSERT_EQ(::ftruncate(s.arena.get(), 0), 0);
  {
    const auto kv = kv_status();
    EXPECT_EQ(kv.at("arena_repairs").get<uint64_t>(), 2u) << "a third cut is not refilled";
    struct stat st {};
    ASSERT_EQ(::fstat(s.arena.get(), &st), 0);
    EXPECT_EQ(st.st_size, 0) << "not put back";
    EXPECT_EQ(st.st_blocks, 0) << "nothing allocated in it again";
  }
  // A new session of the uid, at once (the arena may not have closed yet):
  // it gets a fresh arena of the full size, never the cut one.
  auto again = create(model);
  EXPECT_EQ(again.arena_bytes, s.arena_bytes);
  struct stat cut_st {}, fresh_st {};
  ASSERT_EQ(::fstat(s.arena.get(), &cut_st), 0);
  ASSERT_EQ(::fstat(again.arena.get(), &fresh_st), 0);
  EXPECT_NE(fresh_st.st_ino, cut_st.st_ino) << "the new session joined the cut arena";
  EXPECT_EQ(static_cast<uint64_t>(fresh_st.st_size), again.arena_bytes);
  // Both old sessions end: the daemon closes their wake-up sockets (no
  // events asked for: poll reports the hang-up only, not the notice before).
  for (auto* x : {&s, &other}) {
    pollfd p{x->event.get(), 0, 0};
    ASSERT_EQ(::poll(&p, 1, 20'000), 1) << "a session on the cut arena never ended";
    EXPECT_NE(p.revents & POLLHUP, 0) << "revents " << p.revents;
  }
  EXPECT_EQ(kv_status().at("arenas_closed").get<uint64_t>(), 1u);
  EXPECT_EQ(pool_status().at("kv_bytes").get<uint64_t>(), 0u) << "the cut arena's chunk is back in the pool";
  EXPECT_THROW(s.proxy->callMethod("Allocate").onInterface(kSession).withArguments(uint32_t{1}), sdbus::Error)
      << "the closed session is gone";
  std::vector<uint32_t> fresh;
  again.proxy->callMethod("Allocate").onInterface(kSession).withArguments(uint32_t{1}).storeResultsTo(fresh);
  EXPECT_EQ(fresh.size(), 1u);
  EXPECT_EQ(allocated_bytes(again.arena.get()), held);
}

// A client grows its arena, fills its holes with fallocate and with
// writes, then leaves. None of that memory stays held, and status never
// counted less than the file held.
TEST_P(Holes, WhatAClientAddsToItsArenaIsGivenBack) {
  const auto model = load();
  auto s = create(model);
  std::vector<uint32_t> blocks;
  s.proxy->callMethod("Allocate").onInterface(kSession).withArguments(uint32_t{1}).storeResultsTo(blocks);
  const uint64_t held = allocated_bytes(s.arena.get());
  EXPECT_EQ(held, s.chunk_bytes) << "one chunk backs the first block";
  // Growing: refused or undone; it must not stay.
  const int grew = ::ftruncate(s.arena.get(), static_cast<off_t>(s.arena_bytes + (uint64_t{1} << 30)));
  // Filling holes past the committed chunk: fallocate, then plain writes.
  const uint64_t hole = s.arena_bytes - s.chunk_bytes;
  EXPECT_EQ(::fallocate(s.arena.get(), 0, static_cast<off_t>(s.chunk_bytes), static_cast<off_t>(hole / 2)), 0)
      << std::strerror(errno);
  void* m = ::mmap(nullptr, s.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, s.arena.get(), 0);
  ASSERT_NE(m, MAP_FAILED);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (uint64_t off = s.chunk_bytes + hole / 2; off < s.arena_bytes; off += page) static_cast<volatile char*>(m)[off] = 7;
  ::munmap(m, s.arena_bytes);

  // Status is taken after the arena is put back (housekeeping may have
  // done it already): it counts what is held.
  const auto kv = kv_status();
  EXPECT_GE(kv.at("arena_repairs").get<uint64_t>(), 1u);
  EXPECT_EQ(allocated_bytes(s.arena.get()), held) << "only the pool's pages stay in the arena";
  struct stat st {};
  ASSERT_EQ(::fstat(s.arena.get(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), s.arena_bytes) << (grew == 0 ? "grown, then put back" : "not grown");

  // Again, and the client leaves (closes its session): given back at once.
  ASSERT_EQ(::fallocate(s.arena.get(), 0, static_cast<off_t>(s.chunk_bytes), static_cast<off_t>(hole)), 0);
  s.proxy->callMethod("Close").onInterface(kSession);
  EXPECT_LE(allocated_bytes(s.arena.get()), held);
}


// A userfaultfd that never had UFFDIO_API fails every read and polls
// EPOLLERR for ever: Attach refuses it, and the loop does not spin on it.
TEST_P(Holes, AttachWithAUserfaultfdThatHadNoHandshakeIsRefused) {
  const auto path = load();
  auto model = sdbus::createProxy(*conn_, "org.aios.Airs1", path);
  sdbus::UnixFd region, status;
  uint64_t size = 0;
  Dict info;
  sdbus::UnixFd proof(::open(model_.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd);
  sdbus::UnixFd ready(static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)), sdbus::adopt_fd);
  model->callMethod("OpenLazy").onInterface("org.aios.Airs1.Model")
      .withArguments(proof, ready, Dict{})
      .storeResultsTo(region, size, status, info);
  for (int i = 0; i < 20; ++i) {
    sdbus::UnixFd raw(static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)), sdbus::adopt_fd);
    ASSERT_GE(raw.get(), 0);
    sdbus::UnixFd notify(::eventfd(0, EFD_CLOEXEC), sdbus::adopt_fd);
    expect_error([&] {
      model->callMethod("Attach").onInterface("org.aios.Airs1.Model")
          .withArguments(notify, raw, uint64_t{0x7f0000000000}, size);
    }, "org.aios.Airs1.Error.InvalidArgument", "UFFDIO_API");
  }
  // The notify fd is written when the model is resident: a pipe whose
  // reader is gone would raise SIGPIPE in the daemon. Only an eventfd.
  {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    ::close(p[0]);
    sdbus::UnixFd raw(static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK)), sdbus::adopt_fd);
    sdbus::UnixFd pipe(p[1], sdbus::adopt_fd);
    expect_error([&] {
      model->callMethod("Attach").onInterface("org.aios.Airs1.Model")
          .withArguments(pipe, raw, uint64_t{0x7f0000000000}, size);
    }, "org.aios.Airs1.Error.InvalidArgument", "not an eventfd");
  }
  // A range that wraps the address space is not one.
  sdbus::UnixFd notify(::eventfd(0, EFD_CLOEXEC), sdbus::adopt_fd);
  expect_error([&] {
    model->callMethod("Attach").onInterface("org.aios.Airs1.Model")
        .withArguments(notify, ready, UINT64_MAX - size / 2 + 1, size);
  }, "org.aios.Airs1.Error.InvalidArgument", "not a user address range");
  expect_idle_loop();
  EXPECT_LT(daemon_->log().size(), size_t{1} << 20) << "the log floods";
}

// Follow's request socket must be one end of a connected pair: a socket
// never connected, or a listening one, reports EPOLLHUP for ever.
TEST_P(Holes, FollowWithASocketThatIsNotConnectedIsRefused) {
  const auto path = load();
  auto model = sdbus::createProxy(*conn_, "org.aios.Airs1", path);
  const OpenReply reply = open_without_wait(*model, model_);
  const int opened = ::memfd_create("opened", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(opened, 0);
  ASSERT_EQ(::ftruncate(opened, 1 << 20), 0);
  ASSERT_EQ(::fcntl(opened, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  const int lone = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  const int listening = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_GE(lone, 0);
  ASSERT_GE(listening, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_EQ(::bind(listening, reinterpret_cast<sockaddr*>(&addr), sizeof(sa_family_t)), 0);  // autobind
  ASSERT_EQ(::listen(listening, 1), 0);
  const auto follow = [&](int requests) {
    model->callMethod("Follow").onInterface("org.aios.Airs1.Model")
        .withArguments(sdbus::UnixFd(requests), sdbus::UnixFd(opened));
  };
  expect_error([&] { follow(lone); }, "org.aios.Airs1.Error.InvalidArgument", "not connected");
  expect_error([&] { follow(listening); }, "org.aios.Airs1.Error.InvalidArgument", "listening");
  expect_idle_loop();
  for (int fd : {opened, lone, listening}) ::close(fd);
}

// The open-unit bits of Follow are a memfd the client writes and the
// daemon reads with plain loads. A memfd of huge pages would let the client
// punch a page out and take the last free huge page: the daemon's next read
// of the bits would be a SIGBUS. Refused, naming why; base pages are taken.
TEST_P(Holes, FollowWithAMemfdOfHugePagesIsRefused) {
  const auto path = load();
  auto model = sdbus::createProxy(*conn_, "org.aios.Airs1", path);
  const OpenReply reply = open_without_wait(*model, model_);
  const uint64_t huge = 2u << 20;
  const int opened = ::memfd_create("opened-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  ASSERT_GE(opened, 0) << std::strerror(errno);
  ASSERT_EQ(::ftruncate(opened, static_cast<off_t>(huge)), 0) << std::strerror(errno);
  ASSERT_EQ(::fcntl(opened, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0) << std::strerror(errno);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  const auto follow = [&](int bits) {
    model->callMethod("Follow").onInterface("org.aios.Airs1.Model").withArguments(sdbus::UnixFd(pair[0]), sdbus::UnixFd(bits));
  };
  expect_error([&] { follow(opened); }, "org.aios.Airs1.Error.InvalidArgument", "memfd of huge pages");
  // The same call with a memfd of base pages is taken.
  const int base = ::memfd_create("opened", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(base, 0);
  ASSERT_EQ(::ftruncate(base, 1 << 20), 0);
  ASSERT_EQ(::fcntl(base, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  EXPECT_NO_THROW(follow(base));
  expect_idle_loop();
  for (int fd : {opened, base, pair[0], pair[1]}) ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Backends, Holes, ::testing::Values("hugetlbfs", "shmem"),
                         [](const auto& p) { return p.param; });
