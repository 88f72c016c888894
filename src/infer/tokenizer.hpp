// SPDX-License-Identifier: Apache-2.0
// The SentencePiece-style ("llama", SPM) tokenizer from a GGUF vocabulary,
// as llama.cpp's llama_tokenize does it with parse_special = false:
//
//  1. BOS first when tokenizer.ggml.add_bos_token (default true) and the
//     caller asks for specials; EOS last when add_eos_token.
//  2. A leading space when tokenizer.ggml.add_space_prefix (default true),
//     then every ' ' becomes U+2581 ("▁").
//  3. The text is split into UTF-8 characters; adjacent symbols whose
//     concatenation is a vocabulary piece are merged, highest piece score
//     first (ties: leftmost), until no pair is a piece.
//  4. A symbol that is not a piece is split back along its merges; a
//     character that never formed a piece becomes its bytes' <0xXX> tokens.
//
// Other vocabularies (tokenizer.ggml.model "gpt2" BPE etc.) are rejected
// with ENOTSUP. Control tokens in the text are not parsed (plain text).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gguf/gguf.hpp"
#include "util/hash.hpp"
#include "util/result.hpp"

namespace airs::infer {

class Tokenizer {
 public:
  // From the tokenizer.ggml.* metadata of `file`; arrays left on disk by the
  // parser are read from `mapping` (file bytes). Errors: ENOTSUP for a
  // non-SPM vocabulary, EINVAL for missing/inconsistent arrays.
  [[nodiscard]] static Result<Tokenizer> from_gguf(const gguf::File& file, std::span<const std::byte> mapping);

  // From plain arrays (tests). types: llama_token_type values (1 normal,
  // 2 unknown, 3 control, 6 byte); empty means all normal.
  [[nodiscard]] static Result<Tokenizer> from_vocab(std::vector<std::string> pieces, std::vector<float> scores,
                                                    std::vector<int32_t> types, int32_t bos, int32_t eos,
                                                    bool add_bos, bool add_space_prefix);

  // Token ids of `text`; with add_special, BOS/EOS as the vocabulary says.
  [[nodiscard]] std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;

  // The text of one token as llama_token_to_piece renders it (▁ -> ' ',
  // byte tokens -> their byte, control tokens -> "").
  [[nodiscard]] std::string piece(int32_t id) const;
  // Concatenated pieces; drops the leading space that add_space_prefix
  // added when `strip_prefix_space`.
  [[nodiscard]] std::string decode(std::span<const int32_t> ids, bool strip_prefix_space = true) const;

  [[nodiscard]] uint32_t n_vocab() const noexcept { return static_cast<uint32_t>(pieces_.size()); }
  [[nodiscard]] int32_t bos() const noexcept { return bos_; }
  [[nodiscard]] int32_t eos() const noexcept { return eos_; }

 private:
  Tokenizer() = default;
  void index();
  void tokenize_raw(std::string_view text, std::vector<int32_t>& out) const;
  [[nodiscard]] int32_t find(std::string_view piece) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t, SeededStringHash, std::equal_to<>> ids_;
  int32_t byte_ids_[256] = {};
  int32_t bos_ = 1;
  int32_t eos_ = 2;
  bool add_bos_ = true;
  bool add_eos_ = false;
  bool add_space_prefix_ = true;
};

}  // namespace airs::infer
