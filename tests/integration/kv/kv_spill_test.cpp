// SPDX-License-Identifier: Apache-2.0
// End to end: the KV spill tier over the real airs-memd.
// Published blocks evicted from a too-small arena are written to
// <state_dir>/kv; another process's MatchPrefix restores them byte for byte,
// also after the model was unloaded and loaded again and after a daemon
// restart (and a clean stop spills what is still cached). A corrupted entry
// is rejected and recomputed, never served; another uid never matches.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "airs/airs.h"
#include "daemon_fixture.hpp"
#include "harness.hpp"
#include "kv_pattern.hpp"

using namespace airs::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uid_t kNobody = 65534;
constexpr uint64_t kSeed = 1717;

std::string kv_client_path() { return AIRS_TEST_KV_CLIENT_PATH; }

std::string join(const std::vector<uint64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}


struct Shared {
  int n = -1;
  uint64_t restored = 0;
  int bad = -1;
};

class KvSpill : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = hugepages_missing(pool_bytes())) GTEST_SKIP() << "huge pages missing: " << *why;
    file_ = make_model(dir_, "kv.gguf", "kvmodel", 8 * kMiB, 4);
    bus_ = std::make_unique<PrivateBus>();
  }

  // The model's page(s), one KV chunk and room to spare, in whole huge pages
  // (32 MiB ones on a 16 KiB-page arm64 kernel): 32 MiB with 2 MiB pages.
  static uint64_t pool_bytes() { return std::max<uint64_t>(32 * kMiB, 4 * huge_page_size()); }

  // A daemon on state_dir_ whose KV arenas hold one chunk: a second session
  // filling it evicts the first one's blocks.
  bool start_daemon() {
    const std::string toml = "[daemon]\nstate_dir = \"" + state_dir() + "\"\n[pool]\nsize = " +
                             std::to_string(pool_bytes()) + "\ngrow_nr_hugepages = false\n[kv]\nmax_arena_bytes = \"" +
                             std::to_string(huge_page_size()) + "\"\n";
    daemon_ = std::make_unique<DaemonProcess>(bus_->address(), toml);
    if (model_path_.empty()) model_path_ = file_.path;
    if (!daemon_->started()) {
      ADD_FAILURE() << "airs-memd did not start:\n" << daemon_->log();
      return false;
    }
    dbus_ = std::make_unique<BusClient>(bus_->address());
    return load();
  }

  // Loads the model, holds it (the tests name it by its object path across
  // their steps), and waits for its content id (spill entries are tied to it).
  bool load() {
    auto e = dbus_->load_model(model_path_, &model_obj_);
    if (e.ok()) e = dbus_->hold_model(model_obj_, model_path_);
    if (!e.ok()) {
      ADD_FAILURE() << e.name << ": " << e.message;
      return false;
    }
    const bool hashed = wait_until([&] { return !model_in(dbus_->status(), model_obj_).value("content_id", "").empty(); }, 30s)
                            .has_value();
    EXPECT_TRUE(hashed) << "no content id:\n" << daemon_->log();
    return hashed;
  }

  bool stop_daemon() {
    if (client_ != nullptr) airs_disconnect(client_);
    client_ = nullptr;
    dbus_.reset();
    const int rc = daemon_->stop();
    EXPECT_EQ(rc, 0) << daemon_->log();
    daemon_.reset();
    return rc == 0;
  }

  void TearDown() override {
    if (client_ != nullptr) airs_disconnect(client_);
    client_ = nullptr;
    dbus_.reset();
    if (daemon_ && daemon_->pid() > 0) {
      EXPECT_EQ(daemon_->stop(), 0) << daemon_->log();
    }
  }

  [[nodiscard]] std::string state_dir() const { return dir_.file("state"); }
  [[nodiscard]] std::string uid_dir(uid_t uid) const { return state_dir() + "/kv/" + std::to_string(uid); }

  nlohmann::json spill_status() { return dbus_->status()["kv"]["spill"]; }

  bool wait_entries(uint64_t n) {
    return wait_until([&] { return spill_status().value("entries", uint64_t{0}) >= n; }, 20s).has_value();
  }

  airs_model* open_model() {
    if (client_ == nullptr && airs_connect(bus_->address().c_str(), &client_) != 0) {
      ADD_FAILURE() << airs_last_error();
      return nullptr;
    }
    airs_model* m = nullptr;
    EXPECT_EQ(airs_model_open(client_, file_.path.c_str(), nullptr, &m), 0) << airs_last_error();
    return m;
  }

  // A background session publishes `n` blocks of kv_pattern(kSeed, i) under
  // `hashes`; an interactive session then takes the whole arena, which
  // evicts them (spilled). Returns the background session's notices.
  void spill_by_eviction(const std::vector<uint64_t>& hashes, std::vector<uint8_t>* spilled_flags = nullptr) {
    airs_model* m = open_model();
    ASSERT_NE(m, nullptr);
    airs_session* bg = nullptr;
    ASSERT_EQ(airs_session_create(client_, m, AIRS_PRIORITY_BACKGROUND, &bg), 0) << airs_last_error();
    airs_kv_geometry g{};
    airs_session_geometry(bg, &g);
    geo_ = g;
    const auto n = static_cast<uint32_t>(hashes.size());
    std::vector<uint32_t> blocks(n);
    ASSERT_EQ(airs_session_allocate(bg, n, blocks.data()), 0) << airs_last_error();
    for (uint32_t i = 0; i < n; ++i) kv_fill(airs_session_block_ptr(bg, blocks[i]), g.block_bytes, kSeed, i);
    ASSERT_EQ(airs_session_set_length(bg, n * g.tokens_per_block), 0) << airs_last_error();
    ASSERT_EQ(airs_session_commit(bg, blocks.data(), hashes.data(), n), 0) << airs_last_error();

    const uint64_t arena_blocks = g.arena_bytes / g.block_bytes;  // one chunk
    ASSERT_GT(arena_blocks, n) << "the test needs room for more blocks than it spills in one chunk";
    airs_session* fg = nullptr;
    ASSERT_EQ(airs_session_create(client_, m, AIRS_PRIORITY_INTERACTIVE, &fg), 0) << airs_last_error();
    std::vector<uint32_t> all(arena_blocks);
    ASSERT_EQ(airs_session_allocate(fg, static_cast<uint32_t>(arena_blocks), all.data()), 0) << airs_last_error();

    std::vector<uint32_t> lost(64);
    std::vector<uint8_t> flags(64);
    const int k = airs_session_read_notices_spilled(bg, lost.data(), flags.data(), lost.size());
    ASSERT_EQ(k, static_cast<int>(n)) << airs_last_error();
    flags.resize(static_cast<size_t>(k));
    if (spilled_flags != nullptr) *spilled_flags = flags;
    airs_session_close(fg);
    airs_session_close(bg);
    airs_model_close(m);
    ASSERT_TRUE(wait_entries(n)) << spill_status().dump() << "\n" << daemon_->log();
  }

  // Another process of this uid matches `hashes` and checks the bytes.
  Shared share(const std::vector<uint64_t>& hashes) {
    Child c({kv_client_path(), "share", "--bus", bus_->address(), "--file", file_.path, "--hashes", join(hashes), "--seed",
             std::to_string(kSeed)});
    Shared out;
    auto m = c.expect_line("matched");
    if (!m) {
      ADD_FAILURE() << c.transcript();
      return out;
    }
    out.n = std::stoi(field(*m, "n"));
    out.restored = field_u64(*m, "restored");
    auto chk = c.expect_line("checked");
    if (!chk) {
      ADD_FAILURE() << c.transcript();
      return out;
    }
    out.bad = std::stoi(field(*chk, "bad"));
    c.wait();
    return out;
  }

  TempDir dir_;
  ModelFile file_;
  std::string model_path_;  // the model the daemon loads (default: file_)
  std::string model_obj_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<BusClient> dbus_;
  airs_client* client_ = nullptr;
  airs_kv_geometry geo_{};
};

TEST_F(KvSpill, EvictedBlocksAreRestoredByAnotherProcessAfterUnloadAndAfterRestart) {
  ASSERT_TRUE(start_daemon());
  const uint32_t tpb = 16;
  const auto hashes = chain(3, tpb, 100);
  std::vector<uint8_t> flags;
  spill_by_eviction(hashes, &flags);
  EXPECT_EQ(flags, (std::vector<uint8_t>{1, 1, 1})) << "the eviction notice says each block was spilled";
  auto st = spill_status();
  EXPECT_EQ(st["entries"].get<uint64_t>(), 3u);
  const uint64_t entry_bytes = 64 + uint64_t{geo_.block_bytes};
  EXPECT_EQ(st["used_bytes"].get<uint64_t>(), 3 * entry_bytes);
  EXPECT_EQ(st["written_bytes"].get<uint64_t>(), 3 * entry_bytes);

  // The blocks are gone from memory; a second process restores them.
  auto more = hashes;
  more.push_back(0xfeedface);  // never published: the run ends there
  Shared s = share(more);
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.restored, 3u);
  EXPECT_EQ(s.bad, 0);
  st = spill_status();
  EXPECT_EQ(st["hits"].get<uint64_t>(), 3u);
  EXPECT_EQ(st["read_bytes"].get<uint64_t>(), 3 * entry_bytes);
  // airsctl shows the tier, as JSON and as text.
  auto ctl = airsctl_status(bus_->address())["kv"]["spill"];
  EXPECT_EQ(ctl["hits"].get<uint64_t>(), 3u);
  EXPECT_EQ(ctl["misses"].get<uint64_t>(), 0u);
  EXPECT_EQ(ctl["limit_bytes"].get<uint64_t>(), uint64_t{1} << 30);
  EXPECT_EQ(ctl["used_bytes"].get<uint64_t>(), 3 * entry_bytes);
  EXPECT_EQ(ctl["written_bytes"].get<uint64_t>(), 3 * entry_bytes);
  EXPECT_EQ(ctl["read_bytes"].get<uint64_t>(), 3 * entry_bytes);
  {
    Child text({airsctl_path(), "--bus", bus_->address(), "status"});
    auto line = text.expect_line("  spill tier");
    ASSERT_TRUE(line) << text.transcript();
    EXPECT_NE(line->find("(3 entries)  hits 3  misses 0  rejected 0"), std::string::npos) << *line;
    text.wait();
  }

  // Unloaded and loaded again: the arena is gone, the tier is not.
  ASSERT_TRUE(dbus_->unload(model_obj_, true).ok());
  ASSERT_TRUE(load());
  s = share(more);
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.restored, 3u);
  EXPECT_EQ(s.bad, 0);

  // A prefix only ever cached in memory: the clean stop spills it.
  const auto cached = chain(2, tpb, 9000);
  {
    airs_model* m = open_model();
    ASSERT_NE(m, nullptr);
    airs_session* a = nullptr;
    ASSERT_EQ(airs_session_create(client_, m, AIRS_PRIORITY_INTERACTIVE, &a), 0) << airs_last_error();
    std::vector<uint32_t> b(2);
    ASSERT_EQ(airs_session_allocate(a, 2, b.data()), 0) << airs_last_error();
    for (uint32_t i = 0; i < 2; ++i) kv_fill(airs_session_block_ptr(a, b[i]), geo_.block_bytes, kSeed, i);
    ASSERT_EQ(airs_session_set_length(a, 2 * tpb), 0);
    ASSERT_EQ(airs_session_commit(a, b.data(), cached.data(), 2), 0) << airs_last_error();
    airs_session_close(a);
    airs_model_close(m);
  }
  EXPECT_EQ(spill_status()["entries"].get<uint64_t>(), 3u) << "cached in memory, not spilled yet";

  // A restarted daemon on the same state_dir restores both.
  ASSERT_TRUE(stop_daemon());
  ASSERT_TRUE(start_daemon());
  EXPECT_EQ(spill_status()["entries"].get<uint64_t>(), 5u) << daemon_->log();
  s = share(more);
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.restored, 3u);
  EXPECT_EQ(s.bad, 0);
  s = share(cached);
  EXPECT_EQ(s.n, 2);
  EXPECT_EQ(s.restored, 2u);
  EXPECT_EQ(s.bad, 0);

  // On disk: root's only, one directory per uid.
  struct stat d {};
  ASSERT_EQ(::stat((state_dir() + "/kv").c_str(), &d), 0);
  EXPECT_EQ(d.st_mode & 07777, 0700u);
  ASSERT_EQ(::stat(uid_dir(::getuid()).c_str(), &d), 0);
  EXPECT_EQ(d.st_mode & 07777, 0700u);
  int files = 0;
  for (const auto& e : fs::directory_iterator(uid_dir(::getuid()))) {
    struct stat f {};
    ASSERT_EQ(::stat(e.path().c_str(), &f), 0);
    EXPECT_EQ(f.st_mode & 07777, 0600u) << e.path();
    EXPECT_EQ(static_cast<uint64_t>(f.st_size), entry_bytes) << e.path();
    ++files;
  }
  EXPECT_EQ(files, 5);
}

TEST_F(KvSpill, CorruptEntryIsRejectedAndRecomputed) {
  ASSERT_TRUE(start_daemon());
  const auto hashes = chain(3, 16, 300);
  spill_by_eviction(hashes);
  // Flip one payload byte of the second block's entry.
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hashes[1]));
  std::string victim;
  for (const auto& e : fs::directory_iterator(uid_dir(::getuid())))
    if (e.path().filename().string().ends_with(hex)) victim = e.path();
  ASSERT_FALSE(victim.empty());
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(64 + 100);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(64 + 100);
    f.write(&c, 1);
  }
  // Served up to the bad entry, never past it.
  Shared s = share(hashes);
  EXPECT_EQ(s.n, 1);
  EXPECT_EQ(s.restored, 1u);
  EXPECT_EQ(s.bad, 0);
  EXPECT_EQ(spill_status()["rejected"].get<uint64_t>(), 1u);
  EXPECT_FALSE(fs::exists(victim)) << "a rejected entry is deleted";
  EXPECT_NE(daemon_->log().find("rejected: checksum mismatch"), std::string::npos) << daemon_->log();

  // The client recomputes blocks 1 and 2; the whole prefix matches again.
  airs_model* m = open_model();
  ASSERT_NE(m, nullptr);
  airs_session* a = nullptr;
  ASSERT_EQ(airs_session_create(client_, m, AIRS_PRIORITY_INTERACTIVE, &a), 0) << airs_last_error();
  std::vector<uint32_t> got(3);
  ASSERT_EQ(airs_session_match_prefix(a, hashes.data(), 3, got.data()), 1) << airs_last_error();
  std::vector<uint32_t> fresh(2);
  ASSERT_EQ(airs_session_allocate(a, 2, fresh.data()), 0) << airs_last_error();
  for (uint32_t i = 0; i < 2; ++i) kv_fill(airs_session_block_ptr(a, fresh[i]), geo_.block_bytes, kSeed, i + 1);
  ASSERT_EQ(airs_session_set_length(a, 3 * 16), 0);
  ASSERT_EQ(airs_session_commit(a, fresh.data(), hashes.data() + 1, 2), 0) << airs_last_error();
  airs_session_close(a);
  airs_model_close(m);
  s = share(hashes);
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.bad, 0);

  // A torn entry (cut short, as a crash mid-write could leave it without
  // the rename) is rejected when a fresh daemon indexes the store.
  ASSERT_TRUE(stop_daemon());  // spills the recomputed blocks 1 and 2 (2 is on disk still)
  char hex2[17];
  std::snprintf(hex2, sizeof hex2, "%016llx", static_cast<unsigned long long>(hashes[2]));
  std::string torn;
  for (const auto& e : fs::directory_iterator(uid_dir(::getuid())))
    if (e.path().filename().string().ends_with(hex2)) torn = e.path();
  ASSERT_FALSE(torn.empty());
  fs::resize_file(torn, 64 + geo_.block_bytes / 2);
  ASSERT_TRUE(start_daemon());
  EXPECT_NE(daemon_->log().find("rejected: " + std::to_string(64 + geo_.block_bytes / 2) + " bytes"), std::string::npos)
      << daemon_->log();
  EXPECT_FALSE(fs::exists(torn));
  EXPECT_EQ(spill_status()["entries"].get<uint64_t>(), 2u);
  s = share(hashes);
  EXPECT_EQ(s.n, 2);
  EXPECT_EQ(s.restored, 2u);
  EXPECT_EQ(s.bad, 0);
}

TEST_F(KvSpill, AnotherUidNeverMatches) {
  ASSERT_TRUE(start_daemon());
  const auto hashes = chain(3, 16, 700);
  spill_by_eviction(hashes);
  const uint64_t hits = spill_status()["hits"].get<uint64_t>();
  Child other({kv_client_path(), "match", "--bus", bus_->address(), "--as-uid", std::to_string(kNobody), "--file", file_.path, "--model",
               model_obj_, "--hashes", join(hashes)});
  auto m = other.expect_line("matched");
  ASSERT_TRUE(m) << other.transcript();
  EXPECT_EQ(field(*m, "n"), "0") << *m;
  other.wait();
  EXPECT_EQ(spill_status()["hits"].get<uint64_t>(), hits);
  EXPECT_FALSE(fs::exists(uid_dir(kNobody))) << "nothing of uid 0 is kept under another uid";
  // The owner still matches them.
  Shared s = share(hashes);
  EXPECT_EQ(s.n, 3);
  EXPECT_EQ(s.restored, 3u);
  EXPECT_EQ(s.bad, 0);

  // An entry copied into another uid's directory is foreign: rejected at start.
  ASSERT_TRUE(stop_daemon());
  ASSERT_TRUE(fs::create_directories(uid_dir(kNobody)));
  for (const auto& e : fs::directory_iterator(uid_dir(::getuid())))
    fs::copy_file(e.path(), uid_dir(kNobody) + "/" + e.path().filename().string());
  ASSERT_TRUE(start_daemon());
  EXPECT_EQ(spill_status()["entries"].get<uint64_t>(), 3u) << daemon_->log();
  EXPECT_NE(daemon_->log().find("rejected: uid 0 in a directory of uid 65534"), std::string::npos) << daemon_->log();
  Child again({kv_client_path(), "match", "--bus", bus_->address(), "--as-uid", std::to_string(kNobody), "--file", file_.path, "--model",
               model_obj_, "--hashes", join(hashes)});
  m = again.expect_line("matched");
  ASSERT_TRUE(m) << again.transcript();
  EXPECT_EQ(field(*m, "n"), "0") << *m;
  again.wait();
}

// The engine end to end: airs-generate's prompt blocks, cached when it
// exits, are spilled by the clean stop; after the restart a second run
// restores them (restored_tokens) and generates exactly the tokens private
// memory gives.
TEST_F(KvSpill, AirsGenerateRestoresItsPromptAfterARestartWithTheSameTokens) {
  model_path_ = dir_.file("infer.gguf");
  auto mk = run_process({AIRS_MKMODEL_PATH, "--llama", "--out", model_path_, "--types", "q8_0", "--layers", "4", "--embd",
                         "256", "--ff", "512", "--vocab", "600", "--heads", "8", "--heads-kv", "2", "--seed", "3"},
                        60s);
  ASSERT_EQ(mk.exit_code, 0) << mk.err;
  const std::string system = dir_.file("system.txt");
  std::ofstream(system) << "you are a helpful assistant and you answer every question about the forest, the river and "
                           "the mountain with care; you never make things up";
  auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {AIRS_GENERATE_PATH, model_path_, "--system", system, "-p", "what is the river", "-n", "6",
                                  "--json", "--threads", "1", "--bus", bus_->address()};
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run_process(a, 120s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto at = r.out.rfind('{');
    if (at == std::string::npos) {
      ADD_FAILURE() << "no JSON: " << r.out << r.err;
      return nlohmann::json{};
    }
    return nlohmann::json::parse(r.out.substr(at));
  };
  ASSERT_TRUE(start_daemon());
  const auto ref = generate({"--no-daemon"});
  const auto first = generate({});
  EXPECT_EQ(first["backend"], "daemon");
  EXPECT_EQ(first["matched_tokens"], 0);
  EXPECT_EQ(first["restored_tokens"], 0);
  ASSERT_TRUE(stop_daemon());
  ASSERT_TRUE(start_daemon());
  const auto second = generate({});
  const int tpb = second["tokens_per_block"].get<int>();
  EXPECT_GE(second["matched_tokens"].get<int>(), 2 * tpb) << second.dump();
  EXPECT_EQ(second["restored_tokens"], second["matched_tokens"]) << second.dump();
  EXPECT_EQ(second["token_ids"], ref["token_ids"]);
  EXPECT_EQ(spill_status()["hits"].get<uint64_t>(), second["matched_tokens"].get<uint64_t>() / static_cast<uint64_t>(tpb));
}

}  // namespace
