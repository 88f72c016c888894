// SPDX-License-Identifier: Apache-2.0
#include "pool/pool.hpp"

#include <linux/magic.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>

#include "sys/files.hpp"
#include "util/units.hpp"

namespace airs::pool {

namespace {

// Contiguous runs of indices whose `held` bit equals `want`, up to `n` pages,
// scanning from the top (want=true: pages to punch, highest first) or the
// bottom (want=false: holes to fill, lowest first).
std::vector<PageRange> pick_runs(const std::vector<bool>& held, bool want, uint64_t n, bool from_top) {
  std::vector<PageRange> runs;
  uint64_t left = n;
  const uint64_t size = held.size();
  for (uint64_t k = 0; k < size && left > 0; ++k) {
    const uint64_t i = from_top ? size - 1 - k : k;
    if (held[i] != want) continue;
    if (!runs.empty()) {
      PageRange& last = runs.back();
      if (from_top && last.first == i + 1) {
        last.first = i;
        ++last.count;
        --left;
        continue;
      }
      if (!from_top && last.first + last.count == i) {
        ++last.count;
        --left;
        continue;
      }
    }
    runs.push_back({i, 1});
    --left;
  }
  return runs;
}

}  // namespace

Region::Region(Pool* pool, std::string name, sys::UniqueFd fd, uint64_t size, uint64_t pages, PageKind kind)
    : pool_(pool),
      name_(std::move(name)),
      fd_(std::move(fd)),
      size_(size),
      pages_(pages),
      kind_(kind),
      unit_(pool->page_size()) {
  pool_->regions_.insert(this);
}

Region::~Region() {
  // Punch before closing: clients may still map the file, and only the
  // punch frees pages other mappers hold. Then the reserve takes them back.
  const bool model = kind_ == PageKind::Model;
  // At exit (leave_regions_in_place) nothing is punched: clients keep
  // their mappings' bytes; the pool's own counts no longer matter.
  const uint64_t charged = pool_->leave_in_place_ ? 0 : model ? (map_.valid() ? charged_ : 0) : charged_;
  if (charged > 0) (void)pool_->backend_->release(fd_.get(), 0, size_, name_);
  map_.reset();
  pool_->backend_->forget_file(fd_.get());
  fd_.reset();
  if (charged > 0 && model) {
    pool_->return_model_pages(*this);
  } else if (charged > 0) {
    pool_->counts_.of(kind_) -= charged;
    pool_->give_to_reserve(charged);
  }
  pool_->forget(this);
}

Pool::Pool(std::unique_ptr<PoolBackend> backend, sys::UniqueFd reserve, uint64_t pages, uint64_t raised)
    : backend_(std::move(backend)), reserve_(std::move(reserve)), reserve_held_(pages, true), raised_(raised) {
  counts_.page_size = backend_->page_size();
  counts_.free_pages = pages;
}

Pool::~Pool() {
  // The reserve's pages go back to the kernel's free huge pages; then what
  // this pool added to nr_hugepages is taken back out, and nothing more.
  reserve_.reset();
  if (raised_ > 0 && !backend_->release_frees_memory()) {
    auto r = backend_->adjust_kernel_pages(-static_cast<int64_t>(raised_));
    if (!r || -*r < static_cast<int64_t>(raised_))
      std::fprintf(stderr, "airs-memd: pool: could not give back all %llu huge pages it added to nr_hugepages%s\n",
                   static_cast<unsigned long long>(raised_), r ? "" : (": " + r.error().message).c_str());
  }
}

Result<std::unique_ptr<Pool>> Pool::create(std::unique_ptr<PoolBackend> backend, PoolOptions opts) {
  const uint64_t ps = backend->page_size();
  const uint64_t pages = pages_for(opts.size_bytes, ps);
  if (pages == 0) return make_error(EINVAL, "pool: size must be at least one {} page", format_bytes(ps));
  auto avail = backend->kernel_available_pages();
  if (!avail) return std::move(avail).error();
  int64_t raised = 0;
  if (*avail < pages && opts.grow_nr_hugepages) {
    auto r = backend->adjust_kernel_pages(static_cast<int64_t>(pages - *avail));
    if (!r) return std::move(r).error();
    raised = *r;
    avail = backend->kernel_available_pages();
    if (!avail) return std::move(avail).error();
  }
  auto undo_raise = [&] {
    if (raised > 0) (void)backend->adjust_kernel_pages(-raised);
  };
  uint64_t have_pages = pages;
  if (*avail < pages && opts.allow_partial && *avail > 0) {
    // A service starts with what it got and grows toward its size later.
    have_pages = *avail;
  } else if (*avail < pages) {
    const uint64_t have = *avail;
    undo_raise();
    return make_error(ENOMEM, "pool: need {} huge pages of {} ({}), the kernel has only {} free{}; {}", pages,
                      format_bytes(ps), format_bytes(pages * ps), have,
                      opts.grow_nr_hugepages ? " even after raising nr_hugepages (memory fragmented?)" : "",
                      backend->advice(pages));
  }
  // The pre-touch: allocates and zeroes every page now, so first use later
  // is not slow and the pages are ours. Another process may take free pages
  // between the count above and this (another daemon starting): a partial
  // start then tries again with what is free now, a few times.
  Result<sys::UniqueFd> fd = make_error(ENOMEM, "pool: no attempt");
  for (int attempt = 0;; ++attempt) {
    fd = backend->create_file("airs-pool-reserve", have_pages * ps, FileSize::MayGrow);
    if (!fd) {
      undo_raise();
      return std::move(fd).error();
    }
    auto st = backend->populate(fd->get(), 0, have_pages * ps, "pool reserve");
    if (st) break;
    fd->reset();  // frees whatever fallocate had allocated
    auto now = backend->kernel_available_pages();
    if (opts.allow_partial && attempt < 3 && now && *now > 0 && *now < have_pages) {
      have_pages = *now;
      continue;
    }
    undo_raise();
    return make_error(ENOMEM, "pool: pre-touching {} huge pages failed ({}); {}", have_pages, st.error().message,
                      backend->advice(pages));
  }
  return std::unique_ptr<Pool>(
      new Pool(std::move(backend), std::move(fd).value(), have_pages, static_cast<uint64_t>(std::max<int64_t>(0, raised))));
}

Error Pool::exhausted(const std::string& what, uint64_t need) const {
  return make_error(ENOSPC, "{}: pool exhausted: need {} pages of {} ({}), {} free of {}; evict models, free KV "
                            "or grow the pool (pool size in the config)",
                    what, need, format_bytes(counts_.page_size), format_bytes(need * counts_.page_size),
                    counts_.free_pages, counts_.total_pages());
}

Status Pool::take_from_reserve(uint64_t n) { return punch_reserve(n, false); }

Status Pool::punch_reserve(uint64_t n, bool owed) {
  const uint64_t ps = counts_.page_size;
  for (const PageRange& r : pick_runs(reserve_held_, true, n, true)) {
    AIRS_TRY(backend_->release(reserve_.get(), r.first * ps, r.count * ps, "pool reserve"));
    for (uint64_t i = r.first; i < r.first + r.count; ++i) reserve_held_[i] = false;
    (owed ? owed_ : counts_.free_pages) -= r.count;
  }
  return {};
}

Status Pool::claim(Region& r, uint64_t unit) {
  if (r.kind_ != PageKind::Model || r.claimed_.empty() || !r.map_.valid()) return {};
  if (unit >= r.claimed_.size())
    return make_error(EINVAL, "model '{}': unit {} lies past its {} units", r.name_, unit, r.claimed_.size());
  if (r.claimed_[unit]) return {};
  if (r.pages_for_units(r.claimed_count_ + 1) > r.handed()) {
    if (r.handed() >= r.charged_)
      return make_error(ENOSPC, "model '{}': its {} pages are all in use; release a unit first", r.name_, r.charged_);
    AIRS_TRY(punch_reserve(1, true));
  }
  r.claimed_[unit] = true;
  ++r.claimed_count_;
  return {};
}

Status Pool::release_unit(Region& r, uint64_t unit) {
  if (!r.streamed_ || unit >= r.claimed_.size())
    return make_error(EINVAL, "model '{}': unit {} is not a unit of a streamed region", r.name_, unit);
  if (!r.claimed_[unit]) return {};
  AIRS_TRY(backend_->release(r.fd(), unit * r.unit_, r.unit_, "model '" + r.name_ + "'"));
  r.claimed_[unit] = false;
  --r.claimed_count_;
  if (r.handed() == r.pages_for_units(r.claimed_count_ + 1)) return {};  // the units left still fill every page
  // Back into the reserve, still charged to the region (owed). A page the
  // reserve could not take back (another process took it meanwhile) leaves
  // the pool: the region's budget shrinks with it.
  if (give_to_reserve(1) == 0) {
    --counts_.free_pages;
    ++owed_;
  } else {
    --r.charged_;
    --counts_.model_pages;
  }
  return {};
}

Status Pool::set_budget(Region& r, uint64_t budget) {
  if (!r.streamed_ || budget == 0 || budget >= r.pages_)
    return make_error(EINVAL, "model '{}': a budget of {} pages for a streamed region of {}", r.name_, budget, r.pages_);
  if (budget > r.charged_) {
    const uint64_t more = budget - r.charged_;
    if (more > counts_.free_pages) return exhausted("model '" + r.name_ + "' (a larger budget)", more);
    counts_.free_pages -= more;
    owed_ += more;
    counts_.model_pages += more;
  } else if (budget < r.charged_) {
    if (r.handed() > budget)
      return make_error(EBUSY, "model '{}': {} pages are in use, more than a budget of {}", r.name_, r.handed(), budget);
    const uint64_t fewer = r.charged_ - budget;
    owed_ -= fewer;
    counts_.free_pages += fewer;
    counts_.model_pages -= fewer;
  }
  r.charged_ = budget;
  return {};
}

void Pool::return_model_pages(Region& r) {
  counts_.model_pages -= r.charged_;
  if (r.claimed_.empty()) {
    give_to_reserve(r.charged_);
    return;
  }
  // Pages never handed over are still in the reserve: free again as they are.
  const uint64_t unclaimed = r.charged_ - r.handed();
  owed_ -= unclaimed;
  counts_.free_pages += unclaimed;
  give_to_reserve(r.handed());
  r.claimed_.clear();
  r.claimed_count_ = 0;
}

uint64_t Pool::give_to_reserve(uint64_t n) {
  const uint64_t ps = counts_.page_size;
  uint64_t holes = static_cast<uint64_t>(std::count(reserve_held_.begin(), reserve_held_.end(), false));
  if (holes < n) {
    const uint64_t grow_by = n - holes;
    if (sys::resize_file(reserve_.get(), (reserve_held_.size() + grow_by) * ps, "pool reserve"))
      reserve_held_.resize(reserve_held_.size() + grow_by, false);
  }
  uint64_t lost = 0;
  for (const PageRange& r : pick_runs(reserve_held_, false, n, false)) {
    if (backend_->populate(reserve_.get(), r.first * ps, r.count * ps, "pool reserve")) {
      for (uint64_t i = r.first; i < r.first + r.count; ++i) reserve_held_[i] = true;
      counts_.free_pages += r.count;
    } else {
      // Someone else took the pages meanwhile: leave no half-claimed run.
      (void)backend_->release(reserve_.get(), r.first * ps, r.count * ps, "pool reserve");
      lost += r.count;
    }
  }
  return lost;
}

Result<std::unique_ptr<Region>> Pool::create_model_region(const std::string& name, uint64_t bytes) {
  const uint64_t ps = counts_.page_size;
  const uint64_t pages = pages_for(bytes, ps);
  if (pages == 0) return make_error(EINVAL, "model '{}': empty region", name);
  if (pages > counts_.free_pages) return exhausted("model '" + name + "'", pages);
  auto fd = backend_->create_file("airs-model:" + name, pages * ps, FileSize::Fixed);
  if (!fd) return std::move(fd).error();
  auto r = std::unique_ptr<Region>(new Region(this, name, std::move(fd).value(), pages * ps, pages, PageKind::Model));
  AIRS_TRY(reserve_region(*r));
  return r;
}

Result<std::unique_ptr<Region>> Pool::adopt_model_region(const std::string& name, sys::UniqueFd fd) {
  const uint64_t ps = counts_.page_size;
  auto sr = sys::stat_of(fd.get(), "model '" + name + "': the kept region");
  if (!sr) return std::move(sr).error();
  const struct stat& st = *sr;
  const auto size = static_cast<uint64_t>(st.st_size);
  // hugetlbfs files (block: the huge page) for the hugetlbfs backend; shmem
  // (a memfd, or a file on a huge tmpfs whose block is its huge page) for
  // the shmem backend. A region of the other kind is never adopted: its
  // pages would be counted as the wrong memory.
  const auto blk = static_cast<uint64_t>(st.st_blksize);
  auto fs = sys::fs_type_of(fd.get(), "model '" + name + "': the kept region");
  if (!fs) return std::move(fs).error();
  const bool same_kind = backend_->hands_over_per_unit() ? *fs == TMPFS_MAGIC : (*fs == HUGETLBFS_MAGIC && blk == ps);
  if (!S_ISREG(st.st_mode) || size == 0 || size % ps != 0 || !same_kind)
    return make_error(EINVAL, "model '{}': the kept region is not a file of whole {} pages ({} bytes, block size {})",
                      name, format_bytes(ps), size, static_cast<uint64_t>(st.st_blksize));
  const uint64_t pages = size / ps;
  auto m = backend_->map_region(fd.get(), size, "model '" + name + "'");
  if (!m) return std::move(m).error();
  auto r = std::unique_ptr<Region>(new Region(this, name, std::move(fd), size, pages, PageKind::Model));
  r->map_ = std::move(m).value();
  if (backend_->hands_over_per_unit()) {
    r->claimed_.assign(pages, true);
    r->claimed_count_ = pages;
  }
  r->charged_ = pages;
  counts_.model_pages += pages;
  return r;
}

Result<std::unique_ptr<Region>> Pool::create_streamed_region(const std::string& name, uint64_t bytes,
                                                            uint64_t budget, uint64_t unit) {
  const uint64_t ps = counts_.page_size;
  const uint64_t pages = pages_for(bytes, ps);
  if (budget == 0 || budget >= pages)
    return make_error(EINVAL, "model '{}': a streamed region of {} pages needs a budget of 1 to {} pages, not {}", name,
                      pages, pages - 1, budget);
  if (unit == 0) unit = ps;
  if (unit != ps && (!backend_->hands_over_per_unit() || ps % unit != 0 || unit % sys::base_page_size() != 0))
    return make_error(EINVAL,
                      "model '{}': units of {} on a {} pool of {} pages; a smaller unit must divide the page and be "
                      "a multiple of the base page ({}), on a pool that hands pages over per unit (shmem)",
                      name, format_bytes(unit), backend_->name(), format_bytes(ps), format_bytes(sys::base_page_size()));
  if (budget > counts_.free_pages) return exhausted("model '" + name + "' (streamed)", budget);
  // Whole units: a client's mapping is the units the status page counts.
  const uint64_t size = pages_for(bytes, unit) * unit;
  auto fd = unit == ps ? backend_->create_file("airs-model:" + name, size, FileSize::Fixed)
                       : backend_->create_base_page_file("airs-model:" + name, size);
  if (!fd) return std::move(fd).error();
  auto r = std::unique_ptr<Region>(new Region(this, name, std::move(fd).value(), size, pages, PageKind::Model));
  auto m = backend_->map_region(r->fd(), r->size_, "model '" + name + "' (streamed)", false);
  if (!m) return std::move(m).error();
  // Small units: the reads fault the pages in through this mapping, so ask
  // for no huge folio there, where transparent_hugepage/shmem_enabled
  // would give memfds one. Fails only on a kernel without transparent huge
  // pages, which gives none anyway.
  if (unit != ps) (void)::madvise(m->get(), size, MADV_NOHUGEPAGE);
  r->map_ = std::move(m).value();
  r->streamed_ = true;
  r->unit_ = unit;
  r->units_per_page_ = ps / unit;
  r->claimed_.assign(pages_for(bytes, unit), false);
  r->claimed_count_ = 0;
  r->charged_ = budget;
  counts_.free_pages -= budget;
  owed_ += budget;
  counts_.model_pages += budget;
  return r;
}

Status Pool::reserve_region(Region& r) {
  if (r.kind_ != PageKind::Model) return make_error(EINVAL, "region '{}' is not a model region", r.name_);
  if (r.map_.valid()) return {};
  if (r.pages_ > counts_.free_pages) return exhausted("model '" + r.name_ + "'", r.pages_);
  const bool per_unit = backend_->hands_over_per_unit();
  if (per_unit) {
    // Charged now, handed over by claim() as the pager fills each unit.
    counts_.free_pages -= r.pages_;
    owed_ += r.pages_;
  } else {
    AIRS_TRY(take_from_reserve(r.pages_));
  }
  auto m = backend_->map_region(r.fd(), r.size_, "model '" + r.name_ + "'");
  if (!m) {
    if (per_unit) {
      owed_ -= r.pages_;
      counts_.free_pages += r.pages_;
    } else {
      give_to_reserve(r.pages_);
    }
    return make_error(m.error().code, "model '{}': the kernel would not reserve {} pages ({}); another process "
                                      "took free huge pages?",
                      r.name_, r.pages_, m.error().message);
  }
  r.map_ = std::move(m).value();
  if (per_unit) {
    r.claimed_.assign(r.pages_, false);
    r.claimed_count_ = 0;
  }
  r.charged_ = r.pages_;
  counts_.model_pages += r.pages_;
  return {};
}

Status Pool::release_region(Region& r) {
  if (r.kind_ != PageKind::Model) return make_error(EINVAL, "region '{}' is not a model region", r.name_);
  if (!r.map_.valid()) return {};
  // The punch frees the pages and their reservation; the mapping goes too
  // (a stale mapping would fault without a reservation).
  AIRS_TRY(backend_->release(r.fd(), 0, r.size_, "model '" + r.name_ + "'"));
  r.map_.reset();
  return_model_pages(r);
  return {};
}

Result<std::unique_ptr<Region>> Pool::create_kv_region(const std::string& name, uint64_t bytes) {
  const uint64_t ps = counts_.page_size;
  const uint64_t pages = pages_for(bytes, ps);
  if (pages == 0) return make_error(EINVAL, "KV arena '{}': empty", name);
  auto fd = backend_->create_file("airs-kv:" + name, pages * ps, FileSize::MayGrow);
  if (!fd) return std::move(fd).error();
  auto r = std::unique_ptr<Region>(new Region(this, name, std::move(fd).value(), pages * ps, pages, PageKind::Kv));
  r->held_.assign(pages, false);
  return r;
}

Status Pool::alloc_pages(Region& r, PageRange range) {
  if (r.kind_ != PageKind::Kv || range.first + range.count > r.pages_)
    return make_error(EINVAL, "KV arena '{}': bad page range [{}, +{})", r.name_, range.first, range.count);
  for (uint64_t i = range.first; i < range.first + range.count; ++i)
    if (r.held_[i]) return make_error(EINVAL, "KV arena '{}': page {} already allocated", r.name_, i);
  if (range.count > counts_.free_pages) return exhausted("KV arena '" + r.name_ + "'", range.count);
  const uint64_t ps = counts_.page_size;
  AIRS_TRY(take_from_reserve(range.count));
  if (auto st = backend_->populate(r.fd(), range.first * ps, range.count * ps, "KV arena '" + r.name_ + "'"); !st) {
    (void)backend_->release(r.fd(), range.first * ps, range.count * ps, "KV arena '" + r.name_ + "'");
    give_to_reserve(range.count);
    return st;
  }
  for (uint64_t i = range.first; i < range.first + range.count; ++i) r.held_[i] = true;
  r.charged_ += range.count;
  counts_.kv_pages += range.count;
  return {};
}

Result<Pool::KvRepair> Pool::restore_kv_region(Region& r, Refill refill) {
  if (r.kind_ != PageKind::Kv) return make_error(EINVAL, "'{}' is not a KV arena", r.name_);
  const uint64_t ps = counts_.page_size;
  const std::string what = "KV arena '" + r.name_ + "'";
  auto st = sys::stat_of(r.fd(), what);
  if (!st) return std::move(st).error();
  KvRepair out;
  out.found_size = static_cast<uint64_t>(st->st_size);
  const uint64_t have = static_cast<uint64_t>(st->st_blocks) * 512;
  const uint64_t held = r.charged_ * ps;
  out.stray_bytes = have > held ? have - held : 0;
  out.missing_bytes = held > have ? held - have : 0;
  if (!out.any(r.size_)) return out;
  if (refill == Refill::No && out.refilled(r.size_)) return out;  // found, left as it is
  Status first;
  const auto keep = [&first](Status s) {
    if (!s && first) first = std::move(s);
  };
  // Each run of pages in state `held`, from page `from` on.
  const auto runs = [&r](uint64_t from, bool held_state, const auto& fn) {
    for (uint64_t i = from; i < r.pages_;) {
      if (r.held_[i] != held_state) {
        ++i;
        continue;
      }
      uint64_t n = 1;
      while (i + n < r.pages_ && r.held_[i + n] == held_state) ++n;
      fn(i, n);
      i += n;
    }
  };
  if (out.found_size != r.size_) AIRS_TRY(sys::resize_file(r.fd(), r.size_, what));
  // The pages the pool held past the cut are gone, and so are any it held
  // that were punched or cut and grown back: allocate them again (a page
  // still there is left as it is).
  if (out.found_size < r.size_ || out.missing_bytes != 0)
    runs(out.missing_bytes != 0 ? 0 : out.found_size / ps, true,
         [&](uint64_t i, uint64_t n) { keep(backend_->populate(r.fd(), i * ps, n * ps, what)); });
  runs(0, false, [&](uint64_t i, uint64_t n) { keep(backend_->release(r.fd(), i * ps, n * ps, what)); });
  if (!first) return std::move(first).error();
  return out;
}

Status Pool::free_pages(Region& r, PageRange range) {
  if (r.kind_ != PageKind::Kv || range.first + range.count > r.pages_)
    return make_error(EINVAL, "KV arena '{}': bad page range [{}, +{})", r.name_, range.first, range.count);
  for (uint64_t i = range.first; i < range.first + range.count; ++i)
    if (!r.held_[i]) return make_error(EINVAL, "KV arena '{}': page {} is not allocated", r.name_, i);
  const uint64_t ps = counts_.page_size;
  AIRS_TRY(backend_->release(r.fd(), range.first * ps, range.count * ps, "KV arena '" + r.name_ + "'"));
  for (uint64_t i = range.first; i < range.first + range.count; ++i) r.held_[i] = false;
  r.charged_ -= range.count;
  counts_.kv_pages -= range.count;
  give_to_reserve(range.count);
  return {};
}

Result<KernelView> Pool::kernel_view() {
  auto v = backend_->kernel_view();
  if (!v) return std::move(v).error();
  uint64_t bytes = 0;
  auto add = [&](int fd) {
    auto b = sys::allocated_bytes(fd);
    if (b) bytes += *b;
  };
  add(reserve_.get());
  for (Region* r : regions_) add(r->fd());
  v->files_pages = bytes / counts_.page_size;
  return v;
}

Result<uint64_t> Pool::shrink(uint64_t pages) {
  const uint64_t n = std::min(pages, counts_.free_pages);
  if (n == 0) return uint64_t{0};
  AIRS_TRY(take_from_reserve(n));
  // The punched pages are free in the kernel's hugetlb pool; only lowering
  // nr_hugepages turns them into memory the rest of the system can use.
  // shmem: the punch itself gave the memory back.
  if (backend_->release_frees_memory()) return n;
  auto took = backend_->adjust_kernel_pages(-static_cast<int64_t>(n));
  if (!took) return std::move(took).error();
  const auto given = static_cast<uint64_t>(-std::min<int64_t>(0, *took));
  // Pages given back count against what we added first.
  raised_ -= std::min(raised_, given);
  return given;
}

Result<uint64_t> Pool::grow(uint64_t pages) {
  if (pages == 0) return uint64_t{0};
  auto added = backend_->adjust_kernel_pages(static_cast<int64_t>(pages));
  if (!added) return std::move(added).error();
  if (!backend_->release_frees_memory()) raised_ += static_cast<uint64_t>(std::max<int64_t>(0, *added));
  auto avail = backend_->kernel_available_pages();
  if (!avail) return std::move(avail).error();
  const uint64_t want = std::min(pages, *avail);
  const uint64_t lost = give_to_reserve(want);
  return want - lost;
}

}  // namespace airs::pool
