// SPDX-License-Identifier: Apache-2.0
// airs-generate MODEL.gguf -p PROMPT [--system FILE] [-n N] [--priority P]
//               [--temp T --seed S] [--top-k K] [--threads N] [--kv f16|f32]
//               [--bus ADDRESS] [--no-daemon] [--hold] [--pause-at N] [--json]
//               [--expert-trace FILE] [--no-hints] [--predict-experts]
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
// A mixture of experts the daemon streams (bigger than its share of the
// pool): the expert observer also tells the daemon which experts each layer
// reads, before it reads them (airs_model_hint_experts: one one-way message,
// no round trip), so its expert cache counts every use and it reads them
// ahead of the touch. --no-hints: don't (the measurement's baseline); the
// tokens are the same either way. --json then also says "expert_hints"
// (sent) and "expert_hints_dropped" (the socket was full).
// --predict-experts: also guess each next layer's experts (its router on
// the current hidden state, Engine::set_expert_predictor) and send the
// guess (airs_model_predict_experts), so the daemon reads them while this
// layer computes. Off by default: on our models it loses, at 100 MB/s and
// at the disk's own speed (docs/streaming.md, bench/experts).
// --json then also says "expert_predictions" (sent),
// "expert_predictions_dropped" (the socket was full) and
// "prediction_hit_rate" (of the experts predicted layers chose, the share
// the guess named; computed with or without a daemon).
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
#include <functional>
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
    "                     [--no-daemon] [--hold] [--pause-at N] [--json] [--expert-trace FILE] [--no-hints]\n"
    "                     [--predict-experts]\n";

struct Options {
  std::string model, prompt, system_file, bus = "system", expert_trace;
  int n = 32;
  int pause_at = 0;
  airs_priority priority = AIRS_PRIORITY_INTERACTIVE;
  SamplerParams sampling;
  unsigned threads = 0;
  std::optional<KvElem> kv;  // --kv; default: the daemon's kv_type (f16 without one)
  bool no_daemon = false, hold = false, json = false, no_hints = false, predict_experts = false;
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
    else if (a == "--no-hints") o.no_hints = true;
    else if (a == "--predict-experts") o.predict_experts = true;
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

// Where the model's bytes and the KV blocks live: the daemon's (its client,
// model and session) or, without it, a private mapping and private blocks.
// Declared first in run(), so destroyed last: after the engine and the
// sequence that read the mapping and the blocks, on every return path.
struct Backing {
  std::unique_ptr<airs_client, Disconnect> client;
  std::unique_ptr<airs_model, CloseModel> model;
  std::unique_ptr<airs_session, CloseSession> session;
  FileMapping file;
  std::span<const std::byte> mapping;
};

// The model through airs-memd, or nothing (said on stderr) when it is not
// reachable or cannot open it.
void open_on_daemon(const Options& o, Backing& b) {
  airs_client* client = nullptr;
  if (airs_connect(o.bus.c_str(), &client) < 0) {
    std::fprintf(stderr, "airs-generate: no airs-memd reachable (%s); running on private memory\n", airs_last_error());
    return;
  }
  b.client.reset(client);
  airs_model* model = nullptr;
  if (airs_model_open(client, o.model.c_str(), nullptr, &model) < 0) {
    std::fprintf(stderr, "airs-generate: airs-memd could not open %s (%s); running on private memory\n",
                 o.model.c_str(), airs_last_error());
    return;
  }
  b.model.reset(model);
  b.mapping = {static_cast<const std::byte*>(airs_model_data(model)), airs_model_size(model)};
}

// The private fallback. False (said on stderr) when the file cannot be mapped.
bool map_privately(const Options& o, Backing& b) {
  const int fd = ::open(o.model.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    std::fprintf(stderr, "airs-generate: cannot open %s: %s\n", o.model.c_str(), std::strerror(errno));
    return false;
  }
  FileMapping& fm = b.file;
  fm.n = static_cast<size_t>(st.st_size);
  // Shared and populated, as llama.cpp maps a model: the page cache's
  // large folios stay mapped large (fewer TLB misses in the mat-vecs).
  fm.p = ::mmap(nullptr, fm.n, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (fm.p == MAP_FAILED) {
    std::fprintf(stderr, "airs-generate: cannot map %s: %s\n", o.model.c_str(), std::strerror(errno));
    return false;
  }
  b.mapping = {static_cast<const std::byte*>(fm.p), fm.n};
  return true;
}

// The system prompt (with BOS) and the prompt after it (without), or the
// prompt alone. nullopt (said on stderr) when --system cannot be read.
std::optional<std::vector<int32_t>> encode_prompt(const Options& o, const Tokenizer& tok) {
  if (o.system_file.empty()) return tok.encode(o.prompt, true);
  std::ifstream in(o.system_file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "airs-generate: cannot read --system %s\n", o.system_file.c_str());
    return std::nullopt;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto prompt = tok.encode(ss.str(), true);
  const auto rest = tok.encode(o.prompt, false);
  prompt.insert(prompt.end(), rest.begin(), rest.end());
  return prompt;
}

// KV geometry: the daemon's. Its blocks are sized for its kv_type and
// tokens_per_block, and it checks lengths and commits in those tokens, so
// the engine stores that type with exactly that many positions per block
// (f32 K/V in f16-sized blocks would commit blocks the daemon counts as
// half full). Private memory: --kv, f16 by default, 16 per block. nullopt
// (said on stderr) for daemon blocks this engine cannot use.
std::optional<KvLayout> kv_layout(const Options& o, const Model& model, airs_session* session) {
  if (session == nullptr) return kv_layout_for(model.config, 16, o.kv.value_or(KvElem::kF16));
  const std::string daemon_kv = airs_session_kv_type(session);
  if (daemon_kv != "f16") {
    std::fprintf(stderr,
                 "airs-generate: the daemon stores KV as '%s' ([kv] kv_type in airs-memd.conf); this engine "
                 "reads f16 or f32 KV: set kv_type = \"f16\" there, or run with --no-daemon\n",
                 daemon_kv.c_str());
    return std::nullopt;
  }
  if (o.kv && *o.kv != KvElem::kF16) {
    std::fprintf(stderr,
                 "airs-generate: --kv f32, but the daemon's KV blocks are f16 ([kv] kv_type in airs-memd.conf); "
                 "drop --kv or run with --no-daemon\n");
    return std::nullopt;
  }
  airs_kv_geometry geo{};
  (void)airs_session_geometry(session, &geo);
  const uint32_t tpb = geo.tokens_per_block;
  const uint64_t need = kv_layout_for(model.config, tpb, KvElem::kF16).block_bytes();
  if (tpb == 0 || need > geo.block_bytes) {
    std::fprintf(stderr,
                 "airs-generate: the daemon's KV block (%u bytes, %u tokens) does not hold %u positions of this "
                 "model (%llu bytes): a daemon of another version?\n",
                 geo.block_bytes, tpb, tpb, static_cast<unsigned long long>(need));
    return std::nullopt;
  }
  return kv_layout_for(model.config, tpb, KvElem::kF16);
}

// The start-up line: the model's shape and weight type, the kernels, the
// threads, where the KV cache lives.
void say_start(const Options& o, const Model& model, const char* kernels, bool daemon_kv) {
  const std::string experts = model.config.n_expert == 0 ? std::string()
                              : fmt::format(", {} of {} experts per token", model.config.n_expert_used,
                                            model.config.n_expert);
  std::fprintf(stderr, "airs-generate: %s: %u layers%s, %s weights; kernels %s, %u thread%s, KV in %s\n",
               o.model.c_str(), model.config.n_layer, experts.c_str(),
               weight_type_name(model.layers.empty() ? model.output.type : model.layers[0].wq.type), kernels,
               o.threads, o.threads == 1 ? "" : "s", daemon_kv ? "the daemon's blocks" : "private memory");
}

// What a generation produced and how long it took.
struct Generated {
  std::vector<int32_t> tokens;
  uint64_t hints = 0, hints_dropped = 0;  // expert hints sent to the daemon, and dropped (a full socket)
  uint64_t predictions = 0, predictions_dropped = 0;  // expert predictions sent, and dropped (a full socket)
  double prediction_hit_rate = -1;        // < 0: no prediction made
  double ttft_ms = 0;
  double decode_s = 0;  // a --pause-at wait excluded
  double max_token_ms = 0;  // the slowest decode step
};

// Waits for a line on stdin after saying "paused" (--pause-at).
void pause_for_a_line(const Options& o) {
  std::printf("%spaused\n", o.json ? "" : "\n");
  std::fflush(stdout);
  std::string line;
  for (char c = 0; ::read(0, &c, 1) == 1 && c != '\n';) line += c;
}

// Prefill, then o.n tokens in all, each printed as it comes (not with --json).
// `prefilled` runs once the prompt is in, before the first decode step.
Result<Generated> generate(const Options& o, Sequence& seq, Sampler& sampler, const Tokenizer& tok,
                           const std::vector<int32_t>& prompt, const std::function<void()>& prefilled) {
  Generated g;
  const auto t0 = Clock::now();
  auto logits = seq.prefill(prompt);
  if (!logits) return make_error(logits.error().code, "prefill: {}", logits.error().message);
  g.tokens.push_back(sampler.sample(*logits));
  const auto t_first = Clock::now();
  prefilled();
  if (!o.json) {
    std::fputs(tok.decode(g.tokens, true).c_str(), stdout);
    std::fflush(stdout);
  }
  std::chrono::duration<double> paused{0};
  while (static_cast<int>(g.tokens.size()) < o.n) {
    if (static_cast<int>(g.tokens.size()) == o.pause_at) {
      const auto p0 = Clock::now();
      pause_for_a_line(o);
      paused += Clock::now() - p0;
    }
    const auto s0 = Clock::now();
    logits = seq.append(g.tokens.back());
    g.max_token_ms = std::max(g.max_token_ms, std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
    if (!logits) return make_error(logits.error().code, "decode: {}", logits.error().message);
    g.tokens.push_back(sampler.sample(*logits));
    if (!o.json) {
      std::fputs(tok.piece(g.tokens.back()).c_str(), stdout);
      std::fflush(stdout);
    }
  }
  g.ttft_ms = std::chrono::duration<double, std::milli>(t_first - t0).count();
  g.decode_s = std::chrono::duration<double>(Clock::now() - t_first - paused).count();
  return g;
}

void print_json(const Generated& g, const std::vector<int32_t>& prompt, const Sequence& seq, const Model& model,
                const KvLayout& layout, const char* kernels, bool daemon_kv) {
  const auto& out = g.tokens;
  nlohmann::json j;
  j["token_ids"] = out;
  j["prompt_tokens"] = prompt.size();
  j["matched_tokens"] = seq.matched_tokens();
  j["restored_tokens"] = seq.restored_tokens();
  j["ttft_ms"] = g.ttft_ms;
  j["decode_tok_s"] = out.size() > 1 && g.decode_s > 0 ? static_cast<double>(out.size() - 1) / g.decode_s : 0.0;
  j["max_token_ms"] = g.max_token_ms;
  j["kv_blocks"] = seq.block_ids();
  j["backend"] = daemon_kv ? "daemon" : "private";
  j["recomputed_blocks"] = seq.recomputed_blocks();
  j["tokens_per_block"] = layout.tokens_per_block;
  j["kv_block_bytes"] = layout.block_bytes();
  j["kernels"] = kernels;
  j["weight_bytes_per_token"] = model.weight_bytes;
  if (model.config.n_expert > 0) {
    j["experts"] = model.config.n_expert;
    j["experts_used"] = model.config.n_expert_used;
    j["expert_hints"] = g.hints;
    j["expert_hints_dropped"] = g.hints_dropped;
    if (g.prediction_hit_rate >= 0) {
      j["expert_predictions"] = g.predictions;
      j["expert_predictions_dropped"] = g.predictions_dropped;
      j["prediction_hit_rate"] = g.prediction_hit_rate;
    }
  }
  std::printf("%s\n", j.dump().c_str());
}

int fail(const Options& o, const std::string& message) {
  std::fprintf(stderr, "airs-generate: %s: %s\n", o.model.c_str(), message.c_str());
  return 1;
}

int run(const Options& o) {
  Backing b;
  if (!o.no_daemon) open_on_daemon(o, b);
  if (!b.model && !map_privately(o, b)) return 1;
  const gguf::MemorySource src(b.mapping);
  auto file = gguf::parse(src);
  if (!file) return fail(o, file.error().message);
  auto model = load_model(*file, b.mapping);
  if (!model) return fail(o, model.error().message);
  auto tok = Tokenizer::from_gguf(*file, b.mapping);
  if (!tok) return fail(o, tok.error().message);
  auto prompt = encode_prompt(o, *tok);
  if (!prompt) return 1;

  airs_session* session = nullptr;
  if (b.model && airs_session_create(b.client.get(), b.model.get(), o.priority, &session) < 0) {
    std::fprintf(stderr, "airs-generate: cannot create a KV session (%s); running on private blocks\n",
                 airs_last_error());
    session = nullptr;
  }
  b.session.reset(session);
  const auto layout = kv_layout(o, *model, session);
  if (!layout) return 1;
  const char* kernels = kernel_path_name(kernel_path());
  say_start(o, *model, kernels, session != nullptr);
  ThreadPool pool(o.threads);
  Engine engine(*model, *layout, pool);
  std::optional<AirsKv> dkv;
  std::optional<PrivateKv> pkv;
  KvBackend* kv = session != nullptr ? static_cast<KvBackend*>(&dkv.emplace(session))
                                     : static_cast<KvBackend*>(&pkv.emplace(layout->block_bytes()));
  Sequence seq(engine, *kv);
  Sampler sampler(o.sampling);
  // --expert-trace: each layer's chosen experts, one line per layer and
  // token, P while the prompt is filled and D while decoding.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> trace(nullptr, std::fclose);
  char phase = 'P';
  if (!o.expert_trace.empty()) {
    trace.reset(std::fopen(o.expert_trace.c_str(), "we"));
    if (!trace) {
      std::fprintf(stderr, "airs-generate: --expert-trace %s: %s\n", o.expert_trace.c_str(), std::strerror(errno));
      return 1;
    }
  }
  // Expert hints: the daemon streams this mixture of experts and takes them.
  airs_model* hinted = !o.no_hints && b.model && airs_model_takes_hints(b.model.get()) == 1 ? b.model.get() : nullptr;
  uint64_t hints = 0, hints_dropped = 0;
  if (trace || hinted != nullptr) {
    engine.set_expert_observer([&](uint32_t layer, std::span<const uint32_t> chosen) {
      if (hinted != nullptr) {
        // Never blocks: a hint the socket has no room for is dropped, and
        // its experts are read on their touch.
        if (airs_model_hint_experts(hinted, layer, chosen.data(), chosen.size()) == 0) ++hints;
        else ++hints_dropped;
      }
      if (!trace) return;
      std::fprintf(trace.get(), "%c %u", phase, layer);
      for (uint32_t e : chosen) std::fprintf(trace.get(), " %u", e);
      std::fputc('\n', trace.get());
    });
  }
  uint64_t predictions = 0, predictions_dropped = 0;
  if (o.predict_experts && model->config.n_expert > 0) {
    engine.set_expert_predictor([&](uint32_t layer, std::span<const uint32_t> guess) {
      if (hinted == nullptr) return;  // still scored: prediction_hit_rate
      if (airs_model_predict_experts(hinted, layer, guess.data(), guess.size()) == 0) ++predictions;
      else ++predictions_dropped;
    });
  }
  auto g = generate(o, seq, sampler, *tok, *prompt, [&] { phase = 'D'; });
  if (!g) {
    std::fprintf(stderr, "airs-generate: %s\n", g.error().message.c_str());
    return 1;
  }
  g->hints = hints;
  g->hints_dropped = hints_dropped;
  g->predictions = predictions;
  g->predictions_dropped = predictions_dropped;
  if (const auto& ps = engine.prediction_stats(); ps.used > 0)
    g->prediction_hit_rate = static_cast<double>(ps.hits) / static_cast<double>(ps.used);
  // The decode steps posted their lengths one way; one round trip makes sure
  // the daemon applied the last before the output says we are done.
  if (dkv) (void)dkv->set_length(seq.size());
  if (o.json) print_json(*g, *prompt, seq, *model, *layout, kernels, session != nullptr);
  else std::printf("\n");
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
