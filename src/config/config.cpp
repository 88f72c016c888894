// SPDX-License-Identifier: Apache-2.0
#include "config/config.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <span>
#include <type_traits>
#include <utility>

#include <toml++/toml.h>

#include "sys/files.hpp"
#include "util/units.hpp"

namespace airs::config {
namespace {

template <typename E>
using WordTable = std::span<const std::pair<E, const char*>>;

template <typename E>
WordTable<E> words();

#define AIRS_CONFIG_WORDS(E, ...)                                            \
  template <>                                                                \
  WordTable<E> words<E>() {                                                  \
    static constexpr std::pair<E, const char*> kWords[] = {__VA_ARGS__};     \
    return kWords;                                                           \
  }
AIRS_CONFIG_WORDS(ProfileChoice, {ProfileChoice::Auto, "auto"}, {ProfileChoice::Gb2, "2gb"},
                  {ProfileChoice::Gb4, "4gb"}, {ProfileChoice::Gb8, "8gb"}, {ProfileChoice::Custom, "custom"})
AIRS_CONFIG_WORDS(Backend, {Backend::Auto, "auto"}, {Backend::Hugetlbfs, "hugetlbfs"}, {Backend::Shmem, "shmem"})
AIRS_CONFIG_WORDS(NumaPolicy, {NumaPolicy::Local, "local"}, {NumaPolicy::Bind, "bind"},
                  {NumaPolicy::Interleave, "interleave"})
AIRS_CONFIG_WORDS(ModeChoice, {ModeChoice::Auto, "auto"}, {ModeChoice::Full, "full"},
                  {ModeChoice::SmallPages, "small-pages"}, {ModeChoice::Cooperative, "cooperative"})
AIRS_CONFIG_WORDS(DirectIo, {DirectIo::Auto, "auto"}, {DirectIo::On, "on"}, {DirectIo::Off, "off"})
AIRS_CONFIG_WORDS(KvType, {KvType::F16, "f16"}, {KvType::Q8_0, "q8_0"})
AIRS_CONFIG_WORDS(PressureSource, {PressureSource::Auto, "auto"}, {PressureSource::Psi, "psi"},
                  {PressureSource::Poll, "poll"}, {PressureSource::Off, "off"})
AIRS_CONFIG_WORDS(NoBus, {NoBus::Wait, "wait"}, {NoBus::Fail, "fail"})
#undef AIRS_CONFIG_WORDS

template <typename E>
const char* word_of(E v) {
  for (const auto& [e, w] : words<E>())
    if (e == v) return w;
  return "?";
}

}  // namespace

const char* to_string(ProfileChoice v) { return word_of(v); }
const char* to_string(Backend v) { return word_of(v); }
const char* to_string(NumaPolicy v) { return word_of(v); }
const char* to_string(ModeChoice v) { return word_of(v); }
const char* to_string(DirectIo v) { return word_of(v); }
const char* to_string(KvType v) { return word_of(v); }
const char* to_string(PressureSource v) { return word_of(v); }
const char* to_string(NoBus v) { return word_of(v); }

template <typename E>
std::optional<E> parse_enum(std::string_view word) {
  for (const auto& [e, w] : words<E>())
    if (word == w) return e;
  return std::nullopt;
}

template <typename E>
std::string accepted_words() {
  std::string list;
  for (const auto& [e, w] : words<E>()) list += (list.empty() ? "" : ", ") + std::string(w);
  return list;
}

#define AIRS_CONFIG_INSTANTIATE(E)                                  \
  template std::optional<E> parse_enum<E>(std::string_view word); \
  template std::string accepted_words<E>();
AIRS_CONFIG_INSTANTIATE(ProfileChoice)
AIRS_CONFIG_INSTANTIATE(Backend)
AIRS_CONFIG_INSTANTIATE(NumaPolicy)
AIRS_CONFIG_INSTANTIATE(ModeChoice)
AIRS_CONFIG_INSTANTIATE(DirectIo)
AIRS_CONFIG_INSTANTIATE(KvType)
AIRS_CONFIG_INSTANTIATE(PressureSource)
AIRS_CONFIG_INSTANTIATE(NoBus)
#undef AIRS_CONFIG_INSTANTIATE

uint64_t PoolShare::resolve(uint64_t pool_bytes) const {
  if (percent == 0) return bytes;
  if (percent >= 100) return UINT64_MAX;
  // pool_bytes * percent / 100 without overflowing.
  return pool_bytes / 100 * percent + pool_bytes % 100 * percent / 100;
}

namespace {

// Reads the keys of one [section], remembering which were consumed so the
// leftovers can be reported as unknown.
class Section {
 public:
  Section(const toml::table* t, std::string name, std::string_view origin)
      : t_(t), name_(std::move(name)), origin_(origin) {}

  Status get(std::string_view key, std::string& out) {
    auto n = node(key);
    if (!n) return {};
    if (auto v = n->value<std::string>()) {
      out = *v;
      return {};
    }
    return bad(key, "expected a string");
  }
  Status get(std::string_view key, bool& out) {
    auto n = node(key);
    if (!n) return {};
    if (auto v = n->value<bool>()) {
      out = *v;
      return {};
    }
    return bad(key, "expected true or false");
  }
  template <typename E>
    requires std::is_enum_v<E>
  Status get(std::string_view key, E& out) {
    auto n = node(key);
    if (!n) return {};
    auto v = n->value<std::string>();
    if (!v) return bad(key, fmt::format("expected a string, one of: {}", accepted_words<E>()));
    auto e = parse_enum<E>(*v);
    if (!e) return bad(key, fmt::format("'{}' is not one of: {}", *v, accepted_words<E>()));
    out = *e;
    return {};
  }
  // A size, or a percentage of the pool ("50%", 1 to 100).
  Status get_share(std::string_view key, PoolShare& out) {
    auto n = node(key);
    if (!n) return {};
    if (auto s = n->value<std::string>(); s && !s->empty() && s->back() == '%') {
      const std::string_view num = std::string_view(*s).substr(0, s->size() - 1);
      uint32_t p = 0;
      bool ok = !num.empty() && num.size() <= 3;
      for (char ch : num) {
        if (ch < '0' || ch > '9') ok = false;
        else p = p * 10 + static_cast<uint32_t>(ch - '0');
      }
      if (!ok || p < 1 || p > 100)
        return bad(key, fmt::format("'{}' is not a percentage from 1% to 100% (\"100%\" = unlimited)", *s));
      out = PoolShare{0, p};
      return {};
    }
    uint64_t b = 0;
    AIRS_TRY(get_bytes(key, b));
    if (b == 0) return bad(key, "0 would allow no model at all (use \"100%\" for unlimited)");
    out = PoolShare{b, 0};
    return {};
  }
  template <typename Int>
  Status get_int(std::string_view key, Int& out, int64_t min, int64_t max) {
    auto n = node(key);
    if (!n) return {};
    auto v = n->value<int64_t>();
    if (!v) return bad(key, "expected an integer");
    if (*v < min || *v > max) return bad(key, fmt::format("{} is out of range [{}, {}]", *v, min, max));
    out = static_cast<Int>(*v);
    return {};
  }
  // Sizes: an integer (bytes) or a string with a binary unit ("512M", "2 GiB").
  Status get_bytes(std::string_view key, uint64_t& out) {
    auto n = node(key);
    if (!n) return {};
    if (auto i = n->value<int64_t>()) {
      if (*i < 0) return bad(key, "a size cannot be negative");
      out = static_cast<uint64_t>(*i);
      return {};
    }
    if (auto s = n->value<std::string>()) {
      if (auto b = parse_bytes(*s)) {
        out = *b;
        return {};
      }
      return bad(key, fmt::format("'{}' is not a size (use e.g. 512M, 2G, 1048576)", *s));
    }
    return bad(key, "expected a size such as \"512M\" or a byte count");
  }
  Status get_optional_bytes(std::string_view key, std::optional<uint64_t>& out) {
    auto n = node(key);
    if (!n) return {};
    if (auto s = n->value<std::string>(); s && *s == "auto") {
      out.reset();
      return {};
    }
    uint64_t v = 0;
    AIRS_TRY(get_bytes(key, v));
    out = v;
    return {};
  }
  // Durations: a string with a unit ("150ms", "2s", "5m", "300us") or an
  // integer number of the natural unit of the key.
  template <typename Dur>
  // At most a year: every duration here ends up added to a clock's time in
  // nanoseconds, where a larger one overflows (a limit that fires at once,
  // or never).
  Status get_duration(std::string_view key, Dur& out) {
    constexpr std::chrono::hours kLongest{24 * 365};
    auto n = node(key);
    if (!n) return {};
    if (auto i = n->value<int64_t>()) {
      if (*i < 0) return bad(key, "a duration cannot be negative");
      if (Dur(*i) > kLongest) return bad(key, fmt::format("{} is longer than a year", *i));
      out = Dur(*i);
      return {};
    }
    auto s = n->value<std::string>();
    if (!s) return bad(key, "expected a duration such as \"2s\" or \"150ms\"");
    auto d = parse_duration(*s);
    if (!d) return bad(key, fmt::format("'{}' is not a duration (use us, ms, s, m, h)", *s));
    if (*d > kLongest) return bad(key, fmt::format("'{}' is longer than a year", *s));
    out = std::chrono::duration_cast<Dur>(*d);
    if (std::chrono::duration_cast<std::chrono::microseconds>(out) != *d)
      return bad(key, fmt::format("'{}' is finer than this key's unit", *s));
    return {};
  }
  Status get(std::string_view key, std::vector<std::string>& out) {
    auto n = node(key);
    if (!n) return {};
    auto* arr = n->as_array();
    if (arr == nullptr) return bad(key, "expected an array of strings");
    out.clear();
    for (auto& e : *arr) {
      auto v = e.value<std::string>();
      if (!v) return bad(key, "expected an array of strings");
      out.push_back(*v);
    }
    return {};
  }
  Status get(std::string_view key, std::vector<int>& out) {
    auto n = node(key);
    if (!n) return {};
    auto* arr = n->as_array();
    if (arr == nullptr) return bad(key, "expected an array of integers");
    out.clear();
    for (auto& e : *arr) {
      auto v = e.value<int64_t>();
      if (!v || *v < 0 || *v > 4096) return bad(key, "expected an array of node numbers");
      out.push_back(static_cast<int>(*v));
    }
    return {};
  }
  Status finish() const {
    if (t_ == nullptr) return {};
    for (auto&& [k, v] : *t_) {
      if (!used_.contains(std::string(k.str())))
        return make_error(EINVAL, "{}: [{}] unknown key '{}' (see config/airs-memd.conf for the keys)", origin_, name_,
                          k.str());
    }
    return {};
  }

  static std::optional<std::chrono::microseconds> parse_duration(std::string_view s) {
    if (s == "0") return std::chrono::microseconds(0);  // zero needs no unit
    uint64_t n = 0;
    size_t i = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (n > UINT64_MAX / 10) return std::nullopt;
      n = n * 10 + static_cast<uint64_t>(s[i] - '0');
      ++i;
    }
    if (i == 0) return std::nullopt;
    while (i < s.size() && s[i] == ' ') ++i;
    auto unit = s.substr(i);
    uint64_t mul = 0;
    if (unit == "us") mul = 1;
    else if (unit == "ms") mul = 1000;
    else if (unit == "s") mul = 1000000;
    else if (unit == "m" || unit == "min") mul = 60000000;
    else if (unit == "h") mul = 3600000000;
    else return std::nullopt;
    if (n > static_cast<uint64_t>(INT64_MAX) / mul) return std::nullopt;
    return std::chrono::microseconds(static_cast<int64_t>(n * mul));
  }

 private:
  const toml::node* node(std::string_view key) {
    if (t_ == nullptr) return nullptr;
    used_.insert(std::string(key));
    return t_->get(key);
  }
  Status bad(std::string_view key, std::string_view what) const {
    return make_error(EINVAL, "{}: [{}] {}: {}", origin_, name_, key, what);
  }

  const toml::table* t_;
  std::string name_;
  std::string_view origin_;
  std::set<std::string> used_;
};

}  // namespace

Result<Config> parse(std::string_view text, std::string_view origin, Config c) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return make_error(EINVAL, "{}:{}:{}: {}", origin, e.source().begin.line, e.source().begin.column, e.description());
  }
  static const std::set<std::string> kSections = {"daemon", "pool", "models", "kv", "pressure"};
  for (auto&& [k, v] : root) {
    if (!kSections.contains(std::string(k.str())))
      return make_error(EINVAL, "{}: unknown section or key '{}' (sections: daemon, pool, models, kv, pressure)", origin,
                        k.str());
    if (!v.is_table()) return make_error(EINVAL, "{}: '{}' must be a [section]", origin, k.str());
  }
  {
    Section s(root["daemon"].as_table(), "daemon", origin);
    AIRS_TRY(s.get("bus", c.daemon.bus));
    AIRS_TRY(s.get("start_without_bus", c.daemon.start_without_bus));
    AIRS_TRY(s.get("log_level", c.daemon.log_level));
    AIRS_TRY(s.get("metrics_file", c.daemon.metrics_file));
    AIRS_TRY(s.get_duration("metrics_interval", c.daemon.metrics_interval));
    AIRS_TRY(s.get("admin_group", c.daemon.admin_group));
    AIRS_TRY(s.get("trusted_group", c.daemon.trusted_group));
    AIRS_TRY(s.get("state_dir", c.daemon.state_dir));
    AIRS_TRY(s.finish());
  }
  {
    Section s(root["pool"].as_table(), "pool", origin);
    AIRS_TRY(s.get("profile", c.pool.profile));
    AIRS_TRY(s.get_optional_bytes("size", c.pool.size));
    AIRS_TRY(s.get_bytes("page_size", c.pool.page_size));
    AIRS_TRY(s.get("backend", c.pool.backend));
    AIRS_TRY(s.get("hugetlbfs_mount", c.pool.hugetlbfs_mount));
    AIRS_TRY(s.get("shmem_mount", c.pool.shmem_mount));
    AIRS_TRY(s.get("grow_nr_hugepages", c.pool.grow_nr_hugepages));
    AIRS_TRY(s.get("numa_policy", c.pool.numa_policy));
    AIRS_TRY(s.get("numa_nodes", c.pool.numa_nodes));
    AIRS_TRY(s.finish());
  }
  {
    Section s(root["models"].as_table(), "models", origin);
    AIRS_TRY(s.get("mode", c.models.mode));
    AIRS_TRY(s.get_int("prefetch_window", c.models.prefetch_window, 0, 1024));
    AIRS_TRY(s.get_int("queue_depth", c.models.queue_depth, 1, 1024));
    AIRS_TRY(s.get_int("allocate_ahead", c.models.allocate_ahead, 0, 1024));
    AIRS_TRY(s.get_bytes("stream_expert_unit", c.models.stream_expert_unit));
    AIRS_TRY(s.get("direct_io", c.models.direct_io));
    AIRS_TRY(s.get_bytes("warmup_rate", c.models.warmup_rate));
    AIRS_TRY(s.get("pinned", c.models.pinned));
    AIRS_TRY(s.get_int("max_models_per_uid", c.models.max_models_per_uid, 0, 1 << 20));
    AIRS_TRY(s.get_share("max_pool_bytes_per_uid", c.models.max_pool_bytes_per_uid));
    AIRS_TRY(s.get_duration("keep_alive", c.models.keep_alive));
    AIRS_TRY(s.get_duration("header_timeout", c.models.header_timeout));
    if (c.models.header_timeout.count() == 0)
      return make_error(EINVAL, "{}: [models] header_timeout: must be at least 1s (a header read gets that long)", origin);
    AIRS_TRY(s.get_duration("drain_wait", c.models.drain_wait));
    if (c.models.drain_wait.count() == 0)
      return make_error(EINVAL, "{}: [models] drain_wait: must be at least 1s (a load waits that long for its pages)",
                        origin);
    AIRS_TRY(s.get("preload", c.models.preload));
    AIRS_TRY(s.finish());
  }
  {
    Section s(root["kv"].as_table(), "kv", origin);
    AIRS_TRY(s.get_int("tokens_per_block", c.kv.tokens_per_block, 1, 65536));
    AIRS_TRY(s.get("kv_type", c.kv.kv_type));
    AIRS_TRY(s.get_duration("idle_threshold", c.kv.idle_threshold));
    AIRS_TRY(s.get_int("max_sessions_per_uid", c.kv.max_sessions_per_uid, 1, 1 << 20));
    AIRS_TRY(s.get_int("max_blocks_per_uid", c.kv.max_blocks_per_uid, 0, INT64_MAX));
    AIRS_TRY(s.get_share("max_pool_bytes_per_uid", c.kv.max_pool_bytes_per_uid));
    AIRS_TRY(s.get_int("max_fds_per_uid", c.kv.max_fds_per_uid, 4, 1 << 20));
    AIRS_TRY(s.get_bytes("max_arena_bytes", c.kv.max_arena_bytes));
    AIRS_TRY(s.get_bytes("spill_limit", c.kv.spill_limit));
    AIRS_TRY(s.get_duration("spill_stop_timeout", c.kv.spill_stop_timeout));
    AIRS_TRY(s.finish());
  }
  {
    Section s(root["pressure"].as_table(), "pressure", origin);
    AIRS_TRY(s.get("source", c.pressure.source));
    AIRS_TRY(s.get_duration("some_threshold", c.pressure.some_threshold));
    AIRS_TRY(s.get_duration("some_window", c.pressure.some_window));
    AIRS_TRY(s.get_duration("full_threshold", c.pressure.full_threshold));
    AIRS_TRY(s.get_duration("full_window", c.pressure.full_window));
    AIRS_TRY(s.get_duration("poll_interval", c.pressure.poll_interval));
    AIRS_TRY(s.get_bytes("mem_available_low", c.pressure.mem_available_low));
    AIRS_TRY(s.get_bytes("target_some_bytes", c.pressure.target_some_bytes));
    AIRS_TRY(s.get_bytes("target_full_bytes", c.pressure.target_full_bytes));
    AIRS_TRY(s.get_duration("min_eviction_interval", c.pressure.min_eviction_interval));
    AIRS_TRY(s.get_duration("grow_after", c.pressure.grow_after));
    AIRS_TRY(s.get("resize_pool", c.pressure.resize_pool));
    AIRS_TRY(s.finish());
  }
  c.sources.emplace_back(origin);
  return c;
}

namespace {
Status one_of(std::string_view key, const std::string& v, std::initializer_list<std::string_view> allowed) {
  for (auto a : allowed)
    if (v == a) return {};
  std::string list;
  for (auto a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  return make_error(EINVAL, "{} = '{}' is not one of: {}", key, v, list);
}

// A group name as getgrnam(3) could know it: no spaces, colons or control
// characters (useradd's rules are stricter; this only catches typos that
// can never name a group).
bool plausible_group(const std::string& g) {
  if (g.size() > 32) return false;
  for (char c : g) {
    const auto ch = static_cast<unsigned char>(c);
    if (ch <= ' ' || ch == ':' || ch == ',' || ch == 0x7f) return false;
  }
  return true;
}
}  // namespace

Status validate(const Config& c) {
  AIRS_TRY(one_of("daemon.log_level", c.daemon.log_level, {"trace", "debug", "info", "warning", "error"}));
  if (c.daemon.bus.empty()) return make_error(EINVAL, "daemon.bus is empty (use \"system\" or a D-Bus address)");
  if (c.daemon.metrics_interval < std::chrono::milliseconds(100))
    return make_error(EINVAL, "daemon.metrics_interval must be at least 100ms");
  for (auto [key, g] : {std::pair{"daemon.admin_group", &c.daemon.admin_group},
                        std::pair{"daemon.trusted_group", &c.daemon.trusted_group}})
    if (!plausible_group(*g))
      return make_error(EINVAL, "{} = '{}' is not a group name (empty = root only)", key, *g);
  if (!c.daemon.state_dir.empty() && c.daemon.state_dir.front() != '/')
    return make_error(EINVAL, "daemon.state_dir: '{}' is not an absolute path (empty = keep nothing)",
                      c.daemon.state_dir);
  if (c.pool.profile == ProfileChoice::Custom && !c.pool.size)
    return make_error(EINVAL, "pool.profile = \"custom\" needs pool.size");
  if (c.pool.size && *c.pool.size == 0 && c.pool.profile != ProfileChoice::Gb2)
    return make_error(EINVAL,
                      "pool.size = 0: use profile = \"2gb\" for cloud-only (no local pool), or give a pool size");
  if (c.pool.page_size != 0 && !is_pow2(c.pool.page_size))
    return make_error(EINVAL, "pool.page_size = {} is not a power of two", c.pool.page_size);
  if (c.models.stream_expert_unit != 0 && (!is_pow2(c.models.stream_expert_unit) || c.models.stream_expert_unit < 4096))
    return make_error(EINVAL, "models.stream_expert_unit = {} is not 0 or a power of two of at least 4K",
                      c.models.stream_expert_unit);
  if (c.pool.numa_policy == NumaPolicy::Bind && c.pool.numa_nodes.empty())
    return make_error(EINVAL, "pool.numa_policy = \"bind\" needs pool.numa_nodes");
  for (const auto& [share, key] : {std::pair{&c.models.max_pool_bytes_per_uid, "models.max_pool_bytes_per_uid"},
                                   std::pair{&c.kv.max_pool_bytes_per_uid, "kv.max_pool_bytes_per_uid"}})
    if (share->percent > 100 || (share->percent == 0) == (share->bytes == 0))
      return make_error(EINVAL, "{} must be a size or a percentage from 1% to 100%", key);
  {
    std::set<std::string> seen;
    for (const auto& p : c.models.preload) {
      if (p.empty() || p.front() != '/')
        return make_error(EINVAL, "models.preload: '{}' is not an absolute path (give the GGUF file's full path)", p);
      if (!seen.insert(p).second) return make_error(EINVAL, "models.preload: '{}' is listed twice", p);
    }
  }
  for (auto [name, thr, win] : {std::tuple{"some", c.pressure.some_threshold, c.pressure.some_window},
                                std::tuple{"full", c.pressure.full_threshold, c.pressure.full_window}}) {
    if (win < std::chrono::milliseconds(500) || win > std::chrono::seconds(10))
      return make_error(EINVAL, "pressure.{}_window must be between 500ms and 10s (the kernel's PSI limits)", name);
    if (thr <= std::chrono::microseconds(0) || thr > win)
      return make_error(EINVAL, "pressure.{}_threshold must be positive and at most the window", name);
  }
  if (c.pressure.poll_interval < std::chrono::milliseconds(50))
    return make_error(EINVAL, "pressure.poll_interval must be at least 50ms (PSI totals are wrong when sampled faster)");
  return {};
}

Status check_machine(const Config& c, const MachineFacts& m) {
  if (!c.pool.numa_nodes.empty() && !m.nodes_with_memory.empty()) {
    std::string have;
    for (size_t i = 0; i < m.nodes_with_memory.size(); ++i)
      have += fmt::format("{}{}", i ? ", " : "", m.nodes_with_memory[i]);
    for (int n : c.pool.numa_nodes)
      if (std::find(m.nodes_with_memory.begin(), m.nodes_with_memory.end(), n) == m.nodes_with_memory.end())
        return make_error(EINVAL, "pool.numa_nodes: node {} has no memory on this machine (nodes with memory: {})", n,
                          have);
  }
  if (m.mem_total != 0) {
    const auto prof = effective_profile(c.pool, m.mem_total);
    if (prof.pool_bytes > m.mem_total)
      return make_error(EINVAL, "pool size {} ({} bytes) is larger than MemTotal {} ({} bytes); set pool.size lower",
                        format_bytes(prof.pool_bytes), prof.pool_bytes, format_bytes(m.mem_total), m.mem_total);
    if (prof.pool_bytes > 0 && m.mem_total - prof.pool_bytes < kMinMemoryLeft)
      return make_error(EINVAL,
                        "pool size {} ({} bytes) leaves only {} of MemTotal {} ({} bytes) to the system; at least {} "
                        "must stay: set pool.size lower",
                        format_bytes(prof.pool_bytes), prof.pool_bytes, format_bytes(m.mem_total - prof.pool_bytes),
                        format_bytes(m.mem_total), m.mem_total, format_bytes(kMinMemoryLeft));
  }
  if (m.check_file)
    for (const auto& p : c.models.preload)
      if (auto st = m.check_file(p); !st)
        return make_error(st.error().code, "models.preload: {}", st.error().message);
  return {};
}

namespace {
// Reads a configuration file: regular files only, at most
// kMaxConfigFileBytes. O_NONBLOCK so a FIFO cannot block the open; the
// checks run on the opened file, so nothing changes between check and read.
Result<std::string> read_config_file(const std::string& path) {
  auto opened = sys::open_file(path, O_RDONLY | O_NOCTTY | O_NONBLOCK);
  if (!opened) return make_error(opened.error().code, "cannot read {}: {}", path, std::strerror(opened.error().code));
  const sys::UniqueFd fd = std::move(opened).value();
  const auto stated = sys::stat_of(fd.get(), path);
  if (!stated) return make_error(stated.error().code, "cannot stat {}: {}", path, std::strerror(stated.error().code));
  const struct stat& st = *stated;
  if (!S_ISREG(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return make_error(EINVAL, "configuration {} is {}, not a regular file", path, what);
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxConfigFileBytes)
    return make_error(EFBIG, "configuration {} is {} bytes, more than the {} a configuration file may have", path,
                      st.st_size, format_bytes(kMaxConfigFileBytes));
  std::string text;
  char buf[65536];
  for (;;) {
    const auto n = sys::read_at(fd.get(), buf, sizeof buf, text.size());
    if (!n) return make_error(n.error().code, "cannot read {}: {}", path, std::strerror(n.error().code));
    if (*n == 0) break;
    text.append(buf, *n);
    if (text.size() > kMaxConfigFileBytes)  // grew while being read
      return make_error(EFBIG, "configuration {} is more than {}", path, format_bytes(kMaxConfigFileBytes));
  }
  return text;
}
}  // namespace

Result<Config> load(const std::string& path, const std::string& dropin_dir, bool optional_main) {
  namespace fs = std::filesystem;
  Config c;
  std::error_code ec;
  // symlink_status too: a dangling symlink is not "absent", it is an error.
  if (fs::exists(path, ec) || fs::is_symlink(fs::symlink_status(path, ec))) {
    auto text = read_config_file(path);
    if (!text) return std::move(text).error();
    auto r = parse(*text, path, std::move(c));
    if (!r) return std::move(r).error();
    c = std::move(r).value();
  } else if (!optional_main) {
    return make_error(ENOENT, "config file {} does not exist", path);
  }
  if (!dropin_dir.empty() && fs::exists(dropin_dir, ec)) {
    if (!fs::is_directory(dropin_dir, ec))
      return make_error(ENOTDIR, "drop-in directory {} is not a directory", dropin_dir);
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(dropin_dir, ec))
      if (e.path().extension() == ".conf") files.push_back(e.path());
    if (ec) return make_error(ec.value(), "cannot list drop-in directory {}: {}", dropin_dir, ec.message());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      auto text = read_config_file(f.string());
      if (!text) return std::move(text).error();
      auto r = parse(*text, f.string(), std::move(c));
      if (!r) return std::move(r).error();
      c = std::move(r).value();
    }
  }
  AIRS_TRY(validate(c));
  return c;
}

std::string to_toml(const Config& c) {
  // The coarsest unit that is exact, so the output reads back to the same value.
  auto us = [](auto d) {
    const auto u = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
    if (u == 0) return std::string("\"0\"");
    return u % 1000 == 0 ? fmt::format("\"{}ms\"", u / 1000) : fmt::format("\"{}us\"", u);
  };
  auto secs = [](std::chrono::seconds d) {
    return d.count() == 0 ? std::string("\"0\"") : fmt::format("\"{}s\"", d.count());
  };
  auto share = [](const PoolShare& p) {
    return p.percent != 0 ? fmt::format("\"{}%\"", p.percent) : fmt::format("{}", p.bytes);
  };
  // A TOML basic string (paths may hold quotes or backslashes).
  auto quote = [](const std::string& v) {
    std::string q = "\"";
    for (char ch : v) {
      if (ch == '"' || ch == '\\') q += '\\';
      q += ch;
    }
    return q + "\"";
  };
  auto strs = [&quote](const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + quote(v[i]);
    return s + "]";
  };
  std::string out;
  out += fmt::format(
      "[daemon]\nbus = \"{}\"\nstart_without_bus = \"{}\"\nlog_level = \"{}\"\nmetrics_file = \"{}\"\nmetrics_interval = {}\nadmin_group = \"{}\"\n"
      "trusted_group = \"{}\"\nstate_dir = {}\n\n",
      c.daemon.bus, to_string(c.daemon.start_without_bus), c.daemon.log_level, c.daemon.metrics_file, us(c.daemon.metrics_interval), c.daemon.admin_group,
      c.daemon.trusted_group, quote(c.daemon.state_dir));
  std::string nodes = "[";
  for (size_t i = 0; i < c.pool.numa_nodes.size(); ++i) nodes += fmt::format("{}{}", i ? ", " : "", c.pool.numa_nodes[i]);
  nodes += "]";
  out += fmt::format(
      "[pool]\nprofile = \"{}\"\nsize = {}\npage_size = {}\nbackend = \"{}\"\nhugetlbfs_mount = \"{}\"\n"
      "shmem_mount = \"{}\"\ngrow_nr_hugepages = {}\nnuma_policy = \"{}\"\nnuma_nodes = {}\n\n",
      to_string(c.pool.profile), c.pool.size ? fmt::format("{}", *c.pool.size) : "\"auto\"", c.pool.page_size,
      to_string(c.pool.backend), c.pool.hugetlbfs_mount, c.pool.shmem_mount, c.pool.grow_nr_hugepages, to_string(c.pool.numa_policy),
      nodes);
  out += fmt::format(
      "[models]\nmode = \"{}\"\nprefetch_window = {}\nqueue_depth = {}\nallocate_ahead = {}\nstream_expert_unit = {}\n"
      "direct_io = \"{}\"\nwarmup_rate = {}\npinned = {}\nmax_models_per_uid = {}\nmax_pool_bytes_per_uid = {}\nkeep_alive = {}\n"
      "header_timeout = {}\ndrain_wait = {}\npreload = {}\n\n",
      to_string(c.models.mode), c.models.prefetch_window, c.models.queue_depth, c.models.allocate_ahead,
      c.models.stream_expert_unit, to_string(c.models.direct_io), c.models.warmup_rate, strs(c.models.pinned), c.models.max_models_per_uid,
      share(c.models.max_pool_bytes_per_uid), secs(c.models.keep_alive), secs(c.models.header_timeout),
      secs(c.models.drain_wait), strs(c.models.preload));
  out += fmt::format(
      "[kv]\ntokens_per_block = {}\nkv_type = \"{}\"\nidle_threshold = \"{}s\"\nmax_sessions_per_uid = {}\n"
      "max_blocks_per_uid = {}\nmax_pool_bytes_per_uid = {}\nmax_fds_per_uid = {}\nmax_arena_bytes = {}\n"
      "spill_limit = {}\nspill_stop_timeout = \"{}s\"\n\n",
      c.kv.tokens_per_block, to_string(c.kv.kv_type), c.kv.idle_threshold.count(), c.kv.max_sessions_per_uid,
      c.kv.max_blocks_per_uid, share(c.kv.max_pool_bytes_per_uid), c.kv.max_fds_per_uid, c.kv.max_arena_bytes, c.kv.spill_limit,
      c.kv.spill_stop_timeout.count());
  out += fmt::format(
      "[pressure]\nsource = \"{}\"\nsome_threshold = {}\nsome_window = {}\nfull_threshold = {}\nfull_window = {}\n"
      "poll_interval = {}\nmem_available_low = {}\ntarget_some_bytes = {}\ntarget_full_bytes = {}\n"
      "min_eviction_interval = {}\ngrow_after = \"{}s\"\nresize_pool = {}\n",
      to_string(c.pressure.source), us(c.pressure.some_threshold), us(c.pressure.some_window), us(c.pressure.full_threshold),
      us(c.pressure.full_window), us(c.pressure.poll_interval), c.pressure.mem_available_low,
      c.pressure.target_some_bytes, c.pressure.target_full_bytes, us(c.pressure.min_eviction_interval),
      c.pressure.grow_after.count(), c.pressure.resize_pool);
  return out;
}

Profile profile_for_memory(uint64_t mem_total) {
  // MemTotal is below the nominal size (firmware, kernel): a "4 GB" Pi 5
  // reports about 3.9 GiB, so the cut-offs sit between nominal sizes.
  if (mem_total < 3 * kGiB) return {"2gb", 0};
  if (mem_total < 6 * kGiB) return {"4gb", 2 * kGiB};
  return {"8gb", 4 * kGiB};
}

std::optional<Profile> profile_by_name(std::string_view name) {
  if (name == "2gb") return Profile{"2gb", 0};
  if (name == "4gb") return Profile{"4gb", 2 * kGiB};
  if (name == "8gb") return Profile{"8gb", 4 * kGiB};
  return std::nullopt;
}

Profile effective_profile(const PoolConfig& pool, uint64_t mem_total_bytes) {
  Profile p;
  switch (pool.profile) {
    case ProfileChoice::Auto: p = profile_for_memory(mem_total_bytes); break;
    case ProfileChoice::Custom: p = Profile{"custom", 0}; break;
    default: p = *profile_by_name(to_string(pool.profile)); break;
  }
  if (pool.size) p.pool_bytes = *pool.size;
  return p;
}

}  // namespace airs::config
