// SPDX-License-Identifier: Apache-2.0
// The paged KV-cache allocator (PagedAttention).
// Pure bookkeeping: the daemon owns the memory (one arena file per (model,
// uid) on the huge-page pool) and carries out what this class decides
// through ChunkOps (commit = fallocate, release = punch hole, copy = memcpy
// inside the arena mapping). No I/O, no clocks: `now` is a parameter.
//
// Model:
//  - Arena: one per (model id, uid). Holds up to max_chunks chunks of
//    geometry.chunk_bytes; block id b is at geometry.block_offset(b). Sessions
//    of one uid share an arena and may share prefix blocks; arenas never share
//    anything, so different uids never see each other's KV.
//  - Chunk: committed on demand, "owned" by the session that committed it.
//    A session takes blocks from its own chunks first, so closing or evicting
//    it empties whole chunks, which are released (whole huge pages back).
//    A live session keeps at most Config::spare_chunks_per_session empty
//    chunks of its own (so alloc/free at a chunk boundary does not thrash
//    fallocate/punch); trim() releases them, and eviction never keeps any.
//  - Block: Free (in a committed chunk), Held (refcount ≥ 1: in that many
//    block-table entries) or Cached (refcount 0 but published under a hash;
//    LRU, reused by match_prefix, dropped when memory is needed).
//  - Block table: per session, logical index → block id; kNoBlock marks a
//    hole (freed in the middle). Indices never move, trailing holes are cut.
//
// Allocation order (allocate, and prepare_write's private copy): free blocks
// in the session's own chunks → new chunks (committed through ChunkOps; on
// failure every spare chunk of every arena is released and the commit
// retried once) → other free blocks in the arena → cached prefix blocks of
// the arena, LRU first → KV of lower-priority sessions of the same arena
// (plan_allocation_eviction). Everything is checked before anything is
// evicted: on failure nothing changed and the error (ENOMEM) says how many
// bytes are missing. Evicting across arenas (other models or uids) is the
// pressure loop's job: snapshot() → policy::plan_eviction → evict().
//
// Eviction notices and reuse: every call that evicts (allocate,
// prepare_write, evict) appends an EvictionNotice per victim session to the
// caller's `notices`. The blocks are reusable as soon as the call returns —
// by that call itself in the case of allocate. The daemon therefore MUST
// publish the notices (notice page + wake socket + signal) before it replies to
// the allocating client, which cannot write into a block it has not been
// told about. (A victim that keeps writing into a block it was told it lost
// only corrupts its own uid's KV: blocks never leave their arena.)
//
// Thread: not thread-safe; the daemon calls it from its one event loop.
// Errors: EINVAL bad argument, ENOENT unknown session/arena, EPERM a block
// the session does not hold, ENOMEM pool exhausted (Error.PoolExhausted),
// EDQUOT quota (Error.QuotaExceeded), EBUSY arena in use.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "policy/policy.hpp"
#include "kv/geometry.hpp"
#include "policy/policy.hpp"
#include "util/result.hpp"

namespace airs::kv {

using Clock = policy::Clock;
using TimePoint = Clock::time_point;
using policy::Priority;

using ArenaId = uint32_t;
using SessionId = uint64_t;  // never reused; 0 is never a valid id
using BlockId = uint32_t;
inline constexpr BlockId kNoBlock = std::numeric_limits<BlockId>::max();

// The daemon's side: what to do with real memory. Implementations must not
// call back into the Allocator.
class ChunkOps {
 public:
  virtual ~ChunkOps() = default;
  // Back chunk `chunk` of arena `arena` with pool pages (bytes
  // [chunk_offset, +chunk_bytes) of the arena file). An error (pool
  // exhausted) makes the allocator try its next source.
  virtual Status commit_chunk(ArenaId arena, uint32_t chunk) = 0;
  // Give the chunk's pages back to the pool (punch hole). Cannot fail from
  // the allocator's point of view: it no longer uses the chunk.
  virtual void release_chunk(ArenaId arena, uint32_t chunk) = 0;
  // Copy one block's bytes (copy-on-write) within the arena.
  virtual void copy_block(ArenaId arena, BlockId src, BlockId dst) = 0;
  // A published block (full, carrying the prefix hash `hash`) is about to be
  // freed for memory (a cached block dropped, a session's block evicted, an
  // arena closed). The implementation may keep its bytes elsewhere (the
  // daemon's spill tier copies them out, then writes them in the
  // background); it must be done with the block's memory when it returns.
  // Returns whether the bytes were kept (the eviction notice says so).
  virtual bool spill_block(ArenaId /*arena*/, BlockId /*block*/, uint64_t /*hash*/) { return false; }
};

struct Config {
  std::chrono::nanoseconds idle_threshold = std::chrono::minutes(5);
  uint32_t max_sessions_per_uid = 64;
  uint32_t max_blocks_per_uid = std::numeric_limits<uint32_t>::max();  // blocks referenced by the uid's sessions
  uint32_t spare_chunks_per_session = 1;
  // Seeds the prefix index hash (keys come from clients); the daemon passes
  // process_hash_seed(), tests a constant.
  uint64_t hash_seed = 0;
};

// Blocks a session lost, with their logical indices in its block table.
struct EvictionNotice {
  SessionId session = 0;
  ArenaId arena = 0;
  std::vector<BlockId> blocks;
  std::vector<uint32_t> indices;
  std::vector<uint8_t> spilled;  // per block: 1 if ChunkOps::spill_block kept its bytes
  std::string reason;
};

struct KvStats {
  uint64_t committed_chunks = 0;
  uint64_t committed_bytes = 0;  // committed_chunks × chunk_bytes
  uint64_t used_bytes = 0;       // held blocks × block_bytes (shared blocks once)
  uint64_t cached_bytes = 0;     // cached, unreferenced prefix blocks
  uint64_t free_bytes = 0;       // free blocks in committed chunks (waste (b))
  uint64_t unfilled_bytes = 0;   // token slots in held blocks beyond each session's length (waste (a))
  uint64_t pack_loss_bytes = 0;  // chunk tails no block fits in
  uint32_t sessions = 0;
  uint32_t shared_blocks = 0;  // held blocks with refcount ≥ 2
  // waste = unfilled + free + pack loss; cached is reclaimable, not waste.
  [[nodiscard]] uint64_t waste_bytes() const { return unfilled_bytes + free_bytes + pack_loss_bytes; }
};

enum class BlockState : uint8_t { Uncommitted, Free, Held, Cached };

struct BlockInfo {
  BlockState state = BlockState::Uncommitted;
  uint32_t refcount = 0;
  bool published = false;
  uint64_t hash = 0;
  uint32_t chunk = 0;
};

struct SessionInfo {
  SessionId id = 0;
  ArenaId arena = 0;
  uint64_t model = 0;
  uint32_t uid = 0;
  Priority priority = Priority::Background;
  uint32_t length = 0;   // tokens
  uint32_t blocks = 0;   // non-hole table entries
  uint32_t shared = 0;   // of those, with refcount ≥ 2
  uint32_t owned_chunks = 0;
  TimePoint last_used{};
  std::optional<double> access_rate;  // rate_access's, while it is current
  std::vector<BlockId> table;
};

class Allocator {
 public:
  // `ops` must outlive the allocator.
  Allocator(ChunkOps& ops, Config config);
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // The arena of (model, uid), created on first use. A later call with a
  // different geometry or max_chunks is EINVAL (one model has one geometry).
  // Nothing is committed until a session allocates.
  [[nodiscard]] Result<ArenaId> open_arena(uint64_t model, uint32_t uid, const KvGeometry& geometry,
                                           uint32_t max_chunks);
  // Drop an arena with no sessions (model unloaded): cached blocks and spare
  // chunks are released. EBUSY while it has sessions.
  [[nodiscard]] Status close_arena(ArenaId arena);

  // A session in `arena`. EDQUOT at the uid's max_sessions+1.
  [[nodiscard]] Result<SessionId> create_session(ArenaId arena, Priority priority, TimePoint now);

  // Appends n new private blocks to the session's table and to `blocks`
  // (cleared first); evicted victims are appended to `notices` (see the
  // header comment for the ordering rule). All or nothing. EDQUOT if the
  // uid would exceed max_blocks; ENOMEM with the missing bytes otherwise.
  [[nodiscard]] Status allocate(SessionId session, uint32_t n, TimePoint now, std::vector<BlockId>& blocks,
                                std::vector<EvictionNotice>& notices);

  // One new private block at logical index `index` of the session's table:
  // a hole (a block evicted or freed in the middle) or the end. Same order,
  // errors and notice rule as allocate; EINVAL for an index past the end
  // or one that holds a block. It keeps the table's indices the client's:
  // a block allocated at the end instead would sit at another index, where
  // the length and commit checks count other positions.
  [[nodiscard]] Status allocate_at(SessionId session, uint32_t index, TimePoint now, BlockId& block,
                                   std::vector<EvictionNotice>& notices);

  // Drops the session's references on `blocks` (each must be in its table,
  // no duplicates; checked before anything changes). Published blocks whose
  // refcount reaches 0 stay cached. Their table entries become holes.
  [[nodiscard]] Status free(SessionId session, std::span<const BlockId> blocks, TimePoint now);

  // Tokens stored (≤ table entries × tokens_per_block): what is partially
  // filled for waste accounting, eviction order and commit checks.
  [[nodiscard]] Status set_length(SessionId session, uint32_t tokens, TimePoint now);

  // Marks the session used (the daemon calls it on client activity).
  [[nodiscard]] Status touch(SessionId session, TimePoint now);

  // A measurement of how much of the session's KV its client read: the
  // share of the sampled chunks touched within one round of the client's
  // access sampling (0..1). Kept as an average over time (what was measured
  // before weighs half every 2 s), counted until `now + valid_for`: eviction
  // ranks a priority level by these rates when every session in it has a
  // current one, by last use otherwise. EINVAL for a share outside 0..1.
  [[nodiscard]] Status rate_access(SessionId session, double share, TimePoint now, std::chrono::nanoseconds valid_for);

  // Publishes full blocks (every token slot below the session's length)
  // under the client's chained hashes, for other sessions of the arena.
  // A hash already published by another block leaves this block private
  // (not an error); a block already published under a different hash is
  // EINVAL. Returns how many blocks were newly published.
  [[nodiscard]] Result<uint32_t> commit(SessionId session, std::span<const BlockId> blocks,
                                        std::span<const uint64_t> hashes, TimePoint now);

  // hashes[i] is the chained hash of logical block table_size+i (normally
  // called on an empty table). Appends the longest run of published blocks
  // of this arena to the table and to `blocks` (cleared first), taking a
  // reference on each. EDQUOT if the uid's block quota would be exceeded.
  [[nodiscard]] Status match_prefix(SessionId session, std::span<const uint64_t> hashes, TimePoint now,
                                    std::vector<BlockId>& blocks);

  // Before writing into `block`: returns it if only this session references
  // it (unpublishing it — its bytes are about to change), else allocates a
  // private block (same order and errors as allocate), has ChunkOps copy the
  // bytes, replaces the table entry and drops the shared reference.
  [[nodiscard]] Result<BlockId> prepare_write(SessionId session, BlockId block, TimePoint now,
                                              std::vector<EvictionNotice>& notices);

  // Frees everything the session holds; its empty chunks are released and
  // its other chunks lose their owner; its published blocks stay cached
  // (as of `now`). The id becomes invalid.
  [[nodiscard]] Status close(SessionId session, TimePoint now);

  // For the policy: every session (blocks = held by it alone, partial =
  // those not completely filled, block_bytes of its arena) and every arena's
  // cached blocks (last_used = the oldest). total_bytes/free_bytes are the
  // committed and free-block bytes of all arenas.
  [[nodiscard]] policy::PoolState snapshot(TimePoint now) const;

  // Executes one policy action: DropCached (id = arena, LRU first) or
  // EvictBlocks (id = session, from the table's tail, blocks shared with
  // other sessions skipped: evicting them frees nothing). Published blocks
  // are unpublished, chunks that become empty released. EINVAL for
  // EvictModel. Returns the blocks freed.
  [[nodiscard]] Result<uint32_t> evict(const policy::Action& action, TimePoint now,
                                       std::vector<EvictionNotice>& notices);

  // Publishes blocks the session holds under `hashes` without the length
  // check of commit: for blocks whose bytes the daemon restored from the
  // spill tier (they were full when they were spilled). Same duplicate and
  // already-published rules as commit. Returns how many were newly published.
  [[nodiscard]] Result<uint32_t> publish_restored(SessionId session, std::span<const BlockId> blocks,
                                                  std::span<const uint64_t> hashes);

  // Every published block of the arena (held or cached) with its hash, for
  // spilling what is still in memory at a clean stop.
  [[nodiscard]] std::vector<std::pair<BlockId, uint64_t>> published(ArenaId arena) const;

  // Releases every empty chunk kept as a session's spare. Returns how many.
  uint32_t trim();

  [[nodiscard]] Result<KvStats> arena_stats(ArenaId arena) const;
  [[nodiscard]] KvStats total_stats() const;
  // Committed chunk bytes of all of `uid`'s arenas: the one count of what a
  // uid's KV holds of the pool (its pool share is checked against it). A
  // chunk counts once ChunkOps::commit_chunk accepted it, and no longer
  // once release_chunk is called for it.
  [[nodiscard]] uint64_t committed_bytes_of_uid(uint32_t uid) const;
  [[nodiscard]] Result<SessionInfo> session_info(SessionId session) const;
  [[nodiscard]] std::vector<SessionId> sessions() const;
  [[nodiscard]] Result<BlockInfo> block_info(ArenaId arena, BlockId block) const;
  [[nodiscard]] Result<KvGeometry> arena_geometry(ArenaId arena) const;
  [[nodiscard]] size_t arena_count() const;

  // Checks every internal structure against the others (free lists, LRU,
  // prefix index, refcounts vs tables, ownership, counters). O(everything):
  // for tests and a debug command, not for the hot path.
  [[nodiscard]] Status audit() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace airs::kv
