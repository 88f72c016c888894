// SPDX-License-Identifier: Apache-2.0
// The KV spill tier's limit (daemon/kv_spill.hpp) on a real directory with
// real io_uring writes: least recently used entries go first, a read counts
// as a use, and the order survives a new store opened on the same directory
// (a restarted daemon); a block whose file was cut under it takes no entry
// and loses none.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/kv_spill.hpp"
#include "sys/event_loop.hpp"

namespace airs::daemon {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr uint32_t kBlock = 4096;
constexpr uint64_t kEntry = SpillStore::kHeaderBytes + kBlock;

SpillKey key(uint64_t hash) {
  SpillKey k;
  k.model_high = 0x1234;
  k.model_low = 0x5678;
  k.uid = 0;
  k.tokens_per_block = 16;
  k.block_bytes = kBlock;
  k.hash = hash;
  return k;
}

std::vector<std::byte> block(uint64_t hash) {
  std::vector<std::byte> b(kBlock);
  for (uint32_t i = 0; i < kBlock; ++i) b[i] = static_cast<std::byte>((hash * 131 + i) & 0xff);
  return b;
}

class SpillLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/var/tmp/airs-spill-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto loop = sys::EventLoop::create();
    ASSERT_TRUE(loop.ok());
    loop_ = std::move(loop).value();
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void open(uint64_t entries) {
    store_.reset();
    auto s = SpillStore::open(*loop_, dir_ + "/kv", entries * kEntry);
    ASSERT_TRUE(s.ok()) << s.error().message;
    store_ = std::move(s).value();
  }

  void put(uint64_t hash) {
    const auto b = block(hash);
    ASSERT_EQ(store_->put(key(hash), b.data()), SpillStore::Put::Kept) << hash;
    ASSERT_EQ(store_->drain(std::chrono::steady_clock::now() + 10s), 0u) << "write of " << hash << " never finished";
    ASSERT_TRUE(store_->contains(key(hash))) << hash;
  }

  // Reads it back and checks every byte.
  void read(uint64_t hash) {
    std::vector<std::byte> got(kBlock);
    auto st = store_->get(key(hash), got.data());
    ASSERT_TRUE(st) << hash << ": " << st.error().message;
    EXPECT_EQ(got, block(hash)) << hash;
  }

  // Hashes of the entries in the store and of the files in its directory.
  std::set<uint64_t> kept() const {
    std::set<uint64_t> s;
    for (uint64_t h = 1; h <= 16; ++h)
      if (store_->contains(key(h))) s.insert(h);
    return s;
  }
  std::set<uint64_t> on_disk() const {
    std::set<uint64_t> s;
    for (const auto& e : fs::directory_iterator(dir_ + "/kv/0")) {
      auto k = SpillKey::from_file_name(e.path().filename().string(), 0);
      EXPECT_TRUE(k) << "stray file " << e.path();
      if (k) s.insert(k->hash);
    }
    return s;
  }

  std::string dir_;
  std::unique_ptr<sys::EventLoop> loop_;
  std::unique_ptr<SpillStore> store_;
};

TEST_F(SpillLimit, TheLeastRecentlyUsedEntryGoesFirstAndAReadIsAUse) {
  ASSERT_NO_FATAL_FAILURE(open(3));
  for (uint64_t h : std::initializer_list<uint64_t>{1, 2, 3}) ASSERT_NO_FATAL_FAILURE(put(h));
  EXPECT_EQ(store_->stats().used_bytes, 3 * kEntry);
  ASSERT_NO_FATAL_FAILURE(read(1));  // 1 is now the most recently used
  ASSERT_NO_FATAL_FAILURE(put(4));   // over the limit: 2 goes
  EXPECT_EQ(kept(), (std::set<uint64_t>{1, 3, 4}));
  EXPECT_EQ(on_disk(), kept()) << "a removed entry's file is still there";
  ASSERT_NO_FATAL_FAILURE(put(5));  // then 3
  EXPECT_EQ(kept(), (std::set<uint64_t>{1, 4, 5}));
  EXPECT_EQ(on_disk(), kept());
  std::vector<std::byte> got(kBlock);
  EXPECT_EQ(store_->get(key(2), got.data()).error().code, ENOENT);
  const auto st = store_->stats();
  EXPECT_EQ(st.used_bytes, 3 * kEntry);
  EXPECT_EQ(st.entries, 3u);
  EXPECT_EQ(st.written_bytes, 5 * kEntry);
  for (uint64_t h : std::initializer_list<uint64_t>{1, 4, 5}) ASSERT_NO_FATAL_FAILURE(read(h));
}

// A KV block's client can cut its arena while the daemon restores an entry
// into it: the daemon must not fault (a plain read of the block would be a
// SIGBUS), and the entry, which is sound, stays for the next MatchPrefix.
TEST_F(SpillLimit, AnEntryRestoredIntoACutBlockFailsAndStaysStored) {
  ASSERT_NO_FATAL_FAILURE(open(2));
  ASSERT_NO_FATAL_FAILURE(put(1));
  const int fd = ::memfd_create("airs-cut-arena", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kBlock), 0);
  void* m = ::mmap(nullptr, kBlock, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  ASSERT_EQ(::ftruncate(fd, 0), 0);  // the cut: the mapping has no page behind it now
  auto st = store_->get(key(1), m);
  ASSERT_FALSE(st) << "restored into a cut file";
  EXPECT_EQ(st.error().code, EFAULT) << st.error().message;
  EXPECT_TRUE(store_->contains(key(1))) << "a sound entry was dropped because its block was gone";
  EXPECT_EQ(on_disk(), (std::set<uint64_t>{1}));
  ::munmap(m, kBlock);
  ::close(fd);
  ASSERT_NO_FATAL_FAILURE(read(1));  // and it is served whole to a block that is there
}

TEST_F(SpillLimit, TheOrderOfUseSurvivesARestart) {
  ASSERT_NO_FATAL_FAILURE(open(4));
  for (uint64_t h : std::initializer_list<uint64_t>{1, 2, 3, 4}) ASSERT_NO_FATAL_FAILURE(put(h));
  ASSERT_NO_FATAL_FAILURE(read(2));
  ASSERT_NO_FATAL_FAILURE(read(1));  // use order now: 3, 4, 2, 1
  // Reopened with room for two: the two least recently used go, whatever
  // order they were written in; the rest are served byte for byte.
  ASSERT_NO_FATAL_FAILURE(open(2));
  EXPECT_EQ(kept(), (std::set<uint64_t>{1, 2}));
  EXPECT_EQ(on_disk(), kept());
  EXPECT_EQ(store_->stats().used_bytes, 2 * kEntry);
  for (uint64_t h : std::initializer_list<uint64_t>{1, 2}) ASSERT_NO_FATAL_FAILURE(read(h));
  // A reopened store goes on from there: read 1, then 2 above; 1 again now,
  // so 2 is the oldest use when 7 needs room.
  ASSERT_NO_FATAL_FAILURE(open(2));
  ASSERT_NO_FATAL_FAILURE(read(1));
  ASSERT_NO_FATAL_FAILURE(put(7));
  EXPECT_EQ(kept(), (std::set<uint64_t>{1, 7}));
}

}  // namespace
}  // namespace airs::daemon
