#include "infer/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace airs::infer {

KvLayout kv_layout_for(const ModelConfig& m, uint32_t tokens_per_block, KvElem elem) noexcept {
  return KvLayout{m.n_layer, m.n_head_kv, m.head_dim, tokens_per_block, elem};
}

Engine::Engine(const Model& model, const KvLayout& layout, ThreadPool& pool)
    : model_(model), layout_(layout), pool_(pool) {
  const ModelConfig& c = model_.config;
  x_.resize(c.n_embd);
  xb_.resize(std::max(c.n_embd, c.n_head * c.head_dim));
  q_.resize(size_t{c.n_head} * c.head_dim);
  k_.resize(size_t{c.n_head_kv} * c.head_dim);
  v_.resize(size_t{c.n_head_kv} * c.head_dim);
  att_.resize(size_t{c.n_head} * c.head_dim);
  gate_.resize(c.n_ff);
  up_.resize(c.n_ff);
  act_.resize(row_bytes(WeightType::kF32, std::max<size_t>(c.n_ff, size_t{c.n_head} * c.head_dim + c.n_embd)));
  q16_.resize(q_.size());
}

void Engine::matvec(const Matrix& w, const float* x, float* out) {
  const WeightType at = activation_type(w.type);
  quantize_row(at, x, w.cols, act_.data());
  const std::byte* act = act_.data();
  pool_.parallel_for(w.rows, 16, [&](size_t b, size_t e) {
    size_t r = b;
    for (; r + 4 <= e; r += 4) dot_rows4(w.type, w.data + r * w.row_stride, w.row_stride, act, w.cols, out + r);
    for (; r < e; ++r) out[r] = dot_row(w.type, w.data + r * w.row_stride, act, w.cols);
  });
}

void Engine::attention(uint32_t layer, uint32_t pos, std::span<std::byte* const> blocks) {
  const ModelConfig& c = model_.config;
  const KvLayout& L = layout_;
  const uint32_t n_pos = pos + 1;
  const uint32_t group = c.n_head / c.n_head_kv;
  const size_t hd = c.head_dim;
  const float scale = 1.0F / std::sqrt(static_cast<float>(hd));
  scores_.resize(size_t{c.n_head} * n_pos);
  if (L.elem == KvElem::kF16) {
    for (size_t i = 0; i < q_.size(); ++i) q16_[i] = fp32_to_fp16(q_[i]);
  }
  pool_.parallel_for(c.n_head, 1, [&](size_t hb, size_t he) {
    for (size_t h = hb; h < he; ++h) {
      const auto kvh = static_cast<uint32_t>(h / group);
      float* s = scores_.data() + h * n_pos;
      const float* q = q_.data() + h * hd;
      for (uint32_t t = 0; t < n_pos; ++t) {
        const std::byte* row =
            blocks[t / L.tokens_per_block] + L.offset(layer, 0, kvh, t % L.tokens_per_block);
        if (L.elem == KvElem::kF32) {
          s[t] = dot_f32(q, reinterpret_cast<const float*>(row), hd);
        } else {
          s[t] = dot_row(WeightType::kF16, reinterpret_cast<const std::byte*>(q16_.data() + h * hd), row, hd);
        }
      }
      softmax(s, n_pos, scale);
      float* out = att_.data() + h * hd;
      std::fill(out, out + hd, 0.0F);
      for (uint32_t t = 0; t < n_pos; ++t) {
        const std::byte* row =
            blocks[t / L.tokens_per_block] + L.offset(layer, 1, kvh, t % L.tokens_per_block);
        if (L.elem == KvElem::kF32) {
          axpy_f32(s[t], reinterpret_cast<const float*>(row), out, hd);
        } else {
          axpy_f16(fp16_to_fp32(fp32_to_fp16(s[t])), reinterpret_cast<const uint16_t*>(row), out, hd);
        }
      }
    }
  });
}

void Engine::forward(int32_t token, uint32_t pos, std::span<std::byte* const> blocks, float* logits) {
  const ModelConfig& c = model_.config;
  const KvLayout& L = layout_;
  const size_t hd = c.head_dim;
  dequantize_row(model_.token_embd.type,
                 model_.token_embd.data + static_cast<size_t>(token) * model_.token_embd.row_stride, c.n_embd,
                 x_.data());
  std::byte* block = blocks[pos / L.tokens_per_block];
  const uint32_t slot = pos % L.tokens_per_block;
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const Layer& W = model_.layers[l];
    rms_norm(x_.data(), W.attn_norm, c.rms_eps, c.n_embd, xb_.data());
    matvec(W.wq, xb_.data(), q_.data());
    matvec(W.wk, xb_.data(), k_.data());
    matvec(W.wv, xb_.data(), v_.data());
    for (uint32_t h = 0; h < c.n_head; ++h) rope(q_.data() + h * hd, c.n_rot, pos, c.rope_freq_base, c.rope_style);
    for (uint32_t h = 0; h < c.n_head_kv; ++h) {
      rope(k_.data() + h * hd, c.n_rot, pos, c.rope_freq_base, c.rope_style);
      for (uint32_t kv = 0; kv < 2; ++kv) {
        const float* src = (kv == 0 ? k_.data() : v_.data()) + h * hd;
        std::byte* dst = block + L.offset(l, kv, h, slot);
        if (L.elem == KvElem::kF32) {
          std::memcpy(dst, src, hd * 4);
        } else {
          quantize_row(WeightType::kF16, src, hd, dst);
        }
      }
    }
    attention(l, pos, blocks);
    matvec(W.wo, att_.data(), xb_.data());
    for (size_t i = 0; i < c.n_embd; ++i) x_[i] += xb_[i];
    rms_norm(x_.data(), W.ffn_norm, c.rms_eps, c.n_embd, xb_.data());
    matvec(W.w_gate, xb_.data(), gate_.data());
    matvec(W.w_up, xb_.data(), up_.data());
    swiglu(gate_.data(), up_.data(), c.n_ff);
    matvec(W.w_down, gate_.data(), xb_.data());
    for (size_t i = 0; i < c.n_embd; ++i) x_[i] += xb_[i];
  }
  if (logits == nullptr) return;
  rms_norm(x_.data(), model_.output_norm, c.rms_eps, c.n_embd, xb_.data());
  matvec(model_.output, xb_.data(), logits);
}

}  // namespace airs::infer
