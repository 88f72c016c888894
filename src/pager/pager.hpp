// The lazy-fill engine: model regions filled from GGUF files with io_uring,
// client page faults answered through userfaultfd. Runs entirely on the
// daemon's event loop thread: every method must be called from it, and all
// work happens in callbacks of the EventLoop given at create (no threads).
//
// The zero-page rules it keeps (docs/kernel-facts.md): clients register
// MISSING|MINOR on their own uffd before anything touches their mapping; the
// daemon fills only through its own reserving mapping of the region and
// answers with UFFDIO_CONTINUE once a unit's bytes are complete; read errors
// are answered with UFFDIO_POISON (SIGBUS), never with a mapping; the region
// stays reserved while loaded, so a fill never meets an exhausted pool.
// Allocating ahead (PagerOptions::allocate_ahead) puts zeroed pages of units
// not yet read into the region's page cache: safe, because a registered
// client touching one gets a MINOR fault, and the pager CONTINUEs a unit only
// once it is READY (handle_fault parks every other state, attach maps only
// READY units).
//
// Eviction and unload never block the loop (docs/retire.md): both are state
// machines driven by the ring's completions. The in-flight reads and
// populates of the model finish on their own; while they do the model takes
// no new ones, its region (pages and the daemon's mapping) stays whole, and
// when the last completion lands the pages go back to the pool (counted free
// only then) and the DrainListener fires. An unload revokes at once, before
// that drain: the model leaves the table, its status page says Unloaded and
// the region is truncated, so every mapping gets SIGBUS on its next access.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "client/status_page.hpp"
#include "pager/access_order.hpp"
#include "pager/fill_plan.hpp"
#include "pager/read_rate.hpp"
#include "pool/pool.hpp"
#include "sys/event_loop.hpp"
#include "sys/fd.hpp"
#include "sys/uring.hpp"
#include "util/result.hpp"

namespace airs::pager {

using ModelId = uint64_t;
using ClientKey = uint64_t;

struct ModelSpec {
  std::string name;
  sys::UniqueFd gguf;  // a dup of the client's fd; the pager owns it
  uint64_t file_size = 0;
  // Byte ranges of the file with their load order (0 first: header and
  // token_embd; then blk.0 ... blk.N; output last). Need not cover the file.
  std::vector<Extent> extents;
  // Units the background warm-up reads first, in this order (a replayed
  // recording, pager/access_order.hpp), then the rest in load order. Faults
  // and the prefetch window still come first. Must hold units of this model
  // without repeats, else it is ignored with a log line.
  std::vector<uint32_t> warmup_order;
  // Record the order clients first fault on units (take_access_order).
  // While recording, units are mapped into a client only when it faults on
  // them (not ahead at attach or when read), so every first touch is seen.
  bool record_access = false;
};

enum class DirectIo : uint8_t {
  Auto,  // O_DIRECT where the file system takes it, buffered reads elsewhere
  On,    // O_DIRECT or the load fails (a file system that refuses it is named)
  Off,   // buffered reads through the page cache (a second copy of the model)
};

struct PagerOptions {
  uint32_t queue_depth = 16;       // io_uring reads in flight
  uint32_t prefetch_window = 2;    // ranks past the last faulted rank
  bool background_warmup = true;   // false: read only what faults and the window ask for
  // Units whose pages are allocated and zeroed ahead of their reads
  // (MADV_POPULATE_WRITE on the daemon's mapping, run by the ring's io-wq
  // workers): the kernel's allocation and zeroing of each new page (~113 µs
  // per 2 MiB) then overlaps other reads instead of happening inside the
  // unit's own read (its O_DIRECT page pinning faults the page in), and off
  // the event loop thread, which would otherwise do it inside the read's
  // submission. Two queue depths' worth: at 8 most reads of a 16-deep queue
  // still allocated inline (load_bench, 512 MiB: the loop's CPU time for the
  // fill fell from 207 to 108 ms in small-pages, 37 to 10 ms in full mode at
  // 32; the process's total stayed the same: the work moved, off the loop).
  // 0 = off.
  uint32_t allocate_ahead = 32;
  // Cooperative mode (no userfaultfd): attach() is refused; clients map the
  // region read-only and wait on the status page per rank (client::wait_rank).
  // Background warm-up must stay on: nothing else drives the fill.
  bool uffd_clients = true;
  // Bytes per second for the background warm-up (0: as fast as the device
  // goes). Faults and the layer-ahead window are never limited; in
  // cooperative mode the warm-up is the whole fill, so this paces it all.
  uint64_t warmup_bytes_per_s = 0;
  DirectIo direct_io = DirectIo::Auto;
  // Fill base-page shmem (memfds: PoolBackend::fills_by_copy, the region
  // sealed against growth) by copy: each unit is read into a reusable
  // anonymous bounce buffer (one unit per read slot, queue_depth × unit of
  // anonymous memory), then written into the region file and mapped into
  // the daemon's locked mapping, both in the ring's io-wq workers; no pages
  // are allocated ahead. Off (the default): reads go straight into the
  // region mapping, as on hugetlbfs and huge folios. Measured
  // (docs/shmem-base-pages.md, bench/load/memfd_fill.sh): the copy skips the
  // zeroing and the pinning of shmem pages but costs a memcpy, and took
  // 8-17% more process CPU for the same pass; kept for measuring other
  // machines.
  bool copy_fill = false;
};

// fault→resume latency (the daemon's side: fault event read → CONTINUE done).
struct LatencyHistogram {
  static constexpr std::array<uint64_t, 12> kUpperUs{10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000, 100000};
  std::array<uint64_t, kUpperUs.size() + 1> counts{};  // last: above the last bound
  uint64_t samples = 0;
  uint64_t sum_us = 0;
  void add(uint64_t us);
};

struct ModelStats {
  std::string name;
  client::ModelLoadState state = client::ModelLoadState::Loading;
  uint64_t file_size = 0;
  uint64_t region_size = 0;
  uint64_t unit_size = 0;
  uint32_t units = 0;
  uint32_t units_ready = 0;
  uint32_t units_in_flight = 0;
  uint32_t units_failed = 0;
  uint64_t resident_bytes = 0;    // ready units × unit size
  uint32_t clients = 0;
  uint64_t bytes_read = 0;        // since the last (re)load
  double read_mb_per_s = 0;       // bytes_read over the time since (re)load until resident (or now)
  bool direct_io = false;         // O_DIRECT reads in use
  bool pin_failed = false;        // shmem: a unit could not be mlocked (its bytes may be swapped)
  bool copy_fill = false;         // filled by copy through a bounce buffer (PagerOptions::copy_fill)
  uint64_t faults = 0;            // fault events handled (all clients, duplicates included)
  uint64_t faults_waited = 0;     // faults on units not yet ready
  LatencyHistogram ready_latency; // faults on READY units
  LatencyHistogram wait_latency;  // faults that waited for a read
};

class Pager {
 public:
  // `loop` and `pool` must outlive the pager. Errors: io_uring setup.
  static Result<std::unique_ptr<Pager>> create(sys::EventLoop& loop, pool::Pool& pool, PagerOptions opts);
  ~Pager();
  Pager(const Pager&) = delete;
  Pager& operator=(const Pager&) = delete;

  // Reserves the whole region (pool pages; ENOSPC "pool exhausted" leaves
  // nothing behind), creates the status page and starts the warm-up.
  // Errors: EINVAL for an empty file or extents past it, pool errors.
  [[nodiscard]] Result<ModelId> load(ModelSpec spec);
  // A region that already holds every byte of the file (an earlier daemon
  // filled it; the caller checked its content): the model is Resident at
  // once and nothing is read. Errors: EINVAL for a region smaller than the
  // file, status page errors.
  [[nodiscard]] Result<ModelId> adopt(ModelSpec spec, std::unique_ptr<pool::Region> region);

  // The region file (O_RDWR: lazy clients need a writable fd to register)
  // and the status page (O_RDONLY). Owned by the pager; dup to hand out.
  // -1 for unknown models.
  [[nodiscard]] int region_fd(ModelId id) const;
  [[nodiscard]] int status_fd(ModelId id) const;
  // The model's GGUF (the fd its spec gave; read-only). -1 for unknown models.
  [[nodiscard]] int gguf_fd(ModelId id) const;
  [[nodiscard]] uint64_t region_size(ModelId id) const;

  // A client mapped [addr, addr+length) of the region PROT_READ MAP_SHARED,
  // MADV_DONTFORK, and registered it MISSING|MINOR on `uffd` (it keeps its
  // own copy). Takes ownership of the fds; maps every ready unit into the
  // client at once; `notify` (may be invalid) is signalled when the model is
  // fully resident. Errors: ENOENT model, EEXIST key, ESRCH client gone,
  // EINVAL for a range that is not the whole region.
  [[nodiscard]] Status attach(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd uffd, sys::UniqueFd notify,
                              uint64_t addr, uint64_t length);
  // Forget a client (its uffd is closed). No-op if unknown.
  void detach(ModelId id, ClientKey key);
  // Cooperative mode: `requests` is one end of a client's SOCK_SEQPACKET
  // socket pair. The client sends one 4-byte unit number (host order) per
  // unit it is about to touch and waits for (send(MSG_DONTWAIT|MSG_NOSIGNAL)
  // is async-signal-safe and cannot raise SIGPIPE, so a fault handler can
  // make it); each is handled like a fault: queued urgent if not read yet,
  // and the layer-ahead window moves to its rank. Bad numbers are ignored;
  // the socket goes when the client closes its end (EOF) or on detach(key).
  // Errors: ENOENT model, ENOTSUP outside cooperative mode (a fault does
  // this there), EBADF not a SOCK_SEQPACKET socket, EEXIST key.
  [[nodiscard]] Status follow(ModelId id, ClientKey key, sys::UniqueFd requests);

  // How an evict() or unload() ended.
  enum class Drain : uint8_t {
    Done,     // nothing was in flight: finished inside the call, no event follows
    Pending,  // reads or populates are in flight: the DrainListener fires once they landed
  };
  // What a pending drain ended in (DrainListener).
  enum class Drained : uint8_t {
    Evicted,   // the region was punched, its pages are back in the pool; the model is Evicted
    Kept,      // an eviction was given up: a client faulted or attached meanwhile; the fill goes on
    Unloaded,  // the unloaded model's pages are back in the pool (its id is long gone)
  };

  // Evict (refcount 0, never pinned models): the model stops issuing reads
  // and populates; once those in flight landed the region is punched and its
  // pages go back to the pool (never before: a late read or populate would
  // write into or allocate a page of a punched region). Attached clients
  // that touch it later trigger a re-reserve. While the drain runs the model
  // keeps its state and every ready unit; a fault or attach on it (or
  // ensure_loaded) gives the eviction up (Drained::Kept). Calling it again
  // while it drains is a no-op (Pending). Errors: ENOENT, EBUSY while a
  // client waits on a fault; pool errors (Done only).
  [[nodiscard]] Result<Drain> evict(ModelId id);
  // Re-reserve an evicted model and start refilling it. No-op if loaded;
  // while an eviction drains it is given up. Errors: ENOSPC pool exhausted
  // (nothing changed).
  [[nodiscard]] Status ensure_loaded(ModelId id);
  // Forget the model, at once for every caller: the id is unknown from the
  // return on, the status page says Unloaded, clients are woken and
  // detached, and the region is truncated (every mapping of it, in any
  // process and mode, gets SIGBUS on its next access: never zeros, never
  // stale bytes). The truncate does not wait for the model's in-flight
  // reads (docs/retire.md: a read already in the device writes into pages
  // it pinned, which no mapping or file reaches any more; one not yet
  // started meets the truncated mapping and fails); the pages go back to
  // the pool when the last of them landed (Drain::Pending, then
  // Drained::Unloaded). Errors: ENOENT; a failed truncate (the rest is
  // done anyway).
  [[nodiscard]] Result<Drain> unload(ModelId id);

  // Called on the loop when a model becomes Resident or Failed (events, not
  // polls). May be empty.
  using StateListener = std::function<void(ModelId, client::ModelLoadState)>;
  void set_state_listener(StateListener l) { state_listener_ = std::move(l); }
  // Called on the loop (from a ring completion, never inside evict or
  // unload) once per Drain::Pending, when that drain ended. May be empty.
  using DrainListener = std::function<void(ModelId, Drained)>;
  void set_drain_listener(DrainListener l) { drain_listener_ = std::move(l); }
  // Pool pages that draining evictions and unloads will give back (still
  // counted as model pages by the pool until they do): planners count them
  // as on their way, so nobody evicts twice for the same need.
  [[nodiscard]] uint64_t returning_pages() const;
  // True while an eviction or unload of `id` waits for its reads.
  [[nodiscard]] bool draining(ModelId id) const;
  // Runs the ring until every drain ended or `deadline` passed (serving
  // completions as the loop would: fills of other models go on). Blocks:
  // for tests and tools that may wait for the pages. The daemon never calls
  // it; a bus call that needs draining pages is parked and answered from
  // the drain event (docs/retire.md). Returns true when nothing drains any
  // more.
  bool finish_drains(std::chrono::steady_clock::time_point deadline);

  // Ends the recording of `id` (ModelSpec::record_access) and returns the
  // units in the order clients first faulted on them; units read from then
  // on are mapped into every client at once again (ready units not mapped
  // yet are answered on their fault). nullopt: unknown model or
  // not recording. Cooperative mode records nothing (the waits happen in
  // the clients, on the status page): the order is empty there.
  [[nodiscard]] std::optional<std::vector<uint32_t>> take_access_order(ModelId id);
  // The units of `id` in the order their reads were issued since its last
  // (re)fill started (at most one entry per unit per fill). Empty for an
  // unknown model.
  [[nodiscard]] std::vector<uint32_t> read_order(ModelId id) const;

  [[nodiscard]] Result<ModelStats> stats(ModelId id) const;
  [[nodiscard]] std::vector<ModelId> models() const;

 private:
  struct Client;
  struct Model;
  struct Read;
  struct Populate;
  Pager(sys::EventLoop& loop, pool::Pool& pool, PagerOptions opts, sys::Ring ring);
  Model* find(ModelId id) const;
  void pump();
  bool issue(Model& m, uint32_t unit);
  void submit_read(size_t slot);
  std::byte* bounce(size_t slot);
  void copy_in(size_t slot);
  void on_copied(size_t slot, int32_t res);
  void finish_unit(Model& m, uint32_t unit, uint64_t written);
  void free_bounce_if_idle();
  void on_ring();
  void on_completion(uint64_t user_data, int32_t res);
  bool populate_ahead();
  void on_populated(size_t slot, int32_t res);
  void unit_ready(Model& m, uint32_t unit);
  void map_ready();
  // `fault`: the address a client faulted at, when answering that fault
  // (0: mapping units as they become ready).
  bool continue_range(Model& m, Client& c, uint32_t first, uint32_t count, uint64_t fault = 0);
  // The page a client's mapping of the region is mapped with: the unit (a
  // huge page) on hugetlbfs, the base page on shmem.
  uint64_t mapping_page(const Model& m) const;
  void unit_failed(Model& m, uint32_t unit, int err);
  void on_uffd(ModelId id, ClientKey key);
  void on_requests(ModelId id, ClientKey key);
  void handle_fault(Model& m, Client& c, uint64_t address, std::chrono::steady_clock::time_point t0);
  bool continue_unit(Model& m, Client& c, uint32_t unit, uint64_t fault = 0);
  Status map_ready_units(Model& m, Client& c);
  void poison_unit(Model& m, Client& c, uint32_t unit);
  void drop_client(ModelId id, ClientKey key, const char* why);
  Model* find_any(ModelId id) const;
  uint32_t populates_active() const;
  void after_reap();
  bool reap_until(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline);
  void end_drains();
  Status punch(Model& m);
  void start_fill(Model& m);
  void publish(Model& m);
  void check_resident(Model& m);
  Result<ModelId> install(ModelSpec spec, std::unique_ptr<pool::Region> region, bool filled);

  sys::EventLoop& loop_;
  pool::Pool& pool_;
  PagerOptions opts_;
  std::unique_ptr<sys::Ring> ring_;
  std::vector<Read> reads_;  // slots, size queue_depth
  uint32_t reads_active_ = 0;
  // Copy fill: one unit per read slot, mapped at the first copied read;
  // its pages are given back (MADV_FREE) whenever no model loads.
  sys::Mapping bounce_;
  bool bounce_used_ = false;  // pages of bounce_ touched since the last MADV_FREE
  std::vector<Populate> populates_;  // slots, size allocate_ahead
  std::map<ModelId, std::unique_ptr<Model>> models_;
  // Unloaded models whose reads are still in flight: out of the table for
  // every caller, kept whole (region, mapping) until their drain ended.
  std::map<ModelId, std::unique_ptr<Model>> unloading_;
  ModelId next_id_ = 1;
  ReadRate warmup_rate_;
  StateListener state_listener_;
  DrainListener drain_listener_;
  std::optional<sys::OneShotTimer> warmup_timer_;  // set when the rate is limited
  bool closing_ = false;  // destructor: no new reads, completions only counted
};

}  // namespace airs::pager
