// airs-generate (src/infer) with its KV cache in airs-memd's blocks, over a
// real daemon on a private bus: the same tokens as on private memory, with
// and without a matched prefix, after forced eviction + recompute, and two
// processes sharing one system prompt's blocks.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon_fixture.hpp"
#include "harness.hpp"

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
  bool start(uint64_t pool_mib = 64) {
    if (auto why = hugepages_missing(pool_mib * kMiB)) {
      ADD_FAILURE() << "huge pages missing: " << *why;
      return false;
    }
    model_ = dir_.path() + "/infer.gguf";
    auto r = run_process({kMkmodel, "--llama", "--out", model_, "--types", "q8_0", "--layers", "4", "--embd", "256",
                          "--ff", "512", "--vocab", "600", "--heads", "8", "--heads-kv", "2", "--seed", "3"},
                         60s);
    if (r.exit_code != 0) {
      ADD_FAILURE() << r.err;
      return false;
    }
    system_ = dir_.path() + "/system.txt";
    std::ofstream(system_) << kSystem;
    bus_ = std::make_unique<PrivateBus>();
    // The pressure loop stays out of it (the machine's own pressure must not
    // shrink the pool under the test), and the arena has a fixed size.
    daemon_ = std::make_unique<DaemonProcess>(
        bus_->address(), "[pool]\nsize = \"" + std::to_string(pool_mib) +
                             "M\"\ngrow_nr_hugepages = false\n[kv]\nmax_arena_bytes = 33554432\n[pressure]\n"
                             "resize_pool = false\nsome_threshold = \"1900ms\"\nfull_threshold = \"1900ms\"\n");
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

  TempDir dir_;
  std::string model_, system_, last_err_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(InferIntegration, DaemonBlocksPrivateMemoryAndNoDaemonGiveTheSameTokens) {
  if (!start()) return;
  const auto priv = run(args("what is the river", {"--no-daemon"}));
  const auto d = run(args("what is the river"));
  EXPECT_EQ(priv["backend"], "private");
  EXPECT_EQ(d["backend"], "daemon") << last_err_;
  EXPECT_EQ(d["token_ids"], priv["token_ids"]);
  EXPECT_GT(d["prompt_tokens"].get<int>(), 3 * d["tokens_per_block"].get<int>());
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

}  // namespace
