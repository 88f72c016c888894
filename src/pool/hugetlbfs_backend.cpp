// SPDX-License-Identifier: Apache-2.0
#include "pool/hugetlbfs_backend.hpp"

#include <sys/mman.h>

#include "pool/accounting.hpp"
#include "sys/procfs.hpp"
#include "sys/uffd.hpp"
#include "util/units.hpp"

namespace airs::pool {

Result<std::unique_ptr<HugetlbfsBackend>> HugetlbfsBackend::create(HugetlbfsOptions opts) {
  auto b = std::unique_ptr<HugetlbfsBackend>(new HugetlbfsBackend());
  auto def = sys::default_huge_page_size(opts.meminfo);
  if (!def) return std::move(def).error();
  const uint64_t ps = opts.page_size != 0 ? opts.page_size : *def;
  if (ps == 0)
    return make_error(ENOTSUP, "pool: the kernel reports no huge page size (Hugepagesize missing from {}): "
                               "it needs CONFIG_HUGETLBFS, or use the shmem backend", opts.meminfo);
  auto sizes = sys::read_hugepage_sizes(opts.sysfs_dir);
  if (!sizes) return std::move(sizes).error();
  bool found = false;
  std::string offered;
  for (const auto& s : *sizes) {
    found = found || s.bytes == ps;
    offered += (offered.empty() ? "" : ", ") + format_bytes(s.bytes);
  }
  if (!found)
    return make_error(EINVAL, "pool: huge page size {} is not offered by this kernel (it offers: {})", format_bytes(ps),
                      offered.empty() ? "none" : offered);
  b->page_size_ = ps;
  b->is_default_size_ = ps == *def;
  if (!opts.mount_path.empty()) {
    b->mount_ = opts.mount_path;
  } else {
    auto m = sys::find_hugetlbfs_mount(ps, *def, opts.mountinfo);
    if (!m) return std::move(m).error();
    if (*m) b->mount_ = **m;
  }
  // Checked once here (a node that is not online is a configuration error)
  // and kept resolved, so every later mbind names the same nodes.
  auto nodes = sys::resolve_numa_nodes(opts.numa_policy, opts.numa_nodes, opts.node_dir + "/has_memory");
  if (!nodes) return std::move(nodes).error();
  opts.numa_nodes = std::move(nodes).value();
  b->opts_ = std::move(opts);
  return b;
}

uint64_t HugetlbfsBackend::uffd_features() const {
  return UFFD_FEATURE_MISSING_HUGETLBFS | UFFD_FEATURE_MINOR_HUGETLBFS;
}

Result<sys::UniqueFd> HugetlbfsBackend::create_file(const std::string& name, uint64_t size, FileSize /*kind*/) {
  auto fd = sys::create_hugetlb_file(mount_, page_size_, name);
  if (!fd) return std::move(fd).error();
  AIRS_TRY(sys::resize_file(fd->get(), size, name));
  return std::move(fd).value();
}

Status HugetlbfsBackend::populate(int fd, uint64_t offset, uint64_t len, const std::string& what) {
  // fallocate has no mapping whose policy could apply: use the thread's.
  auto policy = sys::ScopedThreadPolicy::apply(opts_.numa_policy, opts_.numa_nodes);
  if (!policy) return make_error(policy.error().code, "{}: {}", what, policy.error().message);
  return sys::allocate_range(fd, offset, len, what);
}

Status HugetlbfsBackend::release(int fd, uint64_t offset, uint64_t len, const std::string& what) {
  return sys::punch_range(fd, offset, len, what);
}

Result<sys::Mapping> HugetlbfsBackend::map_region(int fd, uint64_t len, const std::string& what, bool reserve) {
  auto m = sys::map_shared(fd, len, PROT_READ | PROT_WRITE, reserve ? 0 : MAP_NORESERVE, what);
  if (!m) return std::move(m).error();
  // Before the first touch, so every fill lands on the policy's nodes.
  AIRS_TRY(sys::numa_bind_range(m->get(), len, opts_.numa_policy, opts_.numa_nodes, what));
  return std::move(m).value();
}

std::string HugetlbfsBackend::size_dir() const {
  return opts_.sysfs_dir + "/hugepages-" + std::to_string(page_size_ / 1024) + "kB";
}

Result<uint64_t> HugetlbfsBackend::kernel_available_pages() {
  auto v = kernel_view();
  if (!v) return std::move(v).error();
  return v->free >= v->reserved ? v->free - v->reserved : 0;
}

Result<KernelView> HugetlbfsBackend::kernel_view() {
  KernelView v;
  v.page_size = page_size_;
  const std::string d = size_dir();
  auto rd = [&](const char* f) { return sys::read_u64_file(d + "/" + f); };
  auto nr = rd("nr_hugepages");
  if (!nr) return std::move(nr).error();
  auto fr = rd("free_hugepages");
  if (!fr) return std::move(fr).error();
  auto rs = rd("resv_hugepages");
  if (!rs) return std::move(rs).error();
  auto sp = rd("surplus_hugepages");
  if (!sp) return std::move(sp).error();
  v.total = *nr;
  v.free = *fr;
  v.reserved = *rs;
  v.surplus = *sp;
  auto nodes = sys::read_node_huge_pages(page_size_, opts_.node_dir);
  if (!nodes) return std::move(nodes).error();
  v.nodes = std::move(nodes).value();
  if (!mount_.empty()) {
    auto u = sys::fs_usage(mount_);
    if (u && u->blocks != 0) v.mount = *u;
  }
  return v;
}

Result<int64_t> HugetlbfsBackend::adjust_kernel_pages(int64_t delta) {
  const std::string path = size_dir() + "/nr_hugepages";
  auto before = sys::read_u64_file(path);
  if (!before) return std::move(before).error();
  const int64_t target = std::max<int64_t>(0, static_cast<int64_t>(*before) + delta);
  AIRS_TRY(sys::write_text_file(path, std::to_string(target)));
  auto after = sys::read_u64_file(path);
  if (!after) return std::move(after).error();
  return static_cast<int64_t>(*after) - static_cast<int64_t>(*before);
}

std::string HugetlbfsBackend::advice(uint64_t needed) {
  auto nr = sys::read_u64_file(size_dir() + "/nr_hugepages");
  auto avail = kernel_available_pages();
  const uint64_t n = nr_hugepages_for(nr ? *nr : 0, avail ? *avail : 0, needed);
  if (is_default_size_)
    return fmt::format("raise the huge page pool: `sysctl -w vm.nr_hugepages={0}` (persist it with "
                       "`echo vm.nr_hugepages={0} > /etc/sysctl.d/90-airs-memd.conf`), or boot with "
                       "`hugepages={0}` on the kernel command line (cmdline.txt on Raspberry Pi OS) so the "
                       "pages are reserved before memory fragments; or enable grow_nr_hugepages",
                       n);
  return fmt::format("raise the {0} huge page pool: `echo {1} > {2}/nr_hugepages`, or boot with "
                     "`hugepagesz={3} hugepages={1}` on the kernel command line (cmdline.txt on Raspberry Pi OS)",
                     format_bytes(page_size_), n, size_dir(), page_size_ >= kGiB ? std::to_string(page_size_ / kGiB) + "G"
                                                                                 : std::to_string(page_size_ / kMiB) + "M");
}

}  // namespace airs::pool
