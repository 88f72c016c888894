// SPDX-License-Identifier: Apache-2.0
// Cooperative mode for callers that never call airs_model_wait_layer (an
// unmodified runtime through libairs-preload.so, or a libairs caller that
// sets airs_model_options.wait_on_touch): the region is mapped PROT_NONE and
// a unit becomes PROT_READ only once the daemon's status page says its bytes
// are complete. A thread that touches a unit that is not readable yet takes
// SIGSEGV (SEGV_ACCERR) in our handler, which
//   1. sends the unit number on the model's request socket (Model.Follow: the
//      daemon reads that unit next and moves its layer-ahead window there),
//   2. futex-waits on the status page until the unit is ready (or the model
//      failed: then the process gets SIGBUS, never zeros); a streamed
//      model's unit is asked for again at each change of the page while it
//      is not ready (it may be read and dropped before this thread opens it),
//   3. mprotects the unit PROT_READ and returns; the access is retried.
// A watcher thread (the caller's) makes units readable as they become ready
// (open_ready), so a reader that stays behind the fill takes no signal at
// all. If the daemon dies mid-load the handler maps the GGUF file over the
// whole range (MAP_FIXED, PROT_READ): the file's bytes, never zeros. A forked child inherits the
// mapping, the handler and the socket, so its touches are served the same way.
//
// A streamed model (bigger than its budget of the pool) drops units again.
// There each open and close follows wire/opened.hpp: the handler marks the
// unit in the open-unit bits the daemon reads, checks READY, and only then
// opens it (and tells the daemon, Opened: where this client is); the watcher
// closes a unit when the daemon asks (Close: PROT_NONE, clear the mark,
// answer Closed). A unit's open and close take one per-unit lock, so no
// close slips between an open's check and its mprotect. The watcher opens
// nothing ahead for a streamed model: each touch must be seen.
//
// Everything the handler does is async-signal-safe: atomics on a fixed slot
// table, send(2), write(2), futex(2), poll(2) on a pidfd, mprotect(2), mmap(2).
// Faults outside our ranges (and anything not SEGV_ACCERR inside none) are
// passed to the handler that was installed before ours, or to the one a
// runtime installs after ours through airs_preload_sigaction (the preload's
// sigaction/signal interposer), so ours stays first.
#pragma once

#include <signal.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "wire/status_page.hpp"
#include "util/result.hpp"

namespace airs::client {

struct TouchGuardSpec {
  void* base = nullptr;   // the PROT_NONE mapping of the region (caller owns it)
  uint64_t size = 0;      // its length: unit_count × unit_size
  wire::StatusPageView status;  // must stay mapped while the guard lives
  int request_fd = -1;    // our end of the Follow socket (SOCK_SEQPACKET), or -1
  int daemon_pidfd = -1;  // to notice the daemon's death, or -1
  int gguf_fd = -1;       // the model file, mapped in place if the daemon dies
  // The region's fd, or -1: on Unloaded a touch is let through (to take
  // the truncated region's SIGBUS) only once the region is truncated.
  int region_fd = -1;
  int trace_fd = -1;      // one line per handled touch (tests), or -1
  // A streamed model: the writable mapping of the open-unit bits this
  // client handed the daemon (wire/opened.hpp), one bit per unit.
  void* opened = nullptr;
};

class TouchGuard {
 public:
  // Takes a slot (at most kSlots guards per process) and installs the
  // SIGSEGV handler (once per process). Errors: ENOSPC slots, EINVAL spec,
  // sigaction errors.
  static Result<std::unique_ptr<TouchGuard>> create(const TouchGuardSpec& spec);
  // Frees the slot once no handler uses it (a handler waiting for a unit of
  // it gives up within one wait slice). The mapping is the caller's.
  ~TouchGuard();
  TouchGuard(const TouchGuard&) = delete;
  TouchGuard& operator=(const TouchGuard&) = delete;

  // Makes every unit the status page says is ready PROT_READ (one mprotect
  // per run of newly ready units). True once every unit is. Thread: one
  // caller (the watcher), concurrent with handlers.
  bool open_ready();
  // Streamed models: the daemon asked to close `unit` (PROT_NONE again,
  // its open mark cleared). Thread: the watcher, concurrent with handlers.
  void close_unit(uint32_t unit);
  // Access sampling (client/sampler.hpp): closes `unit` as the daemon's ask
  // would, if this process has it open, so its next touch opens it again
  // and tells the daemon. The daemon takes a Closed it did not ask for as
  // nothing. True if it was open. Thread: the watcher.
  bool sample_unit(uint32_t unit);
  [[nodiscard]] bool streamed() const { return streamed_; }
  // Asks the daemon to read `unit` now (Wait on the request socket, as a
  // touch does): for a caller about to wait for bytes it has not touched.
  // Never blocks; a full socket loses the request. Thread: any.
  void request(uint32_t unit) const;
  // Maps the GGUF file in place now (the daemon is out of reach), unless
  // that happened already. Thread: the watcher.
  void take_over_now();
  // The handler mapped the GGUF file in place (the daemon died).
  [[nodiscard]] bool taken_over() const;
  // Touches handled so far (SIGSEGVs on our ranges, in this process).
  [[nodiscard]] uint64_t touches() const;

  static constexpr size_t kSlots = 16;
  // How long one futex wait of the handler lasts before it looks at the
  // daemon's pidfd and at its slot again.
  static constexpr int64_t kSliceNs = 50'000'000;

 private:
  TouchGuard() = default;
  size_t slot_ = 0;
  wire::StatusPageView status_;
  uintptr_t base_ = 0;
  uint64_t unit_ = 0;
  std::vector<bool> opened_;
  bool all_open_ = false;
  bool streamed_ = false;
};

}  // namespace airs::client

// For libairs-preload.so only (not part of the API): what sigaction(2)
// should do for `sig` while touch guards may exist. Returns 1 if the caller
// must run the real sigaction itself (not SIGSEGV, or no guard installed
// yet), else 0 or -1 (errno set) as sigaction would: the new action is
// recorded as the one our handler chains to, `oldact` receives the one
// recorded before, and our handler stays installed.
extern "C" __attribute__((visibility("default"))) int airs_preload_sigaction(int sig, const struct sigaction* act,
                                                                             struct sigaction* oldact);
