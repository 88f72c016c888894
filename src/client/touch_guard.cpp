// SPDX-License-Identifier: Apache-2.0
// The SIGSEGV side of the cooperative mode's touch guard; see touch_guard.hpp.
// Handler code below this line may only use async-signal-safe calls (raw
// system calls, atomics, the fixed slot table): no allocation, no locks, no
// stdio.
#include "client/touch_guard.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "wire/opened.hpp"
#include "wire/requests.hpp"

namespace airs::client {

namespace {

enum : uint32_t { kFree = 0, kActive = 1, kClosing = 2 };

struct Slot {
  std::atomic<uint32_t> state{kFree};
  std::atomic<uint32_t> users{0};
  std::atomic<bool> taken{false};
  std::atomic<uint64_t> touches{0};
  // Written while the slot is kFree (under g_mu), read by handlers once
  // they saw kActive (acquire).
  uintptr_t base = 0;
  uint64_t size = 0;
  uint64_t unit = 0;
  wire::StatusPageView status;
  int request_fd = -1;
  int daemon_pidfd = -1;
  int gguf_fd = -1;
  int region_fd = -1;
  int trace_fd = -1;
  // Streamed models: the open-unit bits the daemon reads, and one lock per
  // unit taken by an open (handler) and a close (watcher).
  wire::OpenedBits opened;
  std::atomic<uint8_t>* locks = nullptr;
  uint32_t lock_count = 0;  // the locks array's length (it outlives its guard)
};

std::array<Slot, TouchGuard::kSlots> g_slots;
std::mutex g_mu;  // create/destroy and the chained action's writers
// Lock arrays too short for a slot's next guard: never freed (a handler may
// still hold one), kept here so they stay reachable. Guarded by g_mu.
std::vector<std::atomic<uint8_t>*> g_retired_locks;

// The action our handler chains to: two copies and an index, so a handler
// always reads a complete one while airs_preload_sigaction replaces it.
std::array<struct sigaction, 2> g_chain{};
std::atomic<int> g_chain_index{0};
std::atomic<bool> g_installed{false};

// The kernel's struct sigaction (x86-64 and arm64 alike: both have
// sa_restorer), for resetting a disposition without going through any
// sigaction interposer (the preload's records instead of installing).
struct KernelSigaction {
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  uint64_t mask;
};

void set_default(int sig) {
  KernelSigaction k{SIG_DFL, 0, nullptr, 0};
  (void)::syscall(SYS_rt_sigaction, sig, &k, nullptr, sizeof k.mask);
}

void raise_here(int sig) { (void)::syscall(SYS_tgkill, ::getpid(), ::syscall(SYS_gettid), sig); }

void say(const char* s) { (void)!::write(2, s, std::strlen(s)); }

// The unit can never be read (the daemon reported a read error): this
// process ends with SIGBUS, like a lazy client whose fault was poisoned.
[[noreturn]] void die_sigbus(const char* why) {
  say("airs: ");
  say(why);
  say("; ending the process with SIGBUS (never zeros)\n");
  set_default(SIGBUS);
  raise_here(SIGBUS);
  ::_exit(128 + SIGBUS);
}

char* put_u64(char* p, uint64_t v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0) *p++ = tmp[--n];
  return p;
}

char* put_str(char* p, const char* s) {
  while (*s != '\0') *p++ = *s++;
  return p;
}

void trace(const Slot& s, uint32_t unit) {
  if (s.trace_fd < 0) return;
  const wire::StatusPageView& st = s.status;
  const uint32_t rc = st.rank_count();
  const bool last_ready = rc > 0 && st.rank_ready(st.ranks()[rc - 1].rank);
  char line[160];
  char* p = put_str(line, "touch unit=");
  p = put_u64(p, unit);
  p = put_str(p, " offset=");
  p = put_u64(p, uint64_t{unit} * s.unit);
  p = put_str(p, " ready_units=");
  p = put_u64(p, st.ready_units());
  p = put_str(p, " units=");
  p = put_u64(p, st.unit_count());
  p = put_str(p, " last_rank_ready=");
  p = put_u64(p, last_ready ? 1 : 0);
  *p++ = '\n';
  (void)!::write(s.trace_fd, line, static_cast<size_t>(p - line));
}

bool daemon_gone(const Slot& s) {
  if (s.daemon_pidfd < 0) return false;
  pollfd p{s.daemon_pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

// Maps the GGUF file over the whole range in one call (idempotent: two
// threads of one process, or a forked child, may each do it, same bytes).
// syscall() reads each argument as a long: the offset, the seventh argument
// on x86-64, is on the stack, where an int 0 may leave the upper half
// of its slot unwritten (Clang does), and the kernel saw a huge offset.
void take_over(Slot& s) {
  const long p = ::syscall(SYS_mmap, s.base, s.size, long{PROT_READ}, long{MAP_SHARED | MAP_FIXED}, long{s.gguf_fd}, 0L);
  if (p == -1 || static_cast<uintptr_t>(p) != s.base)
    die_sigbus("airs-memd died before the model was resident and the GGUF file cannot be mapped in its place");
  s.taken.store(true, std::memory_order_release);
}

void lock_unit(const Slot& s, uint32_t unit) {
  if (s.locks == nullptr) return;
  while (s.locks[unit].exchange(1, std::memory_order_acquire) != 0) (void)::syscall(SYS_sched_yield);
}

void unlock_unit(const Slot& s, uint32_t unit) {
  if (s.locks != nullptr) s.locks[unit].store(0, std::memory_order_release);
}

// Whether the region ends before `unit` (an access there is SIGBUS). True
// when the guard was given no region fd (the daemon truncates first).
bool region_revoked(const Slot& s, uint32_t unit) {
  if (s.region_fd < 0) return true;
  struct stat st {};
  if (::fstat(s.region_fd, &st) != 0) return false;
  return static_cast<uint64_t>(st.st_size) <= uint64_t{unit} * s.unit;
}

void* unit_addr(const Slot& s, uint32_t unit) { return reinterpret_cast<void*>(s.base + uint64_t{unit} * s.unit); }

void send_word(const Slot& s, wire::RequestKind kind, uint32_t unit) {
  if (s.request_fd < 0) return;
  const uint32_t w = wire::encode_request({kind, unit});
  // A full socket (the daemon is behind) only loses a hint; a dead daemon
  // gives EPIPE, never SIGPIPE.
  (void)!::send(s.request_fd, &w, sizeof w, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// Opens `unit` if it is ready (wire/opened.hpp): mark, fence, check, map.
// True when the access may run again.
bool try_open(Slot& s, uint32_t unit) {
  if (!s.opened.valid()) {
    if (!s.status.unit_ready(unit)) return false;
    (void)::mprotect(unit_addr(s, unit), s.unit, PROT_READ);
    return true;
  }
  lock_unit(s, unit);
  s.opened.set(unit);
  wire::OpenedBits::fence();
  const bool ready = s.status.unit_ready(unit);
  if (ready) (void)::mprotect(unit_addr(s, unit), s.unit, PROT_READ);
  else s.opened.clear(unit);
  unlock_unit(s, unit);
  if (ready) send_word(s, wire::RequestKind::Opened, unit);
  return ready;
}

void serve(Slot& s, uintptr_t addr) {
  const auto unit = static_cast<uint32_t>((addr - s.base) / s.unit);
  s.touches.fetch_add(1, std::memory_order_relaxed);
  trace(s, unit);
  // The page's generation when this touch last asked for the unit. A
  // streamed model's unit can be read and dropped again (another client's
  // read needed the room) between the wake and the open: the daemon's read
  // answered the ask, so nothing would read the unit again and the thread
  // would wait for ever. So it asks again at every change of the page while
  // the unit is not ready (the daemon takes a repeated ask as the same
  // wait); a unit of a model that fits never leaves, one ask is enough.
  bool requested = false;
  uint32_t asked_at = 0;
  for (;;) {
    // Closing (the model is being closed under us): return and let the
    // access run again.
    if (s.state.load(std::memory_order_acquire) != kActive) return;
    if (s.taken.load(std::memory_order_acquire)) {
      // The file's bytes: a unit a streamed model's close made PROT_NONE
      // again opens as it is.
      (void)::mprotect(unit_addr(s, unit), s.unit, PROT_READ);
      return;
    }
    const uint32_t gen = s.status.generation();
    if (try_open(s, unit)) return;
    const wire::ModelLoadState st = s.status.state();
    if (st == wire::ModelLoadState::Unloaded) {
      // The region is revoked: the access gets SIGBUS. Only where it is:
      // a unit that is a hole of a region still this long reads zeros.
      if (!region_revoked(s, unit)) die_sigbus("the model was unloaded and its region is not revoked");
      (void)::mprotect(unit_addr(s, unit), s.unit, PROT_READ);
      return;
    }
    if (st == wire::ModelLoadState::Failed && !s.status.unit_ready(unit))
      die_sigbus("the daemon could not read part of the model");
    if (!requested || (s.opened.valid() && gen != asked_at)) {
      send_word(s, wire::RequestKind::Wait, unit);
      requested = true;
      asked_at = gen;
    }
    if (daemon_gone(s)) {
      if (try_open(s, unit)) return;
      take_over(s);
      return;
    }
    const timespec ts{0, TouchGuard::kSliceNs};
    (void)::syscall(SYS_futex, s.status.generation_word(), long{FUTEX_WAIT}, long{gen}, &ts, nullptr, 0L);
  }
}

bool serve_if_ours(uintptr_t addr) {
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) != kActive) continue;
    s.users.fetch_add(1, std::memory_order_acq_rel);
    if (s.state.load(std::memory_order_acquire) == kActive && addr >= s.base && addr - s.base < s.size) {
      serve(s, addr);
      s.users.fetch_sub(1, std::memory_order_acq_rel);
      return true;
    }
    s.users.fetch_sub(1, std::memory_order_acq_rel);
  }
  return false;
}

// Not ours: what the process would have done without us.
void chain(int sig, siginfo_t* si, void* uc) {
  const struct sigaction prev = g_chain[static_cast<size_t>(g_chain_index.load(std::memory_order_acquire))];
  const bool sent = si == nullptr || si->si_code <= 0;  // kill(), sigqueue(): nothing to retry
  if ((prev.sa_flags & SA_SIGINFO) != 0) {
    if (prev.sa_sigaction != nullptr) prev.sa_sigaction(sig, si, uc);
    return;
  }
  if (prev.sa_handler == SIG_IGN && sent) return;
  if (prev.sa_handler == SIG_DFL || prev.sa_handler == SIG_IGN) {
    // A fault cannot be ignored: default action. Returning retries the
    // access, which faults again and ends the process as it would have.
    set_default(sig);
    if (sent) raise_here(sig);
    return;
  }
  prev.sa_handler(sig);
}

void on_segv(int sig, siginfo_t* si, void* uc) {
  const int saved = errno;
  if (si != nullptr && si->si_code == SEGV_ACCERR && serve_if_ours(reinterpret_cast<uintptr_t>(si->si_addr))) {
    errno = saved;
    return;
  }
  errno = saved;
  chain(sig, si, uc);
}

Status install_handler() {
  // Under g_mu.
  if (g_installed.load()) return {};
  struct sigaction ours {};
  ours.sa_sigaction = on_segv;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  struct sigaction prev {};
  if (::sigaction(SIGSEGV, &ours, &prev) != 0)
    return make_error(errno, "installing the SIGSEGV handler of the touch guard: {}", std::strerror(errno));
  g_chain[0] = prev;
  g_chain_index.store(0, std::memory_order_release);
  g_installed.store(true, std::memory_order_release);
  return {};
}

}  // namespace

Result<std::unique_ptr<TouchGuard>> TouchGuard::create(const TouchGuardSpec& spec) {
  if (spec.base == nullptr || !spec.status.valid() || spec.status.unit_size() == 0 ||
      spec.size != uint64_t{spec.status.unit_count()} * spec.status.unit_size() || spec.gguf_fd < 0)
    return make_error(EINVAL, "touch guard: the mapping does not match the model's status page");
  std::lock_guard lock(g_mu);
  AIRS_TRY(install_handler());
  for (size_t i = 0; i < g_slots.size(); ++i) {
    Slot& s = g_slots[i];
    if (s.state.load() != kFree) continue;
    s.base = reinterpret_cast<uintptr_t>(spec.base);
    s.size = spec.size;
    s.unit = spec.status.unit_size();
    s.status = spec.status;
    s.request_fd = spec.request_fd;
    s.daemon_pidfd = spec.daemon_pidfd;
    s.gguf_fd = spec.gguf_fd;
    s.region_fd = spec.region_fd;
    s.trace_fd = spec.trace_fd;
    const uint32_t units = spec.status.unit_count();
    if (spec.opened != nullptr) {
      s.opened = wire::OpenedBits(spec.opened, units);
      // Never freed while the process may still run a handler on it: the
      // slot's next guard reuses the array where it is long enough, so a
      // process that opens and closes models keeps one per slot.
      if (s.lock_count < units) {
        if (s.locks != nullptr) g_retired_locks.push_back(s.locks);
        s.locks = new std::atomic<uint8_t>[units]();
        s.lock_count = units;
      } else {
        for (uint32_t u = 0; u < units; ++u) s.locks[u].store(0, std::memory_order_relaxed);
      }
    } else {
      s.opened = {};  // the locks are taken only with open-unit bits
    }
    s.taken.store(false);
    s.touches.store(0);
    s.state.store(kActive, std::memory_order_release);
    auto g = std::unique_ptr<TouchGuard>(new TouchGuard());
    g->slot_ = i;
    g->status_ = spec.status;
    g->base_ = s.base;
    g->unit_ = s.unit;
    g->opened_.assign(spec.status.unit_count(), false);
    g->streamed_ = spec.opened != nullptr;
    return g;
  }
  return make_error(ENOSPC, "touch guard: more than {} models mapped this way in one process", kSlots);
}

TouchGuard::~TouchGuard() {
  std::lock_guard lock(g_mu);
  Slot& s = g_slots[slot_];
  s.state.store(kClosing, std::memory_order_release);
  // A handler inside the slot leaves within one wait slice.
  while (s.users.load(std::memory_order_acquire) != 0) ::usleep(1000);
  s.state.store(kFree, std::memory_order_release);
}

void TouchGuard::request(uint32_t unit) const {
  if (unit < status_.unit_count()) send_word(g_slots[slot_], wire::RequestKind::Wait, unit);
}

void TouchGuard::close_unit(uint32_t unit) {
  Slot& s = g_slots[slot_];
  if (unit >= status_.unit_count() || !s.opened.valid()) return;
  lock_unit(s, unit);
  // Taken over: the range is the file now; it stays readable.
  if (!s.taken.load(std::memory_order_acquire)) (void)::mprotect(unit_addr(s, unit), s.unit, PROT_NONE);
  s.opened.clear(unit);
  unlock_unit(s, unit);
  send_word(s, wire::RequestKind::Closed, unit);
}

bool TouchGuard::sample_unit(uint32_t unit) {
  Slot& s = g_slots[slot_];
  if (unit >= status_.unit_count() || !s.opened.valid() || s.taken.load(std::memory_order_acquire)) return false;
  if (!s.opened.test(unit)) return false;
  close_unit(unit);
  return true;
}

void TouchGuard::take_over_now() {
  Slot& s = g_slots[slot_];
  if (!s.taken.load(std::memory_order_acquire)) take_over(s);
}

bool TouchGuard::open_ready() {
  // A streamed model's units open on their touch only: the daemon must see
  // each one (and nothing stays open that it did not hear of).
  if (streamed_) return false;
  if (all_open_) return true;
  const uint32_t n = status_.unit_count();
  bool all = true;
  uint32_t run = n;  // first unit of the current run of newly ready units
  auto flush = [&](uint32_t end) {
    if (run < end)
      (void)::mprotect(reinterpret_cast<void*>(base_ + uint64_t{run} * unit_), uint64_t{end - run} * unit_, PROT_READ);
    run = n;
  };
  for (uint32_t u = 0; u < n; ++u) {
    if (opened_[u]) {
      flush(u);
      continue;
    }
    if (status_.unit_ready(u)) {
      opened_[u] = true;
      if (run == n) run = u;
    } else {
      all = false;
      flush(u);
    }
  }
  flush(n);
  if (all) {
    // One call over everything lets the kernel merge the split areas again.
    (void)::mprotect(reinterpret_cast<void*>(base_), uint64_t{n} * unit_, PROT_READ);
    all_open_ = true;
  }
  return all;
}

bool TouchGuard::taken_over() const { return g_slots[slot_].taken.load(std::memory_order_acquire); }

uint64_t TouchGuard::touches() const { return g_slots[slot_].touches.load(std::memory_order_relaxed); }

}  // namespace airs::client

extern "C" int airs_preload_sigaction(int sig, const struct sigaction* act, struct sigaction* oldact) {
  using namespace airs::client;
  if (sig != SIGSEGV || !g_installed.load(std::memory_order_acquire)) return 1;
  std::lock_guard lock(g_mu);
  const int i = g_chain_index.load(std::memory_order_relaxed);
  if (oldact != nullptr) *oldact = g_chain[static_cast<size_t>(i)];
  if (act != nullptr) {
    g_chain[static_cast<size_t>(1 - i)] = *act;
    g_chain_index.store(1 - i, std::memory_order_release);
  }
  return 0;
}
