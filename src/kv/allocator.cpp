// SPDX-License-Identifier: Apache-2.0
#include "kv/allocator.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "util/hash.hpp"
#include "util/units.hpp"

namespace airs::kv {
namespace {

constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();

struct Block {
  uint64_t hash = 0;
  SessionId hint_sid = 0;  // the only holder while refcount == 1
  uint32_t hint_idx = 0;   // its logical index there
  uint32_t refcount = 0;
  uint32_t prev = kNil;  // LRU list (cached)
  uint32_t next = kNil;  // chunk free list (free) or LRU list (cached)
  uint32_t mark = 0;     // duplicate detection within one call
  BlockState state = BlockState::Uncommitted;
  bool published = false;
  TimePoint cached_at{};
};

struct Chunk {
  uint32_t used = 0;  // held + cached blocks
  uint32_t free_head = kNil;
  uint32_t free_count = 0;
  SessionId owner = 0;  // the live session that committed it, 0 = none
  uint32_t own_prev = kNil, own_next = kNil;  // owner's chunks with free blocks
  uint32_t ar_prev = kNil, ar_next = kNil;    // arena's chunks with free blocks
  bool committed = false;
  bool spare = false;    // empty, kept for its live owner
  bool pending = false;  // in Arena::pending
};

struct Holder {
  SessionId sid;
  uint32_t idx;
};

struct UidRec {
  uint32_t sessions = 0;
  uint64_t blocks = 0;  // held blocks of all arenas of the uid
};

// Client-chosen hashes as keys: seeded so a client cannot aim them at one
// bucket.
struct SeededU64Hash {
  uint64_t seed = 0;
  size_t operator()(uint64_t k) const noexcept { return static_cast<size_t>(hash_bytes(&k, sizeof k, seed)); }
};

struct ArenaRec {
  bool live = false;
  uint64_t model = 0;
  uint32_t uid = 0;
  KvGeometry g;
  uint32_t max_chunks = 0;
  std::vector<Chunk> chunks;  // max_chunks entries
  std::vector<Block> blocks;  // grows with high_water × blocks_per_chunk
  uint32_t high_water = 0;    // chunks [0, high_water) have been committed at least once
  std::vector<uint32_t> released;  // uncommitted chunks below high_water
  uint32_t committed = 0, free_blocks = 0, held = 0, cached = 0;
  uint32_t free_chunks_head = kNil;  // arena list
  uint32_t lru_head = kNil, lru_tail = kNil;  // oldest first
  std::unordered_map<uint64_t, BlockId, SeededU64Hash> index;
  std::unordered_map<BlockId, std::vector<Holder>> holders;  // refcount ≥ 2 only
  std::vector<uint32_t> sessions;  // slots
  std::vector<uint32_t> pending;   // chunks that became empty during the current call
  UidRec* uid_rec = nullptr;

  explicit ArenaRec(uint64_t seed) : index(16, SeededU64Hash{seed}) {}
};

struct SessionRec {
  SessionId id = 0;
  uint32_t gen = 0;
  bool live = false;
  ArenaId arena = 0;
  Priority prio = Priority::Background;
  TimePoint last_used{};
  // Measured accesses (rate_access): an average that decays with time, when
  // it was last measured, and until when it counts (a client that stopped
  // reporting is no longer measured).
  double access_rate = 0;
  TimePoint rated_at{};
  TimePoint rated_until{};
  bool rated = false;
  uint32_t length = 0;
  uint32_t entries = 0;
  uint32_t own_free_head = kNil;
  uint32_t spare = 0;
  uint32_t arena_pos = 0;
  std::vector<BlockId> table;
  std::vector<uint32_t> owned;
};

// What a measurement of the past weighs, halved after each of these.
constexpr std::chrono::duration<double> kAccessHalfLife = std::chrono::seconds(2);

// The session's measured access rate while it is current.
std::optional<double> rate_of(const SessionRec& s, TimePoint now) {
  if (!s.rated || now >= s.rated_until) return std::nullopt;
  return s.access_rate;
}

}  // namespace

struct Allocator::Impl {
  ChunkOps& ops;
  Config cfg;
  std::vector<std::unique_ptr<ArenaRec>> arenas;
  std::map<std::pair<uint64_t, uint32_t>, ArenaId> arena_by_key;
  std::vector<SessionRec> sessions;
  std::vector<uint32_t> free_slots;
  std::unordered_map<uint32_t, std::unique_ptr<UidRec>> uids;
  uint32_t epoch = 0;
  std::string last_commit_error;
  std::vector<BlockId> scratch_blocks;
  std::vector<uint32_t> scratch_idx;

  Impl(ChunkOps& o, Config c) : ops(o), cfg(c) {}

  // ---- lookups --------------------------------------------------------
  SessionRec* find_session(SessionId id) {
    const uint64_t slot = id & 0xffffffffu;
    if (id == 0 || slot >= sessions.size()) return nullptr;
    SessionRec& s = sessions[slot];
    return s.live && s.id == id ? &s : nullptr;
  }
  const SessionRec* find_session(SessionId id) const { return const_cast<Impl*>(this)->find_session(id); }
  ArenaRec* find_arena(ArenaId id) {
    return id < arenas.size() && arenas[id]->live ? arenas[id].get() : nullptr;
  }
  const ArenaRec* find_arena(ArenaId id) const { return const_cast<Impl*>(this)->find_arena(id); }

  static Error no_session(SessionId id) {
    return make_error(ENOENT, "KV session {}: no such session (closed, evicted with its client, or never created)", id);
  }

  // ---- chunk lists ----------------------------------------------------
  void own_link(ArenaRec& a, SessionRec& s, uint32_t c) {
    Chunk& ch = a.chunks[c];
    ch.own_prev = kNil;
    ch.own_next = s.own_free_head;
    if (s.own_free_head != kNil) a.chunks[s.own_free_head].own_prev = c;
    s.own_free_head = c;
  }
  void own_unlink(ArenaRec& a, SessionRec& s, uint32_t c) {
    Chunk& ch = a.chunks[c];
    if (ch.own_prev != kNil) a.chunks[ch.own_prev].own_next = ch.own_next;
    else s.own_free_head = ch.own_next;
    if (ch.own_next != kNil) a.chunks[ch.own_next].own_prev = ch.own_prev;
    ch.own_prev = ch.own_next = kNil;
  }
  static void arena_link(ArenaRec& a, uint32_t c) {
    Chunk& ch = a.chunks[c];
    ch.ar_prev = kNil;
    ch.ar_next = a.free_chunks_head;
    if (a.free_chunks_head != kNil) a.chunks[a.free_chunks_head].ar_prev = c;
    a.free_chunks_head = c;
  }
  static void arena_unlink(ArenaRec& a, uint32_t c) {
    Chunk& ch = a.chunks[c];
    if (ch.ar_prev != kNil) a.chunks[ch.ar_prev].ar_next = ch.ar_next;
    else a.free_chunks_head = ch.ar_next;
    if (ch.ar_next != kNil) a.chunks[ch.ar_next].ar_prev = ch.ar_prev;
    ch.ar_prev = ch.ar_next = kNil;
  }

  // ---- free blocks ----------------------------------------------------
  BlockId take_free(ArenaRec& a, uint32_t c) {
    Chunk& ch = a.chunks[c];
    const BlockId b = ch.free_head;
    ch.free_head = a.blocks[b].next;
    a.blocks[b].next = kNil;
    --ch.free_count;
    ++ch.used;
    --a.free_blocks;
    if (ch.spare) {
      ch.spare = false;
      if (SessionRec* o = find_session(ch.owner)) --o->spare;
    }
    if (ch.free_count == 0) {
      if (SessionRec* o = find_session(ch.owner)) own_unlink(a, *o, c);
      arena_unlink(a, c);
    }
    return b;
  }

  void put_free(ArenaRec& a, BlockId b) {
    Block& bl = a.blocks[b];
    const uint32_t c = a.g.chunk_of(b);
    Chunk& ch = a.chunks[c];
    bl.state = BlockState::Free;
    bl.refcount = 0;
    bl.published = false;
    bl.hash = 0;
    bl.prev = kNil;
    bl.next = ch.free_head;
    ch.free_head = b;
    ++ch.free_count;
    --ch.used;
    ++a.free_blocks;
    if (ch.free_count == 1) {
      if (SessionRec* o = find_session(ch.owner)) own_link(a, *o, c);
      arena_link(a, c);
    }
    if (ch.used == 0 && !ch.pending) {
      ch.pending = true;
      a.pending.push_back(c);
    }
  }

  // ---- LRU of cached blocks ---------------------------------------------
  static void lru_push(ArenaRec& a, BlockId b) {
    Block& bl = a.blocks[b];
    bl.prev = a.lru_tail;
    bl.next = kNil;
    if (a.lru_tail != kNil) a.blocks[a.lru_tail].next = b;
    else a.lru_head = b;
    a.lru_tail = b;
  }
  static void lru_unlink(ArenaRec& a, BlockId b) {
    Block& bl = a.blocks[b];
    if (bl.prev != kNil) a.blocks[bl.prev].next = bl.next;
    else a.lru_head = bl.next;
    if (bl.next != kNil) a.blocks[bl.next].prev = bl.prev;
    else a.lru_tail = bl.prev;
    bl.prev = bl.next = kNil;
  }

  // Publishes each block under its hash unless it is published already or
  // another block carries the hash (then it stays private). Returns how many.
  static uint32_t publish_all(ArenaRec& a, std::span<const BlockId> list, std::span<const uint64_t> hashes) {
    uint32_t published = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      Block& bl = a.blocks[list[i]];
      if (bl.published) continue;
      const auto [it, inserted] = a.index.try_emplace(hashes[i], list[i]);
      if (!inserted) continue;  // another block already carries this prefix
      bl.published = true;
      bl.hash = hashes[i];
      ++published;
    }
    return published;
  }

  static void unpublish(ArenaRec& a, BlockId b) {
    Block& bl = a.blocks[b];
    if (!bl.published) return;
    a.index.erase(bl.hash);
    bl.published = false;
    bl.hash = 0;
  }

  void drop_cached_lru(ArenaId aid, ArenaRec& a) {
    const BlockId b = a.lru_head;
    (void)ops.spill_block(aid, b, a.blocks[b].hash);
    lru_unlink(a, b);
    --a.cached;
    unpublish(a, b);
    put_free(a, b);
  }

  // ---- references -----------------------------------------------------
  void hold_new(ArenaRec& a, BlockId b, SessionId sid, uint32_t idx) {
    Block& bl = a.blocks[b];
    bl.state = BlockState::Held;
    bl.refcount = 1;
    bl.hint_sid = sid;
    bl.hint_idx = idx;
    ++a.held;
    ++a.uid_rec->blocks;
  }

  void add_ref(ArenaRec& a, BlockId b, SessionId sid, uint32_t idx) {
    Block& bl = a.blocks[b];
    if (bl.state == BlockState::Cached) {
      lru_unlink(a, b);
      --a.cached;
      bl.state = BlockState::Held;
      bl.refcount = 1;
      bl.hint_sid = sid;
      bl.hint_idx = idx;
      ++a.held;
      ++a.uid_rec->blocks;
      return;
    }
    if (bl.refcount == 1) {
      a.holders[b] = {Holder{bl.hint_sid, bl.hint_idx}, Holder{sid, idx}};
    } else {
      a.holders[b].push_back(Holder{sid, idx});
    }
    ++bl.refcount;
  }

  // Logical index of b in sid's table, or kNil if sid does not hold it.
  uint32_t find_ref(const ArenaRec& a, BlockId b, SessionId sid) const {
    if (b >= a.blocks.size()) return kNil;
    const Block& bl = a.blocks[b];
    if (bl.state != BlockState::Held) return kNil;
    if (bl.refcount == 1) return bl.hint_sid == sid ? bl.hint_idx : kNil;
    const auto it = a.holders.find(b);
    for (const Holder& h : it->second) {
      if (h.sid == sid) return h.idx;
    }
    return kNil;
  }

  // Drops sid's reference. At refcount 0 a published block is cached unless
  // `evicting` (then it is freed: eviction is for memory).
  void drop_ref(ArenaRec& a, BlockId b, SessionId sid, bool evicting, TimePoint now) {
    Block& bl = a.blocks[b];
    if (bl.refcount == 1) {
      --a.held;
      --a.uid_rec->blocks;
      if (bl.published && !evicting) {
        bl.refcount = 0;
        bl.state = BlockState::Cached;
        bl.cached_at = now;
        lru_push(a, b);
        ++a.cached;
      } else {
        unpublish(a, b);
        put_free(a, b);
      }
      return;
    }
    auto it = a.holders.find(b);
    auto& hv = it->second;
    for (size_t i = 0; i < hv.size(); ++i) {
      if (hv[i].sid == sid) {
        hv[i] = hv.back();
        hv.pop_back();
        break;
      }
    }
    --bl.refcount;
    if (bl.refcount == 1) {
      bl.hint_sid = hv.front().sid;
      bl.hint_idx = hv.front().idx;
      a.holders.erase(it);
    }
  }

  // ---- chunks ---------------------------------------------------------
  void release_chunk(ArenaId aid, ArenaRec& a, uint32_t c) {
    Chunk& ch = a.chunks[c];
    const uint32_t bpc = a.g.blocks_per_chunk;
    for (uint32_t i = 0; i < bpc; ++i) {
      Block& bl = a.blocks[c * bpc + i];
      bl = Block{};
    }
    if (SessionRec* o = find_session(ch.owner)) {
      if (ch.free_count > 0) own_unlink(a, *o, c);
      if (ch.spare) --o->spare;
      auto pos = std::find(o->owned.begin(), o->owned.end(), c);
      if (pos != o->owned.end()) o->owned.erase(pos);
    }
    if (ch.free_count > 0) arena_unlink(a, c);
    a.free_blocks -= ch.free_count;
    --a.committed;
    ch = Chunk{};
    a.released.push_back(c);
    ops.release_chunk(aid, c);
  }

  // Releases or keeps (as the owner's spare) the chunks that became empty
  // during this call.
  void settle(ArenaId aid, ArenaRec& a, bool keep_spares) {
    for (const uint32_t c : a.pending) {
      Chunk& ch = a.chunks[c];
      ch.pending = false;
      if (!ch.committed || ch.used != 0 || ch.spare) continue;
      SessionRec* o = find_session(ch.owner);
      if (keep_spares && o != nullptr && o->spare < cfg.spare_chunks_per_session) {
        ch.spare = true;
        ++o->spare;
        continue;
      }
      release_chunk(aid, a, c);
    }
    a.pending.clear();
  }

  uint32_t trim_all() {
    uint32_t n = 0;
    for (ArenaId aid = 0; aid < arenas.size(); ++aid) {
      ArenaRec& a = *arenas[aid];
      if (!a.live) continue;
      for (uint32_t c = 0; c < a.high_water; ++c) {
        if (a.chunks[c].committed && a.chunks[c].spare) {
          release_chunk(aid, a, c);
          ++n;
        }
      }
    }
    return n;
  }

  // Commits a chunk for s; kNil if the arena is full or the pool refuses.
  uint32_t commit_new(ArenaId aid, ArenaRec& a, SessionRec& s) {
    auto next = [&a] {
      if (!a.released.empty()) return a.released.back();
      return a.high_water < a.max_chunks ? a.high_water : kNil;
    };
    uint32_t c = next();
    if (c == kNil) return kNil;
    Status st = ops.commit_chunk(aid, c);
    if (!st.ok() && trim_all() > 0) {
      // Spares elsewhere may have been the pages we need. Trimming may have
      // released chunks of this arena too, so choose again.
      c = next();
      st = ops.commit_chunk(aid, c);
    }
    if (!st.ok()) {
      last_commit_error = st.error().message;
      return kNil;
    }
    if (!a.released.empty()) a.released.pop_back();
    else ++a.high_water;
    const uint32_t bpc = a.g.blocks_per_chunk;
    if (a.blocks.size() < size_t{a.high_water} * bpc) a.blocks.resize(size_t{a.high_water} * bpc);
    Chunk& ch = a.chunks[c];
    ch = Chunk{};
    ch.committed = true;
    ch.owner = s.id;
    // Ascending order, so a session's blocks are contiguous in the arena.
    for (uint32_t i = bpc; i-- > 0;) {
      const BlockId b = c * bpc + i;
      a.blocks[b] = Block{};
      a.blocks[b].state = BlockState::Free;
      a.blocks[b].next = ch.free_head;
      ch.free_head = b;
    }
    ch.free_count = bpc;
    a.free_blocks += bpc;
    ++a.committed;
    s.owned.push_back(c);
    own_link(a, s, c);
    arena_link(a, c);
    return c;
  }

  // ---- eviction -------------------------------------------------------
  // Blocks eviction could take from s (held by it alone) and how many of
  // those are not completely filled.
  std::pair<uint32_t, uint32_t> evictable(const ArenaRec& a, const SessionRec& s) const {
    uint32_t blocks = 0, partial = 0;
    const uint64_t tpb = a.g.tokens_per_block;
    for (uint32_t i = 0; i < s.table.size(); ++i) {
      const BlockId b = s.table[i];
      if (b == kNoBlock || a.blocks[b].refcount != 1) continue;
      ++blocks;
      if ((uint64_t{i} + 1) * tpb > s.length) ++partial;
    }
    return {blocks, partial};
  }

  static void trim_table(const ArenaRec& a, SessionRec& s) {
    while (!s.table.empty() && s.table.back() == kNoBlock) s.table.pop_back();
    const uint64_t cap = uint64_t{s.table.size()} * a.g.tokens_per_block;
    if (s.length > cap) s.length = static_cast<uint32_t>(cap);
  }

  uint32_t evict_session_blocks(ArenaRec& a, SessionRec& s, uint32_t n, const std::string& reason, TimePoint now,
                                std::vector<EvictionNotice>& notices) {
    EvictionNotice notice;
    notice.session = s.id;
    notice.arena = s.arena;
    notice.reason = reason;
    uint32_t taken = 0;
    for (size_t i = s.table.size(); i-- > 0 && taken < n;) {
      const BlockId b = s.table[i];
      if (b == kNoBlock || a.blocks[b].refcount != 1) continue;  // shared: evicting frees nothing
      const bool spilled = a.blocks[b].published && ops.spill_block(s.arena, b, a.blocks[b].hash);
      drop_ref(a, b, s.id, /*evicting=*/true, now);
      notice.spilled.push_back(spilled ? 1 : 0);
      s.table[i] = kNoBlock;
      --s.entries;
      notice.blocks.push_back(b);
      notice.indices.push_back(static_cast<uint32_t>(i));
      ++taken;
    }
    trim_table(a, s);
    if (taken > 0) notices.push_back(std::move(notice));
    return taken;
  }

  // Gets n free blocks for s into `out` (appended), in the documented order.
  // On failure nothing is taken (spare chunks may have been released).
  Status obtain(ArenaId aid, ArenaRec& a, SessionRec& s, uint32_t n, TimePoint now, std::vector<BlockId>& out,
                std::vector<EvictionNotice>& notices, bool& evicted) {
    const size_t start = out.size();
    uint32_t got = 0;
    while (got < n && s.own_free_head != kNil) {
      out.push_back(take_free(a, s.own_free_head));
      ++got;
    }
    last_commit_error.clear();
    while (got < n) {
      const uint32_t c = commit_new(aid, a, s);
      if (c == kNil) break;
      while (got < n && a.chunks[c].free_count > 0) {
        out.push_back(take_free(a, c));
        ++got;
      }
    }
    while (got < n && a.free_chunks_head != kNil) {
      out.push_back(take_free(a, a.free_chunks_head));
      ++got;
    }
    if (got == n) return {};

    const uint32_t need = n - got;
    const uint32_t from_cache = std::min(a.cached, need);
    // KV of the levels this session outranks: the daemon's one eviction
    // order (policy::plan_eviction), restricted to this arena.
    policy::Plan plan;
    uint32_t planned = 0;
    if (from_cache < need) {
      policy::PoolState st;
      st.sessions.reserve(a.sessions.size());
      for (const uint32_t slot : a.sessions) {
        const SessionRec& v = sessions[slot];
        const auto [blocks, partial] = evictable(a, v);
        st.sessions.push_back(
            policy::SessionState{v.id, v.prio, blocks, partial, a.g.block_bytes, v.last_used, rate_of(v, now)});
      }
      auto req = policy::Request::for_kv_allocation(s.prio, s.id, uint64_t{need - from_cache} * a.g.block_bytes);
      req.include_cached = false;  // taken above, per arena
      req.include_models = false;  // across the pool: the daemon's job
      policy::Config pc;
      pc.idle_threshold = cfg.idle_threshold;
      plan = policy::plan_eviction(st, req, now, pc);
      for (const policy::Action& act : plan.actions) planned += act.blocks;
    }
    if (from_cache + planned < need) {
      for (size_t i = start; i < out.size(); ++i) {
        put_free(a, out[i]);
      }
      out.resize(start);
      settle(aid, a, /*keep_spares=*/false);
      const uint32_t missing = need - from_cache - planned;
      std::string why = plan.shortfall;
      if (a.committed >= a.max_chunks) {
        why += fmt::format("; arena full ({} chunks of {})", a.max_chunks, format_bytes(a.g.chunk_bytes));
      } else if (!last_commit_error.empty()) {
        why += fmt::format("; pool: {}", last_commit_error);
      }
      return make_error(ENOMEM,
                        "KV session {} (uid {}, model {}): pool exhausted: {} blocks requested, {} missing ({} of {} "
                        "blocks); {}. Free or close sessions, or shorten the context",
                        s.id, a.uid, a.model, n, missing, format_bytes(uint64_t{missing} * a.g.block_bytes),
                        format_bytes(a.g.block_bytes), why);
    }
    for (uint32_t i = 0; i < from_cache; ++i) drop_cached_lru(aid, a);
    for (const policy::Action& act : plan.actions) {
      SessionRec* v = find_session(act.id);
      evict_session_blocks(a, *v, act.blocks, act.reason, now, notices);
      evicted = true;
    }
    while (got < n && a.free_chunks_head != kNil) {
      out.push_back(take_free(a, a.free_chunks_head));
      ++got;
    }
    return {};
  }

  Status check_quota(const ArenaRec& a, uint64_t more) const {
    if (a.uid_rec->blocks + more > cfg.max_blocks_per_uid) {
      return make_error(EDQUOT,
                        "uid {}: KV block quota exceeded: holds {} blocks, asks for {} more, max_blocks_per_uid = {}; "
                        "free blocks or close sessions",
                        a.uid, a.uid_rec->blocks, more, cfg.max_blocks_per_uid);
    }
    return {};
  }

  // ---- audit (Allocator::audit), one arena at a time ------------------
  // Expected holders of each block, from the sessions' tables.
  using HeldBy = std::unordered_map<BlockId, std::vector<Holder>>;
  // What the committed chunks hold, against the arena's counters.
  struct AuditCounts {
    uint32_t committed = 0;
    uint32_t free_blocks = 0;
    uint32_t held = 0;
    uint32_t cached = 0;
    uint32_t chunks_with_free = 0;  // the length the arena's free list must have
  };
  Status audit_session(ArenaId aid, uint32_t slot, HeldBy& held_by) const;
  Status audit_chunk(ArenaId aid, uint32_t c, const HeldBy& held_by, AuditCounts& n) const;
  Status audit_block(ArenaId aid, BlockId b, const HeldBy& held_by, AuditCounts& n) const;
  Status audit_holders(ArenaId aid, BlockId b, const std::vector<Holder>& expected) const;
  Status audit_lists(ArenaId aid, const AuditCounts& n) const;
};

// ---- public API -----------------------------------------------------------

Allocator::Allocator(ChunkOps& ops, Config config) : impl_(std::make_unique<Impl>(ops, config)) {}
Allocator::~Allocator() = default;

Result<ArenaId> Allocator::open_arena(uint64_t model, uint32_t uid, const KvGeometry& g, uint32_t max_chunks) {
  Impl& m = *impl_;
  const auto key = std::make_pair(model, uid);
  if (auto it = m.arena_by_key.find(key); it != m.arena_by_key.end()) {
    const ArenaRec& a = *m.arenas[it->second];
    if (!(a.g == g) || a.max_chunks != max_chunks) {
      return make_error(EINVAL, "KV arena of model {} for uid {} exists with another geometry or size", model, uid);
    }
    return it->second;
  }
  if (g.block_bytes == 0 || g.blocks_per_chunk == 0 || g.chunk_bytes < uint64_t{g.blocks_per_chunk} * g.block_bytes ||
      g.tokens_per_block == 0 || g.bytes_per_token * g.tokens_per_block != g.block_bytes) {
    return make_error(EINVAL, "KV arena of model {}: inconsistent geometry; build it with make_geometry()", model);
  }
  if (max_chunks == 0 || uint64_t{max_chunks} * g.blocks_per_chunk >= kNoBlock) {
    return make_error(EINVAL, "KV arena of model {}: max_chunks {} × {} blocks per chunk must be in [1, 2^32-1)",
                      model, max_chunks, g.blocks_per_chunk);
  }
  auto a = std::make_unique<ArenaRec>(m.cfg.hash_seed);
  a->live = true;
  a->model = model;
  a->uid = uid;
  a->g = g;
  a->max_chunks = max_chunks;
  a->chunks.resize(max_chunks);
  auto& u = m.uids[uid];
  if (!u) u = std::make_unique<UidRec>();
  a->uid_rec = u.get();
  const auto id = static_cast<ArenaId>(m.arenas.size());
  m.arenas.push_back(std::move(a));
  m.arena_by_key.emplace(key, id);
  return id;
}

Status Allocator::close_arena(ArenaId aid) {
  Impl& m = *impl_;
  ArenaRec* a = m.find_arena(aid);
  if (a == nullptr) return make_error(ENOENT, "KV arena {}: no such arena", aid);
  if (!a->sessions.empty()) {
    return make_error(EBUSY, "KV arena {} (model {}, uid {}): {} sessions still open; close them first", aid, a->model,
                      a->uid, a->sessions.size());
  }
  while (a->lru_head != kNil) m.drop_cached_lru(aid, *a);
  m.settle(aid, *a, false);
  for (uint32_t c = 0; c < a->high_water; ++c) {
    if (a->chunks[c].committed) m.release_chunk(aid, *a, c);
  }
  a->live = false;
  m.arena_by_key.erase(std::make_pair(a->model, a->uid));
  a->chunks = {};
  a->blocks = {};
  a->index.clear();
  return {};
}

Result<SessionId> Allocator::create_session(ArenaId aid, Priority priority, TimePoint now) {
  Impl& m = *impl_;
  ArenaRec* a = m.find_arena(aid);
  if (a == nullptr) return make_error(ENOENT, "KV arena {}: no such arena", aid);
  if (priority != Priority::Interactive && priority != Priority::System && priority != Priority::Background) {
    return make_error(EINVAL, "KV session: unknown priority {}", static_cast<int>(priority));
  }
  if (a->uid_rec->sessions >= m.cfg.max_sessions_per_uid) {
    return make_error(EDQUOT, "uid {}: KV session quota exceeded: {} sessions open, max_sessions_per_uid = {}; close one",
                      a->uid, a->uid_rec->sessions, m.cfg.max_sessions_per_uid);
  }
  uint32_t slot = 0;
  if (!m.free_slots.empty()) {
    slot = m.free_slots.back();
    m.free_slots.pop_back();
  } else {
    if (m.sessions.size() >= 0xffffffffu) return make_error(ENOSPC, "KV: out of session slots");
    slot = static_cast<uint32_t>(m.sessions.size());
    m.sessions.emplace_back();
  }
  SessionRec& s = m.sessions[slot];
  ++s.gen;
  s.id = (uint64_t{s.gen} << 32) | slot;
  s.live = true;
  s.arena = aid;
  s.prio = priority;
  s.last_used = now;
  s.length = 0;
  s.entries = 0;
  s.own_free_head = kNil;
  s.spare = 0;
  s.table.clear();
  s.owned.clear();
  s.arena_pos = static_cast<uint32_t>(a->sessions.size());
  a->sessions.push_back(slot);
  ++a->uid_rec->sessions;
  return s.id;
}

Status Allocator::allocate(SessionId sid, uint32_t n, TimePoint now, std::vector<BlockId>& blocks,
                           std::vector<EvictionNotice>& notices) {
  Impl& m = *impl_;
  blocks.clear();
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  ArenaRec& a = *m.arenas[s->arena];
  if (n == 0) return {};
  // Cheap bounds first, so a hostile n costs nothing: more than the whole
  // arena, or a table whose indices would not fit 32 bits.
  if (uint64_t{n} > uint64_t{a.max_chunks} * a.g.blocks_per_chunk || s->table.size() + uint64_t{n} >= kNoBlock) {
    return make_error(EINVAL, "KV session {}: {} blocks exceed the arena ({} blocks)", sid, n,
                      uint64_t{a.max_chunks} * a.g.blocks_per_chunk);
  }
  AIRS_TRY(m.check_quota(a, n));
  bool evicted = false;
  AIRS_TRY(m.obtain(s->arena, a, *s, n, now, blocks, notices, evicted));
  for (const BlockId b : blocks) {
    const auto idx = static_cast<uint32_t>(s->table.size());
    s->table.push_back(b);
    m.hold_new(a, b, sid, idx);
  }
  s->entries += n;
  s->last_used = now;
  m.settle(s->arena, a, !evicted);
  return {};
}

Status Allocator::allocate_at(SessionId sid, uint32_t index, TimePoint now, BlockId& block,
                              std::vector<EvictionNotice>& notices) {
  Impl& m = *impl_;
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  ArenaRec& a = *m.arenas[s->arena];
  if (index > s->table.size() || index >= kNoBlock) {
    return make_error(EINVAL, "KV session {}: index {} is past the end of its block table ({} entries)", sid, index,
                      s->table.size());
  }
  if (index < s->table.size() && s->table[index] != kNoBlock) {
    return make_error(EINVAL, "KV session {}: index {} holds block {}; only a hole or the end can be allocated", sid,
                      index, s->table[index]);
  }
  AIRS_TRY(m.check_quota(a, 1));
  bool evicted = false;
  std::vector<BlockId> got;
  AIRS_TRY(m.obtain(s->arena, a, *s, 1, now, got, notices, evicted));
  // Making room may have evicted this session's own tail (and cut the
  // table): the entries up to `index` are holes then.
  if (s->table.size() <= index) s->table.resize(size_t{index} + 1, kNoBlock);
  s->table[index] = got[0];
  m.hold_new(a, got[0], sid, index);
  ++s->entries;
  s->last_used = now;
  m.settle(s->arena, a, !evicted);
  block = got[0];
  return {};
}

Status Allocator::free(SessionId sid, std::span<const BlockId> list, TimePoint now) {
  Impl& m = *impl_;
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  ArenaRec& a = *m.arenas[s->arena];
  const uint32_t epoch = ++m.epoch;
  for (const BlockId b : list) {
    if (m.find_ref(a, b, sid) == kNil) {
      return make_error(EPERM, "KV session {}: block {} is not in its block table; nothing freed", sid, b);
    }
    if (a.blocks[b].mark == epoch) {
      return make_error(EINVAL, "KV session {}: block {} listed twice; nothing freed", sid, b);
    }
    a.blocks[b].mark = epoch;
  }
  for (const BlockId b : list) {
    const uint32_t idx = m.find_ref(a, b, sid);
    s->table[idx] = kNoBlock;
    --s->entries;
    m.drop_ref(a, b, sid, /*evicting=*/false, now);
  }
  Impl::trim_table(a, *s);
  s->last_used = now;
  m.settle(s->arena, a, true);
  return {};
}

Status Allocator::set_length(SessionId sid, uint32_t tokens, TimePoint now) {
  Impl& m = *impl_;
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  const ArenaRec& a = *m.arenas[s->arena];
  const uint64_t cap = uint64_t{s->table.size()} * a.g.tokens_per_block;
  if (tokens > cap) {
    return make_error(EINVAL, "KV session {}: length {} tokens exceeds its {} blocks ({} tokens); allocate first", sid,
                      tokens, s->table.size(), cap);
  }
  s->length = tokens;
  s->last_used = now;
  return {};
}

Status Allocator::touch(SessionId sid, TimePoint now) {
  SessionRec* s = impl_->find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  s->last_used = now;
  return {};
}

Status Allocator::rate_access(SessionId sid, double share, TimePoint now, std::chrono::nanoseconds valid_for) {
  SessionRec* s = impl_->find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  if (!(share >= 0 && share <= 1))
    return make_error(EINVAL, "KV session {}: a share of {} of its KV read is not a share", sid, share);
  // An average over time, whatever the client's period: what was measured
  // before weighs half after every kAccessHalfLife, so a session read a
  // moment ago ranks above one read a minute ago, and two clients that
  // sample at different periods are ranked alike.
  if (!rate_of(*s, now)) {
    s->access_rate = share;
  } else if (now > s->rated_at) {
    const double w = std::exp2(-std::chrono::duration<double>(now - s->rated_at) / kAccessHalfLife);
    s->access_rate = w * s->access_rate + (1 - w) * share;
  }
  s->rated = true;
  s->rated_at = std::max(s->rated_at, now);
  s->rated_until = now + valid_for;
  return {};
}

Result<uint32_t> Allocator::commit(SessionId sid, std::span<const BlockId> list, std::span<const uint64_t> hashes,
                                   TimePoint now) {
  Impl& m = *impl_;
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  ArenaRec& a = *m.arenas[s->arena];
  if (list.size() != hashes.size()) {
    return make_error(EINVAL, "KV session {}: commit of {} blocks with {} hashes; pass one hash per block", sid,
                      list.size(), hashes.size());
  }
  const uint32_t epoch = ++m.epoch;
  for (size_t i = 0; i < list.size(); ++i) {
    const BlockId b = list[i];
    const uint32_t idx = m.find_ref(a, b, sid);
    if (idx == kNil) return make_error(EPERM, "KV session {}: block {} is not in its block table; nothing committed", sid, b);
    if (a.blocks[b].mark == epoch) return make_error(EINVAL, "KV session {}: block {} listed twice; nothing committed", sid, b);
    a.blocks[b].mark = epoch;
    const uint64_t end = (uint64_t{idx} + 1) * a.g.tokens_per_block;
    if (end > s->length) {
      return make_error(EINVAL,
                        "KV session {}: block {} (index {}) is not full: length is {} tokens, the block ends at {}; "
                        "SetLength before Commit; nothing committed",
                        sid, b, idx, s->length, end);
    }
    if (a.blocks[b].published && a.blocks[b].hash != hashes[i]) {
      return make_error(EINVAL, "KV session {}: block {} is already published under another hash; nothing committed",
                        sid, b);
    }
  }
  const uint32_t published = Impl::publish_all(a, list, hashes);
  s->last_used = now;
  return published;
}

Status Allocator::match_prefix(SessionId sid, std::span<const uint64_t> hashes, TimePoint now,
                               std::vector<BlockId>& out) {
  Impl& m = *impl_;
  out.clear();
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  ArenaRec& a = *m.arenas[s->arena];
  const uint32_t epoch = ++m.epoch;
  uint64_t newly_held = 0;
  for (const uint64_t h : hashes) {
    const auto it = a.index.find(h);
    if (it == a.index.end()) break;
    const BlockId b = it->second;
    // A block already in this table (or twice in the run) would make one
    // table hold a block twice; a chained prefix never repeats, so stop.
    if (a.blocks[b].mark == epoch || m.find_ref(a, b, sid) != kNil) break;
    a.blocks[b].mark = epoch;
    if (a.blocks[b].state == BlockState::Cached) ++newly_held;
    out.push_back(b);
  }
  if (Status q = m.check_quota(a, newly_held); !q.ok()) {
    out.clear();
    return q;
  }
  for (const BlockId b : out) {
    const auto idx = static_cast<uint32_t>(s->table.size());
    s->table.push_back(b);
    ++s->entries;
    m.add_ref(a, b, sid, idx);
  }
  s->last_used = now;
  return {};
}

Result<BlockId> Allocator::prepare_write(SessionId sid, BlockId block, TimePoint now,
                                         std::vector<EvictionNotice>& notices) {
  Impl& m = *impl_;
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  ArenaRec& a = *m.arenas[s->arena];
  const uint32_t idx = m.find_ref(a, block, sid);
  if (idx == kNil) return make_error(EPERM, "KV session {}: block {} is not in its block table", sid, block);
  s->last_used = now;
  if (a.blocks[block].refcount == 1) {
    // Its bytes are about to change: it no longer holds the prefix its hash names.
    Impl::unpublish(a, block);
    return block;
  }
  AIRS_TRY(m.check_quota(a, 1));
  auto& got = m.scratch_blocks;
  got.clear();
  bool evicted = false;
  AIRS_TRY(m.obtain(s->arena, a, *s, 1, now, got, notices, evicted));
  const BlockId dst = got.front();
  m.ops.copy_block(s->arena, block, dst);
  m.hold_new(a, dst, sid, idx);
  s->table[idx] = dst;
  m.drop_ref(a, block, sid, /*evicting=*/false, now);
  m.settle(s->arena, a, !evicted);
  return dst;
}

Status Allocator::close(SessionId sid, TimePoint now) {
  Impl& m = *impl_;
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  ArenaRec& a = *m.arenas[s->arena];
  for (size_t i = s->table.size(); i-- > 0;) {
    if (s->table[i] != kNoBlock) m.drop_ref(a, s->table[i], sid, /*evicting=*/false, now);
  }
  for (const uint32_t c : s->owned) {
    Chunk& ch = a.chunks[c];
    if (ch.free_count > 0) m.own_unlink(a, *s, c);
    ch.owner = 0;
    if (ch.spare) {
      ch.spare = false;
      if (!ch.pending) {
        ch.pending = true;
        a.pending.push_back(c);
      }
    }
  }
  s->owned.clear();
  s->spare = 0;
  s->own_free_head = kNil;
  // Remove from the arena's session list (swap with last).
  const uint32_t slot = static_cast<uint32_t>(sid & 0xffffffffu);
  const uint32_t pos = s->arena_pos;
  const uint32_t last = a.sessions.back();
  a.sessions[pos] = last;
  m.sessions[last].arena_pos = pos;
  a.sessions.pop_back();
  --a.uid_rec->sessions;
  s->live = false;
  s->table.clear();
  s->table.shrink_to_fit();
  s->entries = 0;
  m.free_slots.push_back(slot);
  m.settle(s->arena, a, false);
  return {};
}

uint64_t Allocator::committed_bytes_of_uid(uint32_t uid) const {
  uint64_t n = 0;
  for (const auto& a : impl_->arenas)
    if (a->live && a->uid == uid) n += uint64_t{a->committed} * a->g.chunk_bytes;
  return n;
}

policy::PoolState Allocator::snapshot(TimePoint now) const {
  const Impl& m = *impl_;
  policy::PoolState ps;
  for (ArenaId aid = 0; aid < m.arenas.size(); ++aid) {
    const ArenaRec& a = *m.arenas[aid];
    if (!a.live) continue;
    ps.total_bytes += uint64_t{a.committed} * a.g.chunk_bytes;
    ps.free_bytes += uint64_t{a.free_blocks} * a.g.block_bytes;
    for (const uint32_t slot : a.sessions) {
      const SessionRec& s = m.sessions[slot];
      const auto [blocks, partial] = m.evictable(a, s);
      policy::SessionState st;
      st.id = s.id;
      st.priority = s.prio;
      st.blocks = blocks;
      st.partial_blocks = partial;
      st.block_bytes = a.g.block_bytes;
      st.last_used = s.last_used;
      st.access_rate = rate_of(s, now);
      ps.sessions.push_back(st);
    }
    if (a.cached > 0) {
      ps.cached.push_back(policy::CachedBlocks{aid, a.cached, a.g.block_bytes, a.blocks[a.lru_head].cached_at});
    }
  }
  return ps;
}

Result<uint32_t> Allocator::evict(const policy::Action& action, TimePoint now, std::vector<EvictionNotice>& notices) {
  Impl& m = *impl_;
  switch (action.kind) {
    case policy::ActionKind::DropCached: {
      if (action.id > std::numeric_limits<ArenaId>::max()) return make_error(ENOENT, "KV arena {}: no such arena", action.id);
      const auto aid = static_cast<ArenaId>(action.id);
      ArenaRec* a = m.find_arena(aid);
      if (a == nullptr) return make_error(ENOENT, "KV arena {}: no such arena", action.id);
      const uint32_t n = std::min(action.blocks, a->cached);
      for (uint32_t i = 0; i < n; ++i) m.drop_cached_lru(aid, *a);
      m.settle(aid, *a, false);
      return n;
    }
    case policy::ActionKind::EvictBlocks: {
      SessionRec* s = m.find_session(action.id);
      if (s == nullptr) return Impl::no_session(action.id);
      ArenaRec& a = *m.arenas[s->arena];
      const uint32_t n = m.evict_session_blocks(a, *s, action.blocks, action.reason, now, notices);
      m.settle(s->arena, a, false);
      return n;
    }
    case policy::ActionKind::EvictModel:
    case policy::ActionKind::ShrinkModel:
      break;
  }
  return make_error(EINVAL, "KV: eviction action {} is not a KV action (models are evicted by the model manager)",
                    static_cast<int>(action.kind));
}

uint32_t Allocator::trim() { return impl_->trim_all(); }

Result<uint32_t> Allocator::publish_restored(SessionId sid, std::span<const BlockId> list,
                                             std::span<const uint64_t> hashes) {
  Impl& m = *impl_;
  SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  ArenaRec& a = *m.arenas[s->arena];
  if (list.size() != hashes.size()) {
    return make_error(EINVAL, "KV session {}: {} restored blocks with {} hashes", sid, list.size(), hashes.size());
  }
  const uint32_t epoch = ++m.epoch;
  for (const BlockId b : list) {
    if (m.find_ref(a, b, sid) == kNil) return make_error(EPERM, "KV session {}: block {} is not in its block table", sid, b);
    if (a.blocks[b].mark == epoch) return make_error(EINVAL, "KV session {}: block {} listed twice", sid, b);
    a.blocks[b].mark = epoch;
  }
  return Impl::publish_all(a, list, hashes);
}

std::vector<std::pair<BlockId, uint64_t>> Allocator::published(ArenaId aid) const {
  std::vector<std::pair<BlockId, uint64_t>> out;
  const ArenaRec* a = impl_->find_arena(aid);
  if (a == nullptr) return out;
  out.reserve(a->index.size());
  for (const auto& [h, b] : a->index) out.emplace_back(b, h);
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

KvStats stats_of(const ArenaRec& a, const std::vector<SessionRec>& sessions) {
  KvStats st;
  const KvGeometry& g = a.g;
  st.committed_chunks = a.committed;
  st.committed_bytes = uint64_t{a.committed} * g.chunk_bytes;
  st.used_bytes = uint64_t{a.held} * g.block_bytes;
  st.cached_bytes = uint64_t{a.cached} * g.block_bytes;
  st.free_bytes = uint64_t{a.free_blocks} * g.block_bytes;
  st.pack_loss_bytes = uint64_t{a.committed} * g.pack_loss_bytes();
  st.sessions = static_cast<uint32_t>(a.sessions.size());
  for (const uint32_t slot : a.sessions) {
    const SessionRec& s = sessions[slot];
    for (uint32_t i = 0; i < s.table.size(); ++i) {
      const BlockId b = s.table[i];
      // Shared blocks were full when published; count each physical block once.
      if (b == kNoBlock || a.blocks[b].refcount != 1) continue;
      const uint64_t begin = uint64_t{i} * g.tokens_per_block;
      const uint64_t filled = s.length <= begin ? 0 : std::min<uint64_t>(s.length - begin, g.tokens_per_block);
      st.unfilled_bytes += (g.tokens_per_block - filled) * g.bytes_per_token;
    }
  }
  for (uint32_t c = 0; c < a.high_water; ++c) {
    if (!a.chunks[c].committed) continue;
    for (uint32_t i = 0; i < g.blocks_per_chunk; ++i) {
      if (a.blocks[c * g.blocks_per_chunk + i].refcount >= 2) ++st.shared_blocks;
    }
  }
  return st;
}

void add_stats(KvStats& t, const KvStats& s) {
  t.committed_chunks += s.committed_chunks;
  t.committed_bytes += s.committed_bytes;
  t.used_bytes += s.used_bytes;
  t.cached_bytes += s.cached_bytes;
  t.free_bytes += s.free_bytes;
  t.unfilled_bytes += s.unfilled_bytes;
  t.pack_loss_bytes += s.pack_loss_bytes;
  t.sessions += s.sessions;
  t.shared_blocks += s.shared_blocks;
}

}  // namespace

Result<KvStats> Allocator::arena_stats(ArenaId aid) const {
  const ArenaRec* a = impl_->find_arena(aid);
  if (a == nullptr) return make_error(ENOENT, "KV arena {}: no such arena", aid);
  return stats_of(*a, impl_->sessions);
}

KvStats Allocator::total_stats() const {
  KvStats t;
  for (const auto& a : impl_->arenas) {
    if (a->live) add_stats(t, stats_of(*a, impl_->sessions));
  }
  return t;
}

Result<SessionInfo> Allocator::session_info(SessionId sid) const {
  const Impl& m = *impl_;
  const SessionRec* s = m.find_session(sid);
  if (s == nullptr) return Impl::no_session(sid);
  const ArenaRec& a = *m.arenas[s->arena];
  SessionInfo info;
  info.id = s->id;
  info.arena = s->arena;
  info.model = a.model;
  info.uid = a.uid;
  info.priority = s->prio;
  info.length = s->length;
  info.blocks = s->entries;
  for (const BlockId b : s->table) {
    if (b != kNoBlock && a.blocks[b].refcount >= 2) ++info.shared;
  }
  info.owned_chunks = static_cast<uint32_t>(s->owned.size());
  info.last_used = s->last_used;
  info.access_rate = rate_of(*s, TimePoint::clock::now());
  info.table = s->table;
  return info;
}

std::vector<SessionId> Allocator::sessions() const {
  std::vector<SessionId> out;
  for (const SessionRec& s : impl_->sessions) {
    if (s.live) out.push_back(s.id);
  }
  return out;
}

Result<BlockInfo> Allocator::block_info(ArenaId aid, BlockId b) const {
  const ArenaRec* a = impl_->find_arena(aid);
  if (a == nullptr) return make_error(ENOENT, "KV arena {}: no such arena", aid);
  if (uint64_t{b} >= uint64_t{a->max_chunks} * a->g.blocks_per_chunk) {
    return make_error(EINVAL, "KV arena {}: block {} is outside the arena", aid, b);
  }
  BlockInfo info;
  info.chunk = a->g.chunk_of(b);
  if (b < a->blocks.size()) {
    const Block& bl = a->blocks[b];
    info.state = bl.state;
    info.refcount = bl.refcount;
    info.published = bl.published;
    info.hash = bl.hash;
  }
  return info;
}

Result<KvGeometry> Allocator::arena_geometry(ArenaId aid) const {
  const ArenaRec* a = impl_->find_arena(aid);
  if (a == nullptr) return make_error(ENOENT, "KV arena {}: no such arena", aid);
  return a->g;
}

size_t Allocator::arena_count() const { return impl_->arenas.size(); }

namespace {
Error audit_error(ArenaId aid, const std::string& what) {
  return make_error(EUCLEAN, "KV audit: arena {}: {}", aid, what);
}
}  // namespace

// A session's table against its entries and length, its chunks against
// their owner marks, its own free list against its chunks with free blocks.
// Its blocks go to `held_by`.
Status Allocator::Impl::audit_session(ArenaId aid, uint32_t slot, HeldBy& held_by) const {
  const ArenaRec& a = *arenas[aid];
  const SessionRec& s = sessions[slot];
  auto fail = [&](const std::string& what) { return audit_error(aid, what); };
  if (!s.live || s.arena != aid) return fail(fmt::format("session slot {} listed but not live here", slot));
  uint32_t entries = 0;
  for (uint32_t i = 0; i < s.table.size(); ++i) {
    if (s.table[i] == kNoBlock) continue;
    ++entries;
    held_by[s.table[i]].push_back(Holder{s.id, i});
  }
  if (entries != s.entries) return fail(fmt::format("session {} entries {} != {}", s.id, s.entries, entries));
  if (!s.table.empty() && s.table.back() == kNoBlock) return fail(fmt::format("session {} trailing hole", s.id));
  if (s.length > s.table.size() * uint64_t{a.g.tokens_per_block}) return fail("length beyond table");
  uint32_t spares = 0;
  for (const uint32_t c : s.owned) {
    if (!a.chunks[c].committed || a.chunks[c].owner != s.id) return fail(fmt::format("session {} owns chunk {} wrongly", s.id, c));
    if (a.chunks[c].spare) ++spares;
  }
  if (spares != s.spare) return fail(fmt::format("session {} spare count {} != {}", s.id, s.spare, spares));
  uint32_t own_list = 0;
  for (uint32_t c = s.own_free_head; c != kNil; c = a.chunks[c].own_next) {
    if (a.chunks[c].owner != s.id || a.chunks[c].free_count == 0) return fail("own free list holds a wrong chunk");
    if (++own_list > a.max_chunks) return fail("own free list cycles");
  }
  uint32_t own_with_free = 0;
  for (const uint32_t c : s.owned) own_with_free += a.chunks[c].free_count > 0;
  if (own_list != own_with_free) return fail(fmt::format("session {} own free list {} != {}", s.id, own_list, own_with_free));
  return {};
}

// One block of a committed chunk: its refcount against its holders, its
// state against them, its holder list and its index entry.
Status Allocator::Impl::audit_block(ArenaId aid, BlockId b, const HeldBy& held_by, AuditCounts& n) const {
  const ArenaRec& a = *arenas[aid];
  const Block& bl = a.blocks[b];
  auto fail = [&](const std::string& what) { return audit_error(aid, what); };
  const auto hb = held_by.find(b);
  const size_t holders = hb == held_by.end() ? 0 : hb->second.size();
  if (bl.refcount != holders) return fail(fmt::format("block {} refcount {} but {} holders", b, bl.refcount, holders));
  switch (bl.state) {
    case BlockState::Free:
      ++n.free_blocks;
      if (bl.published || holders) return fail(fmt::format("free block {} published or held", b));
      break;
    case BlockState::Held:
      ++n.held;
      if (holders == 0) return fail(fmt::format("held block {} without holders", b));
      AIRS_TRY(audit_holders(aid, b, hb->second));
      break;
    case BlockState::Cached:
      ++n.cached;
      if (!bl.published || holders) return fail(fmt::format("cached block {} unpublished or held", b));
      break;
    case BlockState::Uncommitted:
      return fail(fmt::format("uncommitted block {} in committed chunk", b));
  }
  if (bl.published) {
    const auto it = a.index.find(bl.hash);
    if (it == a.index.end() || it->second != b) return fail(fmt::format("published block {} not indexed", b));
  }
  return {};
}

// A held block's hint (one holder) or holder list (shared: published, and
// listing exactly the sessions whose tables hold it).
Status Allocator::Impl::audit_holders(ArenaId aid, BlockId b, const std::vector<Holder>& expected) const {
  const ArenaRec& a = *arenas[aid];
  const Block& bl = a.blocks[b];
  auto fail = [&](const std::string& what) { return audit_error(aid, what); };
  if (expected.size() == 1) {
    if (bl.hint_sid != expected[0].sid || bl.hint_idx != expected[0].idx) return fail(fmt::format("block {} hint wrong", b));
    if (a.holders.count(b)) return fail(fmt::format("block {} has a holder list at refcount 1", b));
    return {};
  }
  if (!bl.published) return fail(fmt::format("shared block {} not published", b));
  const auto it = a.holders.find(b);
  if (it == a.holders.end() || it->second.size() != expected.size()) return fail(fmt::format("block {} holder list wrong", b));
  for (const Holder& h : it->second) {
    bool found = false;
    for (const Holder& e : expected) found |= e.sid == h.sid && e.idx == h.idx;
    if (!found) return fail(fmt::format("block {} holder list has a stranger", b));
  }
  return {};
}

// One chunk: uncommitted ones hold no blocks; a committed one's blocks, its
// counts, its free list, its owner and its spare mark.
Status Allocator::Impl::audit_chunk(ArenaId aid, uint32_t c, const HeldBy& held_by, AuditCounts& n) const {
  const ArenaRec& a = *arenas[aid];
  const uint32_t bpc = a.g.blocks_per_chunk;
  const Chunk& ch = a.chunks[c];
  auto fail = [&](const std::string& what) { return audit_error(aid, what); };
  if (!ch.committed) {
    if (c < a.high_water)
      for (uint32_t i = 0; i < bpc; ++i)
        if (a.blocks[c * bpc + i].state != BlockState::Uncommitted) return fail(fmt::format("block in uncommitted chunk {}", c));
    return {};
  }
  if (c >= a.high_water) return fail("committed chunk above high water");
  ++n.committed;
  if (ch.pending) return fail(fmt::format("chunk {} still pending after a call", c));
  const AuditCounts before = n;
  for (uint32_t i = 0; i < bpc; ++i) AIRS_TRY(audit_block(aid, c * bpc + i, held_by, n));
  const uint32_t nfree = n.free_blocks - before.free_blocks;
  const uint32_t nused = (n.held - before.held) + (n.cached - before.cached);
  if (nfree != ch.free_count || nused != ch.used) return fail(fmt::format("chunk {} counts wrong", c));
  uint32_t walked = 0;
  for (uint32_t b = ch.free_head; b != kNil; b = a.blocks[b].next) {
    if (a.g.chunk_of(b) != c || a.blocks[b].state != BlockState::Free || ++walked > bpc) return fail(fmt::format("chunk {} free list broken", c));
  }
  if (walked != nfree) return fail(fmt::format("chunk {} free list length", c));
  if (nfree > 0) ++n.chunks_with_free;
  if (ch.owner != 0) {
    const SessionRec* o = find_session(ch.owner);
    if (o == nullptr || o->arena != aid) return fail(fmt::format("chunk {} owned by a dead session", c));
    if (std::find(o->owned.begin(), o->owned.end(), c) == o->owned.end()) return fail("owner does not list chunk");
  }
  if (ch.spare && (ch.used != 0 || ch.owner == 0)) return fail(fmt::format("spare chunk {} not empty or ownerless", c));
  if (ch.used == 0 && !ch.spare) return fail(fmt::format("empty chunk {} neither released nor spare", c));
  return {};
}

// The arena's lists (free chunks, LRU), its index and holder lists, and its
// counters against what the chunks hold (`n`).
Status Allocator::Impl::audit_lists(ArenaId aid, const AuditCounts& n) const {
  const ArenaRec& a = *arenas[aid];
  auto fail = [&](const std::string& what) { return audit_error(aid, what); };
  uint32_t arena_list = 0;
  for (uint32_t c = a.free_chunks_head; c != kNil; c = a.chunks[c].ar_next) {
    if (a.chunks[c].free_count == 0 || ++arena_list > a.max_chunks) return fail("arena free list broken");
  }
  if (arena_list != n.chunks_with_free) return fail("arena free list length");
  uint32_t lru = 0;
  TimePoint prev{};
  for (uint32_t b = a.lru_head; b != kNil; b = a.blocks[b].next) {
    if (a.blocks[b].state != BlockState::Cached || ++lru > a.blocks.size()) return fail("LRU list broken");
    if (a.blocks[b].cached_at < prev) return fail("LRU out of order");
    prev = a.blocks[b].cached_at;
  }
  if (lru != n.cached) return fail("LRU length");
  for (const auto& [h, b] : a.index) {
    if (b >= a.blocks.size() || !a.blocks[b].published || a.blocks[b].hash != h) return fail("index entry stale");
  }
  for (const auto& [b, hv] : a.holders) {
    if (b >= a.blocks.size() || a.blocks[b].refcount < 2) return fail("holder list for unshared block");
  }
  if (n.committed != a.committed || n.free_blocks != a.free_blocks || n.held != a.held || n.cached != a.cached) {
    return fail(fmt::format("counters: committed {}/{} free {}/{} held {}/{} cached {}/{}", a.committed, n.committed,
                            a.free_blocks, n.free_blocks, a.held, n.held, a.cached, n.cached));
  }
  if (!a.pending.empty()) return fail("pending list not empty");
  return {};
}

Status Allocator::audit() const {
  const Impl& m = *impl_;
  std::unordered_map<uint32_t, uint64_t> uid_blocks;
  std::unordered_map<uint32_t, uint32_t> uid_sessions;
  for (ArenaId aid = 0; aid < m.arenas.size(); ++aid) {
    const ArenaRec& a = *m.arenas[aid];
    if (!a.live) continue;
    // Expected refcounts and holders from the block tables.
    Impl::HeldBy held_by;
    for (const uint32_t slot : a.sessions) AIRS_TRY(m.audit_session(aid, slot, held_by));
    uid_sessions[a.uid] += static_cast<uint32_t>(a.sessions.size());
    Impl::AuditCounts n;
    for (uint32_t c = 0; c < a.max_chunks; ++c) AIRS_TRY(m.audit_chunk(aid, c, held_by, n));
    AIRS_TRY(m.audit_lists(aid, n));
    uid_blocks[a.uid] += n.held;
  }
  for (const auto& [uid, rec] : m.uids) {
    if (rec->blocks != uid_blocks[uid] || rec->sessions != uid_sessions[uid]) {
      return make_error(EUCLEAN, "KV audit: uid {} counters blocks {}/{} sessions {}/{}", uid, rec->blocks,
                        uid_blocks[uid], rec->sessions, uid_sessions[uid]);
    }
  }
  return {};
}

}  // namespace airs::kv
