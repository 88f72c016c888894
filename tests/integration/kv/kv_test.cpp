// SPDX-License-Identifier: Apache-2.0
// End to end: KV sessions over the real airs-memd and a private
// D-Bus, through libairs in this process and in other client processes
// (airs_test_kv_client), one of them running as another uid. Bytes written
// to blocks are checked where they must (and must not) be visible; errors
// by their D-Bus names.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "airs/airs.h"
#include "daemon_fixture.hpp"
#include "harness.hpp"
#include "kv_pattern.hpp"
#include "wire/kv_access.hpp"

using namespace airs::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr const char* kAccessDenied = "org.freedesktop.DBus.Error.AccessDenied";
constexpr const char* kQuota = "org.aios.Airs1.Error.QuotaExceeded";

std::string kv_client_path() { return AIRS_TEST_KV_CLIENT_PATH; }

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

std::string join(const std::vector<uint64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::set<std::string> session_paths(const nlohmann::json& list) {
  std::set<std::string> s;
  for (const auto& d : list) s.insert(d.value("session", ""));
  return s;
}

class KvIntegration : public ::testing::Test {
 protected:
  // `pool_mib` as with 2 MiB huge pages: with larger ones (32 MiB with 16 KiB
  // base pages) the pool has the same number of pages, so as many KV chunks
  // and the same room beside the model, whatever the page size.
  bool start(uint64_t pool_mib, const std::string& kv_toml = "") {
    pool_mib *= std::max<uint64_t>(1, huge_page_size() / (2 * kMiB));
    if (auto why = hugepages_missing(pool_mib * kMiB)) {
      ADD_FAILURE() << "huge pages missing: " << *why;
      return false;
    }
    file_ = make_model(dir_, "kv.gguf", "kvmodel", 8 * kMiB, 4);
    bus_ = std::make_unique<PrivateBus>();
    const std::string toml = "[pool]\nsize = \"" + std::to_string(pool_mib) + "M\"\ngrow_nr_hugepages = false\n[kv]\n" + kv_toml;
    daemon_ = std::make_unique<DaemonProcess>(bus_->address(), toml);
    if (!daemon_->started()) {
      ADD_FAILURE() << "airs-memd did not start:\n" << daemon_->log();
      return false;
    }
    dbus_ = std::make_unique<BusClient>(bus_->address());
    auto e = dbus_->load_model(file_.path, &model_obj_);
    if (!e.ok()) {
      ADD_FAILURE() << e.name << ": " << e.message;
      return false;
    }
    return true;
  }

  // libairs in this process: client + model (opened lazily like any user).
  bool open_lib() {
    if (airs_connect(bus_->address().c_str(), &client_) != 0) {
      ADD_FAILURE() << airs_last_error();
      return false;
    }
    if (airs_model_open(client_, file_.path.c_str(), nullptr, &model_) != 0) {
      ADD_FAILURE() << airs_last_error();
      return false;
    }
    return true;
  }

  airs_session* session(airs_priority p) {
    airs_session* s = nullptr;
    EXPECT_EQ(airs_session_create(client_, model_, p, &s), 0) << airs_last_error();
    if (s != nullptr) sessions_.push_back(s);
    return s;
  }

  void close_session(airs_session* s) {
    std::erase(sessions_, s);
    airs_session_close(s);
  }

  std::vector<uint32_t> allocate(airs_session* s, uint32_t n) {
    std::vector<uint32_t> b(n);
    EXPECT_EQ(airs_session_allocate(s, n, b.data()), 0) << airs_last_error();
    return b;
  }

  static airs_kv_geometry geometry(airs_session* s) {
    airs_kv_geometry g{};
    airs_session_geometry(s, &g);
    return g;
  }

  void TearDown() override {
    for (auto* s : sessions_) airs_session_close(s);
    sessions_.clear();
    if (model_ != nullptr) airs_model_close(model_);
    if (client_ != nullptr) airs_disconnect(client_);
    model_ = nullptr;
    client_ = nullptr;
    dbus_.reset();
    // A clean exit: no sanitizer report, no crash at shutdown.
    if (daemon_ && daemon_->pid() > 0) {
      const int rc = daemon_->stop();
      EXPECT_EQ(rc, 0) << "airs-memd did not stop cleanly:\n" << daemon_->log();
    }
  }

  uint64_t kv_pool_bytes() { return dbus_->status()["pool"]["kv_bytes"].get<uint64_t>(); }

  TempDir dir_;
  ModelFile file_;
  std::string model_obj_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<BusClient> dbus_;
  airs_client* client_ = nullptr;
  airs_model* model_ = nullptr;
  std::vector<airs_session*> sessions_;
};


// ---- 11. the whole session API, prefix sharing and copy-on-write ----

TEST_F(KvIntegration, SessionApiPrefixSharingAndCopyOnWrite) {
  if (!start(64) || !open_lib()) return;
  airs_session* a = session(AIRS_PRIORITY_INTERACTIVE);
  ASSERT_NE(a, nullptr);
  const auto g = geometry(a);
  ASSERT_GT(g.block_bytes, 0u);
  ASSERT_EQ(g.tokens_per_block, 16u);
  EXPECT_EQ(uint64_t{g.block_bytes}, g.bytes_per_token * g.tokens_per_block);

  // Write three full blocks and publish them under their chained hashes.
  const uint64_t seed = 42;
  auto blocks = allocate(a, 3);
  std::set<uint32_t> distinct(blocks.begin(), blocks.end());
  ASSERT_EQ(distinct.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    void* p = airs_session_block_ptr(a, blocks[i]);
    ASSERT_NE(p, nullptr);
    kv_fill(p, g.block_bytes, seed, i);
  }
  ASSERT_EQ(airs_session_set_length(a, 3 * g.tokens_per_block), 0) << airs_last_error();
  const auto hashes = chain(3, g.tokens_per_block);
  ASSERT_EQ(airs_session_commit(a, blocks.data(), hashes.data(), 3), 0) << airs_last_error();

  // Another session of this uid (this process) shares them...
  airs_session* b = session(AIRS_PRIORITY_SYSTEM);
  ASSERT_NE(b, nullptr);
  std::vector<uint32_t> matched(4);
  auto h4 = hashes;
  h4.push_back(0xdeadbeef);  // a fourth block nobody published
  ASSERT_EQ(airs_session_match_prefix(b, h4.data(), h4.size(), matched.data()), 3) << airs_last_error();
  matched.resize(3);
  EXPECT_EQ(matched, blocks);
  for (uint32_t i = 0; i < 3; ++i)
    EXPECT_EQ(kv_check(airs_session_block_ptr(b, matched[i]), g.block_bytes, seed, i), g.block_bytes) << i;
  // ...and so does another process of the same uid.
  {
    Child other({kv_client_path(), "share", "--bus", bus_->address(), "--file", file_.path, "--hashes", join(h4),
                 "--seed", std::to_string(seed)});
    auto m = other.expect_line("matched");
    ASSERT_TRUE(m) << other.transcript();
    EXPECT_EQ(field(*m, "n"), "3") << *m;
    auto c = other.expect_line("checked");
    ASSERT_TRUE(c) << other.transcript();
    EXPECT_EQ(field(*c, "bad"), "0") << other.transcript();
    EXPECT_EQ(other.wait().exit_code, 0) << other.transcript();
  }
  auto listed = dbus_->list_sessions();
  ASSERT_EQ(listed.size(), 2u) << listed.dump(1);
  for (auto& s : listed) EXPECT_EQ(s["shared_blocks"].get<uint32_t>(), 3u) << s.dump();

  // Copy-on-write: b gets a private copy with the same bytes; writing the
  // copy leaves the original (still a's) untouched.
  uint32_t copy = 0;
  ASSERT_EQ(airs_session_prepare_write(b, matched[0], &copy), 0) << airs_last_error();
  EXPECT_NE(copy, matched[0]);
  EXPECT_EQ(distinct.count(copy), 0u);
  EXPECT_EQ(kv_check(airs_session_block_ptr(b, copy), g.block_bytes, seed, 0), g.block_bytes);
  kv_fill(airs_session_block_ptr(b, copy), g.block_bytes, seed + 1, 0);
  EXPECT_EQ(kv_check(airs_session_block_ptr(a, blocks[0]), g.block_bytes, seed, 0), g.block_bytes);
  EXPECT_EQ(kv_check(airs_session_block_ptr(b, copy), g.block_bytes, seed + 1, 0), g.block_bytes);
  // A block that is already private is written in place.
  auto priv = allocate(a, 1);
  uint32_t same = 0;
  ASSERT_EQ(airs_session_prepare_write(a, priv[0], &same), 0) << airs_last_error();
  EXPECT_EQ(same, priv[0]);

  // Free, set_length, errors.
  ASSERT_EQ(airs_session_free(b, &matched[1], 1), 0) << airs_last_error();
  EXPECT_LT(airs_session_free(b, &matched[1], 1), 0) << "freeing a block twice succeeded";
  EXPECT_LT(airs_session_set_length(b, 1000 * g.tokens_per_block), 0) << "a length past the table was accepted";
  std::vector<uint32_t> none(1);
  const uint64_t unknown = 12345;
  EXPECT_EQ(airs_session_match_prefix(b, &unknown, 1, none.data()), 0);

  close_session(b);
  close_session(a);
  EXPECT_TRUE(dbus_->list_sessions().empty());
}

// ---- 12. another uid ----

TEST_F(KvIntegration, AnotherUidCannotTouchTheSessionAndNeverSharesTheArena) {
  if (!start(64)) return;
  if (::getuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534";
  BusClient::Session mine;
  auto e = dbus_->create_session(model_obj_, "interactive", &mine);
  ASSERT_TRUE(e.ok()) << e.name << ": " << e.message;
  std::vector<uint32_t> blocks;
  ASSERT_TRUE(dbus_->allocate(mine.path, 4, &blocks).ok());
  void* map = ::mmap(nullptr, mine.arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, mine.arena_fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto block = [&](uint32_t b) {
    return static_cast<uint8_t*>(map) + (b / mine.blocks_per_chunk) * mine.chunk_bytes +
           (b % mine.blocks_per_chunk) * uint64_t{mine.block_bytes};
  };
  const uint64_t seed = 7;
  for (uint32_t i = 0; i < 4; ++i) kv_fill(block(blocks[i]), mine.block_bytes, seed, i);
  struct stat st {};
  ASSERT_EQ(::fstat(mine.arena_fd, &st), 0);

  Child other({kv_client_path(), "intruder", "--bus", bus_->address(), "--as-uid", "65534", "--file", file_.path,
               "--model", model_obj_, "--victim", mine.path, "--seed", std::to_string(seed), "--blocks", "4"});
  auto u = other.expect_line("uid");
  ASSERT_TRUE(u) << other.transcript();
  EXPECT_EQ(field(*u, "now"), "65534");
  for (const char* method : {"Allocate", "AllocateAt", "Free", "Commit", "MatchPrefix", "PrepareWrite", "SetLength", "Close"}) {
    auto l = other.expect_line("victim");
    ASSERT_TRUE(l) << other.transcript();
    EXPECT_EQ(field(*l, "method"), method);
    EXPECT_EQ(field(*l, "error"), kAccessDenied) << *l << "\n" << other.err();
  }
  auto arena = other.expect_line("arena");
  ASSERT_TRUE(arena) << other.transcript();
  EXPECT_FALSE(field_u64(*arena, "dev") == static_cast<uint64_t>(st.st_dev) &&
               field_u64(*arena, "ino") == static_cast<uint64_t>(st.st_ino))
      << "uid 65534 got the same arena file as uid 0";
  auto b = other.expect_line("blocks");
  ASSERT_TRUE(b) << other.transcript();
  EXPECT_EQ(field(*b, "n"), "4");
  EXPECT_EQ(field(*b, "foreign"), "0") << "uid 65534 sees uid 0's KV bytes";
  EXPECT_EQ(field(*b, "nonzero"), "0") << "a fresh block of another arena holds old bytes";
  ASSERT_TRUE(other.expect_line("holding")) << other.transcript();
  // Our session is still ours, with our bytes, after their writes.
  auto list = dbus_->list_sessions();
  EXPECT_EQ(list.size(), 2u) << list.dump(1);
  bool found = false;
  for (auto& s : list) {
    if (s["session"] == mine.path) {
      found = true;
      EXPECT_EQ(s["blocks"].get<uint32_t>(), 4u);
    } else {
      EXPECT_EQ(s["uid"].get<uint32_t>(), 65534u);
    }
  }
  EXPECT_TRUE(found) << "uid 65534 closed uid 0's session";
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(kv_check(block(blocks[i]), mine.block_bytes, seed, i), mine.block_bytes);
  EXPECT_TRUE(dbus_->allocate(mine.path, 1).ok());
  other.send("go");
  EXPECT_EQ(other.wait().exit_code, 0) << other.transcript();
  ::munmap(map, mine.arena_bytes);
  ::close(mine.arena_fd);
  EXPECT_TRUE(dbus_->close_session(mine.path).ok());
}

TEST_F(KvIntegration, ASessionNeedsProofThatTheUidCanReadTheModel) {
  if (!start(64)) return;
  if (::getuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534";
  // Held by root through both children, which name it by its object path.
  ASSERT_TRUE(dbus_->hold_model(model_obj_, file_.path).ok());
  // No fd of the file: refused, naming the proof that is missing; nothing is held.
  Child bare({kv_client_path(), "match", "--bus", bus_->address(), "--as-uid", "65534", "--model", model_obj_,
              "--hashes", "1"});
  EXPECT_EQ(bare.wait().exit_code, 19) << bare.transcript();
  EXPECT_NE(bare.err().find("org.freedesktop.DBus.Error.AccessDenied"), std::string::npos) << bare.err();
  EXPECT_NE(bare.err().find("uid 65534 has not proven it can read the model's file"), std::string::npos)
      << bare.err();
  EXPECT_TRUE(dbus_->list_sessions().empty()) << dbus_->list_sessions().dump(1);
  // With its own fd of the file (opened before it dropped to 65534), LoadModel
  // proves it: the same model, and a session of uid 65534 on it.
  Child proven({kv_client_path(), "fill", "--bus", bus_->address(), "--as-uid", "65534", "--file", file_.path,
                "--model", model_obj_, "--priority", "interactive", "--blocks", "1"});
  auto p = proven.expect_line("proved");
  ASSERT_TRUE(p) << proven.transcript();
  EXPECT_EQ(field(*p, "model"), model_obj_);
  ASSERT_TRUE(proven.expect_line("ready")) << proven.transcript();
  auto list = dbus_->list_sessions();
  ASSERT_EQ(list.size(), 1u) << list.dump(1);
  EXPECT_EQ(list[0]["uid"].get<uint32_t>(), 65534u);
  proven.send("go");
  EXPECT_EQ(proven.wait().exit_code, 0) << proven.transcript();
}

// ---- 13. crash clean-up ----

// A killed client's sessions and the KV pages they held go with it, and
// nobody else's. Ordered on the kill, not on a clock: the 20 s only ends a
// test that would otherwise wait for ever (a TCG guest the host starves is
// slow, not wrong); the latency is printed.
TEST_F(KvIntegration, KilledClientLosesItsSessionsAndTheirPages) {
  if (!start(64)) return;
  // A session of ours that must survive the other client's death.
  BusClient::Session mine;
  ASSERT_TRUE(dbus_->create_session(model_obj_, "interactive", &mine).ok());
  ASSERT_TRUE(dbus_->allocate(mine.path, 2).ok());
  const auto before = session_paths(dbus_->list_sessions());
  const uint64_t kv0 = kv_pool_bytes();

  // More blocks than our chunk has left, so the pool's KV bytes grow.
  Child c({kv_client_path(), "hold", "--bus", bus_->address(), "--file", file_.path, "--sessions", "3", "--blocks",
           std::to_string(std::max<uint32_t>(40, mine.blocks_per_chunk + 1))});
  ASSERT_TRUE(c.expect_line("ready")) << c.transcript();
  auto during = session_paths(dbus_->list_sessions());
  EXPECT_EQ(during.size(), before.size() + 3);
  EXPECT_GT(kv_pool_bytes(), kv0);

  const auto t_kill = std::chrono::steady_clock::now();
  c.kill(SIGKILL);
  EXPECT_EQ(c.wait(5s).signal, SIGKILL);
  auto gone = wait_until([&] { return session_paths(dbus_->list_sessions()) == before && kv_pool_bytes() == kv0; },
                         20s);
  const auto since_kill =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t_kill).count();
  EXPECT_TRUE(gone) << "after 20 s: sessions " << dbus_->list_sessions().dump(1) << " kv bytes " << kv_pool_bytes()
                    << " (before " << kv0 << ")";
  std::printf("[ info ] sessions and KV pages released %lld ms after the kill\n", static_cast<long long>(since_kill));
  EXPECT_EQ(model_in(dbus_->status(), model_obj_).value("refcount", 99u), 0u);
  // Ours is untouched and usable.
  EXPECT_TRUE(dbus_->allocate(mine.path, 1).ok());
  ::close(mine.arena_fd);
}

// ---- 14. quotas at N+1 ----

TEST_F(KvIntegration, SessionQuotaAtNPlusOne) {
  if (!start(64, "max_sessions_per_uid = 2\n")) return;
  BusClient::Session s1, s2, s3;
  ASSERT_TRUE(dbus_->create_session(model_obj_, "interactive", &s1).ok());
  ASSERT_TRUE(dbus_->create_session(model_obj_, "background", &s2).ok());
  auto e = dbus_->create_session(model_obj_, "system", &s3);
  EXPECT_EQ(e.name, kQuota) << e.message;
  EXPECT_NE(e.message.find("max_sessions_per_uid = 2"), std::string::npos) << e.message;
  EXPECT_EQ(dbus_->list_sessions().size(), 2u);
  // Closing one makes room again.
  ASSERT_TRUE(dbus_->close_session(s2.path).ok());
  EXPECT_TRUE(dbus_->create_session(model_obj_, "system", &s3).ok());
  for (int fd : {s1.arena_fd, s2.arena_fd, s3.arena_fd})
    if (fd >= 0) ::close(fd);
}

TEST_F(KvIntegration, BlockQuotaAtNPlusOne) {
  if (!start(64, "max_blocks_per_uid = 8\n")) return;
  BusClient::Session s1, s2;
  ASSERT_TRUE(dbus_->create_session(model_obj_, "interactive", &s1).ok());
  ASSERT_TRUE(dbus_->create_session(model_obj_, "interactive", &s2).ok());
  ASSERT_TRUE(dbus_->allocate(s1.path, 5).ok());
  ASSERT_TRUE(dbus_->allocate(s2.path, 3).ok());  // 8 of 8 for this uid
  auto e = dbus_->allocate(s2.path, 1);
  EXPECT_EQ(e.name, kQuota) << e.message;
  EXPECT_NE(e.message.find("max_blocks_per_uid = 8"), std::string::npos) << e.message;
  // The library maps it to -EDQUOT.
  ASSERT_TRUE(open_lib());
  airs_session* s = session(AIRS_PRIORITY_INTERACTIVE);
  ASSERT_NE(s, nullptr);
  uint32_t b = 0;
  EXPECT_EQ(airs_session_allocate(s, 1, &b), -EDQUOT);
  EXPECT_NE(std::string(airs_last_error()).find("max_blocks_per_uid"), std::string::npos) << airs_last_error();
  for (int fd : {s1.arena_fd, s2.arena_fd}) ::close(fd);
}

TEST_F(KvIntegration, FdQuotaAtNPlusOne) {
  // Each session hands out 3 fds (arena, notice page, wake socket).
  if (!start(64, "max_fds_per_uid = 6\n")) return;
  BusClient::Session s1, s2, s3;
  ASSERT_TRUE(dbus_->create_session(model_obj_, "interactive", &s1).ok());
  ASSERT_TRUE(dbus_->create_session(model_obj_, "interactive", &s2).ok());
  auto e = dbus_->create_session(model_obj_, "interactive", &s3);
  EXPECT_EQ(e.name, kQuota) << e.message;
  EXPECT_NE(e.message.find("max_fds_per_uid"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("holds 6 of its 6"), std::string::npos) << e.message;
  // Closing the session and its fds gives them back (the daemon counts the
  // descriptors the uid's processes still hold, not Close calls).
  ASSERT_TRUE(dbus_->close_session(s1.path).ok());
  auto still = dbus_->create_session(model_obj_, "interactive", &s3);
  EXPECT_EQ(still.name, kQuota) << "a closed session's fds still held by the client were uncounted";
  for (int fd : {s1.arena_fd, s1.notice_fd, s1.event_fd}) ::close(fd);
  EXPECT_TRUE(dbus_->create_session(model_obj_, "interactive", &s3).ok()) << "closing the fds did not return them";
  for (const auto* s : {&s2, &s3})
    for (int fd : {s->arena_fd, s->notice_fd, s->event_fd})
      if (fd >= 0) ::close(fd);
}

// ---- 15. eviction order end to end ----

class KvEviction : public KvIntegration {
 protected:
  // Fills the pool: background and system one chunk each, `interactive` the rest.
  void fill(airs_session* bg, airs_session* sys, airs_session* interactive) {
    const auto g = geometry(bg);
    const auto st = dbus_->status();
    const uint64_t chunk = huge_page_size();  // blocks are carved from huge-page chunks
    free_chunks_ = st["pool"]["free_bytes"].get<uint64_t>() / chunk;
    ASSERT_GE(free_chunks_, 4u) << st["pool"].dump();
    per_chunk_ = static_cast<uint32_t>(chunk / g.block_bytes);
    ASSERT_GE(per_chunk_, 4u);
    bg_ = allocate(bg, per_chunk_);
    sys_ = allocate(sys, per_chunk_);
    int_blocks_ = allocate(interactive, static_cast<uint32_t>(free_chunks_ - 2) * per_chunk_);
    ASSERT_EQ(dbus_->status()["pool"]["free_bytes"].get<uint64_t>(), 0u) << "the pool is not full";
  }

  // A daemon with `toml`, the pool full (fill): background and system
  // sessions, an interactive one that holds the rest, and an interactive
  // requester with nothing yet. False when the test cannot go on (a skip
  // or a failure is recorded).
  bool start_full(const std::string& toml) {
    if (!start(32, toml) || !open_lib()) return false;
    bg_s_ = session(AIRS_PRIORITY_BACKGROUND);
    sys_s_ = session(AIRS_PRIORITY_SYSTEM);
    int_s_ = session(AIRS_PRIORITY_INTERACTIVE);
    req_s_ = session(AIRS_PRIORITY_INTERACTIVE);
    if (!(bg_s_ && sys_s_ && int_s_ && req_s_)) {
      ADD_FAILURE() << "a session could not be created: " << airs_last_error();
      return false;
    }
    fill(bg_s_, sys_s_, int_s_);
    return !HasFatalFailure();
  }

  static std::vector<uint32_t> notices(airs_session* s) {
    std::vector<uint32_t> v(4096);
    const int n = airs_session_read_notices(s, v.data(), v.size());
    EXPECT_GE(n, 0) << airs_last_error();
    v.resize(static_cast<size_t>(std::max(n, 0)));
    return v;
  }

  uint64_t free_chunks_ = 0;
  uint32_t per_chunk_ = 0;
  std::vector<uint32_t> bg_, sys_, int_blocks_;  // what fill() gave each
  airs_session *bg_s_ = nullptr, *sys_s_ = nullptr, *int_s_ = nullptr, *req_s_ = nullptr;
};

// Whether interactive KV is active or idle is a matter of time, so each half
// is ordered by its own threshold rather than by how fast the machine runs:
// here an hour (the session is active however slow the guest), below one
// second after a sleep past it (the session is idle however fast).
TEST_F(KvEviction, BackgroundThenSystemNeverActiveInteractive) {
  if (!start_full("idle_threshold = \"1h\"\n")) return;
  airs_session *bg = bg_s_, *sys = sys_s_, *active = int_s_, *req = req_s_;
  const uint32_t half = per_chunk_ / 2;

  // 1. Room for half a chunk: background KV goes first, nobody else's.
  auto r1 = allocate(req, half);
  EXPECT_TRUE(readable(airs_session_notice_fd(bg))) << "background session was not told";
  EXPECT_FALSE(readable(airs_session_notice_fd(sys)));
  EXPECT_FALSE(readable(airs_session_notice_fd(active)));
  auto n1 = notices(bg);
  EXPECT_EQ(n1.size(), half);
  for (uint32_t b : n1) EXPECT_NE(std::find(bg_.begin(), bg_.end(), b), bg_.end()) << "notice of a foreign block " << b;
  EXPECT_FALSE(readable(airs_session_notice_fd(bg))) << "reading the notices did not quiet the notice fd";

  // 2. A whole chunk: the rest of background, then system.
  auto r2 = allocate(req, per_chunk_);
  EXPECT_TRUE(readable(airs_session_notice_fd(bg)));
  EXPECT_TRUE(readable(airs_session_notice_fd(sys))) << "system session was not told";
  EXPECT_FALSE(readable(airs_session_notice_fd(active)));
  EXPECT_EQ(notices(bg).size(), per_chunk_ - half);
  auto n2 = notices(sys);
  EXPECT_EQ(n2.size(), half) << "system lost more than needed";
  for (uint32_t b : n2) EXPECT_NE(std::find(sys_.begin(), sys_.end(), b), sys_.end());

  // 3. More than system has left: the active interactive session is never a
  // victim, the allocation fails saying how much is missing, and (all or
  // nothing) nobody lost anything for it.
  std::vector<uint32_t> big(per_chunk_);
  EXPECT_EQ(airs_session_allocate(req, per_chunk_, big.data()), -ENOMEM);
  const std::string msg = airs_last_error();
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pool exhausted"), std::string::npos) << msg;
  EXPECT_FALSE(readable(airs_session_notice_fd(active))) << "an active interactive session lost KV";
  (void)notices(sys);  // whatever a failed Allocate did to it: FailedAllocateEvictsNothing checks that
  {
    // Its D-Bus name, through a raw call on the same failure.
    BusClient::Session probe;
    ASSERT_TRUE(dbus_->create_session(model_obj_, "interactive", &probe).ok());
    auto e = dbus_->allocate(probe.path, per_chunk_ * 2);
    EXPECT_EQ(e.name, "org.aios.Airs1.Error.PoolExhausted") << e.message;
    EXPECT_NE(e.message.find("missing"), std::string::npos) << e.message;
    EXPECT_TRUE(dbus_->close_session(probe.path).ok());
    ::close(probe.arena_fd);
  }
  EXPECT_FALSE(readable(airs_session_notice_fd(active)));
  (void)r1;
  (void)r2;
}

// A client owns its end of the wake-up the daemon gives each session. When
// that was an eventfd, one open file shared with the daemon, a client could
// clear O_NONBLOCK and saturate the counter: the daemon's next eviction
// notice then blocked its loop for good (every call, every fault). Here the
// client does exactly that to its background session's fd, and the
// eviction that tells that session still answers, with the notice.
TEST_F(KvEviction, AClientThatBlocksAndFillsItsNoticeFdCannotStallTheDaemon) {
  if (!start_full("idle_threshold = \"1h\"\n")) return;
  const int fd = airs_session_notice_fd(bg_s_);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK), 0);
  {
    // The write that saturates an eventfd. On the socket it is a message
    // to the daemon's end, which reads it as a KV access report (it is not
    // one: the daemon says so and reads no more of this session's), and
    // nothing the daemon writes to.
    struct sigaction ignore {}, was {};
    ignore.sa_handler = SIG_IGN;
    ASSERT_EQ(::sigaction(SIGPIPE, &ignore, &was), 0);
    const uint64_t max = 0xfffffffffffffffeULL;
    const ssize_t n = ::write(fd, &max, sizeof max);
    const int e = errno;
    ASSERT_EQ(::sigaction(SIGPIPE, &was, nullptr), 0);
    EXPECT_EQ(n, static_cast<ssize_t>(sizeof max)) << std::strerror(e);
    EXPECT_FALSE(readable(fd)) << "the client's write came back to it";
  }
  // Room for half a chunk: the daemon takes it from the background session
  // and wakes that session, in the same call.
  const uint32_t half = per_chunk_ / 2;
  std::vector<uint32_t> got(half);
  ASSERT_EQ(airs_session_allocate(req_s_, half, got.data()), 0) << airs_last_error();
  EXPECT_TRUE(readable(fd)) << "the background session was not told";
  const auto lost = notices(bg_s_);
  EXPECT_EQ(lost.size(), half);
  for (uint32_t b : lost) EXPECT_NE(std::find(bg_.begin(), bg_.end(), b), bg_.end()) << "notice of a foreign block " << b;
  EXPECT_FALSE(readable(fd)) << "reading the notices (on a blocking fd) did not quiet it";
  // And it goes on serving everyone.
  EXPECT_EQ(dbus_->status()["kv"]["sessions"].get<uint64_t>(), 4u) << dbus_->status().dump();

  // The daemon refuses that session's reports once its loop has read the
  // write (on its own turn, which may come after the calls above are
  // answered: the bus and the channel are two descriptors). Status says
  // so, for that session alone.
  for (const auto deadline = std::chrono::steady_clock::now() + 60s;;) {
    int refused = 0, others = 0;
    for (const auto& d : dbus_->list_sessions()) {
      if (!d.value("access_reports_refused", false)) continue;
      if (d.value("priority", "") == "background") ++refused;
      else ++others;
    }
    EXPECT_EQ(others, 0) << "another session's reports were refused";
    if (refused == 1) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the malformed report was never refused";
    std::this_thread::sleep_for(10ms);
  }
  // Its end of the channel is shut for it now: what it sends next fails,
  // so nothing it sends is held in the daemon's socket.
  const uint64_t more = 1;
  EXPECT_EQ(::send(fd, &more, sizeof more, MSG_NOSIGNAL | MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EPIPE) << std::strerror(errno);

  // A raw client that floods its session's channel with reports and hangs
  // up: the daemon reads a bounded number per turn, then sees the hang-up
  // and stops watching. Its loop is idle afterwards: over a second with
  // only our status calls, an idle loop wakes a few times per call, one
  // that spins on the closed socket thousands of times.
  BusClient::Session raw;
  ASSERT_TRUE(dbus_->create_session(model_obj_, "background", &raw).ok());
  std::byte report[airs::wire::kKvAccessBytes];
  (void)airs::wire::encode_kv_access({1000, 1, 1}, report);
  while (::send(raw.event_fd, report, sizeof report, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof report)) {
  }
  EXPECT_EQ(errno, EAGAIN) << std::strerror(errno);
  for (int* f : {&raw.event_fd, &raw.notice_fd, &raw.arena_fd}) {
    if (*f >= 0) ::close(*f);
    *f = -1;
  }
  const uint64_t w0 = dbus_->status()["loop_wakeups"].get<uint64_t>();
  std::this_thread::sleep_for(1s);
  EXPECT_LT(dbus_->status()["loop_wakeups"].get<uint64_t>() - w0, 500u) << "the daemon's loop spins";
  EXPECT_TRUE(dbus_->close_session(raw.path).ok());
}

// Within a priority, idle KV goes first by how often it is read, where the
// client samples its sessions (libairs' KV access sampling), not only by
// last use. Two background sessions hold a chunk each; the older one is
// read and the newer one is not. Room for an interactive allocation then
// comes from the newer one, where last use alone would take the older.
TEST_F(KvEviction, WithinAPriorityTheSessionItsClientDoesNotReadGoesFirst) {
  // Rounds of 50 ms (the default is a second). The sampler reads it when
  // this process's first session is made.
  const char* was = std::getenv("AIRS_KV_SAMPLE_MS");
  struct Restore {
    std::optional<std::string> value;
    ~Restore() {
      if (value) ::setenv("AIRS_KV_SAMPLE_MS", value->c_str(), 1);
      else ::unsetenv("AIRS_KV_SAMPLE_MS");
    }
  } restore{was != nullptr ? std::optional<std::string>(was) : std::nullopt};
  ASSERT_EQ(::setenv("AIRS_KV_SAMPLE_MS", "50", 1), 0);
  if (!start(32, "idle_threshold = \"1h\"\n") || !open_lib()) return;
  airs_session* read = session(AIRS_PRIORITY_BACKGROUND);
  airs_session* idle = session(AIRS_PRIORITY_BACKGROUND);
  airs_session* busy = session(AIRS_PRIORITY_INTERACTIVE);
  airs_session* req = session(AIRS_PRIORITY_INTERACTIVE);
  ASSERT_TRUE(read && idle && busy && req) << airs_last_error();
  fill(read, idle, busy);  // read first: by last use, it would go first
  if (HasFatalFailure()) return;
  const auto read_blocks = bg_;

  // The client reads its `read` session (a store into each block: what
  // counts is that the page is touched) until the daemon has a rate for
  // both background sessions, the read one's above 0. A round only counts
  // pages touched after the round before it dropped them, so the reads go
  // on until a report says so.
  nlohmann::json rates;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    for (const uint32_t b : read_blocks) {
      auto* p = static_cast<volatile uint8_t*>(airs_session_block_ptr(read, b));
      ASSERT_NE(p, nullptr);
      p[0] = static_cast<uint8_t>(b);
    }
    rates = nlohmann::json::array();
    int rated = 0, read_above_zero = 0;
    for (const auto& d : dbus_->list_sessions()) {
      if (d.value("priority", "") != "background") continue;
      rates.push_back(d);
      const double r = d.value("access_rate", -1.0);
      if (r >= 0) ++rated;
      if (r > 0) ++read_above_zero;
    }
    if (rated == 2 && read_above_zero == 1) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "no KV access reports reached the daemon in 60 s: " << rates.dump();
    std::this_thread::sleep_for(20ms);
  }
  for (const auto& d : rates) EXPECT_GT(d.value("access_reports", uint64_t{0}), 0u) << d.dump();

  // Room for half a chunk: from the session nobody reads.
  const uint32_t half = per_chunk_ / 2;
  const auto got = allocate(req, half);
  EXPECT_TRUE(readable(airs_session_notice_fd(idle))) << "the unread session was not told: " << rates.dump();
  EXPECT_FALSE(readable(airs_session_notice_fd(read))) << "the read session lost KV: " << rates.dump();
  EXPECT_FALSE(readable(airs_session_notice_fd(busy)));
  const auto lost = notices(idle);
  EXPECT_EQ(lost.size(), half);
  for (uint32_t b : lost) EXPECT_NE(std::find(sys_.begin(), sys_.end(), b), sys_.end()) << "notice of a foreign block " << b;
  // The read session's bytes are where its client put them: sampling
  // dropped their pages from its mapping, never their contents.
  for (const uint32_t b : read_blocks)
    EXPECT_EQ(static_cast<const uint8_t*>(airs_session_block_ptr(read, b))[0], static_cast<uint8_t>(b)) << b;
  (void)got;
}

TEST_F(KvEviction, IdleInteractiveGoesAfterBackgroundAndSystem) {
  if (!start_full("idle_threshold = \"1s\"\n")) return;
  airs_session *bg = bg_s_, *sys = sys_s_, *idle = int_s_, *req = req_s_;
  // Idle past the threshold from here on: nothing touches it again.
  std::this_thread::sleep_for(1300ms);

  // Two chunks: background and system go whole, the idle interactive
  // session, the next in line, not yet.
  std::vector<uint32_t> first(2 * per_chunk_);
  ASSERT_EQ(airs_session_allocate(req, 2 * per_chunk_, first.data()), 0) << airs_last_error();
  EXPECT_EQ(notices(bg).size(), per_chunk_);
  EXPECT_EQ(notices(sys).size(), per_chunk_);
  EXPECT_FALSE(readable(airs_session_notice_fd(idle))) << "interactive KV went before system KV was gone";

  // One more: now it is the idle interactive session's turn.
  std::vector<uint32_t> more(per_chunk_);
  ASSERT_EQ(airs_session_allocate(req, per_chunk_, more.data()), 0) << airs_last_error();
  EXPECT_TRUE(readable(airs_session_notice_fd(idle))) << "idle interactive session was not evicted";
  auto n = notices(idle);
  EXPECT_EQ(n.size(), per_chunk_);
  for (uint32_t b : n) EXPECT_NE(std::find(int_blocks_.begin(), int_blocks_.end(), b), int_blocks_.end());
  // The blocks it lost are the ones the requester now holds.
  std::set<uint32_t> got(more.begin(), more.end());
  for (uint32_t b : n) EXPECT_EQ(got.count(b), 1u) << b;
}

TEST_F(KvEviction, AcrossUidsBackgroundKvMakesRoomForInteractive) {
  // Background KV of another uid (another arena) fills the pool; an
  // interactive allocation of ours evicts it, only about as much as needed.
  // (Its pool share is lifted so it can fill the pool.)
  if (::getuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534";
  if (!start(32, "max_pool_bytes_per_uid = \"100%\"\n") || !open_lib()) return;
  airs_session* req = session(AIRS_PRIORITY_INTERACTIVE);
  ASSERT_NE(req, nullptr);
  const auto g = geometry(req);
  const uint64_t chunk = huge_page_size();
  const uint32_t pc = static_cast<uint32_t>(chunk / g.block_bytes);
  const uint64_t free_chunks = dbus_->status()["pool"]["free_bytes"].get<uint64_t>() / chunk;
  ASSERT_GE(free_chunks, 4u);
  Child bg({kv_client_path(), "fill", "--bus", bus_->address(), "--as-uid", "65534", "--file", file_.path, "--model",
            model_obj_,
            "--priority", "background", "--blocks", std::to_string((free_chunks - 1) * pc)});
  ASSERT_TRUE(bg.expect_line("ready")) << bg.transcript();
  ASSERT_EQ(dbus_->status()["pool"]["free_bytes"].get<uint64_t>(), chunk);
  std::vector<uint32_t> mine(2 * pc);
  ASSERT_EQ(airs_session_allocate(req, 2 * pc, mine.data()), 0) << airs_last_error();
  uint64_t evicted = 0;
  for (auto& s : dbus_->list_sessions())
    if (s["uid"].get<uint32_t>() == 65534u) evicted = s["evicted_blocks"].get<uint64_t>();
  std::printf("[ info ] background KV of uid 65534 evicted: %llu blocks (%u were missing)\n",
              static_cast<unsigned long long>(evicted), pc);
  EXPECT_GE(evicted, pc);
  EXPECT_LE(evicted, 2u * pc) << "evicted far more than the allocation needed";
  bg.send("go");
  auto n = bg.expect_line("notices");
  ASSERT_TRUE(n) << bg.transcript();
  EXPECT_EQ(field_u64(*n, "n"), evicted) << "the notice page and ListSessions disagree";
  EXPECT_EQ(bg.wait().exit_code, 0) << bg.transcript();
}

TEST_F(KvEviction, AnotherUidsKvStopsAtItsPoolShareAndEvictsNobodyElses) {
  // Root's background KV holds one chunk; uid 65534's interactive KV (which
  // outranks it) may hold half the pool and no more: past its share it gets
  // QuotaExceeded, and nothing of root's is evicted for it.
  if (::getuid() != 0) GTEST_SKIP() << "needs root to run a client as uid 65534";
  if (!start(32, "max_pool_bytes_per_uid = \"50%\"\n") || !open_lib()) return;
  airs_session* bg = session(AIRS_PRIORITY_BACKGROUND);
  ASSERT_NE(bg, nullptr);
  const auto g = geometry(bg);
  const uint64_t chunk = huge_page_size();
  const uint32_t pc = static_cast<uint32_t>(chunk / g.block_bytes);
  std::vector<uint32_t> mine = allocate(bg, pc);
  ASSERT_EQ(mine.size(), pc);
  const uint64_t pool = dbus_->status()["pool"]["total_bytes"].get<uint64_t>();
  const uint64_t share_chunks = (pool / 2) / chunk;
  ASSERT_GE(share_chunks, 2u);
  Child over({kv_client_path(), "fill", "--bus", bus_->address(), "--as-uid", "65534", "--file", file_.path, "--model",
              model_obj_, "--priority", "interactive", "--blocks", std::to_string((share_chunks + 1) * pc)});
  EXPECT_EQ(over.wait().exit_code, 19) << over.transcript();
  EXPECT_NE(over.err().find(kQuota), std::string::npos) << over.err();
  EXPECT_NE(over.err().find("uid 65534: KV pool share exceeded"), std::string::npos) << over.err();
  EXPECT_NE(over.err().find("kv.max_pool_bytes_per_uid"), std::string::npos) << over.err();
  EXPECT_TRUE(notices(bg).empty()) << "root's KV was evicted for another uid past its share";
  // Within its share it gets its blocks.
  Child within({kv_client_path(), "fill", "--bus", bus_->address(), "--as-uid", "65534", "--file", file_.path,
                "--model", model_obj_, "--priority", "interactive", "--blocks", std::to_string(share_chunks * pc)});
  auto r = within.expect_line("ready");
  ASSERT_TRUE(r) << within.transcript();
  EXPECT_EQ(field_u64(*r, "blocks"), share_chunks * pc);
  EXPECT_TRUE(notices(bg).empty());
  within.send("go");
  EXPECT_EQ(within.wait().exit_code, 0) << within.transcript();
}

TEST_F(KvEviction, FailedAllocateEvictsNothing) {
  // All or nothing: an Allocate that cannot be satisfied (the rest is
  // active interactive KV) must not evict lower-priority KV on the way.
  if (!start_full("")) return;
  airs_session *bg = bg_s_, *sys = sys_s_, *active = int_s_, *req = req_s_;
  const auto before = dbus_->list_sessions();
  std::vector<uint32_t> big(3 * per_chunk_);
  EXPECT_EQ(airs_session_allocate(req, 3 * per_chunk_, big.data()), -ENOMEM);
  EXPECT_NE(std::string(airs_last_error()).find("missing"), std::string::npos) << airs_last_error();
  EXPECT_FALSE(readable(airs_session_notice_fd(bg))) << "background lost " << notices(bg).size() << " blocks for nothing";
  EXPECT_FALSE(readable(airs_session_notice_fd(sys))) << "system lost " << notices(sys).size() << " blocks for nothing";
  EXPECT_FALSE(readable(airs_session_notice_fd(active)));
  auto after = dbus_->list_sessions();
  for (size_t i = 0; i < before.size() && i < after.size(); ++i)
    EXPECT_EQ(after[i]["blocks"], before[i]["blocks"]) << after[i].dump();
}

}  // namespace
