// SPDX-License-Identifier: Apache-2.0
#include "sys/procfs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <sstream>
#include <string_view>

#include "sys/fd.hpp"

namespace airs::sys {
namespace {

// Mount points in mountinfo escape space, tab, newline and backslash as \ooo.
std::string unescape_mountinfo(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3') {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

std::vector<MountEntry> parse_mountinfo(const std::string& text) {
  std::vector<MountEntry> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream pre(line.substr(0, dash));
    std::string id, parent, dev, root, mnt;
    pre >> id >> parent >> dev >> root >> mnt;
    std::istringstream post(line.substr(dash + 3));
    MountEntry e;
    std::string source;
    post >> e.fstype >> source >> e.super_options;
    e.mount_point = unescape_mountinfo(mnt);
    out.push_back(std::move(e));
  }
  return out;
}

std::optional<MapsEntry> parse_maps_line(std::string_view line) {
  std::istringstream in{std::string(line)};
  std::string range, offset;
  MapsEntry e;
  if (!(in >> range >> e.perms >> offset >> e.dev >> e.inode)) return std::nullopt;
  const auto dash = range.find('-');
  if (dash == std::string::npos || e.perms.size() < 4) return std::nullopt;
  const auto hex = [](std::string_view t, uint64_t& v) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v, 16);
    return ec == std::errc() && p == t.data() + t.size() && !t.empty();
  };
  const std::string_view r(range);
  if (!hex(r.substr(0, dash), e.start) || !hex(r.substr(dash + 1), e.end) || e.end <= e.start) return std::nullopt;
  std::getline(in >> std::ws, e.path);
  return e;
}

Result<std::string> read_text_file(const std::string& path, size_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return make_error(errno, "cannot open {}: {}", path, std::strerror(errno));
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(errno, "cannot read {}: {}", path, std::strerror(errno));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) return make_error(EFBIG, "{} is larger than {} bytes", path, max_bytes);
  }
  return out;
}

Status write_text_file(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
  if (!fd) return make_error(errno, "cannot open {} for writing: {}", path, std::strerror(errno));
  ssize_t n = ::write(fd.get(), text.data(), text.size());
  if (n < 0) return make_error(errno, "cannot write '{}' to {}: {}", text, path, std::strerror(errno));
  if (static_cast<size_t>(n) != text.size()) return make_error(EIO, "short write to {}", path);
  return {};
}

Result<uint64_t> read_u64_file(const std::string& path) {
  auto text = read_text_file(path, 256);
  if (!text) return std::move(text).error();
  const std::string& s = *text;
  uint64_t v = 0;
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  auto [p, ec] = std::from_chars(s.data() + i, s.data() + s.size(), v);
  if (ec != std::errc{} || p == s.data() + i) return make_error(EINVAL, "{}: expected an unsigned integer, got '{}'", path, s);
  return v;
}

Result<std::map<std::string, uint64_t>> read_meminfo(const std::string& path) {
  auto text = read_text_file(path);
  if (!text) return std::move(text).error();
  std::map<std::string, uint64_t> out;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    const char* p = line.c_str() + colon + 1;
    while (*p == ' ') ++p;
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(p, line.c_str() + line.size(), v);
    if (ec != std::errc{}) continue;
    if (std::strstr(end, "kB") != nullptr) v *= 1024;
    out.emplace(std::move(key), v);
  }
  if (out.empty()) return make_error(EINVAL, "{}: no fields found", path);
  return out;
}

Result<std::vector<HugePageSize>> read_hugepage_sizes(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return make_error(errno, "cannot list {}: {} (kernel without hugetlbfs?)", dir, std::strerror(errno));
  std::vector<HugePageSize> out;
  while (dirent* e = ::readdir(d.get())) {
    std::string_view name(e->d_name);
    if (!name.starts_with("hugepages-") || !name.ends_with("kB")) continue;
    uint64_t kb = 0;
    auto num = name.substr(10, name.size() - 12);
    if (std::from_chars(num.data(), num.data() + num.size(), kb).ec != std::errc{}) continue;
    HugePageSize h;
    h.bytes = kb * 1024;
    const std::string base = dir + "/" + std::string(name) + "/";
    auto rd = [&](const char* f) -> uint64_t {
      auto v = read_u64_file(base + f);
      return v ? *v : 0;
    };
    h.nr = rd("nr_hugepages");
    h.free = rd("free_hugepages");
    h.resv = rd("resv_hugepages");
    h.surplus = rd("surplus_hugepages");
    out.push_back(h);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  return out;
}

}  // namespace airs::sys
