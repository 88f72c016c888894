// SPDX-License-Identifier: Apache-2.0
// Capabilities in words (the start-up log) and as keys (airsctl status).
#include <cstring>

#include <fmt/format.h>

#include "probe/capabilities.hpp"
#include "sys/uffd.hpp"
#include "util/units.hpp"

namespace airs::probe {
namespace {

const char* yes_no(bool b) { return b ? "yes" : "no"; }

// "ENOSYS (Function not implemented)"-style text without depending on the
// errno name table: strerror is what users search for.
std::string err_text(int e) { return e == 0 ? std::string("ok") : std::string(std::strerror(e)); }

std::string join_sizes(const std::vector<HugePageSizeInfo>& sizes) {
  std::string out;
  for (const auto& s : sizes) out += (out.empty() ? "" : ",") + format_bytes(s.bytes);
  return out;
}

std::string optional_int(const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("absent"); }

}  // namespace

uint64_t HugetlbfsCaps::reserved_pages() const {
  uint64_t n = 0;
  for (const auto& s : sizes) n += s.nr;
  return n;
}

bool UffdCaps::open_to_clients() const {
  if (unprivileged_sysctl.value_or(0) == 1) return true;
  if (!device_exists) return false;
  const bool others_rw = (device_mode & 006) == 006;
  const bool group_rw = (device_mode & 060) == 060 && device_group != "root" && device_group != "0";
  return others_rw || group_rw;
}

std::string uffd_feature_names(uint64_t features) {
  static constexpr std::pair<uint64_t, const char*> kNames[] = {
      {UFFD_FEATURE_MISSING_HUGETLBFS, "MISSING_HUGETLBFS"}, {UFFD_FEATURE_MISSING_SHMEM, "MISSING_SHMEM"},
      {UFFD_FEATURE_MINOR_HUGETLBFS, "MINOR_HUGETLBFS"},     {UFFD_FEATURE_MINOR_SHMEM, "MINOR_SHMEM"},
      {UFFD_FEATURE_THREAD_ID, "THREAD_ID"},                 {UFFD_FEATURE_EVENT_UNMAP, "EVENT_UNMAP"},
      {UFFD_FEATURE_POISON, "POISON"},
  };
  std::string out;
  for (const auto& [bit, name] : kNames)
    if ((features & bit) == bit) out += (out.empty() ? "" : " ") + std::string(name);
  return out;
}

std::string format_report(const Capabilities& c) {
  std::string out = fmt::format("kernel       {}, base page {}", c.kernel_release.empty() ? "?" : c.kernel_release,
                                format_bytes(c.base_page_size));

  const auto& h = c.hugetlbfs;
  if (h.available()) {
    std::string sizes;
    for (const auto& s : h.sizes)
      sizes += fmt::format("{}{} ({} reserved, {} free)", sizes.empty() ? "" : ", ", format_bytes(s.bytes), s.nr,
                           s.free);
    std::string mounts;
    for (const auto& m : h.mounts) mounts += fmt::format("{}{} ({})", mounts.empty() ? "" : ", ", m.path,
                                                         format_bytes(m.page_size));
    out += fmt::format("\nhugetlbfs    yes: {}; default {}; mounted at {}", sizes, format_bytes(h.default_size),
                       mounts.empty() ? std::string("nowhere") : mounts);
  } else {
    out += fmt::format("\nhugetlbfs    no: {}in /proc/filesystems, {} page sizes", h.in_filesystems ? "" : "not ",
                       h.sizes.size());
  }

  const auto& u = c.uffd;
  std::string dev = u.device_exists
                        ? fmt::format("/dev/userfaultfd {:04o} group {}: {}", u.device_mode, u.device_group,
                                      err_text(u.device_errno))
                        : std::string("no /dev/userfaultfd");
  out += fmt::format("\nuserfaultfd  {}: userfaultfd(2): {}; {}; vm.unprivileged_userfaultfd={}; clients: {}",
                     yes_no(u.usable()), err_text(u.syscall_errno), dev, optional_int(u.unprivileged_sysctl),
                     u.open_to_clients() ? "any user" : "privileged only");
  if (u.usable()) out += fmt::format("; features {:#x} ({})", u.features, uffd_feature_names(u.features));

  out += fmt::format("\nio_uring     {}: io_uring_setup: {}; kernel.io_uring_disabled={}", yes_no(c.io_uring.setup_ok),
                     err_text(c.io_uring.setup_errno), optional_int(c.io_uring.disabled_sysctl));

  const auto& p = c.psi;
  out += fmt::format("\nPSI          {}: /proc/pressure/memory {}; triggers: {}; cmdline psi={}", yes_no(p.available()),
                     p.readable ? std::string("readable") : err_text(p.read_errno),
                     p.readable ? err_text(p.trigger_errno) : std::string("not tried"),
                     p.cmdline_psi ? (*p.cmdline_psi ? "1" : "0") : "absent");

  const auto& m = c.memcg;
  out += fmt::format("\nmemcg        {}", yes_no(m.available()));
  if (!m.v1_mount.empty()) out += fmt::format(": cgroup v1 at {}", m.v1_mount);
  if (!m.v2_mount.empty()) out += fmt::format("{} cgroup2 at {}", m.v1_mount.empty() ? ":" : ",", m.v2_mount);
  if (m.cmdline_disabled) out += " (cgroup_disable=memory on the command line)";

  out += fmt::format("\nNUMA         {} node{}", c.numa_nodes, c.numa_nodes == 1 ? "" : "s");
  out += c.thp.available() ? fmt::format("\nTHP          {} (shmem {})", c.thp.enabled,
                                         c.thp.shmem_enabled.empty() ? "?" : c.thp.shmem_enabled)
                           : std::string("\nTHP          no");
  if (!c.odirect.path.empty())
    out += fmt::format("\nO_DIRECT     {} on {}{}", yes_no(c.odirect.ok), c.odirect.path,
                       c.odirect.ok ? "" : ": " + err_text(c.odirect.err));
  for (const auto& pr : c.problems) out += "\nproblem      " + pr;
  return out;
}

std::map<std::string, std::string> to_key_values(const Capabilities& c) {
  std::map<std::string, std::string> kv;
  kv["kernel"] = c.kernel_release;
  kv["page_size"] = std::to_string(c.base_page_size);
  kv["hugetlbfs"] = yes_no(c.hugetlbfs.available());
  kv["hugetlbfs.sizes"] = join_sizes(c.hugetlbfs.sizes);
  kv["hugetlbfs.default_size"] = std::to_string(c.hugetlbfs.default_size);
  kv["hugetlbfs.reserved_pages"] = std::to_string(c.hugetlbfs.reserved_pages());
  std::string mounts;
  for (const auto& m : c.hugetlbfs.mounts) mounts += (mounts.empty() ? "" : ",") + m.path;
  kv["hugetlbfs.mounts"] = mounts;
  kv["userfaultfd"] = yes_no(c.uffd.usable());
  kv["userfaultfd.features"] = fmt::format("{:#x}", c.uffd.features);
  kv["userfaultfd.clients"] = c.uffd.open_to_clients() ? "any user" : "privileged only";
  kv["io_uring"] = yes_no(c.io_uring.setup_ok);
  kv["io_uring.disabled"] = optional_int(c.io_uring.disabled_sysctl);
  kv["psi"] = yes_no(c.psi.readable);
  kv["psi.triggers"] = yes_no(c.psi.trigger_ok);
  kv["memcg"] = yes_no(c.memcg.available());
  kv["numa.nodes"] = std::to_string(c.numa_nodes);
  kv["thp"] = c.thp.available() ? c.thp.enabled : "no";
  kv["odirect"] = c.odirect.path.empty() ? "not probed" : yes_no(c.odirect.ok);
  return kv;
}

}  // namespace airs::probe
