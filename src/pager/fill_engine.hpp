// SPDX-License-Identifier: Apache-2.0
// The pager's reads: a unit of a model is read from its GGUF file into the
// daemon's mapping of the model's region with io_uring (O_DIRECT where the
// file system takes it, buffered elsewhere; through a bounce buffer and a
// write into the region file where PagerOptions::copy_fill asks for it),
// pages of units about to be read are allocated ahead (MADV_POPULATE_WRITE
// in the ring's io-wq workers), and the background warm-up is paced. Which
// unit to read is not decided here: the pager asks for one read at a time,
// and hears of each read's end through FillListener. Loop thread only.
//
// A model's FillSource is the engine's record of it: registered while the
// model's reads may still complete (an unloaded model stays registered
// until its last read landed), owned by the pager's model.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pager/fill_plan.hpp"
#include "pager/read_rate.hpp"
#include "pool/pool.hpp"
#include "sys/event_loop.hpp"
#include "sys/fd.hpp"
#include "sys/uring.hpp"
#include "util/result.hpp"

namespace airs::pager {

using ModelId = uint64_t;

enum class DirectIo : uint8_t {
  Auto,  // O_DIRECT where the file system takes it, buffered reads elsewhere
  On,    // O_DIRECT or the load fails (a file system that refuses it is named)
  Off,   // buffered reads through the page cache (a second copy of the model)
};

// What the engine keeps of one model.
struct FillSource {
  ModelId id = 0;
  std::string name;
  sys::UniqueFd gguf;         // buffered reads (the client's file, dup'ed)
  sys::UniqueFd gguf_direct;  // O_DIRECT reopen, invalid where the fs refuses
  uint64_t file_size = 0;
  uint64_t unit = 0;
  pool::Region* region = nullptr;
  bool copy_fill = false;  // read into a bounce buffer, then written into the region file
  // Retiring: no new reads or populates are started; those in flight land
  // (their completions are still reported, unless `revoked`).
  bool accepting = true;
  // Unloaded: the region is truncated; completions are counted, not reported.
  bool revoked = false;
  // The uid whose reads this model's count with, where that uid may hold
  // only a share of the read slots (FillEngine::slot_free_for): a model on
  // a file whose reads may never end (FUSE, a network file system) that a
  // caller who is not an admin loaded. Unset: any other model, which may
  // hold them all.
  std::optional<uint32_t> capped_owner;
  // Reads go straight to an io-wq worker (IOSQE_ASYNC). io_uring otherwise
  // starts a read in the submitting thread, the daemon's loop, and a file
  // system that cannot take it without blocking (FUSE, whose server may
  // never answer) blocks the loop there, in io_uring_enter.
  bool async_reads = false;
  uint32_t in_flight = 0;
  uint32_t populates_in_flight = 0;
  std::vector<uint8_t> populated;  // per unit, since the last (re)fill started
  uint64_t bytes_read = 0;
  bool pin_warned = false;
  bool populate_warned = false;
  [[nodiscard]] bool idle() const { return in_flight == 0 && populates_in_flight == 0; }
};

struct FillOptions {
  uint32_t queue_depth = 16;
  uint32_t allocate_ahead = 32;
  uint64_t warmup_bytes_per_s = 0;
  DirectIo direct_io = DirectIo::Auto;
  bool copy_fill = false;
  bool io_priorities = true;  // false: sqe->ioprio 0 (the process's own priority)
};

// The I/O priority (IOPRIO_PRIO_VALUE) a read of class `cls` goes to the
// device with, so the kernel orders the daemon's reads as pump() does and
// against every other process's I/O:
//   Urgent     best-effort 0: a client's thread is stopped on it;
//   Prefetch   best-effort 7: needed soon, behind any fault, theirs or ours;
//   Background idle: the warm-up of a model nobody waits for yet. The idle
//              class, not best-effort 7, so it never delays another
//              process's I/O either: mq-deadline dispatches it only when no
//              best-effort request waits (aging lifts one that waited past
//              prio_aging_expire, 10 s).
// What honours it: mq-deadline orders requests by class (fault and
// prefetch are both best-effort there), the request's own. bfq does not
// order one process's requests by theirs: its queues and their class are
// per I/O context, and every read of the daemon (io-wq workers share it)
// is one queue; there the unit's IOSchedulingClass places the daemon as a
// whole (bench/ioprio: a fault's p50 4.4x lower with mq-deadline, no change
// with bfq). What a class cannot change once in the device: a fault on a
// unit whose warm-up read is already in flight waits for that idle read;
// under other I/O that is bounded by the aging above, unloaded it is one
// read. Buffered reads (a file system that refuses O_DIRECT) reach the
// device at the process's priority (the unit's), not these.
[[nodiscard]] uint16_t io_priority(ReadClass cls);

class FillListener {
 public:
  virtual ~FillListener() = default;
  // Unit `unit` of model `id` holds its final bytes in the region (and every
  // page of it is present and pinned where the backend pins).
  virtual void unit_read(ModelId id, uint32_t unit) = 0;
  // Its read failed (-errno as errno, EIO for a file that shrank).
  virtual void unit_read_failed(ModelId id, uint32_t unit, int err) = 0;
  // After every batch of completions (the pager maps what became ready,
  // ends drains and issues the next reads here).
  virtual void reaped() = 0;
};

class FillEngine {
 public:
  // `loop`, `pool` and `listener` must outlive the engine. Errors: io_uring setup.
  static Result<std::unique_ptr<FillEngine>> create(sys::EventLoop& loop, pool::Pool& pool, FillOptions opts,
                                                    FillListener& listener);
  // Calls shutdown() unless it ran.
  ~FillEngine();
  // The daemon is going: no new reads; waits (at most 10 s: an SD card's
  // deepest queue takes ~1.6 s) for those still in the device, serving
  // their completions without reporting them. False when some are still in
  // flight: their destinations (the daemon's mappings of their regions, the
  // bounce buffers) must then stay mapped, so no read lands in memory a
  // later mapping reuses; the bounce buffers are left mapped here.
  bool shutdown();
  [[nodiscard]] bool closing() const { return closing_; }
  FillEngine(const FillEngine&) = delete;
  FillEngine& operator=(const FillEngine&) = delete;

  // Takes `direct`, the O_DIRECT reopen of `src.gguf` the caller made (or
  // why it failed), where asked; without one, reopens it here (an OPEN of
  // the file system: the daemon makes it off the loop, with the header).
  // Sets copy_fill and registers the source. Errors: DirectIo::On on a file
  // system that refuses O_DIRECT.
  [[nodiscard]] Status add(FillSource& src, std::optional<Result<sys::UniqueFd>> direct = std::nullopt);
  // Forgets the source (it must be idle).
  void remove(ModelId id);
  // A (re)fill starts: nothing is allocated ahead, nothing read yet.
  void restart(FillSource& src);

  [[nodiscard]] bool slot_free() const { return reads_active_ < opts_.queue_depth; }
  // A slot is free for a read of `src`: a capped owner's models hold at most
  // half the slots between them, and all capped owners together leave a
  // quarter to the uncapped. A read can stay in the device for ever (a
  // FUSE server that never answers, a hung network file system), and no
  // cancel frees its slot; so one user's such file holds only its own
  // share, and everyone else's reads go on. read() leaves this check to
  // the caller.
  [[nodiscard]] bool slot_free_for(const FillSource& src) const;
  [[nodiscard]] uint32_t reads_active() const { return reads_active_; }
  // Starts the read of `unit` (a slot must be free) at the I/O priority of
  // `cls` (io_priority). Errors: the pool's claim of the unit's page
  // (nothing was started).
  [[nodiscard]] Status read(FillSource& src, uint32_t unit, ReadClass cls);
  // The warm-up's pacing: true when a background read of `bytes` may start
  // now; otherwise the engine calls `wake` (the listener's reaped(), via the
  // loop) once it may.
  [[nodiscard]] bool background_allowed(uint64_t bytes);
  // Queues populates for `units` (in order, up to the free populate slots);
  // units already populated or populating are skipped.
  void populate(FillSource& src, const std::vector<uint32_t>& units);
  [[nodiscard]] uint32_t populate_slots() const { return opts_.allocate_ahead; }
  // Submits what read() and populate() queued.
  void submit();

  // Runs the ring until `done()` or `deadline` (serving completions as the
  // loop would). Blocks: tests and shutdown only. True when done() held.
  bool reap_until(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline);
  // No read in flight and no source filling: the bounce buffers' pages go
  // back to the kernel (MADV_FREE).
  void free_bounce_if(bool nothing_loads);

 private:
  struct Read;
  struct Populate;
  FillEngine(sys::EventLoop& loop, pool::Pool& pool, FillOptions opts, FillListener& listener, sys::Ring ring);
  FillSource* find(ModelId id) const;
  void submit_read(size_t slot);
  std::byte* bounce(size_t slot);
  void copy_in(size_t slot);
  void on_copied(size_t slot, int32_t res);
  void finish_unit(FillSource& src, uint32_t unit, uint64_t written);
  // The slot's read is over (done, failed, or its model gone: src null).
  void release(Read& r, FillSource* src);
  void on_ring();
  void on_completion(uint64_t user_data, int32_t res);
  void on_read(size_t slot, int32_t res);
  void on_populated(size_t slot, int32_t res);
  uint32_t populates_active() const;

  sys::EventLoop& loop_;
  pool::Pool& pool_;
  FillOptions opts_;
  FillListener& listener_;
  std::unique_ptr<sys::Ring> ring_;
  std::vector<Read> reads_;  // slots, size queue_depth
  uint32_t reads_active_ = 0;
  std::map<uint32_t, uint32_t> owner_reads_;  // reads in flight per capped owner
  uint32_t capped_reads_ = 0;                 // their sum
  std::vector<Populate> populates_;  // slots, size allocate_ahead
  std::map<ModelId, FillSource*> sources_;
  // Copy fill: one unit per read slot, mapped at the first copied read;
  // its pages are given back (MADV_FREE) whenever no model loads.
  sys::Mapping bounce_;
  bool bounce_used_ = false;
  ReadRate warmup_rate_;
  std::optional<sys::OneShotTimer> warmup_timer_;  // set when the rate is limited
  bool closing_ = false;  // destructor: no new reads, completions only counted
};

}  // namespace airs::pager
