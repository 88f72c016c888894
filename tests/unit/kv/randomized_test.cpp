// SPDX-License-Identifier: Apache-2.0
// Long seeded random operation sequences over several arenas, uids and
// sessions, with a shared pool smaller than the arenas' capacity so commits
// fail too. After EVERY step: the allocator's own audit, and independent
// checks from the outside — refcounts equal the number of table entries
// holding a block, block contents (fake tags written by the test) are intact
// for every holder (so no held block was ever handed out twice or released),
// the committed chunks equal the fake ChunkOps ledger, used + cached + free
// equals committed capacity, and eviction followed the order.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "kv/allocator.hpp"
#include "unit/kv/fake_chunk_ops.hpp"
#include "util/units.hpp"

namespace airs::kv {
namespace {

using namespace std::chrono_literals;
using test::FakeChunkOps;

struct Model {
  ArenaId arena;
  std::vector<uint64_t> expect;  // content tag per logical index (0 = hole)
  int prompt;                    // which shared prompt its hashes follow
};

int level(Priority p, TimePoint last, TimePoint now, std::chrono::nanoseconds idle) {
  if (p == Priority::Background) return 1;
  if (p == Priority::System) return 2;
  return now - last > idle ? 3 : 4;
}

class Randomized : public ::testing::TestWithParam<uint64_t> {};

TEST_P(Randomized, InvariantsHoldAfterEveryStep) {
  std::mt19937_64 rng(GetParam());
  auto pick = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  FakeChunkOps ops(/*pool_chunks=*/14);
  const Config cfg{.idle_threshold = 5min, .max_sessions_per_uid = 5, .max_blocks_per_uid = 40, .hash_seed = 7};
  Allocator alloc(ops, cfg);
  // bpc 2 (seed) and bpc 3 (2 MiB pages, 640 KiB blocks → chunk of 1 page holds 3).
  const KvGeometry g1 = make_geometry({.bytes_per_token = 64 * kKiB, .page_bytes = 2 * kMiB}).value();
  const KvGeometry g2 =
      make_geometry({.bytes_per_token = 40 * kKiB, .page_bytes = 2 * kMiB, .chunk_bytes = 2 * kMiB}).value();
  ASSERT_EQ(g2.blocks_per_chunk, 3u);
  std::vector<ArenaId> arenas;
  for (uint64_t model : {uint64_t{1}, uint64_t{2}}) {
    for (uint32_t uid : {1000u, 1001u}) {
      const KvGeometry& g = model == 1 ? g1 : g2;
      const ArenaId a = alloc.open_arena(model, uid, g, 6).value();
      ops.set_blocks_per_chunk(a, g.blocks_per_chunk);
      arenas.push_back(a);
    }
  }
  std::map<SessionId, Model> model;
  TimePoint now{std::chrono::hours(1)};
  uint64_t next_tag = 1;
  std::vector<BlockId> out;
  std::vector<EvictionNotice> notices;
  uint64_t n_evictions = 0, n_cow = 0, n_matched = 0, n_nomem = 0;

  auto write = [&](ArenaId a, BlockId b) {
    const uint64_t t = next_tag++;
    ops.mem[{a, b}] = t;
    return t;
  };
  auto hash_of = [](int prompt, size_t idx) { return (static_cast<uint64_t>(prompt) << 32) | (idx + 1); };
  auto apply_notices = [&](const std::vector<EvictionNotice>& ns) {
    for (const auto& n : ns) {
      auto& m = model.at(n.session);
      ASSERT_EQ(n.blocks.size(), n.indices.size());
      for (size_t i = 0; i < n.blocks.size(); ++i) {
        ASSERT_LT(n.indices[i], m.expect.size());
        m.expect[n.indices[i]] = 0;
      }
      while (!m.expect.empty() && m.expect.back() == 0) m.expect.pop_back();
      ++n_evictions;
    }
  };
  // Eviction order: after an allocation that evicted a victim at level L,
  // no session of the arena at a lower level may still hold evictable blocks,
  // and no victim is the requester, active interactive, or at a level the
  // requester does not outrank.
  auto check_order = [&](SessionId requester, Priority rp, const std::vector<EvictionNotice>& ns,
                         const std::map<SessionId, std::pair<Priority, TimePoint>>& before) {
    int deepest = 0;
    for (const auto& n : ns) {
      ASSERT_NE(n.session, requester);
      const auto& [p, last] = before.at(n.session);
      const int l = level(p, last, now, cfg.idle_threshold);
      ASSERT_LT(l, 4) << "active interactive KV evicted";
      ASSERT_LT(l, rp == Priority::Interactive ? 4 : rp == Priority::System ? 2 : 1) << "requester does not outrank";
      deepest = std::max(deepest, l);
    }
    if (deepest == 0) return;
    const ArenaId a = model.at(requester).arena;
    for (const SessionId s : alloc.sessions()) {
      const SessionInfo si = alloc.session_info(s).value();
      if (si.arena != a || s == requester) continue;
      const auto& [p, last] = before.at(s);
      if (level(p, last, now, cfg.idle_threshold) >= deepest) continue;
      for (const BlockId b : si.table) {
        if (b == kNoBlock) continue;
        ASSERT_GT(alloc.block_info(a, b).value().refcount, 1u) << "a lower level kept evictable KV";
      }
    }
  };
  auto priorities = [&] {
    std::map<SessionId, std::pair<Priority, TimePoint>> m;
    for (const SessionId s : alloc.sessions()) {
      const auto si = alloc.session_info(s).value();
      m[s] = {si.priority, si.last_used};
    }
    return m;
  };

  for (int step = 0; step < 4000; ++step) {
    now += std::chrono::seconds(pick(100) < 3 ? 400 : pick(20));
    std::vector<SessionId> live = alloc.sessions();
    const SessionId s = live.empty() ? 0 : live[pick(live.size())];
    const uint64_t op = pick(100);
    SCOPED_TRACE(::testing::Message() << "step " << step << " op " << op << " session " << s);
    if (op < 10 || live.empty()) {
      const ArenaId a = arenas[pick(arenas.size())];
      auto r = alloc.create_session(a, static_cast<Priority>(pick(3)), now);
      if (r.ok()) {
        model[r.value()] = Model{a, {}, static_cast<int>(pick(2))};
      } else {
        ASSERT_EQ(r.error().code, EDQUOT);
      }
    } else if (op < 16) {
      ASSERT_TRUE(alloc.close(s, now).ok());
      model.erase(s);
    } else if (op < 45) {
      auto before = priorities();
      const auto rp = alloc.session_info(s).value().priority;
      notices.clear();
      Status st = alloc.allocate(s, static_cast<uint32_t>(1 + pick(4)), now, out, notices);
      if (st.ok()) {
        apply_notices(notices);
        check_order(s, rp, notices, before);
        auto& m = model.at(s);
        for (const BlockId b : out) m.expect.push_back(write(m.arena, b));
      } else {
        ASSERT_TRUE(st.error().code == ENOMEM || st.error().code == EDQUOT) << st.error().message;
        ASSERT_TRUE(notices.empty());
        n_nomem += st.error().code == ENOMEM;
      }
    } else if (op < 60) {
      auto& m = model.at(s);
      std::vector<BlockId> victims;
      const auto tab = alloc.session_info(s).value().table;
      for (size_t i = 0; i < tab.size(); ++i) {
        if (tab[i] != kNoBlock && pick(3) == 0) {
          victims.push_back(tab[i]);
          m.expect[i] = 0;
        }
      }
      if (pick(10) == 0) {  // maybe someone else's, maybe its own, maybe listed twice
        const auto extra = static_cast<BlockId>(pick(40));
        victims.push_back(extra);
        for (size_t i = 0; i < tab.size(); ++i) {
          if (tab[i] == extra) m.expect[i] = 0;
        }
      }
      Status st = alloc.free(s, victims, now);
      if (!st.ok()) {
        ASSERT_TRUE(st.error().code == EPERM || st.error().code == EINVAL);
        for (size_t i = 0; i < tab.size(); ++i) {
          if (tab[i] != kNoBlock) m.expect[i] = ops.mem.at({m.arena, tab[i]});
        }
      }
      while (!m.expect.empty() && m.expect.back() == 0) m.expect.pop_back();
    } else if (op < 70) {
      // Fill everything and publish the full blocks under this prompt's chain.
      const auto si = alloc.session_info(s).value();
      const auto tpb = alloc.arena_geometry(si.arena).value().tokens_per_block;
      ASSERT_TRUE(alloc.set_length(s, static_cast<uint32_t>(si.table.size() * tpb), now).ok());
      std::vector<BlockId> bl;
      std::vector<uint64_t> hs;
      for (size_t i = 0; i < si.table.size(); ++i) {
        if (si.table[i] == kNoBlock) continue;
        const auto bi = alloc.block_info(si.arena, si.table[i]).value();
        if (bi.published && bi.hash != hash_of(model.at(s).prompt, i)) continue;
        bl.push_back(si.table[i]);
        hs.push_back(hash_of(model.at(s).prompt, i));
      }
      auto r = alloc.commit(s, bl, hs, now);
      ASSERT_TRUE(r.ok()) << r.error().message;
    } else if (op < 78) {
      auto& m = model.at(s);
      const size_t start = alloc.session_info(s).value().table.size();
      std::vector<uint64_t> hs;
      for (size_t i = start; i < start + 4; ++i) hs.push_back(hash_of(m.prompt, i));
      Status st = alloc.match_prefix(s, hs, now, out);
      if (st.ok()) {
        for (const BlockId b : out) m.expect.push_back(ops.mem.at({m.arena, b}));
        n_matched += out.size();
      } else {
        ASSERT_EQ(st.error().code, EDQUOT);
      }
    } else if (op < 86) {
      auto& m = model.at(s);
      const auto tab = alloc.session_info(s).value().table;
      if (tab.empty()) continue;
      const size_t i = pick(tab.size());
      if (tab[i] == kNoBlock) continue;
      auto before = priorities();
      const auto rp = alloc.session_info(s).value().priority;
      notices.clear();
      auto r = alloc.prepare_write(s, tab[i], now, notices);
      if (r.ok()) {
        apply_notices(notices);
        check_order(s, rp, notices, before);
        ASSERT_EQ(ops.mem.at({m.arena, r.value()}), m.expect[i]) << "COW lost the bytes";
        n_cow += r.value() != tab[i];
        m.expect[i] = write(m.arena, r.value());
      } else {
        ASSERT_TRUE(r.error().code == ENOMEM || r.error().code == EDQUOT) << r.error().message;
      }
    } else if (op < 92) {
      const auto si = alloc.session_info(s).value();
      const auto tpb = alloc.arena_geometry(si.arena).value().tokens_per_block;
      ASSERT_TRUE(alloc.set_length(s, static_cast<uint32_t>(pick(si.table.size() * tpb + 1)), now).ok());
    } else if (op < 97) {
      // A pressure-loop action on a random target.
      const auto ps = alloc.snapshot(now);
      notices.clear();
      if (pick(2) == 0 && !ps.cached.empty()) {
        const auto& c = ps.cached[pick(ps.cached.size())];
        ASSERT_TRUE(alloc.evict({policy::ActionKind::DropCached, c.arena_id, 1 + static_cast<uint32_t>(pick(3)), 0, "t"},
                                now, notices).ok());
      } else {
        ASSERT_TRUE(alloc.evict({policy::ActionKind::EvictBlocks, s, 1 + static_cast<uint32_t>(pick(3)), 0, "t"}, now,
                                notices).ok());
      }
      apply_notices(notices);
    } else {
      alloc.trim();
    }

    // ---- invariants after every step ----
    Status audit = alloc.audit();
    ASSERT_TRUE(audit.ok()) << "step " << step << ": " << audit.error().message;
    ASSERT_TRUE(ops.errors.empty()) << "step " << step << ": " << ops.errors.front();
    std::map<std::pair<ArenaId, BlockId>, uint32_t> holders;
    for (const SessionId id : alloc.sessions()) {
      const auto si = alloc.session_info(id).value();
      const auto& m = model.at(id);
      ASSERT_EQ(si.table.size(), m.expect.size()) << "step " << step << " session " << id;
      for (size_t i = 0; i < si.table.size(); ++i) {
        ASSERT_EQ(si.table[i] == kNoBlock, m.expect[i] == 0) << "step " << step;
        if (si.table[i] == kNoBlock) continue;
        ++holders[{si.arena, si.table[i]}];
        const auto it = ops.mem.find({si.arena, si.table[i]});
        ASSERT_NE(it, ops.mem.end()) << "step " << step << ": held block released";
        ASSERT_EQ(it->second, m.expect[i]) << "step " << step << ": block " << si.table[i] << " overwritten";
      }
    }
    uint64_t committed_total = 0;
    for (const ArenaId a : arenas) {
      const KvGeometry g = alloc.arena_geometry(a).value();
      const KvStats st = alloc.arena_stats(a).value();
      uint64_t committed = 0, held = 0, cached = 0, free = 0;
      for (uint32_t c = 0; c < 6; ++c) {
        const bool in_ledger = ops.ledger.count({a, c}) == 1;
        for (uint32_t i = 0; i < g.blocks_per_chunk; ++i) {
          const BlockId b = c * g.blocks_per_chunk + i;
          const BlockInfo bi = alloc.block_info(a, b).value();
          ASSERT_EQ(bi.state != BlockState::Uncommitted, in_ledger) << "step " << step;
          const auto h = holders.find({a, b});
          const uint32_t n = h == holders.end() ? 0 : h->second;
          ASSERT_EQ(bi.refcount, n) << "step " << step << " block " << b;
          ASSERT_EQ(bi.state == BlockState::Held, n > 0);
          held += bi.state == BlockState::Held;
          cached += bi.state == BlockState::Cached;
          free += bi.state == BlockState::Free;
        }
        committed += in_ledger;
      }
      committed_total += committed;
      ASSERT_EQ(st.committed_chunks, committed);
      ASSERT_EQ(st.used_bytes, held * g.block_bytes);
      ASSERT_EQ(st.cached_bytes, cached * g.block_bytes);
      ASSERT_EQ(st.free_bytes, free * g.block_bytes);
      ASSERT_EQ(st.used_bytes + st.cached_bytes + st.free_bytes + st.pack_loss_bytes, committed * g.chunk_bytes);
    }
    ASSERT_EQ(committed_total, ops.ledger.size());
    ASSERT_LE(ops.ledger.size(), 14u);
  }
  // The sequence must have exercised the interesting paths.
  EXPECT_GT(n_evictions, 0u);
  EXPECT_GT(n_cow, 0u);
  EXPECT_GT(n_matched, 0u);
  EXPECT_GT(n_nomem, 0u);
  EXPECT_GT(ops.commit_failures, 0u);
  EXPECT_GT(ops.releases, 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, Randomized, ::testing::Values(1, 2, 3, 42, 20240601));

}  // namespace
}  // namespace airs::kv
