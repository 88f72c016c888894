// airs-llama-mkmodel: writes a llama.cpp-loadable synthetic GGUF (the
// writer's llama_compatible spec: SentencePiece vocabulary with the 256 byte
// tokens, sane random weights). Bytes are a pure function of the arguments.
//
// usage: airs-llama-mkmodel --out FILE [--size 300M] [--layers N] [--embd N]
//                           [--ff N] [--vocab N] [--types mixed|f32|f16|q8_0|q4_0|q4_K] [--seed S]
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "util/units.hpp"

namespace {

bool parse_u64(const char* text, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-') return false;
  *out = v;
  return true;
}

constexpr const char* kUsage =
    "usage: airs-llama-mkmodel --out FILE [--size 300M] [--layers N] [--embd N] [--ff N] [--vocab N]\n"
    "                          [--types mixed|f32|f16|q8_0|q4_0|q4_K] [--seed S]\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace airs;
  gguf::ModelSpec spec;
  spec.llama_compatible = true;
  spec.name = "airs-llama-synthetic";
  std::string out;
  std::string size_text;
  std::string types = "mixed";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string opt = argv[i];
    const char* val = argv[i + 1];
    bool ok = true;
    if (opt == "--out") out = val;
    else if (opt == "--size") size_text = val;
    else if (opt == "--types") types = val;
    else if (opt == "--layers") ok = parse_u64(val, &spec.n_layers);
    else if (opt == "--embd") ok = parse_u64(val, &spec.n_embd);
    else if (opt == "--ff") ok = parse_u64(val, &spec.n_ff);
    else if (opt == "--vocab") ok = parse_u64(val, &spec.n_vocab);
    else if (opt == "--seed") ok = parse_u64(val, &spec.seed);
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "airs-llama-mkmodel: bad option %s %s\n%s", opt.c_str(), val, kUsage);
      return 2;
    }
  }
  if (out.empty() || argc % 2 == 0) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const auto scheme = gguf::type_scheme_by_name(types);
  if (!scheme) {
    std::fprintf(stderr, "airs-llama-mkmodel: --types '%s' is not one of mixed|f32|f16|q8_0|q4_0|q4_K\n", types.c_str());
    return 2;
  }
  spec.types = *scheme;
  if (!size_text.empty()) {
    const auto target = parse_bytes(size_text);
    if (!target || *target == 0) {
      std::fprintf(stderr, "airs-llama-mkmodel: --size '%s' is not a byte size like 300M\n", size_text.c_str());
      return 2;
    }
    auto sized = gguf::spec_for_size(spec, *target);
    if (!sized) {
      std::fprintf(stderr, "airs-llama-mkmodel: %s\n", sized.error().message.c_str());
      return 2;
    }
    spec = std::move(*sized);
  }
  auto plan = gguf::plan_model(spec);
  if (!plan) {
    std::fprintf(stderr, "airs-llama-mkmodel: %s\n", plan.error().message.c_str());
    return 2;
  }
  if (auto st = gguf::write_model_file(*plan, out); !st) {
    std::fprintf(stderr, "airs-llama-mkmodel: %s\n", st.error().message.c_str());
    return 1;
  }
  std::printf("%s: %llu bytes, %llu layers, n_embd %llu, n_ff %llu, n_vocab %llu, seed %llu\n", out.c_str(),
              static_cast<unsigned long long>(plan->file_size), static_cast<unsigned long long>(spec.n_layers),
              static_cast<unsigned long long>(spec.n_embd), static_cast<unsigned long long>(spec.n_ff),
              static_cast<unsigned long long>(spec.n_vocab), static_cast<unsigned long long>(spec.seed));
  return 0;
}
