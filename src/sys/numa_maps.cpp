// SPDX-License-Identifier: Apache-2.0
#include "sys/numa_maps.hpp"

#include <charconv>

#include "sys/procfs.hpp"

namespace airs::sys {

namespace {

template <typename T>
bool parse_num(std::string_view s, T& v, int base = 10) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v, base);
  return !s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size();
}

std::string_view next_token(std::string_view& rest) {
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  const size_t sp = rest.find(' ');
  const std::string_view tok = rest.substr(0, sp);
  rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp);
  return tok;
}

// Policies whose printed name has a space in it (mpol_to_str's table).
constexpr std::string_view kSpacedModes[] = {"weighted interleave", "prefer (many)"};

// A known mode (possibly with =flags and :nodes), or an unknown word with
// no '=' (a mode newer than us); "N0=3" or "file=/x" means it is missing.
bool looks_like_policy(std::string_view p) {
  constexpr std::string_view kModes[] = {"default", "prefer", "bind", "interleave", "local",
                                         "weighted interleave", "prefer (many)"};
  const std::string_view name = p.substr(0, p.find_first_of("=:"));
  for (std::string_view m : kModes)
    if (name == m) return true;
  return !p.empty() && p.find('=') == std::string_view::npos;
}

Result<NumaMapsEntry> parse_line(std::string_view line, size_t lineno, const std::string& what) {
  auto bad = [&](std::string_view why, std::string_view tok) {
    return make_error(EINVAL, "{} line {}: {} ('{}' in '{}')", what, lineno, why, tok, line);
  };
  NumaMapsEntry e;
  std::string_view rest = line;
  const std::string_view addr = next_token(rest);
  if (!parse_num(addr, e.start, 16)) return bad("expected a hexadecimal start address", addr);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  for (std::string_view m : kSpacedModes) {
    if (rest.substr(0, m.size()) == m) {
      // Keep the mode's own space, then read the node list part as a token.
      rest.remove_prefix(m.size());
      e.policy = std::string(m) + std::string(next_token(rest));
      break;
    }
  }
  if (e.policy.empty()) e.policy = std::string(next_token(rest));
  if (!looks_like_policy(e.policy)) return bad("expected a memory policy after the address", e.policy);
  for (std::string_view tok = next_token(rest); !tok.empty(); tok = next_token(rest)) {
    if (tok == "huge") {
      e.huge = true;
      continue;
    }
    const size_t eq = tok.find('=');
    if (eq == std::string_view::npos) continue;  // heap, stack, and keys newer than us
    const std::string_view key = tok.substr(0, eq);
    const std::string_view val = tok.substr(eq + 1);
    if (key == "file") {
      e.file = std::string(val);
    } else if (key == "kernelpagesize_kB") {
      uint64_t kb = 0;
      if (!parse_num(val, kb)) return bad("kernelpagesize_kB is not a number", tok);
      e.page_size = kb * 1024;
    } else if (key.size() > 1 && key[0] == 'N' && key[1] >= '0' && key[1] <= '9') {
      int node = 0;
      uint64_t pages = 0;
      if (!parse_num(key.substr(1), node)) return bad("bad node number", tok);
      if (!parse_num(val, pages)) return bad("bad page count", tok);
      e.node_pages[node] += pages;
    }
  }
  return e;
}

}  // namespace

uint64_t NumaMapsEntry::pages() const {
  uint64_t n = 0;
  for (const auto& [node, p] : node_pages) n += p;
  return n;
}

Result<std::vector<NumaMapsEntry>> parse_numa_maps(std::string_view text, const std::string& what) {
  std::vector<NumaMapsEntry> out;
  size_t lineno = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++lineno;
    if (line.find_first_not_of(' ') == std::string_view::npos) continue;
    auto e = parse_line(line, lineno, what);
    if (!e) return std::move(e).error();
    out.push_back(std::move(e).value());
  }
  return out;
}

Result<NumaMapsEntry> find_numa_maps_entry(std::string_view numa_maps_text, std::string_view maps_text, uint64_t addr,
                                           const std::string& what) {
  uint64_t start = 0;
  bool found = false;
  size_t lineno = 0;
  for (std::string_view text = maps_text; !text.empty() && !found;) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++lineno;
    if (line.empty()) continue;
    const auto m = parse_maps_line(line);
    if (!m)
      return make_error(EINVAL, "{} (maps) line {}: not \"start-end perms offset dev inode [path]\": '{}'", what,
                        lineno, line);
    if (addr >= m->start && addr < m->end) {
      start = m->start;
      found = true;
    }
  }
  if (!found) return make_error(ENOENT, "{}: no mapping contains address {:#x}", what, addr);
  auto entries = parse_numa_maps(numa_maps_text, what);
  if (!entries) return std::move(entries).error();
  for (auto& e : *entries)
    if (e.start == start) return std::move(e);
  return make_error(ENOENT, "{}: numa_maps has no entry for the mapping at {:#x} (it changed while being read?)", what,
                    start);
}

Result<NumaMapsEntry> numa_maps_entry(const void* addr, const std::string& numa_maps, const std::string& maps) {
  auto nm = read_text_file(numa_maps, 64 << 20);
  if (!nm) return std::move(nm).error();
  auto m = read_text_file(maps, 64 << 20);
  if (!m) return std::move(m).error();
  return find_numa_maps_entry(*nm, *m, reinterpret_cast<uintptr_t>(addr), numa_maps);
}

}  // namespace airs::sys
