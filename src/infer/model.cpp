// SPDX-License-Identifier: Apache-2.0
#include "infer/model.hpp"

#include <cstring>

namespace airs::infer {

bool rope_style_for(std::string_view a, RopeStyle* out) noexcept {
  if (a == "llama") {
    *out = RopeStyle::kNormal;
    return true;
  }
  if (a == "qwen2" || a == "qwen3" || a == "qwen3moe" || a == "phi3" || a == "stablelm") {
    *out = RopeStyle::kNeox;
    return true;
  }
  return false;
}

namespace {

std::optional<float> meta_float(const gguf::File& f, const std::string& key) {
  const auto* v = f.find(key);
  if (!v || v->type == gguf::ValueType::kArray) return std::nullopt;
  if (const auto* p = std::get_if<float>(&v->scalar)) return *p;
  if (const auto* p = std::get_if<double>(&v->scalar)) return static_cast<float>(*p);
  return std::nullopt;
}

class Loader {
 public:
  Loader(const gguf::File& f, std::span<const std::byte> m) : f_(f), m_(m) {}

  Result<Matrix> matrix(const std::string& name, uint64_t cols, uint64_t rows) {
    const auto idx = f_.find_tensor(name);
    if (!idx) return make_error(EINVAL, "model: tensor '{}' is missing", name);
    const gguf::TensorInfo& t = f_.tensors[*idx];
    if (t.dims.size() != 2 || t.dims[0] != cols || t.dims[1] != rows) {
      return make_error(EINVAL, "model: tensor '{}' has shape {} (expected [{}, {}])", name, fmt::join(t.dims, "x"),
                        cols, rows);
    }
    return as_matrix(t, name, rows, cols);
  }

  // A 3-D expert tensor [cols, rows, n]: expert 0 as a Matrix.
  Result<Matrix> experts(const std::string& name, uint64_t cols, uint64_t rows, uint64_t n) {
    const auto idx = f_.find_tensor(name);
    if (!idx) return make_error(EINVAL, "model: tensor '{}' is missing", name);
    const gguf::TensorInfo& t = f_.tensors[*idx];
    if (t.dims.size() != 3 || t.dims[0] != cols || t.dims[1] != rows || t.dims[2] != n) {
      return make_error(EINVAL, "model: tensor '{}' has shape {} (expected [{}, {}, {}]: experts outermost)", name,
                        fmt::join(t.dims, "x"), cols, rows, n);
    }
    expert_bytes_ += t.nbytes;
    return as_matrix(t, name, rows, cols);
  }

  // The first `rows` × `cols` of a tensor whose shape was checked, counted
  // in the bytes the model reads.
  Result<Matrix> as_matrix(const gguf::TensorInfo& t, const std::string& name, uint64_t rows, uint64_t cols) {
    Matrix mx;
    if (!weight_type_from_ggml(t.type_id, &mx.type)) {
      return make_error(ENOTSUP, "model: tensor '{}' is {}; the engine reads f32, f16, q8_0, q4_0 and q4_K", name,
                        t.type_name);
    }
    AIRS_TRY(bounds(t));
    mx.data = m_.data() + t.offset;
    mx.rows = rows;
    mx.cols = cols;
    mx.row_stride = row_bytes(mx.type, cols);
    bytes_ += t.nbytes;
    return mx;
  }

  Result<const float*> vector(const std::string& name, uint64_t n) {
    const auto idx = f_.find_tensor(name);
    if (!idx) return make_error(EINVAL, "model: tensor '{}' is missing", name);
    const gguf::TensorInfo& t = f_.tensors[*idx];
    if (t.n_elements != n || t.type_id != 0) {
      return make_error(EINVAL, "model: tensor '{}' must be {} f32 values (is {} {})", name, n, t.n_elements,
                        t.type_name);
    }
    AIRS_TRY(bounds(t));
    if (reinterpret_cast<uintptr_t>(m_.data() + t.offset) % alignof(float) != 0) {
      return make_error(EINVAL, "model: tensor '{}' is not 4-byte aligned in the mapping", name);
    }
    bytes_ += t.nbytes;
    return reinterpret_cast<const float*>(m_.data() + t.offset);
  }

  [[nodiscard]] uint64_t bytes() const { return bytes_; }
  [[nodiscard]] uint64_t expert_bytes() const { return expert_bytes_; }

 private:
  Status bounds(const gguf::TensorInfo& t) const {
    if (t.offset > m_.size() || t.nbytes > m_.size() - t.offset) {
      return make_error(EINVAL, "model: tensor '{}' ends past the mapping ({} bytes)", t.name, m_.size());
    }
    return {};
  }
  const gguf::File& f_;
  std::span<const std::byte> m_;
  uint64_t bytes_ = 0;
  uint64_t expert_bytes_ = 0;
};

Status check_u32(std::string_view what, uint64_t v) {
  if (v == 0 || v > (uint64_t{1} << 24)) return make_error(EINVAL, "model: {} = {} is out of range", what, v);
  return {};
}

// The architecture and the attention geometry: layers, widths, heads.
Status read_geometry(const gguf::File& f, ModelConfig& c) {
  c.architecture = f.architecture;
  if (!rope_style_for(c.architecture, &c.rope_style)) {
    return make_error(ENOTSUP, "model: architecture '{}' is not llama-shaped (llama, qwen2, qwen3, phi3, stablelm)",
                      c.architecture);
  }
  if (!f.geometry) return make_error(EINVAL, "model: '{}' metadata lacks the attention geometry", c.architecture);
  const gguf::ModelGeometry& g = *f.geometry;
  AIRS_TRY(check_u32("block_count", g.block_count));
  AIRS_TRY(check_u32("embedding_length", g.embedding_length));
  AIRS_TRY(check_u32("head_count", g.head_count));
  AIRS_TRY(check_u32("head_count_kv", g.head_count_kv));
  AIRS_TRY(check_u32("key_length", g.key_length));
  if (g.value_length != g.key_length) {
    return make_error(ENOTSUP, "model: value_length {} differs from key_length {}", g.value_length, g.key_length);
  }
  if (g.head_count % g.head_count_kv != 0) {
    return make_error(EINVAL, "model: head_count {} is not a multiple of head_count_kv {}", g.head_count,
                      g.head_count_kv);
  }
  c.n_layer = static_cast<uint32_t>(g.block_count);
  c.n_embd = static_cast<uint32_t>(g.embedding_length);
  c.n_head = static_cast<uint32_t>(g.head_count);
  c.n_head_kv = static_cast<uint32_t>(g.head_count_kv);
  c.head_dim = static_cast<uint32_t>(g.key_length);
  c.context_length = static_cast<uint32_t>(std::min<uint64_t>(g.context_length, uint64_t{1} << 24));
  return {};
}

// Experts: llama.cpp reads expert_count and expert_used_count for every
// architecture; qwen3moe needs them.
Status read_experts(const gguf::File& f, ModelConfig& c) {
  const std::string& a = c.architecture;
  const auto n_exp = f.find_uint(a + ".expert_count").value_or(0);
  const auto n_used = f.find_uint(a + ".expert_used_count").value_or(0);
  if (n_exp == 0 && n_used != 0) {
    return make_error(EINVAL, "model: {}.expert_used_count is {} but {}.expert_count is missing or 0", a, n_used, a);
  }
  if (n_exp == 0 && a == "qwen3moe") return make_error(EINVAL, "model: qwen3moe.expert_count is missing or 0");
  if (n_exp == 0) return {};
  if (a != "llama" && a != "qwen3moe") {
    return make_error(ENOTSUP, "model: {}.expert_count is {}, but the engine runs experts only for llama (the "
                      "Mixtral layout) and qwen3moe", a, n_exp);
  }
  if (n_exp > kMaxExperts) return make_error(EINVAL, "model: {}.expert_count {} is above {}", a, n_exp, kMaxExperts);
  if (n_used == 0) return make_error(EINVAL, "model: {}.expert_used_count is missing or 0 ({} experts)", a, n_exp);
  if (n_used > n_exp) {
    return make_error(EINVAL, "model: {}.expert_used_count {} is greater than {}.expert_count {}", a, n_used, a,
                      n_exp);
  }
  c.n_expert = static_cast<uint32_t>(n_exp);
  c.n_expert_used = static_cast<uint32_t>(n_used);
  return {};
}

// The feed-forward width (of each expert, for a mixture), after the experts.
Status read_feed_forward(const gguf::File& f, ModelConfig& c) {
  const std::string& a = c.architecture;
  const auto ff = f.find_uint(a + ".feed_forward_length");
  // Only qwen3moe reads expert_feed_forward_length; llama.cpp's llama
  // (Mixtral) gives each expert feed_forward_length.
  const auto ff_exp = a == "qwen3moe" ? f.find_uint(a + ".expert_feed_forward_length") : std::nullopt;
  if (ff_exp) {
    AIRS_TRY(check_u32("expert_feed_forward_length", *ff_exp));
    c.n_ff = static_cast<uint32_t>(*ff_exp);
    return {};
  }
  if (!ff) return make_error(EINVAL, "model: {}.feed_forward_length is missing", a);
  AIRS_TRY(check_u32("feed_forward_length", *ff));
  // As llama.cpp: a qwen3moe file without expert_feed_forward_length
  // gives each expert feed_forward_length / expert_used_count.
  c.n_ff = static_cast<uint32_t>(a == "qwen3moe" ? *ff / c.n_expert_used : *ff);
  AIRS_TRY(check_u32("the expert feed-forward width", c.n_ff));
  return {};
}

// Rotary embedding and normalisation constants, after the geometry.
Status read_rope_and_norm(const gguf::File& f, ModelConfig& c) {
  const std::string& a = c.architecture;
  c.n_rot = static_cast<uint32_t>(f.find_uint(a + ".rope.dimension_count").value_or(c.head_dim));
  if (c.n_rot == 0 || c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    return make_error(EINVAL, "model: rope.dimension_count {} must be even and at most key_length {}", c.n_rot,
                      c.head_dim);
  }
  if (a == "qwen3moe" && c.n_rot != c.head_dim) {
    return make_error(EINVAL, "model: qwen3moe needs rope.dimension_count {} equal to key_length {}", c.n_rot,
                      c.head_dim);
  }
  c.rms_eps = meta_float(f, a + ".attention.layer_norm_rms_epsilon").value_or(1e-5F);
  c.rope_freq_base = meta_float(f, a + ".rope.freq_base").value_or(10000.0F);
  return {};
}

// The vocabulary size, from the embedding's shape.
Status read_vocab(const gguf::File& f, ModelConfig& c) {
  const auto te = f.find_tensor("token_embd.weight");
  if (!te || f.tensors[*te].dims.size() != 2) return make_error(EINVAL, "model: token_embd.weight is missing or not 2-D");
  AIRS_TRY(check_u32("n_vocab", f.tensors[*te].dims[1]));
  c.n_vocab = static_cast<uint32_t>(f.tensors[*te].dims[1]);
  return {};
}

Result<ModelConfig> read_config(const gguf::File& f) {
  ModelConfig c;
  AIRS_TRY(read_geometry(f, c));
  AIRS_TRY(read_experts(f, c));
  AIRS_TRY(read_feed_forward(f, c));
  AIRS_TRY(read_rope_and_norm(f, c));
  AIRS_TRY(read_vocab(f, c));
  return c;
}

// Block `l`'s tensors: attention, its optional q/k norms, the feed-forward
// (dense, or a router and its experts).
Result<Layer> load_layer(const gguf::File& f, Loader& ld, const ModelConfig& c, uint32_t l) {
  const std::string& a = c.architecture;
  const std::string p = fmt::format("blk.{}.", l);
  const uint64_t q_dim = uint64_t{c.n_head} * c.head_dim;
  const uint64_t kv_dim = uint64_t{c.n_head_kv} * c.head_dim;
  Layer L;
  auto take = [&](Matrix& dst, const char* name, uint64_t cols, uint64_t rows) -> Status {
    auto r = ld.matrix(p + name, cols, rows);
    if (!r) return std::move(r).error();
    dst = *r;
    return {};
  };
  auto vec = [&](const float*& dst, const char* name, uint64_t n) -> Status {
    auto r = ld.vector(p + name, n);
    if (!r) return std::move(r).error();
    dst = *r;
    return {};
  };
  auto exps = [&](Matrix& dst, const char* name, uint64_t cols, uint64_t rows) -> Status {
    auto r = ld.experts(p + name, cols, rows, c.n_expert);
    if (!r) return std::move(r).error();
    dst = *r;
    return {};
  };
  AIRS_TRY(vec(L.attn_norm, "attn_norm.weight", c.n_embd));
  AIRS_TRY(take(L.wq, "attn_q.weight", c.n_embd, q_dim));
  AIRS_TRY(take(L.wk, "attn_k.weight", c.n_embd, kv_dim));
  AIRS_TRY(take(L.wv, "attn_v.weight", c.n_embd, kv_dim));
  AIRS_TRY(take(L.wo, "attn_output.weight", q_dim, c.n_embd));
  const bool qk_norm = a == "qwen3" || a == "qwen3moe";
  if (qk_norm || f.find_tensor(p + "attn_q_norm.weight") || f.find_tensor(p + "attn_k_norm.weight")) {
    AIRS_TRY(vec(L.attn_q_norm, "attn_q_norm.weight", c.head_dim));
    AIRS_TRY(vec(L.attn_k_norm, "attn_k_norm.weight", c.head_dim));
  }
  AIRS_TRY(vec(L.ffn_norm, "ffn_norm.weight", c.n_embd));
  if (c.n_expert == 0) {
    AIRS_TRY(take(L.w_gate, "ffn_gate.weight", c.n_embd, c.n_ff));
    AIRS_TRY(take(L.w_up, "ffn_up.weight", c.n_embd, c.n_ff));
    AIRS_TRY(take(L.w_down, "ffn_down.weight", c.n_ff, c.n_embd));
  } else {
    AIRS_TRY(take(L.router, "ffn_gate_inp.weight", c.n_embd, c.n_expert));
    AIRS_TRY(exps(L.w_gate, "ffn_gate_exps.weight", c.n_embd, c.n_ff));
    AIRS_TRY(exps(L.w_up, "ffn_up_exps.weight", c.n_embd, c.n_ff));
    AIRS_TRY(exps(L.w_down, "ffn_down_exps.weight", c.n_ff, c.n_embd));
  }
  return L;
}

// The final norm and the output matrix (the embedding's, when tied).
Status load_output(const gguf::File& f, Loader& ld, Model& m) {
  const ModelConfig& c = m.config;
  auto on = ld.vector("output_norm.weight", c.n_embd);
  if (!on) return std::move(on).error();
  m.output_norm = *on;
  if (f.find_tensor("output.weight")) {
    auto out = ld.matrix("output.weight", c.n_embd, c.n_vocab);
    if (!out) return std::move(out).error();
    m.output = *out;
  } else {
    m.output = m.token_embd;  // tied embeddings
  }
  return {};
}

}  // namespace

Result<Model> load_model(const gguf::File& f, std::span<const std::byte> mapping) {
  Model m;
  auto config = read_config(f);
  if (!config) return std::move(config).error();
  m.config = *config;
  const ModelConfig& c = m.config;

  Loader ld(f, mapping);
  auto emb = ld.matrix("token_embd.weight", c.n_embd, c.n_vocab);
  if (!emb) return std::move(emb).error();
  m.token_embd = *emb;
  for (uint32_t l = 0; l < c.n_layer; ++l) {
    auto layer = load_layer(f, ld, c, l);
    if (!layer) return std::move(layer).error();
    m.layers.push_back(*layer);
  }
  AIRS_TRY(load_output(f, ld, m));
  // One token reads every matrix once, but only one row of the embedding.
  m.weight_bytes = ld.bytes() - m.token_embd.rows * m.token_embd.row_stride + m.token_embd.row_stride;
  if (c.n_expert > 0) m.weight_bytes -= ld.expert_bytes() / c.n_expert * (c.n_expert - c.n_expert_used);
  return m;
}

}  // namespace airs::infer
