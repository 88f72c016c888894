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

std::vector<CodeRange> code_ranges(const std::string& maps_text) {
  std::vector<MapsEntry> lines;
  std::set<std::pair<std::string, uint64_t>> executable;  // (dev, inode)
  std::istringstream in(maps_text);
  for (std::string line; std::getline(in, line);) {
    auto m = parse_maps_line(line);
    // A file's mappings only: an inode, and a path (not "[vdso]" or a
    // deleted file's).
    if (!m || m->inode == 0 || !m->path.starts_with('/') || m->path.ends_with(" (deleted)")) continue;
    if (m->perms[2] == 'x') executable.emplace(m->dev, m->inode);
    lines.push_back(std::move(*m));
  }
  std::vector<CodeRange> out;
  for (auto& m : lines)
    if (m.perms[1] != 'w' && executable.contains({m.dev, m.inode})) out.push_back({static_cast<uintptr_t>(m.start), static_cast<uintptr_t>(m.end), std::move(m.path)});
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
