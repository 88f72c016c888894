#include "pager/pager.hpp"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"
#include "sys/shmem.hpp"
#include "sys/uffd.hpp"
#include "util/units.hpp"

namespace airs::pager {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; Debian 12's headers may lack it
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

using Clock = std::chrono::steady_clock;

// Completions of populates carry this bit; reads carry their bare slot, and
// a copied read's write into the region and the populate linked to it
// (copy_in) carry their slot with kWriteTag and kCopiedTag.
constexpr uint64_t kPopulateTag = uint64_t{1} << 63;
constexpr uint64_t kWriteTag = uint64_t{1} << 62;
constexpr uint64_t kCopiedTag = uint64_t{1} << 61;
enum : uint8_t { kNotPopulated = 0, kPopulating = 1, kPopulated = 2 };

void LatencyHistogram::add(uint64_t us) {
  size_t i = 0;
  while (i < kUpperUs.size() && us > kUpperUs[i]) ++i;
  ++counts[i];
  ++samples;
  sum_us += us;
}

struct Pager::Client {
  ClientKey key = 0;
  pid_t pid = 0;
  sys::UniqueFd uffd;
  sys::UniqueFd pidfd;
  sys::UniqueFd notify;
  uint64_t addr = 0;
  uint64_t len = 0;
};

struct Pager::Model {
  Model(ModelId i, std::string n, FillPlan p) : id(i), name(std::move(n)), plan(std::move(p)) {}
  ModelId id;
  std::string name;
  sys::UniqueFd gguf;         // buffered reads
  sys::UniqueFd gguf_direct;  // O_DIRECT reopen, invalid where the fs refuses
  uint64_t file_size = 0;
  uint64_t unit = 0;
  std::unique_ptr<pool::Region> region;
  FillPlan plan;
  sys::SealedMemfd status_page;  // written here, handed out read-only
  client::StatusPageWriter status;
  struct Waiter {
    ClientKey key;
    Clock::time_point since;
  };
  std::map<uint32_t, std::vector<Waiter>> waiting;
  std::map<ClientKey, std::unique_ptr<Client>> clients;
  std::map<ClientKey, sys::UniqueFd> requesters;  // cooperative clients' request sockets (see follow())
  client::ModelLoadState state = client::ModelLoadState::Loading;
  // Evict: takes no new reads or populates, punched once those in flight
  // landed (unless `keep`). Unload: out of the table, truncated, dropped
  // once they landed.
  enum class Retire : uint8_t { None, Evict, Unload } retire = Retire::None;
  bool keep = false;  // while an eviction drains: a client wants the model again
  [[nodiscard]] bool idle() const { return in_flight == 0 && populates_in_flight == 0; }
  bool pin_warned = false;
  bool populate_warned = false;
  // Filled by copy (PagerOptions::copy_fill): read into a bounce buffer,
  // written into the region file; no populates ahead.
  bool copy_fill = false;
  uint32_t in_flight = 0;
  uint32_t populates_in_flight = 0;
  std::vector<uint8_t> populated;  // per unit, since the last (re)fill started
  // Units that became READY during the current reap, not yet mapped into
  // the clients (map_ready maps them as runs: one CONTINUE per run and client).
  std::vector<uint32_t> newly_ready;
  std::vector<uint32_t> read_order;  // units by read issue, since the last (re)fill started
  std::optional<AccessRecorder> recorder;  // set while the access order is recorded
  uint64_t bytes_read = 0;
  Clock::time_point fill_start{};
  Clock::time_point fill_end{};
  uint64_t faults = 0;
  uint64_t faults_waited = 0;
  LatencyHistogram ready_latency;
  LatencyHistogram wait_latency;
};

struct Pager::Read {
  bool active = false;
  ModelId model = 0;
  uint32_t unit = 0;
  uint64_t done = 0;
  uint64_t expected = 0;
  bool direct = false;
  bool copy = false;      // into bounce(slot), then copy_in
  int32_t write_res = 0;  // copy_in's write into the region
};

struct Pager::Populate {
  bool active = false;
  ModelId model = 0;
  uint32_t unit = 0;
};

Pager::Pager(sys::EventLoop& loop, pool::Pool& pool, PagerOptions opts, sys::Ring ring)
    : loop_(loop),
      pool_(pool),
      opts_(opts),
      ring_(std::make_unique<sys::Ring>(std::move(ring))),
      warmup_rate_(opts.warmup_bytes_per_s, std::chrono::milliseconds(100), Clock::now()) {
  reads_.resize(opts_.queue_depth);
  populates_.resize(opts_.allocate_ahead);
}

// Bound on the wait at destruction (daemon shutdown) for reads still in the
// device: an SD card's deepest queue takes ~1.6 s.
constexpr auto kShutdownDrainLimit = std::chrono::seconds(10);

Pager::~Pager() {
  // Nothing above us may hear of what still completes.
  state_listener_ = {};
  drain_listener_ = {};
  closing_ = true;
  const bool drained = reap_until([this] { return reads_active_ == 0 && populates_active() == 0; },
                                  Clock::now() + kShutdownDrainLimit);
  if (!drained) {
    // Their reads still write through the daemon's mappings: those stay
    // mapped (leaked, the process is exiting) so no read lands in memory
    // that a later mapping reuses.
    spdlog::error("pager: {} reads and {} page populates still in flight after {} s; their regions stay mapped",
                  reads_active_, populates_active(), kShutdownDrainLimit.count());
    for (auto* tab : {&models_, &unloading_})
      for (auto& [id, m] : *tab)
        if (!m->idle()) (void)m->region.release();
    (void)bounce_.release();  // a copy still writes from it
  }
  for (auto& [id, m] : models_) {
    for (auto& [key, c] : m->clients) {
      loop_.remove(c->uffd.get());
      loop_.remove(c->pidfd.get());
    }
    for (auto& [key, fd] : m->requesters) loop_.remove(fd.get());
  }
  loop_.remove(ring_->event_fd());
  if (warmup_timer_) loop_.remove(warmup_timer_->fd());
}

Result<std::unique_ptr<Pager>> Pager::create(sys::EventLoop& loop, pool::Pool& pool, PagerOptions opts) {
  if (opts.queue_depth == 0) opts.queue_depth = 1;
  if (!opts.uffd_clients) opts.background_warmup = true;
  auto ring = sys::Ring::create(opts.queue_depth + opts.allocate_ahead);
  if (!ring) return std::move(ring).error();
  auto p = std::unique_ptr<Pager>(new Pager(loop, pool, opts, std::move(ring).value()));
  Pager* self = p.get();
  AIRS_TRY(loop.add(self->ring_->event_fd(), EPOLLIN, [self](uint32_t) { self->on_ring(); }));
  if (opts.warmup_bytes_per_s > 0) {
    auto t = sys::OneShotTimer::create();
    if (!t) return std::move(t).error();
    self->warmup_timer_.emplace(std::move(t).value());
    AIRS_TRY(loop.add(self->warmup_timer_->fd(), EPOLLIN, [self](uint32_t) {
      self->warmup_timer_->acknowledge();
      self->pump();
    }));
  }
  return p;
}

Pager::Model* Pager::find(ModelId id) const {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.get();
}

// Also the unloaded models whose reads still land (completions only).
Pager::Model* Pager::find_any(ModelId id) const {
  if (Model* m = find(id)) return m;
  auto it = unloading_.find(id);
  return it == unloading_.end() ? nullptr : it->second.get();
}

uint32_t Pager::populates_active() const {
  return static_cast<uint32_t>(
      std::count_if(populates_.begin(), populates_.end(), [](const Populate& p) { return p.active; }));
}

namespace {

Status check_spec(const ModelSpec& spec, uint64_t unit) {
  if (spec.file_size == 0) return make_error(EINVAL, "model '{}': empty file", spec.name);
  if (!spec.gguf) return make_error(EBADF, "model '{}': no file descriptor", spec.name);
  for (const Extent& e : spec.extents)
    if (e.offset > spec.file_size || e.length > spec.file_size - e.offset)
      return make_error(EINVAL, "model '{}': extent [{}, +{}) lies past the end of the {}-byte file", spec.name,
                        e.offset, e.length, spec.file_size);
  if (pool::pages_for(spec.file_size, unit) > UINT32_MAX) return make_error(EFBIG, "model '{}': too large", spec.name);
  return {};
}

}  // namespace

Result<ModelId> Pager::load(ModelSpec spec) {
  AIRS_TRY(check_spec(spec, pool_.page_size()));
  auto region = pool_.create_model_region(spec.name, spec.file_size);
  if (!region) return std::move(region).error();
  return install(std::move(spec), std::move(region).value(), false);
}

Result<ModelId> Pager::adopt(ModelSpec spec, std::unique_ptr<pool::Region> region) {
  AIRS_TRY(check_spec(spec, pool_.page_size()));
  if (!region || region->size() < spec.file_size)
    return make_error(EINVAL, "model '{}': the kept region does not hold the file", spec.name);
  return install(std::move(spec), std::move(region), true);
}

Result<ModelId> Pager::install(ModelSpec spec, std::unique_ptr<pool::Region> region, bool filled) {
  const uint64_t unit = pool_.page_size();
  const uint64_t units = pool::pages_for(spec.file_size, unit);
  const ModelId id = next_id_++;
  auto m = std::make_unique<Model>(id, spec.name, FillPlan(rank_units(spec.extents, spec.file_size, unit),
                                                           opts_.prefetch_window));
  m->file_size = spec.file_size;
  m->unit = unit;
  m->region = std::move(region);
  // A copy's write past the end of a truncated (unloaded) region fails on
  // the seal instead of growing the file back (sys::create_shmem_file).
  m->copy_fill = opts_.copy_fill && pool_.backend().fills_by_copy() && sys::sealed_against_growth(m->region->fd());
  // O_DIRECT where the file system allows: reads go straight into the huge
  // pages without polluting the page cache with a second copy.
  if (opts_.direct_io != DirectIo::Off) {
    auto d = sys::reopen(spec.gguf.get(), O_RDONLY | O_DIRECT);
    if (d) {
      m->gguf_direct = std::move(d).value();
    } else if (opts_.direct_io == DirectIo::On) {
      return make_error(d.error().code,
                        "model '{}': models.direct_io = \"on\" but the file system refuses O_DIRECT ({}); set it to "
                        "\"auto\" to read through the page cache there",
                        spec.name, d.error().message);
    }
  }
  m->gguf = std::move(spec.gguf);
  if (!spec.warmup_order.empty()) {
    if (m->plan.set_warmup_order(spec.warmup_order))
      spdlog::info("model '{}': warm-up follows the recorded access order ({} of {} units first)", spec.name,
                   spec.warmup_order.size(), units);
    else
      spdlog::warn("model '{}': the recorded access order does not fit this model; warm-up in layer order",
                   spec.name);
  }
  if (spec.record_access) m->recorder.emplace(static_cast<uint32_t>(units));

  // Status page: written here, sealed, handed out read-only.
  const auto& ranks = m->plan.ranks();
  std::vector<client::RankEntry> entries(ranks.size());
  for (uint32_t i = 0; i < ranks.size(); ++i) entries[i] = {ranks[i], m->plan.units_of_rank_index(i), 0, 0};
  const uint64_t sp_bytes = client::status_page_bytes(static_cast<uint32_t>(units), static_cast<uint32_t>(ranks.size()));
  auto page = sys::SealedMemfd::create("airs-status:" + spec.name, sp_bytes);
  if (!page) return std::move(page).error();
  m->status_page = std::move(page).value();
  m->status = client::StatusPageWriter(m->status_page.bytes(), sp_bytes);
  m->status.init(unit, spec.file_size, static_cast<uint32_t>(units), entries.data(),
                 static_cast<uint32_t>(entries.size()));
  Model& ref = *m;
  models_.emplace(id, std::move(m));
  if (filled) {
    // Every byte is there already (an earlier daemon filled it): ready as
    // it is, nothing is read. shmem: the pages are in the file but not in
    // this daemon's mapping, so a lock-on-fault mapping holds none of them
    // (no fault brought them in); pin the whole region as written by no one
    // here, which maps and locks every page (mlock), like a fresh fill's.
    if (auto st = pool_.backend().pin(ref.region->fd(), ref.region->data(), 0, units * unit, 0,
                                      "model '" + ref.name + "' (adopted)");
        !st) {
      spdlog::warn("model '{}': {}", ref.name, st.error().message);
      ref.pin_warned = true;
    }
    ref.fill_start = Clock::now();
    for (uint32_t u = 0; u < units; ++u) {
      ref.plan.set_state(u, UnitState::Ready);
      ref.status.set_ready(u, ref.plan.rank_index(u));
    }
    publish(ref);
    check_resident(ref);
    spdlog::info("model '{}': {} in {} units of {}, adopted filled", ref.name, format_bytes(ref.file_size), units,
                 format_bytes(unit));
    return id;
  }
  start_fill(ref);
  spdlog::info("model '{}': {} in {} units of {}, {} reads{}", ref.name, format_bytes(ref.file_size), units,
               format_bytes(unit), ref.gguf_direct ? "O_DIRECT" : "buffered",
               ref.copy_fill ? ", copied into the region through a bounce buffer" : "");
  return id;
}

int Pager::gguf_fd(ModelId id) const {
  auto* m = find(id);
  return m != nullptr ? m->gguf.get() : -1;
}

int Pager::region_fd(ModelId id) const {
  const Model* m = find(id);
  return m ? m->region->fd() : -1;
}

int Pager::status_fd(ModelId id) const {
  const Model* m = find(id);
  return m ? m->status_page.read_only_fd() : -1;
}

uint64_t Pager::region_size(ModelId id) const {
  const Model* m = find(id);
  return m ? m->region->size() : 0;
}

std::vector<ModelId> Pager::models() const {
  std::vector<ModelId> out;
  for (const auto& [id, m] : models_) out.push_back(id);
  return out;
}

void Pager::start_fill(Model& m) {
  m.plan.reset();
  m.newly_ready.clear();
  // A fill starts on a fresh or punched region: nothing is allocated.
  m.populated.assign(m.plan.unit_count(), kNotPopulated);
  m.read_order.clear();
  m.state = client::ModelLoadState::Loading;
  m.status.reset(client::ModelLoadState::Loading);
  m.bytes_read = 0;
  m.fill_start = Clock::now();
  m.fill_end = {};
  publish(m);
  pump();
}

void Pager::publish(Model& m) {
  m.status.publish();
  sys::futex_wake_all(m.status.generation_word());
}

// Fill free read slots: fault-waited units of any model first, then prefetch
// windows, then background warm-up.
void Pager::pump() {
  if (closing_) return;
  bool queued = false;
  for (ReadClass cls : {ReadClass::Urgent, ReadClass::Prefetch, ReadClass::Background}) {
    if (cls == ReadClass::Background && !opts_.background_warmup) break;
    bool progress = true;
    while (progress && reads_active_ < opts_.queue_depth) {
      progress = false;
      for (auto& [id, m] : models_) {
        if (reads_active_ >= opts_.queue_depth) break;
        if (m->retire != Model::Retire::None || !m->region->reserved()) continue;
        auto u = m->plan.next(cls);
        if (!u) continue;
        if (cls == ReadClass::Background && !warmup_rate_.take(m->unit, Clock::now())) {
          // Over the warm-up rate: come back when the bucket allows a read.
          if (!warmup_timer_->armed()) {
            if (auto st = warmup_timer_->arm(warmup_rate_.wait(Clock::now())); !st)
              spdlog::error("pager: warm-up pacing: {}", st.error().message);
          }
          break;
        }
        if (issue(*m, *u)) {
          progress = true;
          queued = true;
        }
      }
    }
  }
  if (populate_ahead()) queued = true;
  if (queued) {
    if (auto st = ring_->submit(); !st) spdlog::error("pager: {}", st.error().message);
  }
}

// Queue populates for the next units the prefetch and background classes
// will read (up to allocate_ahead per class past its cursor). Urgent units
// get none: their reads are issued at once. Returns true if any was queued.
bool Pager::populate_ahead() {
  bool queued = false;
  size_t slot = 0;
  for (auto& [id, m] : models_) {
    // A copied unit's pages come from its write, not zeroed ahead.
    if (m->retire != Model::Retire::None || !m->region->reserved() || m->copy_fill) continue;
    for (ReadClass cls : {ReadClass::Prefetch, ReadClass::Background}) {
      if (cls == ReadClass::Background && !opts_.background_warmup) break;
      for (uint32_t u : m->plan.peek(cls, opts_.allocate_ahead)) {
        if (m->populated[u] != kNotPopulated) continue;
        while (slot < populates_.size() && populates_[slot].active) ++slot;
        if (slot == populates_.size()) return queued;
        // shmem: the reserve gives the unit's page up before the populate
        // allocates it (a failure here is met again, and reported, by the read).
        if (!pool_.claim(*m->region, u)) continue;
        if (!ring_->queue_madvise(m->region->data() + uint64_t{u} * m->unit, static_cast<uint32_t>(m->unit),
                                  MADV_POPULATE_WRITE, kPopulateTag | slot))
          return queued;  // submission queue full: the next pump continues
        populates_[slot] = Populate{true, m->id, u};
        m->populated[u] = kPopulating;
        ++m->populates_in_flight;
        queued = true;
      }
    }
  }
  return queued;
}

void Pager::on_populated(size_t slot, int32_t res) {
  Populate& p = populates_[slot];
  p.active = false;
  Model* m = find_any(p.model);
  if (m == nullptr) return;
  --m->populates_in_flight;
  // Unloaded: past the truncation it allocated nothing (the fault past EOF
  // failed it) or its page went with the truncation.
  if (m->retire == Model::Retire::Unload) return;
  // Done or not, never retried: a unit whose pages are missing gets them from
  // its read (slower, same bytes), and a real problem shows up there.
  m->populated[p.unit] = kPopulated;
  if (res < 0 && !m->populate_warned) {
    m->populate_warned = true;
    spdlog::warn("model '{}': allocating pages ahead of the reads failed ({}); the reads allocate them instead "
                 "(slower warm-up)",
                 m->name, std::strerror(-res));
  }
}

bool Pager::issue(Model& m, uint32_t unit) {
  for (size_t slot = 0; slot < reads_.size(); ++slot) {
    Read& r = reads_[slot];
    if (r.active) continue;
    // shmem: the reserve hands this unit's page over just before the read
    // allocates it (the pool's memory stays its size).
    if (auto st = pool_.claim(*m.region, unit); !st) {
      unit_failed(m, unit, st.error().code);
      return true;
    }
    r = Read{true, m.id, unit, 0, std::min(m.unit, m.file_size - uint64_t{unit} * m.unit), false, m.copy_fill, 0};
    m.plan.set_state(unit, UnitState::InFlight);
    m.read_order.push_back(unit);
    ++m.in_flight;
    ++reads_active_;
    submit_read(slot);
    return true;
  }
  return false;
}

void Pager::submit_read(size_t slot) {
  Read& r = reads_[slot];
  Model& m = *find(r.model);
  const uint64_t off = uint64_t{r.unit} * m.unit + r.done;
  const uint64_t remaining = r.expected - r.done;
  const uint64_t align = sys::base_page_size();
  r.direct = m.gguf_direct.valid() && off % align == 0;
  // O_DIRECT lengths must be block multiples; reading past EOF is a short read.
  const uint64_t len = r.direct ? std::min(m.unit - r.done, *round_up(remaining, align)) : remaining;
  const int fd = r.direct ? m.gguf_direct.get() : m.gguf.get();
  std::byte* dst = m.region->data() + off;
  if (r.copy) {
    if (std::byte* b = bounce(slot); b != nullptr) dst = b + r.done;
    else r.copy = false;  // no bounce buffer (mapped once, at a read's start): straight into the region
  }
  while (!ring_->queue_read(fd, dst, static_cast<uint32_t>(len), off, slot)) {
    if (auto st = ring_->submit(); !st) {
      spdlog::error("pager: {}", st.error().message);
      break;
    }
  }
}

// The bounce buffer of read slot `slot` (a unit of anonymous memory), mapped
// at the first use; nullptr if it cannot be (then reads go straight into the
// region, logged once).
std::byte* Pager::bounce(size_t slot) {
  if (!bounce_.valid()) {
    const size_t len = reads_.size() * pool_.page_size();
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      static bool warned = false;
      if (!std::exchange(warned, true))
        spdlog::warn("pager: no {} bounce buffer for copied reads ({}); reading into the regions instead",
                     format_bytes(len), std::strerror(errno));
      return nullptr;
    }
    bounce_ = sys::Mapping(p, len);
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
// client: the zero-page rules of the header hold for the pages the write
// put into the file as for pages allocated ahead.
void Pager::copy_in(size_t slot) {
  Read& r = reads_[slot];
  Model& m = *find(r.model);
  const uint64_t off = uint64_t{r.unit} * m.unit;
  for (;;) {
    if (ring_->sq_space() >= 2 &&
        ring_->queue_write_linked(m.region->fd(), bounce(slot), static_cast<uint32_t>(r.expected), off,
                                  kWriteTag | slot, true)) {
      (void)ring_->queue_madvise(m.region->data() + off, static_cast<uint32_t>(m.unit), MADV_POPULATE_READ,
                                 kCopiedTag | slot);
      break;
    }
    if (auto st = ring_->submit(); !st) {
      spdlog::error("pager: {}", st.error().message);
      break;
    }
  }
  if (auto st = ring_->submit(); !st) spdlog::error("pager: {}", st.error().message);
}

// The populate linked to a copy's write landed (or was cancelled because the
// write fell short): the unit is done.
void Pager::on_copied(size_t slot, int32_t res) {
  Read& r = reads_[slot];
  const int32_t wrote = r.write_res;
  Model* m = find_any(r.model);
  const bool live = m != nullptr && m->retire != Model::Retire::Unload && !closing_;
  if (live && (wrote == -EAGAIN || wrote == -EINTR)) return copy_in(slot);
  const uint32_t unit = r.unit;
  const uint64_t expected = r.expected;
  r.active = false;
  --reads_active_;
  if (m == nullptr) return;
  --m->in_flight;
  // Unloaded: the write went into pages the truncation took, or failed on
  // the growth seal; the populate on the truncated mapping.
  if (m->retire == Model::Retire::Unload || closing_) return;
  if (wrote < 0 || static_cast<uint64_t>(wrote) != expected) return unit_failed(*m, unit, wrote < 0 ? -wrote : EIO);
  // Populated: every page is in the mapping (and locked there if it locks
  // on fault). Else pin allocates and locks the whole unit itself.
  finish_unit(*m, unit, res == 0 ? m->unit : 0);
}

void Pager::on_ring() {
  ring_->reap([this](uint64_t user_data, int32_t res) { on_completion(user_data, res); });
  after_reap();
}

void Pager::after_reap() {
  map_ready();  // before a drain's punch takes the pages (a CONTINUE after it would find none)
  end_drains();
  pump();  // the slots the drained models held go to the others
  free_bounce_if_idle();
}

bool Pager::reap_until(const std::function<bool()>& done, Clock::time_point deadline) {
  while (!done()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    auto st = ring_->wait_and_reap_for(static_cast<int>(std::min<int64_t>(left, 1000)),
                                       [this](uint64_t user_data, int32_t res) { on_completion(user_data, res); });
    if (!st && st.error().code != ETIME) {
      spdlog::error("pager: {}", st.error().message);
      return false;
    }
    after_reap();
  }
  return true;
}

bool Pager::finish_drains(Clock::time_point deadline) {
  return reap_until(
      [this] {
        return unloading_.empty() && std::none_of(models_.begin(), models_.end(), [](const auto& e) {
                 return e.second->retire != Model::Retire::None;
               });
      },
      deadline);
}

// Drains whose last read or populate landed in this reap end here, in a
// fixed order: state first, then the listener (which may call back in).
void Pager::end_drains() {
  std::vector<std::pair<ModelId, Drained>> ended;
  for (auto it = unloading_.begin(); it != unloading_.end();) {
    if (!it->second->idle()) {
      ++it;
      continue;
    }
    spdlog::info("model '{}': its last reads landed; {} back in the pool", it->second->name,
                 format_bytes(it->second->region->size()));
    ended.emplace_back(it->first, Drained::Unloaded);
    it = unloading_.erase(it);  // the region's destructor returns the pages: counted free from here on
  }
  for (auto& [id, m] : models_) {
    if (m->retire != Model::Retire::Evict || !m->idle()) continue;
    m->retire = Model::Retire::None;
    // At shutdown nothing is punched: clients keep what they map (never zeros).
    if (closing_) continue;
    if (m->keep || !m->waiting.empty()) {
      m->keep = false;
      spdlog::info("model '{}': eviction given up, a client wants it again", m->name);
      ended.emplace_back(id, Drained::Kept);
      continue;
    }
    if (auto st = punch(*m); !st) {
      spdlog::error("model '{}': eviction failed: {}", m->name, st.error().message);
      ended.emplace_back(id, Drained::Kept);
      continue;
    }
    ended.emplace_back(id, Drained::Evicted);
  }
  if (drain_listener_)
    for (const auto& [id, how] : ended) drain_listener_(id, how);
}

uint64_t Pager::returning_pages() const {
  uint64_t n = 0;
  for (const auto& [id, m] : unloading_)
    if (m->region->reserved()) n += m->region->pages();
  for (const auto& [id, m] : models_)
    if (m->retire == Model::Retire::Evict && !m->keep && m->waiting.empty() && m->region->reserved())
      n += m->region->pages();
  return n;
}

bool Pager::draining(ModelId id) const {
  const Model* m = find_any(id);
  return m != nullptr && m->retire != Model::Retire::None;
}

void Pager::on_completion(uint64_t user_data, int32_t res) {
  if ((user_data & kPopulateTag) != 0) return on_populated(user_data & ~kPopulateTag, res);
  if ((user_data & kWriteTag) != 0) {
    reads_[user_data & ~kWriteTag].write_res = res;  // its linked populate completes after it
    return;
  }
  if ((user_data & kCopiedTag) != 0) return on_copied(user_data & ~kCopiedTag, res);
  const uint64_t slot = user_data;
  Read& r = reads_[slot];
  Model* m = find_any(r.model);
  if (m == nullptr) {
    r.active = false;
    --reads_active_;
    return;
  }
  if (m->retire == Model::Retire::Unload || closing_) {
    // Its bytes go nowhere: the region is truncated (or the pager is going).
    // A read that ran after the truncation failed on the mapping (EFAULT),
    // one that ran before wrote pages no file or mapping holds any more.
    r.active = false;
    --reads_active_;
    --m->in_flight;
    return;
  }
  // An evicting model finishes what it started (short reads too): its
  // bytes are good if the eviction is given up.
  auto requeue = [&] {
    submit_read(slot);
    if (auto st = ring_->submit(); !st) spdlog::error("pager: {}", st.error().message);
  };
  if (res == -EAGAIN || res == -EINTR) return requeue();
  if (res == -EINVAL && r.direct) {
    spdlog::info("model '{}': O_DIRECT refused, falling back to buffered reads", m->name);
    m->gguf_direct.reset();
    return requeue();
  }
  if (res > 0) {
    r.done += static_cast<uint64_t>(res);
    m->bytes_read += static_cast<uint64_t>(res);
    if (r.done < r.expected) return requeue();  // short read: the rest
  }
  const uint32_t unit = r.unit;
  const bool ok = r.done >= r.expected;
  if (ok && r.copy) return copy_in(slot);  // the slot stays busy until the copy landed
  const uint64_t written = r.done;
  r.active = false;
  --reads_active_;
  --m->in_flight;
  // res < 0: read error; res == 0 before the expected end: the file shrank.
  if (!ok) return unit_failed(*m, unit, res < 0 ? -res : EIO);
  finish_unit(*m, unit, written);
}

// Unit `unit` holds its final bytes, the first `written` of them faulted
// into the daemon's mapping. shmem: the rest (the tail past EOF, or all of
// a copied unit whose populate failed) is not; pin makes every page of the
// unit present, so one CONTINUE covers it, and locks it. A pin failure
// leaves correct bytes that could be swapped: worth a warning, not a failed
// unit.
void Pager::finish_unit(Model& m, uint32_t unit, uint64_t written) {
  const uint64_t off = uint64_t{unit} * m.unit;
  if (auto st = pool_.backend().pin(m.region->fd(), m.region->data(), off, m.unit, written, "model '" + m.name + "'");
      !st) {
    if (!m.pin_warned) spdlog::warn("model '{}': {}", m.name, st.error().message);
    m.pin_warned = true;
    if (st.error().code != ENOMEM && st.error().code != EPERM && st.error().code != EAGAIN)
      return unit_failed(m, unit, st.error().code);
  }
  unit_ready(m, unit);
}

// No read in flight and no model loading: the bounce buffers' pages go back
// to the kernel (MADV_FREE: reclaimed only under pressure, free to reuse
// until then).
void Pager::free_bounce_if_idle() {
  if (!bounce_used_ || reads_active_ != 0) return;
  for (const auto& [id, m] : models_)
    if (m->state == client::ModelLoadState::Loading && m->region->reserved()) return;
  (void)::madvise(bounce_.get(), bounce_.size(), MADV_FREE);
  bounce_used_ = false;
}

void Pager::unit_ready(Model& m, uint32_t unit) {
  m.plan.set_state(unit, UnitState::Ready);
  m.status.set_ready(unit, m.plan.rank_index(unit));
  m.newly_ready.push_back(unit);
}

// After a reap: publish the units that completed in it and map them into
// every client (saving their future faults), one range CONTINUE per run of
// adjacent units and client instead of one per unit (a reap at queue depth
// 16 often completes neighbours together). Waiters wake with the CONTINUE.
// Runs before check_resident, so no client is told "resident" (and may
// unregister) before its last units are mapped.
void Pager::map_ready() {
  for (auto& [id, mp] : models_) {
    Model& m = *mp;
    if (m.newly_ready.empty()) continue;
    std::vector<uint32_t> units = std::move(m.newly_ready);
    m.newly_ready.clear();
    std::sort(units.begin(), units.end());
    publish(m);
    const auto now = Clock::now();
    std::vector<ClientKey> gone;
    if (m.recorder) {
      // While recording, a unit goes only to the clients that wait for it:
      // the others' first touch must fault to be seen.
      for (uint32_t unit : units) {
        auto it = m.waiting.find(unit);
        if (it == m.waiting.end()) continue;
        for (auto& [key, c] : m.clients)
          if (std::find(gone.begin(), gone.end(), key) == gone.end() &&
              std::any_of(it->second.begin(), it->second.end(), [k = key](const auto& w) { return w.key == k; }) &&
              !continue_unit(m, *c, unit))
            gone.push_back(key);
      }
    } else {
      for (size_t i = 0; i < units.size();) {
        size_t e = i + 1;
        while (e < units.size() && units[e] == units[e - 1] + 1) ++e;
        for (auto& [key, c] : m.clients)
          if (std::find(gone.begin(), gone.end(), key) == gone.end() &&
              !continue_range(m, *c, units[i], static_cast<uint32_t>(e - i)))
            gone.push_back(key);
        i = e;
      }
    }
    for (uint32_t unit : units) {
      if (auto it = m.waiting.find(unit); it != m.waiting.end()) {
        for (const auto& w : it->second)
          m.wait_latency.add(static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::microseconds>(now - w.since).count()));
        m.waiting.erase(it);
      }
    }
    for (ClientKey k : gone) drop_client(m.id, k, "gone");
    check_resident(m);
  }
}

void Pager::unit_failed(Model& m, uint32_t unit, int err) {
  m.plan.set_state(unit, UnitState::Failed);
  m.status.add_failed();
  m.state = client::ModelLoadState::Failed;
  m.status.set_state(client::ModelLoadState::Failed);
  publish(m);
  spdlog::error("model '{}': reading bytes [{}, +{}) failed: {}; faults there get SIGBUS", m.name,
                uint64_t{unit} * m.unit, m.unit, std::strerror(err));
  if (state_listener_) state_listener_(m.id, client::ModelLoadState::Failed);
  if (auto it = m.waiting.find(unit); it != m.waiting.end()) {
    auto waiters = std::move(it->second);
    m.waiting.erase(it);
    for (const auto& w : waiters)
      if (auto c = m.clients.find(w.key); c != m.clients.end()) poison_unit(m, *c->second, unit);
  }
}

void Pager::check_resident(Model& m) {
  if (m.plan.ready() != m.plan.unit_count() || m.state == client::ModelLoadState::Resident) return;
  m.state = client::ModelLoadState::Resident;
  m.fill_end = Clock::now();
  m.status.set_state(client::ModelLoadState::Resident);
  publish(m);
  for (auto& [key, c] : m.clients)
    if (c->notify) (void)sys::eventfd_signal(c->notify.get());
  spdlog::info("model '{}': fully resident ({} read)", m.name, format_bytes(m.bytes_read));
  if (state_listener_) state_listener_(m.id, client::ModelLoadState::Resident);
}

bool Pager::continue_unit(Model& m, Client& c, uint32_t unit, uint64_t fault) {
  return continue_range(m, c, unit, 1, fault);
}

uint64_t Pager::mapping_page(const Model& m) const {
  return std::string_view(pool_.backend().name()) == "hugetlbfs" ? m.unit : sys::base_page_size();
}

bool Pager::continue_range(Model& m, Client& c, uint32_t first, uint32_t count, uint64_t fault) {
  const uint64_t addr = c.addr + uint64_t{first} * m.unit;
  const uint64_t len = uint64_t{count} * m.unit;
  // A fault on a unit that is ready: usually a duplicate (two threads, a
  // replayed signal), but on shmem the unit may be partly mapped (the
  // client dropped part of its entries): then its faulting page is mapped
  // by itself too, or the client would fault on it for ever.
  auto r = fault != 0 && count == 1 ? sys::uffd_continue_fault(c.uffd.get(), addr, len, fault, mapping_page(m))
                                    : sys::uffd_continue(c.uffd.get(), addr, len, m.unit);
  if (!r) {
    // ENOENT/EINVAL: the client unmapped or unregistered the range; it no
    // longer takes our answers. Once the model is resident that is libairs'
    // watcher dropping its registration (plain faults map the pages from
    // then on), racing a fault it had raised just before: the kernel woke
    // that fault at the unregistration, so nothing waits for this answer.
    // The thread that raised this fault may still sleep on it: the kernel's
    // unregistration can miss a fault queued under the per-VMA lock (6.6+),
    // and a client whose range was replaced is not woken at all. The wake
    // needs no registration; the thread then faults again, on whatever maps
    // the range now (docs/kernel-facts.md).
    (void)sys::uffd_wake(c.uffd.get(), addr, len);
    if (r.error().code == ENOENT && m.state == client::ModelLoadState::Resident)
      spdlog::debug("model '{}': client {} (pid {}) unregistered at residency; detaching it", m.name, c.key, c.pid);
    else
      spdlog::warn("model '{}': client {} (pid {}): {}; detaching it", m.name, c.key, c.pid, r.error().message);
    return false;
  }
  if (r->owner_gone) return false;
  // Already mapped (a duplicate fault, or two threads): a thread may still
  // sleep on the fault, so wake the range; harmless if none does.
  if (r->already_mapped_bytes > 0) (void)sys::uffd_wake(c.uffd.get(), addr, len);
  return true;
}

void Pager::poison_unit(Model& m, Client& c, uint32_t unit) {
  auto r = sys::uffd_poison_or_sigbus(c.uffd.get(), c.pidfd.get(), c.addr + uint64_t{unit} * m.unit, m.unit, m.unit);
  if (!r) spdlog::warn("model '{}': client {}: {}", m.name, c.key, r.error().message);
  else if (*r == sys::PoisonHow::Signalled)
    spdlog::warn("model '{}': no UFFDIO_POISON in this kernel (before 6.6): SIGBUS sent to client {} (pid {}) "
                 "as a whole",
                 m.name, c.key, c.pid);
}

Status Pager::attach(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd uffd, sys::UniqueFd notify, uint64_t addr,
                     uint64_t length) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "attach: no model {}", id);
  if (!opts_.uffd_clients)
    return make_error(ENOTSUP, "model '{}': the daemon runs in cooperative mode (no userfaultfd); map the region "
                               "read-only and wait for each rank on the status page",
                      m->name);
  if (m->clients.contains(key)) return make_error(EEXIST, "model '{}': client {} is already attached", m->name, key);
  // Units are counted from the client's base address; the kernel aligns a
  // hugetlbfs mapping to its page, a shmem one only to the base page (and
  // CONTINUE needs no more).
  const uint64_t align = mapping_page(*m);
  if (length != m->region->size() || addr % align != 0)
    return make_error(EINVAL, "model '{}': client {} registered [{:#x}, +{}), expected the whole {}-byte region at a "
                              "{}-aligned address",
                      m->name, key, addr, length, m->region->size(), format_bytes(align));
  if (!sys::is_userfaultfd(uffd.get()))
    return make_error(EBADF, "model '{}': client {} sent an fd that is not a userfaultfd", m->name, key);
  AIRS_TRY(sys::set_nonblocking(uffd.get()));
  AIRS_TRY(ensure_loaded(id));
  auto pidfd = sys::pidfd_open(pid);
  if (!pidfd) return make_error(ESRCH, "model '{}': client {} (pid {}) is gone: {}", m->name, key, pid,
                                pidfd.error().message);
  auto c = std::make_unique<Client>();
  c->key = key;
  c->pid = pid;
  c->uffd = std::move(uffd);
  c->pidfd = std::move(pidfd).value();
  c->notify = std::move(notify);
  c->addr = addr;
  c->len = length;
  AIRS_TRY(map_ready_units(*m, *c));
  const int ufd = c->uffd.get();
  const int pfd = c->pidfd.get();
  AIRS_TRY(loop_.add(ufd, EPOLLIN, [this, id, key](uint32_t) { on_uffd(id, key); }));
  if (auto st = loop_.add(pfd, EPOLLIN, [this, id, key](uint32_t) { drop_client(id, key, "exited"); }); !st) {
    loop_.remove(ufd);
    return st;
  }
  if (m->state == client::ModelLoadState::Resident && c->notify) (void)sys::eventfd_signal(c->notify.get());
  m->clients.emplace(key, std::move(c));
  // Faults raised before we watched the uffd are waiting in it.
  on_uffd(id, key);
  return {};
}

// Every ready unit at once, one range CONTINUE per run of ready units (while
// recording, only units already seen: the rest must fault).
Status Pager::map_ready_units(Model& m, Client& c) {
  const uint32_t n = m.plan.unit_count();
  auto mappable = [&](uint32_t u) {
    return m.plan.state(u) == UnitState::Ready && (!m.recorder || m.recorder->seen(u));
  };
  for (uint32_t u = 0; u < n;) {
    if (!mappable(u)) {
      ++u;
      continue;
    }
    uint32_t e = u;
    while (e < n && mappable(e)) ++e;
    auto r = sys::uffd_continue(c.uffd.get(), c.addr + uint64_t{u} * m.unit, uint64_t{e - u} * m.unit, m.unit);
    if (!r) return make_error(r.error().code, "model '{}': client {}: {}", m.name, c.key, r.error().message);
    if (r->owner_gone) return make_error(ESRCH, "model '{}': client {} (pid {}) is gone", m.name, c.key, c.pid);
    u = e;
  }
  return {};
}

void Pager::detach(ModelId id, ClientKey key) { drop_client(id, key, "detached"); }

void Pager::drop_client(ModelId id, ClientKey key, const char* why) {
  Model* m = find(id);
  if (m == nullptr) return;
  if (auto r = m->requesters.find(key); r != m->requesters.end()) {
    loop_.remove(r->second.get());
    spdlog::debug("model '{}': request socket {} {}", m->name, key, why);
    m->requesters.erase(r);
    return;
  }
  auto it = m->clients.find(key);
  if (it == m->clients.end()) return;
  loop_.remove(it->second->uffd.get());
  loop_.remove(it->second->pidfd.get());
  for (auto w = m->waiting.begin(); w != m->waiting.end();) {
    auto& v = w->second;
    v.erase(std::remove_if(v.begin(), v.end(), [key](const auto& x) { return x.key == key; }), v.end());
    w = v.empty() ? m->waiting.erase(w) : std::next(w);
  }
  spdlog::debug("model '{}': client {} (pid {}) {}", m->name, key, it->second->pid, why);
  m->clients.erase(it);
}

Status Pager::follow(ModelId id, ClientKey key, sys::UniqueFd requests) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "follow: no model {}", id);
  if (opts_.uffd_clients)
    return make_error(ENOTSUP, "model '{}': request sockets are for the cooperative mode; here a page fault asks for "
                               "its unit",
                      m->name);
  if (m->requesters.contains(key) || m->clients.contains(key))
    return make_error(EEXIST, "model '{}': client {} already follows it", m->name, key);
  int type = 0;
  socklen_t tlen = sizeof type;
  if (::getsockopt(requests.get(), SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_SEQPACKET)
    return make_error(EBADF, "model '{}': the request fd is not a SOCK_SEQPACKET socket", m->name);
  AIRS_TRY(sys::set_nonblocking(requests.get()));
  AIRS_TRY(loop_.add(requests.get(), EPOLLIN, [this, id, key](uint32_t) { on_requests(id, key); }));
  m->requesters.emplace(key, std::move(requests));
  return {};
}

void Pager::on_requests(ModelId id, ClientKey key) {
  Model* m = find(id);
  if (m == nullptr) return;
  auto it = m->requesters.find(key);
  if (it == m->requesters.end()) return;
  // One record per request (SOCK_SEQPACKET keeps the boundaries); at most
  // 256 per wake-up, so one client cannot hold the loop.
  bool eof = false;
  for (int i = 0; i < 256; ++i) {
    uint32_t u = 0;
    const ssize_t n = ::read(it->second.get(), &u, sizeof u);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) eof = true;
    if (n <= 0) break;
    if (n != sizeof u || u >= m->plan.unit_count()) continue;
    // A cooperative client's wait is its first touch of the unit: recorded
    // like a fault (AccessRecorder keeps each unit's first only).
    if (m->recorder) m->recorder->note(u);
    const UnitState s = m->plan.state(u);
    if (s != UnitState::Empty && s != UnitState::InFlight) continue;
    ++m->faults;
    ++m->faults_waited;
    m->plan.on_fault(u);
  }
  if (eof) drop_client(id, key, "closed by the client");
  pump();
}

void Pager::on_uffd(ModelId id, ClientKey key) {
  Model* m = find(id);
  if (m == nullptr) return;
  auto it = m->clients.find(key);
  if (it == m->clients.end()) return;
  std::vector<uffd_msg> msgs;
  if (auto st = sys::uffd_read_events(it->second->uffd.get(), msgs); !st) {
    spdlog::warn("model '{}': client {}: {}", m->name, key, st.error().message);
    return;
  }
  const auto t0 = Clock::now();
  for (const uffd_msg& msg : msgs) {
    if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
    auto c = m->clients.find(key);  // a previous fault may have dropped it
    if (c == m->clients.end()) return;
    handle_fault(*m, *c->second, msg.arg.pagefault.address, t0);
  }
  pump();
}

void Pager::handle_fault(Model& m, Client& c, uint64_t address, Clock::time_point t0) {
  ++m.faults;
  if (address < c.addr || address >= c.addr + c.len) return;
  const auto unit = static_cast<uint32_t>((address - c.addr) / m.unit);
  if (unit >= m.plan.unit_count()) return;
  if (m.recorder) m.recorder->note(unit);
  if (!m.region->reserved()) {
    // Evicted under an attached client: reserve again and refill lazily.
    if (auto st = ensure_loaded(m.id); !st) {
      spdlog::error("model '{}': {}; client {} gets SIGBUS", m.name, st.error().message, c.key);
      poison_unit(m, c, unit);
      return;
    }
  }
  switch (m.plan.state(unit)) {
    case UnitState::Ready: {
      const ClientKey key = c.key;
      if (!continue_unit(m, c, unit, address)) return drop_client(m.id, key, "gone");
      m.ready_latency.add(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count()));
      return;
    }
    case UnitState::Failed:
      return poison_unit(m, c, unit);
    case UnitState::Empty:
    case UnitState::InFlight: {
      ++m.faults_waited;
      auto& v = m.waiting[unit];
      // Duplicate events (signals replay faults, threads share a page): one
      // entry per client is enough, the CONTINUE wakes every thread.
      if (std::none_of(v.begin(), v.end(), [&](const auto& w) { return w.key == c.key; }))
        v.push_back({c.key, t0});
      m.plan.on_fault(unit);
      return;
    }
  }
}

Status Pager::punch(Model& m) {
  AIRS_TRY(pool_.release_region(*m.region));
  m.plan.reset();
  m.state = client::ModelLoadState::Evicted;
  m.status.reset(client::ModelLoadState::Evicted);
  publish(m);
  return {};
}

Result<Pager::Drain> Pager::evict(ModelId id) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "evict: no model {}", id);
  if (m->retire == Model::Retire::Evict) {
    m->keep = false;  // asked again: evict after all
    return Drain::Pending;
  }
  if (!m->region->reserved()) return Drain::Done;
  if (!m->waiting.empty())
    return make_error(EBUSY, "model '{}': cannot evict while {} client fault(s) wait for it", m->name,
                      m->waiting.size());
  if (!m->idle()) {
    // No new reads or populates from here on (pump skips it); the region
    // stays whole until the ones in flight landed (end_drains).
    m->retire = Model::Retire::Evict;
    m->keep = false;
    spdlog::debug("model '{}': evicting once {} reads and {} populates landed", m->name, m->in_flight,
                  m->populates_in_flight);
    pump();
    return Drain::Pending;
  }
  AIRS_TRY(punch(*m));
  pump();
  return Drain::Done;
}

Status Pager::ensure_loaded(ModelId id) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "no model {}", id);
  if (m->retire == Model::Retire::Evict) {
    m->keep = true;  // its region is still whole: the eviction is given up when the drain ends
    return {};
  }
  if (m->region->reserved()) return {};
  AIRS_TRY(pool_.reserve_region(*m->region));
  start_fill(*m);
  return {};
}

Result<Pager::Drain> Pager::unload(ModelId id) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "unload: no model {}", id);
  m->retire = Model::Retire::Unload;
  m->state = client::ModelLoadState::Unloaded;
  // Tell readers first (libairs waits see it), then revoke every mapping:
  // after the truncation an access is SIGBUS, and no page can come back.
  // It does not wait for the reads in flight (docs/retire.md): one the
  // device already runs writes pages it pinned, which the truncation took
  // out of the file and out of every mapping; one that starts later fails
  // on the daemon's mapping, which now ends at 0 (EFAULT), as do populates.
  // What waits is only the return of the pages to the pool, below.
  m->status.reset(client::ModelLoadState::Unloaded);
  publish(*m);
  Status revoked = sys::truncate_to_zero(m->region->fd(), "model '" + m->name + "' region");
  if (!revoked) spdlog::error("model '{}': {}; its mappings are NOT revoked", m->name, revoked.error().message);
  // Threads blocked in a fault of a lazy client (waiting for a unit that
  // will never be read now) retry once woken: past the new end, SIGBUS.
  std::vector<ClientKey> keys;
  for (auto& [key, c] : m->clients) {
    (void)sys::uffd_wake(c->uffd.get(), c->addr, c->len);
    keys.push_back(key);
  }
  for (auto& [key, fd] : m->requesters) keys.push_back(key);
  for (ClientKey k : keys) drop_client(id, k, "model unloaded");
  auto node = models_.extract(id);
  const bool pending = !node.mapped()->idle();
  if (pending) {
    spdlog::debug("model '{}': unloaded; its pages return once {} reads and {} populates landed", node.mapped()->name,
                  node.mapped()->in_flight, node.mapped()->populates_in_flight);
    unloading_.insert(std::move(node));
  }
  // Otherwise the node goes here: the region's destructor returns the pages.
  node = {};
  pump();
  if (!revoked) return std::move(revoked).error();
  return pending ? Drain::Pending : Drain::Done;
}

std::optional<std::vector<uint32_t>> Pager::take_access_order(ModelId id) {
  Model* m = find(id);
  if (m == nullptr || !m->recorder) return std::nullopt;
  std::vector<uint32_t> order = m->recorder->order();
  // Units read but not mapped yet are answered on their fault (READY), or
  // are plain faults once a client unregistered at residency.
  m->recorder.reset();
  return order;
}

std::vector<uint32_t> Pager::read_order(ModelId id) const {
  const Model* m = find(id);
  return m ? m->read_order : std::vector<uint32_t>{};
}

Result<ModelStats> Pager::stats(ModelId id) const {
  const Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "no model {}", id);
  ModelStats s;
  s.name = m->name;
  s.state = m->state;
  s.file_size = m->file_size;
  s.region_size = m->region->size();
  s.unit_size = m->unit;
  s.units = m->plan.unit_count();
  s.units_ready = m->plan.ready();
  s.units_in_flight = m->plan.in_flight();
  s.units_failed = m->plan.failed();
  s.resident_bytes = uint64_t{s.units_ready} * m->unit;
  s.clients = static_cast<uint32_t>(m->clients.size());
  s.bytes_read = m->bytes_read;
  const auto end = m->fill_end != Clock::time_point{} ? m->fill_end : Clock::now();
  const double secs = std::chrono::duration<double>(end - m->fill_start).count();
  s.read_mb_per_s = secs > 0 ? static_cast<double>(m->bytes_read) / 1e6 / secs : 0;
  s.direct_io = m->gguf_direct.valid();
  s.pin_failed = m->pin_warned;
  s.copy_fill = m->copy_fill;
  s.faults = m->faults;
  s.faults_waited = m->faults_waited;
  s.ready_latency = m->ready_latency;
  s.wait_latency = m->wait_latency;
  return s;
}

}  // namespace airs::pager
