// SPDX-License-Identifier: Apache-2.0
// GGUF writer: a low-level Builder for arbitrary (also malformed) files, and
// llama-shaped synthetic models whose every byte is a pure function of the
// spec, so tests can compute the expected bytes of any file range without
// reading the file. Pure code: writing to an fd is in gguf/file_io.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.hpp"
#include "util/result.hpp"

namespace airs::gguf {

// Appends GGUF primitives to a byte vector. No validation: tests use it to
// build malformed files (wrong counts, bad types, truncation) byte by byte.
// pos() before writing a field is that field's file offset.
class Builder {
 public:
  Builder& u8(uint8_t v) { return put(&v, 1); }
  Builder& u16(uint16_t v) { return put(&v, 2); }
  Builder& u32(uint32_t v) { return put(&v, 4); }
  Builder& i32(int32_t v) { return put(&v, 4); }
  Builder& u64(uint64_t v) { return put(&v, 8); }
  Builder& i64(int64_t v) { return put(&v, 8); }
  Builder& f32(float v) { return put(&v, 4); }
  Builder& f64(double v) { return put(&v, 8); }
  Builder& str(std::string_view s) { u64(s.size()); return put(s.data(), s.size()); }
  Builder& raw(std::span<const std::byte> b) { return put(b.data(), b.size()); }
  Builder& zeros(uint64_t n) { bytes_.resize(bytes_.size() + n); return *this; }
  // Zero padding up to the next multiple of `alignment` (> 0).
  Builder& pad_to(uint64_t alignment);

  // Magic "GGUF", version, tensor count, KV count.
  Builder& header(uint32_t version, uint64_t n_tensors, uint64_t n_kv);
  // One KV record: key, type tag, value.
  Builder& kv_u32(std::string_view key, uint32_t v) { str(key).u32(static_cast<uint32_t>(ValueType::kUint32)); return u32(v); }
  Builder& kv_u64(std::string_view key, uint64_t v) { str(key).u32(static_cast<uint32_t>(ValueType::kUint64)); return u64(v); }
  Builder& kv_i32(std::string_view key, int32_t v) { str(key).u32(static_cast<uint32_t>(ValueType::kInt32)); return i32(v); }
  Builder& kv_f32(std::string_view key, float v) { str(key).u32(static_cast<uint32_t>(ValueType::kFloat32)); return f32(v); }
  Builder& kv_bool(std::string_view key, bool v) { str(key).u32(static_cast<uint32_t>(ValueType::kBool)); return u8(v ? 1 : 0); }
  Builder& kv_str(std::string_view key, std::string_view v) { str(key).u32(static_cast<uint32_t>(ValueType::kString)); return str(v); }
  Builder& kv_scalar(std::string_view key, const Scalar& v);  // type tag from the variant
  Builder& kv_array_str(std::string_view key, std::span<const std::string> items);
  Builder& kv_array_u32(std::string_view key, std::span<const uint32_t> items);
  Builder& kv_array_f32(std::string_view key, std::span<const float> items);
  Builder& kv_array_i32(std::string_view key, std::span<const int32_t> items);
  // One tensor info record; `rel_offset` is relative to the data section.
  Builder& tensor_info(std::string_view name, std::span<const uint64_t> dims, uint32_t type_id, uint64_t rel_offset);

  void patch_u32(size_t at, uint32_t v);
  void patch_u64(size_t at, uint64_t v);

  [[nodiscard]] size_t pos() const noexcept { return bytes_.size(); }
  [[nodiscard]] const std::vector<std::byte>& bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::vector<std::byte> take() noexcept { return std::move(bytes_); }

 private:
  Builder& put(const void* p, size_t n);
  std::vector<std::byte> bytes_;
};

// Bytes of a tensor of `type_id` with `dims` (ne0 first); nullopt if ne0 is
// not a multiple of the block size, a dim is 0, or the size overflows.
[[nodiscard]] std::optional<uint64_t> tensor_nbytes(uint32_t type_id, std::span<const uint64_t> dims) noexcept;

enum class TypeScheme : uint8_t {
  kMixed,  // norms F32, embeddings/attention Q4_K, attn_v/ffn_down Q8_0, ffn_gate/up Q4_0, output F16
  kF32, kF16, kQ8_0, kQ4_0, kQ4_K,  // norms stay F32, every other tensor this type
};
[[nodiscard]] std::optional<TypeScheme> type_scheme_by_name(std::string_view name) noexcept;  // "mixed", "q4_K", ...

struct ModelSpec {
  std::string architecture = "llama";
  std::string name = "airs-synthetic";
  uint32_t version = 3;            // 2 or 3 (same layout)
  uint64_t n_layers = 4;
  uint64_t n_embd = 512;           // multiple of 256 when any tensor is Q4_K
  uint64_t n_head = 4;
  uint64_t n_head_kv = 2;          // divides n_head
  uint64_t n_ff = 1536;            // multiple of 256 when ffn_down is Q4_K
  uint64_t n_vocab = 1024;
  uint64_t context_length = 4096;
  std::optional<uint64_t> key_length;    // written as llama.attention.key_length when set
  std::optional<uint64_t> value_length;  // written as llama.attention.value_length when set
  TypeScheme types = TypeScheme::kMixed;
  // Per-tensor override: given the name and the scheme's choice, the ggml type
  // id to use (must be one of F32/F16/Q8_0/Q4_0/Q4_K and fit the dims).
  std::function<uint32_t(std::string_view name, uint32_t scheme_type)> type_override;
  uint32_t alignment = kDefaultAlignment;  // power of two
  uint64_t seed = 1;
  uint64_t n_vocab_tokens_written = 64;    // tokenizer.ggml.tokens entries (min with n_vocab)
  // llama.cpp-loadable: a full SentencePiece ("llama" tokenizer) vocabulary
  // of n_vocab >= 259 tokens (<unk>, <s>, </s>, the 256 byte tokens
  // <0x00>..<0xFF>, then unique word pieces) with scores, token types and
  // special ids, general.file_type, and numerically sane weights: every
  // float and every quantisation scale has a fixed, finite exponent (norm
  // weights around 1, other weights around 0.01), so a forward pass gives
  // finite logits. n_vocab_tokens_written is ignored. Content is still a pure
  // function of the spec (see expected_file_bytes).
  bool llama_compatible = false;
  // Mixture of experts (0: a dense model). Per layer a router
  // blk.N.ffn_gate_inp.weight [n_embd, n_expert] (always F32: llama.cpp's
  // quantizer never quantizes it) and blk.N.ffn_{gate,up,down}_exps.weight
  // [n_embd, n_ff, n_expert] / [n_ff, n_embd, n_expert] (expert outermost,
  // so one expert is one contiguous slice) instead of the dense FFN;
  // `<arch>.expert_count` / `<arch>.expert_used_count` in the metadata.
  // n_ff is the feed-forward width of one expert. Written for architecture
  // "llama" (the Mixtral layout) and "qwen3moe" (which needs it, and also
  // gets blk.N.attn_q_norm / attn_k_norm [key_length] and
  // `qwen3moe.expert_feed_forward_length`). A dense "qwen3" gets the q/k
  // norms too.
  uint64_t n_expert = 0;
  uint64_t n_expert_used = 0;         // 1..n_expert when n_expert > 0
  // Non-uniform routing for tests (llama_compatible only): expert e's router
  // row is scaled by 2^(-router_skew * e / (n_expert - 1)), so its logits
  // spread 2^router_skew times wider for expert 0 than for the last one and
  // the low-numbered experts win the top-k far more often. A model of the
  // hot experts real routers have, not a measurement of any real model.
  double router_skew = 0.0;
};

// The smallest n_vocab a llama_compatible spec accepts (3 specials + 256 bytes).
inline constexpr uint64_t kLlamaMinVocab = 259;
// The most experts a spec may have.
inline constexpr uint64_t kMaxExperts = 1024;

struct PlannedTensor {
  std::string name;
  uint32_t type_id = 0;
  std::vector<uint64_t> dims;
  uint64_t rel_offset = 0;  // from the data section start
  uint64_t offset = 0;      // absolute
  uint64_t nbytes = 0;
};

// The exact layout a spec produces: header bytes (incl. padding to the data
// section), then tensors at their offsets with zero padding between.
struct ModelPlan {
  ModelSpec spec;
  std::vector<std::byte> header;  // file bytes [0, data_offset)
  uint64_t data_offset = 0;
  uint64_t file_size = 0;         // end of the last tensor, padded to the alignment
  std::vector<PlannedTensor> tensors;
};

// Validates the spec (EINVAL naming the field) and lays the file out.
[[nodiscard]] Result<ModelPlan> plan_model(const ModelSpec& spec);

// Returns `base` with n_embd, n_ff (and, for small targets, n_vocab) scaled
// so the file size is as close to `target_bytes` as the 256-element shape
// granularity allows. EINVAL if even the smallest shape is far too large.
[[nodiscard]] Result<ModelSpec> spec_for_size(ModelSpec base, uint64_t target_bytes);

// Content of tensor `tensor_index` from byte `offset_in_tensor` on: a
// counter-based splitmix64 stream, 8 bytes per word, so any range can be
// computed directly. Pure; thread-safe.
void fill_tensor_bytes(uint64_t seed, uint32_t tensor_index, uint64_t offset_in_tensor, std::span<std::byte> out) noexcept;

// The bytes of the planned file in [file_offset, file_offset + out.size()):
// header, padding (zeros) and tensor data. EINVAL if the range passes the
// end of the file. Pure; thread-safe.
[[nodiscard]] Status expected_file_bytes(const ModelPlan& plan, uint64_t file_offset, std::span<std::byte> out);

// The whole file in memory (for small models in tests and the fuzz corpus).
[[nodiscard]] Result<std::vector<std::byte>> render_model(const ModelPlan& plan);

}  // namespace airs::gguf
