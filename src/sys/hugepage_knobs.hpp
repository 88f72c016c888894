// SPDX-License-Identifier: Apache-2.0
// nr_hugepages knobs: how many huge pages of one size the kernel keeps in the
// hugetlb pool, globally and per NUMA node. Lowering the count hands *free*
// pool pages back to the kernel at once (MemFree rises); raising it asks the
// kernel for contiguous memory, which may come back short when memory is
// fragmented. Pages still in hugetlbfs files are never affected by a shrink
// here: it only ever asks for pages that are free and not reserved.
//
// Paths under `root` (default "/", tests pass a fixture tree):
//   sys/kernel/mm/hugepages/hugepages-<kB>kB/{nr,free,resv,surplus}_hugepages
//   sys/devices/system/node/node<N>/hugepages/hugepages-<kB>kB/{nr,free,surplus}_hugepages
// The per-size sysfs file is used for the global count (it works for every
// size; /proc/sys/vm/nr_hugepages covers only the default size).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/result.hpp"

namespace airs::sys {

struct NodeHugePages {
  int node = 0;
  uint64_t nr = 0;
  uint64_t free = 0;
  uint64_t surplus = 0;
};

struct HugePageCounts {
  uint64_t nr = 0;
  uint64_t free = 0;
  uint64_t resv = 0;
  uint64_t surplus = 0;
  std::vector<NodeHugePages> nodes;  // empty when the kernel has no node directories
};

// Pages of the size in the pool: the sum over nodes where the kernel has
// node directories (that is what a per-node write changes), else the global
// count. On a real kernel both agree.
[[nodiscard]] uint64_t pool_pages(const HugePageCounts& c);

struct NodeChange {
  int node = 0;
  uint64_t asked = 0;  // pages we asked this node to give back / add
  uint64_t done = 0;   // what the re-read shows
};

struct ResizeResult {
  uint64_t requested = 0;  // pages the caller asked for
  uint64_t done = 0;       // pages that really moved (re-read after writing)
  uint64_t before = 0;     // pool_pages() before
  uint64_t after = 0;      // and after
  std::vector<NodeChange> nodes;
  // Empty when done == requested; otherwise why not, in words for status and
  // logs ("kernel gave 3 of 5 pages of 2 MiB: memory is fragmented ...").
  std::string note;
};

class HugepageKnobs {
 public:
  explicit HugepageKnobs(std::string root = "/");

  // Counts for one page size (bytes, e.g. 2 MiB). Errors: ENOENT if the
  // kernel has no such size (names the directory and hugetlbfs).
  [[nodiscard]] Result<HugePageCounts> read(uint64_t page_bytes) const;

  // Gives up to `pages` free, unreserved pages back to the kernel. Where node
  // directories exist, each node gives in proportion to its free pages (and
  // never more than it has free); else the global count is lowered. Asking
  // for more than is free and unreserved is not an error: the result says
  // how many went. Not thread-safe against other writers of the same knob.
  [[nodiscard]] Result<ResizeResult> shrink(uint64_t page_bytes, uint64_t pages);

  // Asks the kernel for `pages` more (through the global count, which the
  // kernel spreads over nodes with memory). Fewer than asked is not an
  // error: the result says how many the kernel gave and why.
  [[nodiscard]] Result<ResizeResult> grow(uint64_t page_bytes, uint64_t pages);

 private:
  [[nodiscard]] std::string size_dir(uint64_t page_bytes) const;
  [[nodiscard]] std::string node_size_dir(int node, uint64_t page_bytes) const;
  std::string root_;
};

}  // namespace airs::sys
