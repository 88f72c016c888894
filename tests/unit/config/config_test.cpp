// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include "config/config.hpp"
#include "util/units.hpp"

using namespace airs;
using namespace std::chrono_literals;

TEST(Config, DefaultsAreValid) { EXPECT_TRUE(config::validate(config::Config{})); }

TEST(Config, ParsesEverySection) {
  auto c = config::parse(R"(
[daemon]
bus = "unix:path=/tmp/x"
start_without_bus = "fail"
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
  EXPECT_EQ(c->daemon.start_without_bus, config::NoBus::Fail);
  EXPECT_EQ(c->pool.size, 512 * kMiB);
  EXPECT_EQ(c->pool.page_size, 2 * kMiB);
  EXPECT_EQ(c->models.prefetch_window, 3u);
  EXPECT_EQ(c->models.warmup_rate, 20 * kMiB);
  EXPECT_EQ(c->models.allocate_ahead, 0u);
  EXPECT_EQ(c->models.direct_io, config::DirectIo::Off);
  EXPECT_EQ(c->kv.kv_type, config::KvType::Q8_0);
  EXPECT_EQ(c->pool.numa_policy, config::NumaPolicy::Interleave);
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
  c.pressure.some_threshold = 3s;
  EXPECT_FALSE(config::validate(c));
  c = {};
  c.pool.numa_policy = config::NumaPolicy::Bind;
  auto s = config::validate(c);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("pool.numa_policy = \"bind\" needs pool.numa_nodes"), std::string::npos)
      << s.error().message;
  c = {};
  c.pool.profile = config::ProfileChoice::Custom;
  EXPECT_FALSE(config::validate(c));
}

TEST(Config, FixedWordsParseOnceIntoEnums) {
  auto c = config::parse(R"(
[pool]
profile = "4gb"
backend = "shmem"
numa_policy = "bind"
numa_nodes = [0]
[models]
mode = "small-pages"
direct_io = "on"
[kv]
kv_type = "f16"
[pressure]
source = "poll"
)",
                         "x.conf");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->pool.profile, config::ProfileChoice::Gb4);
  EXPECT_EQ(c->pool.backend, config::Backend::Shmem);
  EXPECT_EQ(c->pool.numa_policy, config::NumaPolicy::Bind);
  EXPECT_EQ(c->models.mode, config::ModeChoice::SmallPages);
  EXPECT_EQ(c->models.direct_io, config::DirectIo::On);
  EXPECT_EQ(c->kv.kv_type, config::KvType::F16);
  EXPECT_EQ(c->pressure.source, config::PressureSource::Poll);
  EXPECT_TRUE(config::validate(*c));
  // Every word reads back to its enum and prints as it was written.
  for (auto w : {"auto", "2gb", "4gb", "8gb", "custom"})
    EXPECT_STREQ(config::to_string(*config::parse_enum<config::ProfileChoice>(w)), w);
  for (auto w : {"auto", "full", "small-pages", "cooperative"})
    EXPECT_STREQ(config::to_string(*config::parse_enum<config::ModeChoice>(w)), w);
  EXPECT_FALSE(config::parse_enum<config::Backend>("Shmem"));
  EXPECT_EQ(config::accepted_words<config::PressureSource>(), "auto, psi, poll, off");
  EXPECT_EQ(config::parse_enum<config::PressureSource>("off"), config::PressureSource::Off);
  EXPECT_EQ(config::accepted_words<config::NoBus>(), "wait, fail");
  EXPECT_EQ(config::Config{}.daemon.start_without_bus, config::NoBus::Wait);
}

TEST(Config, UnknownWordNamesKeyAndAcceptedWords) {
  struct Case {
    const char* text;
    const char* want;
  };
  for (const auto& [text, want] : {
           Case{"[models]\nmode = \"turbo\"\n",
                "x.conf: [models] mode: 'turbo' is not one of: auto, full, small-pages, cooperative"},
           Case{"[pool]\nprofile = \"16gb\"\n", "[pool] profile: '16gb' is not one of: auto, 2gb, 4gb, 8gb, custom"},
           Case{"[pool]\nbackend = \"tmpfs\"\n", "[pool] backend: 'tmpfs' is not one of: auto, hugetlbfs, shmem"},
           Case{"[pool]\nnuma_policy = \"spread\"\n",
                "[pool] numa_policy: 'spread' is not one of: local, bind, interleave"},
           Case{"[models]\ndirect_io = \"yes\"\n", "[models] direct_io: 'yes' is not one of: auto, on, off"},
           Case{"[kv]\nkv_type = \"q4_0\"\n", "[kv] kv_type: 'q4_0' is not one of: f16, q8_0"},
           Case{"[pressure]\nsource = \"dbus\"\n", "[pressure] source: 'dbus' is not one of: auto, psi, poll, off"},
           Case{"[pressure]\nsource = 1\n", "[pressure] source: expected a string, one of: auto, psi, poll, off"},
           Case{"[daemon]\nstart_without_bus = \"retry\"\n",
                "[daemon] start_without_bus: 'retry' is not one of: wait, fail"},
           Case{"[daemon]\nstart_without_bus = false\n",
                "[daemon] start_without_bus: expected a string, one of: wait, fail"},
       }) {
    auto c = config::parse(text, "x.conf");
    ASSERT_FALSE(c) << text;
    EXPECT_NE(c.error().message.find(want), std::string::npos) << c.error().message;
  }
}

TEST(Config, SizeZeroNeedsTheCloudOnlyProfile) {
  auto c = config::parse("[pool]\nsize = 0\n", "x.conf");
  ASSERT_TRUE(c) << c.error().message;
  auto s = config::validate(*c);
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("pool.size = 0: use profile = \"2gb\" for cloud-only"), std::string::npos)
      << s.error().message;
  auto custom = config::parse("[pool]\nprofile = \"custom\"\nsize = 0\n", "x.conf");
  ASSERT_TRUE(custom);
  EXPECT_FALSE(config::validate(*custom));
  auto cloud = config::parse("[pool]\nprofile = \"2gb\"\nsize = 0\n", "x.conf");
  ASSERT_TRUE(cloud);
  EXPECT_TRUE(config::validate(*cloud));
  EXPECT_EQ(config::effective_profile(cloud->pool, 8 * kGiB).pool_bytes, 0u);
}

TEST(Config, EffectiveProfile) {
  config::PoolConfig p;
  EXPECT_EQ(config::effective_profile(p, 3900 * kMiB).name, "4gb");
  EXPECT_EQ(config::effective_profile(p, 3900 * kMiB).pool_bytes, 2 * kGiB);
  p.profile = config::ProfileChoice::Gb8;
  EXPECT_EQ(config::effective_profile(p, 1900 * kMiB).pool_bytes, 4 * kGiB);
  p.size = 512 * kMiB;
  EXPECT_EQ(config::effective_profile(p, 1900 * kMiB).pool_bytes, 512 * kMiB);
  EXPECT_EQ(config::effective_profile(p, 1900 * kMiB).name, "8gb");
  p.profile = config::ProfileChoice::Custom;
  EXPECT_EQ(config::effective_profile(p, 1900 * kMiB).name, "custom");
}

namespace {
config::MachineFacts one_node_8g() {
  config::MachineFacts m;
  m.mem_total = 8 * kGiB;
  m.nodes_with_memory = {0};
  return m;
}
}  // namespace

TEST(Config, MachineCheckRefusesNodesWithoutMemory) {
  config::Config c;
  c.pool.numa_policy = config::NumaPolicy::Interleave;
  c.pool.numa_nodes = {0, 99};
  auto s = config::check_machine(c, one_node_8g());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("pool.numa_nodes: node 99 has no memory on this machine (nodes with memory: 0)"),
            std::string::npos)
      << s.error().message;
  auto m = one_node_8g();
  m.nodes_with_memory = {0, 1, 2, 3};
  c.pool.numa_nodes = {1, 3};
  EXPECT_TRUE(config::check_machine(c, m));
  m.nodes_with_memory.clear();  // unknown: not checked
  c.pool.numa_nodes = {99};
  EXPECT_TRUE(config::check_machine(c, m));
}

TEST(Config, MachineCheckRefusesAPoolTooLargeForMemTotal) {
  config::Config c;
  c.pool.size = 1024 * kGiB;  // size = "1T"
  auto s = config::check_machine(c, one_node_8g());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("pool size 1 TiB (1099511627776 bytes) is larger than MemTotal 8 GiB (8589934592 bytes)"),
            std::string::npos)
      << s.error().message;
  // Less than 512 MiB left: refused, naming the pool, what is left and MemTotal.
  c.pool.size = 8 * kGiB - 256 * kMiB;
  s = config::check_machine(c, one_node_8g());
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("leaves only 256 MiB of MemTotal 8 GiB"), std::string::npos) << s.error().message;
  c.pool.size = 8 * kGiB - 512 * kMiB;
  EXPECT_TRUE(config::check_machine(c, one_node_8g()));
  // The profile's size counts when size is unset: 8gb (4 GiB) on a 2 GB board.
  c.pool.size.reset();
  c.pool.profile = config::ProfileChoice::Gb8;
  auto small = one_node_8g();
  small.mem_total = 1900 * kMiB;
  EXPECT_FALSE(config::check_machine(c, small));
  c.pool.profile = config::ProfileChoice::Auto;  // auto on the same board: cloud only, fine
  EXPECT_TRUE(config::check_machine(c, small));
  small.mem_total = 0;  // unknown: not checked
  c.pool.size = 1024 * kGiB;
  EXPECT_TRUE(config::check_machine(c, small));
}

TEST(Config, MachineCheckNamesAMissingPreloadFile) {
  config::Config c;
  c.models.preload = {"/models/a.gguf", "/models/b.gguf"};
  auto m = one_node_8g();
  std::vector<std::string> asked;
  m.check_file = [&asked](const std::string& p) -> Status {
    asked.push_back(p);
    if (p == "/models/b.gguf") return make_error(ENOENT, "{}: No such file or directory", p);
    return {};
  };
  auto s = config::check_machine(c, m);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message, "models.preload: /models/b.gguf: No such file or directory");
  EXPECT_EQ(asked, (std::vector<std::string>{"/models/a.gguf", "/models/b.gguf"}));
}

TEST(Config, NewKeysParseWithDefaults) {
  config::Config d;
  EXPECT_EQ(d.daemon.trusted_group, "") << "by default no client holds a writable region others read";
  EXPECT_EQ(d.daemon.state_dir, "/var/lib/airs");
  EXPECT_EQ(d.models.max_models_per_uid, 8u);
  EXPECT_EQ(d.models.max_pool_bytes_per_uid, (config::PoolShare{0, 50}));
  EXPECT_EQ(d.models.keep_alive, 0s);
  EXPECT_EQ(d.models.drain_wait, 5s);
  EXPECT_TRUE(d.models.preload.empty());
  auto c = config::parse(R"(
[daemon]
trusted_group = "airs"
state_dir = ""
[models]
max_models_per_uid = 0
max_pool_bytes_per_uid = "1G"
keep_alive = "10m"
drain_wait = "2m"
preload = ["/srv/models/phi-2.gguf"]
)",
                         "x.conf");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->daemon.trusted_group, "airs");
  EXPECT_EQ(c->daemon.state_dir, "");
  EXPECT_EQ(c->models.max_models_per_uid, 0u);
  EXPECT_EQ(c->models.max_pool_bytes_per_uid, (config::PoolShare{kGiB, 0}));
  EXPECT_EQ(c->models.keep_alive, 600s);
  EXPECT_EQ(c->models.drain_wait, 120s);
  EXPECT_EQ(c->models.preload, std::vector<std::string>{"/srv/models/phi-2.gguf"});
  EXPECT_TRUE(config::validate(*c));
  auto zero = config::parse("[models]\nkeep_alive = \"0\"\n", "x.conf");
  ASSERT_TRUE(zero) << zero.error().message;
  EXPECT_EQ(zero->models.keep_alive, 0s);
}

TEST(Config, PoolShareResolves) {
  EXPECT_EQ((config::PoolShare{0, 50}).resolve(4 * kGiB), 2 * kGiB);
  EXPECT_EQ((config::PoolShare{0, 1}).resolve(100), 1u);
  EXPECT_EQ((config::PoolShare{0, 33}).resolve(UINT64_MAX), UINT64_MAX / 100 * 33 + UINT64_MAX % 100 * 33 / 100);
  EXPECT_EQ((config::PoolShare{0, 100}).resolve(4 * kGiB), UINT64_MAX);
  EXPECT_TRUE((config::PoolShare{0, 100}).unlimited());
  EXPECT_EQ((config::PoolShare{kGiB, 0}).resolve(4 * kGiB), kGiB);
  EXPECT_FALSE((config::PoolShare{kGiB, 0}).unlimited());
  auto p = config::parse("[models]\nmax_pool_bytes_per_uid = \"100%\"\n", "x.conf");
  ASSERT_TRUE(p) << p.error().message;
  EXPECT_EQ(p->models.max_pool_bytes_per_uid, (config::PoolShare{0, 100}));
  auto bytes = config::parse("[models]\nmax_pool_bytes_per_uid = 1048576\n", "x.conf");
  ASSERT_TRUE(bytes) << bytes.error().message;
  EXPECT_EQ(bytes->models.max_pool_bytes_per_uid, (config::PoolShare{kMiB, 0}));
}

TEST(Config, NewKeysRejectBadValues) {
  for (const auto& [text, want] : std::initializer_list<std::pair<const char*, const char*>>{
           {"[models]\nmax_pool_bytes_per_uid = \"0%\"\n", "'0%' is not a percentage from 1% to 100%"},
           {"[models]\nmax_pool_bytes_per_uid = \"101%\"\n", "'101%' is not a percentage"},
           {"[models]\nmax_pool_bytes_per_uid = \"x%\"\n", "'x%' is not a percentage"},
           {"[models]\nmax_pool_bytes_per_uid = 0\n", "0 would allow no model at all"},
           {"[models]\nmax_pool_bytes_per_uid = \"lots\"\n", "'lots' is not a size"},
           {"[models]\nmax_models_per_uid = -1\n", "[models] max_models_per_uid: -1 is out of range"},
           {"[models]\nkeep_alive = \"soon\"\n", "[models] keep_alive: 'soon' is not a duration"},
           {"[models]\ndrain_wait = \"0\"\n", "[models] drain_wait: must be at least 1s"},
           {"[models]\ndrain_wait = 9223372036854775807\n", "[models] drain_wait: 9223372036854775807 is longer than a year"},
           {"[models]\nkeep_alive = \"8761h\"\n", "[models] keep_alive: '8761h' is longer than a year"},
           {"[models]\npreload = \"/a.gguf\"\n", "[models] preload: expected an array of strings"},
       }) {
    auto c = config::parse(text, "x.conf");
    ASSERT_FALSE(c) << text;
    EXPECT_NE(c.error().message.find(want), std::string::npos) << c.error().message;
  }
  for (const auto& [text, want] : std::initializer_list<std::pair<const char*, const char*>>{
           {"[models]\npreload = [\"models/a.gguf\"]\n", "models.preload: 'models/a.gguf' is not an absolute path"},
           {"[models]\npreload = [\"\"]\n", "models.preload: '' is not an absolute path"},
           {"[models]\npreload = [\"/a.gguf\", \"/a.gguf\"]\n", "models.preload: '/a.gguf' is listed twice"},
           {"[daemon]\ntrusted_group = \"my group\"\n", "daemon.trusted_group = 'my group' is not a group name"},
           {"[daemon]\nstate_dir = \"var/lib/airs\"\n", "daemon.state_dir: 'var/lib/airs' is not an absolute path"},
       }) {
    auto c = config::parse(text, "x.conf");
    ASSERT_TRUE(c) << c.error().message;
    auto s = config::validate(*c);
    ASSERT_FALSE(s) << text;
    EXPECT_NE(s.error().message.find(want), std::string::npos) << s.error().message;
  }
}

TEST(Config, OnlyRegularFilesAreRead) {
  namespace fs = std::filesystem;
  auto dir = fs::temp_directory_path() / ("airs-conf-reg-" + std::to_string(::getpid()));
  fs::create_directories(dir / "sub");
  // A directory given as the file: an error naming it, not the defaults.
  auto d = config::load(dir.string(), "", false);
  ASSERT_FALSE(d);
  EXPECT_NE(d.error().message.find(dir.string() + " is a directory, not a regular file"), std::string::npos)
      << d.error().message;
  // Optional (the default path) but present as a directory: still an error.
  EXPECT_FALSE(config::load(dir.string(), "", true));
  // A device: an error at once, not a read that never ends.
  auto z = config::load("/dev/zero", "", false);
  ASSERT_FALSE(z);
  EXPECT_NE(z.error().message.find("/dev/zero is a character device"), std::string::npos) << z.error().message;
  // A FIFO: refused without blocking on the open.
  const auto fifo = dir / "fifo.conf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto f = config::load(fifo.string(), "", false);
  ASSERT_FALSE(f);
  EXPECT_NE(f.error().message.find("is a FIFO"), std::string::npos) << f.error().message;
  // Larger than the bound: refused, naming the size.
  const auto big = dir / "big.conf";
  {
    std::ofstream out(big);
    out << "# " << std::string(config::kMaxConfigFileBytes, 'x') << "\n";
  }
  auto b = config::load(big.string(), "", false);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("more than the 1 MiB"), std::string::npos) << b.error().message;
  // A directory among the drop-ins, and a drop-in "directory" that is a file.
  std::ofstream(dir / "main.conf") << "[kv]\ntokens_per_block = 8\n";
  fs::create_directories(dir / "conf.d" / "10-dir.conf");
  auto dd = config::load((dir / "main.conf").string(), (dir / "conf.d").string(), false);
  ASSERT_FALSE(dd);
  EXPECT_NE(dd.error().message.find("10-dir.conf is a directory"), std::string::npos) << dd.error().message;
  auto nd = config::load((dir / "main.conf").string(), (dir / "main.conf").string(), false);
  ASSERT_FALSE(nd);
  EXPECT_NE(nd.error().message.find("is not a directory"), std::string::npos) << nd.error().message;
  // An absent drop-in directory is fine (the default <config>.d).
  EXPECT_TRUE(config::load((dir / "main.conf").string(), (dir / "none.d").string(), false));
  fs::remove_all(dir);
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
  c.models.preload = {"/srv/a \"quoted\" \\ name.gguf"};
  c.models.max_pool_bytes_per_uid = {3 * kGiB, 0};
  c.models.keep_alive = std::chrono::seconds(90);
  c.models.drain_wait = std::chrono::seconds(40);
  c.pool.backend = config::Backend::Shmem;
  c.pool.numa_policy = config::NumaPolicy::Interleave;
  c.models.mode = config::ModeChoice::Cooperative;
  c.pressure.source = config::PressureSource::Psi;
  c.daemon.start_without_bus = config::NoBus::Fail;
  // Finer than a millisecond: printed in µs, not rounded to "150ms" or "0ms".
  c.pressure.some_threshold = std::chrono::microseconds(150500);
  c.pressure.full_threshold = std::chrono::microseconds(150);
  auto again = config::parse(config::to_toml(c), "roundtrip");
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(config::to_toml(*again), config::to_toml(c));
  EXPECT_EQ(again->pressure.some_threshold, std::chrono::microseconds(150500));
  EXPECT_EQ(again->pressure.full_threshold, std::chrono::microseconds(150));
  EXPECT_EQ(again->models.warmup_rate, 20 * kMiB);
  EXPECT_EQ(again->models.preload, c.models.preload);
  EXPECT_EQ(again->models.max_pool_bytes_per_uid, c.models.max_pool_bytes_per_uid);
  EXPECT_EQ(again->models.keep_alive, 90s);
  EXPECT_EQ(again->models.drain_wait, 40s);
  EXPECT_EQ(again->pool.backend, config::Backend::Shmem);
  EXPECT_EQ(again->models.mode, config::ModeChoice::Cooperative);
}

TEST(Config, ProfilesFollowTheSeedBudget) {
  EXPECT_EQ(config::profile_for_memory(1900 * kMiB).pool_bytes, 0u);
  EXPECT_EQ(config::profile_for_memory(3900 * kMiB).pool_bytes, 2 * kGiB);
  EXPECT_EQ(config::profile_for_memory(7800 * kMiB).pool_bytes, 4 * kGiB);
  EXPECT_EQ(config::profile_for_memory(7800 * kMiB).name, "8gb");
}
