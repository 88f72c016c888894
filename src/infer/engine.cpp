// SPDX-License-Identifier: Apache-2.0
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
  constexpr size_t B = kMaxBatch;
  q_w_ = size_t{c.n_head} * c.head_dim;
  kv_w_ = size_t{c.n_head_kv} * c.head_dim;
  xb_w_ = std::max<size_t>(c.n_embd, q_w_);
  x_.resize(B * c.n_embd);
  xb_.resize(B * xb_w_);
  q_.resize(B * q_w_);
  k_.resize(B * kv_w_);
  v_.resize(B * kv_w_);
  att_.resize(B * q_w_);
  gate_.resize(B * c.n_ff);
  up_.resize(B * c.n_ff);
  act_stride_ = row_bytes(WeightType::kF32, std::max<size_t>(c.n_ff, q_w_ + c.n_embd));
  act_.resize(B * act_stride_);
  q16_.resize(q_w_);
  if (c.n_expert > 0) {
    probs_.resize(B * c.n_expert);
    sel_.resize(B * c.n_expert_used);
    sel_w_.resize(B * c.n_expert_used);
    expert_out_.resize(B * c.n_expert_used * c.n_embd);
    xe_.resize(B * c.n_embd);
    ye_.resize(B * c.n_embd);
    used_.reserve(c.n_expert);
    chosen_.resize(c.n_expert);
    members_.reserve(B * c.n_expert_used);
    predicted_.resize(c.n_layer);
  }
}

namespace {

// The k most probable of p[0..n) into sel, best first (ties: the lower id).
void top_k(const float* p, size_t n, size_t k, uint32_t* sel) {
  for (size_t r = 0; r < k; ++r) {
    uint32_t best = 0;
    bool found = false;
    for (uint32_t e = 0; e < n; ++e) {
      if (std::find(sel, sel + r, e) != sel + r) continue;
      if (!found || p[e] > p[best]) {
        best = e;
        found = true;
      }
    }
    sel[r] = best;
  }
}

}  // namespace

void Engine::matmul(const Matrix& w, const float* x, size_t x_stride, size_t nb, float* out, size_t out_stride) {
  const WeightType at = activation_type(w.type);
  for (size_t b = 0; b < nb; ++b) quantize_row(at, x + b * x_stride, w.cols, act_.data() + b * act_stride_);
  const std::byte* act = act_.data();
  const size_t as = act_stride_;
  pool_.parallel_for(w.rows, 16, [&](size_t rb, size_t re) {
    if (nb == 1) {  // one call for the share: the kernels walk it a group at a time
      dot_rows(w.type, w.data + rb * w.row_stride, w.row_stride, act, w.cols, re - rb, out + rb);
      return;
    }
    // A group of rows is read from memory once for the whole batch.
    for (size_t r = rb; r < re; r += kRowGroup) {
      const size_t rows = std::min(kRowGroup, re - r);
      for (size_t b = 0; b < nb; ++b) {
        dot_rows(w.type, w.data + r * w.row_stride, w.row_stride, act + b * as, w.cols, rows, out + b * out_stride + r);
      }
    }
  });
}

void Engine::attention(uint32_t layer, uint32_t pos, size_t t, std::span<std::byte* const> blocks) {
  const ModelConfig& c = model_.config;
  const KvLayout& L = layout_;
  const uint32_t n_pos = pos + 1;
  const uint32_t group = c.n_head / c.n_head_kv;
  const size_t hd = c.head_dim;
  const float scale = 1.0F / std::sqrt(static_cast<float>(hd));
  const float* qt = q_.data() + t * q_w_;
  float* att = att_.data() + t * q_w_;
  scores_.resize(size_t{c.n_head} * n_pos);
  if (L.elem == KvElem::kF16) {
    for (size_t i = 0; i < q_w_; ++i) q16_[i] = fp32_to_fp16(qt[i]);
  }
  pool_.parallel_for(c.n_head, 1, [&](size_t hb, size_t he) {
    for (size_t h = hb; h < he; ++h) {
      const auto kvh = static_cast<uint32_t>(h / group);
      float* s = scores_.data() + h * n_pos;
      const float* q = qt + h * hd;
      for (uint32_t p = 0; p < n_pos; ++p) {
        const std::byte* row =
            blocks[p / L.tokens_per_block] + L.offset(layer, 0, kvh, p % L.tokens_per_block);
        if (L.elem == KvElem::kF32) {
          s[p] = dot_f32(q, reinterpret_cast<const float*>(row), hd);
        } else {
          s[p] = dot_row(WeightType::kF16, reinterpret_cast<const std::byte*>(q16_.data() + h * hd), row, hd);
        }
      }
      softmax(s, n_pos, scale);
      float* out = att + h * hd;
      std::fill(out, out + hd, 0.0F);
      for (uint32_t p = 0; p < n_pos; ++p) {
        const std::byte* row =
            blocks[p / L.tokens_per_block] + L.offset(layer, 1, kvh, p % L.tokens_per_block);
        if (L.elem == KvElem::kF32) {
          axpy_f32(s[p], reinterpret_cast<const float*>(row), out, hd);
        } else {
          axpy_f16(fp16_to_fp32(fp32_to_fp16(s[p])), reinterpret_cast<const uint16_t*>(row), out, hd);
        }
      }
    }
  });
}

void Engine::ffn(uint32_t l, size_t nb) {
  const ModelConfig& c = model_.config;
  if (c.n_expert > 0) {
    moe_ffn(l, nb);
    return;
  }
  const Layer& W = model_.layers[l];
  const size_t ne = c.n_embd;
  matmul(W.w_gate, xb_.data(), xb_w_, nb, gate_.data(), c.n_ff);
  matmul(W.w_up, xb_.data(), xb_w_, nb, up_.data(), c.n_ff);
  for (size_t t = 0; t < nb; ++t) swiglu(gate_.data() + t * c.n_ff, up_.data() + t * c.n_ff, c.n_ff);
  matmul(W.w_down, gate_.data(), c.n_ff, nb, xb_.data(), xb_w_);
  for (size_t t = 0; t < nb; ++t) {
    for (size_t i = 0; i < ne; ++i) x_[t * ne + i] += xb_[t * xb_w_ + i];
  }
}

void Engine::moe_ffn(uint32_t l, size_t nb) {
  const ModelConfig& c = model_.config;
  const Layer& W = model_.layers[l];
  const size_t ne = c.n_embd;
  const size_t n_exp = c.n_expert;
  const size_t k = c.n_expert_used;
  // Routing: softmax over every expert, the k most probable, their
  // probabilities renormalised over the k (llama.cpp: norm_w, a sum
  // clamped at the smallest normal f16).
  matmul(W.router, xb_.data(), xb_w_, nb, probs_.data(), n_exp);
  std::fill(chosen_.begin(), chosen_.end(), uint8_t{0});
  for (size_t t = 0; t < nb; ++t) {
    float* p = probs_.data() + t * n_exp;
    softmax(p, n_exp, 1.0F);
    uint32_t* sel = sel_.data() + t * k;
    top_k(p, n_exp, k, sel);
    for (size_t r = 0; r < k; ++r) chosen_[sel[r]] = 1;
    double sum = 0.0;
    for (size_t r = 0; r < k; ++r) sum += static_cast<double>(p[sel[r]]);
    const float denom = std::max(static_cast<float>(sum), 6.103515625e-5F);
    for (size_t r = 0; r < k; ++r) sel_w_[t * k + r] = p[sel[r]] / denom;
  }
  used_.clear();
  for (uint32_t e = 0; e < n_exp; ++e) {
    if (chosen_[e] != 0) used_.push_back(e);
  }
  if (expert_observer_) expert_observer_(l, used_);
  score_prediction(l);
  if (expert_predictor_ && l + 1 < c.n_layer) predict(l + 1, nb);
  // Each chosen expert once, for every token that chose it.
  for (const uint32_t e : used_) {
    members_.clear();
    for (size_t t = 0; t < nb; ++t) {
      for (size_t r = 0; r < k; ++r) {
        if (sel_[t * k + r] == e) members_.emplace_back(static_cast<uint32_t>(t), static_cast<uint32_t>(r));
      }
    }
    const size_t m = members_.size();
    for (size_t j = 0; j < m; ++j) {
      std::memcpy(xe_.data() + j * ne, xb_.data() + size_t{members_[j].first} * xb_w_, ne * sizeof(float));
    }
    matmul(expert_slice(W.w_gate, e), xe_.data(), ne, m, gate_.data(), c.n_ff);
    matmul(expert_slice(W.w_up, e), xe_.data(), ne, m, up_.data(), c.n_ff);
    for (size_t j = 0; j < m; ++j) swiglu(gate_.data() + j * c.n_ff, up_.data() + j * c.n_ff, c.n_ff);
    matmul(expert_slice(W.w_down, e), gate_.data(), c.n_ff, m, ye_.data(), ne);
    for (size_t j = 0; j < m; ++j) {
      const auto [t, r] = members_[j];
      const float w = sel_w_[size_t{t} * k + r];
      float* dst = expert_out_.data() + (size_t{t} * k + r) * ne;
      const float* y = ye_.data() + j * ne;
      for (size_t i = 0; i < ne; ++i) dst[i] = y[i] * w;
    }
  }
  // Sum best first, then the residual (as llama.cpp's adds).
  for (size_t t = 0; t < nb; ++t) {
    float* acc = expert_out_.data() + t * k * ne;
    for (size_t r = 1; r < k; ++r) {
      const float* o = acc + r * ne;
      for (size_t i = 0; i < ne; ++i) acc[i] += o[i];
    }
    for (size_t i = 0; i < ne; ++i) x_[t * ne + i] += acc[i];
  }
}

void Engine::set_expert_predictor(ExpertObserver predictor) {
  const ModelConfig& c = model_.config;
  expert_predictor_ = std::move(predictor);
  if (!expert_predictor_ || c.n_expert == 0) return;
  pred_x_.resize(size_t{kMaxBatch} * c.n_embd);
  pred_probs_.resize(size_t{kMaxBatch} * c.n_expert);
  pred_sel_.resize(c.n_expert_used);
}

void Engine::score_prediction(uint32_t l) {
  std::vector<uint32_t>& guess = predicted_[l];
  if (guess.empty()) return;
  for (uint32_t e : used_) prediction_.hits += std::binary_search(guess.begin(), guess.end(), e) ? 1U : 0U;
  prediction_.used += used_.size();
  guess.clear();
}

// The experts layer l's router would choose on the residual stream as it
// is now (after the attention of layer l - 1, before its experts add to
// it), normed with layer l's FFN norm: the input layer l's router will see,
// less what the rest of layer l - 1 and the attention of l add.
void Engine::predict(uint32_t l, size_t nb) {
  const ModelConfig& c = model_.config;
  const Layer& W = model_.layers[l];
  const size_t ne = c.n_embd, n_exp = c.n_expert, k = c.n_expert_used;
  for (size_t t = 0; t < nb; ++t) rms_norm(x_.data() + t * ne, W.ffn_norm, c.rms_eps, ne, pred_x_.data() + t * ne);
  matmul(W.router, pred_x_.data(), ne, nb, pred_probs_.data(), n_exp);
  std::vector<uint32_t>& guess = predicted_[l];
  guess.clear();
  for (size_t t = 0; t < nb; ++t) {
    // The softmax keeps the order: the top k of the logits are the same.
    top_k(pred_probs_.data() + t * n_exp, n_exp, k, pred_sel_.data());
    guess.insert(guess.end(), pred_sel_.begin(), pred_sel_.begin() + static_cast<ptrdiff_t>(k));
  }
  std::sort(guess.begin(), guess.end());
  guess.erase(std::unique(guess.begin(), guess.end()), guess.end());
  ++prediction_.predictions;
  expert_predictor_(l, guess);
}

void Engine::forward(int32_t token, uint32_t pos, std::span<std::byte* const> blocks, float* logits) {
  forward_batch(std::span(&token, 1), pos, blocks, logits);
}

void Engine::forward_batch(std::span<const int32_t> tokens, uint32_t pos, std::span<std::byte* const> blocks,
                           float* logits) {
  const ModelConfig& c = model_.config;
  const KvLayout& L = layout_;
  const size_t hd = c.head_dim;
  const size_t nb = tokens.size();
  const size_t ne = c.n_embd;
  for (size_t t = 0; t < nb; ++t) {
    dequantize_row(model_.token_embd.type,
                   model_.token_embd.data + static_cast<size_t>(tokens[t]) * model_.token_embd.row_stride, ne,
                   x_.data() + t * ne);
  }
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    const Layer& W = model_.layers[l];
    for (size_t t = 0; t < nb; ++t) rms_norm(x_.data() + t * ne, W.attn_norm, c.rms_eps, ne, xb_.data() + t * xb_w_);
    matmul(W.wq, xb_.data(), xb_w_, nb, q_.data(), q_w_);
    matmul(W.wk, xb_.data(), xb_w_, nb, k_.data(), kv_w_);
    matmul(W.wv, xb_.data(), xb_w_, nb, v_.data(), kv_w_);
    for (size_t t = 0; t < nb; ++t) {
      const auto p = static_cast<uint32_t>(pos + t);
      std::byte* block = blocks[p / L.tokens_per_block];
      const uint32_t slot = p % L.tokens_per_block;
      for (uint32_t h = 0; h < c.n_head; ++h) {
        float* qh = q_.data() + t * q_w_ + h * hd;
        if (W.attn_q_norm != nullptr) rms_norm(qh, W.attn_q_norm, c.rms_eps, hd, qh);
        rope(qh, c.n_rot, p, c.rope_freq_base, c.rope_style);
      }
      for (uint32_t h = 0; h < c.n_head_kv; ++h) {
        if (W.attn_k_norm != nullptr) {
          float* kh = k_.data() + t * kv_w_ + h * hd;
          rms_norm(kh, W.attn_k_norm, c.rms_eps, hd, kh);
        }
        rope(k_.data() + t * kv_w_ + h * hd, c.n_rot, p, c.rope_freq_base, c.rope_style);
        for (uint32_t kv = 0; kv < 2; ++kv) {
          const float* src = (kv == 0 ? k_.data() : v_.data()) + t * kv_w_ + h * hd;
          std::byte* dst = block + L.offset(l, kv, h, slot);
          if (L.elem == KvElem::kF32) {
            std::memcpy(dst, src, hd * 4);
          } else {
            quantize_row(WeightType::kF16, src, hd, dst);
          }
        }
      }
    }
    // Causal: token t reads positions up to pos + t, all written above.
    for (size_t t = 0; t < nb; ++t) attention(l, static_cast<uint32_t>(pos + t), t, blocks);
    matmul(W.wo, att_.data(), q_w_, nb, xb_.data(), xb_w_);
    for (size_t t = 0; t < nb; ++t) {
      for (size_t i = 0; i < ne; ++i) x_[t * ne + i] += xb_[t * xb_w_ + i];
      rms_norm(x_.data() + t * ne, W.ffn_norm, c.rms_eps, ne, xb_.data() + t * xb_w_);
    }
    ffn(l, nb);
  }
  if (logits == nullptr) return;
  const float* last = x_.data() + (nb - 1) * ne;
  rms_norm(last, model_.output_norm, c.rms_eps, ne, xb_.data());
  matmul(model_.output, xb_.data(), xb_w_, 1, logits, 0);
}

}  // namespace airs::infer
