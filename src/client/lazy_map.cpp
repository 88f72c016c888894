// SPDX-License-Identifier: Apache-2.0
#include "client/lazy_map.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"
#include "sys/uffd.hpp"

namespace airs::client {

namespace {
// <sys/mman.h> of glibc 2.36 lacks it; the kernel's value (asm-generic/mman-common.h).
constexpr int kMadvCollapse = 25;
}  // namespace

Status check_no_mlock_future() {
  const uint64_t ps = sys::base_page_size();
  void* p = ::mmap(nullptr, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return make_error(errno, "probing for mlockall: mmap: {}", std::strerror(errno));
  sys::Mapping probe(p, ps);
  unsigned char vec = 0;
  if (::mincore(p, ps, &vec) != 0) return make_error(errno, "probing for mlockall: mincore: {}", std::strerror(errno));
  if ((vec & 1U) != 0)
    return make_error(EBUSY, "mlockall(MCL_FUTURE) is active in this process: it would fill the model mapping with "
                             "zero pages before the daemon could load it; call munlockall() or lock only your own "
                             "buffers (mlock) before attaching a model lazily");
  return {};
}

Result<LazyMapping> LazyMapping::create(int region_fd, uint64_t size, LazyBacking backing, sys::UniqueFd uffd) {
  AIRS_TRY(check_no_mlock_future());
  const int acc = ::fcntl(region_fd, F_GETFL);
  if (acc < 0) return make_error(errno, "model region fd: {}", std::strerror(errno));
  if ((acc & O_ACCMODE) != O_RDWR)
    return make_error(EPERM, "model region fd is not O_RDWR: userfaultfd registration needs a writable fd");
  LazyMapping lm;
  lm.backing_ = backing;
  auto st = sys::stat_of(region_fd, "model region fd");
  if (!st) return std::move(st).error();
  if (backing == LazyBacking::Shmem) {
    lm.huge_folios_ = static_cast<uint64_t>(st->st_blksize) > sys::base_page_size();
    lm.page_ = sys::base_page_size();  // CONTINUE maps shmem one PTE at a time
  } else {
    lm.page_ = static_cast<uint64_t>(st->st_blksize);  // hugetlbfs: its huge page
  }
  // No MAP_POPULATE, no MAP_LOCKED: nothing may touch the range before the
  // registration below.
  auto m = sys::map_shared(region_fd, size, PROT_READ, 0, "model region");
  if (!m) return std::move(m).error();
  lm.map_ = std::move(m).value();
  if (::madvise(lm.map_.get(), size, MADV_DONTFORK) != 0)
    return make_error(errno, "madvise(MADV_DONTFORK) on the model mapping: {}", std::strerror(errno));
  if (!uffd) {
    auto fd = sys::uffd_create();
    if (!fd) return std::move(fd).error();
    uffd = std::move(fd).value();
  }
  lm.uffd_ = std::move(uffd);
  const uint64_t features = backing == LazyBacking::Hugetlbfs
                                ? (UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS)
                                : (UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_MINOR_SHMEM);
  auto api = sys::uffd_api(lm.uffd_.get(), features);
  if (!api) return std::move(api).error();
  auto reg = sys::uffd_register(lm.uffd_.get(), lm.address(), size,
                                UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR);
  if (!reg) return std::move(reg).error();
  if ((*reg & (uint64_t{1} << _UFFDIO_CONTINUE)) == 0)
    return make_error(EOPNOTSUPP, "the kernel does not allow UFFDIO_CONTINUE on the model mapping");
  lm.registered_ = true;
  return lm;
}

Result<sys::UniqueFd> LazyMapping::dup_uffd() const {
  sys::UniqueFd fd(::fcntl(uffd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!fd) return make_error(errno, "dup of the userfaultfd: {}", std::strerror(errno));
  return fd;
}

Status LazyMapping::unregister() {
  if (!registered_) return {};
  AIRS_TRY(sys::uffd_unregister(uffd_.get(), address(), size()));
  registered_ = false;
  // Wake every thread still asleep on a fault of the range. The kernel's
  // unregistration wakes the faults it finds queued, but since 6.6 a fault
  // runs under the per-VMA lock, which UFFDIO_UNREGISTER's mmap write lock
  // does not exclude: a fault that queues itself after that wake and before
  // the VMA is write-locked sleeps on, its message answered by nobody (the
  // daemon's CONTINUE then fails with ENOENT). The VMA write lock waited for
  // it to queue, so by now it is queued, and UFFDIO_WAKE needs no
  // registration (docs/kernel-facts.md).
  AIRS_TRY(sys::uffd_wake(uffd_.get(), address(), size()));
  // The system call itself: libairs-preload.so interposes madvise() and
  // absorbs it on model mappings.
  // Base pages (a memfd): nothing to gain, and MADV_COLLAPSE would copy the
  // whole model into new huge folios (it ignores shmem_enabled).
  if (backing_ != LazyBacking::Shmem || !huge_folios_) return {};
  if (::syscall(SYS_madvise, map_.get(), size(), MADV_DONTNEED) != 0)
    return make_error(errno, "madvise(MADV_DONTNEED) of the resident model mapping: {}", std::strerror(errno));
  // Kernels before 6.14 keep the emptied PTE tables, so the next touch maps
  // 4 KiB entries again (seen on 6.1); MADV_COLLAPSE (6.1+) retracts
  // them and maps each huge folio by one PMD entry. Best effort: a kernel
  // without it, or memfd pages, keeps base-page entries (the same bytes).
  (void)::syscall(SYS_madvise, map_.get(), size(), kMadvCollapse);
  return {};
}

Result<std::unique_ptr<FallbackServer>> FallbackServer::create(const LazyMapping& mapping, int region_fd, int gguf_fd,
                                                               uint64_t file_size, wire::StatusPageView status) {
  if (!status.valid()) return make_error(EINVAL, "fallback: the model's status page is not valid");
  auto s = std::unique_ptr<FallbackServer>(new FallbackServer());
  s->uffd_ = mapping.uffd();
  s->base_ = mapping.address();
  s->size_ = mapping.size();
  s->unit_ = status.unit_size();
  s->page_ = mapping.page_size();
  s->gguf_fd_ = gguf_fd;
  s->file_size_ = file_size;
  s->status_ = status;
  // Our own writable view: filling through it puts bytes into the shared
  // page cache; the registered mapping then gets them by CONTINUE.
  auto w = sys::map_shared(region_fd, mapping.size(), PROT_READ | PROT_WRITE, 0, "fallback view of the model region");
  if (!w) return std::move(w).error();
  ::madvise(w->get(), mapping.size(), MADV_DONTFORK);
  s->writable_ = std::move(w).value();
  s->filled_.assign(status.unit_count(), false);
  return s;
}

Status FallbackServer::takeover() { return sys::uffd_wake(uffd_, base_, size_); }

Result<int> FallbackServer::run_once(std::chrono::milliseconds timeout) {
  pollfd p{uffd_, POLLIN, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (rc < 0 && errno != EINTR) return make_error(errno, "fallback: poll: {}", std::strerror(errno));
  if (rc <= 0) return 0;
  std::vector<uffd_msg> msgs;
  AIRS_TRY(sys::uffd_read_events(uffd_, msgs));
  // Every message read is answered, whatever happens to one of them: a
  // fault whose message is read and left is never raised again.
  int served = 0;
  Status first_error;
  for (const uffd_msg& m : msgs) {
    if (m.event != UFFD_EVENT_PAGEFAULT) continue;
    if (auto st = serve(m.arg.pagefault.address); !st) {
      if (first_error) first_error = std::move(st);
      continue;
    }
    ++served;
  }
  if (!first_error) return std::move(first_error).error();
  return served;
}

Status FallbackServer::serve(uint64_t address) {
  if (address < base_ || address >= base_ + size_) return {};
  const auto unit = static_cast<uint32_t>((address - base_) / unit_);
  const uint64_t addr = base_ + uint64_t{unit} * unit_;
  if (!status_.unit_ready(unit) && !filled_[unit]) {
    const uint64_t off = uint64_t{unit} * unit_;
    const uint64_t want = off < file_size_ ? std::min(unit_, file_size_ - off) : 0;
    uint64_t done = 0;
    while (done < want) {
      const ssize_t n = ::pread(gguf_fd_, writable_.bytes() + off + done, want - done, static_cast<off_t>(off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<uint64_t>(n);
    }
    if (done == want && want < unit_) {
      // The last unit: on shmem the pages past EOF do not exist until
      // written, and CONTINUE needs every page of the range present.
      std::memset(writable_.bytes() + off + want, 0, unit_ - want);
    }
    if (done < want) {
      // The file shrank or cannot be read: SIGBUS for the faulting thread,
      // never a page of zeros. A kernel without UFFDIO_POISON (before 6.6)
      // rejects it with EINVAL: then SIGBUS to this whole process (its
      // default action ends it; a faulting thread never waits forever).
      auto r = sys::uffd_poison(uffd_, addr, unit_, unit_);
      if (!r && r.error().code == EINVAL) {
        ::kill(::getpid(), SIGBUS);
        return {};
      }
      if (!r) return std::move(r).error();
      return {};
    }
    filled_[unit] = true;
    ++units_filled_;
  }
  // The daemon may have died inside a CONTINUE of this unit (a fatal
  // signal cuts the ioctl short), leaving it partly mapped: the faulting
  // page itself is then mapped too.
  auto r = sys::uffd_continue_fault(uffd_, addr, unit_, address, page_);
  if (!r) {
    // The thread may still sleep on the fault: it faults again on whatever
    // maps the range now, and is not left asleep.
    (void)sys::uffd_wake(uffd_, addr, unit_);
    return std::move(r).error();
  }
  if (r->already_mapped_bytes > 0) AIRS_TRY(sys::uffd_wake(uffd_, addr, unit_));
  return {};
}

Result<sys::Mapping> map_region_readonly(int region_fd, uint64_t size) {
  return sys::map_shared(region_fd, size, PROT_READ, 0, "model region (cooperative, read-only)");
}

CooperativeFallback::CooperativeFallback(void* base, uint64_t size, int gguf_fd, int daemon_pidfd,
                                         std::function<void()> announce)
    : base_(base), size_(size), gguf_fd_(gguf_fd), daemon_pidfd_(daemon_pidfd), announce_(std::move(announce)) {}

bool CooperativeFallback::daemon_gone() const { return sys::pidfd_exited(daemon_pidfd_); }

Status CooperativeFallback::take_over() {
  std::lock_guard lock(mu_);
  if (taken_.load(std::memory_order_relaxed)) return {};
  if (failed_) return *failed_;
  // MAP_FIXED replaces the region's pages in the one call; the file mapping
  // has no holes to read as zeros (past EOF it would be SIGBUS, and nothing
  // reads the region past the file's size).
  void* p = ::mmap(base_, size_, PROT_READ, MAP_SHARED | MAP_FIXED, gguf_fd_, 0);
  if (p == MAP_FAILED) {
    failed_ = Error{errno, fmt::format("the daemon died before the model was resident and mapping the GGUF file "
                                       "in its place failed: {}",
                                       std::strerror(errno))};
    return *failed_;
  }
  taken_.store(true, std::memory_order_release);
  if (announce_) announce_();
  return {};
}

void CooperativeFallback::adopt() {
  std::lock_guard lock(mu_);
  if (taken_.load(std::memory_order_relaxed)) return;
  taken_.store(true, std::memory_order_release);
  if (announce_) announce_();
}

namespace {

// The futex loop shared by the waits: `done` is checked after loading the
// generation, so a publish between the check and the wait changes the word
// and the wait returns at once.
template <typename Done>
Status wait_until(wire::StatusPageView status, std::chrono::nanoseconds timeout, const char* what,
                  CooperativeFallback* fallback, Done done) {
  if (!status.valid()) return make_error(EINVAL, "waiting for {}: the model's status page is not valid", what);
  using Clock = std::chrono::steady_clock;
  const bool forever = timeout.count() < 0;
  const auto deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
  for (;;) {
    const uint32_t gen = status.generation();
    if (done()) return {};
    if (fallback != nullptr && fallback->taken_over()) return {};
    if (status.state() == wire::ModelLoadState::Unloaded)
      return make_error(ENODEV, "waiting for {}: the model was unloaded (an admin forced it, or it was evicted): its "
                                "mapping is revoked and gets SIGBUS on access; open the model again",
                        what);
    if (status.state() == wire::ModelLoadState::Failed)
      return make_error(EIO, "waiting for {}: the daemon could not read part of the model (see its log); those "
                             "bytes will never be ready",
                        what);
    if (fallback != nullptr && fallback->daemon_gone()) {
      // The status page may have moved between the check above and the
      // daemon's exit: look once more before leaving the pool's pages.
      if (done()) return {};
      return fallback->take_over();
    }
    int64_t left = -1;
    if (!forever) {
      const auto now = Clock::now();
      if (now >= deadline) return make_error(ETIMEDOUT, "waiting for {}: not ready after the timeout", what);
      left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    }
    if (fallback != nullptr) {
      const int64_t slice = std::chrono::nanoseconds(CooperativeFallback::kCheckEvery).count();
      left = left < 0 ? slice : std::min(left, slice);
    }
    (void)sys::futex_wait(status.generation_word(), gen, left);
  }
}

}  // namespace

Status wait_rank(wire::StatusPageView status, uint32_t rank, std::chrono::nanoseconds timeout,
                 CooperativeFallback* fallback) {
  if (status.valid()) {
    bool known = false;
    for (uint32_t i = 0; i < status.rank_count(); ++i) known = known || status.ranks()[i].rank == rank;
    if (!known) return make_error(EINVAL, "wait_rank: the model has no load rank {}", rank);
  }
  const std::string what = "load rank " + std::to_string(rank);
  return wait_until(status, timeout, what.c_str(), fallback, [&] { return status.rank_ready(rank); });
}

Status wait_range(wire::StatusPageView status, uint64_t offset, uint64_t len, std::chrono::nanoseconds timeout,
                  CooperativeFallback* fallback, const std::function<void(uint32_t unit)>& ask) {
  if (!status.valid()) return make_error(EINVAL, "wait_range: the model's status page is not valid");
  const uint64_t unit = status.unit_size();
  const uint64_t region = uint64_t{status.unit_count()} * unit;
  if (len == 0) return {};
  if (offset > region || len > region - offset)
    return make_error(EINVAL, "wait_range: bytes [{}, +{}) lie past the {}-byte region", offset, len, region);
  const auto first = static_cast<uint32_t>(offset / unit);
  const auto last = static_cast<uint32_t>((offset + len - 1) / unit);
  uint32_t next = first;  // units before `next` were seen ready (bits are never cleared but by eviction)
  const std::string what = "bytes [" + std::to_string(offset) + ", +" + std::to_string(len) + ")";
  return wait_until(status, timeout, what.c_str(), fallback, [&] {
    while (next <= last && status.unit_ready(next)) ++next;
    if (next > last) return true;
    // One unit at a time, the one the wait stopped at, as a touch asks: the
    // daemon protects the unit a client asked for last (where it is), so
    // asking for the whole range at once left the earlier units
    // unprotected, and one read and dropped again before this wait looked
    // was never asked for again (the wait hung). Asked again at every
    // change of the page while it is not ready: a unit read and dropped
    // between two looks (another reader's read needed the room) is asked
    // for anew.
    if (ask) ask(next);
    return false;
  });
}

Status wait_resident(wire::StatusPageView status, std::chrono::nanoseconds timeout, CooperativeFallback* fallback) {
  // A streamed model never becomes resident: a wait for it would last its
  // whole timeout, or for ever.
  bool streamed = false;
  AIRS_TRY(wait_until(status, timeout, "the whole model", fallback, [&] {
    streamed = status.state() == wire::ModelLoadState::Streaming;
    return streamed || status.state() == wire::ModelLoadState::Resident || status.ready_units() == status.unit_count();
  }));
  if (streamed && (fallback == nullptr || !fallback->taken_over()))
    return make_error(EFBIG, "waiting for the whole model: it is bigger than its share of the pool and streams (its "
                             "units come as they are read and go again), so it is never resident: read it, or wait "
                             "for the bytes or layer needed next");
  return {};
}

}  // namespace airs::client
