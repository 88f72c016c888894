// SPDX-License-Identifier: Apache-2.0
#include "pager/fill_engine.hpp"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"
#include "sys/shmem.hpp"
#include "util/units.hpp"

namespace airs::pager {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; Debian 12's headers may lack it
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

using Clock = std::chrono::steady_clock;

namespace {
// Completions of populates carry this bit; reads carry their bare slot, and
// a copied read's write into the region and the populate linked to it
// (copy_in) carry their slot with kWriteTag and kCopiedTag.
constexpr uint64_t kPopulateTag = uint64_t{1} << 63;
constexpr uint64_t kWriteTag = uint64_t{1} << 62;
constexpr uint64_t kCopiedTag = uint64_t{1} << 61;
enum : uint8_t { kNotPopulated = 0, kPopulating = 1, kPopulated = 2 };
}  // namespace

struct FillEngine::Read {
  bool active = false;
  ModelId model = 0;
  uint32_t unit = 0;
  uint64_t done = 0;
  uint64_t expected = 0;
  bool direct = false;
  bool copy = false;      // into bounce(slot), then copy_in
  int32_t write_res = 0;  // copy_in's write into the region
  uint16_t ioprio = 0;    // io_priority of the read's class (kept when a short read goes on)
  std::optional<uint32_t> owner;  // the source's capped_owner when it started
};

struct FillEngine::Populate {
  bool active = false;
  ModelId model = 0;
  uint32_t unit = 0;
};

FillEngine::FillEngine(sys::EventLoop& loop, pool::Pool& pool, FillOptions opts, FillListener& listener,
                       sys::Ring ring)
    : loop_(loop),
      pool_(pool),
      opts_(opts),
      listener_(listener),
      ring_(std::make_unique<sys::Ring>(std::move(ring))),
      warmup_rate_(opts.warmup_bytes_per_s, std::chrono::milliseconds(100), Clock::now()) {
  reads_.resize(opts_.queue_depth);
  populates_.resize(opts_.allocate_ahead);
}

// Bound on the wait at destruction (daemon shutdown) for reads still in the
// device: an SD card's deepest queue takes ~1.6 s.
constexpr auto kShutdownDrainLimit = std::chrono::seconds(10);

bool FillEngine::shutdown() {
  closing_ = true;
  const bool drained = reap_until([this] { return reads_active_ == 0 && populates_active() == 0; },
                                  Clock::now() + kShutdownDrainLimit);
  if (!drained) {
    spdlog::error("pager: {} reads and {} page populates still in flight after {} s; their regions stay mapped",
                  reads_active_, populates_active(), kShutdownDrainLimit.count());
    (void)bounce_.release();  // a copy still writes from it
  }
  return drained;
}

FillEngine::~FillEngine() {
  if (!closing_) (void)shutdown();
  loop_.remove(ring_->event_fd());
  if (warmup_timer_) loop_.remove(warmup_timer_->fd());
}

Result<std::unique_ptr<FillEngine>> FillEngine::create(sys::EventLoop& loop, pool::Pool& pool, FillOptions opts,
                                                       FillListener& listener) {
  if (opts.queue_depth == 0) opts.queue_depth = 1;
  auto ring = sys::Ring::create(opts.queue_depth + opts.allocate_ahead);
  if (!ring) return std::move(ring).error();
  // Room in the loop thread's io-wq for every read and populate in flight,
  // and the KV spill's writes beside them. The reads of a file that never
  // answers hold their workers (IOSQE_ASYNC): under the kernel's bound of 4
  // per CPU, 12 of them (two users' shares) would take every worker of a
  // 2-core machine, and every other read, populate and spill write that
  // needs one would wait. (The 6.18 kernel here ran 16 such reads at once
  // with its default bound, so no test here shows that wait.)
  if (auto st = ring->set_bounded_workers(opts.queue_depth + opts.allocate_ahead + 16); !st)
    spdlog::debug("pager: {} (the kernel's bound stays)", st.error().message);
  auto e = std::unique_ptr<FillEngine>(new FillEngine(loop, pool, opts, listener, std::move(ring).value()));
  FillEngine* self = e.get();
  AIRS_TRY(loop.add(self->ring_->event_fd(), EPOLLIN, [self](uint32_t) { self->on_ring(); }));
  if (opts.warmup_bytes_per_s > 0) {
    auto t = sys::OneShotTimer::create();
    if (!t) return std::move(t).error();
    self->warmup_timer_.emplace(std::move(t).value());
    AIRS_TRY(loop.add(self->warmup_timer_->fd(), EPOLLIN, [self](uint32_t) {
      self->warmup_timer_->acknowledge();
      self->listener_.reaped();
    }));
  }
  return e;
}

Status FillEngine::add(FillSource& src, std::optional<Result<sys::UniqueFd>> direct) {
  // O_DIRECT where the file system allows: reads go straight into the huge
  // pages without polluting the page cache with a second copy.
  if (opts_.direct_io != DirectIo::Off) {
    auto d = direct ? std::move(*direct) : sys::reopen(src.gguf.get(), O_RDONLY | O_DIRECT);
    if (d) {
      src.gguf_direct = std::move(d).value();
    } else if (opts_.direct_io == DirectIo::On) {
      return make_error(d.error().code,
                        "model '{}': models.direct_io = \"on\" but the file system refuses O_DIRECT ({}); set it to "
                        "\"auto\" to read through the page cache there",
                        src.name, d.error().message);
    }
  }
  // A copy's write past the end of a truncated (unloaded) region fails on
  // the seal instead of growing the file back (sys::create_shmem_file).
  src.copy_fill =
      opts_.copy_fill && pool_.backend().fills_by_copy() && sys::sealed_against_growth(src.region->fd());
  sources_[src.id] = &src;
  return {};
}

void FillEngine::remove(ModelId id) { sources_.erase(id); }

void FillEngine::restart(FillSource& src) {
  // A fill starts on a fresh or emptied region: nothing is allocated.
  src.populated.assign(pool::pages_for(src.file_size, src.unit), kNotPopulated);
  src.bytes_read = 0;
}

FillSource* FillEngine::find(ModelId id) const {
  auto it = sources_.find(id);
  return it == sources_.end() ? nullptr : it->second;
}

uint32_t FillEngine::populates_active() const {
  return static_cast<uint32_t>(
      std::count_if(populates_.begin(), populates_.end(), [](const Populate& p) { return p.active; }));
}

bool FillEngine::background_allowed(uint64_t bytes) {
  if (warmup_rate_.take(bytes, Clock::now())) return true;
  // Over the warm-up rate: come back when the bucket allows a read.
  if (!warmup_timer_->armed())
    if (auto st = warmup_timer_->arm(warmup_rate_.wait(Clock::now())); !st)
      spdlog::error("pager: warm-up pacing: {}", st.error().message);
  return false;
}

// ioprio(2)'s encoding: the class in the top three bits, the level in the
// low ones (the kernel's UAPI values; its header's helper since Linux 6.5
// names a parameter `class` and so does not compile as C++).
constexpr uint16_t ioprio_value(uint16_t cls, uint16_t level) { return static_cast<uint16_t>((cls << 13) | level); }
constexpr uint16_t kIoprioClassBe = 2;
constexpr uint16_t kIoprioClassIdle = 3;

uint16_t io_priority(ReadClass cls) {
  switch (cls) {
    case ReadClass::Urgent: return ioprio_value(kIoprioClassBe, 0);
    case ReadClass::Prefetch: return ioprio_value(kIoprioClassBe, 7);
    case ReadClass::Background: return ioprio_value(kIoprioClassIdle, 0);
  }
  return 0;
}

Status FillEngine::read(FillSource& src, uint32_t unit, ReadClass cls) {
  for (size_t slot = 0; slot < reads_.size(); ++slot) {
    Read& r = reads_[slot];
    if (r.active) continue;
    // shmem, and streamed models: the reserve hands this unit's page over
    // just before the read allocates it (the pool's memory stays its size).
    AIRS_TRY(pool_.claim(*src.region, unit));
    r = Read{true,
             src.id,
             unit,
             0,
             std::min(src.unit, src.file_size - uint64_t{unit} * src.unit),
             false,
             src.copy_fill,
             0,
             opts_.io_priorities ? io_priority(cls) : uint16_t{0},
             src.capped_owner};
    ++src.in_flight;
    ++reads_active_;
    if (r.owner) {
      ++owner_reads_[*r.owner];
      ++capped_reads_;
    }
    submit_read(slot);
    return {};
  }
  return make_error(EBUSY, "pager: no free read slot");
}

bool FillEngine::slot_free_for(const FillSource& src) const {
  if (!slot_free()) return false;
  if (!src.capped_owner) return true;
  const uint32_t depth = opts_.queue_depth;
  // At least one slot each, so a depth of 1 still reads everyone's units.
  if (capped_reads_ >= std::max(1u, depth - std::max(1u, depth / 4))) return false;
  const auto it = owner_reads_.find(*src.capped_owner);
  return it == owner_reads_.end() || it->second < std::max(1u, depth / 2);
}

void FillEngine::release(Read& r, FillSource* src) {
  r.active = false;
  --reads_active_;
  if (r.owner) {
    if (auto it = owner_reads_.find(*r.owner); it != owner_reads_.end() && --it->second == 0) owner_reads_.erase(it);
    --capped_reads_;
    r.owner.reset();
  }
  if (src != nullptr) --src->in_flight;
}

void FillEngine::submit() {
  if (auto st = ring_->submit(); !st) spdlog::error("pager: {}", st.error().message);
}

void FillEngine::submit_read(size_t slot) {
  Read& r = reads_[slot];
  FillSource& src = *find(r.model);
  const uint64_t off = uint64_t{r.unit} * src.unit + r.done;
  const uint64_t remaining = r.expected - r.done;
  const uint64_t align = sys::base_page_size();
  r.direct = src.gguf_direct.valid() && off % align == 0;
  // O_DIRECT lengths must be block multiples; reading past EOF is a short read.
  const uint64_t len = r.direct ? std::min(src.unit - r.done, *round_up(remaining, align)) : remaining;
  const int fd = r.direct ? src.gguf_direct.get() : src.gguf.get();
  std::byte* dst = src.region->data() + off;
  if (r.copy) {
    if (std::byte* b = bounce(slot); b != nullptr) dst = b + r.done;
    else r.copy = false;  // no bounce buffer (mapped once, at a read's start): straight into the region
  }
  while (!ring_->queue_read(fd, dst, static_cast<uint32_t>(len), off, slot, r.ioprio, src.async_reads)) {
    if (auto st = ring_->submit(); !st) {
      spdlog::error("pager: {}", st.error().message);
      break;
    }
  }
}

// The bounce buffer of read slot `slot` (a unit of anonymous memory), mapped
// at the first use; nullptr if it cannot be (then reads go straight into the
// region, logged once).
std::byte* FillEngine::bounce(size_t slot) {
  if (!bounce_.valid()) {
    const size_t len = reads_.size() * pool_.page_size();
    auto m = sys::map_anonymous(len, "pager bounce buffers");
    if (!m) {
      static bool warned = false;
      if (!std::exchange(warned, true))
        spdlog::warn("pager: {}; reading into the regions instead", m.error().message);
      return nullptr;
    }
    bounce_ = std::move(m).value();
  }
  bounce_used_ = true;
  return bounce_.bytes() + slot * pool_.page_size();
}

// A copied read is complete in its bounce buffer: write it into the region
// file, and once that wrote every byte, fault the unit's pages into the
// daemon's mapping (MADV_POPULATE_READ, linked), both in io-wq workers.
// shmem_write_begin allocates each page without zeroing it and the copy
// fills it; the populate maps the pages into the lock-on-fault mapping
// (which locks them) and allocates the tail past the end of the file, so one
// CONTINUE finds every page. Until the unit is READY nothing shows it to a
// client: the zero-page rules hold for the pages the write put into the
// file as for pages allocated ahead.
void FillEngine::copy_in(size_t slot) {
  Read& r = reads_[slot];
  FillSource& src = *find(r.model);
  const uint64_t off = uint64_t{r.unit} * src.unit;
  for (;;) {
    if (ring_->sq_space() >= 2 &&
        ring_->queue_write_linked(src.region->fd(), bounce(slot), static_cast<uint32_t>(r.expected), off,
                                  kWriteTag | slot, true)) {
      (void)ring_->queue_madvise(src.region->data() + off, static_cast<uint32_t>(src.unit), MADV_POPULATE_READ,
                                 kCopiedTag | slot);
      break;
    }
    if (auto st = ring_->submit(); !st) {
      spdlog::error("pager: {}", st.error().message);
      break;
    }
  }
  submit();
}

// The populate linked to a copy's write landed (or was cancelled because the
// write fell short): the unit is done.
void FillEngine::on_copied(size_t slot, int32_t res) {
  Read& r = reads_[slot];
  const int32_t wrote = r.write_res;
  FillSource* src = find(r.model);
  const bool live = src != nullptr && !src->revoked && !closing_;
  if (live && (wrote == -EAGAIN || wrote == -EINTR)) return copy_in(slot);
  const uint32_t unit = r.unit;
  const uint64_t expected = r.expected;
  release(r, src);
  if (src == nullptr) return;
  // Unloaded: the write went into pages the truncation took, or failed on
  // the growth seal; the populate on the truncated mapping.
  if (!live) return;
  if (wrote < 0 || static_cast<uint64_t>(wrote) != expected)
    return listener_.unit_read_failed(src->id, unit, wrote < 0 ? -wrote : EIO);
  // Populated: every page is in the mapping (and locked there if it locks
  // on fault). Else pin allocates and locks the whole unit itself.
  finish_unit(*src, unit, res == 0 ? src->unit : 0);
}

void FillEngine::on_ring() {
  ring_->reap([this](uint64_t user_data, int32_t res) { on_completion(user_data, res); });
  listener_.reaped();
}

bool FillEngine::reap_until(const std::function<bool()>& done, Clock::time_point deadline) {
  while (!done()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    auto st = ring_->wait_and_reap_for(static_cast<int>(std::min<int64_t>(left, 1000)),
                                       [this](uint64_t user_data, int32_t res) { on_completion(user_data, res); });
    if (!st && st.error().code != ETIME) {
      spdlog::error("pager: {}", st.error().message);
      return false;
    }
    if (!closing_) listener_.reaped();
  }
  return true;
}

void FillEngine::on_completion(uint64_t user_data, int32_t res) {
  if ((user_data & kPopulateTag) != 0) return on_populated(user_data & ~kPopulateTag, res);
  if ((user_data & kWriteTag) != 0) {
    reads_[user_data & ~kWriteTag].write_res = res;  // its linked populate completes after it
    return;
  }
  if ((user_data & kCopiedTag) != 0) return on_copied(user_data & ~kCopiedTag, res);
  on_read(user_data, res);
}

void FillEngine::on_read(size_t slot, int32_t res) {
  Read& r = reads_[slot];
  FillSource* src = find(r.model);
  if (src == nullptr || src->revoked || closing_) {
    // Its bytes go nowhere: the region is truncated (or the pager is going).
    // A read that ran after the truncation failed on the mapping (EFAULT),
    // one that ran before wrote pages no file or mapping holds any more.
    release(r, src);
    return;
  }
  // A retiring model finishes what it started (short reads too): its bytes
  // are good if the retirement is given up.
  auto requeue = [&] {
    submit_read(slot);
    submit();
  };
  if (res == -EAGAIN || res == -EINTR) return requeue();
  if (res == -EINVAL && r.direct) {
    spdlog::info("model '{}': O_DIRECT refused, falling back to buffered reads", src->name);
    src->gguf_direct.reset();
    return requeue();
  }
  if (res > 0) {
    r.done += static_cast<uint64_t>(res);
    src->bytes_read += static_cast<uint64_t>(res);
    if (r.done < r.expected) return requeue();  // short read: the rest
  }
  const uint32_t unit = r.unit;
  const bool ok = r.done >= r.expected;
  if (ok && r.copy) return copy_in(slot);  // the slot stays busy until the copy landed
  const uint64_t written = r.done;
  release(r, src);
  // res < 0: read error; res == 0 before the expected end: the file shrank.
  if (!ok) return listener_.unit_read_failed(src->id, unit, res < 0 ? -res : EIO);
  finish_unit(*src, unit, written);
}

// Unit `unit` holds its final bytes, the first `written` of them faulted
// into the daemon's mapping. shmem: the rest (the tail past EOF, or all of
// a copied unit whose populate failed) is not; pin makes every page of the
// unit present, so one CONTINUE covers it, and locks it. A pin failure
// leaves correct bytes that could be swapped: worth a warning, not a failed
// unit.
void FillEngine::finish_unit(FillSource& src, uint32_t unit, uint64_t written) {
  const uint64_t off = uint64_t{unit} * src.unit;
  if (auto st = pool_.backend().pin(src.region->fd(), src.region->data(), off, src.unit, written,
                                    "model '" + src.name + "'");
      !st) {
    if (!src.pin_warned) spdlog::warn("model '{}': {}", src.name, st.error().message);
    src.pin_warned = true;
    if (st.error().code != ENOMEM && st.error().code != EPERM && st.error().code != EAGAIN)
      return listener_.unit_read_failed(src.id, unit, st.error().code);
  }
  if (unit < src.populated.size()) src.populated[unit] = kNotPopulated;  // a later refill allocates anew
  listener_.unit_read(src.id, unit);
}

void FillEngine::free_bounce_if(bool nothing_loads) {
  if (!bounce_used_ || reads_active_ != 0 || !nothing_loads) return;
  sys::free_lazily(bounce_);
  bounce_used_ = false;
}

void FillEngine::populate(FillSource& src, const std::vector<uint32_t>& units) {
  // A copied unit's pages come from its write, not zeroed ahead.
  if (!src.accepting || src.copy_fill) return;
  size_t slot = 0;
  for (uint32_t u : units) {
    if (u >= src.populated.size() || src.populated[u] != kNotPopulated) continue;
    while (slot < populates_.size() && populates_[slot].active) ++slot;
    if (slot == populates_.size()) return;
    // shmem: the reserve gives the unit's page up before the populate
    // allocates it (a failure here is met again, and reported, by the read).
    if (!pool_.claim(*src.region, u)) continue;
    if (!ring_->queue_madvise(src.region->data() + uint64_t{u} * src.unit, static_cast<uint32_t>(src.unit),
                              MADV_POPULATE_WRITE, kPopulateTag | slot))
      return;  // submission queue full: the next pump continues
    populates_[slot] = Populate{true, src.id, u};
    src.populated[u] = kPopulating;
    ++src.populates_in_flight;
  }
}

void FillEngine::on_populated(size_t slot, int32_t res) {
  Populate& p = populates_[slot];
  p.active = false;
  FillSource* src = find(p.model);
  if (src == nullptr) return;
  --src->populates_in_flight;
  // Unloaded: past the truncation it allocated nothing (the fault past EOF
  // failed it) or its page went with the truncation.
  if (src->revoked) return;
  // Done or not, never retried: a unit whose pages are missing gets them from
  // its read (slower, same bytes), and a real problem shows up there.
  if (p.unit < src->populated.size() && src->populated[p.unit] == kPopulating) src->populated[p.unit] = kPopulated;
  if (res < 0 && !src->populate_warned) {
    src->populate_warned = true;
    spdlog::warn("model '{}': allocating pages ahead of the reads failed ({}); the reads allocate them instead "
                 "(slower warm-up)",
                 src->name, std::strerror(-res));
  }
}

}  // namespace airs::pager
