// SPDX-License-Identifier: Apache-2.0
#include "probe/probe.hpp"

#include <grp.h>
#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <sstream>
#include <string_view>

#include "sys/files.hpp"
#include "sys/procfs.hpp"
#include "sys/psi.hpp"
#include "util/units.hpp"

namespace airs::probe {
namespace {

using sys::MountEntry;
using sys::parse_mountinfo;

bool has_word(const std::string& text, std::string_view word, char sep) {
  std::istringstream in(text);
  std::string w;
  while (std::getline(in, w, sep)) {
    while (!w.empty() && (w.back() == '\n' || w.back() == ' ')) w.pop_back();
    if (w == word) return true;
  }
  return false;
}

std::optional<int> parse_int(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// "always [madvise] never" → "madvise".
std::string bracketed(const std::string& text) {
  const auto open = text.find('[');
  const auto close = text.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return {};
  return text.substr(open + 1, close - open - 1);
}

// kstrtobool's spellings, as the kernel parses psi=.
std::optional<bool> parse_kernel_bool(std::string_view v) {
  if (v == "1" || v == "y" || v == "Y" || v == "on") return true;
  if (v == "0" || v == "n" || v == "N" || v == "off") return false;
  return std::nullopt;
}

class Prober {
 public:
  Prober(const ProbePaths& paths, const KernelOps& ops) : paths_(paths), ops_(ops) {}

  Capabilities run() {
    if (auto r = read_optional(proc("sys/kernel/osrelease"))) {
      caps_.kernel_release = *r;
      while (!caps_.kernel_release.empty() && caps_.kernel_release.back() == '\n') caps_.kernel_release.pop_back();
    }
    caps_.base_page_size = ops_.page_size();
    if (auto r = read_optional(proc("self/mountinfo"))) mounts_ = parse_mountinfo(*r);
    if (auto r = read_optional(proc("cmdline"))) cmdline_ = *r;
    probe_hugetlbfs();
    probe_uffd();
    probe_io_uring();
    probe_psi();
    probe_memcg();
    probe_numa();
    probe_thp();
    probe_odirect();
    return std::move(caps_);
  }

 private:
  std::string proc(std::string_view rel) const { return paths_.proc_root + "/" + std::string(rel); }
  std::string sys(std::string_view rel) const { return paths_.sys_root + "/" + std::string(rel); }

  // A mount point the kernel names (/sys/fs/cgroup) as a path in the tree
  // we were pointed at.
  std::string in_tree(const std::string& mount_point) const {
    auto under = [&](std::string_view real) {
      return mount_point == real || (mount_point.starts_with(real) && mount_point[real.size()] == '/');
    };
    if (under("/sys")) return paths_.sys_root + mount_point.substr(4);
    if (under("/proc")) return paths_.proc_root + mount_point.substr(5);
    return mount_point;
  }

  void problem(const Error& e) { caps_.problems.push_back(e.message); }

  // The file's text; nullopt when it does not exist (the kernel lacks the
  // feature), and also on other errors, which are recorded as problems.
  std::optional<std::string> read_optional(const std::string& path) {
    auto r = ops_.read_file(path);
    if (r) return std::move(r).value();
    if (r.error().code != ENOENT) problem(r.error());
    return std::nullopt;
  }

  std::optional<int> read_int(const std::string& path) {
    auto text = read_optional(path);
    if (!text) return std::nullopt;
    auto v = parse_int(*text);
    if (!v) problem(make_error(EINVAL, "{}: expected an integer, got '{}'", path, *text));
    return v;
  }

  void probe_hugetlbfs() {
    auto& h = caps_.hugetlbfs;
    if (auto fs = read_optional(proc("filesystems"))) {
      std::istringstream in(*fs);
      std::string line;
      while (std::getline(in, line)) {
        // "nodev\thugetlbfs"
        const auto tab = line.rfind('\t');
        if (line.substr(tab == std::string::npos ? 0 : tab + 1) == "hugetlbfs") h.in_filesystems = true;
      }
    }
    auto sizes = sys::read_hugepage_sizes(sys("kernel/mm/hugepages"));
    if (sizes) {
      for (const auto& s : *sizes) h.sizes.push_back({s.bytes, s.nr, s.free});
    } else if (sizes.error().code != ENOENT) {
      problem(sizes.error());
    }
    if (auto mi = read_optional(proc("meminfo"))) {
      std::istringstream in(*mi);
      std::string line;
      while (std::getline(in, line)) {
        if (!line.starts_with("Hugepagesize:")) continue;
        uint64_t kb = 0;
        std::istringstream(line.substr(13)) >> kb;
        h.default_size = kb * kKiB;
      }
    }
    for (const auto& m : mounts_) {
      if (m.fstype != "hugetlbfs") continue;
      uint64_t size = h.default_size;
      std::istringstream opts(m.super_options);
      std::string opt;
      while (std::getline(opts, opt, ','))
        if (opt.starts_with("pagesize=")) size = parse_bytes(opt.substr(9)).value_or(0);
      h.mounts.push_back({m.mount_point, size});
    }
  }

  void probe_uffd() {
    auto& u = caps_.uffd;
    auto sc = ops_.uffd_syscall();
    if (sc) {
      u.syscall_ok = true;
      u.features = *sc;
    } else {
      u.syscall_errno = sc.error().code;
    }
    const std::string dev = paths_.dev_root + "/userfaultfd";
    if (const auto dst = sys::stat_path(dev)) {
      const struct stat& st = *dst;
      u.device_exists = true;
      u.device_mode = st.st_mode & 07777;
      group st_group{};
      group* found = nullptr;
      std::vector<char> buf(4096);
      if (::getgrgid_r(st.st_gid, &st_group, buf.data(), buf.size(), &found) == 0 && found != nullptr)
        u.device_group = found->gr_name;
      else
        u.device_group = std::to_string(st.st_gid);
      auto d = ops_.uffd_device(dev);
      if (d) {
        u.device_ok = true;
        u.features |= *d;
      } else {
        u.device_errno = d.error().code;
      }
    } else if (errno != ENOENT) {
      problem(make_error(errno, "stat {}: {}", dev, std::strerror(errno)));
    }
    u.unprivileged_sysctl = read_int(proc("sys/vm/unprivileged_userfaultfd"));
  }

  void probe_io_uring() {
    auto& io = caps_.io_uring;
    io.disabled_sysctl = read_int(proc("sys/kernel/io_uring_disabled"));
    auto s = ops_.io_uring_setup();
    io.setup_ok = s.ok();
    if (!s) io.setup_errno = s.error().code;
  }

  void probe_psi() {
    auto& p = caps_.psi;
    const std::string file = proc("pressure/memory");
    p.file_exists = sys::stat_path(file).ok();
    if (p.file_exists) {
      auto text = ops_.read_file(file);
      if (!text) {
        p.read_errno = text.error().code;
      } else if (auto parsed = sys::parse_psi(*text, file); !parsed) {
        p.read_errno = parsed.error().code;
        problem(parsed.error());
      } else {
        p.readable = true;
      }
    } else {
      p.read_errno = ENOENT;
    }
    if (p.readable) {
      auto t = ops_.psi_trigger(file);
      p.trigger_ok = t.ok();
      if (!t) p.trigger_errno = t.error().code;
    }
    std::istringstream in(cmdline_);
    std::string word;
    // The kernel takes the last psi= it sees.
    while (in >> word)
      if (word.starts_with("psi=")) p.cmdline_psi = parse_kernel_bool(std::string_view(word).substr(4));
  }

  void probe_memcg() {
    auto& m = caps_.memcg;
    for (const auto& e : mounts_) {
      if (e.fstype == "cgroup" && m.v1_mount.empty() && has_word(e.super_options, "memory", ','))
        m.v1_mount = e.mount_point;
      if (e.fstype == "cgroup2" && m.v2_mount.empty()) {
        auto ctl = read_optional(in_tree(e.mount_point) + "/cgroup.controllers");
        if (ctl && has_word(*ctl, "memory", ' ')) m.v2_mount = e.mount_point;
      }
    }
    std::istringstream in(cmdline_);
    std::string word;
    while (in >> word)
      if (word.starts_with("cgroup_disable=") && has_word(word.substr(15), "memory", ',')) m.cmdline_disabled = true;
  }

  void probe_numa() {
    const std::string dir = sys("devices/system/node");
    const auto names = sys::list_dir(dir);
    if (!names) {
      const int e = names.error().code;
      if (e != ENOENT) problem(make_error(e, "cannot list {}: {}", dir, std::strerror(e)));
      return;
    }
    for (const std::string& entry : *names) {
      const std::string_view name(entry);
      if (name.size() > 4 && name.starts_with("node") &&
          name.find_first_not_of("0123456789", 4) == std::string_view::npos)
        ++caps_.numa_nodes;
    }
  }

  void probe_thp() {
    if (auto e = read_optional(sys("kernel/mm/transparent_hugepage/enabled"))) caps_.thp.enabled = bracketed(*e);
    if (auto s = read_optional(sys("kernel/mm/transparent_hugepage/shmem_enabled")))
      caps_.thp.shmem_enabled = bracketed(*s);
  }

  void probe_odirect() {
    if (paths_.odirect_path.empty()) return;
    caps_.odirect.path = paths_.odirect_path;
    auto s = ops_.open_direct(paths_.odirect_path);
    caps_.odirect.ok = s.ok();
    if (!s) {
      caps_.odirect.err = s.error().code;
      if (s.error().code != EINVAL) problem(s.error());
    }
  }

  const ProbePaths& paths_;
  const KernelOps& ops_;
  Capabilities caps_;
  std::vector<MountEntry> mounts_;
  std::string cmdline_;
};

}  // namespace

Capabilities probe(const ProbePaths& paths, const KernelOps& ops) { return Prober(paths, ops).run(); }

}  // namespace airs::probe
