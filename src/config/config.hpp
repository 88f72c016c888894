// SPDX-License-Identifier: Apache-2.0
// Daemon configuration: TOML (/etc/airs/airs-memd.conf plus drop-ins in
// /etc/airs/airs-memd.conf.d/*.conf, applied in name order, later keys win),
// parsed into plain structs, then validated. Unknown keys are errors so a
// typo never silently falls back to a default. Every key and its default is
// documented in config/airs-memd.conf.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.hpp"

namespace airs::config {

// The words of the keys that take one of a fixed set, parsed once by
// parse(); to_string gives the word back as the file spells it.
enum class ProfileChoice : uint8_t { Auto, Gb2, Gb4, Gb8, Custom };  // auto | 2gb | 4gb | 8gb | custom
enum class Backend : uint8_t { Auto, Hugetlbfs, Shmem };             // auto | hugetlbfs | shmem
// The pool's NUMA placement. Its own enum so config depends on util only;
// the daemon maps it onto sys::NumaPolicy (same three policies, same words).
enum class NumaPolicy : uint8_t { Local, Bind, Interleave };         // local | bind | interleave
enum class ModeChoice : uint8_t { Auto, Full, SmallPages, Cooperative };  // auto | full | small-pages | cooperative
enum class DirectIo : uint8_t { Auto, On, Off };                     // auto | on | off
enum class KvType : uint8_t { F16, Q8_0 };                           // f16 | q8_0
enum class PressureSource : uint8_t { Auto, Psi, Poll, Off };        // auto | psi | poll | off
enum class NoBus : uint8_t { Wait, Fail };                           // wait | fail

[[nodiscard]] const char* to_string(ProfileChoice v);
[[nodiscard]] const char* to_string(Backend v);
[[nodiscard]] const char* to_string(NumaPolicy v);
[[nodiscard]] const char* to_string(ModeChoice v);
[[nodiscard]] const char* to_string(DirectIo v);
[[nodiscard]] const char* to_string(KvType v);
[[nodiscard]] const char* to_string(PressureSource v);
[[nodiscard]] const char* to_string(NoBus v);

// The word back to the enum (exact spelling, as to_string gives it);
// nullopt for any other word. Defined for the eight enums above.
template <typename E>
[[nodiscard]] std::optional<E> parse_enum(std::string_view word);
// The accepted words of E, comma separated ("auto, hugetlbfs, shmem").
template <typename E>
[[nodiscard]] std::string accepted_words();

// models.max_pool_bytes_per_uid: a size, or a percentage of the pool.
// Exactly one of the two is non-zero after parse().
struct PoolShare {
  uint64_t bytes = 0;     // a fixed bound; 0 when `percent` is used
  uint32_t percent = 0;   // 1..100 of the pool; 0 when `bytes` is used
  // The bound in bytes for a pool of `pool_bytes`; UINT64_MAX for "100%"
  // (unlimited, whatever the pool grows or shrinks to).
  [[nodiscard]] uint64_t resolve(uint64_t pool_bytes) const;
  [[nodiscard]] bool unlimited() const { return percent == 100; }
  bool operator==(const PoolShare&) const = default;
};

struct DaemonConfig {
  std::string bus = "system";  // "system", "session", or a D-Bus address ("unix:path=...")
  // No bus at start: wait for one (reconnecting with backoff, as after
  // losing it), or fail at once naming the address.
  NoBus start_without_bus = NoBus::Wait;
  std::string log_level = "info";
  std::string metrics_file;    // Prometheus textfile; empty = off
  std::chrono::milliseconds metrics_interval{5000};
  std::string admin_group;     // members may call admin methods besides root; empty = root only
  std::string trusted_group;  // members (and root) may attach lazily (a writable region fd); empty = root only
  // What outlives the process (model content ids, spilled KV, recorded
  // access orders): an absolute directory, mode 0700; empty = keep nothing.
  std::string state_dir = "/var/lib/airs";
};

struct PoolConfig {
  ProfileChoice profile = ProfileChoice::Auto;
  std::optional<uint64_t> size;            // bytes; unset = from the profile; 0 only with profile 2gb
  uint64_t page_size = 0;                  // huge page size; 0 = the kernel's default
  Backend backend = Backend::Auto;
  std::string hugetlbfs_mount;             // empty = find a mount, else a hugetlb memfd
  // shmem backend: a tmpfs mounted huge= to make the files on (a unit
  // drop-in can mount one here); else a private mount, else memfds
  // (docs/shmem-huge-folios.md). Empty: no directory.
  std::string shmem_mount = "/run/airs/shm";
  bool grow_nr_hugepages = true;           // raise vm.nr_hugepages at start when short
  NumaPolicy numa_policy = NumaPolicy::Local;
  std::vector<int> numa_nodes;
};

struct ModelsConfig {
  ModeChoice mode = ModeChoice::Auto;
  uint32_t prefetch_window = 2;            // layers read ahead of the last faulted one
  uint32_t queue_depth = 16;
  uint32_t allocate_ahead = 32;            // units whose pages are allocated ahead of their reads
  uint64_t stream_expert_unit = 512 << 10; // unit of a streamed mixture of experts on shmem; 0 = the pool's page
  DirectIo direct_io = DirectIo::Auto;
  uint64_t warmup_rate = 0;                // background fill, bytes per second; 0 = unlimited
  std::vector<std::string> pinned;         // model names never evicted
  uint32_t max_models_per_uid = 8;         // models a non-admin uid may have loaded at once; 0 = unlimited
  PoolShare max_pool_bytes_per_uid{0, 50}; // pool bytes of the models a non-admin uid loaded
  std::chrono::seconds keep_alive{0};      // unload an unreferenced model idle this long; 0 = never
  std::chrono::seconds header_timeout{30}; // a GGUF header read still running this long is answered as stalled
  std::chrono::seconds drain_wait{5};      // a load waits this long for pages whose reads are still in flight
  std::vector<std::string> preload;        // absolute GGUF paths loaded at start
};

struct KvConfig {
  uint32_t tokens_per_block = 16;
  KvType kv_type = KvType::F16;
  std::chrono::seconds idle_threshold{300};
  uint32_t max_sessions_per_uid = 64;
  uint64_t max_blocks_per_uid = 0;         // 0 = bounded by the pool only
  PoolShare max_pool_bytes_per_uid{0, 50}; // committed KV chunk bytes of a non-admin uid's arenas
  uint32_t max_fds_per_uid = 256;
  uint64_t max_arena_bytes = 0;            // per (model, uid) arena; 0 = pool size
  uint64_t spill_limit = 1ull << 30;       // the KV spill tier in <daemon.state_dir>/kv; 0 = off
  std::chrono::seconds spill_stop_timeout{5};  // a clean stop spills what is cached, for at most this long
};

struct PressureConfig {
  PressureSource source = PressureSource::Auto;
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

// Largest configuration file read (a bound, so a device or a runaway file is
// an error instead of a hang).
inline constexpr uint64_t kMaxConfigFileBytes = 1ull << 20;

// Reads `path` (missing is fine when `optional_main`), then every *.conf in
// `dropin_dir` in name order, then validates. Only regular files of at most
// kMaxConfigFileBytes are read (symlinks followed): a directory, a device, a
// FIFO or a larger file is an error naming the path. `dropin_dir` may be
// absent; present, it must be a directory.
[[nodiscard]] Result<Config> load(const std::string& path, const std::string& dropin_dir, bool optional_main);

// Cross-field checks; the message names the key and the accepted values.
// Machine-independent: see check_machine for what depends on the host.
[[nodiscard]] Status validate(const Config& c);

// What the host offers, gathered by the caller (airs-memd reads
// /proc/meminfo and sysfs), so the check itself is pure.
struct MachineFacts {
  uint64_t mem_total = 0;               // MemTotal in bytes; 0 = unknown (pool size not checked)
  std::vector<int> nodes_with_memory;   // ascending; empty = unknown (numa_nodes not checked)
  // Whether a model file can be loaded: an error naming the path and what is
  // wrong (missing, not a regular file). Empty = not checked.
  std::function<Status(const std::string& path)> check_file;
};

// Least memory the pool must leave to the rest of the system.
inline constexpr uint64_t kMinMemoryLeft = 512ull << 20;

// Checks `c` against the host: every pool.numa_nodes entry is a node with
// memory; the effective pool size (effective_profile) is at most MemTotal
// and leaves at least kMinMemoryLeft; every models.preload file passes
// `check_file`. Errors: EINVAL naming the key and both numbers / the node
// lists / the path.
[[nodiscard]] Status check_machine(const Config& c, const MachineFacts& m);

// The effective configuration as TOML (for --check-config).
[[nodiscard]] std::string to_toml(const Config& c);

// Device profile from MemTotal, following the design's budget: about 2 GB → no
// local pool (cloud only), about 4 GB → 2 GiB pool, 8 GB and more → 4 GiB.
struct Profile {
  std::string name;
  uint64_t pool_bytes = 0;
};
[[nodiscard]] Profile profile_for_memory(uint64_t mem_total_bytes);
[[nodiscard]] std::optional<Profile> profile_by_name(std::string_view name);
// The profile the daemon runs with: pool.profile (auto = from
// `mem_total_bytes`; custom is named "custom"), its pool size replaced by
// pool.size when set.
[[nodiscard]] Profile effective_profile(const PoolConfig& pool, uint64_t mem_total_bytes);

}  // namespace airs::config
