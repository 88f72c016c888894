// SPDX-License-Identifier: Apache-2.0
// KV access sampling on a real shared mapping: what a round drops, what the
// next round counts as touched, and that no byte is lost on the way.
#include "client/kv_sampler.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sys/fd.hpp"
#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"
#include "wire/kv_access.hpp"

namespace airs::client {
namespace {

using namespace std::chrono_literals;

class KvSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    page_ = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    chunk_ = 4 * page_;
    auto fd = sys::memfd_create_sealable("kv-sampling", kChunks * chunk_);
    ASSERT_TRUE(fd.ok()) << fd.error().message;
    fd_ = std::move(fd).value();
    auto m = sys::map_shared(fd_.get(), kChunks * chunk_, PROT_READ | PROT_WRITE, 0, "arena");
    ASSERT_TRUE(m.ok()) << m.error().message;
    map_ = std::move(m).value();
    auto pm = sys::open_file("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    ASSERT_TRUE(pm.ok()) << pm.error().message;
    pagemap_ = std::move(pm).value();
    for (uint64_t i = 0; i < kChunks * chunk_; ++i) map_.bytes()[i] = static_cast<std::byte>(i * 7 + 3);
  }
  // Whether the first page of `chunk` is in our page tables.
  bool present(uint64_t chunk) {
    uint64_t e = 0;
    const auto at = reinterpret_cast<uintptr_t>(map_.bytes() + chunk * chunk_) / page_ * 8;
    EXPECT_EQ(::pread(pagemap_.get(), &e, sizeof e, static_cast<off_t>(at)), 8);
    return (e >> 63) != 0;
  }
  bool bytes_intact() {
    for (uint64_t i = 0; i < kChunks * chunk_; ++i)
      if (map_.bytes()[i] != static_cast<std::byte>(i * 7 + 3)) return false;
    return true;
  }

  static constexpr uint64_t kChunks = 4;
  static constexpr uint64_t kBlocksPerChunk = 4;
  uint64_t page_ = 0, chunk_ = 0;
  sys::UniqueFd fd_, pagemap_;
  sys::Mapping map_;
};

TEST_F(KvSamplingTest, ARoundCountsTheChunksTouchedSinceTheLastOneAndKeepsEveryByte) {
  KvSampling s(map_.bytes(), map_.size(), chunk_, kBlocksPerChunk);
  const std::vector<uint32_t> held = {0, 1, 5, 9};  // chunks 0, 1 and 2; chunk 3 is another session's
  s.held(held);
  for (uint64_t c = 0; c < kChunks; ++c) ASSERT_TRUE(present(c)) << c;

  // The first round counts the chunks it takes (all written since they
  // were mapped), then drops them.
  auto r = s.round(pagemap_.get(), 50ms);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->chunks, 3U);
  EXPECT_EQ((*r)->touched, 3U);
  EXPECT_FALSE(present(0));
  EXPECT_FALSE(present(1));
  EXPECT_FALSE(present(2));
  EXPECT_TRUE(present(3)) << "a chunk without the session's blocks was dropped";

  // One store in chunk 1 (the byte it holds): one of three touched. A
  // store, since a read fault also maps the neighbouring pages the kernel
  // has (fault-around, 64 KiB), which here would reach chunks 0 and 2.
  map_.bytes()[chunk_ + 5] = static_cast<std::byte>((chunk_ + 5) * 7 + 3);
  r = s.round(pagemap_.get(), 50ms);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->chunks, 3U);
  EXPECT_EQ((*r)->touched, 1U);
  EXPECT_EQ((*r)->period_ms, 50U);
  EXPECT_DOUBLE_EQ((*r)->share(), 1.0 / 3.0);

  // Dropped pages keep their bytes: reading all of them touches all three.
  EXPECT_TRUE(bytes_intact()) << "a dropped page lost its bytes";
  s.dropped(std::vector<uint32_t>{5});  // chunk 1 leaves the session
  r = s.round(pagemap_.get(), 50ms);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->chunks, 3U);
  EXPECT_EQ((*r)->touched, 3U);
  EXPECT_TRUE(present(1)) << "a chunk the session no longer holds was dropped";

  // Nothing touched since: the two chunks it holds, untouched.
  r = s.round(pagemap_.get(), 50ms);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->chunks, 2U);
  EXPECT_EQ((*r)->touched, 0U);
  EXPECT_TRUE(bytes_intact());

  // A session whose blocks are all gone reports nothing.
  s.dropped_all();
  r = s.round(pagemap_.get(), 50ms);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->has_value()) << "the last round's chunks are still counted";
  r = s.round(pagemap_.get(), 50ms);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->has_value());
}

// A round takes a bounded number of chunks, round robin over those the
// session holds, so a big KV costs a bounded number of faults per round.
TEST_F(KvSamplingTest, ARoundTakesAtMostItsShareOfChunksRoundRobin) {
  KvSampling s(map_.bytes(), map_.size(), chunk_, kBlocksPerChunk, 2);
  s.held(std::vector<uint32_t>{0, 4, 8, 12});  // one block in each of the 4 chunks
  std::vector<std::vector<bool>> seen;
  for (int i = 0; i < 3; ++i) {
    bytes_intact();  // touch every chunk
    auto r = s.round(pagemap_.get(), 50ms);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_TRUE(r->has_value());
    EXPECT_EQ((*r)->chunks, 2U);
    EXPECT_EQ((*r)->touched, 2U);
    seen.push_back({present(0), present(1), present(2), present(3)});
  }
  EXPECT_EQ(seen[0], (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(seen[1], (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(seen[2], (std::vector<bool>{false, false, true, true}));
}

// The sampler's thread sends one report per round on the session's
// channel, in the daemon's wire format, and stops using a session once it
// is removed.
TEST_F(KvSamplingTest, TheSamplerSendsAReportPerRoundUntilTheSessionIsRemoved) {
  auto ch = sys::message_channel();
  ASSERT_TRUE(ch.ok()) << ch.error().message;
  KvSampling s(map_.bytes(), map_.size(), chunk_, kBlocksPerChunk);
  s.held(std::vector<uint32_t>{0});
  std::byte buf[wire::kKvAccessBytes + 1];
  {
    KvSampler sampler(10ms);
    ASSERT_TRUE(sampler.add(&s, ch->first.get()));
    for (int i = 0; i < 2; ++i) {
      pollfd p{ch->second.get(), POLLIN, 0};
      ASSERT_EQ(::poll(&p, 1, 60'000), 1) << "no report in 60 s";
      const auto m = sys::read_message(ch->second.get(), buf, sizeof buf);
      ASSERT_EQ(m.state, sys::MessageRead::Message);
      const auto d = wire::decode_kv_access(buf, m.bytes);
      ASSERT_EQ(d.error, nullptr) << d.error;
      EXPECT_EQ(d.access.chunks, 1U);
      EXPECT_EQ(d.access.period_ms, 10U);
    }
    sampler.remove(&s);
    // Whatever was sent before the removal is read; nothing comes after.
    while (sys::read_message(ch->second.get(), buf, sizeof buf).state == sys::MessageRead::Message) {
    }
  }  // the thread has ended: no round can be under way
  EXPECT_EQ(sys::read_message(ch->second.get(), buf, sizeof buf).state, sys::MessageRead::Again);
  EXPECT_TRUE(bytes_intact());
}

TEST(KvAccessWire, AReportRoundTripsAndAMalformedOneIsNamed) {
  std::byte buf[wire::kKvAccessBytes + 4] = {};
  const size_t n = wire::encode_kv_access({1000, 8, 2}, buf);
  ASSERT_EQ(n, wire::kKvAccessBytes);
  auto d = wire::decode_kv_access(buf, n);
  ASSERT_EQ(d.error, nullptr);
  EXPECT_DOUBLE_EQ(d.access.share(), 0.25);
  EXPECT_NE(wire::decode_kv_access(buf, n + 1).error, nullptr);
  EXPECT_NE(wire::decode_kv_access(buf, n - 1).error, nullptr);
  for (const wire::KvAccess bad : {wire::KvAccess{9, 8, 2}, wire::KvAccess{10'001, 8, 2}, wire::KvAccess{1000, 0, 0},
                                   wire::KvAccess{1000, 2, 3}}) {
    (void)wire::encode_kv_access(bad, buf);
    EXPECT_NE(wire::decode_kv_access(buf, n).error, nullptr) << bad.period_ms << " " << bad.chunks << " " << bad.touched;
  }
  (void)wire::encode_kv_access({1000, 8, 2}, buf);
  buf[0] = std::byte{0};
  EXPECT_STREQ(wire::decode_kv_access(buf, n).error, "not a KV access report (wrong magic word)");
}

TEST(KvAccessWire, ThePeriodComesFromTheEnvironmentWithinTheDaemonsRange) {
  const char* was = std::getenv("AIRS_KV_SAMPLE_MS");
  const std::string saved = was ? was : "";
  ::unsetenv("AIRS_KV_SAMPLE_MS");
  EXPECT_EQ(kv_sample_period_from_env(), 1000ms);
  ::setenv("AIRS_KV_SAMPLE_MS", "0", 1);
  EXPECT_EQ(kv_sample_period_from_env(), 0ms);
  ::setenv("AIRS_KV_SAMPLE_MS", "1", 1);
  EXPECT_EQ(kv_sample_period_from_env(), 10ms);
  ::setenv("AIRS_KV_SAMPLE_MS", "99999999", 1);
  EXPECT_EQ(kv_sample_period_from_env(), 10'000ms);
  ::setenv("AIRS_KV_SAMPLE_MS", "-1", 1);
  EXPECT_EQ(kv_sample_period_from_env(), 1000ms);
  ::setenv("AIRS_KV_SAMPLE_MS", "fast", 1);
  EXPECT_EQ(kv_sample_period_from_env(), 1000ms);
  if (was) ::setenv("AIRS_KV_SAMPLE_MS", saved.c_str(), 1);
  else ::unsetenv("AIRS_KV_SAMPLE_MS");
}

}  // namespace
}  // namespace airs::client
