// SPDX-License-Identifier: Apache-2.0
// airs-generate MODEL.gguf -p PROMPT [--system FILE] [-n N] [--priority P]
//               [--temp T --seed S] [--top-k K] [--threads N] [--kv f16|f32]
//               [--bus ADDRESS] [--no-daemon] [--hold] [--pause-at N] [--json]
//               [--expert-trace FILE]
//
// Generates text with the engine in src/infer, the model mapped lazily
// through airs-memd and the KV cache in the daemon's blocks (libairs C API).
// Without a reachable daemon it says so in one line on stderr and runs on a
// private mapping and private blocks: same tokens.
//
// The system prompt (FILE) is tokenized on its own (with BOS) and the
// prompt appended without BOS, so every process with the same system
// prompt has the same leading blocks and shares them through MatchPrefix.
// Tokens are printed as they come; --json instead prints one object:
//   {"token_ids": [...], "prompt_tokens": N, "matched_tokens": N,
//    "restored_tokens": N (of the matched, restored from the spill tier),
//    "ttft_ms": x, "decode_tok_s": x (a --pause-at wait excluded),
//    "max_token_ms": x (slowest decode step), "kv_blocks": [...], "backend":
//    "daemon"|"private", "recomputed_blocks": N, "tokens_per_block": N,
//    "kv_block_bytes": N (bytes of our layout used in each block), "kernels":
//    the kernel family the mat-vecs run: "neon-dotprod", "neon",
//    "avx512-vnni", "avx2" or "scalar" (the best the CPU has),
//    "weight_bytes_per_token": N (weight bytes one decode step reads: every
//    tensor but the embedding table, of which one row; of a mixture of
//    experts, the routers and expert_used_count experts per layer),
//    with experts also "experts": N, "experts_used": K}
// Before the first token, one start-up line on stderr names the model's
// shape and weight type, the kernel family, the threads and where the KV
// cache lives.
// --hold: after the output, keep the session open until stdin reaches EOF
// (so another process can share its blocks, or a test can inspect it).
// --pause-at N: after N generated tokens print "paused" on a line of its own
// and wait for a line on stdin (evict or inspect a live session meanwhile);
// pending eviction notices are handled before the next step.
//
// --expert-trace FILE: a mixture of experts' routing, one line per layer of
// every forward pass, written before the layer reads its experts:
// "P|D LAYER E1 E2 ..." (P: a prefill batch, D: a decode step; the
// distinct experts the pass chose in that layer). bench/experts replays it.
//
// Exit status: 0 ok, 1 failure (message on stderr), 2 usage.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "airs/airs.h"
#include "gguf/gguf.hpp"
#include "infer/airs_backend.hpp"
#include "infer/engine.hpp"
#include "infer/model.hpp"
#include "infer/sampler.hpp"
#include "infer/sequence.hpp"
#include "infer/tokenizer.hpp"

namespace {

using namespace airs;
using namespace airs::infer;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: airs-generate MODEL.gguf -p PROMPT [--system FILE] [-n N] [--priority interactive|system|background]\n"
    "                     [--temp T --seed S] [--top-k K] [--threads N] [--kv f16|f32] [--bus ADDRESS]\n"
    "                     [--no-daemon] [--hold] [--pause-at N] [--json] [--expert-trace FILE]\n";

struct Options {
  std::string model, prompt, system_file, bus = "system", expert_trace;
  int n = 32;
  int pause_at = 0;
  airs_priority priority = AIRS_PRIORITY_INTERACTIVE;
  SamplerParams sampling;
  unsigned threads = 0;
  std::optional<KvElem> kv;  // --kv; default: the daemon's kv_type (f16 without one)
  bool no_daemon = false, hold = false, json = false;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "airs-generate: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "-p" || a == "--prompt") o.prompt = val();
    else if (a == "--system") o.system_file = val();
    else if (a == "-n") o.n = std::atoi(val().c_str());
    else if (a == "--pause-at") o.pause_at = std::atoi(val().c_str());
    else if (a == "--temp") o.sampling.temperature = std::strtof(val().c_str(), nullptr);
    else if (a == "--seed") o.sampling.seed = std::strtoull(val().c_str(), nullptr, 0);
    else if (a == "--top-k") o.sampling.top_k = static_cast<uint32_t>(std::atoi(val().c_str()));
    else if (a == "--threads") o.threads = static_cast<unsigned>(std::atoi(val().c_str()));
    else if (a == "--bus") o.bus = val();
    else if (a == "--no-daemon") o.no_daemon = true;
    else if (a == "--hold") o.hold = true;
    else if (a == "--json") o.json = true;
    else if (a == "--expert-trace") o.expert_trace = val();
    else if (a == "--kv") {
      const std::string v = val();
      if (v != "f16" && v != "f32") usage_error("--kv must be f16 or f32");
      o.kv = v == "f32" ? KvElem::kF32 : KvElem::kF16;
    } else if (a == "--priority") {
      const std::string v = val();
      if (v == "interactive") o.priority = AIRS_PRIORITY_INTERACTIVE;
      else if (v == "system") o.priority = AIRS_PRIORITY_SYSTEM;
      else if (v == "background") o.priority = AIRS_PRIORITY_BACKGROUND;
      else usage_error("--priority must be interactive, system or background");
    } else if (!a.empty() && a[0] == '-') usage_error("unknown option " + a);
    else if (o.model.empty()) o.model = a;
    else usage_error("more than one model given");
  }
  if (o.model.empty()) usage_error("no model given");
  if (o.prompt.empty()) usage_error("-p PROMPT is required");
  if (o.n < 1) usage_error("-n must be at least 1");
  if (o.threads == 0) o.threads = std::max(1U, std::min(4U, std::thread::hardware_concurrency()));
  return o;
}

// The private fallback: the GGUF mapped read-only from the file.
struct FileMapping {
  void* p = MAP_FAILED;
  size_t n = 0;
  ~FileMapping() {
    if (p != MAP_FAILED) ::munmap(p, n);
  }
};

struct CloseSession {
  void operator()(airs_session* s) const { airs_session_close(s); }
};
struct CloseModel {
  void operator()(airs_model* m) const { airs_model_close(m); }
};
struct Disconnect {
  void operator()(airs_client* c) const { airs_disconnect(c); }
};

int run(const Options& o) {
  // Declared first, so destroyed last: after the engine and the sequence
  // that read the mapping and the blocks, on every return path.
  std::unique_ptr<airs_client, Disconnect> client_owner;
  std::unique_ptr<airs_model, CloseModel> model_owner;
  std::unique_ptr<airs_session, CloseSession> session_owner;
  airs_client* client = nullptr;
  airs_model* amodel = nullptr;
  airs_session* session = nullptr;
  FileMapping fm;
  std::span<const std::byte> mapping;
  if (!o.no_daemon) {
    if (airs_connect(o.bus.c_str(), &client) < 0) {
      std::fprintf(stderr, "airs-generate: no airs-memd reachable (%s); running on private memory\n",
                   airs_last_error());
      client = nullptr;
    } else {
      client_owner.reset(client);
      if (airs_model_open(client, o.model.c_str(), nullptr, &amodel) < 0) {
        std::fprintf(stderr, "airs-generate: airs-memd could not open %s (%s); running on private memory\n",
                     o.model.c_str(), airs_last_error());
        amodel = nullptr;
      }
    }
  }
  model_owner.reset(amodel);
  if (amodel != nullptr) {
    mapping = {static_cast<const std::byte*>(airs_model_data(amodel)), airs_model_size(amodel)};
  } else {
    const int fd = ::open(o.model.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      std::fprintf(stderr, "airs-generate: cannot open %s: %s\n", o.model.c_str(), std::strerror(errno));
      return 1;
    }
    fm.n = static_cast<size_t>(st.st_size);
    // Shared and populated, as llama.cpp maps a model: the page cache's
    // large folios stay mapped large (fewer TLB misses in the mat-vecs).
    fm.p = ::mmap(nullptr, fm.n, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    ::close(fd);
    if (fm.p == MAP_FAILED) {
      std::fprintf(stderr, "airs-generate: cannot map %s: %s\n", o.model.c_str(), std::strerror(errno));
      return 1;
    }
    mapping = {static_cast<const std::byte*>(fm.p), fm.n};
  }

  const gguf::MemorySource src(mapping);
  auto file = gguf::parse(src);
  if (!file) {
    std::fprintf(stderr, "airs-generate: %s: %s\n", o.model.c_str(), file.error().message.c_str());
    return 1;
  }
  auto model = load_model(*file, mapping);
  if (!model) {
    std::fprintf(stderr, "airs-generate: %s: %s\n", o.model.c_str(), model.error().message.c_str());
    return 1;
  }
  auto tok = Tokenizer::from_gguf(*file, mapping);
  if (!tok) {
    std::fprintf(stderr, "airs-generate: %s: %s\n", o.model.c_str(), tok.error().message.c_str());
    return 1;
  }

  std::vector<int32_t> prompt;
  if (!o.system_file.empty()) {
    std::ifstream in(o.system_file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "airs-generate: cannot read --system %s\n", o.system_file.c_str());
      return 1;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = tok->encode(ss.str(), true);
    const auto rest = tok->encode(o.prompt, false);
    prompt.insert(prompt.end(), rest.begin(), rest.end());
  } else {
    prompt = tok->encode(o.prompt, true);
  }

  // KV geometry: the daemon's. Its blocks are sized for its kv_type and
  // tokens_per_block, and it checks lengths and commits in those tokens, so
  // the engine stores that type with exactly that many positions per block
  // (f32 K/V in f16-sized blocks would commit blocks the daemon counts as
  // half full). Private memory: --kv, f16 by default, 16 per block.
  uint32_t tpb = 16;
  if (amodel != nullptr && airs_session_create(client, amodel, o.priority, &session) < 0) {
    std::fprintf(stderr, "airs-generate: cannot create a KV session (%s); running on private blocks\n",
                 airs_last_error());
    session = nullptr;
  }
  session_owner.reset(session);
  KvElem kv_elem = o.kv.value_or(KvElem::kF16);
  if (session != nullptr) {
    const std::string daemon_kv = airs_session_kv_type(session);
    if (daemon_kv != "f16") {
      std::fprintf(stderr,
                   "airs-generate: the daemon stores KV as '%s' ([kv] kv_type in airs-memd.conf); this engine "
                   "reads f16 or f32 KV: set kv_type = \"f16\" there, or run with --no-daemon\n",
                   daemon_kv.c_str());
      return 1;
    }
    if (o.kv && *o.kv != KvElem::kF16) {
      std::fprintf(stderr,
                   "airs-generate: --kv f32, but the daemon's KV blocks are f16 ([kv] kv_type in airs-memd.conf); "
                   "drop --kv or run with --no-daemon\n");
      return 1;
    }
    kv_elem = KvElem::kF16;
    airs_kv_geometry geo{};
    (void)airs_session_geometry(session, &geo);
    tpb = geo.tokens_per_block;
    const uint64_t need = kv_layout_for(model->config, tpb, kv_elem).block_bytes();
    if (tpb == 0 || need > geo.block_bytes) {
      std::fprintf(stderr,
                   "airs-generate: the daemon's KV block (%u bytes, %u tokens) does not hold %u positions of this "
                   "model (%llu bytes): a daemon of another version?\n",
                   geo.block_bytes, tpb, tpb, static_cast<unsigned long long>(need));
      return 1;
    }
  }
  const KvLayout layout = kv_layout_for(model->config, tpb, kv_elem);
  const char* kernels = kernel_path_name(kernel_path());
  const std::string experts = model->config.n_expert == 0 ? std::string()
                              : fmt::format(", {} of {} experts per token", model->config.n_expert_used,
                                            model->config.n_expert);
  std::fprintf(stderr, "airs-generate: %s: %u layers%s, %s weights; kernels %s, %u thread%s, KV in %s\n",
               o.model.c_str(), model->config.n_layer, experts.c_str(),
               weight_type_name(model->layers.empty() ? model->output.type : model->layers[0].wq.type),
               kernels, o.threads, o.threads == 1 ? "" : "s", session != nullptr ? "the daemon's blocks" : "private memory");
  ThreadPool pool(o.threads);
  Engine engine(*model, layout, pool);
  std::optional<AirsKv> dkv;
  std::optional<PrivateKv> pkv;
  KvBackend* kv = nullptr;
  if (session != nullptr) {
    kv = &dkv.emplace(session);
  } else {
    kv = &pkv.emplace(layout.block_bytes());
  }
  Sequence seq(engine, *kv);
  Sampler sampler(o.sampling);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> trace(nullptr, std::fclose);
  char phase = 'P';
  if (!o.expert_trace.empty()) {
    trace.reset(std::fopen(o.expert_trace.c_str(), "we"));
    if (!trace) {
      std::fprintf(stderr, "airs-generate: --expert-trace %s: %s\n", o.expert_trace.c_str(), std::strerror(errno));
      return 1;
    }
    engine.set_expert_observer([&](uint32_t layer, std::span<const uint32_t> chosen) {
      std::fprintf(trace.get(), "%c %u", phase, layer);
      for (uint32_t e : chosen) std::fprintf(trace.get(), " %u", e);
      std::fputc('\n', trace.get());
    });
  }

  const auto t0 = Clock::now();
  auto logits = seq.prefill(prompt);
  if (!logits) {
    std::fprintf(stderr, "airs-generate: prefill: %s\n", logits.error().message.c_str());
    return 1;
  }
  std::vector<int32_t> out;
  out.push_back(sampler.sample(*logits));
  const auto t_first = Clock::now();
  phase = 'D';
  if (!o.json) {
    std::fputs(tok->decode(out, true).c_str(), stdout);
    std::fflush(stdout);
  }
  // Decode time excludes a --pause-at wait; the slowest step is kept too.
  std::chrono::duration<double> paused{0};
  double max_token_ms = 0;
  while (static_cast<int>(out.size()) < o.n) {
    if (static_cast<int>(out.size()) == o.pause_at) {
      const auto p0 = Clock::now();
      std::printf("%spaused\n", o.json ? "" : "\n");
      std::fflush(stdout);
      std::string line;
      for (char c = 0; ::read(0, &c, 1) == 1 && c != '\n';) line += c;
      paused += Clock::now() - p0;
    }
    const auto s0 = Clock::now();
    logits = seq.append(out.back());
    max_token_ms = std::max(max_token_ms, std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
    if (!logits) {
      std::fprintf(stderr, "airs-generate: decode: %s\n", logits.error().message.c_str());
      return 1;
    }
    out.push_back(sampler.sample(*logits));
    if (!o.json) {
      std::fputs(tok->piece(out.back()).c_str(), stdout);
      std::fflush(stdout);
    }
  }
  const auto t_end = Clock::now();
  // The decode steps posted their lengths one way; one round trip makes sure
  // the daemon applied the last before the output says we are done.
  if (dkv) (void)dkv->set_length(seq.size());
  const double ttft = std::chrono::duration<double, std::milli>(t_first - t0).count();
  const double decode_s = std::chrono::duration<double>(t_end - t_first - paused).count();
  if (o.json) {
    nlohmann::json j;
    j["token_ids"] = out;
    j["prompt_tokens"] = prompt.size();
    j["matched_tokens"] = seq.matched_tokens();
    j["restored_tokens"] = seq.restored_tokens();
    j["ttft_ms"] = ttft;
    j["decode_tok_s"] = out.size() > 1 && decode_s > 0 ? static_cast<double>(out.size() - 1) / decode_s : 0.0;
    j["max_token_ms"] = max_token_ms;
    j["kv_blocks"] = seq.block_ids();
    j["backend"] = session != nullptr ? "daemon" : "private";
    j["recomputed_blocks"] = seq.recomputed_blocks();
    j["tokens_per_block"] = tpb;
    j["kv_block_bytes"] = layout.block_bytes();
    j["kernels"] = kernels;
    j["weight_bytes_per_token"] = model->weight_bytes;
    if (model->config.n_expert > 0) {
      j["experts"] = model->config.n_expert;
      j["experts_used"] = model->config.n_expert_used;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n");
  }
  std::fflush(stdout);
  if (o.hold) {
    char buf[64];
    while (::read(0, buf, sizeof buf) > 0) {
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return run(parse_args(argc, argv)); }
