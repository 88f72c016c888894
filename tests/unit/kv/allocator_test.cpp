// SPDX-License-Identifier: Apache-2.0
#include "kv/allocator.hpp"

#include <cmath>
#include <optional>

#include <gtest/gtest.h>

#include <algorithm>

#include "unit/kv/fake_chunk_ops.hpp"
#include "util/units.hpp"

namespace airs::kv {
namespace {

using namespace std::chrono_literals;
using test::FakeChunkOps;

const TimePoint kT0{std::chrono::hours(1000)};

// The seed's 8B q8 geometry: 64 KiB/token, 16 tokens → 1 MiB blocks, 2 per 2 MiB chunk.
KvGeometry seed_geometry() {
  return make_geometry({.bytes_per_token = 64 * kKiB, .tokens_per_block = 16, .page_bytes = 2 * kMiB}).value();
}

class KvAllocatorTest : public ::testing::Test {
 protected:
  explicit KvAllocatorTest(Config cfg = {}) : alloc_(ops_, cfg) {}

  ArenaId arena(uint64_t model = 1, uint32_t uid = 1000, uint32_t max_chunks = 16) {
    ArenaId a = alloc_.open_arena(model, uid, g_, max_chunks).value();
    ops_.set_blocks_per_chunk(a, g_.blocks_per_chunk);
    return a;
  }
  SessionId session(ArenaId a, Priority p = Priority::Interactive, TimePoint t = kT0) {
    return alloc_.create_session(a, p, t).value();
  }
  std::vector<BlockId> allocate(SessionId s, uint32_t n, TimePoint t = kT0) {
    std::vector<BlockId> out;
    notices_.clear();
    Status st = alloc_.allocate(s, n, t, out, notices_);
    EXPECT_TRUE(st.ok()) << st.error().message;
    return out;
  }
  std::vector<BlockId> table(SessionId s) { return alloc_.session_info(s).value().table; }
  BlockInfo info(ArenaId a, BlockId b) { return alloc_.block_info(a, b).value(); }
  void audit() {
    Status st = alloc_.audit();
    EXPECT_TRUE(st.ok()) << st.error().message;
    EXPECT_TRUE(ops_.errors.empty()) << ops_.errors.front();
  }
  std::set<std::pair<ArenaId, uint32_t>> chunks(std::initializer_list<std::pair<ArenaId, uint32_t>> l) { return l; }

  KvGeometry g_ = seed_geometry();
  FakeChunkOps ops_;
  Allocator alloc_;
  std::vector<EvictionNotice> notices_;
};

// A block lost in the middle of a sequence is refilled at its own index:
// the table keeps the client's indices, so the length and commit checks
// (which count tokens_per_block positions per index) hold for it.
TEST_F(KvAllocatorTest, AllocateAtRefillsAHoleInPlace) {
  const ArenaId a = arena();
  const SessionId s = session(a);
  EXPECT_EQ(allocate(s, 3), (std::vector<BlockId>{0, 1, 2}));
  ASSERT_TRUE(alloc_.set_length(s, 40, kT0).ok());  // 2.5 blocks
  ASSERT_TRUE(alloc_.free(s, std::vector<BlockId>{1}, kT0).ok());
  EXPECT_EQ(table(s), (std::vector<BlockId>{0, kNoBlock, 2}));
  BlockId b = kNoBlock;
  ASSERT_TRUE(alloc_.allocate_at(s, 1, kT0, b, notices_).ok());
  EXPECT_EQ(b, 1u);  // the freed block, the first free one of the session's chunks
  EXPECT_EQ(table(s), (std::vector<BlockId>{0, 1, 2}));
  EXPECT_EQ(alloc_.session_info(s).value().blocks, 3u);
  EXPECT_EQ(alloc_.session_info(s).value().length, 40u);
  // Full below the length at its index: it can be published again.
  EXPECT_EQ(alloc_.commit(s, std::vector<BlockId>{b}, std::vector<uint64_t>{77}, kT0).value(), 1u);
  // Only a hole or the end: an index holding a block, or past the end, is
  // refused and changes nothing.
  BlockId c = kNoBlock;
  EXPECT_EQ(alloc_.allocate_at(s, 1, kT0, c, notices_).error().code, EINVAL);
  EXPECT_EQ(alloc_.allocate_at(s, 4, kT0, c, notices_).error().code, EINVAL);
  EXPECT_EQ(c, kNoBlock);
  EXPECT_EQ(table(s), (std::vector<BlockId>{0, 1, 2}));
  // The end is an append.
  ASSERT_TRUE(alloc_.allocate_at(s, 3, kT0, c, notices_).ok());
  EXPECT_EQ(table(s), (std::vector<BlockId>{0, 1, 2, c}));
  EXPECT_EQ(alloc_.allocate_at(SessionId{999}, 0, kT0, c, notices_).error().code, ENOENT);
  audit();
}

TEST_F(KvAllocatorTest, AllocateFreeCloseAccounting) {
  const ArenaId a = arena();
  const SessionId s = session(a);
  EXPECT_EQ(allocate(s, 3), (std::vector<BlockId>{0, 1, 2}));
  EXPECT_EQ(ops_.ledger, chunks({{a, 0}, {a, 1}}));
  ASSERT_TRUE(alloc_.set_length(s, 40, kT0).ok());  // 2.5 blocks
  KvStats st = alloc_.arena_stats(a).value();
  EXPECT_EQ(st.committed_bytes, 4 * kMiB);
  EXPECT_EQ(st.used_bytes, 3 * kMiB);
  EXPECT_EQ(st.free_bytes, 1 * kMiB);
  EXPECT_EQ(st.cached_bytes, 0u);
  EXPECT_EQ(st.unfilled_bytes, 8 * 64 * kKiB);  // 8 empty token slots in the last block
  EXPECT_EQ(st.waste_bytes(), 1 * kMiB + 512 * kKiB);
  audit();

  // Freeing the tail empties chunk 1: kept as the session's one spare.
  ASSERT_TRUE(alloc_.free(s, std::vector<BlockId>{2}, kT0).ok());
  EXPECT_EQ(table(s), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(alloc_.session_info(s).value().length, 32u);  // clamped to what the table can hold
  EXPECT_EQ(ops_.ledger, chunks({{a, 0}, {a, 1}}));
  // Freeing the rest empties chunk 0 too: a second spare is not kept.
  ASSERT_TRUE(alloc_.free(s, std::vector<BlockId>{1, 0}, kT0).ok());
  EXPECT_EQ(ops_.ledger.size(), 1u);
  EXPECT_TRUE(table(s).empty());
  audit();
  // Allocating again reuses the spare without committing.
  const uint64_t commits = ops_.commits;
  EXPECT_EQ(allocate(s, 2).size(), 2u);
  EXPECT_EQ(ops_.commits, commits);
  ASSERT_TRUE(alloc_.close(s, kT0).ok());
  EXPECT_TRUE(ops_.ledger.empty());
  EXPECT_EQ(alloc_.arena_stats(a).value().committed_bytes, 0u);
  EXPECT_EQ(alloc_.close(s, kT0).error().code, ENOENT);
  audit();
}

TEST_F(KvAllocatorTest, OwnChunksFirstAndWholeChunkRelease) {
  const ArenaId a = arena();
  const SessionId s1 = session(a), s2 = session(a);
  EXPECT_EQ(allocate(s1, 1), (std::vector<BlockId>{0}));
  // s2 does not take s1's free block 1: it commits its own chunk.
  EXPECT_EQ(allocate(s2, 1), (std::vector<BlockId>{2}));
  EXPECT_EQ(allocate(s1, 1), (std::vector<BlockId>{1}));
  EXPECT_EQ(allocate(s2, 2), (std::vector<BlockId>{3, 4}));
  EXPECT_EQ(alloc_.session_info(s1).value().owned_chunks, 1u);
  EXPECT_EQ(alloc_.session_info(s2).value().owned_chunks, 2u);
  ASSERT_TRUE(alloc_.close(s1, kT0).ok());
  EXPECT_EQ(ops_.ledger, chunks({{a, 1}, {a, 2}}));  // chunk 0 went back whole
  audit();
}

TEST_F(KvAllocatorTest, OtherFreeBlocksWhenArenaIsFull) {
  const ArenaId a = arena(1, 1000, 2);
  const SessionId s1 = session(a), s2 = session(a), s3 = session(a);
  allocate(s1, 1);
  allocate(s2, 1);
  auto got = allocate(s3, 2);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<BlockId>{1, 3}));
  EXPECT_EQ(alloc_.session_info(s3).value().owned_chunks, 0u);
  // Closing s1 keeps chunk 0 (s3 holds block 1), now without an owner.
  ASSERT_TRUE(alloc_.close(s1, kT0).ok());
  EXPECT_EQ(ops_.ledger.size(), 2u);
  ASSERT_TRUE(alloc_.free(s3, std::vector<BlockId>{1}, kT0).ok());
  EXPECT_EQ(ops_.ledger, chunks({{a, 1}}));
  audit();
}

TEST_F(KvAllocatorTest, PoolExhaustedSaysWhatIsMissingAndChangesNothing) {
  const ArenaId a = arena(1, 1000, 2);
  const SessionId s1 = session(a), s2 = session(a);
  allocate(s1, 3);
  const KvStats before = alloc_.arena_stats(a).value();
  std::vector<BlockId> out;
  Status st = alloc_.allocate(s2, 3, kT0, out, notices_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ENOMEM);
  EXPECT_NE(st.error().message.find("pool exhausted: 3 blocks requested, 2 missing (2 MiB of 1 MiB blocks)"),
            std::string::npos)
      << st.error().message;
  EXPECT_NE(st.error().message.find("arena full"), std::string::npos) << st.error().message;
  EXPECT_TRUE(out.empty());
  EXPECT_TRUE(table(s2).empty());
  const KvStats after = alloc_.arena_stats(a).value();
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  EXPECT_EQ(after.free_bytes, before.free_bytes);
  audit();
}

TEST_F(KvAllocatorTest, CommitFailureFallsThroughAndIsReported) {
  const ArenaId a = arena(1, 1000, 8);
  const SessionId s1 = session(a), s2 = session(a);
  allocate(s1, 1);
  ops_.fail_commits = true;
  EXPECT_EQ(allocate(s2, 1), (std::vector<BlockId>{1}));  // s1's free block
  std::vector<BlockId> out;
  Status st = alloc_.allocate(s2, 1, kT0, out, notices_);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("pool: fake pool"), std::string::npos) << st.error().message;
  audit();
}

TEST_F(KvAllocatorTest, CommitFailureReleasesSparesOfOtherArenasAndRetries) {
  ops_.pool_chunks_ = 2;
  const ArenaId a = arena(1, 1000), b = arena(1, 1001);
  const SessionId s1 = session(a), s2 = session(b);
  allocate(s1, 2);  // chunk 0 of a
  ASSERT_TRUE(alloc_.free(s1, std::vector<BlockId>{0, 1}, kT0).ok());  // a spare
  allocate(s2, 2);  // chunk 0 of b: the pool is now full
  EXPECT_EQ(ops_.ledger.size(), 2u);
  EXPECT_EQ(allocate(s2, 1), (std::vector<BlockId>{2}));  // a's spare was released to make room
  EXPECT_EQ(ops_.ledger, chunks({{b, 0}, {b, 1}}));
  audit();
}

// Found by the randomized test: a failed commit trims spares of the same
// arena, which changes which chunk is next; the allocator must choose again
// rather than commit a chunk it still lists as released.
TEST_F(KvAllocatorTest, CommitRetryAfterTrimChoosesAgain) {
  ops_.pool_chunks_ = 2;
  const ArenaId a = arena(1, 1000), b = arena(1, 1001);
  const SessionId s1 = session(a), s2 = session(b), s3 = session(a);
  allocate(s1, 4);                                                   // chunks 0, 1
  ASSERT_TRUE(alloc_.free(s1, std::vector<BlockId>{3, 2}, kT0).ok());  // chunk 1: s1's spare
  ASSERT_TRUE(alloc_.free(s1, std::vector<BlockId>{1, 0}, kT0).ok());  // chunk 0: released
  allocate(s2, 2);                                                   // pool full
  EXPECT_EQ(allocate(s3, 2).size(), 2u);
  EXPECT_EQ(ops_.ledger, chunks({{a, 1}, {b, 0}}));
  audit();
  // Pool full, no spares, only active interactive KV: a clear failure.
  std::vector<BlockId> out;
  Status st = alloc_.allocate(s1, 1, kT0, out, notices_);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("pool: fake pool: 2 of 2 chunks in use"), std::string::npos) << st.error().message;
  audit();
}

TEST_F(KvAllocatorTest, PrefixCommitMatchRefcountsAndCache) {
  const ArenaId a = arena();
  const SessionId s1 = session(a), s2 = session(a);
  allocate(s1, 3);
  ASSERT_TRUE(alloc_.set_length(s1, 40, kT0).ok());
  const std::vector<uint64_t> h = {0x1111, 0x2222, 0x3333};
  // Block 2 is not full: nothing is committed.
  auto bad = alloc_.commit(s1, std::vector<BlockId>{0, 1, 2}, h, kT0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not full"), std::string::npos);
  EXPECT_FALSE(info(a, 0).published);
  EXPECT_EQ(alloc_.commit(s1, std::vector<BlockId>{0, 1}, std::vector<uint64_t>{h[0], h[1]}, kT0).value(), 2u);
  EXPECT_EQ(alloc_.commit(s1, std::vector<BlockId>{0}, std::vector<uint64_t>{h[0]}, kT0).value(), 0u);  // idempotent
  EXPECT_EQ(alloc_.commit(s1, std::vector<BlockId>{0}, std::vector<uint64_t>{h[2]}, kT0).error().code, EINVAL);

  std::vector<BlockId> m;
  ASSERT_TRUE(alloc_.match_prefix(s2, h, kT0, m).ok());
  EXPECT_EQ(m, (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(table(s2), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(info(a, 0).refcount, 2u);
  EXPECT_EQ(info(a, 1).refcount, 2u);
  EXPECT_EQ(info(a, 2).refcount, 1u);
  EXPECT_EQ(alloc_.arena_stats(a).value().shared_blocks, 2u);
  EXPECT_EQ(alloc_.session_info(s2).value().shared, 2u);
  // Sharing costs nothing: still 3 blocks used.
  EXPECT_EQ(alloc_.arena_stats(a).value().used_bytes, 3 * kMiB);
  audit();

  ASSERT_TRUE(alloc_.close(s1, kT0 + 1s).ok());
  EXPECT_EQ(info(a, 0).refcount, 1u);
  EXPECT_EQ(info(a, 2).state, BlockState::Uncommitted);  // its chunk lost its owner and emptied: released
  ASSERT_TRUE(alloc_.close(s2, kT0 + 2s).ok());
  EXPECT_EQ(info(a, 0).state, BlockState::Cached);
  EXPECT_EQ(info(a, 1).state, BlockState::Cached);
  EXPECT_EQ(alloc_.arena_stats(a).value().cached_bytes, 2 * kMiB);
  EXPECT_EQ(ops_.ledger, chunks({{a, 0}}));  // chunk 1 (block 2) released, chunk 0 kept by the cache
  audit();

  const SessionId s3 = session(a);
  ASSERT_TRUE(alloc_.match_prefix(s3, h, kT0 + 3s, m).ok());
  EXPECT_EQ(m, (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(info(a, 0).state, BlockState::Held);
  EXPECT_EQ(alloc_.arena_stats(a).value().cached_bytes, 0u);
  // A second match on the same table does not take the blocks twice.
  ASSERT_TRUE(alloc_.match_prefix(s3, h, kT0 + 3s, m).ok());
  EXPECT_TRUE(m.empty());
  audit();
}

TEST_F(KvAllocatorTest, CopyOnWrite) {
  const ArenaId a = arena();
  const SessionId s1 = session(a), s2 = session(a);
  allocate(s1, 2);
  ops_.mem[{a, 0}] = 0xAAAA;
  ops_.mem[{a, 1}] = 0xBBBB;
  ASSERT_TRUE(alloc_.set_length(s1, 32, kT0).ok());
  ASSERT_TRUE(alloc_.commit(s1, std::vector<BlockId>{0, 1}, std::vector<uint64_t>{7, 8}, kT0).ok());
  std::vector<BlockId> m;
  ASSERT_TRUE(alloc_.match_prefix(s2, std::vector<uint64_t>{7, 8}, kT0, m).ok());

  auto w = alloc_.prepare_write(s2, 1, kT0, notices_);
  ASSERT_TRUE(w.ok()) << w.error().message;
  const BlockId priv = w.value();
  EXPECT_NE(priv, 1u);
  ASSERT_EQ(ops_.copies.size(), 1u);
  EXPECT_EQ(ops_.copies[0], std::make_pair(BlockId{1}, priv));
  EXPECT_EQ(ops_.mem[std::make_pair(a, priv)], 0xBBBBu);
  EXPECT_EQ(table(s2), (std::vector<BlockId>{0, priv}));
  EXPECT_EQ(info(a, 1).refcount, 1u);
  EXPECT_EQ(info(a, priv).refcount, 1u);
  EXPECT_FALSE(info(a, priv).published);
  audit();

  // s1 alone holds block 1 now: writing needs no copy, but unpublishes it.
  EXPECT_EQ(alloc_.prepare_write(s1, 1, kT0, notices_).value(), 1u);
  EXPECT_EQ(ops_.copies.size(), 1u);
  EXPECT_FALSE(info(a, 1).published);
  const SessionId s3 = session(a);
  ASSERT_TRUE(alloc_.match_prefix(s3, std::vector<uint64_t>{7, 8}, kT0, m).ok());
  EXPECT_EQ(m, (std::vector<BlockId>{0}));
  EXPECT_EQ(alloc_.prepare_write(s3, 1, kT0, notices_).error().code, EPERM);
  audit();
}

TEST_F(KvAllocatorTest, CachedBlocksAreDroppedLruWhenMemoryIsNeeded) {
  const ArenaId a = arena(1, 1000, 2);
  const SessionId s1 = session(a);
  allocate(s1, 4);
  ASSERT_TRUE(alloc_.set_length(s1, 64, kT0).ok());
  ASSERT_TRUE(alloc_.commit(s1, std::vector<BlockId>{0, 1, 2, 3}, std::vector<uint64_t>{1, 2, 3, 4}, kT0).ok());
  ASSERT_TRUE(alloc_.close(s1, kT0).ok());
  EXPECT_EQ(alloc_.arena_stats(a).value().cached_bytes, 4 * kMiB);
  const SessionId s2 = session(a);
  // The arena is full of cached blocks; the tail of the chain (freed first,
  // so least recently used) goes first: a prefix without its parent is useless.
  auto got = allocate(s2, 2);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<BlockId>{2, 3}));
  EXPECT_TRUE(notices_.empty());  // nobody held them
  const SessionId s3 = session(a);
  std::vector<BlockId> m;
  ASSERT_TRUE(alloc_.match_prefix(s3, std::vector<uint64_t>{1, 2, 3, 4}, kT0, m).ok());
  EXPECT_EQ(m, (std::vector<BlockId>{0, 1}));
  audit();
}

// Every published block freed for memory is offered to the spill
// tier first, while its chunk is still committed; the notice says which.
TEST_F(KvAllocatorTest, EvictedPublishedBlocksAreOfferedToTheSpillTier) {
  const ArenaId a = arena(1, 1000, 2);  // 4 blocks
  const SessionId bg = session(a, Priority::Background);
  allocate(bg, 3);
  ASSERT_TRUE(alloc_.set_length(bg, 48, kT0).ok());
  ASSERT_TRUE(alloc_.commit(bg, std::vector<BlockId>{0, 1}, std::vector<uint64_t>{11, 12}, kT0).ok());  // 2 stays private
  const SessionId fg = session(a, Priority::Interactive);
  allocate(fg, 4);
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_EQ(notices_[0].blocks, (std::vector<BlockId>{2, 1, 0}));
  EXPECT_EQ(notices_[0].spilled, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(ops_.spills, (std::vector<FakeChunkOps::Spill>{{a, 1, 12}, {a, 0, 11}}));
  audit();

  // A tier that does not keep them: the notice says so.
  ops_.keep_spills = false;
  ops_.spills.clear();
  ASSERT_TRUE(alloc_.close(fg, kT0).ok());
  const SessionId bg2 = session(a, Priority::Background);
  allocate(bg2, 1);
  ASSERT_TRUE(alloc_.set_length(bg2, 16, kT0).ok());
  ASSERT_TRUE(alloc_.commit(bg2, table(bg2), std::vector<uint64_t>{13}, kT0).ok());
  const SessionId fg2 = session(a, Priority::Interactive);
  allocate(fg2, 4);
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_EQ(notices_[0].spilled, (std::vector<uint8_t>{0}));
  EXPECT_EQ(ops_.spills.size(), 1u);
  audit();
}

TEST_F(KvAllocatorTest, CachedDropsAndClosedArenasAreOfferedAndRestoredBlocksPublish) {
  const ArenaId a = arena(1, 1000, 2);
  const SessionId s1 = session(a);
  allocate(s1, 2);
  ASSERT_TRUE(alloc_.set_length(s1, 32, kT0).ok());
  ASSERT_TRUE(alloc_.commit(s1, std::vector<BlockId>{0, 1}, std::vector<uint64_t>{21, 22}, kT0).ok());
  ASSERT_TRUE(alloc_.close(s1, kT0).ok());
  const SessionId s2 = session(a);
  allocate(s2, 4);  // both cached blocks are dropped for memory
  EXPECT_TRUE(notices_.empty());
  ASSERT_EQ(ops_.spills.size(), 2u);
  std::set<uint64_t> spilled{ops_.spills[0].hash, ops_.spills[1].hash};
  EXPECT_EQ(spilled, (std::set<uint64_t>{21, 22}));

  // Restored bytes publish without the length check commit makes.
  const auto t = table(s2);
  EXPECT_FALSE(alloc_.commit(s2, std::vector<BlockId>{t[0]}, std::vector<uint64_t>{31}, kT0).ok());
  EXPECT_EQ(alloc_.publish_restored(s2, std::vector<BlockId>{t[0]}, std::vector<uint64_t>{31}).value(), 1u);
  EXPECT_EQ(alloc_.publish_restored(s2, std::vector<BlockId>{t[1]}, std::vector<uint64_t>{31}).value(), 0u);  // taken
  EXPECT_EQ(alloc_.publish_restored(s2, std::vector<BlockId>{t[0], t[0]}, std::vector<uint64_t>{1, 2}).error().code, EINVAL);
  EXPECT_TRUE(info(a, t[0]).published);
  using P = std::pair<BlockId, uint64_t>;
  EXPECT_EQ(alloc_.published(a), (std::vector<P>{{t[0], 31}}));
  audit();

  // Closing the arena (the model unloaded) offers its cached blocks too.
  ASSERT_TRUE(alloc_.close(s2, kT0).ok());
  ops_.spills.clear();
  ASSERT_TRUE(alloc_.close_arena(a).ok());
  EXPECT_EQ(ops_.spills, (std::vector<FakeChunkOps::Spill>{{a, t[0], 31}}));
  EXPECT_TRUE(ops_.errors.empty());
}

TEST_F(KvAllocatorTest, UidsNeverShare) {
  const ArenaId a = arena(1, 1000), b = arena(1, 1001);
  EXPECT_NE(a, b);
  EXPECT_EQ(alloc_.open_arena(1, 1000, g_, 16).value(), a);
  EXPECT_EQ(alloc_.open_arena(1, 1000, g_, 8).error().code, EINVAL);
  const SessionId s1 = session(a), s2 = session(b);
  allocate(s1, 1);
  ASSERT_TRUE(alloc_.set_length(s1, 16, kT0).ok());
  ASSERT_TRUE(alloc_.commit(s1, std::vector<BlockId>{0}, std::vector<uint64_t>{42}, kT0).ok());
  std::vector<BlockId> m;
  ASSERT_TRUE(alloc_.match_prefix(s2, std::vector<uint64_t>{42}, kT0, m).ok());
  EXPECT_TRUE(m.empty());
  allocate(s2, 1);  // block 0 of its own arena
  EXPECT_EQ(table(s2), (std::vector<BlockId>{0}));
  // Same id, different arena: s1 cannot free or write s2's block 0 — its own block 0 is a different one.
  ASSERT_TRUE(alloc_.free(s1, std::vector<BlockId>{0}, kT0).ok());
  EXPECT_EQ(table(s2), (std::vector<BlockId>{0}));
  EXPECT_EQ(info(b, 0).refcount, 1u);
  EXPECT_EQ(info(a, 0).state, BlockState::Cached);
  audit();
}

// The pool share of a uid's KV is checked against this one count: every
// committed chunk of every arena of the uid, and nothing of another uid's.
TEST_F(KvAllocatorTest, CommittedBytesOfUidCountsEveryArenaOfTheUid) {
  const ArenaId a = arena(1, 1000), b = arena(2, 1000), c = arena(1, 1001);
  EXPECT_EQ(alloc_.committed_bytes_of_uid(1000), 0u);
  const SessionId sa = session(a), sb = session(b), sc = session(c);
  allocate(sa, 3);  // 2 chunks
  allocate(sb, 1);  // 1 chunk
  allocate(sc, 1);  // 1 chunk, another uid
  EXPECT_EQ(alloc_.committed_bytes_of_uid(1000), 3 * g_.chunk_bytes);
  EXPECT_EQ(alloc_.committed_bytes_of_uid(1001), 1 * g_.chunk_bytes);
  ASSERT_TRUE(alloc_.close(sb, kT0).ok());
  ASSERT_TRUE(alloc_.close_arena(b).ok());
  EXPECT_EQ(alloc_.committed_bytes_of_uid(1000), 2 * g_.chunk_bytes);
  EXPECT_EQ(alloc_.committed_bytes_of_uid(4242), 0u);
  audit();
}

TEST_F(KvAllocatorTest, HostileIdsAreErrorsAndChangeNothing) {
  const ArenaId a = arena();
  const SessionId s1 = session(a), s2 = session(a);
  allocate(s1, 2);
  allocate(s2, 2);  // blocks 2, 3
  const std::vector<BlockId> evil[] = {{999999}, {kNoBlock}, {2}, {0, 2}, {0, 0}, {1, 5}};
  for (const auto& list : evil) {
    Status st = alloc_.free(s1, list, kT0);
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(st.error().code == EPERM || st.error().code == EINVAL) << st.error().message;
  }
  EXPECT_EQ(table(s1), (std::vector<BlockId>{0, 1}));
  for (const SessionId bogus : {SessionId{0}, SessionId{12345}, s1 + (uint64_t{1} << 32), ~SessionId{0}}) {
    std::vector<BlockId> out;
    EXPECT_EQ(alloc_.allocate(bogus, 1, kT0, out, notices_).error().code, ENOENT);
    EXPECT_EQ(alloc_.free(bogus, std::vector<BlockId>{0}, kT0).error().code, ENOENT);
    EXPECT_EQ(alloc_.set_length(bogus, 1, kT0).error().code, ENOENT);
    EXPECT_EQ(alloc_.commit(bogus, std::vector<BlockId>{0}, std::vector<uint64_t>{1}, kT0).error().code, ENOENT);
    EXPECT_EQ(alloc_.match_prefix(bogus, std::vector<uint64_t>{1}, kT0, out).error().code, ENOENT);
    EXPECT_EQ(alloc_.prepare_write(bogus, 0, kT0, notices_).error().code, ENOENT);
    EXPECT_EQ(alloc_.close(bogus, kT0).error().code, ENOENT);
    EXPECT_EQ(alloc_.evict({policy::ActionKind::EvictBlocks, bogus, 1, 0, ""}, kT0, notices_).error().code, ENOENT);
  }
  EXPECT_EQ(alloc_.prepare_write(s1, 3, kT0, notices_).error().code, EPERM);
  EXPECT_EQ(alloc_.prepare_write(s1, kNoBlock, kT0, notices_).error().code, EPERM);
  EXPECT_EQ(alloc_.commit(s1, std::vector<BlockId>{3}, std::vector<uint64_t>{1}, kT0).error().code, EPERM);
  EXPECT_EQ(alloc_.commit(s1, std::vector<BlockId>{0}, std::vector<uint64_t>{}, kT0).error().code, EINVAL);
  EXPECT_EQ(alloc_.set_length(s1, 33, kT0).error().code, EINVAL);
  EXPECT_EQ(alloc_.evict({policy::ActionKind::EvictModel, 1, 1, 0, ""}, kT0, notices_).error().code, EINVAL);
  EXPECT_EQ(alloc_.evict({policy::ActionKind::DropCached, 77, 1, 0, ""}, kT0, notices_).error().code, ENOENT);
  EXPECT_EQ(alloc_.evict({policy::ActionKind::DropCached, uint64_t{1} << 40, 1, 0, ""}, kT0, notices_).error().code, ENOENT);
  EXPECT_EQ(alloc_.create_session(99, Priority::Interactive, kT0).error().code, ENOENT);
  EXPECT_EQ(alloc_.create_session(a, static_cast<Priority>(7), kT0).error().code, EINVAL);
  EXPECT_EQ(alloc_.block_info(a, 32).error().code, EINVAL);
  std::vector<BlockId> out;
  EXPECT_EQ(alloc_.allocate(s1, UINT32_MAX, kT0, out, notices_).error().code, EINVAL);
  EXPECT_EQ(table(s2), (std::vector<BlockId>{2, 3}));
  audit();
}

class KvQuotaTest : public KvAllocatorTest {
 protected:
  KvQuotaTest() : KvAllocatorTest(Config{.max_sessions_per_uid = 2, .max_blocks_per_uid = 4}) {}
};

TEST_F(KvQuotaTest, SessionsAndBlocksAtNPlusOne) {
  const ArenaId a = arena(1, 1000), a2 = arena(2, 1000), other = arena(1, 1001);
  const SessionId s1 = session(a), s2 = session(a2);
  auto third = alloc_.create_session(a, Priority::Interactive, kT0);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code, EDQUOT);
  EXPECT_NE(third.error().message.find("uid 1000"), std::string::npos);
  EXPECT_NE(third.error().message.find("max_sessions_per_uid = 2"), std::string::npos) << third.error().message;
  EXPECT_TRUE(alloc_.create_session(other, Priority::Interactive, kT0).ok());  // another uid has its own quota

  allocate(s1, 3);
  allocate(s2, 1);  // 4 blocks over two arenas of uid 1000
  std::vector<BlockId> out;
  Status st = alloc_.allocate(s1, 1, kT0, out, notices_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, EDQUOT);
  EXPECT_NE(st.error().message.find("max_blocks_per_uid = 4"), std::string::npos) << st.error().message;
  // Matching cached blocks counts too; matching blocks already held does not.
  ASSERT_TRUE(alloc_.set_length(s1, 48, kT0).ok());
  ASSERT_TRUE(alloc_.commit(s1, table(s1), std::vector<uint64_t>{1, 2, 3}, kT0).ok());
  ASSERT_TRUE(alloc_.close(s2, kT0).ok());
  const SessionId s3 = session(a);
  ASSERT_TRUE(alloc_.match_prefix(s3, std::vector<uint64_t>{1, 2, 3}, kT0, out).ok());
  EXPECT_EQ(out.size(), 3u);
  allocate(s3, 1);
  EXPECT_EQ(alloc_.allocate(s3, 1, kT0, out, notices_).error().code, EDQUOT);
  // COW of a shared block needs one more block: over quota.
  EXPECT_EQ(alloc_.prepare_write(s3, 0, kT0, notices_).error().code, EDQUOT);
  ASSERT_TRUE(alloc_.close(s1, kT0).ok());
  const SessionId s4 = session(a);
  EXPECT_EQ(alloc_.create_session(a, Priority::Interactive, kT0).error().code, EDQUOT);
  (void)s4;
  audit();
}

TEST_F(KvAllocatorTest, EvictionOrderEndToEnd) {
  const ArenaId a = arena(1, 1000, 4);  // 8 blocks
  const SessionId bg = session(a, Priority::Background, kT0);
  const SessionId sys = session(a, Priority::System, kT0);
  const SessionId idle = session(a, Priority::Interactive, kT0);
  EXPECT_EQ(allocate(bg, 3, kT0), (std::vector<BlockId>{0, 1, 2}));
  ASSERT_TRUE(alloc_.set_length(bg, 40, kT0).ok());
  EXPECT_EQ(allocate(sys, 2, kT0), (std::vector<BlockId>{4, 5}));
  ASSERT_TRUE(alloc_.set_length(sys, 20, kT0).ok());  // block 5 holds 4 of 16
  EXPECT_EQ(allocate(idle, 1, kT0), (std::vector<BlockId>{6}));
  const TimePoint later = kT0 + 10min;
  const SessionId me = session(a, Priority::Interactive, later);
  // Free: 3 and 7. Then background (partial block 2 first, then 1, 0), then
  // system's partial tail block 5. The idle interactive session is not needed.
  auto got = allocate(me, 6, later);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<BlockId>{0, 1, 2, 3, 5, 7}));
  ASSERT_EQ(notices_.size(), 3u);
  EXPECT_EQ(notices_[0].session, bg);
  EXPECT_EQ(notices_[0].blocks, (std::vector<BlockId>{2}));
  EXPECT_EQ(notices_[0].indices, (std::vector<uint32_t>{2}));
  EXPECT_NE(notices_[0].reason.find("background KV, partial blocks"), std::string::npos) << notices_[0].reason;
  EXPECT_EQ(notices_[1].session, bg);
  EXPECT_EQ(notices_[1].blocks, (std::vector<BlockId>{1, 0}));
  EXPECT_EQ(notices_[1].indices, (std::vector<uint32_t>{1, 0}));
  EXPECT_EQ(notices_[2].session, sys);
  EXPECT_EQ(notices_[2].blocks, (std::vector<BlockId>{5}));
  EXPECT_TRUE(table(bg).empty());
  EXPECT_EQ(alloc_.session_info(bg).value().length, 0u);
  EXPECT_EQ(table(sys), (std::vector<BlockId>{4}));
  EXPECT_EQ(table(idle), (std::vector<BlockId>{6}));
  audit();

  // Next: system's last block, then the idle interactive session; never `me`'s
  // peer that is active.
  const SessionId active = session(a, Priority::Interactive, later);
  std::vector<BlockId> out;
  ASSERT_TRUE(alloc_.allocate(me, 2, later, out, notices_ = {}).ok());
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<BlockId>{4, 6}));
  ASSERT_EQ(notices_.size(), 2u);
  EXPECT_NE(notices_[1].reason.find("interactive KV idle 600 s"), std::string::npos) << notices_[1].reason;
  // `active` has nothing and `me` has everything: `active` cannot evict an
  // active interactive session.
  Status st = alloc_.allocate(active, 1, later, out, notices_);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ENOMEM);
  EXPECT_NE(st.error().message.find("1 missing (1 MiB"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("active interactive"), std::string::npos) << st.error().message;
  // A background session never evicts anyone.
  const SessionId bg2 = session(a, Priority::Background, later);
  EXPECT_EQ(alloc_.allocate(bg2, 1, later, out, notices_).error().code, ENOMEM);
  audit();
}

// Measured access rates (libairs' KV sampling) rank a priority level
// before last use, while they are current: two background sessions fill
// the arena, the older one is read (rated) and the newer one is not, and an
// interactive allocation takes the newer one's blocks. Once the rates run
// out, last use decides again: the older one goes.
TEST_F(KvAllocatorTest, AccessRatesRankALevelWhileTheyAreCurrent) {
  const ArenaId a = arena(1, 1000, 2);  // 2 chunks, 4 blocks
  const SessionId read = session(a, Priority::Background, kT0);
  const SessionId idle = session(a, Priority::Background, kT0 + 1s);
  const auto read_blocks = allocate(read, 2, kT0);
  const auto idle_blocks = allocate(idle, 2, kT0 + 1s);
  const SessionId req = session(a, Priority::Interactive, kT0 + 2s);

  // A share that is not one is refused and changes nothing.
  EXPECT_EQ(alloc_.rate_access(read, -0.1, kT0 + 2s, 10s).error().code, EINVAL);
  EXPECT_EQ(alloc_.rate_access(read, 1.5, kT0 + 2s, 10s).error().code, EINVAL);
  EXPECT_EQ(alloc_.rate_access(read, std::nan(""), kT0 + 2s, 10s).error().code, EINVAL);
  EXPECT_FALSE(alloc_.session_info(read).value().access_rate.has_value());

  ASSERT_TRUE(alloc_.rate_access(read, 0.8, kT0 + 2s, 10s).ok());
  ASSERT_TRUE(alloc_.rate_access(idle, 0.0, kT0 + 2s, 10s).ok());
  // An average over time: after 1 s, what was measured before weighs
  // 2^-0.5 (half every 2 s), so 0.8 and then 0 is about 0.57, above 0.
  ASSERT_TRUE(alloc_.rate_access(read, 0.0, kT0 + 3s, 10s).ok());
  policy::PoolState ps = alloc_.snapshot(kT0 + 3s);
  ASSERT_EQ(ps.sessions.size(), 3u);
  for (const auto& st : ps.sessions) {
    if (st.id == read) {
      ASSERT_TRUE(st.access_rate.has_value());
      EXPECT_DOUBLE_EQ(*st.access_rate, 0.8 * std::exp2(-0.5));
    } else if (st.id == idle) {
      EXPECT_EQ(st.access_rate, std::optional<double>(0.0));
    } else {
      EXPECT_FALSE(st.access_rate.has_value()) << "a session nobody measured has no rate";
    }
  }

  // Room for one block: the idle session's go, though it was used later.
  auto got = allocate(req, 1, kT0 + 4s);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(notices_.size(), 1u);
  EXPECT_EQ(notices_[0].session, idle);
  EXPECT_NE(std::find(idle_blocks.begin(), idle_blocks.end(), notices_[0].blocks.at(0)), idle_blocks.end());

  // Past its validity (a client that stopped reporting) a rate is gone,
  // and last use ranks the level: now the older session goes.
  for (const auto& st : alloc_.snapshot(kT0 + 13s).sessions) EXPECT_FALSE(st.access_rate.has_value()) << st.id;
  got = allocate(req, 2, kT0 + 13s);
  ASSERT_EQ(got.size(), 2u);
  bool read_lost = false;
  for (const auto& n : notices_)
    if (n.session == read) read_lost = true;
  EXPECT_TRUE(read_lost) << "without current rates, the least recently used session goes first";
  (void)read_blocks;
  audit();
}

TEST_F(KvAllocatorTest, SnapshotAndPolicyActions) {
  const ArenaId a = arena(1, 1000, 8);
  const SessionId s1 = session(a, Priority::Background, kT0);
  const SessionId s2 = session(a, Priority::System, kT0 + 1s);
  allocate(s1, 5, kT0);
  ASSERT_TRUE(alloc_.set_length(s1, 50, kT0).ok());  // 3 full, 1 partial, 1 empty
  allocate(s2, 2, kT0 + 1s);
  ASSERT_TRUE(alloc_.set_length(s2, 32, kT0 + 1s).ok());
  ASSERT_TRUE(alloc_.commit(s2, table(s2), std::vector<uint64_t>{5, 6}, kT0 + 1s).ok());
  std::vector<BlockId> m;
  ASSERT_TRUE(alloc_.match_prefix(s1, std::vector<uint64_t>{5}, kT0, m).ok());  // s1 shares s2's block
  ASSERT_TRUE(alloc_.close(s2, kT0 + 2s).ok());  // block 7 (hash 6) is cached now

  policy::PoolState ps = alloc_.snapshot(kT0 + 3s);
  ASSERT_EQ(ps.sessions.size(), 1u);
  EXPECT_EQ(ps.sessions[0].id, s1);
  EXPECT_EQ(ps.sessions[0].blocks, 6u);  // the matched block is s1's alone now
  EXPECT_EQ(ps.sessions[0].partial_blocks, 3u);  // index 3 (2 of 16), 4 (empty), 5 (the match, beyond length)
  EXPECT_EQ(ps.sessions[0].block_bytes, 1 * kMiB);
  ASSERT_EQ(ps.cached.size(), 1u);
  EXPECT_EQ(ps.cached[0].arena_id, a);
  EXPECT_EQ(ps.cached[0].blocks, 1u);
  EXPECT_EQ(ps.cached[0].last_used, kT0 + 2s);
  EXPECT_EQ(ps.total_bytes, 8 * kMiB);

  std::vector<EvictionNotice> notices;
  EXPECT_EQ(alloc_.evict({policy::ActionKind::DropCached, a, 5, 0, "cached"}, kT0, notices).value(), 1u);
  EXPECT_TRUE(notices.empty());
  EXPECT_EQ(alloc_.evict({policy::ActionKind::EvictBlocks, s1, 3, 0, "pressure"}, kT0, notices).value(), 3u);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0].indices, (std::vector<uint32_t>{5, 4, 3}));
  EXPECT_EQ(notices[0].reason, "pressure");
  EXPECT_EQ(alloc_.session_info(s1).value().length, 48u);
  // Evicting frees whole chunks where it can and keeps no spare: chunks 2
  // (blocks 4, 5) and 3 (6, 7) went back; block 3 stays free beside block 2.
  EXPECT_EQ(alloc_.arena_stats(a).value().free_bytes, 1 * kMiB);
  EXPECT_EQ(ops_.ledger, chunks({{a, 0}, {a, 1}}));
  audit();
  EXPECT_EQ(alloc_.trim(), 0u);
}

TEST_F(KvAllocatorTest, TrimReleasesSpares) {
  const ArenaId a = arena();
  const SessionId s = session(a);
  allocate(s, 2);
  ASSERT_TRUE(alloc_.free(s, table(s), kT0).ok());
  EXPECT_EQ(ops_.ledger.size(), 1u);
  EXPECT_EQ(alloc_.total_stats().free_bytes, 2 * kMiB);
  EXPECT_EQ(alloc_.trim(), 1u);
  EXPECT_TRUE(ops_.ledger.empty());
  audit();
}

TEST_F(KvAllocatorTest, CloseArena) {
  const ArenaId a = arena();
  const SessionId s = session(a);
  allocate(s, 1);
  ASSERT_TRUE(alloc_.set_length(s, 16, kT0).ok());
  ASSERT_TRUE(alloc_.commit(s, table(s), std::vector<uint64_t>{1}, kT0).ok());
  EXPECT_EQ(alloc_.close_arena(a).error().code, EBUSY);
  ASSERT_TRUE(alloc_.close(s, kT0).ok());
  EXPECT_EQ(ops_.ledger.size(), 1u);  // held by the cached block
  ASSERT_TRUE(alloc_.close_arena(a).ok());
  EXPECT_TRUE(ops_.ledger.empty());
  EXPECT_EQ(alloc_.create_session(a, Priority::Interactive, kT0).error().code, ENOENT);
  audit();
}

}  // namespace
}  // namespace airs::kv
