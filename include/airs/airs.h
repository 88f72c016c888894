// SPDX-License-Identifier: Apache-2.0
/*
 * libairs — the client library of airs-memd.
 *
 * An inference process uses it to map a model from the daemon's pinned
 * huge-page pool (lazily: usable before it is fully resident, shared with
 * every other process using the same model) and to get paged KV-cache
 * blocks. The library does the careful part for the caller: the region is
 * registered with the process's own userfaultfd (MISSING|MINOR) before
 * anything can touch it, so no caller ever reads zero-filled weights; if the
 * daemon dies during a load, the library serves the remaining pages from
 * the GGUF file itself.
 *
 * Conventions: functions return 0 (or a count) on success and a negative
 * errno value on failure; airs_last_error() then describes it (thread-local,
 * valid until the next call on that thread). An airs_client and the objects
 * made from it are used by one thread at a time; the library runs one
 * internal thread per lazily attached model ("airs-watch") that serves the
 * fallback and unregisters once the model is resident, and, in cooperative
 * mode with wait_on_touch, one ("airs-touch") that makes units readable as
 * they are filled, plus a SIGSEGV handler (see wait_on_touch).
 */
#ifndef AIRS_AIRS_H
#define AIRS_AIRS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AIRS_API_VERSION 1

#pragma GCC visibility push(default)

typedef struct airs_client airs_client;
typedef struct airs_model airs_model;
typedef struct airs_session airs_session;

/* Text of the last error on this thread ("" if none). */
const char *airs_last_error(void);

/* Connects to the daemon. bus: NULL or "system" (honours
 * DBUS_SYSTEM_BUS_ADDRESS), "session", or a D-Bus address. */
int airs_connect(const char *bus, airs_client **out);
void airs_disconnect(airs_client *client);

/* ---- models ---- */

typedef struct {
  const char *name; /* NULL: the GGUF's general.name */
  int quiet;        /* nonzero: do not log the fallback notice to stderr */
  /* Cooperative mode only (kernels without userfaultfd): nonzero returns at
   * once and the caller calls airs_model_wait_range/_layer before touching
   * each part; zero (default) waits until the model is resident. */
  int wait_per_layer;
  /* Cooperative mode only: nonzero returns at once, like wait_per_layer, for
   * callers that cannot wait themselves (unmodified runtimes: the preload
   * library sets it). Parts not resident yet are mapped PROT_NONE; a thread
   * that touches one is held in the library's SIGSEGV handler until that
   * unit is complete (the daemon reads it next, and reads ahead from there),
   * then the unit becomes readable and the access continues. Never zeros:
   * a unit the daemon cannot read ends the process with SIGBUS; if the
   * daemon dies, the GGUF file is mapped in the region's place. The handler
   * passes every other SIGSEGV to the handler installed before it; a
   * handler the caller installs later must chain to the previous one
   * itself (the preload library keeps ours first by interposing
   * sigaction/signal). Kernel accesses (read()/write() buffers) of a part
   * not resident yet fail with EFAULT. Takes precedence over
   * wait_per_layer. Ignored in the lazy modes, where faults do the waiting. */
  int wait_on_touch;
} airs_model_options;

/* Opens the GGUF at `path` (or the caller's readable `gguf_fd`, which is
 * duplicated) through the daemon and maps the model read-only. The mapping
 * is valid until airs_model_close(). A process under mlockall(MCL_FUTURE)
 * gets no lazy mapping (locking it would fault in zero pages): it takes the
 * read-only path of the cooperative mode, which locks only filled bytes. */
int airs_model_open(airs_client *client, const char *path, const airs_model_options *opt, airs_model **out);
int airs_model_open_fd(airs_client *client, int gguf_fd, const airs_model_options *opt, airs_model **out);

/* The mapped model: byte i is byte i of the GGUF file. */
const void *airs_model_data(const airs_model *model);
uint64_t airs_model_size(const airs_model *model);      /* the GGUF's size */
const char *airs_model_object(const airs_model *model); /* D-Bus object path */

/* 1 when every page is resident, 0 otherwise. */
int airs_model_is_resident(const airs_model *model);
/* Waits until the model is resident (timeout_ms < 0: forever).
 * -ETIMEDOUT on time-out; -EFBIG at once for a model the daemon streams
 * (bigger than its share of the pool: never resident). */
int airs_model_wait_resident(airs_model *model, int timeout_ms);
/* Cooperative mode: wait until load rank `rank` (0 = header and token
 * embeddings, N+1 = blk.N, last = output) or the byte range is resident.
 * Returns at once in the lazy modes, where faults do the waiting. A model
 * the daemon streams keeps no layer resident: waiting for a layer of it is
 * -EFBIG at once; a range wait asks the daemon for its units. */
int airs_model_wait_layer(airs_model *model, uint32_t rank, int timeout_ms);
int airs_model_wait_range(airs_model *model, uint64_t offset, uint64_t len, int timeout_ms);
/* "full", "small-pages" or "cooperative". */
const char *airs_model_mode(const airs_model *model);

/* 1 if the daemon died during the load and the library serves the rest
 * (lazy modes: this process fills its faults from the GGUF file;
 * cooperative mode: the GGUF file is mapped in the region's place, same
 * address, and every wait returns). */
int airs_model_in_fallback(const airs_model *model);

/* ---- expert hints (a streamed mixture of experts) ---- */

/* 1 when the daemon takes expert hints for this model: it is a mixture of
 * experts streamed through the pool (bigger than its share of it), and this
 * process has a channel to the daemon for it. 0 otherwise. */
int airs_model_takes_hints(const airs_model *model);
/* Tells the daemon that this process is about to read experts[0..n) of
 * layer `layer` (blk.N; each an index in the layer's expert tensors,
 * distinct), before it touches them: once the router has chosen. The
 * daemon counts a use of each (its expert cache keeps the experts used
 * most) and reads those not in the pool ahead of the first touch. No round
 * trip: one one-way message on a socket the library holds for the model
 * (the request socket of the touch guard, or a hint socket of its own for
 * a lazy mapping); it never waits for the daemon and never blocks. A hint
 * that cannot be sent now (the socket is full: the daemon is behind) is
 * dropped and the call says -EAGAIN: the experts are then read on their
 * touch, as without hints. A hint is never needed for the right bytes,
 * only for fewer and earlier reads; one the daemon finds wrong (a layer or
 * expert the model does not have) is ignored there and logged, and nothing
 * reports it here. Returns 0 once sent; -ENOTSUP when the model takes no
 * hints (airs_model_takes_hints is 0, or the daemon died and the library
 * maps the file itself); -EINVAL for a NULL argument, n == 0 or n > 256.
 * May be called from any thread, one call per model at a time. */
int airs_model_hint_experts(airs_model *model, uint32_t layer, const uint32_t *experts, size_t n);
/* A guess, where airs_model_hint_experts is a promise: this process may
 * read experts[0..n) of layer `layer` later (say, its next layer's router
 * put through the current hidden state chose them). The daemon reads those
 * not in the pool ahead, once no hinted expert waits for a read, but counts
 * no use and keeps nothing for them; the process's next hint or prediction
 * replaces what is left of it unread. Same channel, returns and errors as
 * airs_model_hint_experts. */
int airs_model_predict_experts(airs_model *model, uint32_t layer, const uint32_t *experts, size_t n);

/* Drops the reference and unmaps. */
void airs_model_close(airs_model *model);

/* ---- KV sessions ---- */

typedef enum {
  AIRS_PRIORITY_INTERACTIVE = 0,
  AIRS_PRIORITY_SYSTEM = 1,
  AIRS_PRIORITY_BACKGROUND = 2
} airs_priority;

typedef struct {
  uint32_t block_bytes;
  uint32_t tokens_per_block;
  uint64_t bytes_per_token;
  uint64_t arena_bytes;
} airs_kv_geometry;

int airs_session_create(airs_client *client, airs_model *model, airs_priority priority, airs_session **out);
int airs_session_geometry(const airs_session *s, airs_kv_geometry *out);
/* The element type the daemon sized this session's blocks for (its
 * [kv] kv_type: "f16" or "q8_0"; "" from a daemon that does not say).
 * block_bytes and tokens_per_block hold for that type only: a client that
 * stores another type must not use these blocks (commit and SetLength count
 * tokens_per_block tokens per block). Valid while the session is. */
const char *airs_session_kv_type(const airs_session *s);
/* n new blocks, written to blocks_out[0..n). -ENOMEM: pool exhausted
 * (airs_last_error says how much is missing); -EDQUOT: quota. */
int airs_session_allocate(airs_session *s, uint32_t n, uint32_t *blocks_out);
/* One new block at logical index `index` of the session's block table (a
 * hole: a block evicted or freed in the middle of the sequence; or the end,
 * as airs_session_allocate(s, 1)), written to *block_out. Refill a lost
 * block in place with it: the daemon counts positions by table index for
 * SetLength and Commit, and a block allocated at the end sits at another
 * index. -EINVAL for an index past the end or one that holds a block;
 * otherwise the errors of airs_session_allocate. */
int airs_session_allocate_at(airs_session *s, uint32_t index, uint32_t *block_out);
int airs_session_free(airs_session *s, const uint32_t *blocks, size_t n);
/* Publish full blocks under their chained hashes (airs_kv_chain_hash). */
int airs_session_commit(airs_session *s, const uint32_t *blocks, const uint64_t *hashes, size_t n);
/* Longest cached prefix for hashes[0..n); returns how many blocks were
 * matched (written to blocks_out). Blocks evicted to the daemon's KV spill
 * tier match too: the daemon reads them back into fresh blocks of this
 * session before it replies, so every block returned holds its bytes. A
 * spilled entry that fails validation (torn, corrupt, another model or uid)
 * ends the match there: recompute from that block. */
int airs_session_match_prefix(airs_session *s, const uint64_t *hashes, size_t n, uint32_t *blocks_out);
/* Blocks MatchPrefix restored from the spill tier into this session so far
 * (read from the notice page: no call to the daemon). */
uint64_t airs_session_restored_blocks(const airs_session *s);
/* Copy-on-write: the block to write into instead of `block`. */
int airs_session_prepare_write(airs_session *s, uint32_t block, uint32_t *writable);
int airs_session_set_length(airs_session *s, uint32_t tokens);
/* airs_session_set_length without the round trip: one one-way message (no
 * reply awaited), which the daemon applies in order before this session's
 * later calls (a Commit after it sees the length; the Tokens property and
 * `airsctl sessions` show it as soon as it is applied). A length the daemon
 * refuses (it took blocks meanwhile: their eviction notice says so) is
 * dropped, and nothing reports it. For a decode loop's per-token length;
 * use airs_session_set_length where a refusal must be seen. Returns 0 once
 * queued for sending, or a negative errno. */
int airs_session_post_length(airs_session *s, uint32_t tokens);
/* Where block `block` lives in this process (NULL for a bad id). Touch the
 * session's blocks through this pointer only: the library measures how
 * much of the session's KV is read through its own mapping, and the daemon
 * evicts the KV read least first (libairs(3), AIRS_KV_SAMPLE_MS). */
void *airs_session_block_ptr(airs_session *s, uint32_t block);
/* A file descriptor to poll(2) for POLLIN: readable when blocks of this
 * session were evicted; then call airs_session_read_notices, which makes it
 * quiet again. POLLHUP: the daemon closed the session (or exited); POLLIN
 * then stays set too, so stop polling it and close the session. Only poll
 * it and let the library read it (it is a socket, not an eventfd). */
int airs_session_notice_fd(const airs_session *s);
/* Evicted block ids since the last call, up to cap; returns the count, or
 * -EOVERFLOW if more were evicted than the notice ring holds (treat every
 * block as lost). */
int airs_session_read_notices(airs_session *s, uint32_t *blocks_out, size_t cap);
/* The same, with spilled_out[i] = 1 if block i's bytes were kept in the
 * spill tier (matching its prefix hash again restores it; no recompute). */
int airs_session_read_notices_spilled(airs_session *s, uint32_t *blocks_out, uint8_t *spilled_out, size_t cap);
void airs_session_close(airs_session *s);

/* The chained hash of a full block: parent is the previous block's hash (0
 * for the first block). Identical on the daemon and every client. */
uint64_t airs_kv_chain_hash(uint64_t parent, const int32_t *tokens, size_t n);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* AIRS_AIRS_H */
