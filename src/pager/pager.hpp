// SPDX-License-Identifier: Apache-2.0
// The lazy-fill pager: model regions filled from GGUF files with io_uring,
// client page faults answered through userfaultfd, cooperative clients
// served through their request sockets, and models bigger than their
// budget of pool pages streamed through it. Runs entirely on the daemon's
// event loop thread: every method must be called from it, and all work
// happens in callbacks of the EventLoop given at create (no threads).
//
// It is three parts and this file, which owns the models and joins them:
//   - FillEngine (fill_engine.hpp): the reads, pages allocated ahead, the
//     warm-up's pacing;
//   - ClientService (client_service.hpp): lazy and cooperative clients,
//     their faults and messages, the answers;
//   - Residency (residency.hpp): what of a model is in, what is read next,
//     what goes out, with StreamPolicy (stream_policy.hpp) for a streamed one.
//
// The zero-page rules it keeps (docs/kernel-facts.md): clients register
// MISSING|MINOR on their own uffd before anything touches their mapping; the
// daemon fills only through its own mapping of the region and answers with
// UFFDIO_CONTINUE once a unit's bytes are complete; read errors are answered
// with UFFDIO_POISON (SIGBUS), never with a mapping; a region that fits is
// reserved whole while loaded, so a fill never meets an exhausted pool; a
// streamed region is handed a page per unit before its read (the pool's
// claim), within the model's budget. Allocating ahead puts zeroed pages of
// units not yet read into the page cache: safe, because a registered client
// touching one gets a MINOR fault, and a unit is CONTINUEd only once READY.
// A streamed unit leaves in two steps: its READY bit is cleared and every
// cooperative client asked to close it (PROT_NONE); once each answered (or
// left), its page is punched, which takes it out of every lazy client's
// mapping (their next touch faults). A cooperative client that does not
// answer in time keeps the unit in the pool: the daemon takes another.
//
// Unload never blocks the loop (docs/retire.md): the model leaves the table
// at once, its status page says Unloaded and the region is truncated, so
// every mapping gets SIGBUS on its next access; its pages go back to the
// pool once its reads in flight landed (the DrainListener fires then).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pager/access_order.hpp"
#include "pager/client_service.hpp"
#include "pager/fill_engine.hpp"
#include "pager/fill_plan.hpp"
#include "pager/latency.hpp"
#include "pager/residency.hpp"
#include "pool/pool.hpp"
#include "sys/event_loop.hpp"
#include "sys/fd.hpp"
#include "util/result.hpp"
#include "wire/status_page.hpp"

namespace airs::pager {

struct ModelSpec {
  // The caller's id for the model (0: the pager picks one). Unique.
  ModelId id = 0;
  std::string name;
  sys::UniqueFd gguf;  // a dup of the client's fd; the pager owns it
  // gguf reopened O_DIRECT by the caller, or why that failed; unset: the
  // pager reopens it (models.direct_io), an OPEN of the file system on the
  // calling thread.
  std::optional<Result<sys::UniqueFd>> gguf_direct;
  uint64_t file_size = 0;
  // Byte ranges of the file with their load order (0 first: header and
  // token_embd; then blk.0 ... blk.N; output last) and how a token reads
  // them. Need not cover the file.
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
  // Streamed: the model may hold at most this many bytes of pool pages
  // (rounded down to whole units). 0, or not smaller than the region: the
  // model is loaded whole.
  uint64_t budget_bytes = 0;
  // The uid whose share of the read slots this model's reads take (the
  // file's reads may never end, and its loader is not an admin); unset: no
  // share, all slots.
  std::optional<uint32_t> capped_owner;
  // Every read of the file goes to one of the ring's io-wq workers, never
  // started in the thread that submits it (FillSource::async_reads).
  bool async_reads = false;
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
  // the event loop thread. Two queue depths' worth: at 8 most reads of a
  // 16-deep queue still allocated inline (load_bench, 512 MiB: the loop's
  // CPU time for the fill fell from 207 to 108 ms in small-pages, 37 to
  // 10 ms in full mode at 32). 0 = off. Never for streamed models (their
  // units would take pages of the budget before their turn).
  uint32_t allocate_ahead = 32;
  // Cooperative mode (no userfaultfd): attach() is refused; clients map the
  // region read-only and wait on the status page. Background warm-up must
  // stay on: nothing else drives the fill.
  bool uffd_clients = true;
  // Bytes per second for the background warm-up (0: as fast as the device
  // goes). Faults and the layer-ahead window are never limited; in
  // cooperative mode the warm-up is the whole fill, so this paces it all.
  uint64_t warmup_bytes_per_s = 0;
  DirectIo direct_io = DirectIo::Auto;
  // Fill base-page shmem by copy through bounce buffers (FillOptions; off
  // by default: measured 8-17% more process CPU, docs/shmem-base-pages.md).
  bool copy_fill = false;
  // Each read at its class's I/O priority (io_priority in fill_engine.hpp).
  // false: every read at the process's own, as before (bench/ioprio's
  // comparison).
  bool io_priorities = true;
  // Streamed models: units read ahead of the clients (0: a tenth of what a
  // token streams, at least 2, at most the queue depth), and how long a
  // cooperative client may take to close a unit before the daemon keeps it
  // and drops another.
  uint32_t stream_window = 0;
  std::chrono::milliseconds close_timeout{500};
  // A streamed mixture of experts on a pool that hands pages over per unit
  // (shmem) is cut in units of this many bytes (a divisor of the pool's
  // page, a multiple of the base page); 0, or a size that is neither: the
  // pool's page, as every other model (Pager::stream_unit says why).
  uint64_t expert_unit = 512 * 1024;
};

struct ModelStats {
  std::string name;
  wire::ModelLoadState state = wire::ModelLoadState::Loading;
  uint64_t file_size = 0;
  uint64_t region_size = 0;
  uint64_t unit_size = 0;
  uint32_t units = 0;
  uint32_t units_ready = 0;
  uint32_t units_in_flight = 0;
  uint32_t units_failed = 0;
  uint64_t resident_bytes = 0;    // ready units × unit size
  uint32_t clients = 0;           // lazy and cooperative clients mapping it now
  uint64_t bytes_read = 0;        // since the last (re)load
  double read_mb_per_s = 0;       // bytes_read over the time since (re)load until resident (or now)
  bool direct_io = false;         // O_DIRECT reads in use
  bool pin_failed = false;        // shmem: a unit could not be mlocked (its bytes may be swapped)
  bool copy_fill = false;         // filled by copy through a bounce buffer
  uint64_t faults = 0;            // fault events (duplicates included) and cooperative waits (not a repeated ask)
  uint64_t faults_waited = 0;     // faults on units not ready yet
  LatencyHistogram ready_latency; // faults on READY units
  LatencyHistogram wait_latency;  // faults that waited for a read
  bool streamed = false;
  StreamStats stream;             // streamed models only
  HintStats hints;                // expert hints of its clients
};

class Pager final : FillListener, TouchListener {
 public:
  // How an unload or a budget cut ended.
  enum class Drain : uint8_t {
    Done,     // finished inside the call, no event follows
    Pending,  // the DrainListener fires once it ended
  };
  // What a pending drain ended in (DrainListener).
  enum class Drained : uint8_t {
    Unloaded,  // the unloaded model's pages are back in the pool (its id is long gone)
    Shrunk,    // a streamed model's budget was cut: the pages are free in the pool
  };
  // Called on the loop when a model becomes Resident or Failed (events, not
  // polls).
  using StateListener = std::function<void(ModelId, wire::ModelLoadState)>;
  // Called on the loop (from a ring completion, never inside unload or
  // set_budget) once per Drain::Pending, when that drain ended.
  using DrainListener = std::function<void(ModelId, Drained)>;
  // Called on the loop when a client of a loaded model is gone, whatever
  // took it (detach(), its process exited, its socket hung up, its
  // userfaultfd failed); not for the clients an unload() takes. The pager
  // is the one record of who is attached: a caller that keeps its own list
  // of keys prunes it here.
  using ClientListener = std::function<void(ModelId, ClientKey)>;
  // Each may be empty.
  struct Listeners {
    StateListener state;
    DrainListener drain;
    ClientListener client_left;
  };

  // `loop` and `pool` must outlive the pager. Errors: io_uring setup.
  static Result<std::unique_ptr<Pager>> create(sys::EventLoop& loop, pool::Pool& pool, PagerOptions opts,
                                               Listeners listeners = {});
  ~Pager() override;
  Pager(const Pager&) = delete;
  Pager& operator=(const Pager&) = delete;

  // Reserves the region (whole, or the budget of a streamed model: ENOSPC
  // "pool exhausted" leaves nothing behind), creates the status page and
  // starts the warm-up. Errors: EINVAL for an empty file, extents past it,
  // a streamed budget below the model's floor (stream_floor_bytes), pool
  // errors, EEXIST for an id in use.
  [[nodiscard]] Result<ModelId> load(ModelSpec spec);
  // A region that already holds every byte of the file (an earlier daemon
  // filled it; the caller checked its content): the model is Resident at
  // once and nothing is read. Errors: EINVAL for a region smaller than the
  // file, status page errors.
  [[nodiscard]] Result<ModelId> adopt(ModelSpec spec, std::unique_ptr<pool::Region> region);
  // The smallest budget a streamed model of `spec`'s layout can stream with
  // (the largest layer, a row of the embeddings, the read-ahead window), in
  // bytes of whole units. Pure.
  [[nodiscard]] uint64_t stream_floor_bytes(const ModelSpec& spec) const;

  // The region file (O_RDWR: lazy clients need a writable fd to register)
  // and the status page (O_RDONLY). Owned by the pager; dup to hand out.
  // -1 for unknown models.
  [[nodiscard]] int region_fd(ModelId id) const;
  [[nodiscard]] int status_fd(ModelId id) const;
  // The model's GGUF (the fd its spec gave; read-only). -1 for unknown models.
  [[nodiscard]] int gguf_fd(ModelId id) const;
  [[nodiscard]] uint64_t region_size(ModelId id) const;
  [[nodiscard]] bool streamed(ModelId id) const;
  // A streamed mixture of experts: its clients' expert hints are taken.
  [[nodiscard]] bool takes_hints(ModelId id) const;

  // A client mapped [addr, addr+length) of the region PROT_READ MAP_SHARED,
  // MADV_DONTFORK, and registered it MISSING|MINOR on `uffd` (it keeps its
  // own copy). Takes ownership of the fds; maps every ready unit into the
  // client at once (a streamed model's on their fault instead); `notify`
  // (may be invalid) is signalled when the model is fully resident.
  // Errors: ENOENT model, EEXIST key, ESRCH client gone, EINVAL for a range
  // that is not the whole region, EBADF not a userfaultfd.
  [[nodiscard]] Status attach(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd uffd, sys::UniqueFd notify,
                              uint64_t addr, uint64_t length);
  // Forget a client (its uffd or socket is closed). No-op if unknown.
  void detach(ModelId id, ClientKey key);
  // A cooperative client (process `pid`): `requests` is one end of a
  // SOCK_SEQPACKET socket pair it made (wire/requests.hpp: what it touches
  // and waits for, and for a streamed model the units it closed as asked),
  // `opened` its sealed memfd of one bit per unit it has open
  // (wire/opened.hpp). Each wait is handled like a fault: queued urgent if
  // not read yet, the layer-ahead window moves to its rank. It goes when
  // the client closes its socket, on any error, when the process exits, or
  // on detach(key). In every mode (a client that is not trusted with a
  // writable region follows the fill this way). Errors: ENOENT model,
  // EBADF not a connected SOCK_SEQPACKET socket or not a sealed memfd of
  // the model's size, ESRCH process gone, EEXIST key.
  [[nodiscard]] Status follow(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd requests, sys::UniqueFd opened);
  // A lazy client's expert hints (wire/hints.hpp; a cooperative client
  // sends them on its request socket): `socket` is one end of a
  // SOCK_SEQPACKET socket pair the client (process `pid`) made, which it
  // only sends on. A hint (layer, experts) counts a use of each expert in
  // the expert cache and queues the reads of each one's units that are not
  // in (its three slices, one batch), ahead of the client's touch; they
  // make room only from cold units and experts no client protects, never
  // from the dense part, and the hinted experts are protected until the
  // client's next hint. A hint that is malformed or names what the model
  // does not have is ignored with a rate-limited log line. Only for a
  // streamed mixture of experts. Errors: ENOENT model, ENOTSUP a model that
  // fits or has no experts, EBADF not a connected SOCK_SEQPACKET socket,
  // ESRCH process gone, EEXIST key.
  [[nodiscard]] Status hints(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd socket);

  // Forget the model, at once for every caller: the id is unknown from the
  // return on, the status page says Unloaded, clients are woken and
  // detached, and the region is truncated (every mapping of it, in any
  // process and mode, gets SIGBUS on its next access: never zeros, never
  // stale bytes). The truncate does not wait for the model's in-flight
  // reads (docs/retire.md); the pages go back to the pool when the last of
  // them landed (Drain::Pending, then Drained::Unloaded). Errors: ENOENT; a
  // failed truncate (the rest is done anyway).
  [[nodiscard]] Result<Drain> unload(ModelId id);
  // Streamed models: a new budget in bytes (whole units; at least the
  // model's floor). Growing takes free pool pages now. Shrinking drops
  // units first (the policy's choice); the pages are free in the pool once
  // they are gone (Drain::Pending: Drained::Shrunk). Errors: ENOENT, EINVAL
  // (not streamed, below the floor), ENOSPC (not enough free pages).
  [[nodiscard]] Result<Drain> set_budget(ModelId id, uint64_t bytes);
  // The model's floor (stream_floor_bytes), 0 for a model that is not streamed.
  [[nodiscard]] uint64_t floor_bytes(ModelId id) const;
  // A cut of its budget (set_budget: Pending) is still on its way.
  [[nodiscard]] bool budget_cut_pending(ModelId id) const;

  // Replace a listener (Listeners above); an owner that goes first clears them.
  void set_state_listener(StateListener l) { listeners_.state = std::move(l); }
  void set_drain_listener(DrainListener l) { listeners_.drain = std::move(l); }
  // Pool pages that drains will give back (still counted as model pages by
  // the pool until they do): planners count them as on their way, so
  // nobody evicts twice for the same need.
  [[nodiscard]] uint64_t returning_pages() const;
  // True while an unload of `id` waits for its reads.
  [[nodiscard]] bool draining(ModelId id) const;
  // Runs the ring until every drain ended or `deadline` passed (serving
  // completions as the loop would). Blocks: for tests and tools that may
  // wait for the pages. The daemon never calls it. True when nothing drains.
  bool finish_drains(std::chrono::steady_clock::time_point deadline);

  // Ends the recording of `id` (ModelSpec::record_access) and returns the
  // units in the order clients first faulted on them. nullopt: unknown
  // model or not recording.
  [[nodiscard]] std::optional<std::vector<uint32_t>> take_access_order(ModelId id);
  // The units of `id` in the order their reads were issued since its load
  // (at most one entry per unit per fill for a model that fits). Empty for
  // an unknown model.
  [[nodiscard]] std::vector<uint32_t> read_order(ModelId id) const;

  [[nodiscard]] Result<ModelStats> stats(ModelId id) const;
  // Per load rank (a layer): its units, how many are in, how many are being
  // read now, and (streamed) being dropped. Ascending ranks.
  struct RankResidency {
    uint32_t rank = 0;
    uint32_t units = 0;
    uint32_t ready = 0;
    uint32_t in_flight = 0;
    uint32_t closing = 0;
  };
  [[nodiscard]] Result<std::vector<RankResidency>> residency(ModelId id) const;
  [[nodiscard]] std::vector<ModelId> models() const;

 private:
  struct Model;
  Pager(sys::EventLoop& loop, pool::Pool& pool, PagerOptions opts, Listeners listeners);
  Model* find(ModelId id) const;
  Model* find_any(ModelId id) const;
  Result<ModelId> install(ModelSpec spec, std::unique_ptr<pool::Region> region, bool filled);
  // The unit a streamed model is cut in: the pool's page, or for a mixture
  // of experts on shmem PagerOptions::expert_unit.
  uint64_t stream_unit(const ModelSpec& spec) const;
  UnitSteps stream_steps(const ModelSpec& spec) const;
  void fetch_expert(Model& m, ClientKey key, uint32_t expert);
  bool uses_now(const Model& m, ClientKey key, uint32_t expert) const;
  bool first_touch_of_use(Model& m, ClientKey key, uint32_t expert);
  bool pump_hinted(Model& m);
  uint32_t stream_window(const ModelSpec& spec, uint32_t budget_units) const;

  // FillListener
  void unit_read(ModelId id, uint32_t unit) override;
  void unit_read_failed(ModelId id, uint32_t unit, int err) override;
  void reaped() override;
  // TouchListener
  void touched(ModelId id, ClientKey key, uint32_t unit, Touch how, uint64_t address, Clock::time_point t0) override;
  void closed(ModelId id, ClientKey key, uint32_t unit) override;
  void client_left(ModelId id, ClientKey key) override;
  void touches_done() override { pump(); }
  std::optional<std::string> hinted(ModelId id, ClientKey key, uint32_t layer, std::span<const uint32_t> experts,
                                    bool predicted) override;

  void pump();
  void pump_fitting(Model& m, ReadClass cls, bool& progress);
  void pump_streamed(Model& m);
  bool read(Model& m, uint32_t unit, ReadClass cls);
  // Streamed: room for one more unit at `distance` (a free slot of the
  // budget, or a drop that finished at once). False when none (yet).
  bool make_room(Model& m, uint64_t distance, bool urgent);
  // Starts dropping READY unit `u`; true when its page is already gone.
  bool drop(Model& m, uint32_t u);
  void finish_drop(Model& m, uint32_t u);
  void on_close_timer();
  void arm_close_timer();
  void shrink_to_target(Model& m);
  void continue_cuts();
  void map_ready();
  void publish(Model& m);
  void check_resident(Model& m);
  void end_drains();

  sys::EventLoop& loop_;
  pool::Pool& pool_;
  PagerOptions opts_;
  std::unique_ptr<FillEngine> engine_;
  ClientService clients_;
  std::map<ModelId, std::unique_ptr<Model>> models_;
  // Unloaded models whose reads are still in flight: out of the table for
  // every caller, kept whole (region, mapping) until their drain ended.
  std::map<ModelId, std::unique_ptr<Model>> unloading_;
  ModelId next_id_ = 1;
  Listeners listeners_;
  std::optional<sys::OneShotTimer> close_timer_;
};

}  // namespace airs::pager
