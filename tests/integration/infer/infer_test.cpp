// SPDX-License-Identifier: Apache-2.0
// airs-generate (src/infer) with its KV cache in airs-memd's blocks, over a
// real daemon on a private bus: the same tokens as on private memory, with
// and without a matched prefix, after forced eviction + recompute, and two
// processes sharing one system prompt's blocks.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "airs/airs.h"
#include "daemon_fixture.hpp"
#include "gguf/file_io.hpp"
#include "gguf/gguf.hpp"
#include "harness.hpp"
#include "infer/airs_backend.hpp"
#include "infer/engine.hpp"
#include "infer/sampler.hpp"
#include "infer/sequence.hpp"
#include "infer_model.hpp"
#include "integration/pressure/memcg_stressor.hpp"
#include "wire/hints.hpp"

using namespace airs::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
const std::string kGenerate = AIRS_GENERATE_PATH;
const std::string kMkmodel = AIRS_MKMODEL_PATH;

// ~150 tokens with the writer's letter vocabulary: several blocks.
const std::string kSystem =
    "you are a helpful assistant and you answer every question about the forest, the river and the mountain with "
    "care; you never make things up, and you say so when you do not know the answer to a question";

class InferIntegration : public ::testing::Test {
 protected:
  // The pressure loop stays out of it by default (the machine's own
  // pressure must not shrink the pool under the test): no source named, so
  // the test daemon's is "off" (with_pressure_source).
  static constexpr const char* kQuietPressure = "[kv]\nmax_arena_bytes = 33554432\n[pressure]\nresize_pool = false\n";

  // model_args: more airs-mkmodel arguments (a later one of the same
  // option wins in airs-mkmodel).
  // pool_toml: more of the [pool] table.
  bool start(uint64_t pool_mib = 64, const std::string& kv_and_pressure = kQuietPressure,
             const std::vector<std::string>& model_args = {}, const std::string& pool_toml = "") {
    if (auto why = hugepages_missing(pool_mib * kMiB)) {
      ADD_FAILURE() << "huge pages missing: " << *why;
      return false;
    }
    model_ = dir_.path() + "/infer.gguf";
    std::vector<std::string> mk = {kMkmodel, "--llama", "--out", model_, "--types", "q8_0", "--layers", "4", "--embd",
                                   "256", "--ff", "512", "--vocab", "600", "--heads", "8", "--heads-kv", "2", "--seed",
                                   "3"};
    mk.insert(mk.end(), model_args.begin(), model_args.end());
    auto r = run_process(mk, 60s);
    if (r.exit_code != 0) {
      ADD_FAILURE() << r.err;
      return false;
    }
    system_ = dir_.path() + "/system.txt";
    std::ofstream(system_) << kSystem;
    bus_ = std::make_unique<PrivateBus>();
    daemon_ = std::make_unique<DaemonProcess>(
        bus_->address(),
        "[pool]\nsize = \"" + std::to_string(pool_mib) + "M\"\ngrow_nr_hugepages = false\n" + pool_toml +
            kv_and_pressure);
    if (!daemon_->started()) {
      ADD_FAILURE() << "airs-memd did not start:\n" << daemon_->log();
      return false;
    }
    BusClient c(bus_->address());
    auto e = c.load_model(model_);
    if (!e.ok()) {
      ADD_FAILURE() << e.name << ": " << e.message;
      return false;
    }
    return true;
  }

  std::vector<std::string> args(const std::string& prompt, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {kGenerate, model_, "--system", system_, "-p", prompt, "-n", "16", "--json",
                                  "--threads", "1", "--bus", bus_->address()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  nlohmann::json run(const std::vector<std::string>& argv) {
    auto r = run_process(argv, 120s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    last_err_ = r.err;
    const auto at = r.out.rfind('{');
    if (at == std::string::npos) {
      ADD_FAILURE() << "no JSON: " << r.out << r.err;
      return {};
    }
    return nlohmann::json::parse(r.out.substr(at));
  }

  // A libairs client of the daemon with the test model open, in client_
  // and am_; close_model() (also run by the destructor, after the test's
  // own sessions are closed) releases both.
  bool open_model() {
    EXPECT_EQ(airs_connect(bus_->address().c_str(), &client_), 0) << airs_last_error();
    if (client_ == nullptr) return false;
    EXPECT_EQ(airs_model_open(client_, model_.c_str(), nullptr, &am_), 0) << airs_last_error();
    return am_ != nullptr;
  }
  void close_model() {
    if (am_ != nullptr) airs_model_close(am_);
    if (client_ != nullptr) airs_disconnect(client_);
    am_ = nullptr;
    client_ = nullptr;
  }
  ~InferIntegration() override { close_model(); }
  // start() for a test that runs the engine in this process: the model
  // also loaded into lm_, and open_model().
  bool start_in_process() {
    if (!start()) return false;
    lm_ = airs::test::load_model_file(model_);
    return lm_ != nullptr && open_model();
  }

  // Loads the test model through `c` and holds it (BusClient::hold_model),
  // so that the status read later is this model's.
  bool load_and_hold(BusClient& c, std::string& obj) {
    const auto e = c.load_model(model_, &obj);
    EXPECT_TRUE(e.ok()) << e.name << ": " << e.message;
    if (!e.ok()) return false;
    const auto o = c.hold_model(obj, model_);
    EXPECT_TRUE(o.ok()) << o.name << ": " << o.message;
    return o.ok();
  }
  // The model `obj` in the daemon's status; when it is gone, a failure with
  // the daemon's log (which names who unloaded it) and an empty object.
  nlohmann::json model_status(BusClient& c, const std::string& obj) {
    auto m = model_in(c.status(), obj);
    if (m.is_object()) return m;
    ADD_FAILURE() << "model " << obj << " is not loaded any more; the daemon's log:\n" << daemon_->log();
    return nlohmann::json::object();
  }

  std::unique_ptr<airs::test::LoadedModel> lm_;
  airs_client* client_ = nullptr;
  airs_model* am_ = nullptr;
  TempDir dir_;
  std::string model_, system_, last_err_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// The KV geometry is the daemon's: a session says its kv_type, and
// airs-generate stores that type in blocks of the daemon's tokens_per_block.
// A client type the blocks were not sized for is a clear error, not a
// commit the daemon refuses mid-prefill (f32 K/V in f16 blocks used to fail
// there: 'block 2 (index 2) is not full').
TEST_F(InferIntegration, KvTypeComesFromTheDaemonAndAMismatchIsAClearError) {
  if (!start()) return;
  ASSERT_TRUE(open_model());
  airs_client* client = client_;
  airs_model* am = am_;
  airs_session* s = nullptr;
  ASSERT_EQ(airs_session_create(client, am, AIRS_PRIORITY_INTERACTIVE, &s), 0) << airs_last_error();
  EXPECT_STREQ(airs_session_kv_type(s), "f16");
  airs_kv_geometry geo{};
  ASSERT_EQ(airs_session_geometry(s, &geo), 0);
  airs_session_close(s);
  close_model();
  EXPECT_STREQ(airs_session_kv_type(nullptr), "");

  const auto d = run(args("what is the river"));
  EXPECT_EQ(d["backend"], "daemon") << last_err_;
  EXPECT_EQ(d["tokens_per_block"].get<uint32_t>(), geo.tokens_per_block);
  auto r = run_process(args("what is the river", {"--kv", "f32"}), 120s);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("--kv f32, but the daemon's KV blocks are f16 ([kv] kv_type"), std::string::npos) << r.err;
  // f32 on private memory is fine.
  const auto p32 = run(args("what is the river", {"--kv", "f32", "--no-daemon"}));
  EXPECT_EQ(p32["backend"], "private");
  EXPECT_EQ(p32["token_ids"].size(), 16U);

  // A daemon whose KV is q8_0: the engine cannot read it, and says so.
  daemon_.reset();
  daemon_ = std::make_unique<DaemonProcess>(
      bus_->address(), "[pool]\nsize = \"64M\"\ngrow_nr_hugepages = false\n[kv]\nkv_type = \"q8_0\"\n"
                       "max_arena_bytes = 33554432\n[pressure]\nresize_pool = false\n");
  ASSERT_TRUE(daemon_->started()) << daemon_->log();
  BusClient c(bus_->address());
  ASSERT_TRUE(c.load_model(model_).ok());
  r = run_process(args("what is the river"), 120s);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("the daemon stores KV as 'q8_0' ([kv] kv_type in airs-memd.conf)"), std::string::npos) << r.err;
}

TEST_F(InferIntegration, DaemonBlocksPrivateMemoryAndNoDaemonGiveTheSameTokens) {
  if (!start()) return;
  const auto priv = run(args("what is the river", {"--no-daemon"}));
  const auto d = run(args("what is the river"));
  EXPECT_EQ(priv["backend"], "private");
  EXPECT_EQ(d["backend"], "daemon") << last_err_;
  EXPECT_EQ(d["token_ids"], priv["token_ids"]);
  EXPECT_GT(d["prompt_tokens"].get<int>(), 3 * d["tokens_per_block"].get<int>());
  // The kernel family, in the JSON and the start-up line: the one this
  // process's copy of the kernels picks on the same CPU.
  const std::string family = airs::infer::kernel_path_name(airs::infer::kernel_path());
  EXPECT_EQ(d["kernels"], family);
  EXPECT_EQ(priv["kernels"], family);
  EXPECT_NE(last_err_.find(" layers, q8_0 weights; kernels " + family + ", 1 thread, KV in the daemon's blocks\n"),
            std::string::npos)
      << last_err_;
  // Unreachable daemon: one line on stderr, private memory, same output.
  // LSan off for this run only: a failed connect leaks the half-built bus
  // inside libairs' sdbus-c++ connection (sd_bus_new), not ours.
  auto r = run_process({"/usr/bin/env", "ASAN_OPTIONS=detect_leaks=0", kGenerate, model_, "--system", system_, "-p",
                        "what is the river", "-n", "16", "--json", "--bus", "unix:path=" + dir_.path() + "/no-such-bus"},
                       120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("no airs-memd reachable"), std::string::npos) << r.err;
  const auto nd = nlohmann::json::parse(r.out);
  EXPECT_EQ(nd["backend"], "private");
  EXPECT_EQ(nd["token_ids"], priv["token_ids"]);
}

// A mixture of experts (qwen3moe, 2 of 8 experts per token) changes only
// the FFN: its K/V live in the daemon's blocks as a dense model's do, and
// the tokens are those of private memory.
TEST_F(InferIntegration, MixtureOfExpertsOnDaemonBlocksGivesThePrivateTokens) {
  if (!start(64, kQuietPressure, {"--arch", "qwen3moe", "--experts", "8", "--experts-used", "2", "--ff", "256"})) {
    return;
  }
  const auto priv = run(args("what is the river", {"--no-daemon"}));
  const auto d = run(args("what is the river"));
  EXPECT_EQ(priv["backend"], "private");
  EXPECT_EQ(d["backend"], "daemon") << last_err_;
  EXPECT_EQ(d["token_ids"].size(), 16U);
  EXPECT_EQ(d["token_ids"], priv["token_ids"]);
  EXPECT_GT(d["prompt_tokens"].get<int>(), 3 * d["tokens_per_block"].get<int>());
  EXPECT_EQ(d["experts"], 8);
  EXPECT_EQ(d["experts_used"], 2);
  EXPECT_NE(last_err_.find(" 4 layers, 2 of 8 experts per token, q8_0 weights; kernels "), std::string::npos)
      << last_err_;
}

// A mixture of experts bigger than the pool (32 experts, 2 per token,
// skewed routing) streams through it in every mode: the dense part stays,
// experts come and go while airs-generate decodes, and the tokens are
// those of private memory (a zero or wrong byte of any weight read would
// change them).
class InferStreamedMoe : public InferIntegration, public ::testing::WithParamInterface<std::string> {
 protected:
  // `unit`: the model's, 0 for the pool's page.
  void decodes_the_private_tokens(const std::string& mode, const std::string& models_toml, uint64_t unit);
};

// The unit is the model's: a mixture of experts streams in 512 KiB units
// on the shmem pool (small-pages, cooperative), where a unit holds parts
// of one or two slices and a missed expert reads little of its
// neighbours (docs/streaming.md, "The unit"); in huge pages in full mode.
TEST_P(InferStreamedMoe, AMixtureOfExpertsBiggerThanThePoolGivesThePrivateTokens) {
  decodes_the_private_tokens(GetParam(), "", GetParam() == "full" ? 0 : 512U << 10);
}

// The same in the pool's 2 MiB pages (models.stream_expert_unit = 0),
// where a unit holds parts of several experts.
class InferStreamedMoePoolPages : public InferStreamedMoe {};

TEST_P(InferStreamedMoePoolPages, AMixtureOfExpertsBiggerThanThePoolGivesThePrivateTokens) {
  decodes_the_private_tokens(GetParam(), "stream_expert_unit = 0\n", 0);
}

void InferStreamedMoe::decodes_the_private_tokens(const std::string& mode, const std::string& models_toml,
                                                  uint64_t unit) {
  if (!start(64, std::string(kQuietPressure) + "[models]\nmode = \"" + mode + "\"\n" + models_toml,
             {"--experts", "32", "--experts-used", "2", "--embd", "512", "--ff", "512", "--router-skew", "2"})) {
    return;
  }
  BusClient c(bus_->address());
  if (unit == 0) unit = c.status().value("page_size", uint64_t{0});
  std::string obj;
  ASSERT_TRUE(load_and_hold(c, obj));
  EXPECT_EQ(model_status(c, obj).value("unit_bytes", uint64_t{0}), unit) << model_status(c, obj).dump();
  const auto priv = run(args("what is the river", {"--no-daemon", "-n", "24"}));
  const auto d = run(args("what is the river", {"-n", "24"}));
  if (HasFailure()) {
    ADD_FAILURE() << "the model: " << model_status(c, obj).dump();  // a stall says what streamed
    return;
  }
  EXPECT_EQ(d["backend"], "daemon") << last_err_;
  EXPECT_EQ(d["token_ids"].size(), 24U);
  EXPECT_EQ(d["token_ids"], priv["token_ids"]);
  const auto ms = model_status(c, obj);
  EXPECT_EQ(ms.value("streamed", false), true) << ms.dump();
  EXPECT_GT(ms.value("units_dropped", uint64_t{0}), 0U) << "nothing was dropped: nothing tested\n" << ms.dump();
  // The engine told the daemon every layer's experts ahead (expert hints,
  // on by default), and the daemon took every one.
  EXPECT_GT(d.value("expert_hints", uint64_t{0}), 0U) << d.dump();
  EXPECT_GE(d.value("expert_hints", uint64_t{0}) + d.value("expert_hints_dropped", uint64_t{0}), 23U * 4)
      << "one hint per layer and forward pass (23 decode steps of 4 layers, and the prefill's)";
  EXPECT_GT(ms.value("expert_hints", uint64_t{0}), 0U) << ms.dump();
  EXPECT_EQ(ms.value("expert_hints_ignored", uint64_t{1}), 0U) << ms.dump();
  EXPECT_GT(ms.value("expert_uses", uint64_t{0}), 0U) << ms.dump();
  // Without hints: the same tokens.
  const auto n = run(args("what is the river", {"-n", "24", "--no-hints"}));
  EXPECT_EQ(n["token_ids"], priv["token_ids"]);
  EXPECT_EQ(n.value("expert_hints", uint64_t{1}), 0U);
  // With each layer's guess at the next one's experts: the same tokens,
  // a guess per layer after the first and forward pass, all taken.
  const auto p = run(args("what is the river", {"-n", "24", "--predict-experts"}));
  EXPECT_EQ(p["token_ids"], priv["token_ids"]);
  EXPECT_GT(p.value("expert_predictions", uint64_t{0}), 0U) << p.dump();
  EXPECT_GE(p.value("expert_predictions", uint64_t{0}) + p.value("expert_predictions_dropped", uint64_t{0}), 23U * 3)
      << "a guess per layer after the first and forward pass (23 decode steps of 4 layers, and the prefill's)";
  const double rate = p.value("prediction_hit_rate", -1.0);
  EXPECT_GE(rate, 0.0) << p.dump();
  EXPECT_LE(rate, 1.0) << p.dump();
  const auto mp = model_status(c, obj);
  EXPECT_GT(mp.value("expert_predictions", uint64_t{0}), 0U) << mp.dump();
  EXPECT_EQ(mp.value("expert_hints_ignored", uint64_t{1}), 0U) << mp.dump();
}

// Expert hints the daemon cannot use, or that are not hints at all, from
// clients that may hint and from one that may not: each is refused or
// ignored (and counted), the daemon goes on answering, and a client then
// reads the file's bytes (the tokens of private memory).
TEST_F(InferIntegration, HostileExpertHintsAreIgnoredAndTheDaemonGoesOn) {
  if (!start(64, kQuietPressure,
             {"--experts", "32", "--experts-used", "2", "--embd", "512", "--ff", "512", "--router-skew", "2"})) {
    return;
  }
  BusClient c(bus_->address());
  std::string obj;
  ASSERT_TRUE(c.load_model(model_, &obj).ok());
  ASSERT_TRUE(open_model());
  ASSERT_EQ(airs_model_takes_hints(am_), 1) << "a streamed mixture of experts, mapped lazily";
  // Through the library: what it can check, it refuses itself.
  const uint32_t e0[] = {0}, e32[] = {32}, twice[] = {1, 1};
  std::vector<uint32_t> many(257, 0);
  EXPECT_EQ(airs_model_hint_experts(am_, 0, e0, 0), -EINVAL);
  EXPECT_EQ(airs_model_hint_experts(am_, 0, many.data(), many.size()), -EINVAL);
  EXPECT_EQ(airs_model_hint_experts(am_, 0, nullptr, 1), -EINVAL);
  // What only the daemon knows: a layer, an expert it does not have, one
  // named twice. Sent (one-way), ignored there.
  EXPECT_EQ(airs_model_hint_experts(am_, 99, e0, 1), 0);
  EXPECT_EQ(airs_model_hint_experts(am_, 0, e32, 1), 0);
  EXPECT_EQ(airs_model_hint_experts(am_, 1, twice, 2), 0);
  EXPECT_EQ(airs_model_hint_experts(am_, 3, e0, 1), 0) << "a good one";
  // A prediction is checked the same, here and there.
  EXPECT_EQ(airs_model_predict_experts(am_, 0, e0, 0), -EINVAL);
  EXPECT_EQ(airs_model_predict_experts(am_, 0, nullptr, 1), -EINVAL);
  EXPECT_EQ(airs_model_predict_experts(am_, 0, e32, 1), 0);
  EXPECT_EQ(airs_model_predict_experts(am_, 2, e0, 1), 0) << "a good guess";
  uint64_t ignored = 4, taken = 1;
  // A raw hint socket of this test's own bus client (which holds a
  // reference once it opened the model): messages that are no hints.
  ASSERT_TRUE(c.open_model(obj, model_, true).ok());
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  const auto hinted = c.hints(obj, sv[0]);
  ::close(sv[0]);
  ASSERT_TRUE(hinted.ok()) << hinted.name << ": " << hinted.message;
  const auto send_raw = [&](const void* p, size_t n) {
    EXPECT_EQ(::send(sv[1], p, n, MSG_DONTWAIT | MSG_NOSIGNAL), static_cast<ssize_t>(n)) << std::strerror(errno);
  };
  const uint32_t word = 5;
  send_raw(&word, 3);
  send_raw(&word, 4);
  const uint32_t bad_magic[4] = {0x12345678, 0, 1, 0};
  send_raw(bad_magic, sizeof bad_magic);
  const uint32_t miscount[5] = {airs::wire::kHintMagic, 0, 1, 0, 1};
  send_raw(miscount, sizeof miscount);
  std::vector<uint32_t> huge(2048, airs::wire::kHintMagic);
  send_raw(huge.data(), huge.size() * 4);
  ignored += 5;
  // A flood of good hints (what the socket takes without blocking).
  for (int i = 0; i < 4096; ++i) {
    alignas(uint32_t) std::byte buf[airs::wire::kMaxHintBytes];
    const uint32_t e = static_cast<uint32_t>(i % 32);
    const size_t n = airs::wire::encode_hint(static_cast<uint32_t>(i % 4), std::span<const uint32_t>(&e, 1), buf);
    if (::send(sv[1], buf, n, MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(n)) break;
    ++taken;
  }
  // A third channel on one reference is past the quota; a bus
  // client without a reference may not hint at all, and a model that fits
  // in the pool takes no hints.
  int sv2[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv2), 0);
  EXPECT_TRUE(c.hints(obj, sv2[0]).ok()) << "a mapping and a hint socket per reference: this client maps nothing";
  EXPECT_EQ(c.hints(obj, sv2[0]).name, "org.aios.Airs1.Error.QuotaExceeded");
  BusClient stranger(bus_->address());
  EXPECT_EQ(stranger.hints(obj, sv2[0]).name, "org.freedesktop.DBus.Error.AccessDenied");
  const std::string dense = dir_.path() + "/dense.gguf";
  ASSERT_EQ(run_process({kMkmodel, "--llama", "--out", dense, "--types", "q8_0", "--layers", "2", "--embd", "128",
                         "--ff", "256", "--vocab", "600", "--seed", "5"},
                        60s)
                .exit_code,
            0);
  std::string dense_obj;
  ASSERT_TRUE(c.load_model(dense, &dense_obj).ok());
  ASSERT_TRUE(c.open_model(dense_obj, dense, true).ok());
  EXPECT_EQ(c.hints(dense_obj, sv2[0]).name, "org.aios.Airs1.Error.Unsupported");
  ::close(sv2[0]);
  ::close(sv2[1]);
  // The daemon reads the sockets on its loop: wait until it counted them
  // all (GetStatus answers meanwhile, or this fails).
  nlohmann::json ms;
  const auto end = std::chrono::steady_clock::now() + 60s;
  do {
    ms = model_in(c.status(), obj);
    if (ms.value("expert_hints", uint64_t{0}) >= taken && ms.value("expert_hints_ignored", uint64_t{0}) >= ignored)
      break;
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < end);
  EXPECT_EQ(ms.value("expert_hints", uint64_t{0}), taken) << ms.dump();
  EXPECT_EQ(ms.value("expert_hints_ignored", uint64_t{0}), ignored) << ms.dump();
  EXPECT_EQ(ms.value("expert_predictions", uint64_t{0}), 1U) << ms.dump();
  EXPECT_NE(daemon_->log().find("expert hint ignored: layer 99 is out of range"), std::string::npos)
      << daemon_->log();
  EXPECT_NE(daemon_->log().find("expert hint ignored: a malformed hint of 3 bytes"), std::string::npos)
      << "the first bad message of the raw socket has its line";
  ::close(sv[1]);
  // The daemon goes on: a client reads the file's bytes.
  const auto priv = run(args("what is the river", {"--no-daemon", "-n", "8"}));
  const auto d = run(args("what is the river", {"-n", "8"}));
  EXPECT_EQ(d["backend"], "daemon") << last_err_;
  EXPECT_EQ(d["token_ids"], priv["token_ids"]);
}

// Access sampling (libairs): a client that sends no expert hints takes a
// few units that are in out of its page tables now and then (a lazy
// mapping) or closes them (cooperative), so the next touch of each is seen
// by the daemon, whose expert cache otherwise counts misses only. Without
// sampling, rereading an expert that is in reaches the daemon not at all;
// with it, the rereads are seen. Every read gives the file's bytes.
TEST_P(InferStreamedMoe, ClientSamplingShowsTheDaemonTheHitsAndKeepsTheBytes) {
  if (!start(64, std::string(kQuietPressure) + "[models]\nmode = \"" + GetParam() + "\"\n",
             {"--experts", "32", "--experts-used", "2", "--embd", "512", "--ff", "512"})) {
    return;
  }
  BusClient c(bus_->address());
  std::string obj;
  ASSERT_TRUE(load_and_hold(c, obj));
  // Expert 5's slice of layer 1's up projection: its first 64 KiB.
  auto src = airs::gguf::FdSource::open(model_);
  ASSERT_TRUE(src) << src.error().message;
  auto file = airs::gguf::parse(*src);
  ASSERT_TRUE(file) << file.error().message;
  const auto t = std::find_if(file->tensors.begin(), file->tensors.end(),
                              [](const auto& x) { return x.name == "blk.1.ffn_up_exps.weight"; });
  ASSERT_NE(t, file->tensors.end());
  const uint64_t slice = t->nbytes / 32, off = t->offset + 5 * slice, len = std::min<uint64_t>(slice, 64 * 1024);
  std::vector<unsigned char> want(len);
  ASSERT_TRUE(src->read(off, want.data(), len));
  const auto same = [&] {
    const auto* p = static_cast<const volatile unsigned char*>(airs_model_data(am_)) + off;
    for (uint64_t i = 0; i < len; ++i)
      if (p[i] != want[i]) return false;
    return true;
  };
  const auto touches = [&] { return model_status(c, obj).value("resident_touches", uint64_t{0}); };
  const auto open_with = [&](const char* ms, const char* units) {
    // The previous phase's client is gone first: what its socket still
    // held (a sampled reopen) is counted before this phase's baseline.
    EXPECT_TRUE(wait_until([&] { return model_status(c, obj).value("clients", uint64_t{99}) == 0; }, 20s))
        << "the previous client is still attached: " << model_status(c, obj).dump();
    if (ms != nullptr) ::setenv("AIRS_SAMPLE_MS", ms, 1);
    if (units != nullptr) ::setenv("AIRS_SAMPLE_UNITS", units, 1);
    const bool ok = open_model();
    ::unsetenv("AIRS_SAMPLE_MS");
    ::unsetenv("AIRS_SAMPLE_UNITS");
    return ok && airs_model_takes_hints(am_) == 1;
  };

  // Whether rereading the expert reaches the daemon (a fault or an open of
  // a unit that was in), with every reread checked against the file.
  const auto rereads_seen = [&](const char* what) {
    EXPECT_TRUE(same()) << what << ": the first read";
    const uint64_t before = touches();
    bool right = true;
    const auto seen = wait_until(
        [&] {
          right = right && same();
          return touches() >= before + 3;
        },
        20s);
    EXPECT_TRUE(right) << what << ": a reread gave bytes that are not the file's";
    return seen.has_value();
  };
  const auto rereads_unseen = [&](const char* what) {
    EXPECT_TRUE(same()) << what << ": the first read";
    // The first read's own open of a unit that was in is a touch, which a
    // cooperative client reports on its request socket without a reply:
    // the daemon may count it after a status call. A prediction on that
    // socket behind it, once counted, says the open was counted too (a
    // prediction is neither a touch nor a hint, and stops no sampling).
    const auto predictions = [&] { return model_status(c, obj).value("expert_predictions", uint64_t{0}); };
    const uint64_t p0 = predictions();
    const uint32_t five = 5;
    EXPECT_EQ(airs_model_predict_experts(am_, 1, &five, 1), 0) << airs_last_error();
    EXPECT_TRUE(wait_until([&] { return predictions() == p0 + 1; }, 20s)) << model_status(c, obj).dump();
    const uint64_t before = touches();
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(same()) << what << ": reread " << i;
      std::this_thread::sleep_for(5ms);
    }
    return touches() == before;
  };

  // Sampling off: once the expert is in, rereading it takes no fault.
  ASSERT_TRUE(open_with("0", "4")) << "a streamed mixture of experts on the daemon";
  EXPECT_TRUE(rereads_unseen("off")) << "a unit that was in reached the daemon without sampling";
  close_model();

  // Sampling on (every unit that is in, every 5 ms): the rereads are seen.
  ASSERT_TRUE(open_with("5", "100000"));
  EXPECT_TRUE(rereads_seen("on")) << "sampling made no reread reach the daemon: " << model_status(c, obj).dump();
  const auto ms = model_status(c, obj);
  EXPECT_EQ(ms.value("access_source", std::string()), "faults") << ms.dump();
  EXPECT_NE(ms.value("access_source_why", std::string()).find("libairs' access sampling"), std::string::npos)
      << ms.dump();
  EXPECT_EQ(ms.value("units_failed", uint64_t{1}), 0U) << ms.dump();
  close_model();

  // By default, on only where a fault names the base page it touched, and
  // with it the expert (small-pages); a huge page or a cooperative unit
  // holds several experts.
  ASSERT_TRUE(open_with(nullptr, nullptr));
  if (GetParam() == "small-pages")
    EXPECT_TRUE(rereads_seen("default")) << "no sampling by default in small-pages mode";
  else
    EXPECT_TRUE(rereads_unseen("default")) << "sampling by default in " << GetParam() << " mode";
  close_model();
}

std::string mode_name(const ::testing::TestParamInfo<std::string>& p) {
  std::string n = p.param;
  n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
  return n;
}
INSTANTIATE_TEST_SUITE_P(Modes, InferStreamedMoe, ::testing::Values("full", "small-pages", "cooperative"), mode_name);
INSTANTIATE_TEST_SUITE_P(Modes, InferStreamedMoePoolPages, ::testing::Values("small-pages", "cooperative"),
                         mode_name);

TEST_F(InferIntegration, TwoProcessesShareTheSystemPromptBlocks) {
  if (!start()) return;
  const auto ref = run(args("tell me about the mountain", {"--no-daemon"}));
  Child a(args("what is the river", {"--hold"}));
  const auto la = a.expect_line("{", 120s);
  ASSERT_TRUE(la) << a.err();
  const auto ja = nlohmann::json::parse(*la);
  EXPECT_EQ(ja["matched_tokens"], 0);
  // The second process, while the first still holds its session.
  const auto jb = run(args("tell me about the mountain"));
  ASSERT_EQ(jb["backend"], "daemon") << last_err_ << daemon_->log();
  ASSERT_EQ(ja["backend"], "daemon") << a.err();
  const int tpb = jb["tokens_per_block"].get<int>();
  EXPECT_GE(jb["matched_tokens"].get<int>(), 2 * tpb) << jb.dump();
  EXPECT_EQ(jb["matched_tokens"].get<int>() % tpb, 0);
  EXPECT_EQ(jb["token_ids"], ref["token_ids"]) << "a matched prefix changed the output";
  const size_t matched_blocks = jb["matched_tokens"].get<size_t>() / static_cast<size_t>(tpb);
  for (size_t i = 0; i < matched_blocks; ++i) {
    EXPECT_EQ(jb["kv_blocks"][i], ja["kv_blocks"][i]) << "block " << i << " is not the first process's";
  }
  EXPECT_NE(jb["kv_blocks"][matched_blocks], ja["kv_blocks"][matched_blocks]) << "the diverging block is shared";
  // airsctl sees the first process's real session: its length is the
  // tokens whose K/V it holds (prompt + generated - the last, not fed
  // back), in as many blocks as it reported.
  auto s = run_process({airsctl_path(), "--bus", bus_->address(), "--json", "sessions"}, 30s);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const auto sessions = nlohmann::json::parse(s.out).at("sessions");
  ASSERT_EQ(sessions.size(), 1U) << s.out;
  EXPECT_EQ(sessions[0]["tokens"].get<int>(), ja["prompt_tokens"].get<int>() + 15) << s.out;
  EXPECT_EQ(sessions[0]["blocks"].get<size_t>(), ja["kv_blocks"].size()) << s.out;
  a.close_stdin();
  EXPECT_EQ(a.wait(30s).exit_code, 0) << a.err();
}

TEST_F(InferIntegration, ForcedEvictionIsRecomputedWithIdenticalTokens) {
  if (!start()) return;
  const auto ref = run(args("what is the forest", {"--no-daemon"}));
  Child g(args("what is the forest", {"--priority", "background", "--pause-at", "5"}));
  ASSERT_TRUE(g.expect_line("paused", 120s)) << g.err();
  auto ev = run_process({airsctl_path(), "--bus", bus_->address(), "evict", "--priority", "background"}, 30s);
  EXPECT_EQ(ev.exit_code, 0) << ev.out << ev.err;
  ASSERT_TRUE(g.send(""));
  const auto line = g.expect_line("{", 120s);
  ASSERT_TRUE(line) << g.err();
  const auto j = nlohmann::json::parse(*line);
  ASSERT_EQ(j["backend"], "daemon") << g.err();
  EXPECT_GT(j["recomputed_blocks"].get<int>(), 0) << "nothing was evicted: " << ev.out;
  EXPECT_EQ(j["token_ids"], ref["token_ids"]) << "recomputed blocks changed the output";
  std::printf("[ info ] evict: %s; recomputed %d blocks\n", ev.out.c_str(), j["recomputed_blocks"].get<int>());
  EXPECT_EQ(g.wait(30s).exit_code, 0) << g.err();
}

// Every K/V row of positions [0, n) of two sequences, compared byte for
// byte; returns how many rows differ.
size_t differing_rows(const airs::infer::KvLayout& L, airs::infer::KvBackend& ka, const airs::infer::Sequence& a,
                      airs::infer::KvBackend& kb, const airs::infer::Sequence& b, uint32_t n) {
  size_t bad = 0;
  const size_t row = size_t{L.head_dim} * L.elem_bytes();
  for (uint32_t p = 0; p < n; ++p) {
    const std::byte* x = ka.block_ptr(a.block_ids()[p / L.tokens_per_block]);
    const std::byte* y = kb.block_ptr(b.block_ids()[p / L.tokens_per_block]);
    for (uint32_t l = 0; l < L.n_layer; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t h = 0; h < L.n_head_kv; ++h) {
          const size_t off = L.offset(l, kv, h, p % L.tokens_per_block);
          if (std::memcmp(x + off, y + off, row) != 0) ++bad;
        }
      }
    }
  }
  return bad;
}

std::vector<int32_t> greedy(airs::infer::Sequence& s, std::span<const float> logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(airs::infer::argmax(logits));
    auto l = s.append(out.back());
    EXPECT_TRUE(l.ok()) << l.error().message;
    if (!l.ok()) break;
    logits = *l;
  }
  return out;
}

// Two sessions of the daemon share a prompt's blocks; the second rewinds
// into a shared block and continues differently. Its first write there is
// copy-on-write (PrepareWrite): the first session's bytes do not change,
// both sessions' K/V equal byte for byte those of private runs of their own
// token sequences, and both outputs are those of the private runs.
TEST_F(InferIntegration, CopyOnWriteWhenOneSequenceDivergesInsideASharedBlock) {
  using namespace airs::infer;
  ASSERT_TRUE(start_in_process());
  const auto& lm = lm_;
  airs_client* client = client_;
  airs_model* am = am_;
  airs_session *sa = nullptr, *sb = nullptr;
  ASSERT_EQ(airs_session_create(client, am, AIRS_PRIORITY_INTERACTIVE, &sa), 0) << airs_last_error();
  ASSERT_EQ(airs_session_create(client, am, AIRS_PRIORITY_INTERACTIVE, &sb), 0) << airs_last_error();
  airs_kv_geometry geo{};
  ASSERT_EQ(airs_session_geometry(sa, &geo), 0);
  const uint64_t per_token = kv_layout_for(lm->model.config, 1, KvElem::kF16).bytes_per_token();
  const auto tpb = static_cast<uint32_t>(geo.block_bytes / per_token);
  ASSERT_GE(tpb, 4U);
  const KvLayout layout = kv_layout_for(lm->model.config, tpb, KvElem::kF16);
  ThreadPool pool(1);
  Engine engine(lm->model, layout, pool);
  {
    AirsKv ka(sa), kb(sb);
    std::vector<int32_t> prompt = {1};
    for (uint32_t i = 1; i < 3 * tpb + 3; ++i) prompt.push_back(static_cast<int32_t>(3 + (i * 53) % 500));
    Sequence a(engine, ka);
    auto la = a.prefill(prompt);
    ASSERT_TRUE(la.ok()) << la.error().message;
    const auto ta = greedy(a, *la, 4);
    // Bytes of the first session's blocks before the second one runs.
    std::vector<std::vector<std::byte>> before;
    for (uint32_t id : a.block_ids()) {
      const std::byte* p = ka.block_ptr(id);
      before.emplace_back(p, p + layout.block_bytes());
    }

    Sequence b(engine, kb);
    auto lb = b.prefill(prompt);
    ASSERT_TRUE(lb.ok()) << lb.error().message;
    ASSERT_EQ(b.matched_tokens(), 3 * tpb);
    ASSERT_TRUE(std::equal(b.block_ids().begin(), b.block_ids().begin() + 3, a.block_ids().begin()));
    // Back into shared block 2, then a different continuation that runs
    // past its end.
    const uint32_t m = 2 * tpb + tpb / 2;
    ASSERT_TRUE(b.truncate(m).ok());
    std::vector<int32_t> diverge;
    for (uint32_t i = 0; i < tpb; ++i) diverge.push_back(static_cast<int32_t>(7 + (i * 31) % 400));
    lb = b.prefill(diverge);
    ASSERT_TRUE(lb.ok()) << lb.error().message;
    const auto tb = greedy(b, *lb, 4);
    EXPECT_TRUE(std::equal(b.block_ids().begin(), b.block_ids().begin() + 2, a.block_ids().begin()));
    EXPECT_NE(b.block_ids()[2], a.block_ids()[2]) << "the write went into the shared block";
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_EQ(std::memcmp(ka.block_ptr(a.block_ids()[i]), before[i].data(), before[i].size()), 0)
          << "block " << i << " of the first session changed";
    }

    // Private references of both token sequences.
    PrivateKv pa_kv(layout.block_bytes()), pb_kv(layout.block_bytes());
    Sequence pa(engine, pa_kv), pb(engine, pb_kv);
    auto lpa = pa.prefill(prompt);
    ASSERT_TRUE(lpa.ok());
    EXPECT_EQ(greedy(pa, *lpa, 4), ta);
    std::vector<int32_t> b_tokens(prompt.begin(), prompt.begin() + m);
    b_tokens.insert(b_tokens.end(), diverge.begin(), diverge.end());
    auto lpb = pb.prefill(b_tokens);
    ASSERT_TRUE(lpb.ok());
    EXPECT_EQ(greedy(pb, *lpb, 4), tb);
    EXPECT_NE(ta, tb);
    ASSERT_EQ(a.size(), pa.size());
    ASSERT_EQ(b.size(), pb.size());
    EXPECT_EQ(differing_rows(layout, ka, a, pa_kv, pa, a.size()), 0U);
    EXPECT_EQ(differing_rows(layout, kb, b, pb_kv, pb, b.size()), 0U);
  }
  airs_session_close(sb);
  airs_session_close(sa);
  close_model();
}

// A block lost in the middle of a sequence is refilled at its own index
// (AllocateAt) and published again, and only the lost blocks are
// recomputed. The middle loss: a second session holds the first one's
// block 1 but not block 0, so evicting the first session (tail first,
// shared blocks skipped) takes blocks 3, 2 and 0. Appending the refill at
// the end of the daemon's table instead shifted every later block's index,
// and the daemon refused the next commit ('block ... is not full').
TEST_F(InferIntegration, ABlockLostInTheMiddleIsRefilledInPlace) {
  using namespace airs::infer;
  ASSERT_TRUE(start_in_process());
  airs_session *sa = nullptr, *sb = nullptr, *sc = nullptr;
  ASSERT_EQ(airs_session_create(client_, am_, AIRS_PRIORITY_BACKGROUND, &sa), 0) << airs_last_error();
  ASSERT_EQ(airs_session_create(client_, am_, AIRS_PRIORITY_INTERACTIVE, &sb), 0) << airs_last_error();
  ASSERT_EQ(airs_session_create(client_, am_, AIRS_PRIORITY_INTERACTIVE, &sc), 0) << airs_last_error();
  airs_kv_geometry geo{};
  ASSERT_EQ(airs_session_geometry(sa, &geo), 0);
  const uint32_t tpb = geo.tokens_per_block;
  const KvLayout layout = kv_layout_for(lm_->model.config, tpb, KvElem::kF16);
  ASSERT_LE(layout.block_bytes(), geo.block_bytes);
  ThreadPool pool(1);
  Engine engine(lm_->model, layout, pool);
  {
    AirsKv ka(sa);
    std::vector<int32_t> prompt = {1};
    for (uint32_t i = 1; i < 3 * tpb + 3; ++i) prompt.push_back(static_cast<int32_t>(3 + (i * 53) % 500));
    Sequence a(engine, ka);
    auto la = a.prefill(prompt);
    ASSERT_TRUE(la.ok()) << la.error().message;
    ASSERT_EQ(a.block_ids().size(), 4U);
    const std::vector<uint32_t> before = a.block_ids();
    // B takes a reference on A's blocks 0 and 1, then gives block 0 back.
    std::vector<uint64_t> hashes;
    uint64_t parent = 0;
    for (uint32_t b = 0; b < 3; ++b) {
      parent = airs_kv_chain_hash(parent, prompt.data() + size_t{b} * tpb, tpb);
      hashes.push_back(parent);
    }
    uint32_t got[3] = {};
    ASSERT_EQ(airs_session_match_prefix(sb, hashes.data(), 2, got), 2) << airs_last_error();
    ASSERT_EQ(got[0], before[0]);
    ASSERT_EQ(got[1], before[1]);
    ASSERT_EQ(airs_session_free(sb, got, 1), 0) << airs_last_error();

    auto ev = run_process({airsctl_path(), "--bus", bus_->address(), "evict", "--priority", "background"}, 30s);
    ASSERT_EQ(ev.exit_code, 0) << ev.out << ev.err;
    // The next step recovers: blocks 0, 2 and 3 recomputed, block 1 kept.
    std::vector<int32_t> ta;
    ta.push_back(argmax(*la));
    auto l = a.append(ta.back());
    ASSERT_TRUE(l.ok()) << l.error().message;
    EXPECT_EQ(a.recomputed_blocks(), 3U);
    EXPECT_EQ(a.block_ids()[1], before[1]);
    const auto rest = greedy(a, *l, 3);
    ta.insert(ta.end(), rest.begin(), rest.end());

    // The daemon's table is the sequence's: a third session matches all
    // three full blocks, the refilled block 0 included, at A's ids.
    ASSERT_EQ(airs_session_match_prefix(sc, hashes.data(), 3, got), 3) << airs_last_error();
    for (uint32_t b = 0; b < 3; ++b) EXPECT_EQ(got[b], a.block_ids()[b]) << b;

    PrivateKv pa_kv(layout.block_bytes());
    Sequence pa(engine, pa_kv);
    auto lpa = pa.prefill(prompt);
    ASSERT_TRUE(lpa.ok());
    std::vector<int32_t> tp;
    tp.push_back(argmax(*lpa));
    auto lp = pa.append(tp.back());
    ASSERT_TRUE(lp.ok());
    const auto rest_p = greedy(pa, *lp, 3);
    tp.insert(tp.end(), rest_p.begin(), rest_p.end());
    EXPECT_EQ(ta, tp);
    ASSERT_EQ(a.size(), pa.size());
    EXPECT_EQ(differing_rows(layout, ka, a, pa_kv, pa, a.size()), 0U);
  }
  airs_session_close(sc);
  airs_session_close(sb);
  airs_session_close(sa);
  close_model();
}

// Each session's blocks and evicted blocks, by priority name (airsctl).
struct SessionBlocks {
  int blocks = 0, evicted = 0;
};
std::map<std::string, SessionBlocks> session_blocks(const std::string& bus) {
  std::map<std::string, SessionBlocks> out;
  auto s = run_process({airsctl_path(), "--bus", bus, "--json", "sessions"}, 30s);
  const auto at = s.out.find('{');
  if (s.exit_code != 0 || at == std::string::npos) {
    ADD_FAILURE() << "airsctl sessions: exit " << s.exit_code << ": " << s.out << s.err;
    return out;
  }
  const auto j = nlohmann::json::parse(s.out.substr(at));
  for (const auto& x : j.at("sessions")) {
    out[x["priority"].get<std::string>()] = {x["blocks"].get<int>(), x["evicted_blocks"].get<int>()};
  }
  return out;
}

// Milliseconds since midnight of a daemon log line's timestamp
// ("YYYY-MM-DD HH:MM:SS.mmm ..."), or -1.
long long log_ms(const std::string& line) {
  int h = 0, m = 0, sec = 0, ms = 0;
  if (line.size() < 23 || std::sscanf(line.c_str() + 11, "%d:%d:%d.%d", &h, &m, &sec, &ms) != 4) return -1;
  return ((h * 60LL + m) * 60 + sec) * 1000 + ms;
}

// The oom_kill count of a memory cgroup (v2 memory.events, v1
// memory.oom_control); -1 when neither says.
long long oom_kills(const std::string& cg) {
  for (const char* f : {"/memory.events", "/memory.oom_control"}) {
    std::ifstream in(cg + f);
    std::string key;
    long long v = 0;
    while (in >> key >> v) {
      if (key == "oom_kill") return v;
    }
  }
  return -1;
}

// The whole product under real memory pressure: an interactive and a
// background airs-generate hold KV sessions while a memory hog in a small
// memory cgroup refaults its working set (it stalls in reclaim: PSI "some"
// and "full" rise, and it is never OOM-killed). The daemon's PSI loop gives
// memory back in the design's order: the background session's blocks go and
// it recomputes them; the interactive session (active: idle threshold
// 10 min) keeps every block. Both outputs equal the private runs'. No
// timing is asserted: every wait is bounded generously, and the times are
// printed.
TEST_F(InferIntegration, RealPressureEvictsBackgroundFirstAndBothOutputsStayIdentical) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to create a memory cgroup";
  if (!start(64, "[kv]\nmax_arena_bytes = 33554432\nidle_threshold = \"10min\"\n[pressure]\nsource = \"psi\"\n"
                 "resize_pool = false\nsome_threshold = \"50ms\"\nsome_window = \"2s\"\nfull_threshold = \"20ms\"\n"
                 "full_window = \"2s\"\ntarget_some_bytes = \"1M\"\ntarget_full_bytes = \"1M\"\n")) {
    return;
  }
  // Different system prompts: the background session's blocks are its own
  // (shared ones would stay referenced by the interactive session).
  const std::string system_b = dir_.path() + "/system-b.txt";
  std::ofstream(system_b) << "you are a patient teacher of geography who explains the valleys, the lakes and the "
                             "hills of every country slowly and with many small examples for young students";
  auto bg_args = [&](std::vector<std::string> extra) {
    auto a = args("tell me about the mountain", std::move(extra));
    *(std::find(a.begin(), a.end(), "--system") + 1) = system_b;
    return a;
  };
  const auto ref_i = run(args("what is the river", {"--no-daemon", "-n", "24"}));
  const auto ref_b = run(bg_args({"--no-daemon", "-n", "24"}));
  Child bg(bg_args({"-n", "24", "--priority", "background", "--pause-at", "4"}));
  ASSERT_TRUE(bg.expect_line("paused", 120s)) << bg.err();
  Child in(args("what is the river", {"-n", "24", "--priority", "interactive", "--pause-at", "4"}));
  ASSERT_TRUE(in.expect_line("paused", 120s)) << in.err();
  // The daemon's session list can lag the calls that made the sessions:
  // wait (bounded) until it shows both.
  std::map<std::string, SessionBlocks> before;
  for (int i = 0; i < 120 && before.size() < 2; ++i) {
    before = session_blocks(bus_->address());
    if (before.size() < 2) std::this_thread::sleep_for(250ms);
  }
  ASSERT_EQ(before.size(), 2U);
  ASSERT_GT(before.at("interactive").blocks, 0);

  auto stress = airs::test::MemcgStressor::create(64 * kMiB, 256 * kMiB);
  ASSERT_TRUE(stress) << "cannot set up memory pressure: " << stress.error().message;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*stress)->start().ok());
  // Until the loop has evicted background blocks (the machine's own
  // pressure may have done it already: the counter, not the block count,
  // is what is waited on). 90 s is ~15x the slowest trigger seen (three
  // 2 s windows).
  std::map<std::string, SessionBlocks> during;
  for (int i = 0; i < 360; ++i) {
    during = session_blocks(bus_->address());
    if (during.count("background") && during.at("background").evicted > 0) break;
    std::this_thread::sleep_for(250ms);
  }
  const auto seen_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_GT(during["background"].evicted, 0)
      << "the pressure loop evicted no background block within 90 s; daemon log:\n" << daemon_->log();
  EXPECT_EQ(during["interactive"].evicted, 0) << "active interactive KV was evicted";
  EXPECT_EQ(during["interactive"].blocks, before.at("interactive").blocks);

  // The interactive session generates while the hog still runs.
  ASSERT_TRUE(in.send(""));
  const auto li = in.expect_line("{", 120s);
  ASSERT_TRUE(li) << in.err();
  const auto ji = nlohmann::json::parse(*li);
  const bool hog_alive = ::kill((*stress)->pid(), 0) == 0;
  const long long ooms = oom_kills((*stress)->cgroup());
  (*stress)->stop();
  EXPECT_TRUE(hog_alive) << "the memory hog died (OOM?) before the end";
  EXPECT_EQ(ooms, 0) << "OOM kills in " << (*stress)->cgroup();
  EXPECT_EQ(ji["recomputed_blocks"], 0) << "the interactive session lost blocks";
  EXPECT_EQ(ji["token_ids"], ref_i["token_ids"]);
  EXPECT_EQ(in.wait(30s).exit_code, 0) << in.err();

  ASSERT_TRUE(bg.send(""));
  const auto lb = bg.expect_line("{", 120s);
  ASSERT_TRUE(lb) << bg.err() << "\ndaemon log:\n" << daemon_->log();
  const auto jb = nlohmann::json::parse(*lb);
  EXPECT_GT(jb["recomputed_blocks"].get<int>(), 0);
  EXPECT_EQ(jb["token_ids"], ref_b["token_ids"]) << "recomputed blocks changed the output";
  EXPECT_EQ(bg.wait(30s).exit_code, 0) << bg.err();

  // Report: the daemon's trigger -> eviction done (its log), and the
  // interactive session's token latency while the hog ran.
  std::istringstream log_in(daemon_->log());
  std::string line;
  long long trig = -1, back = -1;
  std::string back_line;
  while (std::getline(log_in, line)) {
    if (trig < 0 && line.find("pressure: raw level none") != std::string::npos) trig = log_ms(line);
    if (trig >= 0 && back < 0 && line.find("actions freed") != std::string::npos) {
      back = log_ms(line);
      back_line = line;
    }
  }
  std::printf("[ info ] stressor start -> background blocks evicted (airsctl): %lld ms; daemon trigger -> memory "
              "back: %lld ms (%s)\n[ info ] blocks before %d/%d (interactive/background), during %d/%d (evicted %d/%d); "
              "interactive decode under pressure %.1f tok/s (%.1f ms/token, slowest %.1f ms); background recomputed %d "
              "blocks\n",
              static_cast<long long>(seen_ms), trig >= 0 && back >= 0 ? back - trig : -1LL, back_line.c_str(),
              before.at("interactive").blocks, before.at("background").blocks, during["interactive"].blocks,
              during["background"].blocks, during["interactive"].evicted, during["background"].evicted,
              ji["decode_tok_s"].get<double>(), 1000.0 / ji["decode_tok_s"].get<double>(), ji["max_token_ms"].get<double>(),
              jb["recomputed_blocks"].get<int>());
}

}  // namespace

