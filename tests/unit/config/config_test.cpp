#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "config/config.hpp"
#include "util/units.hpp"

using namespace airs;
using namespace std::chrono_literals;

TEST(Config, DefaultsAreValid) { EXPECT_TRUE(config::validate(config::Config{})); }

TEST(Config, ParsesEverySection) {
  auto c = config::parse(R"(
[daemon]
bus = "unix:path=/tmp/x"
log_level = "debug"
[pool]
size = "512M"
page_size = "2M"
numa_policy = "interleave"
[models]
prefetch_window = 3
allocate_ahead = 0
warmup_rate = "20M"
direct_io = "off"
pinned = ["tinyllama"]
[kv]
tokens_per_block = 32
kv_type = "q8_0"
idle_threshold = "2m"
[pressure]
some_window = "2s"
some_threshold = "150ms"
poll_interval = 250
)",
                         "test.conf");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->daemon.bus, "unix:path=/tmp/x");
  EXPECT_EQ(c->pool.size, 512 * kMiB);
  EXPECT_EQ(c->pool.page_size, 2 * kMiB);
  EXPECT_EQ(c->models.prefetch_window, 3u);
  EXPECT_EQ(c->models.warmup_rate, 20 * kMiB);
  EXPECT_EQ(c->models.allocate_ahead, 0u);
  EXPECT_EQ(c->models.direct_io, "off");
  EXPECT_EQ(c->models.pinned, std::vector<std::string>{"tinyllama"});
  EXPECT_EQ(c->kv.tokens_per_block, 32u);
  EXPECT_EQ(c->kv.idle_threshold, 120s);
  EXPECT_EQ(c->pressure.some_threshold, 150000us);
  EXPECT_EQ(c->pressure.poll_interval, 250ms);
  EXPECT_TRUE(config::validate(*c));
}

TEST(Config, UnknownKeyIsNamed) {
  auto c = config::parse("[pool]\nszie = \"1G\"\n", "x.conf");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("x.conf: [pool] unknown key 'szie'"), std::string::npos) << c.error().message;
}

TEST(Config, UnknownSectionIsNamed) {
  auto c = config::parse("[kvcache]\n", "x.conf");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("'kvcache'"), std::string::npos);
}

TEST(Config, BadValuesNameKeyAndReason) {
  auto c = config::parse("[pool]\nsize = \"lots\"\n", "x.conf");
  ASSERT_FALSE(c);
  EXPECT_NE(c.error().message.find("[pool] size: 'lots' is not a size"), std::string::npos) << c.error().message;
  auto d = config::parse("[models]\nqueue_depth = 0\n", "x.conf");
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find("queue_depth: 0 is out of range"), std::string::npos) << d.error().message;
  auto w = config::parse("[models]\nwarmup_rate = \"fast\"\n", "x.conf");
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message.find("[models] warmup_rate: 'fast' is not a size"), std::string::npos)
      << w.error().message;
  auto e = config::parse("[pool\n", "x.conf");
  ASSERT_FALSE(e);
  EXPECT_NE(e.error().message.find("x.conf:1:"), std::string::npos) << e.error().message;
}

TEST(Config, ValidateRejectsInconsistentValues) {
  config::Config c;
  c.models.mode = "turbo";
  auto s = config::validate(c);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("models.mode = 'turbo' is not one of: auto, full, small-pages, cooperative"),
            std::string::npos);
  c = {};
  c.pressure.some_threshold = 3s;
  EXPECT_FALSE(config::validate(c));
  c = {};
  c.pool.numa_policy = "bind";
  EXPECT_FALSE(config::validate(c));
}

TEST(Config, DropInsOverrideInNameOrder) {
  namespace fs = std::filesystem;
  auto dir = fs::temp_directory_path() / ("airs-conf-" + std::to_string(::getpid()));
  fs::create_directories(dir / "conf.d");
  std::ofstream(dir / "main.conf") << "[kv]\ntokens_per_block = 8\n[pool]\nsize = \"1G\"\n";
  std::ofstream(dir / "conf.d" / "20-b.conf") << "[kv]\ntokens_per_block = 64\n";
  std::ofstream(dir / "conf.d" / "10-a.conf") << "[kv]\ntokens_per_block = 32\n";
  std::ofstream(dir / "conf.d" / "ignored.txt") << "garbage";
  auto c = config::load((dir / "main.conf").string(), (dir / "conf.d").string(), false);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->kv.tokens_per_block, 64u);
  EXPECT_EQ(c->pool.size, kGiB);
  EXPECT_EQ(c->sources.size(), 3u);
  fs::remove_all(dir);
}

TEST(Config, ShippedConfigFileParsesToDefaults) {
  auto c = config::load(AIRS_SOURCE_DIR "/config/airs-memd.conf", "", false);
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(config::to_toml(*c), config::to_toml(config::Config{}));
}

TEST(Config, EffectiveConfigRoundTrips) {
  config::Config c;
  c.pool.size = 3 * kGiB;
  c.models.pinned = {"a", "b"};
  c.models.warmup_rate = 20 * kMiB;
  // Finer than a millisecond: printed in µs, not rounded to "150ms" or "0ms".
  c.pressure.some_threshold = std::chrono::microseconds(150500);
  c.pressure.full_threshold = std::chrono::microseconds(150);
  auto again = config::parse(config::to_toml(c), "roundtrip");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(config::to_toml(*again), config::to_toml(c));
  EXPECT_EQ(again->pressure.some_threshold, std::chrono::microseconds(150500));
  EXPECT_EQ(again->pressure.full_threshold, std::chrono::microseconds(150));
  EXPECT_EQ(again->models.warmup_rate, 20 * kMiB);
}

TEST(Config, ProfilesFollowTheSeedBudget) {
  EXPECT_EQ(config::profile_for_memory(1900 * kMiB).pool_bytes, 0u);
  EXPECT_EQ(config::profile_for_memory(3900 * kMiB).pool_bytes, 2 * kGiB);
  EXPECT_EQ(config::profile_for_memory(7800 * kMiB).pool_bytes, 4 * kGiB);
  EXPECT_EQ(config::profile_for_memory(7800 * kMiB).name, "8gb");
}
