// SPDX-License-Identifier: Apache-2.0
#include "gguf/writer.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "util/units.hpp"

namespace airs::gguf {

// ---- Builder ---------------------------------------------------------------

Builder& Builder::put(const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  bytes_.insert(bytes_.end(), b, b + n);
  return *this;
}

Builder& Builder::pad_to(uint64_t alignment) {
  const uint64_t target = *round_up(bytes_.size(), alignment);
  return zeros(target - bytes_.size());
}

Builder& Builder::header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  return u32(kMagic).u32(version).u64(n_tensors).u64(n_kv);
}

Builder& Builder::kv_scalar(std::string_view key, const Scalar& v) {
  str(key);
  u32(static_cast<uint32_t>(v.index() == 8    ? ValueType::kString
                            : v.index() <= 7  ? static_cast<ValueType>(v.index())
                                              : static_cast<ValueType>(v.index() + 1)));
  std::visit(
      [&](const auto& x) {
        using V = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<V, std::string>) {
          str(x);
        } else if constexpr (std::is_same_v<V, bool>) {
          u8(x ? 1 : 0);
        } else {
          put(&x, sizeof x);
        }
      },
      v);
  return *this;
}

Builder& Builder::kv_array_str(std::string_view key, std::span<const std::string> items) {
  str(key).u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kString));
  u64(items.size());
  for (const auto& s : items) str(s);
  return *this;
}

Builder& Builder::kv_array_u32(std::string_view key, std::span<const uint32_t> items) {
  str(key).u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kUint32));
  u64(items.size());
  for (uint32_t v : items) u32(v);
  return *this;
}

Builder& Builder::kv_array_f32(std::string_view key, std::span<const float> items) {
  str(key).u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kFloat32));
  u64(items.size());
  for (float v : items) f32(v);
  return *this;
}

Builder& Builder::kv_array_i32(std::string_view key, std::span<const int32_t> items) {
  str(key).u32(static_cast<uint32_t>(ValueType::kArray)).u32(static_cast<uint32_t>(ValueType::kInt32));
  u64(items.size());
  for (int32_t v : items) i32(v);
  return *this;
}

Builder& Builder::tensor_info(std::string_view name, std::span<const uint64_t> dims, uint32_t type_id,
                              uint64_t rel_offset) {
  str(name).u32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) u64(d);
  return u32(type_id).u64(rel_offset);
}

void Builder::patch_u32(size_t at, uint32_t v) { std::memcpy(bytes_.data() + at, &v, 4); }
void Builder::patch_u64(size_t at, uint64_t v) { std::memcpy(bytes_.data() + at, &v, 8); }

// ---- sizes and schemes -----------------------------------------------------

std::optional<uint64_t> tensor_nbytes(uint32_t type_id, std::span<const uint64_t> dims) noexcept {
  const TypeTraits t = type_traits(type_id);
  if (t.status != TypeStatus::kSupported || dims.empty()) return std::nullopt;
  if (dims[0] == 0 || dims[0] % t.block_size != 0) return std::nullopt;
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(dims[0] / t.block_size, uint64_t{t.type_size}, &bytes)) return std::nullopt;
  for (size_t i = 1; i < dims.size(); ++i) {
    if (dims[i] == 0 || __builtin_mul_overflow(bytes, dims[i], &bytes)) return std::nullopt;
  }
  return bytes;
}

std::optional<TypeScheme> type_scheme_by_name(std::string_view name) noexcept {
  if (name == "mixed") return TypeScheme::kMixed;
  if (name == "f32") return TypeScheme::kF32;
  if (name == "f16") return TypeScheme::kF16;
  if (name == "q8_0") return TypeScheme::kQ8_0;
  if (name == "q4_0") return TypeScheme::kQ4_0;
  if (name == "q4_K") return TypeScheme::kQ4_K;
  return std::nullopt;
}

namespace {

constexpr auto id(GgmlType t) { return static_cast<uint32_t>(t); }

uint32_t scheme_type(TypeScheme s, std::string_view role) {
  if (role == "attn_norm" || role == "ffn_norm" || role == "output_norm" || role == "attn_q_norm" ||
      role == "attn_k_norm" || role == "ffn_gate_inp") {
    return id(GgmlType::kF32);
  }
  switch (s) {
    case TypeScheme::kF32: return id(GgmlType::kF32);
    case TypeScheme::kF16: return id(GgmlType::kF16);
    case TypeScheme::kQ8_0: return id(GgmlType::kQ8_0);
    case TypeScheme::kQ4_0: return id(GgmlType::kQ4_0);
    case TypeScheme::kQ4_K: return id(GgmlType::kQ4_K);
    case TypeScheme::kMixed: break;
  }
  if (role == "attn_v" || role == "ffn_down") return id(GgmlType::kQ8_0);
  if (role == "ffn_gate" || role == "ffn_up") return id(GgmlType::kQ4_0);
  if (role == "output") return id(GgmlType::kF16);
  return id(GgmlType::kQ4_K);  // token_embd, attn_q, attn_k, attn_output
}

// A scheme's choice degrades to a smaller block size when ne0 does not fit
// (tiny random shapes), so every spec with dims >= 1 has a valid layout.
uint32_t fit_type(uint32_t t, uint64_t ne0) {
  for (uint32_t cand : {t, id(GgmlType::kQ8_0), id(GgmlType::kF16)}) {
    if (ne0 % type_traits(cand).block_size == 0) return cand;
  }
  return id(GgmlType::kF16);
}

Status check_u32(std::string_view field, uint64_t v) {
  if (v == 0 || v > std::numeric_limits<uint32_t>::max()) {
    return make_error(EINVAL, "model spec: {} = {} must be between 1 and 2^32-1", field, v);
  }
  return {};
}

constexpr uint64_t mix64(uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// ---- llama_compatible models ----

// llama.cpp token types (llama_token_type).
constexpr int32_t kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokByte = 6;

// Bijective base 26: 0 -> "a", 25 -> "z", 26 -> "aa", ...
std::string letters(uint64_t k) {
  std::string out;
  for (uint64_t n = k + 1; n > 0; n = (n - 1) / 26) out.insert(out.begin(), static_cast<char>('a' + (n - 1) % 26));
  return out;
}

// A SentencePiece-style vocabulary: llama.cpp's "llama" (SPM) tokenizer
// needs <unk>/<s>/</s>, the byte-fallback tokens (it looks up <0x0A> for the
// newline) and n_vocab unique pieces; U+2581 is SentencePiece's space.
void llama_vocab(uint64_t n_vocab, std::vector<std::string>& tokens, std::vector<float>& scores,
                 std::vector<int32_t>& types) {
  tokens.reserve(n_vocab);
  scores.reserve(n_vocab);
  types.reserve(n_vocab);
  tokens = {"<unk>", "<s>", "</s>"};
  scores = {0.0F, 0.0F, 0.0F};
  types = {kTokUnknown, kTokControl, kTokControl};
  for (uint64_t b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    scores.push_back(0.0F);
    types.push_back(kTokByte);
  }
  for (uint64_t j = 0; tokens.size() < n_vocab; ++j) {
    tokens.push_back((j % 2 == 0 ? std::string("\xE2\x96\x81") : std::string()) + letters(j / 2));
    scores.push_back(-static_cast<float>(j + 1));
    types.push_back(kTokNormal);
  }
}

// llama_ftype for general.file_type (informational for llama.cpp).
uint32_t llama_file_type(TypeScheme s) {
  switch (s) {
    case TypeScheme::kF32: return 0;
    case TypeScheme::kF16: return 1;
    case TypeScheme::kQ4_0: return 2;
    case TypeScheme::kQ8_0: return 7;
    case TypeScheme::kQ4_K: return 15;   // MOSTLY_Q4_K_M
    case TypeScheme::kMixed: return 15;
  }
  return 0;
}

// Overwrites, in `out` (tensor bytes from `offset_in_tensor` on), every
// byte at position `pos` within each `block`-byte element/block with
// (byte & keep) | set: that pins the exponent of a float or a quantisation
// scale to a finite value while the random mantissa/quants stay.
void pin_byte(std::span<std::byte> out, uint64_t offset_in_tensor, uint64_t block, uint64_t pos, uint8_t keep,
              uint8_t set) {
  const uint64_t first_block = offset_in_tensor / block;
  uint64_t at = first_block * block + pos;
  if (at < offset_in_tensor) at += block;
  for (; at < offset_in_tensor + out.size(); at += block) {
    auto& b = out[static_cast<size_t>(at - offset_in_tensor)];
    b = static_cast<std::byte>((static_cast<uint8_t>(b) & keep) | set);
  }
}

// Makes random tensor bytes numerically sane for llama.cpp: norm weights
// with magnitude in [0.5, 2), other weights around 0.01 (see ModelSpec).
void sanitize_for_llama(const PlannedTensor& t, uint64_t offset_in_tensor, std::span<std::byte> out) {
  const bool norm = t.name.find("_norm") != std::string::npos;
  switch (static_cast<GgmlType>(t.type_id)) {
    case GgmlType::kF32:  // byte 3 = sign + exponent[7:1]: 126/127 or 120/121
      pin_byte(out, offset_in_tensor, 4, 3, 0x80, norm ? 0x3F : 0x3C);
      break;
    case GgmlType::kF16:  // byte 1 = sign, 5-bit exponent, 2 mantissa bits
      pin_byte(out, offset_in_tensor, 2, 1, 0x83, static_cast<uint8_t>((norm ? 15 : 8) << 2));
      break;
    case GgmlType::kQ8_0:  // f16 d then 32 x int8: d ~ 2^-12
      pin_byte(out, offset_in_tensor, 34, 1, 0x03, 3 << 2);
      break;
    case GgmlType::kQ4_0:  // f16 d then 16 bytes of nibbles: d ~ 2^-8
      pin_byte(out, offset_in_tensor, 18, 1, 0x03, 7 << 2);
      break;
    case GgmlType::kQ4_K:  // f16 d, f16 dmin, 12 scale bytes, 128 quant bytes
      // w = d*sc*q - dmin*m with sc, m in [0, 64), q in [0, 16): d ~ 2^-14
      // and dmin ~ 8 d keep the mean near zero (a common positive bias would
      // drive every hidden state to one direction and every output to one
      // token).
      pin_byte(out, offset_in_tensor, 144, 1, 0x03, 1 << 2);
      pin_byte(out, offset_in_tensor, 144, 3, 0x03, 4 << 2);
      break;
    default:
      break;
  }
}

// Scales the router's row e (expert e; F32, sanitized) by
// 2^(-skew * e / (n_expert - 1)) (see ModelSpec::router_skew). A range may
// cut a float: each one it touches is computed whole, then the bytes in
// the range are copied.
void skew_router(const ModelSpec& s, const PlannedTensor& t, uint32_t index, uint64_t offset_in_tensor,
                 std::span<std::byte> out) {
  const uint64_t n_embd = t.dims[0];
  const double span = s.n_expert > 1 ? static_cast<double>(s.n_expert - 1) : 1.0;
  for (uint64_t elem = offset_in_tensor / 4; elem * 4 < offset_in_tensor + out.size(); ++elem) {
    std::array<std::byte, 4> b{};
    fill_tensor_bytes(s.seed, index, elem * 4, b);
    sanitize_for_llama(t, elem * 4, b);
    float v = 0;
    std::memcpy(&v, b.data(), 4);
    v *= static_cast<float>(std::exp2(-s.router_skew * static_cast<double>(elem / n_embd) / span));
    std::memcpy(b.data(), &v, 4);
    const uint64_t lo = std::max(elem * 4, offset_in_tensor);
    const uint64_t hi = std::min(elem * 4 + 4, offset_in_tensor + out.size());
    std::memcpy(out.data() + (lo - offset_in_tensor), b.data() + (lo - elem * 4), hi - lo);
  }
}

}  // namespace

// ---- planning --------------------------------------------------------------

namespace {

// The spec's numbers, each against what a reader and the runtimes accept.
Status check_spec(const ModelSpec& s) {
  const bool qwen3moe = s.architecture == "qwen3moe";
  if (s.architecture.empty()) return make_error(EINVAL, "model spec: architecture is empty");
  if (s.version != 2 && s.version != 3) return make_error(EINVAL, "model spec: version {} is not 2 or 3", s.version);
  AIRS_TRY(check_u32("n_layers", s.n_layers));
  AIRS_TRY(check_u32("n_embd", s.n_embd));
  AIRS_TRY(check_u32("n_head", s.n_head));
  AIRS_TRY(check_u32("n_head_kv", s.n_head_kv));
  AIRS_TRY(check_u32("n_ff", s.n_ff));
  AIRS_TRY(check_u32("n_vocab", s.n_vocab));
  AIRS_TRY(check_u32("context_length", s.context_length));
  if (s.n_head % s.n_head_kv != 0) {
    return make_error(EINVAL, "model spec: n_head {} is not a multiple of n_head_kv {}", s.n_head, s.n_head_kv);
  }
  if ((!s.key_length || !s.value_length) && s.n_embd % s.n_head != 0) {
    return make_error(EINVAL, "model spec: n_embd {} is not a multiple of n_head {}", s.n_embd, s.n_head);
  }
  if (!is_pow2(s.alignment) || s.alignment > (uint32_t{1} << 30)) {
    return make_error(EINVAL, "model spec: alignment {} is not a power of two up to 1 GiB", s.alignment);
  }
  if (s.n_expert == 0) {
    if (s.n_expert_used != 0) {
      return make_error(EINVAL, "model spec: n_expert_used {} without experts (n_expert 0)", s.n_expert_used);
    }
    if (qwen3moe) return make_error(EINVAL, "model spec: a qwen3moe model needs n_expert > 0");
  } else {
    if (s.architecture != "llama" && !qwen3moe) {
      return make_error(EINVAL, "model spec: experts are written for architecture llama or qwen3moe, not '{}'",
                        s.architecture);
    }
    if (s.n_expert > kMaxExperts) {
      return make_error(EINVAL, "model spec: n_expert {} is above {}", s.n_expert, kMaxExperts);
    }
    if (s.n_expert_used == 0 || s.n_expert_used > s.n_expert) {
      return make_error(EINVAL, "model spec: n_expert_used {} must be between 1 and n_expert {}", s.n_expert_used,
                        s.n_expert);
    }
  }
  if (!(s.router_skew >= 0.0 && s.router_skew <= 64.0)) {
    return make_error(EINVAL, "model spec: router_skew {} must be between 0 and 64", s.router_skew);
  }
  if (s.router_skew != 0.0 && (s.n_expert == 0 || !s.llama_compatible)) {
    return make_error(EINVAL, "model spec: router_skew needs experts and llama-compatible weights");
  }
  return {};
}

// Every tensor in file order: the embeddings, each block's, the output.
Status plan_tensors(const ModelSpec& s, uint64_t kl, uint64_t vl, ModelPlan& plan) {
  const bool qwen3moe = s.architecture == "qwen3moe";
  const bool a_is_qwen3 = s.architecture == "qwen3";  // dense, with q/k norms too
  auto add = [&](std::string name, std::string_view role, std::vector<uint64_t> dims) -> Status {
    uint32_t t = fit_type(scheme_type(s.types, role), dims[0]);
    if (s.type_override) t = s.type_override(name, t);
    const auto nb = tensor_nbytes(t, dims);
    if (!nb) {
      return make_error(EINVAL, "model spec: tensor '{}' cannot be type {} with ne0 = {}", name, type_traits(t).name,
                        dims[0]);
    }
    plan.tensors.push_back(PlannedTensor{std::move(name), t, std::move(dims), 0, 0, *nb});
    return {};
  };
  AIRS_TRY(add("token_embd.weight", "token_embd", {s.n_embd, s.n_vocab}));
  for (uint64_t l = 0; l < s.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    AIRS_TRY(add(p + "attn_norm.weight", "attn_norm", {s.n_embd}));
    AIRS_TRY(add(p + "attn_q.weight", "attn_q", {s.n_embd, s.n_head * kl}));
    AIRS_TRY(add(p + "attn_k.weight", "attn_k", {s.n_embd, s.n_head_kv * kl}));
    AIRS_TRY(add(p + "attn_v.weight", "attn_v", {s.n_embd, s.n_head_kv * vl}));
    AIRS_TRY(add(p + "attn_output.weight", "attn_output", {s.n_head * vl, s.n_embd}));
    if (qwen3moe || a_is_qwen3) {
      AIRS_TRY(add(p + "attn_q_norm.weight", "attn_q_norm", {kl}));
      AIRS_TRY(add(p + "attn_k_norm.weight", "attn_k_norm", {kl}));
    }
    AIRS_TRY(add(p + "ffn_norm.weight", "ffn_norm", {s.n_embd}));
    if (s.n_expert == 0) {
      AIRS_TRY(add(p + "ffn_gate.weight", "ffn_gate", {s.n_embd, s.n_ff}));
      AIRS_TRY(add(p + "ffn_up.weight", "ffn_up", {s.n_embd, s.n_ff}));
      AIRS_TRY(add(p + "ffn_down.weight", "ffn_down", {s.n_ff, s.n_embd}));
    } else {
      AIRS_TRY(add(p + "ffn_gate_inp.weight", "ffn_gate_inp", {s.n_embd, s.n_expert}));
      AIRS_TRY(add(p + "ffn_gate_exps.weight", "ffn_gate", {s.n_embd, s.n_ff, s.n_expert}));
      AIRS_TRY(add(p + "ffn_up_exps.weight", "ffn_up", {s.n_embd, s.n_ff, s.n_expert}));
      AIRS_TRY(add(p + "ffn_down_exps.weight", "ffn_down", {s.n_ff, s.n_embd, s.n_expert}));
    }
  }
  AIRS_TRY(add("output_norm.weight", "output_norm", {s.n_embd}));
  AIRS_TRY(add("output.weight", "output", {s.n_embd, s.n_vocab}));

  return {};
}

// Each tensor's offset in the data section (aligned); returns its size.
Result<uint64_t> lay_out_data(const ModelSpec& s, ModelPlan& plan) {
  uint64_t rel = 0;
  for (auto& t : plan.tensors) {
    const auto start = round_up(rel, s.alignment);
    if (!start || __builtin_add_overflow(*start, t.nbytes, &rel)) {
      return make_error(EINVAL, "model spec: file size overflows at tensor '{}'", t.name);
    }
    t.rel_offset = *start;
  }
  return rel;
}

struct Vocabulary {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_types;
};

// A llama-compatible vocabulary (specials and byte tokens), or placeholder
// tokens for the first n_vocab_tokens_written ids.
Result<Vocabulary> plan_vocabulary(const ModelSpec& s) {
  Vocabulary v;
  auto& tokens = v.tokens;
  auto& scores = v.scores;
  auto& token_types = v.token_types;
  if (s.llama_compatible) {
    if (s.n_vocab < kLlamaMinVocab) {
      return make_error(EINVAL, "model spec: n_vocab {} is below {} (a llama-compatible vocabulary needs 3 specials and "
                        "256 byte tokens)", s.n_vocab, kLlamaMinVocab);
    }
    llama_vocab(s.n_vocab, tokens, scores, token_types);
  } else {
    const uint64_t n_tok = std::min(s.n_vocab, s.n_vocab_tokens_written);
    tokens.reserve(n_tok);
    for (uint64_t i = 0; i < n_tok; ++i) {
      tokens.push_back(i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : fmt::format("<0x{:02X}>", i - 3));
      scores.push_back(-static_cast<float>(i));
    }
  }
  return v;
}

// The header: metadata (architecture, shape, tokenizer) and tensor infos.
std::vector<std::byte> write_header(const ModelSpec& s, const ModelPlan& plan, uint64_t kl, uint64_t vl,
                                   const Vocabulary& v) {
  const std::string& a = s.architecture;
  const bool qwen3moe = a == "qwen3moe";
  const auto& tokens = v.tokens;
  const auto& scores = v.scores;
  const auto& token_types = v.token_types;
  Builder b;
  const size_t kv_count_at = 16;
  b.header(s.version, plan.tensors.size(), 0);
  uint64_t n_kv = 0;
  auto kv = [&](auto&& fn) { fn(); ++n_kv; };
  kv([&] { b.kv_str("general.architecture", a); });
  kv([&] { b.kv_str("general.name", s.name); });
  kv([&] { b.kv_u32("general.alignment", s.alignment); });
  kv([&] { b.kv_u32(a + ".block_count", static_cast<uint32_t>(s.n_layers)); });
  kv([&] { b.kv_u32(a + ".context_length", static_cast<uint32_t>(s.context_length)); });
  kv([&] { b.kv_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd)); });
  kv([&] { b.kv_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.n_ff)); });
  if (s.n_expert > 0) {
    kv([&] { b.kv_u32(a + ".expert_count", static_cast<uint32_t>(s.n_expert)); });
    kv([&] { b.kv_u32(a + ".expert_used_count", static_cast<uint32_t>(s.n_expert_used)); });
    if (qwen3moe) kv([&] { b.kv_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(s.n_ff)); });
  }
  kv([&] { b.kv_u32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head)); });
  kv([&] { b.kv_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv)); });
  if (s.key_length) kv([&] { b.kv_u32(a + ".attention.key_length", static_cast<uint32_t>(kl)); });
  if (s.value_length) kv([&] { b.kv_u32(a + ".attention.value_length", static_cast<uint32_t>(vl)); });
  kv([&] { b.kv_u32(a + ".rope.dimension_count", static_cast<uint32_t>(kl)); });
  kv([&] { b.kv_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5F); });
  kv([&] { b.kv_u32(a + ".vocab_size", static_cast<uint32_t>(s.n_vocab)); });
  kv([&] { b.kv_str("tokenizer.ggml.model", "llama"); });
  kv([&] { b.kv_array_str("tokenizer.ggml.tokens", tokens); });
  kv([&] { b.kv_array_f32("tokenizer.ggml.scores", scores); });
  // The reader rejects a special id outside the vocabulary (so must every
  // runtime): with fewer than 2 tokens there is no <s> to point at.
  if (tokens.size() > 1) kv([&] { b.kv_u32("tokenizer.ggml.bos_token_id", 1); });
  kv([&] { b.kv_bool("tokenizer.ggml.add_bos_token", true); });
  if (s.llama_compatible) {
    kv([&] { b.kv_u32("general.file_type", llama_file_type(s.types)); });
    kv([&] { b.kv_array_i32("tokenizer.ggml.token_type", token_types); });
    kv([&] { b.kv_u32("tokenizer.ggml.eos_token_id", 2); });
    kv([&] { b.kv_u32("tokenizer.ggml.unknown_token_id", 0); });
    kv([&] { b.kv_bool("tokenizer.ggml.add_eos_token", false); });
  }
  b.patch_u64(kv_count_at, n_kv);
  for (const auto& t : plan.tensors) b.tensor_info(t.name, t.dims, t.type_id, t.rel_offset);
  return b.take();
}

}  // namespace

Result<ModelPlan> plan_model(const ModelSpec& s) {
  AIRS_TRY(check_spec(s));
  const uint64_t kl = s.key_length.value_or(s.n_embd / s.n_head);
  const uint64_t vl = s.value_length.value_or(s.n_embd / s.n_head);
  AIRS_TRY(check_u32("key_length", kl));
  AIRS_TRY(check_u32("value_length", vl));
  ModelPlan plan;
  plan.spec = s;
  AIRS_TRY(plan_tensors(s, kl, vl, plan));
  auto rel = lay_out_data(s, plan);
  if (!rel) return std::move(rel).error();
  auto vocab = plan_vocabulary(s);
  if (!vocab) return std::move(vocab).error();
  plan.header = write_header(s, plan, kl, vl, *vocab);
  plan.data_offset = *round_up(plan.header.size(), s.alignment);
  for (auto& t : plan.tensors) {
    if (__builtin_add_overflow(plan.data_offset, t.rel_offset, &t.offset)) {
      return make_error(EINVAL, "model spec: file size overflows at tensor '{}'", t.name);
    }
  }
  const auto end = round_up(*rel, s.alignment);
  if (!end || __builtin_add_overflow(plan.data_offset, *end, &plan.file_size)) {
    return make_error(EINVAL, "model spec: file size overflows");
  }
  return plan;
}

Result<ModelSpec> spec_for_size(ModelSpec base, uint64_t target) {
  auto shape = [&](uint64_t k, uint64_t vocab) {
    ModelSpec s = base;
    s.n_embd = 256 * k;
    s.n_head = std::max<uint64_t>(1, s.n_embd / 128);
    s.n_head_kv = 1;
    for (uint64_t d = s.n_head / 4; d >= 1; --d) {
      if (s.n_head % d == 0) {
        s.n_head_kv = d;
        break;
      }
    }
    s.n_ff = *round_up(s.n_embd * 8 / 3, 256);
    s.n_vocab = vocab;
    s.key_length.reset();
    s.value_length.reset();
    return s;
  };
  auto size_of = [](const ModelSpec& s) -> uint64_t {
    auto p = plan_model(s);
    return p ? p->file_size : std::numeric_limits<uint64_t>::max();
  };
  // Small targets: shrink the vocabulary first (the embedding dominates).
  uint64_t vocab = base.n_vocab;
  const uint64_t min_vocab = base.llama_compatible ? kLlamaMinVocab : 256;
  while (vocab > min_vocab && size_of(shape(1, vocab)) > target) vocab = std::max<uint64_t>(min_vocab, vocab / 2);
  ModelSpec best = shape(1, vocab);
  uint64_t best_size = size_of(best);
  if (best_size == std::numeric_limits<uint64_t>::max()) return make_error(EINVAL, "model spec: invalid base spec");
  if (best_size > target * 2 + kMiB) {
    return make_error(EINVAL, "model spec: the smallest {}-layer model is {} bytes, far above the target {}",
                      base.n_layers, best_size, target);
  }
  // File size grows monotonically with n_embd; stop once past the target.
  for (uint64_t k = 2; k <= 256; ++k) {
    ModelSpec s = shape(k, vocab);
    const uint64_t sz = size_of(s);
    const auto dist = [&](uint64_t v) { return v > target ? v - target : target - v; };
    if (dist(sz) < dist(best_size)) {
      best = s;
      best_size = sz;
    }
    if (sz > target) break;
  }
  return best;
}

// ---- content ---------------------------------------------------------------

void fill_tensor_bytes(uint64_t seed, uint32_t tensor_index, uint64_t offset_in_tensor,
                       std::span<std::byte> out) noexcept {
  const uint64_t base = mix64(seed ^ mix64(uint64_t{tensor_index} + 0x9e3779b97f4a7c15ULL));
  uint64_t word = offset_in_tensor / 8;
  size_t skip = static_cast<size_t>(offset_in_tensor % 8);
  size_t done = 0;
  if (skip != 0) {
    const uint64_t v = mix64(base + word * 0x9e3779b97f4a7c15ULL);
    const size_t n = std::min(out.size(), 8 - skip);
    std::memcpy(out.data(), reinterpret_cast<const std::byte*>(&v) + skip, n);
    done = n;
    ++word;
  }
  std::byte* p = out.data() + done;
  const size_t whole = (out.size() - done) / 8;
  for (size_t i = 0; i < whole; ++i, ++word) {
    const uint64_t v = mix64(base + word * 0x9e3779b97f4a7c15ULL);
    std::memcpy(p + i * 8, &v, 8);
  }
  done += whole * 8;
  if (done < out.size()) {
    const uint64_t v = mix64(base + word * 0x9e3779b97f4a7c15ULL);
    std::memcpy(out.data() + done, &v, out.size() - done);
  }
}

Status expected_file_bytes(const ModelPlan& plan, uint64_t file_offset, std::span<std::byte> out) {
  if (file_offset > plan.file_size || out.size() > plan.file_size - file_offset) {
    return make_error(EINVAL, "model plan: range [{}, +{}) passes the end of the file ({} bytes)", file_offset,
                      out.size(), plan.file_size);
  }
  std::memset(out.data(), 0, out.size());
  const uint64_t end = file_offset + out.size();
  if (file_offset < plan.header.size()) {
    const uint64_t n = std::min<uint64_t>(plan.header.size(), end) - file_offset;
    std::memcpy(out.data(), plan.header.data() + file_offset, static_cast<size_t>(n));
  }
  // Tensors are laid out in order: find the first that ends after the start.
  auto it = std::partition_point(plan.tensors.begin(), plan.tensors.end(),
                                 [&](const PlannedTensor& t) { return t.offset + t.nbytes <= file_offset; });
  for (; it != plan.tensors.end() && it->offset < end; ++it) {
    const uint64_t a = std::max(file_offset, it->offset);
    const uint64_t b = std::min(end, it->offset + it->nbytes);
    if (a >= b) continue;
    const auto index = static_cast<uint32_t>(it - plan.tensors.begin());
    const auto dst = out.subspan(static_cast<size_t>(a - file_offset), static_cast<size_t>(b - a));
    fill_tensor_bytes(plan.spec.seed, index, a - it->offset, dst);
    if (plan.spec.llama_compatible) sanitize_for_llama(*it, a - it->offset, dst);
    if (plan.spec.router_skew != 0.0 && it->name.ends_with("ffn_gate_inp.weight")) {
      skew_router(plan.spec, *it, index, a - it->offset, dst);
    }
  }
  return {};
}

Result<std::vector<std::byte>> render_model(const ModelPlan& plan) {
  if (plan.file_size > (uint64_t{1} << 32)) {
    return make_error(EINVAL, "model plan: {} bytes is too large to render in memory", plan.file_size);
  }
  std::vector<std::byte> bytes(static_cast<size_t>(plan.file_size));
  AIRS_TRY(expected_file_bytes(plan, 0, bytes));
  return bytes;
}

}  // namespace airs::gguf
