// SPDX-License-Identifier: Apache-2.0
// Where a mapping's pages really are: /proc/<pid>/numa_maps, one line per
// VMA ("<start> <policy> [file=..] [huge] [anon=..] .. N<node>=<pages> ..
// kernelpagesize_kB=<kB>"). The parser is pure (canned text in tests); the
// reader takes its paths so tests can point it at fixtures.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.hpp"

namespace airs::sys {

struct NumaMapsEntry {
  uint64_t start = 0;
  // As the kernel prints it: "default", "local", "bind:0-1", "interleave:0-7",
  // "prefer:1", "weighted interleave:0-3", "interleave=static:0" ...
  std::string policy;
  std::string file;             // file= as printed (octal escapes kept), "" if none
  bool huge = false;            // a hugetlb VMA
  uint64_t page_size = 0;       // bytes (kernelpagesize_kB); 0 if the line has none
  // N<node>=<pages>: pages present in the VMA's page tables, per node, in
  // page_size units. Pages never touched through this VMA are not counted.
  std::map<int, uint64_t> node_pages;

  [[nodiscard]] uint64_t pages() const;
};

// Every line of a numa_maps text. Unknown tokens are skipped (newer kernels
// add keys). Errors: EINVAL naming `what`, the line number and the bad token
// (no address, no policy, a non-numeric N<node>= or kernelpagesize_kB=).
[[nodiscard]] Result<std::vector<NumaMapsEntry>> parse_numa_maps(std::string_view text, const std::string& what);

// The entry of the VMA containing `addr`: its [start, end) from `maps_text`
// (/proc/<pid>/maps), its entry by that start from `numa_maps_text`.
// Errors: ENOENT when no VMA contains addr (or numa_maps has no entry for
// it: the mapping changed between the two reads), parse errors as above.
[[nodiscard]] Result<NumaMapsEntry> find_numa_maps_entry(std::string_view numa_maps_text, std::string_view maps_text,
                                                         uint64_t addr, const std::string& what);

// Reads both files and finds the VMA containing `addr` in that process.
// Thread: any; the files are read fresh on every call (a few hundred lines
// for the daemon).
[[nodiscard]] Result<NumaMapsEntry> numa_maps_entry(const void* addr,
                                                    const std::string& numa_maps = "/proc/self/numa_maps",
                                                    const std::string& maps = "/proc/self/maps");

}  // namespace airs::sys
