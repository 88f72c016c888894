// SPDX-License-Identifier: Apache-2.0
// A ChunkOps that keeps a ledger of committed chunks, a pool limit shared by
// all arenas, and fake block contents (one tag per block) so tests can check
// that copies happen and that no held block is ever handed out again.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kv/allocator.hpp"

namespace airs::kv::test {

class FakeChunkOps final : public ChunkOps {
 public:
  explicit FakeChunkOps(uint64_t pool_chunks = UINT64_MAX) : pool_chunks_(pool_chunks) {}

  void set_blocks_per_chunk(ArenaId arena, uint32_t bpc) { bpc_[arena] = bpc; }

  Status commit_chunk(ArenaId arena, uint32_t chunk) override {
    ++commits;
    if (fail_commits || ledger.size() >= pool_chunks_) {
      ++commit_failures;
      return make_error(ENOMEM, "fake pool: {} of {} chunks in use", ledger.size(), pool_chunks_);
    }
    if (!ledger.insert({arena, chunk}).second) errors.push_back("commit of a committed chunk");
    return {};
  }
  void release_chunk(ArenaId arena, uint32_t chunk) override {
    ++releases;
    if (ledger.erase({arena, chunk}) != 1) errors.push_back("release of an uncommitted chunk");
    const uint32_t bpc = bpc_[arena];
    for (uint32_t i = 0; i < bpc; ++i) mem.erase({arena, chunk * bpc + i});
  }
  void copy_block(ArenaId arena, BlockId src, BlockId dst) override {
    copies.push_back({src, dst});
    const uint32_t bpc = bpc_[arena];
    if (!ledger.count({arena, src / bpc}) || !ledger.count({arena, dst / bpc})) errors.push_back("copy outside committed chunks");
    auto it = mem.find({arena, src});
    if (it == mem.end()) mem.erase({arena, dst});
    else mem[{arena, dst}] = it->second;
  }

  // Records the offer; the block must still be committed (its bytes are read now).
  bool spill_block(ArenaId arena, BlockId block, uint64_t hash) override {
    const uint32_t bpc = bpc_[arena];
    if (bpc == 0 || !ledger.count({arena, block / bpc})) errors.push_back("spill of a block outside committed chunks");
    spills.push_back({arena, block, hash});
    return keep_spills;
  }

  struct Spill {
    ArenaId arena;
    BlockId block;
    uint64_t hash;
    friend bool operator==(const Spill&, const Spill&) = default;
  };
  std::vector<Spill> spills;
  bool keep_spills = true;
  std::set<std::pair<ArenaId, uint32_t>> ledger;
  std::map<std::pair<ArenaId, BlockId>, uint64_t> mem;
  std::vector<std::pair<BlockId, BlockId>> copies;
  std::vector<std::string> errors;
  uint64_t commits = 0, commit_failures = 0, releases = 0;
  bool fail_commits = false;
  uint64_t pool_chunks_;

 private:
  std::map<ArenaId, uint32_t> bpc_;
};

}  // namespace airs::kv::test
