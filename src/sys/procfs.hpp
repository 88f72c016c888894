// SPDX-License-Identifier: Apache-2.0
// Readers for /proc and /sys. Each takes its path as a parameter so tests can
// point it at a fixture file; defaults are the real locations.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.hpp"

namespace airs::sys {

// Whole file as text (procfs files report size 0, so this reads until EOF).
[[nodiscard]] Result<std::string> read_text_file(const std::string& path, size_t max_bytes = 1 << 20);
// Writes `text` to an existing file (sysctl/sysfs knobs).
[[nodiscard]] Status write_text_file(const std::string& path, const std::string& text);
// A file holding one unsigned integer (sysfs counters).
[[nodiscard]] Result<uint64_t> read_u64_file(const std::string& path);

// /proc/meminfo: key → value in bytes for "kB" lines, raw number otherwise
// (HugePages_Total etc. are page counts).
[[nodiscard]] Result<std::map<std::string, uint64_t>> read_meminfo(const std::string& path = "/proc/meminfo");

// One line of /proc/PID/mountinfo
// ("id parent maj:min root mountpoint opts [optional...] - fstype source superopts").
struct MountEntry {
  std::string mount_point;  // unescaped (mountinfo writes space, tab, newline, backslash as \ooo)
  std::string fstype;
  std::string super_options;
};
// Every well-formed line of a mountinfo text, in order. Pure.
[[nodiscard]] std::vector<MountEntry> parse_mountinfo(const std::string& text);

// One line of /proc/PID/maps (and a mapping's header line in smaps):
// "start-end perms offset dev inode [path]".
struct MapsEntry {
  uint64_t start = 0, end = 0;  // [start, end)
  std::string perms;            // "r-xp": read, write, execute, private/shared
  std::string dev;              // "fe:01"
  uint64_t inode = 0;           // 0: not a file's mapping
  std::string path;             // as printed: "[heap]", "/x (deleted)", "" for anonymous memory
};
// Nullopt for a line that is not one (missing fields, a bad range). Pure.
[[nodiscard]] std::optional<MapsEntry> parse_maps_line(std::string_view line);

struct HugePageSize {
  uint64_t bytes = 0;      // e.g. 2 MiB
  uint64_t nr = 0;         // nr_hugepages
  uint64_t free = 0;       // free_hugepages
  uint64_t resv = 0;       // resv_hugepages
  uint64_t surplus = 0;    // surplus_hugepages
};
// Every size under /sys/kernel/mm/hugepages (hugepages-<N>kB), ascending.
[[nodiscard]] Result<std::vector<HugePageSize>> read_hugepage_sizes(
    const std::string& dir = "/sys/kernel/mm/hugepages");

}  // namespace airs::sys
