// SPDX-License-Identifier: Apache-2.0
// A LoadModel whose header is slow to parse or never arrives does not stall
// the daemon's event loop: a header of a million tensors (the last one past
// the end of the file) from two connections at once, and a file on a FUSE
// mount whose READ is never answered (a real FUSE server on /dev/fuse, here,
// speaking the kernel's protocol). GetStatus is answered while the server
// holds the daemon's request (an event, not a time: a loop stuck in that
// request could answer nothing), each load gets its own error naming the
// defect or the stall, a uid gets no more than its bound of header reads,
// and the daemon exits cleanly with a read still stuck. Also: FIFOs planted in the state
// directory where the daemon reads do not hang it.
#include <fcntl.h>
#include <grp.h>
#include <linux/fuse.h>
#include <poll.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sdbus-c++/sdbus-c++.h>

#include "daemon_fixture.hpp"
#include "hostile_common.hpp"
#include "gguf/content_id.hpp"
#include "gguf/file_io.hpp"
#include "gguf/gguf.hpp"
#include "gguf/writer.hpp"
#include "harness.hpp"
#include "sys/procfs.hpp"
#include "test_model.hpp"
#include "util/sanitizers.hpp"

using namespace airs::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A namespace of its own: the suite is one unity build, and the other files'
// anonymous namespaces have helpers of the same names.
namespace airs::test::load_stall {
namespace {

using Clock = std::chrono::steady_clock;
using Dict = std::map<std::string, sdbus::Variant>;
const char* kManagerIf = "org.aios.Airs1.Manager";
constexpr uid_t kNobody = 65534;

// A model's bytes, for a FUSE server to serve: one whole read (a model of
// tens of MiB a character at a time costs seconds in the TSan build, whose
// tests are compiled at -O0). Empty, and the test failed, if it cannot be.
std::string model_bytes(const std::string& path) {
  auto read = airs::sys::read_text_file(path, 256u << 20);
  if (!read) ADD_FAILURE() << read.error().message;
  return read ? std::move(read).value() : std::string();
}

// ---- a GGUF header of `n` tensors, the last one past the end of the file ----

void put_u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }

// n tensors of 8 F32 each, packed at offsets i * 32; the data section holds
// all but the last (a sparse tail), so the parser reads the whole table
// before it finds the defect. The file's bytes, the tail's zeros included;
// *table_end: where the table ends (the parser must read the byte before).
std::string many_tensors(uint64_t n, uint64_t* table_end = nullptr) {
  std::string b;
  b.reserve(n * 80);
  put_u32(b, airs::gguf::kMagic);
  put_u32(b, 3);
  put_u64(b, n);
  put_u64(b, 0);
  for (uint64_t i = 0; i < n; ++i) {
    const std::string name = fmt::format("blk.{}.a_tensor_name_long_enough_to_fill", i);
    put_u64(b, name.size());
    b += name;
    put_u32(b, 1);
    put_u64(b, 8);
    put_u32(b, 0);  // F32
    put_u64(b, i * 32);
  }
  if (table_end != nullptr) *table_end = b.size();
  const uint64_t data_offset = (b.size() + 31) / 32 * 32;
  b.resize(data_offset + (n - 1) * 32, '\0');
  return b;
}

// ---- GetStatus every 100 ms on a connection of its own ----

// `during`: a state the test holds the daemon in (a request of a FUSE
// server held unanswered). An answer counts in answered_during() when
// `during` was true both when its call went out and when it came back: the
// loop answered while that state lasted, which a loop stuck in the held
// request never could. How long an answer took is only printed: a loaded
// machine (a sanitizer, a guest under TCG) makes any bound on it a race.
class StatusWatcher {
 public:
  explicit StatusWatcher(const std::string& address, std::function<bool()> during = {})
      : during_(std::move(during)), thread_([this, address] { run(address); }) {}
  ~StatusWatcher() { stop(); }
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  [[nodiscard]] int answered_during() const { return answered_during_; }
  // After stop().
  [[nodiscard]] std::chrono::milliseconds slowest() const { return slowest_; }
  [[nodiscard]] int answered() const { return answered_; }
  [[nodiscard]] const std::string& failure() const { return failure_; }

 private:
  void run(const std::string& address) {
    auto c = sdbus::createSessionBusConnectionWithAddress(address);
    auto p = sdbus::createProxy(*c, "org.aios.Airs1", "/org/aios/Airs1");
    // At least one call, however soon stop() comes: a test whose loads end
    // before this thread has connected still asks the daemon once (it did
    // not, and "answered nothing" failed a run whose loads took 0.2 s).
    do {
      const auto t0 = Clock::now();
      const bool held_before = during_ && during_();
      try {
        Dict st;
        p->callMethod("GetStatus").onInterface(kManagerIf).withTimeout(60s).storeResultsTo(st);
        ++answered_;
        if (held_before && during_()) ++answered_during_;
      } catch (const sdbus::Error& e) {
        failure_ = e.getName() + ": " + e.getMessage();
      }
      slowest_ = std::max(slowest_, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0));
      if (!done_) std::this_thread::sleep_for(100ms);
    } while (!done_);
  }
  std::function<bool()> during_;
  std::atomic<bool> done_{false};
  std::atomic<int> answered_during_{0};
  std::chrono::milliseconds slowest_{0};
  int answered_ = 0;
  std::string failure_;
  std::thread thread_;
};

// `fn` running in a child process (no threads: a child of this
// multi-threaded process must start none under TSan); finish() returns
// what it returned.
struct Child {
  pid_t pid = -1;
  int out = -1;
};
Child spawn(const std::function<std::string()>& fn) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    const std::string out = fn();
    (void)!::write(p[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(p[1]);
  return {pid, p[0]};
}
std::string finish(Child c) {
  if (c.pid < 0) return "fork failed";
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(c.out, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(c.out);
  int st = 0;
  ::waitpid(c.pid, &st, 0);
  return out;
}


// The names of `pid`'s threads.
std::string thread_names(pid_t pid) {
  std::string out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : fs::directory_iterator(dir, ec)) {
    std::ifstream in(t.path() / "comm");
    std::string name;
    std::getline(in, name);
    out += name + "\n";
  }
  return out;
}

// How many threads of process `pid` have the name `name`.
int threads_named(pid_t pid, const std::string& name) {
  std::stringstream names(thread_names(pid));
  int n = 0;
  for (std::string l; std::getline(names, l);) n += l == name ? 1 : 0;
  return n;
}

// LoadModel of `path` on a new connection: "ok <object>" or "<error name>: <message>".
std::string load_on_new_connection(const std::string& address, const std::string& path,
                                   std::chrono::seconds timeout = 60s) {
  try {
    auto c = sdbus::createSessionBusConnectionWithAddress(address);
    auto p = sdbus::createProxy(*c, "org.aios.Airs1", "/org/aios/Airs1");
    sdbus::ObjectPath obj;
    p->callMethod("LoadModel").onInterface(kManagerIf).withTimeout(timeout)
        .withArguments(sdbus::UnixFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC), sdbus::adopt_fd), Dict{})
        .storeResultsTo(obj);
    return "ok " + std::string(obj);
  } catch (const sdbus::Error& e) {
    return e.getName() + ": " + e.getMessage();
  }
}

// ---- a FUSE file system of one file whose READ is never answered ----
// (or, given the file's bytes, answered after `delay`: a slow file that
// does return)

class StalledFuse {
 public:
  static constexpr uint64_t kFileNode = 2;
  StalledFuse(const std::string& dir, uint64_t size) : StalledFuse(dir, size, std::nullopt, {}) {}
  StalledFuse(const std::string& dir, std::string bytes, std::chrono::milliseconds delay)
      : StalledFuse(dir, 0, std::move(bytes), delay) {}
  // `size` is the file's unless `bytes` are given.
  StalledFuse(const std::string& dir, uint64_t size, std::optional<std::string> bytes, std::chrono::milliseconds delay)
      : dir_(dir), size_(bytes ? bytes->size() : size), bytes_(std::move(bytes)), delay_(delay) {
    if (::access("/dev/fuse", F_OK) != 0) {
      why_not_ = "/dev/fuse is missing (no FUSE on this machine)";
      return;
    }
    fd_ = ::open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd_ < 0) {
      why_not_ = std::string("opening /dev/fuse: ") + std::strerror(errno);
      return;
    }
    wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_ < 0) {
      why_not_ = std::string("eventfd: ") + std::strerror(errno);
      return;
    }
    fs::create_directories(dir_);
    ::chmod(dir_.c_str(), 0755);
    const std::string opts = fmt::format("fd={},rootmode=40000,user_id=0,group_id=0,allow_other", fd_);
    if (::mount("airs-stall", dir_.c_str(), "fuse.airs-stall", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) {
      why_not_ = std::string("mounting a FUSE file system: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
    thread_ = std::thread([this] { serve(); });
  }
  ~StalledFuse() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    if (wake_ >= 0) ::close(wake_);
  }
  [[nodiscard]] const std::optional<std::string>& why_not() const { return why_not_; }
  [[nodiscard]] std::string file() const { return dir_ + "/stalled.gguf"; }
  [[nodiscard]] int reads_held() const { return reads_held_; }
  // From now on the kernel keeps no attribute of the file (attr_valid 0),
  // and a GETATTR goes unanswered once stall_attributes() was called.
  void keep_no_attributes() { keep_attrs_ = false; }
  void stall_attributes() { stall_attrs_ = true; }
  // Every OPEN after the first `n` goes unanswered.
  void stall_opens_after(int n) { opens_answered_max_ = n; }
  [[nodiscard]] int opens_held() const { return opens_held_; }
  // A FLUSH (sent at every close of the file) from a thread of process
  // `pid` goes unanswered; 0: every FLUSH is answered again (held ones stay
  // held). Only that process's: the bus daemon, which passes the file on,
  // closes its own copy too.
  void stall_flushes_of(pid_t pid) { flush_stalled_for_ = pid; }
  [[nodiscard]] int flushes_held() const { return flushes_held_; }
  [[nodiscard]] int getattrs_held() const { return getattrs_held_; }
  [[nodiscard]] int reads_answered() const { return reads_answered_; }
  // Given the file's bytes: a READ at `offset` or later goes unanswered.
  void stall_reads_from(uint64_t offset) { stall_reads_from_ = offset; }
  // Given the file's bytes: a READ that reaches byte `offset` waits until
  // answer_waiting_reads(), which answers each in full (and every later
  // READ at once).
  void hold_reads_reaching(uint64_t offset) { hold_reaching_ = offset; }
  [[nodiscard]] int reads_waiting() const { return reads_waiting_; }
  void answer_waiting_reads() {
    answer_waiting_ = true;
    (void)!::eventfd_write(wake_, 1);
  }

 private:
  void reply(const fuse_in_header& in, int error, const void* body = nullptr, size_t len = 0) {
    fuse_out_header out{};
    out.len = static_cast<uint32_t>(sizeof out + len);
    out.error = -error;
    out.unique = in.unique;
    iovec iov[2] = {{&out, sizeof out}, {const_cast<void*>(body), len}};
    (void)!::writev(fd_, iov, len > 0 ? 2 : 1);
  }
  // The process of thread `tid` (its Tgid), 0 if unknown.
  static pid_t process_of(pid_t tid) {
    std::ifstream in("/proc/" + std::to_string(tid) + "/status");
    for (std::string l; std::getline(in, l);)
      if (l.rfind("Tgid:", 0) == 0) return static_cast<pid_t>(std::stol(l.substr(5)));
    return 0;
  }
  fuse_attr attr_of(uint64_t node) const {
    fuse_attr a{};
    a.ino = node;
    a.mode = node == kFileNode ? (S_IFREG | 0644) : (S_IFDIR | 0755);
    a.size = node == kFileNode ? size_ : 0;
    a.nlink = node == kFileNode ? 1 : 2;
    a.blksize = 4096;
    return a;
  }
  void handle(const fuse_in_header& in, const char* arg) {
    switch (in.opcode) {
      case FUSE_INIT: {
        const auto* i = reinterpret_cast<const fuse_init_in*>(arg);
        fuse_init_out o{};
        o.major = FUSE_KERNEL_VERSION;
        o.minor = FUSE_KERNEL_MINOR_VERSION;
        o.max_readahead = i->max_readahead;
        o.max_write = 65536;
        return reply(in, 0, &o, sizeof o);
      }
      case FUSE_LOOKUP: {
        if (std::string(arg) != "stalled.gguf") return reply(in, ENOENT);
        fuse_entry_out e{};
        e.nodeid = kFileNode;
        e.generation = 1;
        e.entry_valid = 3600;
        e.attr_valid = keep_attrs_ ? 3600 : 0;
        e.attr = attr_of(kFileNode);
        return reply(in, 0, &e, sizeof e);
      }
      case FUSE_GETATTR: {
        if (stall_attrs_) {
          ++getattrs_held_;
          return;  // never answered: the caller waits until the connection goes
        }
        fuse_attr_out a{};
        a.attr_valid = keep_attrs_ ? 3600 : 0;
        a.attr = attr_of(in.nodeid);
        return reply(in, 0, &a, sizeof a);
      }
      case FUSE_OPEN:
        if (opens_answered_ >= opens_answered_max_) {
          ++opens_held_;
          return;  // never answered: the opener waits until the connection goes
        }
        ++opens_answered_;
        [[fallthrough]];
      case FUSE_OPENDIR: {
        // Direct I/O: no page cache, so each read of the file is a READ of
        // its own, and a second open does not wait on a page the first
        // stalled read holds locked.
        fuse_open_out o{};
        o.fh = 1;
        o.open_flags = in.opcode == FUSE_OPEN ? FOPEN_DIRECT_IO : 0;
        return reply(in, 0, &o, sizeof o);
      }
      case FUSE_READ: {
        const auto* r = reinterpret_cast<const fuse_read_in*>(arg);
        if (bytes_ && !answer_waiting_ && r->offset + r->size > hold_reaching_) {
          waiting_.push_back({in, r->offset, r->size});
          ++reads_waiting_;
          return;  // answered by answer_waiting_reads()
        }
        ++reads_held_;
        if (!bytes_ || r->offset >= stall_reads_from_) return;  // never answered: the reader waits until the connection goes
        std::this_thread::sleep_for(delay_);
        --reads_held_;
        return answer_read(in, r->offset, r->size);
      }
      case FUSE_FLUSH:
        if (const pid_t of = flush_stalled_for_; of != 0 && process_of(static_cast<pid_t>(in.pid)) == of) {
          ++flushes_held_;
          return;  // never answered: the closer waits until the connection goes
        }
        return reply(in, 0);
      case FUSE_RELEASE:
      case FUSE_RELEASEDIR:
      case FUSE_ACCESS:
        return reply(in, 0);
      case FUSE_INTERRUPT:
      case FUSE_FORGET:
      case FUSE_BATCH_FORGET:
        return;
      default:
        return reply(in, ENOSYS);
    }
  }
  void answer_read(const fuse_in_header& in, uint64_t offset, uint32_t size) {
    const uint64_t at = std::min<uint64_t>(offset, bytes_->size());
    const uint64_t len = std::min<uint64_t>(size, bytes_->size() - at);
    ++reads_answered_;
    reply(in, 0, bytes_->data() + at, len);
  }
  void serve() {
    std::vector<char> buf(FUSE_MIN_READ_BUFFER + (1u << 20));
    while (!stop_) {
      if (answer_waiting_ && !waiting_.empty()) {
        for (const auto& w : waiting_) answer_read(w.in, w.offset, w.size);
        waiting_.clear();
        reads_waiting_ = 0;
      }
      pollfd p[2] = {{fd_, POLLIN, 0}, {wake_, POLLIN, 0}};
      if (::poll(p, 2, 100) <= 0) continue;
      if (p[1].revents & POLLIN) {
        eventfd_t v;
        (void)!::eventfd_read(wake_, &v);
      }
      if (!(p[0].revents & (POLLIN | POLLERR | POLLHUP))) continue;
      const ssize_t n = ::read(fd_, buf.data(), buf.size());
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == ENOENT)) continue;
      if (n < static_cast<ssize_t>(sizeof(fuse_in_header))) return;  // unmounted (ENODEV)
      const auto* in = reinterpret_cast<const fuse_in_header*>(buf.data());
      handle(*in, buf.data() + sizeof *in);
    }
  }

  struct Waiting {
    fuse_in_header in;
    uint64_t offset;
    uint32_t size;
  };
  std::string dir_;
  uint64_t size_;
  std::optional<std::string> bytes_;
  std::chrono::milliseconds delay_;
  int fd_ = -1;
  int wake_ = -1;
  std::vector<Waiting> waiting_;  // the serving thread's
  std::atomic<uint64_t> hold_reaching_{UINT64_MAX};
  std::atomic<bool> answer_waiting_{false};
  std::atomic<int> reads_waiting_{0};
  bool mounted_ = false;
  std::optional<std::string> why_not_;
  std::atomic<bool> stop_{false};
  std::atomic<int> reads_held_{0};
  std::atomic<int> reads_answered_{0};
  std::atomic<uint64_t> stall_reads_from_{UINT64_MAX};
  std::atomic<bool> keep_attrs_{true};
  std::atomic<bool> stall_attrs_{false};
  std::atomic<int> getattrs_held_{0};
  std::atomic<int> opens_answered_max_{INT_MAX};
  std::atomic<int> opens_answered_{0};
  std::atomic<int> opens_held_{0};
  std::atomic<pid_t> flush_stalled_for_{0};
  std::atomic<int> flushes_held_{0};
  std::thread thread_;
};

class LoadStall : public ::testing::Test {
 protected:
  // `daemon`: more keys of [daemon]; `toml`: more sections.
  void start(const std::string& toml, const std::string& daemon = "") {
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
    bus_ = std::make_unique<PrivateBus>();
    daemon_ = std::make_unique<DaemonProcess>(
        bus_->address(), "[daemon]\ntrusted_group = \"\"\n" + daemon + "[pool]\nsize = \"64M\"\n" + toml);
    ASSERT_TRUE(daemon_->started()) << daemon_->log();
  }
  void TearDown() override {
    if (daemon_ && daemon_->pid() > 0) {
      EXPECT_EQ(daemon_->stop(), 0) << "the daemon did not exit cleanly:\n" << daemon_->log();
    }
  }
  std::string path(const std::string& name) const { return dir_.path() + "/" + name; }
  // Stops the daemon while one of its threads waits in a request of
  // `fuse` (a READ or OPEN the server has taken). Such a wait cannot be
  // interrupted, not even by SIGKILL: the kernel keeps the thread (and so
  // the process, as a zombie) until the server answers or goes. So: the
  // daemon says it stopped, then the server goes, then its exit code is 0.
  void stop_with_a_request_stuck_in(std::unique_ptr<StalledFuse> fuse) {
    ASSERT_EQ(::kill(daemon_->pid(), SIGTERM), 0);
    const auto stopped = Clock::now() + 10s;
    while (daemon_->log().find("info: stopped") == std::string::npos && Clock::now() < stopped)
      std::this_thread::sleep_for(50ms);
    EXPECT_NE(daemon_->log().find("info: stopped"), std::string::npos) << "no clean stop:\n" << daemon_->log();
    fuse.reset();
    EXPECT_EQ(daemon_->stop(), 0) << "the daemon did not exit cleanly with a request stuck:\n" << daemon_->log();
  }

  TempDir dir_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
};

}  // namespace

// A header of a million tensors (the last one past the end of the file),
// loaded from two connections at once through a FUSE file whose server
// holds each load's read of the table's last bytes: both parses have then
// gone through a million tensors and wait in that read, and GetStatus is
// answered meanwhile, which a loop that parsed or read a header could not
// be. Answered, each load gets its own error naming the tensor.
TEST_F(LoadStall, AMillionTensorHeaderFromTwoConnectionsLeavesTheLoopServing) {
  // Under TSan, which looks for races between the header threads and the
  // loop (the same whatever the header's length), 64 Ki tensors: there a
  // million cost a minute on the CI's longest lane.
#if defined(AIRS_TSAN)
  constexpr uint64_t n = uint64_t{1} << 16;
#else
  constexpr uint64_t n = uint64_t{1} << 20;
#endif
  uint64_t table_end = 0;
  std::string bytes = many_tensors(n, &table_end);
  auto fuse = std::make_unique<StalledFuse>(path("fuse"), std::move(bytes), 0ms);
  if (fuse->why_not()) GTEST_SKIP() << "no file system to hold the header's reads: " << *fuse->why_not();
  fuse->hold_reads_reaching(table_end - 1);
  // Only the held read counts as a stall (parsing does not), and the test
  // holds it as long as it takes.
  start("[models]\nheader_timeout = \"3600s\"\n");
  if (HasFatalFailure()) return;
  StalledFuse* f = fuse.get();
  StatusWatcher watcher(bus_->address(), [f] { return f->reads_waiting() == 2; });
  std::string r1, r2;
  const auto t0 = Clock::now();
  std::thread a([&] { r1 = load_on_new_connection(bus_->address(), fuse->file(), 3600s); });
  std::thread b([&] { r2 = load_on_new_connection(bus_->address(), fuse->file(), 3600s); });
  struct Join {
    StalledFuse& fuse;
    std::thread &a, &b;
    ~Join() {
      fuse.answer_waiting_reads();
      for (auto* t : {&a, &b})
        if (t->joinable()) t->join();
    }
  } join{*fuse, a, b};
  EXPECT_TRUE(wait_until([&] { return fuse->reads_waiting() == 2; }, 600000ms))
      << "the two loads never reached the table's end: " << fuse->reads_waiting() << " reads wait\n"
      << daemon_->log();
  const auto parsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_TRUE(wait_until([&] { return watcher.answered_during() > 0; }, 120000ms))
      << "no GetStatus was answered while both header reads waited";
  fuse->answer_waiting_reads();
  a.join();
  b.join();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  watcher.stop();
  for (const auto& r : {r1, r2}) {
    EXPECT_EQ(r.rfind("org.aios.Airs1.Error.BadModel: ", 0), 0u) << r;
    EXPECT_NE(r.find(fmt::format("tensor[{}]", n - 1)), std::string::npos) << r;
    EXPECT_NE(r.find("extends past the end of the file"), std::string::npos) << r;
  }
  EXPECT_TRUE(watcher.failure().empty()) << watcher.failure();
  std::cout << "two loads of a header of " << n << " tensors: both at the table's end after " << parsed.count()
            << " ms, answered after " << took.count() << " ms; " << watcher.answered_during()
            << " GetStatus answered while both waited there (slowest GetStatus: " << watcher.slowest().count()
            << " ms, " << watcher.answered() << " answered)\n";
}

// The stall limit counts the time a read of the file is in flight, not the
// time the whole header takes: a slow file whose every read returns within
// the limit is read to the end however long that takes, and its load gets
// the header's own verdict, never the stall.
TEST_F(LoadStall, ASlowFileWhoseReadsReturnIsReadToTheEnd) {
  std::string bytes = many_tensors(20000);
  // The parser reads 64 KiB at a time: the header alone is this many reads.
  ASSERT_GE(bytes.size(), 20u * 64 * 1024) << "the header is too short to need many reads";
  auto fuse = std::make_unique<StalledFuse>(path("fuse"), std::move(bytes), 150ms);
  if (fuse->why_not()) GTEST_SKIP() << "no slow file to load: " << *fuse->why_not();
  start("[models]\nheader_timeout = \"2s\"\n");
  const auto t0 = Clock::now();
  const std::string r = load_on_new_connection(bus_->address(), fuse->file());
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_EQ(r.rfind("org.aios.Airs1.Error.BadModel: ", 0), 0u) << r;
  EXPECT_NE(r.find("tensor[19999]"), std::string::npos) << r;
  EXPECT_NE(r.find("extends past the end of the file"), std::string::npos) << r;
  // Each read took 150 ms, and there were enough of them (14 make 2.1 s) that
  // the header as a whole took longer than the limit.
  EXPECT_GE(fuse->reads_answered(), 14) << r;
  std::cout << "a header of " << fuse->reads_answered() << " slow reads read in " << took.count()
            << " ms with a 2000 ms stall limit\n";
  fuse.reset();
}

// kv.max_fds_per_uid recounts the descriptors of ours that a caller's
// process holds by following each entry of /proc/PID/fd. A caller that
// also holds a file of a FUSE server it runs (or of a hung NFS mount) must
// not make that recount wait for the file system: here the server never
// answers a GETATTR, and the call over the quota is refused at once.
TEST_F(LoadStall, AStalledFuseFileHeldByACallerDoesNotStallTheFdQuotaRecount) {
  auto fuse = std::make_unique<StalledFuse>(path("fuse"), 4u << 20);
  if (fuse->why_not()) GTEST_SKIP() << "no stalled file system: " << *fuse->why_not();
  fuse->keep_no_attributes();
  start("[kv]\nmax_fds_per_uid = 6\n");
  if (HasFatalFailure()) return;
  const auto m = airs::test::write_test_model("airs-fdq", "fdq", 2, 256);
  BusClient c(bus_->address());
  std::string obj;
  ASSERT_TRUE(c.load_model(m.path, &obj).ok());
  BusClient::Session s1, s2, s3;
  ASSERT_TRUE(c.create_session(obj, "interactive", &s1).ok());
  ASSERT_TRUE(c.create_session(obj, "interactive", &s2).ok());  // 6 fds of 6
  const int held = ::open(fuse->file().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0) << std::strerror(errno);
  fuse->stall_attributes();
  const auto t0 = Clock::now();
  const auto e = c.create_session(obj, "interactive", &s3);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_EQ(e.name, "org.aios.Airs1.Error.QuotaExceeded") << e.message;
  EXPECT_NE(e.message.find("holds 6 of its 6"), std::string::npos) << e.message;
  EXPECT_EQ(fuse->getattrs_held(), 0) << "the recount asked the file system";
  EXPECT_NE(c.status().dump(), "") << "the daemon stopped answering";
  std::cout << "a call over the fd quota, with a stalled FUSE file held: refused in " << took.count() << " ms\n";
  for (const auto* s : {&s1, &s2})
    for (int fd : {s->arena_fd, s->notice_fd, s->event_fd}) ::close(fd);
  ::close(held);
  fuse.reset();
}

// Open proves read access with the caller's fd, checked on the loop. The
// file may be on a FUSE mount the caller serves itself, whose attributes it
// never gives: the check takes the attributes the kernel holds and never
// asks the server, so the call is answered at once and the loop goes on.
TEST_F(LoadStall, OpenWithAFuseFileWhoseAttributesNeverComeIsAnsweredAtOnce) {
  auto fuse = std::make_unique<StalledFuse>(path("fuse"), 4u << 20);
  if (fuse->why_not()) GTEST_SKIP() << "no stalled file system: " << *fuse->why_not();
  fuse->keep_no_attributes();
  start("");
  if (HasFatalFailure()) return;
  const auto m = airs::test::write_test_model("airs-fuse-open", "fuseopen", 2, 256);
  BusClient c(bus_->address());
  std::string obj;
  ASSERT_TRUE(c.load_model(m.path, &obj).ok());
  const int proof = ::open(fuse->file().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(proof, 0) << std::strerror(errno);
  fuse->stall_attributes();
  StatusWatcher watcher(bus_->address());
  const auto e = c.open_model_fd(obj, proof, false);
  watcher.stop();
  EXPECT_EQ(e.name, "org.freedesktop.DBus.Error.AccessDenied") << e.message;
  EXPECT_NE(e.message.find("not this model's GGUF file"), std::string::npos) << e.message;
  EXPECT_EQ(fuse->getattrs_held(), 0) << "Open asked the caller's file system for the file's attributes";
  EXPECT_TRUE(watcher.failure().empty()) << watcher.failure();
  std::cout << "Open with a FUSE file whose attributes never come: slowest GetStatus meanwhile "
            << watcher.slowest().count() << " ms\n";
  ::close(proof);
  fuse.reset();
}

TEST_F(LoadStall, AStalledFuseReadFailsItsLoadAndNothingElse) {
  auto fuse = std::make_unique<StalledFuse>(path("fuse"), 4u << 20);
  if (fuse->why_not()) GTEST_SKIP() << "no stalled file to load: " << *fuse->why_not();
  start("[models]\nheader_timeout = \"3s\"\n");
  StalledFuse* f = fuse.get();
  StatusWatcher watcher(bus_->address(), [f] { return f->reads_held() >= 1; });
  const auto t0 = Clock::now();
  const std::string r = load_on_new_connection(bus_->address(), fuse->file());
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  EXPECT_EQ(r.rfind("org.aios.Airs1.Error.Failed: ", 0), 0u) << r;
  EXPECT_NE(r.find("has not returned within 3000 ms"), std::string::npos) << r;
  EXPECT_NE(r.find("stalled"), std::string::npos) << r;
  EXPECT_GE(took, 2900ms) << "answered as stalled before its limit";
  EXPECT_GE(fuse->reads_held(), 1) << "the daemon never read the FUSE file";

  // Another uid: two stalled reads at once are its bound; a third is
  // refused at once, naming the bound, and the two get the stall.
  const std::string address = bus_->address();
  const std::string file = fuse->file();
  const pid_t daemon = daemon_->pid();
  auto out = as_user(kNobody, [&] {
    Child x = spawn([&] { return load_on_new_connection(address, file); });
    Child y = spawn([&] { return load_on_new_connection(address, file); });
    // Both counted: the daemon runs a header thread for each (and still
    // one for the load above, stuck in its read).
    const auto until = Clock::now() + 60s;
    while (threads_named(daemon, "airs-header") < 3 && Clock::now() < until) std::this_thread::sleep_for(10ms);
    if (threads_named(daemon, "airs-header") < 3) return std::string("the two loads never reached the daemon");
    const auto t = Clock::now();
    std::string s3 = load_on_new_connection(address, file);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
    const std::string s1 = finish(x);
    const std::string s2 = finish(y);
    return fmt::format("{}\n{}\n{} ({} ms)", s1, s2, s3, ms);
  });
  const auto lines = [&] {
    std::vector<std::string> v;
    std::stringstream ss(out);
    for (std::string l; std::getline(ss, l);) v.push_back(l);
    return v;
  }();
  ASSERT_EQ(lines.size(), 3u) << out;
  for (size_t i = 0; i < 2; ++i) EXPECT_NE(lines[i].find("has not returned within 3000 ms"), std::string::npos) << out;
  EXPECT_EQ(lines[2].rfind("org.aios.Airs1.Error.QuotaExceeded: ", 0), 0u) << out;
  EXPECT_NE(lines[2].find("uid 65534 has 2 GGUF headers being read already"), std::string::npos) << out;
  // The read stays held: the loop answers GetStatus all the same.
  EXPECT_TRUE(wait_until([&] { return watcher.answered_during() > 0; }, 120000ms))
      << "no GetStatus was answered while a header read was held";
  watcher.stop();
  EXPECT_TRUE(watcher.failure().empty()) << watcher.failure();
  std::cout << "stalled load answered after " << took.count() << " ms; slowest GetStatus meanwhile: "
            << watcher.slowest().count() << " ms (" << watcher.answered() << " answered, "
            << watcher.answered_during() << " while a read was held)\n";
  // The reads are still stuck in the FUSE server, and the daemon stops all
  // the same.
  stop_with_a_request_stuck_in(std::move(fuse));
}

// A user's model on a file whose reads never come back once past its
// header (a FUSE server that takes them and never answers; no cancel frees
// such a read) holds only that user's share of the daemon's read slots,
// half of them. An admin's model loaded meanwhile, from a FUSE file whose
// server answers, is read whole, and the stalled model's reads stay at its
// share. Before: the loop itself blocked in the first stalled read (io_uring
// starts a read in the submitting thread, and FUSE blocks there, in
// io_uring_enter); without the share, the warm-up took all 16 slots and no
// other model was read again.
TEST_F(LoadStall, AFileWhoseReadsNeverReturnHoldsOnlyItsOwnersShareOfTheReadSlots) {
  const uint64_t unit = huge_page_size();
  const ModelFile a = make_model(dir_, "a.gguf", "never-read", 24 * unit, 8, 11);
  std::string bytes = model_bytes(a.path);
  ASSERT_EQ(bytes.size(), a.size());
  ASSERT_GT(a.size(), 20 * unit) << "more units than the daemon has read slots (16)";
  auto fuse = std::make_unique<StalledFuse>(path("fuse"), std::move(bytes), 0ms);
  if (fuse->why_not()) GTEST_SKIP() << "no stalled file to load: " << *fuse->why_not();
  fuse->stall_reads_from(unit);  // the first unit (with the header) is answered, no later one
  start("[models]\nmax_pool_bytes_per_uid = \"100%\"\n");
  const std::string address = bus_->address();
  const std::string file = fuse->file();
  const std::string r = as_user(kNobody, [&] { return load_on_new_connection(address, file); });
  ASSERT_EQ(r.rfind("ok ", 0), 0u) << r << "\n" << daemon_->log();
  // Its warm-up reads every unit; half of the 16 slots reach the server and stay there.
  ASSERT_TRUE(wait_until([&] { return fuse->reads_held() >= 8; }, 60000ms))
      << "the daemon sent " << fuse->reads_held() << " reads of the stalled model\n" << daemon_->log();

  // An admin's model on a FUSE file too, one whose server answers: its
  // reads go to io-wq workers as the stalled ones do.
  const ModelFile b = make_model(dir_, "b.gguf", "read-meanwhile", 4 * unit, 4, 12);
  std::string b_bytes = model_bytes(b.path);
  ASSERT_EQ(b_bytes.size(), b.size());
  auto answering = std::make_unique<StalledFuse>(path("fuse-b"), std::move(b_bytes), 0ms);
  ASSERT_FALSE(answering->why_not()) << *answering->why_not();
  BusClient admin(address);
  std::string object;
  const CallError load = admin.load_model(answering->file(), &object);
  ASSERT_TRUE(load.ok()) << load.name << ": " << load.message;
  // Open (not lazy) answers once every unit of the model is read.
  const CallError open = admin.open_model(object, answering->file(), false, true);
  EXPECT_TRUE(open.ok()) << open.name << ": " << open.message << "\n" << daemon_->log();
  const nlohmann::json m = model_in(admin.status(), object);
  EXPECT_EQ(m.value("resident_bytes", uint64_t{0}), round_up_pages(b.size())) << m.dump();
  EXPECT_EQ(fuse->reads_held(), 8) << "the stalled model holds more than its owner's share of the read slots";
  // Its bytes came through the server: reads of at most 1 MiB each (FUSE's largest).
  EXPECT_GE(answering->reads_answered(), static_cast<int>(b.size() >> 20));
  stop_with_a_request_stuck_in(std::move(fuse));
}

namespace {

// Where the content-id cache keeps the id of a file of stat `st`.
std::string identity_entry(const std::string& state, const struct stat& st) {
  return fmt::format("{}/identity/{:x}-{:x}-{:x}-{}.{:09}-{}.{:09}", state, static_cast<uint64_t>(st.st_dev),
                     static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec,
                     static_cast<int64_t>(st.st_ctim.tv_sec), st.st_ctim.tv_nsec);
}

std::string write_model(const std::string& path, const std::string& name, uint64_t seed) {
  airs::gguf::ModelSpec spec;
  spec.name = name;
  spec.seed = seed;
  auto plan = airs::gguf::plan_model(spec);
  EXPECT_TRUE(plan);
  EXPECT_TRUE(airs::gguf::write_model_file(*plan, path));
  return path;
}

}  // namespace

TEST_F(LoadStall, FifosInTheStateDirectoryDoNotHangTheDaemon) {
  const std::string state = path("state");
  for (const char* d : {"", "/kv", "/kv/0", "/identity", "/order"}) {
    fs::create_directories(state + d);
    ASSERT_EQ(::chmod((state + d).c_str(), 0700), 0);
  }
  // At start: a FIFO named like a KV spill entry of uid 0.
  const std::string entry = state + "/kv/0/" + std::string(32, '1') + "-16-4096-" + std::string(16, '2');
  ASSERT_EQ(::mkfifo(entry.c_str(), 0600), 0);
  start("", "state_dir = \"" + state + "\"\n");

  // While it serves: a FIFO where the content-id cache keeps model a's id.
  const std::string a = write_model(path("a.gguf"), "fifo-a", 1);
  struct stat sa {};
  ASSERT_EQ(::stat(a.c_str(), &sa), 0);
  ASSERT_EQ(::mkfifo(identity_entry(state, sa).c_str(), 0600), 0);
  StatusWatcher watcher(bus_->address());
  // A FIFO opened on the loop would hold it until a writer came: never.
  std::string r = load_on_new_connection(bus_->address(), a, 120s);
  EXPECT_EQ(r.rfind("ok ", 0), 0u) << r << "\n" << daemon_->log();

  // Model b's id is in the cache, and a FIFO is where its access order is.
  const std::string b = write_model(path("b.gguf"), "fifo-b", 2);
  struct stat sb {};
  ASSERT_EQ(::stat(b.c_str(), &sb), 0);
  const int fd = ::open(b.c_str(), O_RDONLY | O_CLOEXEC);
  auto id = airs::gguf::content_id_of_fd(fd, static_cast<uint64_t>(sb.st_size));
  ::close(fd);
  ASSERT_TRUE(id) << id.error().message;
  std::ofstream(identity_entry(state, sb)) << id->hex() << "\n";
  ASSERT_EQ(::mkfifo((state + "/order/" + id->hex()).c_str(), 0600), 0);
  r = load_on_new_connection(bus_->address(), b, 120s);
  EXPECT_EQ(r.rfind("ok ", 0), 0u) << r << "\n" << daemon_->log();
  watcher.stop();
  EXPECT_TRUE(watcher.failure().empty()) << watcher.failure();
  EXPECT_GT(watcher.answered(), 0);
  const std::string log = daemon_->log();
  EXPECT_NE(log.find("recorded access order not used (" + state + "/order/" + id->hex() + ": not a regular file)"),
            std::string::npos)
      << log;
}

// The fill reads a caller's file reopened O_DIRECT, and that reopen is an
// OPEN of the file's file system. It is made with the header, off the loop:
// a FUSE server that answers reads but never a second OPEN fails the load
// naming the stall, and GetStatus is answered all the while.
TEST_F(LoadStall, AFileWhoseSecondOpenIsNeverAnsweredFailsItsLoadAndNothingElse) {
  const std::string local = write_model(path("open.gguf"), "open-stall", 3);
  std::string bytes = model_bytes(local);
  ASSERT_FALSE(bytes.empty());
  auto fuse = std::make_unique<StalledFuse>(path("fuse"), std::move(bytes), 0ms);
  if (fuse->why_not()) GTEST_SKIP() << "no stalled file system: " << *fuse->why_not();
  fuse->stall_opens_after(1);  // the caller's open
  start("[models]\nheader_timeout = \"2s\"\n");
  if (HasFatalFailure()) return;
  StalledFuse* f = fuse.get();
  StatusWatcher watcher(bus_->address(), [f] { return f->opens_held() >= 1; });
  const std::string r = load_on_new_connection(bus_->address(), fuse->file());
  // The OPEN stays held: the loop answers GetStatus all the same.
  EXPECT_TRUE(wait_until([&] { return watcher.answered_during() > 0; }, 120000ms))
      << "no GetStatus was answered while the OPEN was held";
  watcher.stop();
  EXPECT_EQ(r.rfind("org.aios.Airs1.Error.Failed: ", 0), 0u) << r;
  EXPECT_NE(r.find("a read or open of the file has not returned within 2000 ms"), std::string::npos) << r;
  EXPECT_EQ(fuse->opens_held(), 1) << "the daemon did not reopen the file";
  EXPECT_GT(fuse->reads_answered(), 0) << "the daemon never read the header";
  EXPECT_TRUE(watcher.failure().empty()) << watcher.failure();
  std::cout << "a second OPEN held: slowest GetStatus meanwhile " << watcher.slowest().count() << " ms ("
            << watcher.answered_during() << " answered while it was held)\n";
  stop_with_a_request_stuck_in(std::move(fuse));
}

namespace {

// Sends GetStatus with `fd` attached (if not -1), expecting no reply (a
// caller may attach descriptors to any call, and the daemon's bus library
// closes them with the message, on the loop), then a plain GetStatus on the
// same connection, which the daemon takes after the first: "answered", or
// the error.
std::string attach_then_status(const std::string& address, int fd) {
  try {
    auto c = sdbus::createSessionBusConnectionWithAddress(address);
    auto p = sdbus::createProxy(*c, "org.aios.Airs1", "/org/aios/Airs1");
    if (fd >= 0)
      p->callMethod("GetStatus").onInterface(kManagerIf).withArguments(sdbus::UnixFd(fd)).dontExpectReply();
    Dict st;
    p->callMethod("GetStatus").onInterface(kManagerIf).withTimeout(5s).storeResultsTo(st);
    return "answered";
  } catch (const sdbus::Error& e) {
    return e.getName() + ": " + e.getMessage();
  }
}

bool eventually(const std::function<bool()>& pred) {
  const auto until = Clock::now() + 20s;
  while (!pred()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

}  // namespace

// Closing a file of a FUSE mount sends FLUSH, at every close, and waits for
// the server's answer. A caller attaches a file of its own FUSE server to a
// call and never answers the daemon's FLUSH: the close waits on a closer
// thread of its own, never on the loop, and the daemon answers on.
TEST_F(LoadStall, AFuseFileAttachedToACallWhoseFlushIsNeverAnsweredDoesNotHoldTheLoop) {
  auto fuse = std::make_unique<StalledFuse>(path("fuse"), 4u << 20);
  if (fuse->why_not()) GTEST_SKIP() << "no stalled file system: " << *fuse->why_not();
  start("");
  if (HasFatalFailure()) return;
  const int fd = ::open(fuse->file().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  fuse->stall_flushes_of(daemon_->pid());
  EXPECT_EQ(attach_then_status(bus_->address(), fd), "answered");
  EXPECT_TRUE(eventually([&] { return fuse->flushes_held() >= 1; })) << "the daemon never closed the file";
  EXPECT_NE(thread_names(daemon_->pid()).find("airs-close"), std::string::npos) << thread_names(daemon_->pid());
  EXPECT_EQ(attach_then_status(bus_->address(), -1), "answered");
  fuse->stall_flushes_of(0);
  ::close(fd);
  fuse.reset();  // the held FLUSH fails: the closer thread returns
}

// A TCP socket with SO_LINGER and data its peer does not take makes its
// last close wait for the peer, up to the linger time. A caller attaches
// one to a call and closes its own copies, and the bus daemon drops its
// own, so the daemon's close is the last (the daemon is stopped until
// then): it waits on a closer thread, never on the loop.
TEST_F(LoadStall, ALingeringTcpSocketAttachedToACallDoesNotHoldTheLoop) {
  start("");
  if (HasFatalFailure()) return;
  // A listener that never accepts: what is sent to it stays unread. Its
  // close resets the connection, which ends the waiting close.
  struct Listener {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ~Listener() {
      if (fd >= 0) ::close(fd);
    }
  } lst;
  ASSERT_GE(lst.fd, 0) << std::strerror(errno);
  const int small = 4096;
  ASSERT_EQ(::setsockopt(lst.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof a;
  ASSERT_EQ(::bind(lst.fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  ASSERT_EQ(::getsockname(lst.fd, reinterpret_cast<sockaddr*>(&a), &alen), 0);
  ASSERT_EQ(::listen(lst.fd, 1), 0);
  const pid_t daemon = daemon_->pid();
  ASSERT_EQ(::kill(daemon, SIGSTOP), 0);
  struct Continue {
    pid_t pid;
    ~Continue() { ::kill(pid, SIGCONT); }
  } cont{daemon};
  // The caller, a process of its own: it connects, fills the connection,
  // sets a linger of 15 s, attaches the socket to a call and exits.
  const std::string address = bus_->address();
  const std::string r = as_user(0, [&]() -> std::string {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || ::setsockopt(s, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) != 0 ||
        ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return std::string("connect: ") + std::strerror(errno);
    if (::fcntl(s, F_SETFL, O_NONBLOCK) != 0) return "O_NONBLOCK";
    const std::string chunk(4096, 'x');
    size_t sent = 0;
    for (ssize_t n; (n = ::send(s, chunk.data(), chunk.size(), MSG_NOSIGNAL)) > 0;) sent += static_cast<size_t>(n);
    if (errno != EAGAIN || sent == 0) return std::string("filling: ") + std::strerror(errno);
    const linger l{1, 15};
    struct stat st {};
    if (::setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l) != 0 || ::fstat(s, &st) != 0) return "SO_LINGER";
    auto c = sdbus::createSessionBusConnectionWithAddress(address);
    auto p = sdbus::createProxy(*c, "org.aios.Airs1", "/org/aios/Airs1");
    p->callMethod("GetStatus").onInterface(kManagerIf).withArguments(sdbus::UnixFd(s)).dontExpectReply();
    ::close(s);
    // The bus daemon answers this only after it routed the call above.
    auto driver = sdbus::createProxy(*c, "org.freedesktop.DBus", "/org/freedesktop/DBus");
    std::string id;
    driver->callMethod("GetId").onInterface("org.freedesktop.DBus").storeResultsTo(id);
    return "socket:[" + std::to_string(st.st_ino) + "]";
  });
  ASSERT_EQ(r.rfind("socket:[", 0), 0u) << r;
  // The bus daemon passed it on and dropped its copy: the one in the
  // daemon's queue is the last.
  auto bus_holds_it = [&] {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(bus_->pid()) + "/fd", ec))
      if (fs::read_symlink(e.path(), ec).string() == r) return true;
    return false;
  };
  EXPECT_TRUE(eventually([&] { return !bus_holds_it(); })) << "the bus daemon keeps the socket";
  ASSERT_EQ(::kill(daemon, SIGCONT), 0);
  EXPECT_EQ(attach_then_status(bus_->address(), -1), "answered");
  EXPECT_TRUE(eventually([&] { return thread_names(daemon).find("airs-close") != std::string::npos; }))
      << "no closer thread waits: " << thread_names(daemon);
}

}  // namespace airs::test::load_stall
