// SPDX-License-Identifier: Apache-2.0
// The forward pass of a llama-shaped model for one token at a time, with the
// sequence's K and V in caller-provided blocks (the daemon's KV blocks, or
// private memory: the engine cannot tell).
//
// Block layout (KvLayout): a block holds `tokens_per_block` consecutive
// positions of one sequence for every layer. Inside it, element type E
// (f32 or f16), the order is
//
//   block = [layer 0 .. n_layer-1] × [K, V] × [kv head 0 .. n_head_kv-1]
//           × [slot 0 .. tokens_per_block-1] × [head_dim values]
//
// so the K (or V) rows one attention head scans are contiguous within a
// block: position p of the sequence is slot p % tokens_per_block of block
// p / tokens_per_block. block_bytes = 2 · n_layer · n_head_kv ·
// tokens_per_block · head_dim · sizeof(E). K is stored after RoPE.
//
// A mixture-of-experts layer routes as llama.cpp's build_moe_ffn does for
// llama (Mixtral) and qwen3moe: router logits, softmax over all experts,
// the n_expert_used most probable (ties: the lower id), their probabilities
// divided by their sum (clamped below at 2^-14), each chosen expert's
// SwiGLU FFN (a slice of the 3-D tensors) scaled by its weight, summed best
// first. A batch reads each chosen expert's slices once for all the tokens
// that chose it.
//
// Numerics follow llama.cpp's CPU path (see kernels.hpp); with f16 KV, q and
// the attention weights are rounded to f16 before their products with K and
// V, as ggml's f16 mat-mul does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "infer/kernels.hpp"
#include "infer/model.hpp"
#include "infer/thread_pool.hpp"

namespace airs::infer {

enum class KvElem : uint8_t { kF32, kF16 };

struct KvLayout {
  uint32_t n_layer = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;
  uint32_t tokens_per_block = 16;
  KvElem elem = KvElem::kF16;

  [[nodiscard]] size_t elem_bytes() const noexcept { return elem == KvElem::kF32 ? 4 : 2; }
  [[nodiscard]] uint64_t bytes_per_token() const noexcept {
    return uint64_t{2} * n_layer * n_head_kv * head_dim * elem_bytes();
  }
  [[nodiscard]] uint64_t block_bytes() const noexcept { return bytes_per_token() * tokens_per_block; }
  // Byte offset of the K (kv = 0) or V (kv = 1) row of (layer, head, slot).
  [[nodiscard]] size_t offset(uint32_t layer, uint32_t kv, uint32_t head, uint32_t slot) const noexcept {
    return ((((size_t{layer} * 2 + kv) * n_head_kv + head) * tokens_per_block + slot) * head_dim) * elem_bytes();
  }
};

// The layout for `m` with the given block size and element type.
[[nodiscard]] KvLayout kv_layout_for(const ModelConfig& m, uint32_t tokens_per_block, KvElem elem) noexcept;

class Engine {
 public:
  // `model` and `pool` must outlive the engine; layout must be
  // kv_layout_for(model.config, ...). Not thread-safe: one forward at a time.
  Engine(const Model& model, const KvLayout& layout, ThreadPool& pool);

  // The most tokens forward_batch() takes at once.
  static constexpr uint32_t kMaxBatch = 32;

  // Runs `token` at position `pos`. blocks[i] is the sequence's i-th block
  // (block_bytes each, suitably aligned): positions [0, pos) must already be
  // in them, and blocks.size() > pos / tokens_per_block. Writes K and V of
  // `pos` into blocks[pos / tokens_per_block]. If logits is non-null, writes
  // n_vocab values there; null skips the output layer (prefill).
  // token must be < n_vocab (checked by the caller).
  void forward(int32_t token, uint32_t pos, std::span<std::byte* const> blocks, float* logits);

  // Runs tokens[i] at position pos + i for all i (1 <= size <= kMaxBatch):
  // each weight matrix is read once for the whole batch (every row against
  // every token's activation while the row is in cache). Same contract as
  // forward() with blocks covering pos + size - 1; logits, if non-null, are
  // those after the last token. Every value is computed by the same kernels
  // in the same order as forward() token by token, so the K/V and logits are
  // bit-identical to it.
  void forward_batch(std::span<const int32_t> tokens, uint32_t pos, std::span<std::byte* const> blocks,
                     float* logits);

  // Mixture of experts: called once per layer of every forward pass, after
  // the routing and before any expert's weights are read, with the
  // distinct experts (ascending) the tokens of the pass chose in that
  // layer. On the forward pass's thread; must not call into the engine.
  using ExpertObserver = std::function<void(uint32_t layer, std::span<const uint32_t> experts)>;
  void set_expert_observer(ExpertObserver observer) { expert_observer_ = std::move(observer); }
  // Mixture of experts: a guess at the next layer's experts. Once layer l
  // has routed (after the observer's call), the engine puts the residual
  // stream through layer l + 1's FFN norm and router, and calls this with
  // the distinct experts (ascending) it would choose: before layer l's
  // experts are read, so their reads and the guessed ones overlap. Not set:
  // nothing is computed. Same thread rules as the observer.
  void set_expert_predictor(ExpertObserver predictor);
  // How good the guesses were: of the experts each predicted layer then
  // chose (`used`), those the guess named (`hits`).
  struct PredictionStats {
    uint64_t predictions = 0;
    uint64_t used = 0;
    uint64_t hits = 0;
  };
  [[nodiscard]] const PredictionStats& prediction_stats() const noexcept { return prediction_; }

  [[nodiscard]] const ModelConfig& config() const noexcept { return model_.config; }
  [[nodiscard]] const KvLayout& layout() const noexcept { return layout_; }

 private:
  // out[b][r] = W[r] · x[b] for all rows and the nb tokens of the batch
  // (x[b] at x + b * x_stride, out[b] at out + b * out_stride); quantises
  // each x[b] once per call.
  void matmul(const Matrix& w, const float* x, size_t x_stride, size_t nb, float* out, size_t out_stride);
  // Attention of batch token t (position pos) over positions [0, pos].
  void attention(uint32_t layer, uint32_t pos, size_t t, std::span<std::byte* const> blocks);
  // The FFN of a dense layer or a mixture of experts: reads xb_ (the
  // normed input of the nb tokens), adds the result to x_.
  void ffn(uint32_t layer, size_t nb);
  void moe_ffn(uint32_t layer, size_t nb);
  void predict(uint32_t layer, size_t nb);
  void score_prediction(uint32_t layer);

  const Model& model_;
  KvLayout layout_;
  ThreadPool& pool_;
  // Per-token activations, kMaxBatch rows each of the widths below.
  size_t xb_w_ = 0, q_w_ = 0, kv_w_ = 0;
  std::vector<float> x_, xb_, q_, k_, v_, att_, gate_, up_;
  std::vector<float> scores_;               // n_head × (pos + 1)
  std::vector<std::byte> act_;              // kMaxBatch activations in the weight's format
  size_t act_stride_ = 0;
  std::vector<uint16_t> q16_;               // one token's q rounded to f16 (f16 KV)
  // Mixture of experts, per batch token: router probabilities (n_expert),
  // the chosen experts and their weights (n_expert_used, best first), each
  // chosen expert's weighted output (n_expert_used × n_embd); and one
  // expert's inputs and outputs for the tokens that chose it.
  std::vector<float> probs_, sel_w_, expert_out_, xe_, ye_;
  std::vector<uint32_t> sel_, used_;
  std::vector<uint8_t> chosen_;  // per expert: chosen by a token of the batch
  std::vector<std::pair<uint32_t, uint32_t>> members_;  // (token, rank) of one expert
  ExpertObserver expert_observer_;
  // Predictions: the normed residual, the next router's logits and one
  // token's top k; per layer, the last guess not yet scored.
  ExpertObserver expert_predictor_;
  std::vector<float> pred_x_, pred_probs_;
  std::vector<uint32_t> pred_sel_;
  std::vector<std::vector<uint32_t>> predicted_;
  PredictionStats prediction_;
};

}  // namespace airs::infer
