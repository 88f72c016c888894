// SPDX-License-Identifier: Apache-2.0
#include "infer/sequence.hpp"

#include <algorithm>
#include <cstring>

#include "util/hash.hpp"

namespace airs::infer {

uint64_t kv_chain_hash(uint64_t parent, std::span<const int32_t> tokens) noexcept {
  // hash(parent || tokens), seed 0: byte for byte what libairs computes.
  std::vector<std::byte> buf(sizeof parent + tokens.size_bytes());
  std::memcpy(buf.data(), &parent, sizeof parent);
  if (!tokens.empty()) std::memcpy(buf.data() + sizeof parent, tokens.data(), tokens.size_bytes());
  return hash_bytes(buf.data(), buf.size(), 0);
}

// ---- PrivateKv ----

Result<std::vector<uint32_t>> PrivateKv::allocate(uint32_t n) {
  std::vector<uint32_t> out;
  for (uint32_t i = 0; i < n; ++i) {
    out.push_back(static_cast<uint32_t>(blocks_.size()));
    blocks_.push_back(std::make_unique<std::byte[]>(block_bytes_));
  }
  return out;
}

Result<uint32_t> PrivateKv::allocate_at(uint32_t) {
  auto ids = allocate(1);
  if (!ids) return std::move(ids).error();
  return (*ids)[0];
}

Status PrivateKv::free(std::span<const uint32_t> ids) {
  for (uint32_t id : ids) {
    if (id >= blocks_.size()) return make_error(EINVAL, "kv: free of unknown block {}", id);
    const bool published =
        std::any_of(by_hash_.begin(), by_hash_.end(), [&](const auto& e) { return e.second == id; });
    if (!published) blocks_[id].reset();
  }
  return {};
}

std::byte* PrivateKv::block_ptr(uint32_t id) {
  return id < blocks_.size() ? blocks_[id].get() : nullptr;
}

Status PrivateKv::commit(std::span<const uint32_t> ids, std::span<const uint64_t> hashes) {
  for (size_t i = 0; i < ids.size() && i < hashes.size(); ++i) by_hash_.insert_or_assign(hashes[i], ids[i]);
  return {};
}

Result<std::vector<uint32_t>> PrivateKv::match_prefix(std::span<const uint64_t> hashes) {
  std::vector<uint32_t> out;
  for (uint64_t h : hashes) {
    const auto it = by_hash_.find(h);
    if (it == by_hash_.end() || !blocks_[it->second]) break;
    out.push_back(it->second);
  }
  return out;
}

Result<uint32_t> PrivateKv::prepare_write(uint32_t id) {
  // A block referenced by the hash table may be read by another sequence:
  // hand out a copy, as the daemon's copy-on-write does.
  for (const auto& [h, b] : by_hash_) {
    if (b == id) {
      auto fresh = allocate(1);
      std::memcpy(blocks_[(*fresh)[0]].get(), blocks_[id].get(), block_bytes_);
      return (*fresh)[0];
    }
  }
  return id;
}

Status PrivateKv::set_length(uint32_t tokens) {
  length_ = tokens;
  return {};
}

Result<std::vector<uint32_t>> PrivateKv::read_notices() { return std::exchange(notices_, {}); }

void PrivateKv::evict(uint32_t id) {
  if (id >= blocks_.size() || !blocks_[id]) return;
  blocks_[id].reset();
  std::erase_if(by_hash_, [&](const auto& kv) { return kv.second == id; });
  notices_.push_back(id);
}

size_t PrivateKv::blocks_in_use() const noexcept {
  return static_cast<size_t>(std::count_if(blocks_.begin(), blocks_.end(), [](const auto& b) { return b != nullptr; }));
}

// ---- Sequence ----

Sequence::Sequence(Engine& engine, KvBackend& kv)
    : engine_(engine), kv_(kv), tpb_(engine.layout().tokens_per_block), logits_(engine.config().n_vocab) {}

Status Sequence::ensure_block(uint32_t pos) {
  const uint32_t index = pos / tpb_;
  if (index < ids_.size()) {
    if (committed_[index]) {
      // Never happens in this protocol (only the open block is written),
      // but a shared block must not be written in place.
      auto w = kv_.prepare_write(ids_[index]);
      if (!w) return std::move(w).error();
      ids_[index] = *w;
      ptrs_[index] = kv_.block_ptr(*w);
      committed_[index] = false;
    }
    return {};
  }
  auto ids = kv_.allocate(1);
  if (!ids) return std::move(ids).error();
  std::byte* p = kv_.block_ptr((*ids)[0]);
  if (p == nullptr) return make_error(EINVAL, "kv: block {} has no mapping", (*ids)[0]);
  ids_.push_back((*ids)[0]);
  ptrs_.push_back(p);
  committed_.push_back(false);
  return {};
}

Status Sequence::commit_if_full(uint32_t index) {
  const uint64_t end = uint64_t{index + 1} * tpb_;
  if (tokens_.size() < end || committed_[index]) return {};
  const uint64_t parent = index == 0 ? 0 : hashes_[index - 1];
  const uint64_t h = kv_.chain_hash(parent, std::span(tokens_).subspan(size_t{index} * tpb_, tpb_));
  if (hashes_.size() <= index) hashes_.resize(index + 1);
  hashes_[index] = h;
  const uint32_t id = ids_[index];
  AIRS_TRY(kv_.commit(std::span(&id, 1), std::span(&h, 1)));
  committed_[index] = true;
  return {};
}

namespace {
// Rounds of recovery one call tolerates while the service keeps taking
// blocks (each round waits at most 1 s for the notice that explains a
// refusal, and returns at once when it comes).
constexpr int kMaxRecoveries = 30;
}  // namespace

Status Sequence::step(std::span<const int32_t> batch, float* logits) {
  for (int32_t token : batch) {
    if (token < 0 || static_cast<uint32_t>(token) >= engine_.config().n_vocab) {
      return make_error(EINVAL, "sequence: token {} is outside the vocabulary ({})", token, engine_.config().n_vocab);
    }
  }
  const auto pos = static_cast<uint32_t>(tokens_.size());
  const auto end = static_cast<uint32_t>(pos + batch.size());
  for (uint32_t p = pos; p < end; p = (p / tpb_ + 1) * tpb_) AIRS_TRY(ensure_block(p));
  tokens_.insert(tokens_.end(), batch.begin(), batch.end());
  for (int attempt = 0;; ++attempt) {
    engine_.forward_batch(batch, pos, ptrs_, logits);
    // A decode step inside a block: no round trip (see the header).
    const bool one_way = batch.size() == 1 && end % tpb_ != 0 && attempt == 0;
    Status st = one_way ? kv_.post_length(end) : kv_.set_length(end);
    // The service refusing the length means it took blocks we were not told
    // about yet: give the notice a moment to arrive.
    if (!st && attempt == 0) (void)kv_.wait_notice(1000);
    // Blocks lost while this step ran: repair them (recover() also sets the
    // length and recomputes the lost positions of this batch too), then run
    // the step again on valid K/V.
    auto rec = recover();
    if (!rec) return std::move(rec).error();
    if (*rec == 0) {
      if (!st) return st;
      break;
    }
    if (attempt == kMaxRecoveries) return make_error(EAGAIN, "sequence: blocks keep being evicted during step {}", pos);
  }
  for (uint32_t b = pos / tpb_; b <= (end - 1) / tpb_; ++b) AIRS_TRY(commit_if_full(b));
  return {};
}

Result<std::span<const float>> Sequence::prefill(std::span<const int32_t> tokens) {
  if (tokens.empty()) return make_error(EINVAL, "sequence: empty prompt");
  auto rec = recover();
  if (!rec) return std::move(rec).error();
  size_t start = 0;
  if (tokens_.empty()) {
    // Full blocks before the one that holds the last token.
    const size_t n_full = (tokens.size() - 1) / tpb_;
    std::vector<uint64_t> hashes;
    uint64_t parent = 0;
    for (size_t b = 0; b < n_full; ++b) {
      parent = kv_.chain_hash(parent, tokens.subspan(b * tpb_, tpb_));
      hashes.push_back(parent);
    }
    if (!hashes.empty()) {
      const uint64_t restored_before = kv_.restored_blocks();
      auto matched = kv_.match_prefix(hashes);
      if (!matched) return std::move(matched).error();
      restored_tokens_ = static_cast<uint32_t>(
          std::min<uint64_t>(kv_.restored_blocks() - restored_before, matched->size()) * tpb_);
      for (size_t b = 0; b < matched->size(); ++b) {
        const uint32_t id = (*matched)[b];
        std::byte* p = kv_.block_ptr(id);
        if (p == nullptr) return make_error(EINVAL, "kv: matched block {} has no mapping", id);
        ids_.push_back(id);
        ptrs_.push_back(p);
        committed_.push_back(true);
        hashes_.push_back(hashes[b]);
      }
      start = matched->size() * tpb_;
      tokens_.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(start));
      matched_tokens_ = static_cast<uint32_t>(start);
      if (start > 0) AIRS_TRY(kv_.set_length(static_cast<uint32_t>(start)));
    }
  }
  // Batches of up to Engine::kMaxBatch tokens that end at block
  // boundaries, so each full block is committed as soon as it is written.
  for (size_t i = start; i < tokens.size();) {
    const size_t limit = i + Engine::kMaxBatch;
    const size_t aligned = limit / tpb_ * tpb_;
    const size_t n = std::min(aligned > i ? aligned : limit, tokens.size()) - i;
    AIRS_TRY(step(tokens.subspan(i, n), i + n == tokens.size() ? logits_.data() : nullptr));
    i += n;
  }
  return std::span<const float>(logits_);
}

Result<std::span<const float>> Sequence::append(int32_t token) {
  auto rec = recover();
  if (!rec) return std::move(rec).error();
  AIRS_TRY(step(std::span(&token, 1), logits_.data()));
  return std::span<const float>(logits_);
}

Status Sequence::recompute(uint32_t index, bool tail) {
  auto id = kv_.allocate_at(index);
  if (!id) return std::move(id).error();
  ids_[index] = *id;
  ptrs_[index] = kv_.block_ptr(ids_[index]);
  if (ptrs_[index] == nullptr) return make_error(EINVAL, "kv: block {} has no mapping", ids_[index]);
  committed_[index] = false;
  const uint32_t begin = index * tpb_;
  const auto end = static_cast<uint32_t>(std::min<size_t>(tokens_.size(), size_t{begin} + tpb_));
  // Attention at these positions reads only blocks 0..index.
  const auto table = std::span<std::byte* const>(ptrs_).first(index + 1);
  for (uint32_t pos = begin; pos < end;) {
    const uint32_t n = std::min(end - pos, Engine::kMaxBatch);
    engine_.forward_batch(std::span(tokens_).subspan(pos, n), pos, table, nullptr);
    pos += n;
  }
  ++recomputed_;
  // The block is back at its own index. When every later block was lost
  // too, the service cut its table (and length) to before this one: the
  // true length is this block's end for now (recover() sets the whole
  // length at the end). A block refilled in the middle is inside the
  // service's length already. Either way a full block is published again.
  if (tail) AIRS_TRY(kv_.set_length(end));
  return commit_if_full(index);
}

Status Sequence::truncate(uint32_t n) {
  if (n == 0 || n > size()) return make_error(EINVAL, "sequence: truncate to {} of {} tokens", n, size());
  const uint32_t keep = (n + tpb_ - 1) / tpb_;
  if (keep < ids_.size()) {
    AIRS_TRY(kv_.free(std::span(ids_).subspan(keep)));
    ids_.resize(keep);
    ptrs_.resize(keep);
    committed_.resize(keep);
  }
  tokens_.resize(n);
  if (hashes_.size() > n / tpb_) hashes_.resize(n / tpb_);
  return kv_.set_length(n);
}

Result<uint32_t> Sequence::recover() {
  // Blocks recomputed by this call. The service can take blocks again while
  // they are being recomputed (pressure goes on): then the calls of this
  // pass fail or the next notices name them, and the pass is repeated.
  // Blocks named by notices already read stay to be done (`need`) until
  // they are recomputed: a pass cut short by a refusal must not forget them.
  std::vector<bool> redone(ids_.size(), false);
  std::vector<bool> need(ids_.size(), false);
  uint32_t n = 0;
  for (int attempt = 0;; ++attempt) {
    auto lost = kv_.read_notices();
    std::vector<bool> hit(ids_.size(), false);
    if (!lost) {
      if (lost.error().code != EOVERFLOW) return std::move(lost).error();
      hit.assign(ids_.size(), true);
    } else {
      for (uint32_t id : *lost) {
        for (size_t i = 0; i < ids_.size(); ++i) hit[i] = hit[i] || ids_[i] == id;
      }
    }
    // A block recomputed in this call at or after a block lost now may have
    // read that block while it was being taken: recompute it too.
    const auto first = static_cast<size_t>(std::find(hit.begin(), hit.end(), true) - hit.begin());
    for (size_t i = 0; i < hit.size(); ++i) need[i] = need[i] || hit[i] || (i >= first && redone[i]);
    Status st;
    bool any = false;
    for (uint32_t i = 0; i < need.size() && st; ++i) {
      if (!need[i]) continue;
      const bool tail = std::all_of(need.begin() + i, need.end(), [](bool b) { return b; });
      st = recompute(i, tail);
      if (!st) break;
      need[i] = false;
      redone[i] = true;
      any = true;
      ++n;
    }
    if (st && any) st = kv_.set_length(size());
    if (st) return n;
    // Refused because blocks went meanwhile: their notices come; repeat.
    // Pressure can go on taking a low-priority session's blocks while it
    // recomputes them (slow engines, a pressure loop still above its
    // threshold after the hog stopped): keep up while notices keep coming.
    if (attempt == kMaxRecoveries || !kv_.wait_notice(1000)) return std::move(st).error();
  }
}

}  // namespace airs::infer
