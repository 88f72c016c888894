// SPDX-License-Identifier: Apache-2.0
// A llama-architecture model as views into a GGUF mapping: hyperparameters
// from the metadata and, per tensor, a pointer to its bytes in place. Nothing
// is copied or converted; the mapping must outlive the Model.
//
// Accepted: general.architecture "llama" (RoPE pairs adjacent values) and
// the NeoX-rotating llama-shaped architectures qwen2 / qwen3 / phi3 /
// stablelm (see rope_style_for); weights F32, F16, Q8_0, Q4_0, Q4_K; norms F32.
// A missing output.weight means tied embeddings (token_embd is reused).
// Mixtures of experts as llama.cpp lays them out: "llama" with
// llama.expert_count (the Mixtral layout) and "qwen3moe" (NeoX RoPE, q/k
// norms, qwen3moe.expert_feed_forward_length): a router
// blk.N.ffn_gate_inp.weight [n_embd, n_expert] and
// blk.N.ffn_{gate,up,down}_exps.weight with the expert outermost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "gguf/gguf.hpp"
#include "infer/kernels.hpp"
#include "util/result.hpp"

namespace airs::infer {

// One 2-D weight: `rows` rows of `cols` values each, row r at data + r * row_stride.
struct Matrix {
  const std::byte* data = nullptr;
  WeightType type = WeightType::kF32;
  size_t rows = 0;
  size_t cols = 0;
  size_t row_stride = 0;
};

struct Layer {
  const float* attn_norm = nullptr;
  Matrix wq, wk, wv, wo;
  // RMSNorm weights (head_dim values) applied to each head of q and k
  // before RoPE; null when the model has none (qwen3 / qwen3moe have them).
  const float* attn_q_norm = nullptr;
  const float* attn_k_norm = nullptr;
  const float* ffn_norm = nullptr;
  // Dense: the FFN. Mixture of experts: expert 0's slice of the 3-D tensors
  // (expert_slice gives the others), and `router` (n_expert rows of n_embd).
  Matrix w_gate, w_up, w_down;
  Matrix router;
};

// Expert e of a 3-D expert tensor whose expert 0 is `m`: the experts are
// contiguous, rows × row_stride bytes each.
[[nodiscard]] inline Matrix expert_slice(const Matrix& m, uint32_t e) noexcept {
  Matrix s = m;
  s.data = m.data + size_t{e} * m.rows * m.row_stride;
  return s;
}

struct ModelConfig {
  std::string architecture;
  uint32_t n_layer = 0;
  uint32_t n_embd = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;  // key_length; value_length must equal it
  uint32_t n_ff = 0;       // with experts: one expert's width
  uint32_t n_expert = 0;   // 0: dense
  uint32_t n_expert_used = 0;
  uint32_t n_vocab = 0;
  uint32_t n_rot = 0;     // rope.dimension_count, defaults to head_dim
  uint32_t context_length = 0;
  float rms_eps = 1e-5F;
  float rope_freq_base = 10000.0F;
  RopeStyle rope_style = RopeStyle::kNormal;
};

// The most experts a model may have.
inline constexpr uint64_t kMaxExperts = 1024;

struct Model {
  ModelConfig config;
  Matrix token_embd;  // n_vocab rows of n_embd
  std::vector<Layer> layers;
  const float* output_norm = nullptr;
  Matrix output;      // n_vocab rows of n_embd
  // Bytes of the tensors one token's forward pass reads (with experts: the
  // routers and n_expert_used experts of each layer).
  uint64_t weight_bytes = 0;
};

// The rope style llama.cpp uses for an architecture; false when unknown.
[[nodiscard]] bool rope_style_for(std::string_view architecture, RopeStyle* out) noexcept;

// Builds the views. `file` is the parsed header of `mapping` (mapping byte i
// = file byte i). Errors (EINVAL/ENOTSUP) name the tensor or key that is
// missing, has the wrong shape, or an unsupported type. Pure.
[[nodiscard]] Result<Model> load_model(const gguf::File& file, std::span<const std::byte> mapping);

}  // namespace airs::infer
