// SPDX-License-Identifier: Apache-2.0
#include "probe/mode.hpp"

#include <cstring>

#include <fmt/format.h>

#include "sys/uffd.hpp"
#include "util/units.hpp"

namespace airs::probe {
namespace {

constexpr const char* kKernelRecipe = "(see docs/raspberry-pi-kernel.md; config/kernel/airs.config)";
constexpr uint64_t kFullFeatures = UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS;
constexpr uint64_t kSmallPagesFeatures = UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_MINOR_SHMEM;

struct Missing {
  std::string topic;
  std::string what;
};

std::string uffd_failure(const UffdCaps& u) {
  std::string out = fmt::format("userfaultfd(2): {}", std::strerror(u.syscall_errno));
  out += u.device_exists ? fmt::format("; /dev/userfaultfd: {}", std::strerror(u.device_errno))
                         : std::string("; no /dev/userfaultfd");
  return out;
}

std::vector<Missing> missing(const Capabilities& c, Mode mode) {
  std::vector<Missing> out;
  if (mode == Mode::Cooperative) return out;
  const uint64_t need = mode == Mode::Full ? kFullFeatures : kSmallPagesFeatures;
  if (!c.uffd.usable())
    out.push_back({"userfaultfd", fmt::format("userfaultfd ({})", uffd_failure(c.uffd))});
  else if (!c.uffd.has(need))
    out.push_back({"userfaultfd", fmt::format("userfaultfd features {} (kernel offers {})",
                                              uffd_feature_names(need & ~c.uffd.features),
                                              uffd_feature_names(c.uffd.features))});
  if (mode == Mode::Full) {
    if (!c.hugetlbfs.in_filesystems)
      out.push_back({"hugetlbfs", "hugetlbfs (not in /proc/filesystems)"});
    else if (c.hugetlbfs.sizes.empty())
      out.push_back({"hugetlbfs", "huge page sizes (none under /sys/kernel/mm/hugepages)"});
  }
  return out;
}

std::string join(const std::vector<Missing>& m) {
  std::string out;
  for (const auto& x : m) out += (out.empty() ? "" : ", ") + x.what;
  return out;
}

std::string size_list(const HugetlbfsCaps& h) {
  std::string out;
  for (const auto& s : h.sizes) out += (out.empty() ? "" : ", ") + format_bytes(s.bytes);
  return out;
}

Mode best_mode(const Capabilities& c) {
  if (missing(c, Mode::Full).empty()) return Mode::Full;
  if (missing(c, Mode::SmallPages).empty()) return Mode::SmallPages;
  return Mode::Cooperative;
}

std::string auto_reason(const Capabilities& c, Mode m) {
  switch (m) {
    case Mode::Full:
      return fmt::format("full: hugetlbfs ({} pages) and userfaultfd with MINOR_HUGETLBFS", size_list(c.hugetlbfs));
    case Mode::SmallPages:
      return fmt::format("small-pages: userfaultfd with MINOR_SHMEM; full needs {}", join(missing(c, Mode::Full)));
    case Mode::Cooperative:
      break;
  }
  return fmt::format("cooperative: lazy loading needs {}", join(missing(c, Mode::SmallPages)));
}

void add(std::vector<Advice>& out, const char* topic, std::string text) { out.push_back({topic, std::move(text)}); }

void advise_uffd(const Capabilities& c, std::vector<Advice>& out) {
  const auto& u = c.uffd;
  if (!u.usable()) {
    if (u.syscall_errno == ENOSYS && !u.device_exists)
      add(out, "userfaultfd", fmt::format("no userfaultfd: build the kernel with CONFIG_USERFAULTFD=y {}", kKernelRecipe));
    else
      add(out, "userfaultfd",
          fmt::format("userfaultfd refused ({}): run airs-memd as root, install the udev rule (group airs on "
                      "/dev/userfaultfd) or set vm.unprivileged_userfaultfd=1",
                      uffd_failure(u)));
    return;
  }
  if (!u.open_to_clients())
    add(out, "userfaultfd",
        "userfaultfd needs privilege: install the udev rule (group airs on /dev/userfaultfd: "
        "KERNEL==\"userfaultfd\", GROUP=\"airs\", MODE=\"0660\" in /etc/udev/rules.d/60-airs-userfaultfd.rules) "
        "or set vm.unprivileged_userfaultfd=1; until then only root clients can map models lazily");
  if (c.hugetlbfs.available() && !u.has(kFullFeatures))
    add(out, "userfaultfd", "userfaultfd lacks MINOR_HUGETLBFS: full mode needs Linux 5.13 or later");
  if (!u.has(kSmallPagesFeatures))
    add(out, "userfaultfd", "userfaultfd lacks MINOR_SHMEM: small-pages mode needs Linux 5.14 or later");
  if (!u.has(UFFD_FEATURE_POISON))
    add(out, "userfaultfd",
        "userfaultfd lacks POISON: a failed model read cannot reach lazy clients as SIGBUS; use Linux 6.6 or later");
}

void advise_hugetlbfs(const Capabilities& c, std::vector<Advice>& out) {
  const auto& h = c.hugetlbfs;
  if (!h.in_filesystems) {
    add(out, "hugetlbfs",
        fmt::format("no hugetlbfs: build the kernel with CONFIG_HUGETLBFS=y and CONFIG_HUGETLB_PAGE=y {}",
                    kKernelRecipe));
    return;
  }
  if (h.sizes.empty()) {
    add(out, "hugetlbfs", "hugetlbfs has no page sizes under /sys/kernel/mm/hugepages: check CONFIG_HUGETLB_PAGE");
    return;
  }
  if (h.reserved_pages() == 0)
    add(out, "hugetlbfs",
        fmt::format("no huge pages reserved: vm.nr_hugepages=N or hugepages=N on the kernel command line "
                    "(N = pool size / {})",
                    format_bytes(h.default_size != 0 ? h.default_size : h.sizes.front().bytes)));
  if (h.mounts.empty()) add(out, "hugetlbfs", "no hugetlbfs mount: systemctl enable --now dev-hugepages.mount");
}

void advise_io_uring(const Capabilities& c, std::vector<Advice>& out) {
  const auto& io = c.io_uring;
  if (io.disabled_sysctl == 2) {
    add(out, "io_uring", "io_uring disabled by kernel.io_uring_disabled=2: set it to 0");
    return;
  }
  if (io.setup_ok) return;
  if (io.disabled_sysctl == 1)
    add(out, "io_uring",
        "io_uring restricted by kernel.io_uring_disabled=1: set it to 0 or put airs-memd's group in "
        "kernel.io_uring_group");
  else if (io.setup_errno == ENOSYS)
    add(out, "io_uring", fmt::format("no io_uring: build the kernel with CONFIG_IO_URING=y {}", kKernelRecipe));
  else
    add(out, "io_uring",
        fmt::format("io_uring_setup fails: {} (a seccomp filter or container policy blocks it?)",
                    std::strerror(io.setup_errno)));
}

void advise_psi(const Capabilities& c, std::vector<Advice>& out) {
  const auto& p = c.psi;
  if (!p.readable) {
    if (p.cmdline_psi == true)
      add(out, "psi", fmt::format("no PSI although psi=1 is set: build the kernel with CONFIG_PSI=y {}", kKernelRecipe));
    else
      add(out, "psi", "PSI is off: add psi=1 to /boot/firmware/cmdline.txt (Raspberry Pi OS) or the kernel command line");
    return;
  }
  if (!p.trigger_ok)
    add(out, "psi",
        fmt::format("PSI triggers refused on /proc/pressure/memory: {}{}", std::strerror(p.trigger_errno),
                    p.trigger_errno == EACCES || p.trigger_errno == EPERM ? ": run airs-memd as root" : ""));
}

void advise_rest(const Capabilities& c, std::vector<Advice>& out) {
  if (!c.memcg.available())
    add(out, "memcg",
        c.memcg.cmdline_disabled
            ? std::string("no memory cgroup: remove cgroup_disable=memory from /boot/firmware/cmdline.txt "
                          "(Raspberry Pi OS) or the kernel command line")
            : std::string("no memory cgroup controller: add cgroup_enable=memory to /boot/firmware/cmdline.txt "
                          "(Raspberry Pi OS) or the kernel command line; the kernel needs CONFIG_MEMCG=y"));
  if (!c.thp.available())
    add(out, "thp",
        fmt::format("no transparent huge pages: build the kernel with CONFIG_TRANSPARENT_HUGEPAGE=y {}", kKernelRecipe));
  if (!c.odirect.path.empty() && !c.odirect.ok)
    add(out, "odirect",
        c.odirect.err == EINVAL
            ? fmt::format("no O_DIRECT on the file system of {}: model reads go through the page cache; "
                          "keep models on ext4, xfs or btrfs",
                          c.odirect.path)
            : fmt::format("O_DIRECT probe on {} failed: {}", c.odirect.path, std::strerror(c.odirect.err)));
}

}  // namespace

const char* to_string(Mode m) {
  switch (m) {
    case Mode::Full:
      return "full";
    case Mode::SmallPages:
      return "small-pages";
    case Mode::Cooperative:
      return "cooperative";
  }
  return "?";
}

std::vector<Advice> advise(const Capabilities& caps) {
  std::vector<Advice> out;
  advise_uffd(caps, out);
  advise_hugetlbfs(caps, out);
  advise_io_uring(caps, out);
  advise_psi(caps, out);
  advise_rest(caps, out);
  return out;
}

std::vector<std::string> missing_for(const Capabilities& caps, Mode mode) {
  std::vector<std::string> out;
  for (auto& m : missing(caps, mode)) out.push_back(std::move(m.what));
  return out;
}

Result<ModeChoice> choose_mode(const Capabilities& caps, std::string_view forced) {
  ModeChoice choice;
  choice.advice = advise(caps);
  const Mode best = best_mode(caps);
  if (forced == "auto") {
    choice.mode = best;
    choice.reason = auto_reason(caps, best);
    return choice;
  }
  Mode m{};
  if (forced == "full") m = Mode::Full;
  else if (forced == "small-pages") m = Mode::SmallPages;
  else if (forced == "cooperative") m = Mode::Cooperative;
  else
    return make_error(EINVAL, "models.mode = '{}' is not a mode: use auto, full, small-pages or cooperative", forced);

  const auto miss = missing(caps, m);
  if (!miss.empty()) {
    std::string how;
    for (const auto& a : choice.advice)
      for (const auto& x : miss)
        if (a.topic == x.topic) {
          how += "; " + a.text;
          break;
        }
    return make_error(EOPNOTSUPP, "models.mode = {} cannot run on this kernel: missing {}{}; or set models.mode = auto "
                      "(would choose {})",
                      to_string(m), join(miss), how, to_string(best));
  }
  choice.mode = m;
  choice.reason = m == best ? fmt::format("{}: forced by models.mode (auto agrees)", to_string(m))
                            : fmt::format("{}: forced by models.mode (auto would choose {})", to_string(m),
                                          to_string(best));
  return choice;
}

std::map<std::string, std::string> to_key_values(const ModeChoice& choice) {
  std::map<std::string, std::string> kv;
  kv["mode"] = to_string(choice.mode);
  kv["mode.reason"] = choice.reason;
  for (const auto& a : choice.advice) {
    auto& v = kv["advice." + a.topic];
    v += (v.empty() ? "" : "; ") + a.text;
  }
  return kv;
}

}  // namespace airs::probe
