// SPDX-License-Identifier: Apache-2.0
// libairs-preload.so: runs an unmodified GGUF runtime (llama.cpp and
// everything built on it) on the airs-memd pool via LD_PRELOAD.
//
// What llama.cpp does (prebuilt 3.22.1 / llama.cpp "v0.5.0", seen with strace
// and nm): fopen the GGUF, fread the header, posix_fadvise(SEQUENTIAL),
// mmap(NULL, file_size, PROT_READ, MAP_SHARED|MAP_POPULATE, fileno, 0),
// posix_madvise(WILLNEED) over the whole map, munmap of the header pages and
// the tail right after loading, fclose, then reads weights in place; with
// mmap disabled it read()s every tensor into private memory.
//
// What we do: the one call that matters is that whole-file shared read-only
// mmap. When a process makes it on a regular file that starts with "GGUF"
// (checked with pread: the file position stays untouched), we hand the fd to
// the daemon through libairs (airs_model_open_fd: LoadModel, Open, register
// the region with our own userfaultfd, Attach) and return libairs' lazily
// attached mapping of the model region instead; the region is the file byte
// for byte, so every offset the runtime computes stays valid. The real mmap
// never runs for it, so MAP_POPULATE never touches an unregistered page, and
// posix_madvise/madvise on the region are absorbed (WILLNEED/POPULATE_* would
// populate it; REMOVE would punch the shared pool). munmap of parts of the
// region (llama.cpp drops header and tail pages) only shrinks our record of
// what the runtime still uses; when nothing is left we close the model (the
// mapping goes, the daemon reference is released). close()/fclose() of the fd
// need nothing: libairs holds its own dup. read() (no-mmap mode) and every
// other call pass through untouched.
//
// Recognition happens at mmap time rather than at open/fopen: only there do
// we know the process wants a whole-file shared mapping, so a runtime that
// read()s the file (llama.cpp --no-mmap, a converter, `file`) never puts the
// model into the pool, and every way of opening the fd (open, openat, fopen,
// O_DIRECT, an inherited fd) is covered without interposing any of them.
//
// Without a reachable daemon (or any failure to open the model through it)
// we log one line to stderr and behave exactly as without the library.
//
// Cooperative mode (kernels without userfaultfd): libairs maps the region
// PROT_NONE where it is not resident yet and holds a thread that touches such
// a part in its SIGSEGV handler until that unit is filled
// (airs_model_options.wait_on_touch, src/client/touch_guard.hpp). So that a
// runtime installing its own SIGSEGV handler (after us, or before) never
// takes those faults, sigaction() and signal() for SIGSEGV are interposed
// once libairs' handler is in: the runtime's handler is recorded as the one
// ours chains to for every other fault, and it gets back what it would have
// got (the previous runtime handler, or the default). SIGBUS is untouched.
//
// Configuration (client side; documented in scripts/airs-run):
//   AIRS_BUS              "system" (default; honours DBUS_SYSTEM_BUS_ADDRESS),
//                         "session", or a D-Bus address
//   AIRS_PRELOAD_VERBOSE  "1": one line per model mapped from the pool
//
// This file makes system calls itself (it is a syscall interposer); that is
// the one exception to "only src/sys makes syscalls".
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "airs/airs.h"
#include "client/touch_guard.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define AIRS_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using MmapFn = void* (*)(void*, size_t, int, int, int, off_t);
using MunmapFn = int (*)(void*, size_t);
using MadviseFn = int (*)(void*, size_t, int);
using SigactionFn = int (*)(int, const struct sigaction*, struct sigaction*);

struct RealFns {
  MmapFn mmap = nullptr;
  MmapFn mmap64 = nullptr;
  MunmapFn munmap = nullptr;
  MadviseFn madvise = nullptr;
  MadviseFn posix_madvise = nullptr;
  SigactionFn sigaction = nullptr;
};

RealFns g_real;
pthread_once_t g_real_once = PTHREAD_ONCE_INIT;

template <typename F>
F next_symbol(const char* name) {
  // dlsym returns void*; a function pointer cast is the documented way.
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

void resolve_real() {
  g_real.mmap = next_symbol<MmapFn>("mmap");
  g_real.mmap64 = next_symbol<MmapFn>("mmap64");
  g_real.munmap = next_symbol<MunmapFn>("munmap");
  g_real.madvise = next_symbol<MadviseFn>("madvise");
  g_real.posix_madvise = next_symbol<MadviseFn>("posix_madvise");
  g_real.sigaction = next_symbol<SigactionFn>("sigaction");
}

const RealFns& real() {
  pthread_once(&g_real_once, resolve_real);
  return g_real;
}

// Raw syscalls for the (theoretical) case that RTLD_NEXT finds nothing.
void* sys_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  return reinterpret_cast<void*>(::syscall(SYS_mmap, addr, len, long{prot}, long{flags}, long{fd}, long{off}));
}

void* call_real_mmap(bool is64, void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  const RealFns& r = real();
  MmapFn fn = is64 && r.mmap64 != nullptr ? r.mmap64 : r.mmap;
  return fn != nullptr ? fn(addr, len, prot, flags, fd, off) : sys_mmap(addr, len, prot, flags, fd, off);
}

int call_real_munmap(void* addr, size_t len) {
  const RealFns& r = real();
  return r.munmap != nullptr ? r.munmap(addr, len) : static_cast<int>(::syscall(SYS_munmap, addr, len));
}

// Set while this thread is inside libairs: sdbus-c++/libsystemd and libairs
// itself open, map and unmap things, and those calls must pass straight
// through (never be mistaken for the runtime's).
thread_local bool t_inside = false;

class InsideGuard {
 public:
  InsideGuard() : prev_(t_inside) { t_inside = true; }
  ~InsideGuard() { t_inside = prev_; }
  InsideGuard(const InsideGuard&) = delete;
  InsideGuard& operator=(const InsideGuard&) = delete;

 private:
  bool prev_;
};

// The kernel's base page (4 KiB on x86-64, 16 KiB on the Pi 5's kernel_2712):
// mmap/munmap lengths round up to it.
uintptr_t base_page() {
  static const uintptr_t page = [] {
    const long v = ::sysconf(_SC_PAGESIZE);
    return v > 0 ? static_cast<uintptr_t>(v) : uintptr_t{4096};
  }();
  return page;
}
constexpr size_t kMaxModels = 16;
constexpr size_t kMaxFragments = 32;

struct Range {
  uintptr_t begin = 0;
  uintptr_t end = 0;
};

// A model the runtime mapped through us: [base, base + span) is what it
// believes it mapped; `live` is what it has not unmapped yet.
struct Attached {
  airs_model* model = nullptr;
  uintptr_t base = 0;
  uintptr_t span = 0;
  std::array<Range, kMaxFragments> live{};
  size_t n_live = 0;
};

// g_mu guards g_models only and is never held while calling into libairs
// (its watcher thread may call munmap, and airs_model_close joins it).
std::mutex g_mu;
std::array<Attached, kMaxModels> g_models{};
std::atomic<size_t> g_n_models{0};

// Serialises connecting and opening (never taken by munmap/madvise).
std::mutex g_open_mu;
airs_client* g_client = nullptr;
bool g_disabled = false;

bool verbose() {
  const char* v = std::getenv("AIRS_PRELOAD_VERBOSE");
  return v != nullptr && v[0] == '1';
}

const char* bus_name() {
  const char* b = std::getenv("AIRS_BUS");
  return b != nullptr && b[0] != '\0' ? b : "system";
}

// A regular, readable GGUF file of exactly `len` bytes, not one of the pool's
// own files (hugetlbfs region, memfd) that libairs' threads map.
bool is_gguf_candidate(int fd, size_t len) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) return false;
  if (static_cast<uint64_t>(st.st_size) != len) return false;
  struct statfs sfs {};
  if (::fstatfs(fd, &sfs) != 0 || sfs.f_type == HUGETLBFS_MAGIC) return false;
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) == O_WRONLY) return false;
  char magic[4] = {};
  if (::pread(fd, magic, sizeof magic, 0) != static_cast<ssize_t>(sizeof magic)) return false;
  if (std::memcmp(magic, "GGUF", 4) != 0) return false;
  // memfds carry no path; a model in one is already in memory.
  char link[64];
  char path[32];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(path, link, sizeof link - 1);
  if (n > 0) {
    link[n] = '\0';
    if (std::strncmp(link, "/memfd:", 7) == 0) return false;
  }
  return true;
}

// Opens the model through the daemon; nullptr (after one line on stderr the
// first time) if that is not possible.
airs_model* open_through_pool(int fd) {
  std::lock_guard lock(g_open_mu);
  if (g_disabled) return nullptr;
  InsideGuard inside;
  if (g_client == nullptr) {
    const int rc = airs_connect(bus_name(), &g_client);
    if (rc < 0) {
      std::fprintf(stderr, "airs-preload: airs-memd not reachable (bus %s: %s); loading models the normal way\n",
                   bus_name(), airs_last_error());
      g_client = nullptr;
      g_disabled = true;
      return nullptr;
    }
  }
  airs_model_options opt{};
  opt.name = nullptr;
  opt.quiet = 0;
  // Cooperative mode: return at once; a touch waits for its unit (and asks
  // the daemon for it) in libairs' SIGSEGV handler, so compute overlaps the
  // fill. Ignored in the lazy modes.
  opt.wait_on_touch = 1;
  airs_model* m = nullptr;
  const int rc = airs_model_open_fd(g_client, fd, &opt, &m);
  if (rc < 0) {
    std::fprintf(stderr, "airs-preload: cannot load the model through airs-memd (%s: %s); loading models the normal way\n",
                 std::strerror(-rc), airs_last_error());
    g_disabled = true;
    return nullptr;
  }
  return m;
}

void* try_attach(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (t_inside || addr != nullptr || off != 0 || fd < 0 || len == 0 || prot != PROT_READ) return nullptr;
  if ((flags & ~(MAP_POPULATE | MAP_NORESERVE)) != MAP_SHARED) return nullptr;
  if (g_disabled || !is_gguf_candidate(fd, len)) return nullptr;
  if (g_n_models.load() >= kMaxModels) return nullptr;

  airs_model* m = open_through_pool(fd);
  if (m == nullptr) return nullptr;
  void* data = const_cast<void*>(airs_model_data(m));
  {
    std::lock_guard lock(g_mu);
    for (auto& a : g_models) {
      if (a.model != nullptr) continue;
      a.model = m;
      a.base = reinterpret_cast<uintptr_t>(data);
      a.span = (len + base_page() - 1) & ~(base_page() - 1);
      a.live[0] = Range{a.base, a.base + a.span};
      a.n_live = 1;
      g_n_models.fetch_add(1);
      if (verbose()) {
        InsideGuard inside;
        std::fprintf(stderr, "airs-preload: %zu-byte GGUF mapped from the pool (%s, %s)\n", len, airs_model_object(m),
                     airs_model_is_resident(m) != 0 ? "resident" : "lazy");
      }
      return data;
    }
  }
  // Table full (raced): give it back and let the runtime map the file.
  InsideGuard inside;
  airs_model_close(m);
  return nullptr;
}

Attached* find_overlap(uintptr_t b, uintptr_t e) {
  for (auto& a : g_models) {
    if (a.model != nullptr && b < a.base + a.span && e > a.base) return &a;
  }
  return nullptr;
}

// Removes [b, e) from a's live set. False if the set overflowed (then we
// keep everything alive: leaking a mapping is safe, unmapping weights a
// runtime still uses is not).
bool subtract(Attached& a, uintptr_t b, uintptr_t e) {
  std::array<Range, kMaxFragments> out{};
  size_t n = 0;
  for (size_t i = 0; i < a.n_live; ++i) {
    const Range r = a.live[i];
    const Range pieces[2] = {{r.begin, std::min(r.end, b)}, {std::max(r.begin, e), r.end}};
    for (const Range& p : pieces) {
      if (p.begin >= p.end) continue;
      if (n == kMaxFragments) return false;
      out[n++] = p;
    }
  }
  a.live = out;
  a.n_live = n;
  return true;
}

void atfork_prepare() { g_mu.lock(); }
void atfork_parent() { g_mu.unlock(); }
void atfork_child() {
  // The lazy mappings are MADV_DONTFORK: the child has none of them, and no
  // watcher threads. Forget them (their handles are the parent's).
  g_models.fill(Attached{});
  g_n_models.store(0);
  g_mu.unlock();
}

__attribute__((constructor)) void register_atfork() {
  // Only bookkeeping here: nothing touches D-Bus before the first model map.
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

void* do_mmap(bool is64, void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  if (void* p = try_attach(addr, len, prot, flags, fd, off); p != nullptr) return p;
  return call_real_mmap(is64, addr, len, prot, flags, fd, off);
}

// Whether an madvise on our region is absorbed (returns success without
// running): anything that would populate, punch or re-share it.
bool absorb_advice(int advice) {
  switch (advice) {
    case MADV_DONTNEED:  // drops this process's PTEs; the next touch faults back in
    case MADV_DONTDUMP:
    case MADV_DODUMP:
      return false;
    default:
      return true;  // WILLNEED, POPULATE_*, REMOVE, DOFORK, RANDOM, SEQUENTIAL, ...
  }
}

bool overlaps_ours(void* addr, size_t len) {
  if (g_n_models.load() == 0) return false;
  const auto b = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard lock(g_mu);
  return find_overlap(b, b + len) != nullptr;
}

}  // namespace

AIRS_EXPORT void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
  return do_mmap(false, addr, len, prot, flags, fd, off);
}

AIRS_EXPORT void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
  return do_mmap(true, addr, len, prot, flags, fd, off);
}

AIRS_EXPORT int munmap(void* addr, size_t len) noexcept {
  if (t_inside || g_n_models.load() == 0) return call_real_munmap(addr, len);
  const auto b = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t e = b + ((len + base_page() - 1) & ~(base_page() - 1));
  airs_model* to_close = nullptr;
  uintptr_t ours_b = 0;
  uintptr_t ours_e = 0;
  {
    std::lock_guard lock(g_mu);
    Attached* a = find_overlap(b, e);
    if (a == nullptr) return call_real_munmap(addr, len);
    ours_b = std::max(b, a->base);
    ours_e = std::min(e, a->base + a->span);
    if (subtract(*a, ours_b, ours_e) && a->n_live == 0) {
      to_close = a->model;
      *a = Attached{};
      g_n_models.fetch_sub(1);
    }
  }
  // Parts of the range outside the model are the caller's business.
  int rc = 0;
  if (b < ours_b) rc |= call_real_munmap(addr, ours_b - b);
  if (ours_e < e) rc |= call_real_munmap(reinterpret_cast<void*>(ours_e), e - ours_e);
  if (to_close != nullptr) {
    InsideGuard inside;
    airs_model_close(to_close);
  }
  return rc;
}

AIRS_EXPORT int madvise(void* addr, size_t len, int advice) noexcept {
  if (!t_inside && absorb_advice(advice) && overlaps_ours(addr, len)) return 0;
  const RealFns& r = real();
  return r.madvise != nullptr ? r.madvise(addr, len, advice) : static_cast<int>(::syscall(SYS_madvise, addr, len, advice));
}

AIRS_EXPORT int posix_madvise(void* addr, size_t len, int advice) noexcept {
  // POSIX_MADV_* equal MADV_* for NORMAL/RANDOM/SEQUENTIAL/WILLNEED; glibc
  // ignores POSIX_MADV_DONTNEED. All of them are absorbed on our region.
  if (!t_inside && overlaps_ours(addr, len)) return 0;
  const RealFns& r = real();
  if (r.posix_madvise != nullptr) return r.posix_madvise(addr, len, advice);
  return ::syscall(SYS_madvise, addr, len, advice) == 0 ? 0 : errno;
}

AIRS_EXPORT int sigaction(int sig, const struct sigaction* act, struct sigaction* oldact) noexcept {
  if (const int r = airs_preload_sigaction(sig, act, oldact); r != 1) return r;
  const RealFns& r = real();
  if (r.sigaction == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return r.sigaction(sig, act, oldact);
}

// glibc's signal() calls its internal sigaction, which no interposer sees:
// the same BSD semantics (restart, the signal blocked while it runs) here.
AIRS_EXPORT sighandler_t signal(int sig, sighandler_t handler) noexcept {
  struct sigaction act {};
  struct sigaction old {};
  act.sa_handler = handler;
  sigemptyset(&act.sa_mask);
  sigaddset(&act.sa_mask, sig);
  act.sa_flags = SA_RESTART;
  if (sigaction(sig, &act, &old) != 0) return SIG_ERR;
  return old.sa_handler;
}
