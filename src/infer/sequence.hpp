// SPDX-License-Identifier: Apache-2.0
// One token sequence on paged KV blocks: the block table, prefix matching,
// publishing full blocks, and recomputing evicted ones. The blocks come from
// a KvBackend: the daemon's session (infer/airs_backend.hpp) or private
// memory (PrivateKv below) — same calls, same output.
//
// Protocol with the backend (the daemon's KV service):
//  - prefill() first asks match_prefix() for the chained hashes of the
//    prompt's full blocks (all but the block holding the last prompt token,
//    whose logits must be computed) and adopts the matched blocks without
//    computing them; the rest is computed.
//  - A block is allocated when the first position in it is written; when it
//    becomes full it is committed under chain_hash(parent, its token ids).
//  - The prompt is computed in batches (Engine::forward_batch) that end at
//    block boundaries; decode runs one token per step.
//  - The service's length is set after every step to the number of
//    positions whose K/V are in the table: with post_length() (one-way, no
//    round trip) after a decode step that leaves its block partly filled,
//    with set_length() (waits, a refusal seen) after any other step, since
//    a commit follows when a block fills and the refusal is the early
//    sign of an eviction.
//  - Only the last, partly filled block is ever written. After
//    truncate() that block can be one that was matched or committed: the
//    first write into it goes through prepare_write() (copy-on-write), and
//    the copy is published again under its new tokens when full.
//  - recover() reads the eviction notices; each lost block gets a fresh
//    block and its positions are recomputed from the token history (earlier
//    blocks are valid or recomputed first, later ones do not depend on the
//    lost block's storage). Notices are checked again after every step:
//    a step that ran while one of its blocks was taken is repaired and run
//    again, so its logits never come from lost K/V. Blocks taken again while
//    recover() recomputes (pressure goes on) are recomputed again, with
//    every block recomputed after them in the same call. A lost block gets
//    its fresh block at its own table index (allocate_at: a hole in the
//    middle is refilled in place), so it is committed again when full and
//    the service's indices stay the sequence's.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "infer/engine.hpp"
#include "util/result.hpp"

namespace airs::infer {

class KvBackend {
 public:
  virtual ~KvBackend() = default;
  [[nodiscard]] virtual Result<std::vector<uint32_t>> allocate(uint32_t n) = 0;
  // One block at this sequence's table index `index`: a hole (a block lost
  // in the middle) or the end, so the service's index of every block stays
  // the sequence's (airs_session_allocate_at).
  [[nodiscard]] virtual Result<uint32_t> allocate_at(uint32_t index) = 0;
  // Gives this sequence's reference to the blocks back (a block another
  // sequence shares stays readable there).
  [[nodiscard]] virtual Status free(std::span<const uint32_t> ids) = 0;
  [[nodiscard]] virtual std::byte* block_ptr(uint32_t id) = 0;
  [[nodiscard]] virtual Status commit(std::span<const uint32_t> ids, std::span<const uint64_t> hashes) = 0;
  // Ids of the longest cached prefix of `hashes`.
  [[nodiscard]] virtual Result<std::vector<uint32_t>> match_prefix(std::span<const uint64_t> hashes) = 0;
  [[nodiscard]] virtual Result<uint32_t> prepare_write(uint32_t id) = 0;
  [[nodiscard]] virtual Status set_length(uint32_t tokens) = 0;
  // set_length without waiting for the service: applied in order before
  // later calls, a refusal (blocks taken meanwhile) dropped silently (the
  // eviction notice tells). Default: set_length.
  [[nodiscard]] virtual Status post_length(uint32_t tokens) { return set_length(tokens); }
  // Evicted ids since the last call; EOVERFLOW means every block was lost.
  [[nodiscard]] virtual Result<std::vector<uint32_t>> read_notices() = 0;
  // Waits up to timeout_ms for a notice to be pending (true if one is).
  // Used only after the service refused a call in a way only an eviction
  // explains, to catch a notice published after the evicting call returned.
  [[nodiscard]] virtual bool wait_notice(int timeout_ms) = 0;
  [[nodiscard]] virtual uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const = 0;
  // Blocks match_prefix restored from a spill tier so far (0: there is none).
  [[nodiscard]] virtual uint64_t restored_blocks() const { return 0; }
};

// The chained block hash every process agrees on (as airs_kv_chain_hash).
[[nodiscard]] uint64_t kv_chain_hash(uint64_t parent, std::span<const int32_t> tokens) noexcept;

// Blocks in this process's heap; commit/match work among the sequences
// sharing one PrivateKv (a per-process prefix cache). evict() simulates the
// daemon taking blocks back (tests). Not thread-safe.
class PrivateKv final : public KvBackend {
 public:
  explicit PrivateKv(uint64_t block_bytes) : block_bytes_(block_bytes) {}
  Result<std::vector<uint32_t>> allocate(uint32_t n) override;
  Result<uint32_t> allocate_at(uint32_t) override;  // no table here: a new block
  Status free(std::span<const uint32_t> ids) override;  // a published block stays
  std::byte* block_ptr(uint32_t id) override;
  Status commit(std::span<const uint32_t> ids, std::span<const uint64_t> hashes) override;
  Result<std::vector<uint32_t>> match_prefix(std::span<const uint64_t> hashes) override;
  Result<uint32_t> prepare_write(uint32_t id) override;
  Status set_length(uint32_t tokens) override;
  Result<std::vector<uint32_t>> read_notices() override;
  bool wait_notice(int) override { return !notices_.empty(); }
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const override {
    return kv_chain_hash(parent, tokens);
  }
  // Drops block `id` (its bytes are poisoned) and queues a notice.
  void evict(uint32_t id);
  [[nodiscard]] size_t blocks_in_use() const noexcept;
  [[nodiscard]] uint32_t length() const noexcept { return length_; }

 private:
  uint64_t block_bytes_;
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::unordered_map<uint64_t, uint32_t> by_hash_;
  std::vector<uint32_t> notices_;
  uint32_t length_ = 0;
};

class Sequence {
 public:
  // engine and kv must outlive the sequence.
  Sequence(Engine& engine, KvBackend& kv);

  // Appends the prompt (on an empty sequence, with prefix matching) and
  // returns the logits after its last token (valid until the next call).
  // Errors: the backend's (ENOMEM: pool exhausted), EINVAL for a token
  // outside the vocabulary or an empty prompt.
  [[nodiscard]] Result<std::span<const float>> prefill(std::span<const int32_t> tokens);
  // One decode step: appends `token`, returns the logits after it.
  [[nodiscard]] Result<std::span<const float>> append(int32_t token);
  // Drops positions [n, size()) (1 <= n <= size()), so the sequence can
  // continue differently from position n: the blocks after the one holding
  // position n - 1 are freed, and that block, when it is shared (matched or
  // committed), is copied by prepare_write() on the next write into it;
  // the other sequences reading it keep their bytes. EINVAL for n out of
  // range.
  [[nodiscard]] Status truncate(uint32_t n);
  // Handles pending eviction notices (recomputes lost blocks). Call before
  // each step; prefill/append call it too. Returns the blocks recomputed.
  [[nodiscard]] Result<uint32_t> recover();

  [[nodiscard]] uint32_t size() const noexcept { return static_cast<uint32_t>(tokens_.size()); }
  [[nodiscard]] uint32_t matched_tokens() const noexcept { return matched_tokens_; }
  // Of those, the tokens whose KV the daemon restored from its spill tier.
  [[nodiscard]] uint32_t restored_tokens() const noexcept { return restored_tokens_; }
  [[nodiscard]] const std::vector<uint32_t>& block_ids() const noexcept { return ids_; }
  [[nodiscard]] uint32_t recomputed_blocks() const noexcept { return recomputed_; }

 private:
  Status ensure_block(uint32_t pos);
  // Appends `batch` (1..Engine::kMaxBatch tokens) in one forward_batch;
  // logits (if non-null) after its last token.
  Status step(std::span<const int32_t> batch, float* logits);
  Status commit_if_full(uint32_t index);
  Status recompute(uint32_t index, bool tail);

  Engine& engine_;
  KvBackend& kv_;
  uint32_t tpb_;
  std::vector<int32_t> tokens_;
  std::vector<uint32_t> ids_;        // block table: sequence block i -> backend id
  std::vector<std::byte*> ptrs_;     // block_ptr(ids_[i])
  std::vector<uint64_t> hashes_;     // chained hash of each full block
  std::vector<bool> committed_;
  std::vector<float> logits_;
  uint32_t matched_tokens_ = 0;
  uint32_t restored_tokens_ = 0;
  uint32_t recomputed_ = 0;
};

}  // namespace airs::infer
