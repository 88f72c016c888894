// Daemon configuration: TOML (/etc/airs/airs-memd.conf plus drop-ins in
// /etc/airs/airs-memd.conf.d/*.conf, applied in name order, later keys win),
// parsed into plain structs, then validated. Unknown keys are errors so a
// typo never silently falls back to a default. Every key and its default is
// documented in config/airs-memd.conf.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.hpp"

namespace airs::config {

struct DaemonConfig {
  std::string bus = "system";  // "system", "session", or a D-Bus address ("unix:path=...")
  std::string log_level = "info";
  std::string metrics_file;    // Prometheus textfile; empty = off
  std::chrono::milliseconds metrics_interval{5000};
  std::string admin_group;     // members may call admin methods besides root; empty = root only
};

struct PoolConfig {
  std::string profile = "auto";            // auto | 2gb | 4gb | 8gb | custom
  std::optional<uint64_t> size;            // bytes; unset = from the profile
  uint64_t page_size = 0;                  // huge page size; 0 = the kernel's default
  std::string backend = "auto";            // auto | hugetlbfs | shmem
  std::string hugetlbfs_mount;             // empty = find a mount, else a hugetlb memfd
  bool grow_nr_hugepages = true;           // raise vm.nr_hugepages at start when short
  std::string numa_policy = "local";       // local | bind | interleave
  std::vector<int> numa_nodes;
};

struct ModelsConfig {
  std::string mode = "auto";               // auto | full | small-pages | cooperative
  uint32_t prefetch_window = 2;            // layers read ahead of the last faulted one
  uint32_t queue_depth = 16;
  uint32_t allocate_ahead = 8;             // units whose pages are allocated ahead of their reads
  std::string direct_io = "auto";          // auto | on | off
  uint64_t warmup_rate = 0;                // background fill, bytes per second; 0 = unlimited
  std::vector<std::string> pinned;         // model names never evicted
};

struct KvConfig {
  uint32_t tokens_per_block = 16;
  std::string kv_type = "f16";             // f16 | q8_0
  std::chrono::seconds idle_threshold{300};
  uint32_t max_sessions_per_uid = 64;
  uint64_t max_blocks_per_uid = 0;         // 0 = bounded by the pool only
  uint32_t max_fds_per_uid = 256;
  uint64_t max_arena_bytes = 0;            // per (model, uid) arena; 0 = pool size
};

struct PressureConfig {
  std::string source = "auto";             // auto | psi | poll
  std::chrono::microseconds some_threshold{150000};
  std::chrono::microseconds some_window{2000000};
  std::chrono::microseconds full_threshold{100000};
  std::chrono::microseconds full_window{2000000};
  std::chrono::milliseconds poll_interval{500};
  uint64_t mem_available_low = 0;          // poll fallback without PSI: bytes; 0 = 10 % of MemTotal
  uint64_t target_some_bytes = 64ull << 20;
  uint64_t target_full_bytes = 256ull << 20;
  std::chrono::milliseconds min_eviction_interval{1000};
  std::chrono::seconds grow_after{60};
  bool resize_pool = true;                 // give freed huge pages back to the kernel
};

struct Config {
  DaemonConfig daemon;
  PoolConfig pool;
  ModelsConfig models;
  KvConfig kv;
  PressureConfig pressure;
  std::vector<std::string> sources;        // files read, in order
};

// Parses one TOML document over `base` (keys present override). `origin`
// names the file in errors ("/etc/airs/airs-memd.conf: [pool] size: ...").
[[nodiscard]] Result<Config> parse(std::string_view text, std::string_view origin, Config base = {});

// Reads `path` (missing is fine when `optional_main`), then every *.conf in
// `dropin_dir` in name order, then validates.
[[nodiscard]] Result<Config> load(const std::string& path, const std::string& dropin_dir, bool optional_main);

// Cross-field checks; the message names the key and the accepted values.
[[nodiscard]] Status validate(const Config& c);

// The effective configuration as TOML (for --check-config).
[[nodiscard]] std::string to_toml(const Config& c);

// Device profile from MemTotal, following the seed's budget: about 2 GB → no
// local pool (cloud only), about 4 GB → 2 GiB pool, 8 GB and more → 4 GiB.
struct Profile {
  std::string name;
  uint64_t pool_bytes = 0;
};
[[nodiscard]] Profile profile_for_memory(uint64_t mem_total_bytes);
[[nodiscard]] std::optional<Profile> profile_by_name(std::string_view name);

}  // namespace airs::config
