// SPDX-License-Identifier: Apache-2.0
// Writes the fuzz seed corpus: small valid models from the writer (every
// scheme, both versions, several alignments) and a few hand-built files.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "gguf/writer.hpp"

namespace {

bool write(const std::filesystem::path& p, const std::vector<std::byte>& b) {
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  return static_cast<bool>(o);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace airs::gguf;
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_fuzz_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "gguf_fuzz_seeds: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  int n = 0;
  const TypeScheme schemes[] = {TypeScheme::kMixed, TypeScheme::kF32, TypeScheme::kF16, TypeScheme::kQ8_0,
                                TypeScheme::kQ4_0};
  for (TypeScheme sc : schemes) {
    for (uint32_t align : {1U, 32U, 64U}) {
      ModelSpec s;
      s.n_layers = 1 + static_cast<uint64_t>(n % 2);
      s.n_embd = 32;
      s.n_head = 2;
      s.n_head_kv = 1;
      s.n_ff = 32;
      s.n_vocab = 4;
      s.n_vocab_tokens_written = 4;
      s.types = sc;
      s.alignment = align;
      s.version = n % 2 == 0 ? 3 : 2;
      s.seed = static_cast<uint64_t>(n);
      if (n % 3 == 0) {
        s.key_length = 32;
        s.value_length = 32;
      }
      auto plan = plan_model(s);
      auto bytes = plan ? render_model(*plan) : plan.error();
      if (!bytes) {
        std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", bytes.error().message.c_str());
        return 1;
      }
      if (!write(dir / ("model-" + std::to_string(n++) + ".gguf"), *bytes)) return 1;
    }
  }
  // Mixtures of experts: 3-D tensors, expert keys, q/k norms.
  for (const char* arch : {"llama", "qwen3moe"}) {
    ModelSpec s;
    s.architecture = arch;
    s.n_layers = 1;
    s.n_embd = 32;
    s.n_head = 2;
    s.n_head_kv = 1;
    s.n_ff = 32;
    s.n_vocab = 4;
    s.n_vocab_tokens_written = 4;
    s.types = TypeScheme::kQ8_0;
    s.n_expert = 4;
    s.n_expert_used = 2;
    auto plan = plan_model(s);
    auto bytes = plan ? render_model(*plan) : plan.error();
    if (!bytes) {
      std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", bytes.error().message.c_str());
      return 1;
    }
    if (!write(dir / ("model-moe-" + std::string(arch) + ".gguf"), *bytes)) return 1;
  }
  Builder b;
  b.header(3, 2, 3).kv_str("general.architecture", "llama").kv_u32("llama.block_count", 1);
  const std::vector<std::string> toks{"a", "b", "c"};
  b.kv_array_str("tokenizer.ggml.tokens", toks);
  b.tensor_info("token_embd.weight", std::vector<uint64_t>{8, 2}, 0, 0);
  b.tensor_info("blk.0.attn_q.weight", std::vector<uint64_t>{32}, 8, 64);
  b.pad_to(32).zeros(64 + 34);
  if (!write(dir / "hand-1.gguf", b.take())) return 1;
  // A consistent tokenizer (tokens, scores, token types, merges, special
  // ids) so mutations reach the cross-checks between those keys.
  Builder t;
  t.header(3, 0, 7);
  const std::vector<std::string> vocab{"<unk>", "<s>", "</s>", "a", "b"};
  t.kv_array_str("tokenizer.ggml.tokens", vocab);
  t.kv_array_f32("tokenizer.ggml.scores", std::vector<float>{0, 0, 0, -1, -2});
  t.kv_array_i32("tokenizer.ggml.token_type", std::vector<int32_t>{2, 3, 3, 1, 1});
  t.kv_array_str("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
  t.kv_u32("tokenizer.ggml.bos_token_id", 1).kv_u32("tokenizer.ggml.eos_token_id", 2);
  t.kv_u32("tokenizer.ggml.padding_token_id", 0);
  if (!write(dir / "hand-tokenizer.gguf", t.take())) return 1;
  std::printf("wrote %d seeds to %s\n", n + 2, dir.c_str());
  return 0;
}
