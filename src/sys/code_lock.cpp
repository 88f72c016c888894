// SPDX-License-Identifier: Apache-2.0
#include "sys/code_lock.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "sys/procfs.hpp"
#include "util/units.hpp"

namespace airs::sys {

namespace {

struct MapsLine {
  uintptr_t start = 0, end = 0;
  std::string perms, dev, path;
  uint64_t inode = 0;
};

// "start-end perms offset dev inode [path]"; false for a line that is not.
bool parse_line(const std::string& line, MapsLine& m) {
  std::istringstream in(line);
  std::string range, offset;
  if (!(in >> range >> m.perms >> offset >> m.dev >> m.inode)) return false;
  const auto dash = range.find('-');
  if (dash == std::string::npos || m.perms.size() < 4) return false;
  try {
    m.start = static_cast<uintptr_t>(std::stoull(range.substr(0, dash), nullptr, 16));
    m.end = static_cast<uintptr_t>(std::stoull(range.substr(dash + 1), nullptr, 16));
  } catch (const std::exception&) {
    return false;
  }
  std::getline(in >> std::ws, m.path);
  return m.end > m.start;
}

}  // namespace

std::vector<CodeRange> code_ranges(const std::string& maps_text) {
  std::vector<MapsLine> lines;
  std::set<std::pair<std::string, uint64_t>> executable;  // (dev, inode)
  std::istringstream in(maps_text);
  for (std::string line; std::getline(in, line);) {
    MapsLine m;
    // A file's mappings only: an inode, and a path (not "[vdso]" or a
    // deleted file's).
    if (!parse_line(line, m) || m.inode == 0 || !m.path.starts_with('/') || m.path.ends_with(" (deleted)")) continue;
    if (m.perms[2] == 'x') executable.emplace(m.dev, m.inode);
    lines.push_back(std::move(m));
  }
  std::vector<CodeRange> out;
  for (auto& m : lines)
    if (m.perms[1] != 'w' && executable.contains({m.dev, m.inode})) out.push_back({m.start, m.end, std::move(m.path)});
  return out;
}

Result<LockedCode> lock_loaded_code() {
  auto maps = read_text_file("/proc/self/maps", 16u << 20);
  if (!maps) return std::move(maps).error();
  LockedCode done;
  std::set<std::string> objects;
  for (const auto& r : code_ranges(*maps)) {
    const uint64_t len = r.end - r.start;
    if (::syscall(SYS_mlock, r.start, len) != 0) {
      const int err = errno;
      rlimit rl{};
      const bool limited = ::getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
      return make_error(err, "locking its code: mlock of {} of {}: {} (RLIMIT_MEMLOCK {}; {} locked before it){}",
                        format_bytes(len), r.path, std::strerror(err),
                        limited ? format_bytes(rl.rlim_cur) : std::string("unlimited"), format_bytes(done.bytes),
                        err == ENOMEM || err == EPERM || err == EAGAIN
                            ? ": give the daemon CAP_IPC_LOCK or LimitMEMLOCK=infinity, as its systemd unit does"
                            : "");
    }
    done.bytes += len;
    objects.insert(r.path);
  }
  done.objects = static_cast<uint32_t>(objects.size());
  return done;
}

}  // namespace airs::sys
