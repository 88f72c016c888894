// SPDX-License-Identifier: Apache-2.0
#include "sys/hugepage_knobs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <numeric>

#include "sys/fd.hpp"
#include "sys/procfs.hpp"
#include "util/units.hpp"

namespace airs::sys {
namespace {

std::string join(const std::string& root, const std::string& rel) {
  if (root.empty() || root == "/") return "/" + rel;
  return root.back() == '/' ? root + rel : root + "/" + rel;
}

Result<std::vector<int>> list_nodes(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) {
    if (errno == ENOENT) return std::vector<int>{};  // kernel without NUMA
    return make_error(errno, "cannot list {}: {}", dir, std::strerror(errno));
  }
  std::vector<int> out;
  while (dirent* e = ::readdir(d.get())) {
    std::string_view name(e->d_name);
    if (!name.starts_with("node") || name.size() == 4) continue;
    int n = 0;
    auto [p, ec] = std::from_chars(name.data() + 4, name.data() + name.size(), n);
    if (ec != std::errc{} || p != name.data() + name.size()) continue;
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Like write_text_file, but truncating: sysfs ignores O_TRUNC, and a fixture
// tree needs it so "8" over "10" does not read back as "80".
Status write_knob(const std::string& path, uint64_t value) {
  const std::string text = std::to_string(value);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
  if (!fd) return make_error(errno, "cannot open {} for writing: {}", path, std::strerror(errno));
  const ssize_t n = ::write(fd.get(), text.data(), text.size());
  if (n < 0) return make_error(errno, "cannot write {} to {}: {}", text, path, std::strerror(errno));
  if (static_cast<size_t>(n) != text.size()) return make_error(EIO, "short write to {}", path);
  return {};
}

}  // namespace

uint64_t pool_pages(const HugePageCounts& c) {
  if (c.nodes.empty()) return c.nr;
  uint64_t sum = 0;
  for (const auto& n : c.nodes) sum += n.nr;
  return sum;
}

HugepageKnobs::HugepageKnobs(std::string root) : root_(std::move(root)) {}

std::string HugepageKnobs::size_dir(uint64_t page_bytes) const {
  return join(root_, fmt::format("sys/kernel/mm/hugepages/hugepages-{}kB", page_bytes / 1024));
}

std::string HugepageKnobs::node_size_dir(int node, uint64_t page_bytes) const {
  return join(root_, fmt::format("sys/devices/system/node/node{}/hugepages/hugepages-{}kB", node, page_bytes / 1024));
}

Result<HugePageCounts> HugepageKnobs::read(uint64_t page_bytes) const {
  const std::string dir = size_dir(page_bytes);
  HugePageCounts c;
  auto nr = read_u64_file(dir + "/nr_hugepages");
  if (!nr) {
    if (nr.error().code == ENOENT)
      return make_error(ENOENT, "no huge pages of {} on this kernel ({} missing; needs CONFIG_HUGETLBFS and that size)",
                        format_bytes(page_bytes), dir);
    return std::move(nr).error();
  }
  c.nr = *nr;
  for (auto [file, field] : {std::pair{"free_hugepages", &c.free}, {"resv_hugepages", &c.resv},
                             {"surplus_hugepages", &c.surplus}}) {
    auto v = read_u64_file(dir + "/" + file);
    if (!v) return std::move(v).error();
    *field = *v;
  }
  auto nodes = list_nodes(join(root_, "sys/devices/system/node"));
  if (!nodes) return std::move(nodes).error();
  for (int n : *nodes) {
    const std::string nd = node_size_dir(n, page_bytes);
    auto nnr = read_u64_file(nd + "/nr_hugepages");
    if (!nnr && nnr.error().code == ENOENT) continue;  // memoryless node / no such size there
    if (!nnr) return std::move(nnr).error();
    auto nfree = read_u64_file(nd + "/free_hugepages");
    if (!nfree) return std::move(nfree).error();
    auto nsur = read_u64_file(nd + "/surplus_hugepages");
    if (!nsur) return std::move(nsur).error();
    c.nodes.push_back(NodeHugePages{n, *nnr, *nfree, *nsur});
  }
  return c;
}

Result<ResizeResult> HugepageKnobs::shrink(uint64_t page_bytes, uint64_t pages) {
  auto before = read(page_bytes);
  if (!before) return std::move(before).error();
  ResizeResult r;
  r.requested = pages;
  r.before = pool_pages(*before);
  // Reserved pages are free but promised to a mapping; lowering the count
  // below them only turns them into surplus, it frees nothing.
  const uint64_t givable = before->free > before->resv ? before->free - before->resv : 0;
  const uint64_t want = std::min(pages, givable);

  if (want > 0 && !before->nodes.empty()) {
    // Proportional to each node's free pages, largest remainders first, so a
    // node is never asked for more than it has free.
    uint64_t node_free = 0;
    for (const auto& n : before->nodes) node_free += n.free;
    const uint64_t total = std::min(want, node_free);
    std::vector<uint64_t> share(before->nodes.size(), 0);
    std::vector<std::pair<uint64_t, size_t>> rem;
    uint64_t assigned = 0;
    for (size_t i = 0; i < before->nodes.size(); ++i) {
      const auto& n = before->nodes[i];
      if (node_free == 0) break;
      // Page counts stay far below 2^32 (8 PiB of 2 MiB pages), so the
      // product cannot overflow.
      const uint64_t prod = total * n.free;
      share[i] = prod / node_free;
      rem.emplace_back(prod % node_free, i);
      assigned += share[i];
    }
    std::sort(rem.begin(), rem.end(), [](auto& a, auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    for (auto& [unused, i] : rem) {
      if (assigned >= total) break;
      if (share[i] < before->nodes[i].free) {
        ++share[i];
        ++assigned;
      }
    }
    for (size_t i = 0; i < before->nodes.size(); ++i) {
      if (share[i] == 0) continue;
      const auto& n = before->nodes[i];
      AIRS_TRY(write_knob(node_size_dir(n.node, page_bytes) + "/nr_hugepages", n.nr - share[i]));
      r.nodes.push_back(NodeChange{n.node, share[i], 0});
    }
  } else if (want > 0) {
    AIRS_TRY(write_knob(size_dir(page_bytes) + "/nr_hugepages", before->nr - want));
  }

  auto after = read(page_bytes);
  if (!after) return std::move(after).error();
  r.after = pool_pages(*after);
  r.done = r.before > r.after ? r.before - r.after : 0;
  for (auto& ch : r.nodes) {
    auto b = std::find_if(before->nodes.begin(), before->nodes.end(), [&](auto& n) { return n.node == ch.node; });
    auto a = std::find_if(after->nodes.begin(), after->nodes.end(), [&](auto& n) { return n.node == ch.node; });
    if (b != before->nodes.end() && a != after->nodes.end() && b->nr > a->nr) ch.done = b->nr - a->nr;
  }
  if (r.done < pages) {
    if (want < pages)
      r.note = fmt::format("gave back {} of {} pages of {}: only {} free and unreserved ({} free, {} reserved)", r.done,
                           pages, format_bytes(page_bytes), givable, before->free, before->resv);
    else
      r.note = fmt::format("gave back {} of {} pages of {}: the kernel kept the rest (another writer, or pages got used "
                           "between reading and writing)",
                           r.done, pages, format_bytes(page_bytes));
  }
  return r;
}

Result<ResizeResult> HugepageKnobs::grow(uint64_t page_bytes, uint64_t pages) {
  auto before = read(page_bytes);
  if (!before) return std::move(before).error();
  ResizeResult r;
  r.requested = pages;
  r.before = before->nr;
  if (pages > 0) AIRS_TRY(write_knob(size_dir(page_bytes) + "/nr_hugepages", before->nr + pages));
  auto after = read(page_bytes);
  if (!after) return std::move(after).error();
  r.after = after->nr;
  r.done = r.after > r.before ? r.after - r.before : 0;
  for (const auto& a : after->nodes) {
    auto b = std::find_if(before->nodes.begin(), before->nodes.end(), [&](auto& n) { return n.node == a.node; });
    const uint64_t was = b == before->nodes.end() ? 0 : b->nr;
    if (a.nr > was) r.nodes.push_back(NodeChange{a.node, 0, a.nr - was});
  }
  if (r.done < pages)
    r.note = fmt::format(
        "kernel gave {} of {} pages of {}: not enough free contiguous memory (fragmentation); try again later, "
        "after 'echo 1 > /proc/sys/vm/compact_memory', or reserve at boot (hugepages= on the kernel command line)",
        r.done, pages, format_bytes(page_bytes));
  return r;
}

}  // namespace airs::sys
