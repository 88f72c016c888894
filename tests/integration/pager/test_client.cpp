// SPDX-License-Identifier: Apache-2.0
// A lazy client process for the pager integration tests: receives the model
// region over a socket, maps it with LazyMapping, hands its uffd to the
// in-test daemon and then touches the mapping according to its mode,
// comparing every byte with the source file. Exit codes: 0 bytes correct,
// 3 wrong bytes, 4 forked child saw something other than SIGSEGV, 10+ setup.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/lazy_map.hpp"
#include "client/touch_guard.hpp"
#include "wire/opened.hpp"
#include "wire/requests.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"
#include "wire.hpp"
#include "support/same_bytes.hpp"

using airs::client::FallbackServer;
using airs::client::LazyBacking;
using airs::client::LazyMapping;
using airs::wire::StatusPageView;
namespace wire = airs::wire;

namespace {

int g_src = -1;
uint64_t g_file_size = 0;
uint64_t g_unit = 0;

// Compare one unit of the mapping with the source (tail past EOF: zeros,
// unless `past_eof` is false: then only the file's bytes are read).
bool verify_unit(const std::byte* base, uint64_t u, bool past_eof = true) {
  thread_local std::vector<std::byte> want;
  want.assign(g_unit, std::byte{0});
  const uint64_t off = u * g_unit;
  const uint64_t n = off < g_file_size ? std::min(g_unit, g_file_size - off) : 0;
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(g_src, want.data() + done, n - done, static_cast<off_t>(off + done));
    if (r <= 0) {
      std::fprintf(stderr, "client %d: pread of source failed\n", getpid());
      return false;
    }
    done += static_cast<uint64_t>(r);
  }
  const uint64_t len = past_eof ? g_unit : n;
  if (!airs::test::same_bytes(base + off, want.data(), len)) {
    for (uint64_t i = 0; i < len; ++i)
      if (base[off + i] != want[i]) {
        std::fprintf(stderr, "client %d: unit %lu differs at byte %lu: got %02x want %02x\n", getpid(),
                     static_cast<unsigned long>(u), static_cast<unsigned long>(off + i),
                     static_cast<unsigned>(base[off + i]), static_cast<unsigned>(want[i]));
        break;
      }
    return false;
  }
  return true;
}

// Cooperative mode: no uffd, a read-only mapping of an O_RDONLY fd, and
// waits on the status page before touching.
//   coop-ranks     wait for each load rank in order, then check its units
//                  (while the fill is still going on: exit 7 if everything
//                  was already resident at the first rank, nothing tested)
//   coop-resident  wait for full residency, then check every unit
//   coop-fallback  like coop-ranks while the daemon dies mid-load: the waits
//                  swap the GGUF file in; then every byte of the file must
//                  read right at the same address (exit 7: the model was
//                  resident before the daemon died, nothing tested). Sends
//                  one byte on its socket before it first waits for a rank
//                  that is not ready (the test kills the daemon then).
// Whether the region's shmem file holds huge folios: a memfd (named
// "/memfd:...") never does here; a file of the daemon's huge tmpfs does.
// Waits for the test's one-byte "go": sent once its attach call has
// returned, so the daemon's loop is still from then on. The attach itself
// signals "attached" and only then reads the faults already queued, so a
// fault raised between the two would be answered by the daemon.
bool wait_go(int sock) {
  char go = 0;
  for (;;) {
    const ssize_t n = ::recv(sock, &go, 1, 0);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

bool region_on_huge_folios(int fd) {
  char link[256] = {};
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
  return n > 0 && std::strncmp(link, "/memfd:", 7) != 0;
}

// ShmemPmdMapped (kB) of the /proc/self/smaps entry starting at `addr`.
uint64_t pmd_mapped_kb(const void* addr) {
  std::FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return 0;
  char line[512];
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(addr));
  bool in = false;
  uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, start, std::strlen(start)) == 0) in = true;
    else if (in && std::strncmp(line, "ShmemPmdMapped:", 15) == 0) {
      kb = std::strtoull(line + 15, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kb;
}

// coop-touch:N  a streamed model through the touch guard (PROT_NONE, each
//                unit opened on its touch, wire/opened.hpp): sends the daemon
//                its request socket and open-unit bits (a TouchMsg with two
//                fds), closes what the daemon asks to close (a watcher
//                thread), and reads every unit N times in order, checking
//                every byte. Exit 0: right bytes; 3 wrong; 60+ setup.
// coop-touch:N:SEED  the same, each time in another order (shuffled with
//                SEED): touches far from where the daemon saw it last.
int run_touch(uint32_t tokens, uint32_t seed, int sock, int region_fd, const airs::test::Hello& hello,
              wire::StatusPageView status) {
  const uint64_t units = status.unit_count();
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return 60;
  airs::sys::UniqueFd mine(sv[0]), theirs(sv[1]);
  auto bits = airs::sys::memfd_create_sealable("opened", wire::opened_bytes(static_cast<uint32_t>(units)));
  if (!bits) return 61;
  auto bmap = airs::sys::map_shared(bits->get(), wire::opened_bytes(static_cast<uint32_t>(units)),
                                    PROT_READ | PROT_WRITE, 0, "opened");
  if (!bmap || !airs::sys::seal_size(bits->get(), "opened")) return 62;
  airs::test::AttachMsg am{0, 0};
  if (!airs::test::send_msg(sock, &am, sizeof am, {theirs.get(), bits->get()})) return 63;
  auto daemon = airs::sys::pidfd_open(hello.daemon_pid);
  if (!daemon) return 64;
  auto region = airs::sys::map_shared(region_fd, hello.region_size, PROT_NONE, 0, "region");
  if (!region) return 65;
  airs::client::TouchGuardSpec spec;
  spec.base = region->get();
  spec.size = hello.region_size;
  spec.status = status;
  spec.request_fd = mine.get();
  spec.daemon_pidfd = daemon->get();
  spec.gguf_fd = g_src;
  spec.opened = bmap->get();
  auto guard = airs::client::TouchGuard::create(spec);
  if (!guard) return 66;
  std::atomic<bool> stop{false};
  std::thread closer([&] {
    while (!stop.load()) {
      pollfd p{mine.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      uint32_t w = 0;
      const auto r = airs::sys::read_message(mine.get(), &w, sizeof w);
      if (r.state == airs::sys::MessageRead::Message && wire::decode_request(w).kind == wire::RequestKind::Close)
        (*guard)->close_unit(wire::decode_request(w).unit);
      if (r.state == airs::sys::MessageRead::Closed) return;
    }
  });
  const std::byte* base = region->bytes();
  std::vector<uint64_t> order(units);
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::mt19937 rng(seed);
  int rc = 0;
  for (uint32_t t = 0; t < tokens && rc == 0; ++t) {
    if (seed != 0) std::shuffle(order.begin(), order.end(), rng);
    for (uint64_t i = 0; i < units && rc == 0; ++i)
      if (!verify_unit(base, order[i])) rc = 3;
  }
  stop.store(true);
  closer.join();
  if (rc == 0 && (*guard)->touches() == 0) rc = 67;  // nothing went through the guard: nothing tested
  return rc;
}

// coop-resident: waits until the whole model is resident, then checks it.
int coop_resident(const std::byte* base, uint64_t units, wire::StatusPageView status) {
  auto st = airs::client::wait_resident(status, std::chrono::seconds(30));
  if (!st) {
    std::fprintf(stderr, "client: %s\n", st.error().message.c_str());
    return 53;
  }
  for (uint64_t u = 0; u < units; ++u)
    if (!verify_unit(base, u)) return 3;
  return 0;
}

// Says so (one byte on the socket) before it first waits, once: the test
// holds the fill until then. 0, or the exit code.
int say_waiting(int sock, bool& said) {
  if (said) return 0;
  const char b = 'w';
  if (::send(sock, &b, 1, MSG_NOSIGNAL) != 1) return 58;
  said = true;
  return 0;
}

// Checks every unit the status page says is ready and `checked` does not
// hold yet (the rest must not be read). 0, or 3 for a wrong byte.
int check_ready_units(const std::byte* base, uint64_t units, wire::StatusPageView status, std::vector<bool>& checked) {
  for (uint64_t u = 0; u < units; ++u) {
    if (checked[u] || !status.unit_ready(static_cast<uint32_t>(u))) continue;
    if (!verify_unit(base, u)) return 3;
    checked[u] = true;
  }
  return 0;
}

// coop-fallback: waits rank by rank until the daemon dies, then every byte
// comes from the file through the same pointer.
int coop_fallback(const std::byte* base, void* mapping, uint64_t units, int sock, const airs::test::Hello& hello,
                  wire::StatusPageView status) {
  auto daemon = airs::sys::pidfd_open(hello.daemon_pid);
  if (!daemon) return 23;
  std::atomic<int> announced{0};
  airs::client::CooperativeFallback fb(mapping, hello.region_size, g_src, daemon->get(), [&] { ++announced; });
  std::vector<bool> checked(units, false);
  std::vector<airs::wire::RankEntry> ranks(status.ranks(), status.ranks() + status.rank_count());
  bool said_waiting = false;
  for (const auto& r : ranks) {
    if (!status.rank_ready(r.rank))
      if (int rc = say_waiting(sock, said_waiting); rc != 0) return rc;
    auto st = airs::client::wait_rank(status, r.rank, std::chrono::seconds(30), &fb);
    if (!st) {
      std::fprintf(stderr, "client: rank %u: %s\n", r.rank, st.error().message.c_str());
      return 53;
    }
    if (fb.taken_over()) break;
    if (int rc = check_ready_units(base, units, status, checked); rc != 0) return rc;
  }
  if (!fb.taken_over()) return 7;
  if (announced.load() != 1) return 55;
  if (status.ready_units() == status.unit_count()) return 7;
  // Ready units or not, every byte of the file through the same pointer.
  for (uint64_t u = 0; u < units; ++u)
    if (!verify_unit(base, u, false)) return 3;
  // A second take-over is a no-op, and the waits return at once now.
  if (!fb.take_over() || announced.load() != 1) return 56;
  if (!airs::client::wait_resident(status, std::chrono::seconds(0), &fb)) return 57;
  std::fprintf(stderr, "client %d: took over with %u of %u units filled by the daemon\n", getpid(),
               status.ready_units(), status.unit_count());
  return 0;
}

// coop-ranks: waits rank by rank and checks each unit once its rank is
// complete (a unit belongs to the lowest rank of the extents it overlaps).
int coop_ranks(const std::byte* base, uint64_t units, int sock, wire::StatusPageView status) {
  const bool resident_at_start = status.ready_units() == status.unit_count();
  std::vector<airs::wire::RankEntry> ranks(status.ranks(), status.ranks() + status.rank_count());
  std::vector<bool> checked(units, false);
  uint32_t waited_for_something = 0;
  bool said_waiting = false;
  for (const auto& r : ranks) {
    const bool before = status.rank_ready(r.rank);
    if (!before)
      if (int rc = say_waiting(sock, said_waiting); rc != 0) return rc;
    auto st = airs::client::wait_rank(status, r.rank, std::chrono::seconds(30));
    if (!st) {
      std::fprintf(stderr, "client: rank %u: %s\n", r.rank, st.error().message.c_str());
      return 53;
    }
    if (!before) ++waited_for_something;
    if (int rc = check_ready_units(base, units, status, checked); rc != 0) return rc;
  }
  if (airs::client::wait_resident(status, std::chrono::seconds(30)).ok() == false) return 54;
  for (uint64_t u = 0; u < units; ++u)
    if (!checked[u] && !verify_unit(base, u)) return 3;
  if (resident_at_start || waited_for_something == 0) return 7;
  return 0;
}

int run_cooperative(const std::string& mode, int sock, int region_fd, const airs::test::Hello& hello,
                    wire::StatusPageView status) {
  if ((::fcntl(region_fd, F_GETFL) & O_ACCMODE) != O_RDONLY) return 50;
  if (mode.starts_with("coop-touch:")) {
    const std::string args = mode.substr(11);
    const size_t colon = args.find(':');
    const auto seed = colon == std::string::npos ? 0U : static_cast<uint32_t>(std::stoul(args.substr(colon + 1)));
    return run_touch(static_cast<uint32_t>(std::stoul(args.substr(0, colon))), seed, sock, region_fd, hello, status);
  }
  // A writable mapping must be refused on the O_RDONLY fd.
  if (::mmap(nullptr, hello.region_size, PROT_READ | PROT_WRITE, MAP_SHARED, region_fd, 0) != MAP_FAILED) return 51;
  auto m = airs::client::map_region_readonly(region_fd, hello.region_size);
  if (!m) return 52;
  const uint64_t units = (g_file_size + g_unit - 1) / g_unit;
  if (mode == "coop-resident") return coop_resident(m->bytes(), units, status);
  if (mode == "coop-fallback") return coop_fallback(m->bytes(), m->get(), units, sock, hello, status);
  if (mode == "coop-ranks") return coop_ranks(m->bytes(), units, sock, status);
  return 30;
}

// The status page (read-only; the daemon sealed it): 0, or the exit code
// of what failed.
int map_status_page(int status_fd, wire::StatusPageView* out) {
  void* sp = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, status_fd, 0);
  off_t sp_len = ::lseek(status_fd, 0, SEEK_END);
  if (sp != MAP_FAILED) ::munmap(sp, 1 << 20);
  sp = ::mmap(nullptr, static_cast<size_t>(sp_len), PROT_READ, MAP_SHARED, status_fd, 0);
  if (sp == MAP_FAILED) return 13;
  *out = wire::StatusPageView(sp, static_cast<uint64_t>(sp_len));
  if (!out->valid()) return 14;
  // A writable mapping of the status page must be refused (sealed, O_RDONLY).
  if (::mmap(nullptr, static_cast<size_t>(sp_len), PROT_READ | PROT_WRITE, MAP_SHARED, status_fd, 0) != MAP_FAILED)
    return 15;
  return 0;
}

// What every lazy mode works on: the mapping, attached to the daemon.
struct LazyClient {
  int sock = -1;
  int region_fd = -1;
  airs::test::Hello hello{};
  wire::StatusPageView status;
  LazyMapping* lm = nullptr;
  int notify = -1;                   // the daemon's eventfd: signalled when every ready unit is mapped
  airs::sys::UniqueFd daemon_pidfd;  // fallback: modes only
  const std::byte* base = nullptr;
  uint64_t units = 0;
  std::vector<uint64_t> order;  // every unit, in order
};

bool verify_all(const std::byte* base, const std::vector<uint64_t>& ord, useconds_t sleep_us) {
  for (uint64_t u : ord) {
    if (!verify_unit(base, u)) return false;
    if (sleep_us) ::usleep(sleep_us);
  }
  return true;
}

// Several threads fault the same pages at once: duplicate events.
int run_threads(const LazyClient& c, int n) {
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      std::vector<uint64_t> o = c.order;
      std::mt19937_64 rng(static_cast<uint64_t>(i) + 1);
      std::shuffle(o.begin(), o.end(), rng);
      if (!verify_all(c.base, o, 0)) ++bad;
    });
  for (auto& t : ts) t.join();
  return bad.load() == 0 ? 0 : 3;
}

// Waits (30 s) for the daemon's notice that every ready unit is mapped.
bool wait_notified(const LazyClient& c) {
  pollfd p{c.notify, POLLIN, 0};
  return ::poll(&p, 1, 30000) == 1;
}

int run_resident(const LazyClient& c) {
  if (!wait_notified(c)) return 19;
  if (c.status.state() != airs::wire::ModelLoadState::Resident) return 20;
  if (c.status.ready_units() != c.status.unit_count()) return 21;
  if (!c.lm->unregister()) return 22;
  if (!verify_all(c.base, c.order, 0)) return 3;
  // Unregistered, a shmem mapping on huge folios is mapped by PMD entries
  // again (LazyMapping::unregister dropped the PTEs CONTINUE made).
  if (c.hello.backing == airs::test::kBackingShmem && region_on_huge_folios(c.region_fd) &&
      pmd_mapped_kb(c.lm->data()) * 1024 < c.hello.region_size / 2)
    return 23;
  return 0;
}

// Whether thread `tid` (0 until the thread has said it) sleeps in a
// userfaultfd fault within 10 s, by its wait channel; `wchan` gets the last
// one read.
bool sleeps_in_fault(const std::atomic<pid_t>& tid, char (&wchan)[64]) {
  for (int i = 0; i < 10000; ++i) {
    if (tid.load() != 0) {
      std::memset(wchan, 0, sizeof wchan);
      const std::string path = "/proc/self/task/" + std::to_string(tid.load()) + "/wchan";
      if (const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
        if (::read(fd, wchan, sizeof wchan - 1) < 0) wchan[0] = 0;
        ::close(fd);
      }
      if (std::strcmp(wchan, "handle_userfault") == 0) return true;
    }
    ::usleep(1000);
  }
  return false;
}

// A thread sleeps on a fault of unit 1 while the range stops being
// registered without the kernel waking it (docs/kernel-facts.md: a fault
// queued under the per-VMA lock can miss UFFDIO_UNREGISTER's wake). Made
// here by mapping a plain view of the region over the range (MAP_FIXED
// replaces the VMA and wakes nobody). Then it must be woken:
//   stale-fault       by the daemon, whose CONTINUE for that fault now
//                     fails with ENOENT (told "go" once the thread sleeps;
//                     the unit is filled after that);
//   stale-unregister  by LazyMapping::unregister (the model is resident:
//                     the unit's entries are dropped first so that the
//                     touch faults; the daemon answers nothing meanwhile).
// Either way the thread then reads the unit's bytes through the view.
int run_stale(const LazyClient& c, bool by_daemon) {
  if (!by_daemon) {
    if (!wait_notified(c)) return 19;  // attached, every ready unit mapped
    if (!wait_go(c.sock)) return 29;
    if (c.status.state() != airs::wire::ModelLoadState::Resident) return 20;
    if (::madvise(const_cast<std::byte*>(c.base) + g_unit, g_unit, MADV_DONTNEED) != 0) return 24;
  }
  std::atomic<pid_t> tid{0};
  std::atomic<bool> ok{false};
  std::atomic<bool> done{false};
  std::thread t([&] {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    ok = verify_unit(c.base, 1);
    done = true;
  });
  char w[64] = {};
  if (!sleeps_in_fault(tid, w)) {
    std::fprintf(stderr, "client: the reader never slept in handle_userfault (last wchan '%s'; it %s, bytes %s)\n", w,
                 done.load() ? "returned" : "did not return", ok.load() ? "right" : "not right");
    std::_Exit(25);
  }
  if (::mmap(const_cast<std::byte*>(c.base), c.hello.region_size, PROT_READ, MAP_SHARED | MAP_FIXED, c.region_fd,
             0) != c.base)
    std::_Exit(26);
  if (by_daemon) {
    const char go = 'g';
    if (::send(c.sock, &go, 1, 0) != 1) std::_Exit(27);
  } else if (!c.lm->unregister()) {
    std::_Exit(28);
  }
  t.join();
  return ok.load() ? 0 : 3;
}

// Unit 1 left partly mapped: every entry past its first page dropped. A
// CONTINUE cut short by a fatal signal (the daemon killed inside the ioctl)
// leaves the same. On hugetlbfs a unit is one page: all of it. The touch
// past the first page faults, and must be answered with its page mapped
// (not skipped with the unit's mapped start, which would fault it again for
// ever):
//   partial           by the daemon (the unit is ready);
//   partial-fallback  by our own FallbackServer (the daemon's loop stays
//                     still: the fault is ours to read).
int run_partial(const LazyClient& c, bool own_fallback) {
  if (!wait_notified(c)) return 19;  // attached to a resident model: every unit mapped
  if (own_fallback && !wait_go(c.sock)) return 29;
  const uint64_t keep = c.hello.backing == airs::test::kBackingShmem ? airs::sys::base_page_size() : 0;
  if (::madvise(const_cast<std::byte*>(c.base) + g_unit + keep, g_unit - keep, MADV_DONTNEED) != 0) return 24;
  std::unique_ptr<FallbackServer> fb;
  std::atomic<bool> done{false};
  std::atomic<int> fb_error{0};
  std::thread t;
  if (own_fallback) {
    auto f = FallbackServer::create(*c.lm, c.region_fd, g_src, g_file_size, c.status);
    if (!f) {
      std::fprintf(stderr, "client: %s\n", f.error().message.c_str());
      return 25;
    }
    fb = std::move(f).value();
    t = std::thread([&] {
      while (!done.load()) {
        if (auto r = fb->run_once(std::chrono::milliseconds(20)); !r) {
          std::fprintf(stderr, "client: fallback: %s\n", r.error().message.c_str());
          fb_error = 1;
          return;
        }
      }
    });
  }
  const bool ok = verify_all(c.base, c.order, 0);
  done = true;
  if (t.joinable()) t.join();
  if (fb_error.load() != 0) return 26;
  return ok ? 0 : 3;
}

int run_fork(const LazyClient& c) {
  const pid_t child = ::fork();
  if (child == 0) {
    // MADV_DONTFORK: the range does not exist here, so this must SIGSEGV
    // (and must not put a zero page into the shared page cache).
    volatile const char* p = reinterpret_cast<volatile const char*>(c.base);
    char ch = p[g_unit * (c.units / 2)];
    _exit(ch == 0 ? 40 : 41);
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV) {
    std::fprintf(stderr, "client: forked child status %#x, expected SIGSEGV\n", st);
    return 4;
  }
  return verify_all(c.base, c.order, 0) ? 0 : 3;
}

// Touches random units until killed.
[[noreturn]] void run_loop(const LazyClient& c) {
  std::mt19937_64 rng(static_cast<uint64_t>(getpid()));
  for (;;) {
    const uint64_t u = rng() % c.units;
    volatile const char* p = reinterpret_cast<volatile const char*>(c.base + u * g_unit);
    (void)*p;
    ::usleep(200);
  }
}

// Reads every unit (sleeping `sleep_us` after each) while the test kills
// the daemon: our FallbackServer takes over once its pidfd says it exited.
// Exit 6: the daemon outlived the pass, nothing tested.
int run_fallback(const LazyClient& c, useconds_t sleep_us) {
  auto fb = FallbackServer::create(*c.lm, c.region_fd, g_src, g_file_size, c.status);
  if (!fb) {
    std::fprintf(stderr, "client: %s\n", fb.error().message.c_str());
    return 24;
  }
  std::atomic<bool> done{false};
  std::atomic<int> fb_error{0};
  std::thread t([&] {
    pollfd p{c.daemon_pidfd.get(), POLLIN, 0};
    while (!done.load()) {
      if (::poll(&p, 1, 20) == 1) break;
    }
    if (done.load()) return;
    std::fprintf(stderr, "client %d: daemon gone, serving own faults from the GGUF\n", getpid());
    if (!(*fb)->takeover()) fb_error = 1;
    while (!done.load()) {
      auto r = (*fb)->run_once(std::chrono::milliseconds(20));
      if (!r) {
        std::fprintf(stderr, "client: fallback: %s\n", r.error().message.c_str());
        fb_error = 2;
        return;
      }
    }
  });
  const bool ok = verify_all(c.base, c.order, sleep_us);
  const bool took_over = airs::sys::pidfd_exited(c.daemon_pidfd.get());
  done = true;
  t.join();
  if (fb_error.load() != 0) return 25;
  if (ok && !took_over) return 6;  // the daemon outlived the pass: nothing tested
  std::fprintf(stderr, "client %d: fallback filled %lu units\n", getpid(),
               static_cast<unsigned long>((*fb)->units_filled()));
  return ok ? 0 : 3;
}

// The lazy modes: one per run, named by the test.
// One byte at file offset `off`, nothing else: it must be the file's
// ("byte:OFF"; "byte-hold:OFF" then stays attached until the test's go).
int run_byte(const LazyClient& c, uint64_t off) {
  std::byte want{};
  if (off >= g_file_size || ::pread(g_src, &want, 1, static_cast<off_t>(off)) != 1) return 19;
  const std::byte got = *reinterpret_cast<const volatile std::byte*>(c.base + off);
  if (got != want) {
    std::fprintf(stderr, "client %d: byte %lu: got %02x want %02x\n", getpid(), static_cast<unsigned long>(off),
                 static_cast<unsigned>(got), static_cast<unsigned>(want));
    return 3;
  }
  return 0;
}

// Bytes [lo, hi) of the file, compared byte for byte; each range of a
// "range:LO-HI,LO-HI,..." list in turn.
int run_ranges(const LazyClient& c, const std::string& list) {
  std::istringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto dash = item.find('-');
    if (dash == std::string::npos) return 30;
    const uint64_t lo = std::stoull(item.substr(0, dash)), hi = std::stoull(item.substr(dash + 1));
    if (hi > g_file_size || lo > hi) return 19;
    std::vector<std::byte> want(hi - lo);
    if (::pread(g_src, want.data(), want.size(), static_cast<off_t>(lo)) != static_cast<ssize_t>(want.size())) return 19;
    if (!airs::test::same_bytes(c.base + lo, want.data(), want.size())) {
      std::fprintf(stderr, "client %d: bytes [%lu, %lu) differ from the file\n", getpid(), static_cast<unsigned long>(lo),
                   static_cast<unsigned long>(hi));
      return 3;
    }
  }
  return 0;
}

int run_lazy(const std::string& mode, const LazyClient& c) {
  if (mode == "seq") return verify_all(c.base, c.order, 0) ? 0 : 3;
  if (mode.starts_with("tokens:")) {
    // A streamed model: every unit in order, N times (N tokens).
    const uint64_t tokens = std::stoull(mode.substr(7));
    for (uint64_t t = 0; t < tokens; ++t)
      if (!verify_all(c.base, c.order, 0)) return 3;
    return 0;
  }
  if (mode.starts_with("first:")) {
    // Unit U first, then the rest in order: a fault on a chosen unit.
    std::vector<uint64_t> o = c.order;
    std::rotate(o.begin(), o.begin() + static_cast<long>(std::min<uint64_t>(std::stoull(mode.substr(6)), c.units)),
                o.end());
    return verify_all(c.base, o, 0) ? 0 : 3;
  }
  if (mode.starts_with("random:")) {
    std::vector<uint64_t> o = c.order;
    std::mt19937_64 rng(std::stoull(mode.substr(7)));
    std::shuffle(o.begin(), o.end(), rng);
    return verify_all(c.base, o, 0) ? 0 : 3;
  }
  if (mode.starts_with("threads:")) return run_threads(c, std::stoi(mode.substr(8)));
  if (mode == "resident") return run_resident(c);
  if (mode == "stale-fault" || mode == "stale-unregister") return run_stale(c, mode == "stale-fault");
  if (mode == "partial" || mode == "partial-fallback") return run_partial(c, mode == "partial-fallback");
  if (mode == "fork") return run_fork(c);
  if (mode.starts_with("touch:")) return verify_unit(c.base, std::stoull(mode.substr(6))) ? 0 : 3;
  if (mode.starts_with("byte:")) return run_byte(c, std::stoull(mode.substr(5)));
  if (mode.starts_with("byte-hold:")) {
    // The same, then attached until the test says go: the daemon reads
    // ahead for a client only while it is there.
    const int rc = run_byte(c, std::stoull(mode.substr(10)));
    return rc == 0 && !wait_go(c.sock) ? 29 : rc;
  }
  if (mode.starts_with("range:")) return run_ranges(c, mode.substr(6));
  if (mode == "loop") run_loop(c);
  if (mode.starts_with("fallback:")) return run_fallback(c, static_cast<useconds_t>(std::stoul(mode.substr(9))));
  return 30;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return 10;
  const int sock = std::atoi(argv[1]);
  const std::string mode = argv[2];
  g_src = ::open(argv[3], O_RDONLY | O_CLOEXEC);
  if (g_src < 0) return 11;

  LazyClient c;
  c.sock = sock;
  std::vector<int> fds;
  if (!airs::test::recv_msg(sock, &c.hello, sizeof c.hello, fds, 2)) return 12;
  c.region_fd = fds[0];
  const int status_fd = fds[1];
  g_file_size = c.hello.file_size;
  if (const int rc = map_status_page(status_fd, &c.status); rc != 0) return rc;
  g_unit = c.status.unit_size();

  if (c.hello.backing == airs::test::kBackingCooperative)
    return run_cooperative(mode, sock, c.region_fd, c.hello, c.status);

  const bool shmem = c.hello.backing == airs::test::kBackingShmem;
  auto lm = LazyMapping::create(c.region_fd, c.hello.region_size, shmem ? LazyBacking::Shmem : LazyBacking::Hugetlbfs);
  if (!lm) {
    std::fprintf(stderr, "client: %s\n", lm.error().message.c_str());
    return 16;
  }
  c.lm = &*lm;
  auto dup = lm->dup_uffd();
  if (!dup) return 17;
  // fallback: a pidfd of the daemon before we attach; once attached, the
  // test may kill it at any time (a pidfd opened later would find no pid).
  if (mode.starts_with("fallback:")) {
    auto pfd = airs::sys::pidfd_open(c.hello.daemon_pid);
    if (!pfd) return 23;
    c.daemon_pidfd = std::move(pfd).value();
  }
  c.notify = ::eventfd(0, EFD_CLOEXEC);
  airs::test::AttachMsg am{lm->address(), lm->size()};
  if (!airs::test::send_msg(sock, &am, sizeof am, {dup->get(), c.notify})) return 18;
  dup->reset();

  c.base = lm->data();
  c.units = (g_file_size + g_unit - 1) / g_unit;
  c.order.resize(c.units);
  for (uint64_t i = 0; i < c.units; ++i) c.order[i] = i;
  return run_lazy(mode, c);
}
