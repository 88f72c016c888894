// SPDX-License-Identifier: Apache-2.0
// The client side of lazy model loading: the mapping and userfaultfd an
// inference process needs so it can never read zero-filled weights, and the
// fallback that serves its own faults if the daemon dies mid-load.
//
// Order that keeps zero pages out (docs/kernel-facts.md): refuse if
// mlockall(MCL_FUTURE) is active (it would populate zero pages at mmap),
// mmap PROT_READ MAP_SHARED without MAP_POPULATE, MADV_DONTFORK (a forked
// child must not see the unregistered range), register MISSING|MINOR
// (MINOR alone lets zero pages through) before anything touches the range,
// keep our own uffd and give the daemon a dup.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "wire/status_page.hpp"
#include "sys/fd.hpp"
#include "util/result.hpp"

namespace airs::client {

enum class LazyBacking : uint8_t { Hugetlbfs, Shmem };

// EBUSY with advice if mlockall(MCL_FUTURE) is in effect for this process
// (detected by mapping one anonymous page and asking mincore whether the
// kernel populated it without a touch).
[[nodiscard]] Status check_no_mlock_future();

class LazyMapping {
 public:
  // Maps `size` bytes (the region size, a multiple of the huge page) of
  // `region_fd`, which must be O_RDWR (registration needs VM_MAYWRITE), and
  // registers it. Thread: any. Errors: EBUSY (mlockall), uffd creation or
  // feature errors (with the fix), EPERM (read-only fd).
  // `uffd`: a userfaultfd created earlier (the one shown to the daemon in
  // OpenLazy as proof), or invalid to create one here.
  static Result<LazyMapping> create(int region_fd, uint64_t size, LazyBacking backing, sys::UniqueFd uffd = {});
  LazyMapping() = default;
  LazyMapping(LazyMapping&&) noexcept = default;
  LazyMapping& operator=(LazyMapping&&) noexcept = default;
  ~LazyMapping() = default;

  [[nodiscard]] const std::byte* data() const { return map_.bytes(); }
  [[nodiscard]] uint64_t size() const { return map_.size(); }
  [[nodiscard]] uint64_t address() const { return reinterpret_cast<uint64_t>(map_.get()); }
  // The page the kernel maps the range with: the huge page on hugetlbfs, the
  // base page on shmem (a CONTINUE maps shmem by PTEs, whatever its folios).
  [[nodiscard]] uint64_t page_size() const { return page_; }
  // Our own uffd (kept for the fallback; never read while the daemon lives).
  [[nodiscard]] int uffd() const { return uffd_.get(); }
  // A dup of the uffd to send to the daemon.
  [[nodiscard]] Result<sys::UniqueFd> dup_uffd() const;
  // Unregister once the model is fully resident: no more fault overhead. On
  // shmem on huge folios it then drops the mapping's page table entries (MADV_DONTNEED:
  // the pages stay in the region, every one of them READY), so the next
  // touches map the region the way its page cache holds it: one PMD entry
  // per 2 MiB on huge folios instead of the 512 PTEs CONTINUE installed
  // (~190 KiB of page tables per 96 MB, per process). The bytes are the
  // same; a thread touching a page meanwhile refaults it.
  [[nodiscard]] Status unregister();
  [[nodiscard]] bool registered() const { return registered_; }

 private:
  // Declared first so it is destroyed last: unmap, then close the uffd.
  sys::UniqueFd uffd_;
  sys::Mapping map_;
  bool registered_ = false;
  // The region's page cache may hold huge folios (its st_blksize is the PMD
  // size, as shmem reports for a huge tmpfs file); memfd base pages: false.
  bool huge_folios_ = false;
  uint64_t page_ = 0;
  LazyBacking backing_ = LazyBacking::Hugetlbfs;
};

// Serves this process's own faults when the daemon is gone (the caller
// detects that with a pidfd of the daemon and then calls takeover()). Reads
// whole units from the GGUF fd the client still holds into a second,
// writable mapping of the region, then UFFDIO_CONTINUE; units the status page
// says are READY are just CONTINUEd. Refilling identical bytes is safe even
// if another process does the same. Runs on one thread the caller owns.
class FallbackServer {
 public:
  // `mapping` and the status page mapping must outlive the server.
  // `region_fd` is O_RDWR; `gguf_fd` is the client's own model file.
  static Result<std::unique_ptr<FallbackServer>> create(const LazyMapping& mapping, int region_fd, int gguf_fd,
                                                        uint64_t file_size, wire::StatusPageView status);
  // Wake every thread blocked on a fault the dead daemon read but never
  // answered, so the kernel raises those faults again on our uffd.
  [[nodiscard]] Status takeover();
  // The uffd to poll (EPOLLIN) if the caller has its own loop.
  [[nodiscard]] int fd() const { return uffd_; }
  // Wait at most `timeout` for faults and serve them. Returns faults served.
  // Units that cannot be read (file shrank, pool exhausted) are poisoned:
  // the faulting thread gets SIGBUS, never zeros.
  [[nodiscard]] Result<int> run_once(std::chrono::milliseconds timeout);
  [[nodiscard]] uint64_t units_filled() const { return units_filled_; }

 private:
  FallbackServer() = default;
  [[nodiscard]] Status serve(uint64_t address);
  int uffd_ = -1;
  uint64_t base_ = 0;
  uint64_t size_ = 0;
  uint64_t unit_ = 0;
  uint64_t page_ = 0;  // LazyMapping::page_size()
  int gguf_fd_ = -1;
  uint64_t file_size_ = 0;
  wire::StatusPageView status_;
  sys::Mapping writable_;
  std::vector<bool> filled_;
  uint64_t units_filled_ = 0;
};

// Cooperative mode (no userfaultfd on this kernel): the daemon
// fills the region in rank order in the background and publishes readiness on
// the status page; the client maps the region read-only and waits before it
// touches what is not ready yet. Touching a unit before it is ready reads
// zeros (the daemon's fill then overwrites them in the shared page cache, but
// what was read is wrong): only touch after a wait below returned OK.

// Maps `size` bytes of `region_fd` (O_RDONLY is enough) PROT_READ MAP_SHARED,
// nothing populated. Thread: any. Errors: mmap.
[[nodiscard]] Result<sys::Mapping> map_region_readonly(int region_fd, uint64_t size);

// What a cooperative client does when the daemon dies before the model is
// resident (nobody fills the region any more): the region mapping is
// replaced in place (same address, MAP_FIXED) by a read-only shared mapping
// of the GGUF file itself — byte i of the region is byte i of the file — so
// every later touch reads the file's bytes from the page cache (shared with
// every process that maps the file), never zeros, and every wait returns.
// The swap is one mmap call: a thread reading a unit that was ready reads
// the same bytes before and after it.
class CooperativeFallback {
 public:
  // `base`, `size`: the read-only region mapping (must stay mapped while
  // this lives; its owner unmaps the same range later). `gguf_fd`: the
  // client's own model file, `daemon_pidfd`: a pidfd of the daemon (neither
  // owned). `announce` (may be empty) runs once when the swap happened.
  CooperativeFallback(void* base, uint64_t size, int gguf_fd, int daemon_pidfd, std::function<void()> announce);
  // True once the daemon has exited. Thread: any.
  [[nodiscard]] bool daemon_gone() const;
  // Swaps the mapping (once; later and concurrent calls return the first
  // call's result). Thread: any. Errors: mmap of the file (the region
  // mapping is then unchanged and the waits report it).
  [[nodiscard]] Status take_over();
  // The mapping was swapped already by someone else (the touch guard's
  // SIGSEGV handler maps the file in place itself): record it and announce,
  // without mapping again. Thread: any.
  void adopt();
  [[nodiscard]] bool taken_over() const { return taken_.load(std::memory_order_acquire); }
  // How often a waiter looks at the daemon's pidfd while the status page
  // stays still (a futex wait cannot also wait for a process).
  static constexpr std::chrono::milliseconds kCheckEvery{50};

 private:
  void* base_;
  uint64_t size_;
  int gguf_fd_;
  int daemon_pidfd_;
  std::function<void()> announce_;
  std::mutex mu_;
  std::atomic<bool> taken_{false};
  std::optional<Error> failed_;
};

// Blocks until every unit of load rank `rank` is ready: futex wait on the
// status page's generation word (non-private) re-checking the rank's
// units_ready == units_total after each wake. `timeout` < 0: forever.
// Thread: any (many threads may wait at once). Errors: EINVAL unknown rank or
// invalid page, EIO the model failed to load and the rank is not complete,
// ETIMEDOUT.
//
// With `fallback` (may be null), a wait also watches the daemon: once it is
// gone and the wait's units are not ready, the fallback takes over and the
// wait returns OK (the bytes now come from the file).
[[nodiscard]] Status wait_rank(wire::StatusPageView status, uint32_t rank, std::chrono::nanoseconds timeout,
                               CooperativeFallback* fallback = nullptr);
// Blocks until every unit overlapping region bytes [offset, +len) is ready
// (for callers that know tensor offsets rather than ranks). Same errors;
// EINVAL for a range past the region. `ask`, if given, asks the daemon for
// a unit (the touch guard's Wait): called at the start for each unit of the
// range that is not ready, and again for a unit the wait comes to that is
// not ready (one dropped after it was read): a streamed model reads what
// is asked for, and ahead of its clients only near where they are.
[[nodiscard]] Status wait_range(wire::StatusPageView status, uint64_t offset, uint64_t len, std::chrono::nanoseconds timeout,
                                CooperativeFallback* fallback = nullptr,
                                const std::function<void(uint32_t unit)>& ask = {});
// Blocks until the whole model is resident (what a plain mapper must do
// before its first touch). Same errors.
[[nodiscard]] Status wait_resident(wire::StatusPageView status, std::chrono::nanoseconds timeout,
                                   CooperativeFallback* fallback = nullptr);

}  // namespace airs::client
