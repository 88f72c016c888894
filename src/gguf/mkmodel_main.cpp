// SPDX-License-Identifier: Apache-2.0
// airs-mkmodel: writes a synthetic llama-shaped GGUF model whose bytes are a
// pure function of its arguments (see gguf/writer.hpp). Used by the demo, the
// tests and the benchmarks.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "gguf/file_io.hpp"
#include "gguf/writer.hpp"
#include "util/units.hpp"

namespace {

namespace gguf = airs::gguf;

constexpr const char* kUsage =
    "usage: airs-mkmodel --out FILE [--size 1G | --layers N --embd N --ff N --vocab N]\n"
    "                    [--heads N] [--heads-kv N] [--context N] [--seed S]\n"
    "                    [--types mixed|f32|f16|q8_0|q4_0|q4_K] [--alignment 32] [--gguf-version 3] [--llama]\n"
    "                    [--arch llama|qwen3moe|NAME] [--experts N --experts-used K] [--router-skew X]\n"
    "  --experts N --experts-used K: a mixture of experts (N experts per layer, K of\n"
    "    them per token; --ff is one expert's width). --arch qwen3moe needs them.\n"
    "  --router-skew X: expert e's router row scaled by 2^(-X*e/(N-1)), so a few\n"
    "    experts win most tokens (needs --llama). A model of skewed real routing,\n"
    "    not a measurement.\n";

bool parse_u64(const char* text, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-') return false;
  *out = v;
  return true;
}

// What the command line asked for.
struct Args {
  std::string out;
  std::string size_text;
  std::string types = "mixed";
  gguf::ModelSpec spec;
};

enum class OptResult { kOk, kNotNumber, kUnknown };

// One option that takes a value.
OptResult take_option(const std::string& opt, const char* val, Args& a) {
  gguf::ModelSpec& spec = a.spec;
  uint64_t n = 0;
  auto num = [&](uint64_t* dst) {
    if (!parse_u64(val, &n)) return false;
    *dst = n;
    return true;
  };
  bool ok = true;
  if (opt == "--out") a.out = val;
  else if (opt == "--size") a.size_text = val;
  else if (opt == "--types") a.types = val;
  else if (opt == "--layers") ok = num(&spec.n_layers);
  else if (opt == "--embd") ok = num(&spec.n_embd);
  else if (opt == "--ff") ok = num(&spec.n_ff);
  else if (opt == "--vocab") ok = num(&spec.n_vocab);
  else if (opt == "--heads") ok = num(&spec.n_head);
  else if (opt == "--heads-kv") ok = num(&spec.n_head_kv);
  else if (opt == "--context") ok = num(&spec.context_length);
  else if (opt == "--seed") ok = num(&spec.seed);
  else if (opt == "--arch") spec.architecture = val;
  else if (opt == "--experts") ok = num(&spec.n_expert);
  else if (opt == "--experts-used") ok = num(&spec.n_expert_used);
  else if (opt == "--router-skew") {
    char* end = nullptr;
    spec.router_skew = std::strtod(val, &end);
    ok = end != val && *end == '\0';
  }
  else if (opt == "--alignment" || opt == "--gguf-version") {
    ok = parse_u64(val, &n) && n <= UINT32_MAX;
    (opt == "--alignment" ? spec.alignment : spec.version) = static_cast<uint32_t>(n);
  } else {
    return OptResult::kUnknown;
  }
  return ok ? OptResult::kOk : OptResult::kNotNumber;
}

// The command line into `a`: an exit code when the run ends here (help, or
// a usage error already printed), nothing to go on.
// Small, fixed option set: parsed by hand (CLI11's header trips
// -Wnull-dereference under -Werror with GCC 12).
std::optional<int> parse_args(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string opt = argv[i];
    if (opt == "-h" || opt == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (opt == "--llama") {
      // A vocabulary and weights the real llama.cpp loads and runs.
      a.spec.llama_compatible = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "airs-mkmodel: %s needs a value\n%s", opt.c_str(), kUsage);
      return 2;
    }
    const char* val = argv[++i];
    switch (take_option(opt, val, a)) {
      case OptResult::kOk:
        break;
      case OptResult::kUnknown:
        std::fprintf(stderr, "airs-mkmodel: unknown option %s\n%s", opt.c_str(), kUsage);
        return 2;
      case OptResult::kNotNumber:
        std::fprintf(stderr, "airs-mkmodel: %s '%s' is not a number\n", opt.c_str(), val);
        return 2;
    }
  }
  if (a.out.empty()) {
    std::fprintf(stderr, "airs-mkmodel: --out is required\n%s", kUsage);
    return 2;
  }
  return std::nullopt;
}

// --types and --size applied to the spec; false once the reason is printed.
bool resolve_spec(Args& a) {
  const auto scheme = gguf::type_scheme_by_name(a.types);
  if (!scheme) {
    std::fprintf(stderr, "airs-mkmodel: --types '%s' is not one of mixed|f32|f16|q8_0|q4_0|q4_K\n", a.types.c_str());
    return false;
  }
  a.spec.types = *scheme;
  if (a.size_text.empty()) return true;
  const auto target = airs::parse_bytes(a.size_text);
  if (!target || *target == 0) {
    std::fprintf(stderr, "airs-mkmodel: --size '%s' is not a byte size like 512M or 2G\n", a.size_text.c_str());
    return false;
  }
  auto sized = gguf::spec_for_size(a.spec, *target);
  if (!sized) {
    std::fprintf(stderr, "airs-mkmodel: %s\n", sized.error().message.c_str());
    return false;
  }
  a.spec = std::move(*sized);
  return true;
}

// Plans and writes the file, then says what it holds: the exit code.
int write_and_report(const gguf::ModelSpec& spec, const std::string& out) {
  auto plan = gguf::plan_model(spec);
  if (!plan) {
    std::fprintf(stderr, "airs-mkmodel: %s\n", plan.error().message.c_str());
    return 2;
  }
  if (auto st = gguf::write_model_file(*plan, out); !st) {
    std::fprintf(stderr, "airs-mkmodel: %s\n", st.error().message.c_str());
    return 1;
  }
  std::printf("%s: %llu bytes, %zu tensors, %llu layers, n_embd %llu, n_ff %llu, n_vocab %llu, seed %llu\n",
              out.c_str(), static_cast<unsigned long long>(plan->file_size), plan->tensors.size(),
              static_cast<unsigned long long>(spec.n_layers), static_cast<unsigned long long>(spec.n_embd),
              static_cast<unsigned long long>(spec.n_ff), static_cast<unsigned long long>(spec.n_vocab),
              static_cast<unsigned long long>(spec.seed));
  if (spec.n_expert > 0) {
    std::printf("%s: %s, %llu of %llu experts per token, router skew %g\n", out.c_str(), spec.architecture.c_str(),
                static_cast<unsigned long long>(spec.n_expert_used), static_cast<unsigned long long>(spec.n_expert),
                spec.router_skew);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const auto code = parse_args(argc, argv, args)) return *code;
  if (!resolve_spec(args)) return 2;
  return write_and_report(args.spec, args.out);
}
