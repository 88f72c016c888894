// SPDX-License-Identifier: Apache-2.0
#include "pool/shmem_backend.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/userfaultfd.h>
#include <sys/mman.h>
#include <sys/vfs.h>

#include <algorithm>

#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/procfs.hpp"
#include "sys/shmem.hpp"
#include "util/units.hpp"

namespace airs::pool {

Result<std::unique_ptr<ShmemBackend>> ShmemBackend::create(ShmemOptions opts) {
  const uint64_t base = sys::base_page_size();
  uint64_t unit = opts.unit;
  if (unit == 0) unit = *round_up(2 * kMiB, base);
  if (unit % base != 0)
    return make_error(EINVAL, "pool: shmem unit {} is not a multiple of the base page size {} (sysconf(_SC_PAGESIZE))",
                      unit, base);
  auto b = std::unique_ptr<ShmemBackend>(new ShmemBackend());
  b->unit_ = unit;
  // Checked once here (a node that is not online is a configuration error)
  // and kept resolved, so every later mbind names the same nodes.
  auto nodes = sys::resolve_numa_nodes(opts.numa_policy, opts.numa_nodes);
  if (!nodes) return std::move(nodes).error();
  opts.numa_nodes = std::move(nodes).value();
  b->opts_ = std::move(opts);
  b->init_huge_folios();
  return b;
}

void ShmemBackend::init_huge_folios() {
  if (!opts_.huge_folios) {
    huge_note_ = "shmem files: memfds of base pages (huge folios off)";
    return;
  }
  const uint64_t pmd = sys::thp_pmd_size();
  std::string why;
  if (pmd == 0) {
    why = "the kernel has no transparent huge pages";
  } else if (unit_ % pmd != 0) {
    why = fmt::format("the unit {} is not a multiple of the {} transparent huge page (a folio would span units)",
                      format_bytes(unit_), format_bytes(pmd));
  } else {
    // The directory first (a daemon that may not mount is given one), then
    // a mount of our own; each must give huge folios to be used.
    auto usable = [&](sys::UniqueFd fd, const std::string& what) {
      auto huge = sys::tmpfs_gives_huge_folios(fd.get(), pmd);
      if (huge && *huge) {
        huge_mount_ = std::move(fd);
        // A directory passed over is named with its reason.
        huge_note_ = fmt::format("shmem files: {} files in {} huge folios{}", what, format_bytes(pmd),
                                 why.empty() ? "" : " (not " + why + ")");
        return true;
      }
      why += fmt::format("{}{}: {}", why.empty() ? "" : "; ", what,
                         huge ? "base pages only (transparent_hugepage/shmem_enabled is \"" +
                                    sys::thp_shmem_enabled() + "\")"
                              : huge.error().message);
      return false;
    };
    if (!opts_.huge_dir.empty()) {
      auto dir = sys::open_file(opts_.huge_dir, O_RDONLY | O_DIRECTORY);
      if (!dir) {
        why = dir.error().message;
      } else if (auto fs = sys::fs_type_of(dir->get(), opts_.huge_dir); !fs || *fs != TMPFS_MAGIC) {
        why = fmt::format("{} is not a tmpfs", opts_.huge_dir);
      } else if (usable(std::move(dir).value(), "tmpfs " + opts_.huge_dir)) {
        return;
      }
    }
    if (auto m = sys::mount_huge_tmpfs(); !m)
      why += (why.empty() ? "" : "; ") + m.error().message;
    else if (usable(std::move(m).value(), "a private tmpfs (huge=within_size)"))
      return;
  }
  huge_note_ = "shmem files: memfds of base pages (no huge folios: " + why + ")";
}

ShmemBackend::~ShmemBackend() = default;

uint64_t ShmemBackend::uffd_features() const { return UFFD_FEATURE_MISSING_SHMEM | UFFD_FEATURE_MINOR_SHMEM; }

Result<sys::UniqueFd> ShmemBackend::create_file(const std::string& name, uint64_t size, FileSize kind) {
  if (!huge_mount_) return sys::create_shmem_file(name, size, kind == FileSize::Fixed);
  auto fd = sys::create_tmpfs_file(huge_mount_.get(), name);
  if (!fd) return std::move(fd).error();
  AIRS_TRY(sys::resize_file(fd->get(), size, name));
  return std::move(fd).value();
}

Result<sys::UniqueFd> ShmemBackend::create_base_page_file(const std::string& name, uint64_t size) {
  return sys::create_shmem_file(name, size, true);
}

Result<std::byte*> ShmemBackend::pin_map(int fd, uint64_t end, const std::string& what) {
  auto id = sys::inode_key(fd);
  if (!id) return std::move(id).error();
  auto it = maps_.find(*id);
  if (it != maps_.end() && it->second.size() >= end) return it->second.bytes();
  auto size = sys::file_size(fd);
  if (!size) return std::move(size).error();
  if (*size < end) return make_error(EINVAL, "{}: range end {} lies past the {}-byte file", what, end, *size);
  if (it != maps_.end())
    return make_error(EINVAL, "{}: the file grew after it was first populated; the pool never resizes files", what);
  auto m = sys::map_shared(fd, *size, PROT_READ | PROT_WRITE, 0, what + " (pin mapping)");
  if (!m) return std::move(m).error();
  AIRS_TRY(sys::numa_bind_range(m->get(), *size, opts_.numa_policy, opts_.numa_nodes, what + " (pin mapping)"));
  std::byte* p = m->bytes();
  maps_.emplace(*id, std::move(m).value());
  return p;
}

Status ShmemBackend::populate(int fd, uint64_t offset, uint64_t len, const std::string& what) {
  auto base = pin_map(fd, offset + len, what);
  if (!base) return std::move(base).error();
  {
    // The file's shared policy (set through pin_map's mbind) places these
    // pages; the thread's is the fallback should the file have none.
    auto policy = sys::ScopedThreadPolicy::apply(opts_.numa_policy, opts_.numa_nodes);
    if (!policy) return make_error(policy.error().code, "{}: {}", what, policy.error().message);
    AIRS_TRY(sys::allocate_range(fd, offset, len, what));
  }
  if (auto st = sys::lock_range(*base + offset, len, what); !st) {
    (void)sys::punch_range(fd, offset, len, what);
    return st;
  }
  return {};
}

Status ShmemBackend::release(int fd, uint64_t offset, uint64_t len, const std::string& what) {
  auto id = sys::inode_key(fd);
  if (!id) return std::move(id).error();
  if (auto it = maps_.find(*id); it != maps_.end() && offset + len <= it->second.size())
    AIRS_TRY(sys::unlock_range(it->second.bytes() + offset, len, what));
  // Model regions are locked in the daemon's region mapping; the pool drops
  // it (and with it the lock) before it punches. The punch frees the pages
  // whoever else still maps them.
  return sys::punch_range(fd, offset, len, what);
}

Result<sys::Mapping> ShmemBackend::map_region(int fd, uint64_t len, const std::string& what, bool /*reserve*/) {
  auto m = sys::map_shared(fd, len, PROT_READ | PROT_WRITE, 0, what);
  if (!m) return std::move(m).error();
  AIRS_TRY(sys::numa_bind_range(m->get(), len, opts_.numa_policy, opts_.numa_nodes, what));
  locked_on_fault_.erase(m->bytes());
  // A failure is not fatal here: pin() then locks unit by unit and reports
  // the limit once a unit is filled (the model's pin_failed).
  if (sys::lock_range_on_fault(m->bytes(), len, what)) locked_on_fault_.insert(m->bytes());
  return std::move(m).value();
}

Status ShmemBackend::pin(int fd, std::byte* map, uint64_t offset, uint64_t len, uint64_t written,
                         const std::string& what) {
  const bool on_fault = locked_on_fault_.contains(map);
  // The page holding the last written byte is present (the write reached
  // it); from the next page on nothing was touched.
  const uint64_t present = std::min(len, *round_up(std::min(written, len), sys::base_page_size()));
  if (on_fault && present == len) return {};
  if (present < len) {
    auto policy = sys::ScopedThreadPolicy::apply(opts_.numa_policy, opts_.numa_nodes);
    if (!policy) return make_error(policy.error().code, "{}: {}", what, policy.error().message);
    AIRS_TRY(sys::allocate_range(fd, offset + present, len - present, what));
  }
  // Locked on fault: only the pages allocated just now, which no fault
  // brought into the mapping, need a lock (and with it their mapping).
  const uint64_t from = on_fault ? present : 0;
  return sys::lock_range(map + offset + from, len - from, what);
}

void ShmemBackend::forget_file(int fd) {
  auto id = sys::inode_key(fd);
  if (id) maps_.erase(*id);
}

Result<uint64_t> ShmemBackend::kernel_available_pages() {
  auto mi = sys::read_meminfo(opts_.meminfo);
  if (!mi) return std::move(mi).error();
  auto it = mi->find("MemAvailable");
  if (it == mi->end()) return make_error(ENOENT, "pool: {} has no MemAvailable line", opts_.meminfo);
  // RLIMIT_MEMLOCK is not applied here: with CAP_IPC_LOCK it does not
  // bind, and populate's mlock reports it with the fix when it does.
  return it->second / unit_;
}

Result<KernelView> ShmemBackend::kernel_view() {
  auto mi = sys::read_meminfo(opts_.meminfo);
  if (!mi) return std::move(mi).error();
  auto get = [&](const char* k) -> uint64_t {
    auto it = mi->find(k);
    return it == mi->end() ? 0 : it->second;
  };
  KernelView v;
  v.page_size = unit_;
  v.total = get("MemTotal") / unit_;
  v.free = get("MemAvailable") / unit_;
  v.shmem_bytes = get("Shmem");
  v.mlocked_bytes = get("Mlocked");
  v.unevictable_bytes = get("Unevictable");
  return v;
}

Result<int64_t> ShmemBackend::adjust_kernel_pages(int64_t /*delta*/) { return int64_t{0}; }

std::string ShmemBackend::advice(uint64_t needed) {
  const uint64_t lim = sys::memlock_limit();
  return fmt::format("the shmem pool needs {} ({} units of {}) of MemAvailable and as much lockable memory "
                     "(RLIMIT_MEMLOCK is {}): free memory or make the pool smaller, and run the daemon with "
                     "LimitMEMLOCK=infinity (or CAP_IPC_LOCK)",
                     format_bytes(needed * unit_), needed, format_bytes(unit_),
                     lim == UINT64_MAX ? std::string("unlimited") : format_bytes(lim));
}

}  // namespace airs::pool
