#include "config/config.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "util/units.hpp"

namespace airs::config {
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
  Status get_duration(std::string_view key, Dur& out) {
    auto n = node(key);
    if (!n) return {};
    if (auto i = n->value<int64_t>()) {
      if (*i < 0) return bad(key, "a duration cannot be negative");
      out = Dur(*i);
      return {};
    }
    auto s = n->value<std::string>();
    if (!s) return bad(key, "expected a duration such as \"2s\" or \"150ms\"");
    auto d = parse_duration(*s);
    if (!d) return bad(key, fmt::format("'{}' is not a duration (use us, ms, s, m, h)", *s));
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
    AIRS_TRY(s.get("log_level", c.daemon.log_level));
    AIRS_TRY(s.get("metrics_file", c.daemon.metrics_file));
    AIRS_TRY(s.get_duration("metrics_interval", c.daemon.metrics_interval));
    AIRS_TRY(s.get("admin_group", c.daemon.admin_group));
    AIRS_TRY(s.finish());
  }
  {
    Section s(root["pool"].as_table(), "pool", origin);
    AIRS_TRY(s.get("profile", c.pool.profile));
    AIRS_TRY(s.get_optional_bytes("size", c.pool.size));
    AIRS_TRY(s.get_bytes("page_size", c.pool.page_size));
    AIRS_TRY(s.get("backend", c.pool.backend));
    AIRS_TRY(s.get("hugetlbfs_mount", c.pool.hugetlbfs_mount));
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
    AIRS_TRY(s.get("direct_io", c.models.direct_io));
    AIRS_TRY(s.get_bytes("warmup_rate", c.models.warmup_rate));
    AIRS_TRY(s.get("pinned", c.models.pinned));
    AIRS_TRY(s.finish());
  }
  {
    Section s(root["kv"].as_table(), "kv", origin);
    AIRS_TRY(s.get_int("tokens_per_block", c.kv.tokens_per_block, 1, 65536));
    AIRS_TRY(s.get("kv_type", c.kv.kv_type));
    AIRS_TRY(s.get_duration("idle_threshold", c.kv.idle_threshold));
    AIRS_TRY(s.get_int("max_sessions_per_uid", c.kv.max_sessions_per_uid, 1, 1 << 20));
    AIRS_TRY(s.get_int("max_blocks_per_uid", c.kv.max_blocks_per_uid, 0, INT64_MAX));
    AIRS_TRY(s.get_int("max_fds_per_uid", c.kv.max_fds_per_uid, 4, 1 << 20));
    AIRS_TRY(s.get_bytes("max_arena_bytes", c.kv.max_arena_bytes));
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
}  // namespace

Status validate(const Config& c) {
  AIRS_TRY(one_of("daemon.log_level", c.daemon.log_level, {"trace", "debug", "info", "warning", "error"}));
  if (c.daemon.bus.empty()) return make_error(EINVAL, "daemon.bus is empty (use \"system\" or a D-Bus address)");
  if (c.daemon.metrics_interval < std::chrono::milliseconds(100))
    return make_error(EINVAL, "daemon.metrics_interval must be at least 100ms");
  AIRS_TRY(one_of("pool.profile", c.pool.profile, {"auto", "2gb", "4gb", "8gb", "custom"}));
  if (c.pool.profile == "custom" && !c.pool.size)
    return make_error(EINVAL, "pool.profile = \"custom\" needs pool.size");
  if (c.pool.page_size != 0 && !is_pow2(c.pool.page_size))
    return make_error(EINVAL, "pool.page_size = {} is not a power of two", c.pool.page_size);
  AIRS_TRY(one_of("pool.backend", c.pool.backend, {"auto", "hugetlbfs", "shmem"}));
  AIRS_TRY(one_of("pool.numa_policy", c.pool.numa_policy, {"local", "bind", "interleave"}));
  if (c.pool.numa_policy == "bind" && c.pool.numa_nodes.empty())
    return make_error(EINVAL, "pool.numa_policy = \"bind\" needs pool.numa_nodes");
  AIRS_TRY(one_of("models.mode", c.models.mode, {"auto", "full", "small-pages", "cooperative"}));
  AIRS_TRY(one_of("models.direct_io", c.models.direct_io, {"auto", "on", "off"}));
  AIRS_TRY(one_of("kv.kv_type", c.kv.kv_type, {"f16", "q8_0"}));
  AIRS_TRY(one_of("pressure.source", c.pressure.source, {"auto", "psi", "poll"}));
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

Result<Config> load(const std::string& path, const std::string& dropin_dir, bool optional_main) {
  namespace fs = std::filesystem;
  auto read = [](const fs::path& p) -> Result<std::string> {
    std::ifstream in(p, std::ios::binary);
    if (!in) return make_error(ENOENT, "cannot read {}", p.string());
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  Config c;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    auto text = read(path);
    if (!text) return std::move(text).error();
    auto r = parse(*text, path, std::move(c));
    if (!r) return std::move(r).error();
    c = std::move(r).value();
  } else if (!optional_main) {
    return make_error(ENOENT, "config file {} does not exist", path);
  }
  if (!dropin_dir.empty() && fs::is_directory(dropin_dir, ec)) {
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(dropin_dir, ec))
      if (e.path().extension() == ".conf") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      auto text = read(f);
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
    return u % 1000 == 0 ? fmt::format("\"{}ms\"", u / 1000) : fmt::format("\"{}us\"", u);
  };
  auto strs = [](const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}\"{}\"", i ? ", " : "", v[i]);
    return s + "]";
  };
  std::string out;
  out += fmt::format("[daemon]\nbus = \"{}\"\nlog_level = \"{}\"\nmetrics_file = \"{}\"\nmetrics_interval = {}\nadmin_group = \"{}\"\n\n",
                     c.daemon.bus, c.daemon.log_level, c.daemon.metrics_file, us(c.daemon.metrics_interval),
                     c.daemon.admin_group);
  std::string nodes = "[";
  for (size_t i = 0; i < c.pool.numa_nodes.size(); ++i) nodes += fmt::format("{}{}", i ? ", " : "", c.pool.numa_nodes[i]);
  nodes += "]";
  out += fmt::format(
      "[pool]\nprofile = \"{}\"\nsize = {}\npage_size = {}\nbackend = \"{}\"\nhugetlbfs_mount = \"{}\"\n"
      "grow_nr_hugepages = {}\nnuma_policy = \"{}\"\nnuma_nodes = {}\n\n",
      c.pool.profile, c.pool.size ? fmt::format("{}", *c.pool.size) : "\"auto\"", c.pool.page_size, c.pool.backend,
      c.pool.hugetlbfs_mount, c.pool.grow_nr_hugepages, c.pool.numa_policy, nodes);
  out += fmt::format(
      "[models]\nmode = \"{}\"\nprefetch_window = {}\nqueue_depth = {}\nallocate_ahead = {}\ndirect_io = \"{}\"\n"
      "warmup_rate = {}\npinned = {}\n\n",
      c.models.mode, c.models.prefetch_window, c.models.queue_depth, c.models.allocate_ahead, c.models.direct_io,
      c.models.warmup_rate, strs(c.models.pinned));
  out += fmt::format(
      "[kv]\ntokens_per_block = {}\nkv_type = \"{}\"\nidle_threshold = \"{}s\"\nmax_sessions_per_uid = {}\n"
      "max_blocks_per_uid = {}\nmax_fds_per_uid = {}\nmax_arena_bytes = {}\n\n",
      c.kv.tokens_per_block, c.kv.kv_type, c.kv.idle_threshold.count(), c.kv.max_sessions_per_uid,
      c.kv.max_blocks_per_uid, c.kv.max_fds_per_uid, c.kv.max_arena_bytes);
  out += fmt::format(
      "[pressure]\nsource = \"{}\"\nsome_threshold = {}\nsome_window = {}\nfull_threshold = {}\nfull_window = {}\n"
      "poll_interval = {}\nmem_available_low = {}\ntarget_some_bytes = {}\ntarget_full_bytes = {}\n"
      "min_eviction_interval = {}\ngrow_after = \"{}s\"\nresize_pool = {}\n",
      c.pressure.source, us(c.pressure.some_threshold), us(c.pressure.some_window), us(c.pressure.full_threshold),
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

}  // namespace airs::config
