// SPDX-License-Identifier: Apache-2.0
#include "pager/pager.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"
#include "util/units.hpp"

namespace airs::pager {

// The pager's one record of a model: its identity and region, the engine's
// part (reads), and what is in the region (Residency). The clients of the
// model are the ClientService's record, under the same id.
struct Pager::Model {
  ModelId id = 0;
  std::string name;
  uint64_t file_size = 0;
  uint64_t unit = 0;
  std::unique_ptr<pool::Region> region;
  sys::SealedMemfd status_page;  // written here, handed out read-only
  FillSource fill;
  std::optional<Residency> res;
  bool unloading = false;  // out of the table; its reads land, then it goes
  // Streamed: units being dropped that cooperative clients still hold open,
  // and until when they may take to close them.
  struct Close {
    std::set<ClientKey> holders;
    Clock::time_point deadline;
  };
  std::map<uint32_t, Close> closes;
  // Streamed mixture of experts: the units of a touched expert's three
  // slices that are not in, with the client that touched it (read first).
  std::deque<std::pair<uint32_t, ClientKey>> expert_queue;
  // Per client, the layer it touches experts of now and the experts of it
  // it touched since: the experts it uses now (first_touch_of_use).
  struct InUse {
    uint32_t layer = UINT32_MAX;
    std::vector<uint32_t> experts;
  };
  std::map<ClientKey, InUse> in_use;
  // Units of hinted experts to read, with the client whose hint named them
  // (its next hint replaces what is left).
  std::deque<std::pair<uint32_t, ClientKey>> hint_queue;
  // The same for predicted experts, read only once no hinted unit waits
  // (a client's next hint or prediction replaces what is left).
  std::deque<std::pair<uint32_t, ClientKey>> predict_queue;
  // Streamed, while a budget cut drops units: the budget it shrinks to.
  std::optional<uint32_t> shrink_to;
  Clock::time_point fill_start{};
  Clock::time_point fill_end{};
  bool pin_warned_adopt = false;
};

Pager::Pager(sys::EventLoop& loop, pool::Pool& pool, PagerOptions opts, Listeners listeners)
    : loop_(loop), pool_(pool), opts_(opts), clients_(loop, *this), listeners_(std::move(listeners)) {}

Pager::~Pager() {
  // Nothing above us may hear of what still completes.
  listeners_ = {};
  if (engine_ && !engine_->shutdown()) {
    // Reads still write through the daemon's mappings: those regions stay
    // mapped (leaked, the process is exiting) so no read lands in memory
    // that a later mapping reuses.
    for (auto* tab : {&models_, &unloading_})
      for (auto& [id, m] : *tab)
        if (!m->fill.idle()) (void)m->region.release();
  }
  if (close_timer_) loop_.remove(close_timer_->fd());
}

Result<std::unique_ptr<Pager>> Pager::create(sys::EventLoop& loop, pool::Pool& pool, PagerOptions opts,
                                             Listeners listeners) {
  if (opts.queue_depth == 0) opts.queue_depth = 1;
  if (!opts.uffd_clients) opts.background_warmup = true;
  auto p = std::unique_ptr<Pager>(new Pager(loop, pool, opts, std::move(listeners)));
  FillOptions fo;
  fo.queue_depth = opts.queue_depth;
  fo.allocate_ahead = opts.allocate_ahead;
  fo.warmup_bytes_per_s = opts.warmup_bytes_per_s;
  fo.direct_io = opts.direct_io;
  fo.copy_fill = opts.copy_fill;
  fo.io_priorities = opts.io_priorities;
  auto e = FillEngine::create(loop, pool, fo, *p);
  if (!e) return std::move(e).error();
  p->engine_ = std::move(e).value();
  auto t = sys::OneShotTimer::create();
  if (!t) return std::move(t).error();
  p->close_timer_.emplace(std::move(t).value());
  Pager* self = p.get();
  AIRS_TRY(loop.add(p->close_timer_->fd(), EPOLLIN, [self](uint32_t) {
    self->close_timer_->acknowledge();
    self->on_close_timer();
  }));
  return p;
}

Pager::Model* Pager::find(ModelId id) const {
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second.get();
}

Pager::Model* Pager::find_any(ModelId id) const {
  if (Model* m = find(id)) return m;
  auto it = unloading_.find(id);
  return it == unloading_.end() ? nullptr : it->second.get();
}

namespace {

Status check_spec(const ModelSpec& spec, uint64_t unit) {
  if (spec.file_size == 0) return make_error(EINVAL, "model '{}': empty file", spec.name);
  if (!spec.gguf) return make_error(EBADF, "model '{}': no file descriptor", spec.name);
  for (const Extent& e : spec.extents)
    if (e.offset > spec.file_size || e.length > spec.file_size - e.offset)
      return make_error(EINVAL, "model '{}': extent [{}, +{}) lies past the end of the {}-byte file", spec.name,
                        e.offset, e.length, spec.file_size);
  if (pool::pages_for(spec.file_size, unit) > UINT32_MAX / 4) return make_error(EFBIG, "model '{}': too large", spec.name);
  return {};
}

}  // namespace

// A streamed model's unit. A mixture of experts on a pool that hands pages
// over per unit (shmem) is cut in opts_.expert_unit: a token reads a few
// experts of each layer, each about a unit's size in the models we measured,
// and a 2 MiB unit reads the neighbours' bytes with them (bench/moe, 100
// MB/s, shmem modes: 26-50 MiB a token at 512 KiB against 110-131 at
// 2 MiB, docs/streaming.md). A dense model reads every byte of every layer
// each token, so a smaller unit reads no less and loses the huge folios (a
// fill about 2.5x slower on fast storage); it, and every model on
// hugetlbfs (a huge page is filled and mapped whole), keeps the pool's
// page.
uint64_t Pager::stream_unit(const ModelSpec& spec) const {
  const uint64_t page = pool_.page_size(), unit = opts_.expert_unit;
  if (unit == 0 || unit >= page || page % unit != 0 || unit % sys::base_page_size() != 0 ||
      !pool_.backend().hands_over_per_unit())
    return page;
  const bool experts =
      std::any_of(spec.extents.begin(), spec.extents.end(), [](const Extent& e) { return e.access == Access::Expert; });
  return experts ? unit : page;
}

UnitSteps Pager::stream_steps(const ModelSpec& spec) const {
  return unit_steps(spec.extents, spec.file_size, stream_unit(spec));
}

// The read-ahead of a streamed model: a tenth of what one token streams
// (bytes read per token over the optimum is then at most about 1.1), at
// least 2 (one unit read while the client uses the one before), at most
// the queue depth.
uint32_t Pager::stream_window(const ModelSpec& spec, uint32_t budget_units) const {
  if (opts_.stream_window != 0) return opts_.stream_window;
  const StreamPolicy probe(stream_steps(spec), 1);
  const uint32_t streams = probe.cyclic_units() > budget_units ? probe.cyclic_units() - budget_units : 1;
  return std::clamp<uint32_t>((streams + 9) / 10, 2, std::max<uint32_t>(2, opts_.queue_depth));
}

// In whole pool pages: the pool charges a budget by the page.
uint64_t Pager::stream_floor_bytes(const ModelSpec& spec) const {
  const uint64_t unit = stream_unit(spec);
  const StreamPolicy probe(stream_steps(spec), 2, ExpertLayout(spec.extents, spec.file_size, unit));
  return pool::pages_for(uint64_t{probe.floor_units()} * unit, pool_.page_size()) * pool_.page_size();
}

Result<ModelId> Pager::load(ModelSpec spec) {
  const uint64_t page = pool_.page_size();
  AIRS_TRY(check_spec(spec, page));
  const uint64_t pages = pool::pages_for(spec.file_size, page);
  const uint64_t budget = spec.budget_bytes / page;
  if (spec.budget_bytes != 0 && budget < pages) {
    const uint64_t unit = stream_unit(spec);
    AIRS_TRY(check_spec(spec, unit));
    const uint64_t floor = stream_floor_bytes(spec);
    if (budget * page < floor)
      return make_error(ENOSPC,
                        "model '{}' ({}) is streamed through the pool, and streaming it needs at least {} of pool "
                        "pages (its largest layer, a row of the embeddings and the read-ahead); it may have {}",
                        spec.name, format_bytes(spec.file_size), format_bytes(floor), format_bytes(budget * page));
    auto region = pool_.create_streamed_region(spec.name, spec.file_size, budget, unit);
    if (!region) return std::move(region).error();
    return install(std::move(spec), std::move(region).value(), false);
  }
  auto region = pool_.create_model_region(spec.name, spec.file_size);
  if (!region) return std::move(region).error();
  spec.budget_bytes = 0;
  return install(std::move(spec), std::move(region).value(), false);
}

Result<ModelId> Pager::adopt(ModelSpec spec, std::unique_ptr<pool::Region> region) {
  AIRS_TRY(check_spec(spec, pool_.page_size()));
  if (!region || region->size() < spec.file_size)
    return make_error(EINVAL, "model '{}': the kept region does not hold the file", spec.name);
  spec.budget_bytes = 0;
  return install(std::move(spec), std::move(region), true);
}

Result<ModelId> Pager::install(ModelSpec spec, std::unique_ptr<pool::Region> region, bool filled) {
  const uint64_t unit = region->unit_size();
  const auto units = static_cast<uint32_t>(pool::pages_for(spec.file_size, unit));
  const ModelId id = spec.id != 0 ? spec.id : next_id_++;
  if (models_.contains(id) || unloading_.contains(id))
    return make_error(EEXIST, "model '{}': id {} is in use", spec.name, id);
  next_id_ = std::max(next_id_, id + 1);
  auto m = std::make_unique<Model>();
  m->id = id;
  m->name = spec.name;
  m->file_size = spec.file_size;
  m->unit = unit;
  m->region = std::move(region);
  const bool streamed = m->region->streamed();
  // In units: the pool's charge is in pages, each of page / unit units.
  const auto budget = static_cast<uint32_t>(m->region->charged_pages() * (pool_.page_size() / unit));

  FillPlan plan(rank_units(spec.extents, spec.file_size, unit), opts_.prefetch_window);
  if (!spec.warmup_order.empty() && !streamed) {
    if (plan.set_warmup_order(spec.warmup_order))
      spdlog::info("model '{}': warm-up follows the recorded access order ({} of {} units first)", spec.name,
                   spec.warmup_order.size(), units);
    else
      spdlog::warn("model '{}': the recorded access order does not fit this model; warm-up in layer order",
                   spec.name);
  }
  // Status page: written here, sealed, handed out read-only.
  const uint64_t sp_bytes = wire::status_page_bytes(units, static_cast<uint32_t>(plan.ranks().size()));
  auto page = sys::SealedMemfd::create("airs-status:" + spec.name, sp_bytes);
  if (!page) return std::move(page).error();
  m->status_page = std::move(page).value();
  m->res.emplace(std::move(plan), wire::StatusPageWriter(m->status_page.bytes(), sp_bytes), unit, spec.file_size,
                 streamed ? stream_steps(spec) : UnitSteps{}, budget,
                 streamed ? stream_window(spec, budget) : 0,
                 streamed ? ExpertLayout(spec.extents, spec.file_size, unit) : ExpertLayout{});
  if (spec.record_access && !streamed) m->res->recorder().emplace(units);

  m->fill.id = id;
  m->fill.name = spec.name;
  m->fill.gguf = std::move(spec.gguf);
  m->fill.file_size = spec.file_size;
  m->fill.capped_owner = spec.capped_owner;
  m->fill.async_reads = spec.async_reads;
  m->fill.unit = unit;
  m->fill.region = m->region.get();
  AIRS_TRY(engine_->add(m->fill, std::move(spec.gguf_direct)));
  ClientModelInfo info;
  info.name = spec.name;
  info.unit = unit;
  info.mapping_page = std::string_view(pool_.backend().name()) == "hugetlbfs" ? unit : sys::base_page_size();
  info.region_size = m->region->size();
  info.units = units;
  info.uffd_clients = opts_.uffd_clients;
  clients_.add_model(id, info);

  Model& ref = *m;
  models_.emplace(id, std::move(m));
  ref.fill_start = Clock::now();
  if (filled) {
    // Every byte is there already (an earlier daemon filled it): ready as
    // it is, nothing is read. shmem: the pages are in the file but not in
    // this daemon's mapping, so a lock-on-fault mapping holds none of them
    // (no fault brought them in); pin the whole region, which maps and
    // locks every page (mlock), like a fresh fill's.
    if (auto st = pool_.backend().pin(ref.region->fd(), ref.region->data(), 0, uint64_t{units} * unit, 0,
                                      "model '" + ref.name + "' (adopted)");
        !st) {
      spdlog::warn("model '{}': {}", ref.name, st.error().message);
      ref.fill.pin_warned = true;
    }
    ref.res->all_ready();
    publish(ref);
    check_resident(ref);
    spdlog::info("model '{}': {} in {} units of {}, adopted filled", ref.name, format_bytes(ref.file_size), units,
                 format_bytes(unit));
    return id;
  }
  engine_->restart(ref.fill);
  publish(ref);
  if (streamed)
    spdlog::info("model '{}': {} in {} units of {}, streamed through a budget of {} ({} units, {} read ahead), {} "
                 "reads",
                 ref.name, format_bytes(ref.file_size), units, format_bytes(unit), format_bytes(uint64_t{budget} * unit),
                 budget, ref.res->policy().window(), ref.fill.gguf_direct ? "O_DIRECT" : "buffered");
  else
    spdlog::info("model '{}': {} in {} units of {}, {} reads{}", ref.name, format_bytes(ref.file_size), units,
                 format_bytes(unit), ref.fill.gguf_direct ? "O_DIRECT" : "buffered",
                 ref.fill.copy_fill ? ", copied into the region through a bounce buffer" : "");
  pump();
  return id;
}

int Pager::gguf_fd(ModelId id) const {
  const Model* m = find(id);
  return m != nullptr ? m->fill.gguf.get() : -1;
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

bool Pager::streamed(ModelId id) const {
  const Model* m = find(id);
  return m != nullptr && m->res->streamed();
}

bool Pager::takes_hints(ModelId id) const {
  const Model* m = find(id);
  return m != nullptr && m->res->streamed() && !m->res->policy().experts().empty();
}

std::vector<ModelId> Pager::models() const {
  std::vector<ModelId> out;
  for (const auto& [id, m] : models_) out.push_back(id);
  return out;
}

void Pager::publish(Model& m) {
  m.res->publish();
  sys::futex_wake_all(m.res->status().generation_word());
}

// --- reads -----------------------------------------------------------------

bool Pager::read(Model& m, uint32_t unit, ReadClass cls) {
  if (auto st = engine_->read(m.fill, unit, cls); !st) {
    // A streamed model's budget has no page for it now: not a failure of
    // the unit (the next room made reads it).
    if (m.res->streamed() && st.error().code == ENOSPC) {
      spdlog::warn("model '{}': unit {} waits: {}", m.name, unit, st.error().message);
      return false;
    }
    unit_read_failed(m.id, unit, st.error().code);
    return true;
  }
  m.res->read_started(unit);
  return true;
}

// Free read slots go to faulted units of any model first, then the prefetch
// windows and read-ahead, then the background warm-up.
void Pager::pump() {
  if (engine_->closing()) return;
  for (ReadClass cls : {ReadClass::Urgent, ReadClass::Prefetch, ReadClass::Background}) {
    if (cls == ReadClass::Background && !opts_.background_warmup) break;
    bool progress = true;
    while (progress && engine_->slot_free()) {
      progress = false;
      for (auto& [id, m] : models_) {
        if (!engine_->slot_free()) break;
        if (!m->fill.accepting || !engine_->slot_free_for(m->fill)) continue;
        if (!m->res->streamed()) {
          pump_fitting(*m, cls, progress);
          continue;
        }
        // A streamed model: its faulted units, then one unit ahead of its
        // clients per round (its warm-up is the read-ahead).
        const uint32_t before = engine_->reads_active();
        if (cls == ReadClass::Urgent) {
          if (auto u = m->res->plan().next(ReadClass::Urgent); u && make_room(*m, 0, true)) read(*m, *u, ReadClass::Urgent);
        } else if (cls == ReadClass::Prefetch) {
          if (!pump_hinted(*m)) pump_streamed(*m);
        }
        if (engine_->reads_active() != before) progress = true;
      }
    }
  }
  // Pages of the next units the prefetch and background classes will read,
  // allocated ahead (models that fit; a streamed model's pages come from its
  // budget one read at a time).
  if (opts_.allocate_ahead > 0)
    for (auto& [id, m] : models_) {
      if (!m->fill.accepting || m->res->streamed()) continue;
      std::vector<uint32_t> next = m->res->plan().peek(ReadClass::Prefetch, opts_.allocate_ahead);
      if (opts_.background_warmup) {
        auto bg = m->res->plan().peek(ReadClass::Background, opts_.allocate_ahead);
        next.insert(next.end(), bg.begin(), bg.end());
      }
      engine_->populate(m->fill, next);
    }
  engine_->submit();
}

void Pager::pump_fitting(Model& m, ReadClass cls, bool& progress) {
  auto u = m.res->plan().next(cls);
  if (!u) return;
  if (cls == ReadClass::Background && !engine_->background_allowed(m.unit)) return;
  if (read(m, *u, cls)) progress = true;
}

// One read ahead of a streamed model's clients: the nearest unit they will
// need that is not in (warm-up from the first layer before any client came),
// into a free unit of the budget, or in place of a unit needed later than it.
void Pager::pump_streamed(Model& m) {
  Residency& r = *m.res;
  const StreamPolicy& p = r.policy();
  const uint32_t budget = m.shrink_to ? std::min(*m.shrink_to, r.budget()) : r.budget();
  const auto wanted = [&](uint32_t u) { return r.plan().state(u) == UnitState::Empty; };
  if (r.held() < budget) {
    // Free room: the next unit in cycle order, however far (nothing goes).
    const std::vector<uint32_t> next = p.ahead(1, wanted);
    if (!next.empty()) read(m, next.front(), ReadClass::Prefetch);
    return;
  }
  // A full budget: only what is needed within the window, in place of what
  // is needed later (StreamPolicy::ahead says why no further).
  const std::vector<uint32_t> next = p.ahead(1, wanted, p.window());
  if (!next.empty() && make_room(m, p.distance(next.front()), false)) read(m, next.front(), ReadClass::Prefetch);
}

// One read of a unit of a touched expert's slices (fetch_expert), else of
// a hinted expert's unit, before the read-ahead of the dense part (both
// name what the client reads within its current layer). Room comes only
// from cold units and experts no client protects: each is a guess made
// ahead, and never takes the dense part or what a client reads now
// (make_room with no distance the dense part is farther than).
// Then the units of predicted experts, the same way.
bool Pager::pump_hinted(Model& m) {
  Residency& r = *m.res;
  // The first queue with a unit still to read, in that order.
  const auto next = [&]() -> std::deque<std::pair<uint32_t, ClientKey>>* {
    for (auto* q : {&m.expert_queue, &m.hint_queue, &m.predict_queue}) {
      while (!q->empty() && r.plan().state(q->front().first) != UnitState::Empty) q->pop_front();
      if (!q->empty()) return q;
    }
    return nullptr;
  };
  if (next() == nullptr || !make_room(m, UINT64_MAX, false)) return false;
  // Making room may have dropped a client (one that takes no messages), and
  // its queued units with it.
  auto* q = next();
  if (q == nullptr) return false;
  const uint32_t u = q->front().first;
  q->pop_front();
  if (!read(m, u, ReadClass::Prefetch)) return false;
  if (q == &m.predict_queue) r.predicted_read();
  else if (q == &m.hint_queue) r.hinted_read();
  return true;
}

bool Pager::make_room(Model& m, uint64_t distance, bool urgent) {
  Residency& r = *m.res;
  const uint32_t budget = m.shrink_to ? std::min(*m.shrink_to, r.budget()) : r.budget();
  if (r.held() < budget) return true;
  // Drops already on their way (cooperative clients closing units) cover as
  // many needs: never more than the window of them at once.
  if (m.closes.size() >= r.policy().window()) return false;
  const auto busy = [&](uint32_t u) { return clients_.waits_for(m.id, u); };
  const std::vector<uint32_t> candidates = r.droppable(busy);
  const auto v = r.policy().victim(candidates, distance, urgent);
  if (!v) return false;
  return drop(m, *v) && r.held() < budget;
}

// Drops READY unit `u` of a streamed model: its READY bit goes first, so no
// cooperative client opens it from now on; those that have it open are
// asked to close it. Its page goes once none has it open (lazy clients lose
// it with the punch itself).
bool Pager::drop(Model& m, uint32_t u) {
  m.res->begin_drop(u);
  publish(m);
  const std::set<ClientKey> holders = clients_.ask_to_close(m.id, u);
  if (holders.empty()) {
    finish_drop(m, u);
    return true;
  }
  m.closes[u] = Model::Close{holders, Clock::now() + opts_.close_timeout};
  arm_close_timer();
  return false;
}

void Pager::finish_drop(Model& m, uint32_t u) {
  m.closes.erase(u);
  if (auto st = pool_.release_unit(*m.region, u); !st) {
    // The bytes are still whole: the unit stays, READY again.
    spdlog::error("model '{}': dropping unit {}: {}", m.name, u, st.error().message);
    m.res->cancel_drop(u);
    publish(m);
    return;
  }
  m.res->dropped(u);
  if (m.shrink_to) shrink_to_target(m);
}

void Pager::closed(ModelId id, ClientKey key, uint32_t unit) {
  Model* m = find(id);
  if (m == nullptr) return;
  auto it = m->closes.find(unit);
  if (it == m->closes.end()) return;
  if (clients_.holds_open(id, key, unit)) return;  // it answered, but its mark is still set: wait for the deadline
  it->second.holders.erase(key);
  if (it->second.holders.empty()) finish_drop(*m, unit);
}

void Pager::arm_close_timer() {
  Clock::time_point next = Clock::time_point::max();
  for (const auto& [id, m] : models_)
    for (const auto& [u, c] : m->closes) next = std::min(next, c.deadline);
  if (next == Clock::time_point::max()) return;
  const auto delay = std::max<Clock::duration>(next - Clock::now(), std::chrono::milliseconds(1));
  if (auto st = close_timer_->arm(delay); !st) spdlog::error("pager: close deadline timer: {}", st.error().message);
}

// Cooperative clients that did not close a unit in time: the unit stays
// (READY again: its bytes never went), and each such client is counted. A
// client past its quota of refusals is cut off (ClientService::refused):
// SIGBUS to its process before anything it may still read goes.
void Pager::on_close_timer() {
  const auto now = Clock::now();
  for (auto& [id, m] : models_) {
    std::vector<uint32_t> expired;
    for (const auto& [u, c] : m->closes)
      if (c.deadline <= now) expired.push_back(u);
    for (uint32_t u : expired) {
      auto holders = m->closes[u].holders;
      std::set<ClientKey> still;
      for (ClientKey k : holders)
        if (clients_.holds_open(id, k, u)) still.insert(k);
      if (still.empty()) {
        finish_drop(*m, u);
        continue;
      }
      m->closes.erase(u);
      m->res->drop_refused(u);
      publish(*m);
      for (ClientKey k : still) clients_.refused(id, k, u, m->res->policy().window() + 8);
    }
  }
  continue_cuts();  // a unit a cut dropped stayed: the cut takes another
  arm_close_timer();
  pump();
}

// Every budget cut still on its way drops what it still needs to (a cut
// waits for reads in flight, closes, refusals: each ends here or in
// finish_drop). By id: the drain listener a finished cut calls may load
// models.
void Pager::continue_cuts() {
  std::vector<ModelId> cuts;
  for (const auto& [id, m] : models_)
    if (m->shrink_to) cuts.push_back(id);
  for (ModelId id : cuts)
    if (Model* m = find(id); m != nullptr && m->shrink_to) shrink_to_target(*m);
}

void Pager::shrink_to_target(Model& m) {
  const uint32_t target = *m.shrink_to;
  Residency& r = *m.res;
  // Units on their way out (cooperative clients closing them) count as
  // gone: every drop the cut needs starts at once, and none twice (the cut
  // goes on at each event, and it once started another drop at each while
  // a close was on its way, past its budget).
  const auto busy = [&](uint32_t u) { return clients_.waits_for(m.id, u); };
  while (r.held() - static_cast<uint32_t>(r.closing_units().size()) > target) {
    const auto v = r.policy().victim(r.droppable(busy), 0, true);
    if (!v) break;
    (void)drop(m, *v);
  }
  // A drop that finished at once ended the cut in finish_drop already.
  if (!m.shrink_to) return;
  if (r.held() > target) return;  // drops and reads on their way: finish_drop and continue_cuts come back
  if (auto st = pool_.set_budget(*m.region, pool::pages_for(uint64_t{target} * m.unit, pool_.page_size())); !st) {
    spdlog::error("model '{}': a budget of {} units: {}", m.name, target, st.error().message);
  } else {
    r.set_budget(target);
    spdlog::info("model '{}': streaming budget cut to {} ({} units)", m.name, format_bytes(uint64_t{target} * m.unit),
                 target);
  }
  m.shrink_to.reset();
  if (listeners_.drain) listeners_.drain(m.id, Drained::Shrunk);
}

Result<Pager::Drain> Pager::set_budget(ModelId id, uint64_t bytes) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "set_budget: no model {}", id);
  if (!m->res->streamed()) return make_error(EINVAL, "model '{}' is not streamed: it has no budget", m->name);
  // Whole pool pages, fewer than the region's: the pool charges by the page.
  const uint64_t page = pool_.page_size();
  const auto target =
      static_cast<uint32_t>(std::min<uint64_t>(bytes / page, m->region->pages() - 1) * (page / m->unit));
  const uint32_t floor = m->res->policy().floor_units();
  if (target < floor)
    return make_error(EINVAL, "model '{}': a budget of {} is below its floor of {} (its largest layer and read-ahead)",
                      m->name, format_bytes(uint64_t{target} * m->unit), format_bytes(uint64_t{floor} * m->unit));
  if (target >= m->res->budget()) {
    AIRS_TRY(pool_.set_budget(*m->region, pool::pages_for(uint64_t{target} * m->unit, page)));
    m->res->set_budget(target);
    m->shrink_to.reset();
    pump();
    return Drain::Done;
  }
  m->shrink_to = target;
  const DrainListener keep = std::move(listeners_.drain);
  listeners_.drain = {};  // a cut finished inside this call is Done, not an event
  shrink_to_target(*m);
  listeners_.drain = keep;
  return m->shrink_to ? Drain::Pending : Drain::Done;
}

bool Pager::budget_cut_pending(ModelId id) const {
  const Model* m = find(id);
  return m != nullptr && m->shrink_to.has_value();
}

uint64_t Pager::floor_bytes(ModelId id) const {
  const Model* m = find(id);
  if (m == nullptr || !m->res->streamed()) return 0;
  return pool::pages_for(uint64_t{m->res->policy().floor_units()} * m->unit, pool_.page_size()) * pool_.page_size();
}

// --- completions -----------------------------------------------------------

void Pager::unit_read(ModelId id, uint32_t unit) {
  Model* m = find_any(id);
  if (m == nullptr || m->unloading) return;
  m->res->read_done(unit);
}

void Pager::unit_read_failed(ModelId id, uint32_t unit, int err) {
  Model* m = find_any(id);
  if (m == nullptr || m->unloading) return;
  m->res->read_failed(unit);
  // A streamed model's failed unit gives its page back (every touch of it
  // gets SIGBUS from now on; the budget streams on without it).
  if (m->res->streamed()) (void)pool_.release_unit(*m->region, unit);
  publish(*m);
  spdlog::error("model '{}': reading bytes [{}, +{}) failed: {}; faults there get SIGBUS", m->name,
                uint64_t{unit} * m->unit, m->unit, std::strerror(err));
  if (listeners_.state) listeners_.state(m->id, wire::ModelLoadState::Failed);
  clients_.poison(m->id, unit);
}

void Pager::reaped() {
  map_ready();  // before a drain's end (a CONTINUE after an unload's truncation finds nothing)
  // A budget cut that waited for reads in flight (their units hold pages of
  // the budget but cannot be dropped before they land) goes on now. It used
  // to wait for the next read a client asked for: for ever on a model that
  // nobody read, with the pages it was to give back kept, and the daemon's
  // restore of the budget waiting for the cut to end.
  continue_cuts();
  end_drains();
  pump();  // the slots the drained models held go to the others
  bool loading = false;
  for (const auto& [id, m] : models_)
    if (m->res->state() == wire::ModelLoadState::Loading || m->res->streamed()) loading = true;
  engine_->free_bounce_if(!loading);
}

// After a reap: publish the units that completed in it and map them into
// the clients (saving their future faults), one range CONTINUE per run of
// adjacent units and client instead of one per unit (a reap at queue depth
// 16 often completes neighbours together). Waiters wake with the CONTINUE.
// A streamed model's units (and any model's while its access order is
// recorded) go only to the clients that wait for them: the others' touch
// must fault, so the daemon sees where they are. Runs before
// check_resident, so no client is told "resident" (and may unregister)
// before its last units are mapped.
void Pager::map_ready() {
  for (auto& [id, mp] : models_) {
    Model& m = *mp;
    std::vector<uint32_t> units = m.res->take_newly_ready();
    if (units.empty()) continue;
    publish(m);
    if (m.res->streamed() || m.res->recorder()) {
      for (uint32_t u : units) clients_.release_waiters(id, u);
    } else {
      for (size_t i = 0; i < units.size();) {
        size_t e = i + 1;
        while (e < units.size() && units[e] == units[e - 1] + 1) ++e;
        clients_.map(id, units[i], static_cast<uint32_t>(e - i));
        i = e;
      }
    }
    check_resident(m);
  }
}

void Pager::check_resident(Model& m) {
  if (!m.res->became_resident()) return;
  m.fill_end = Clock::now();
  publish(m);
  clients_.notify_resident(m.id);
  spdlog::info("model '{}': fully resident ({} read)", m.name, format_bytes(m.fill.bytes_read));
  if (listeners_.state) listeners_.state(m.id, wire::ModelLoadState::Resident);
}

// --- clients ----------------------------------------------------------------

Status Pager::attach(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd uffd, sys::UniqueFd notify, uint64_t addr,
                     uint64_t length) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "attach: no model {}", id);
  // Every ready unit at once, one range CONTINUE per run (a streamed model's
  // on their fault, so that the daemon sees where the client is; while
  // recording, only units already seen: the rest must fault).
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  if (!m->res->streamed()) {
    const auto& r = *m->res;
    const auto& rec = m->res->recorder();
    const uint32_t n = r.units();
    auto mappable = [&](uint32_t u) { return r.plan().state(u) == UnitState::Ready && (!rec || rec->seen(u)); };
    for (uint32_t u = 0; u < n;) {
      if (!mappable(u)) {
        ++u;
        continue;
      }
      uint32_t e = u;
      while (e < n && mappable(e)) ++e;
      ranges.emplace_back(u, e - u);
      u = e;
    }
  }
  const bool resident = m->res->state() == wire::ModelLoadState::Resident;
  AIRS_TRY(clients_.attach(id, key, pid, std::move(uffd), std::move(notify), addr, length, ranges, resident));
  pump();
  return {};
}

void Pager::detach(ModelId id, ClientKey key) { clients_.detach(id, key, "detached"); }

Status Pager::follow(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd requests, sys::UniqueFd opened) {
  if (find(id) == nullptr) return make_error(ENOENT, "follow: no model {}", id);
  return clients_.follow(id, key, pid, std::move(requests), std::move(opened));
}

void Pager::touched(ModelId id, ClientKey key, uint32_t unit, Touch how, uint64_t address, Clock::time_point t0) {
  Model* m = find(id);
  if (m == nullptr) return;
  Residency& r = *m->res;
  // Asked again for a unit it waits for: where the client is, but no
  // second fault, wait or expert use.
  const bool again = how == Touch::RequestAgain;
  if (r.recorder() && !again) r.recorder()->note(unit);
  r.touched(key, unit);
  // A mixture of experts: the expert whose bytes were touched (when the
  // touch tells), which the policy counts as a use.
  std::optional<uint32_t> expert;
  bool first_use = false;
  if (r.streamed() && !r.policy().experts().empty() && !again) {
    uint64_t lo = uint64_t{unit} * m->unit, hi = lo + m->unit;
    if (how == Touch::Fault)
      if (auto page = clients_.fault_bytes(id, key, address)) lo = page->first, hi = page->second;
    expert = r.policy().experts().expert_of_touch(unit, lo, hi);
    if (expert) {
      first_use = first_touch_of_use(*m, key, *expert);
      r.touched_expert(key, *expert, true, first_use);
    } else if (r.plan().state(unit) != UnitState::Ready) {
      // A miss whose expert is not known: each of the unit's is counted.
      // A touch of a unit that was in (a hit, as access sampling makes
      // them) counts none: it would give every expert of the unit what one
      // of them did.
      // One the client uses now was counted already.
      for (uint32_t k : r.policy().experts().keys_of(unit))
        if (!uses_now(*m, key, k)) r.touched_expert(key, k, false);
    }
  }
  // A unit on its way out that a client wants again stays.
  if (r.closing(unit)) {
    m->closes.erase(unit);
    r.cancel_drop(unit);
    publish(*m);
  }
  switch (r.plan().state(unit)) {
    case UnitState::Ready:
      // A touch of a unit that was in: a hit the daemon sees (a client's
      // access sampling makes them; otherwise it sees only misses).
      if (how == Touch::Fault || how == Touch::OpenedIn) r.touched_in();
      if (how == Touch::Fault) clients_.answer(id, key, unit, address, t0);
      break;
    case UnitState::Failed:
      if (how == Touch::Fault) clients_.poison(id, unit, key);
      return;
    case UnitState::Empty:
    case UnitState::InFlight:
      // It opened a unit that is not in: it sees SIGBUS or waits, its business.
      if (how == Touch::Opened || how == Touch::OpenedIn) return;
      if (!again) clients_.wait(id, key, unit, t0);
      r.plan().on_fault(unit);
      break;
  }
  if (expert && first_use) fetch_expert(*m, key, *expert);
}

// The client uses `expert` now: it touched it since it last touched an
// expert of another layer.
bool Pager::uses_now(const Model& m, ClientKey key, uint32_t expert) const {
  const auto it = m.in_use.find(key);
  return it != m.in_use.end() && it->second.layer == m.res->policy().experts().key(expert).layer &&
         std::find(it->second.experts.begin(), it->second.experts.end(), expert) != it->second.experts.end();
}

// A touch of `expert` is the first of its use by this client unless the
// client uses it now (uses_now). A later touch of the same use is neither
// another use for the cache to count nor a reason to read its slices
// again: by then the client has read part of them, and a unit it read that
// went since is not needed before the expert's next use. Counting every
// touch gave an expert as many uses as units the client happened to fault
// on, which is chance where access sampling makes those faults (bench/moe,
// llama.cpp through the preload in small-pages mode at 512 KiB units: 92.5
// and 95.7 MiB a token at 2.29x and 4x the pool before, 84.5 and 81.7
// after).
bool Pager::first_touch_of_use(Model& m, ClientKey key, uint32_t expert) {
  if (uses_now(m, key, expert)) return false;
  Model::InUse& u = m.in_use[key];
  const uint32_t layer = m.res->policy().experts().key(expert).layer;
  if (u.layer != layer) {
    u.layer = layer;
    u.experts.clear();
  }
  u.experts.push_back(expert);
  return true;
}

// The token reads an expert's gate, up and down slices one after the
// other: on the first touch of any of them, every unit of the three that is
// not in is queued to be read in the same pump as the touched one
// (touches_done pumps): one batch of parallel reads instead of one fault
// round trip each. The units of the neighbouring experts are not (an edge
// unit they share is one of this expert's). Units on their way out stay.
// The touched unit is a client's wait (urgent: it may take room from
// anything); the others are a guess that the client reads them next, so
// they take room as a hint does (pump_hinted): when two clients read two
// experts at once, their batches must not push out the dense part every
// token reads.
// Once per use (first_touch_of_use).
void Pager::fetch_expert(Model& m, ClientKey key, uint32_t expert) {
  Residency& r = *m.res;
  bool published = false;
  for (uint32_t u : r.policy().experts().units_of(expert)) {
    if (r.closing(u)) {
      m.closes.erase(u);
      r.cancel_drop(u);
      published = true;
    }
    if (r.plan().state(u) != UnitState::Empty || clients_.waits_for(m.id, u)) continue;
    if (std::none_of(m.expert_queue.begin(), m.expert_queue.end(), [u](const auto& e) { return e.first == u; }))
      m.expert_queue.emplace_back(u, key);
  }
  if (published) publish(m);
}

Status Pager::hints(ModelId id, ClientKey key, pid_t pid, sys::UniqueFd socket) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "hints: no model {}", id);
  if (!m->res->streamed())
    return make_error(ENOTSUP, "model '{}' fits in its pool pages (it is not streamed): expert hints are for streamed "
                               "mixtures of experts, whose experts come and go",
                      m->name);
  if (m->res->policy().experts().empty())
    return make_error(ENOTSUP, "model '{}' has no experts (a dense model): expert hints are for mixtures of experts",
                      m->name);
  return clients_.hints(id, key, pid, std::move(socket));
}

std::optional<std::string> Pager::hinted(ModelId id, ClientKey key, uint32_t layer, std::span<const uint32_t> experts,
                                         bool predicted) {
  Model* m = find(id);
  if (m == nullptr) return "the model is being unloaded";
  Residency& r = *m->res;
  if (!r.streamed()) return "the model fits in its pool pages (it is not streamed): there is nothing to read ahead";
  const ExpertLayout& layout = r.policy().experts();
  if (layout.empty()) return "the model has no experts (a dense model)";
  if (layer >= layout.layers())
    return fmt::format("layer {} is out of range (the model's experts are in layers below {})", layer, layout.layers());
  std::vector<uint32_t> keys;
  keys.reserve(experts.size());
  for (uint32_t e : experts) {
    const auto k = layout.find({layer, e});
    if (!k) return fmt::format("layer {} has no expert {}", layer, e);
    keys.push_back(*k);
  }
  std::sort(keys.begin(), keys.end());
  if (std::adjacent_find(keys.begin(), keys.end()) != keys.end())
    return fmt::format("it names an expert of layer {} twice", layer);
  // What is left of the client's previous prediction is not worth a read
  // now: a hint says what it reads, a new prediction guesses further on.
  std::erase_if(m->predict_queue, [key](const auto& e) { return e.second == key; });
  if (predicted) {
    // A guess: no use counted, nothing protected, no drop called back.
    const auto queued = [&](uint32_t u) {
      const auto is_u = [u](const auto& e) { return e.first == u; };
      return std::any_of(m->hint_queue.begin(), m->hint_queue.end(), is_u) ||
             std::any_of(m->predict_queue.begin(), m->predict_queue.end(), is_u);
    };
    for (uint32_t k : keys) {
      for (uint32_t u : layout.units_of(k))
        if (r.plan().state(u) == UnitState::Empty && !queued(u)) m->predict_queue.emplace_back(u, key);
    }
    return std::nullopt;
  }
  r.hinted(key, keys);
  // What is left of the client's previous hint is not worth a read now.
  std::erase_if(m->hint_queue, [key](const auto& e) { return e.second == key; });
  bool published = false;
  for (uint32_t k : keys) {
    for (uint32_t u : layout.units_of(k)) {
      if (r.closing(u)) {
        m->closes.erase(u);
        r.cancel_drop(u);
        published = true;
      }
      if (r.plan().state(u) != UnitState::Empty) continue;
      if (std::none_of(m->hint_queue.begin(), m->hint_queue.end(), [u](const auto& e) { return e.first == u; }))
        m->hint_queue.emplace_back(u, key);
    }
  }
  if (published) publish(*m);
  return std::nullopt;
}

void Pager::client_left(ModelId id, ClientKey key) {
  Model* m = find(id);
  if (m == nullptr) return;
  std::erase_if(m->expert_queue, [key](const auto& e) { return e.second == key; });
  m->in_use.erase(key);
  std::erase_if(m->hint_queue, [key](const auto& e) { return e.second == key; });
  std::erase_if(m->predict_queue, [key](const auto& e) { return e.second == key; });
  if (!m->unloading && listeners_.client_left) listeners_.client_left(id, key);
  if (m->res->streamed()) m->res->forget(key);
  std::vector<uint32_t> free_now;
  for (auto& [u, c] : m->closes)
    if (c.holders.erase(key) != 0 && c.holders.empty()) free_now.push_back(u);
  for (uint32_t u : free_now) finish_drop(*m, u);
}

// --- unload and drains ------------------------------------------------------

Result<Pager::Drain> Pager::unload(ModelId id) {
  Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "unload: no model {}", id);
  m->unloading = true;
  m->fill.accepting = false;
  m->fill.revoked = true;
  m->closes.clear();
  // Revoke every mapping first, then tell readers: after the truncation an
  // access is SIGBUS, and no page can come back. In that order, a reader
  // that sees Unloaded finds the region gone; the other way round, the
  // touch guard of a client waiting for a unit that is a hole would open
  // it on Unloaded (to take its SIGBUS) and read the hole's zeros before
  // the truncation. It does not wait for the reads in flight
  // (docs/retire.md): one the device already runs writes pages it pinned,
  // which the truncation took out of the file and out of every mapping;
  // one that starts later fails on the daemon's mapping, which now ends at
  // 0 (EFAULT), as do populates. What waits is only the return of the
  // pages to the pool, below.
  Status revoked = sys::truncate_to_zero(m->region->fd(), "model '" + m->name + "' region");
  if (!revoked) spdlog::error("model '{}': {}; its mappings are NOT revoked", m->name, revoked.error().message);
  m->res->status().reset(wire::ModelLoadState::Unloaded);
  m->res->set_state(wire::ModelLoadState::Unloaded);
  publish(*m);
  // Threads blocked in a fault (waiting for a unit that will never be read
  // now) retry once woken: past the new end, SIGBUS.
  clients_.remove_model(id);
  auto node = models_.extract(id);
  const bool pending = !node.mapped()->fill.idle();
  if (pending) {
    spdlog::debug("model '{}': unloaded; its pages return once {} reads and {} populates landed", node.mapped()->name,
                  node.mapped()->fill.in_flight, node.mapped()->fill.populates_in_flight);
    unloading_.insert(std::move(node));
  } else {
    engine_->remove(id);
  }
  // Otherwise the node goes here: the region's destructor returns the pages.
  node = {};
  pump();
  if (!revoked) return std::move(revoked).error();
  return pending ? Drain::Pending : Drain::Done;
}

// Unloads whose last read or populate landed in this reap end here: state
// first, then the listener (which may call back in).
void Pager::end_drains() {
  std::vector<ModelId> ended;
  for (auto it = unloading_.begin(); it != unloading_.end();) {
    if (!it->second->fill.idle()) {
      ++it;
      continue;
    }
    spdlog::info("model '{}': its last reads landed; {} back in the pool", it->second->name,
                 format_bytes(it->second->region->charged_pages() * it->second->unit));
    ended.push_back(it->first);
    engine_->remove(it->first);
    it = unloading_.erase(it);  // the region's destructor returns the pages: counted free from here on
  }
  if (listeners_.drain)
    for (ModelId id : ended) listeners_.drain(id, Drained::Unloaded);
}

uint64_t Pager::returning_pages() const {
  uint64_t n = 0;
  for (const auto& [id, m] : unloading_)
    if (m->region->reserved()) n += m->region->charged_pages();
  for (const auto& [id, m] : models_)
    if (m->shrink_to && *m->shrink_to < m->res->budget()) n += m->res->budget() - *m->shrink_to;
  return n;
}

bool Pager::draining(ModelId id) const { return unloading_.contains(id); }

bool Pager::finish_drains(Clock::time_point deadline) {
  return engine_->reap_until(
      [this] {
        return unloading_.empty() &&
               std::none_of(models_.begin(), models_.end(), [](const auto& e) { return e.second->shrink_to.has_value(); });
      },
      deadline);
}

std::optional<std::vector<uint32_t>> Pager::take_access_order(ModelId id) {
  Model* m = find(id);
  if (m == nullptr || !m->res->recorder()) return std::nullopt;
  std::vector<uint32_t> order = m->res->recorder()->order();
  // Units read but not mapped yet are answered on their fault (READY), or
  // are plain faults once a client unregistered at residency.
  m->res->recorder().reset();
  return order;
}

std::vector<uint32_t> Pager::read_order(ModelId id) const {
  const Model* m = find(id);
  return m ? m->res->read_order() : std::vector<uint32_t>{};
}

Result<std::vector<Pager::RankResidency>> Pager::residency(ModelId id) const {
  const Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "no model {}", id);
  const FillPlan& plan = m->res->plan();
  std::vector<RankResidency> out(plan.ranks().size());
  for (uint32_t i = 0; i < out.size(); ++i) out[i].rank = plan.ranks()[i];
  for (uint32_t u = 0; u < plan.unit_count(); ++u) {
    RankResidency& r = out[plan.rank_index(u)];
    ++r.units;
    if (plan.state(u) == UnitState::Ready) ++r.ready;
    if (plan.state(u) == UnitState::InFlight) ++r.in_flight;
    if (m->res->closing(u)) ++r.closing;
  }
  return out;
}

Result<ModelStats> Pager::stats(ModelId id) const {
  const Model* m = find(id);
  if (m == nullptr) return make_error(ENOENT, "no model {}", id);
  ModelStats s;
  const Residency& r = *m->res;
  s.name = m->name;
  s.state = r.state();
  s.file_size = m->file_size;
  s.region_size = m->region->size();
  s.unit_size = m->unit;
  s.units = r.units();
  s.units_ready = r.plan().ready();
  s.units_in_flight = r.plan().in_flight();
  s.units_failed = r.plan().failed();
  s.resident_bytes = uint64_t{s.units_ready} * m->unit;
  s.clients = clients_.lazy_clients(id) + clients_.cooperative_clients(id);
  s.bytes_read = m->fill.bytes_read;
  const auto end = m->fill_end != Clock::time_point{} ? m->fill_end : Clock::now();
  const double secs = std::chrono::duration<double>(end - m->fill_start).count();
  s.read_mb_per_s = secs > 0 ? static_cast<double>(m->fill.bytes_read) / 1e6 / secs : 0;
  s.direct_io = m->fill.gguf_direct.valid();
  s.pin_failed = m->fill.pin_warned;
  s.copy_fill = m->fill.copy_fill;
  const LatencyStats l = clients_.latency(id);
  s.faults = l.faults;
  s.faults_waited = l.faults_waited;
  s.ready_latency = l.ready;
  s.wait_latency = l.waited;
  s.streamed = r.streamed();
  if (s.streamed) s.stream = r.stream_stats();
  s.hints = clients_.hint_stats(id);
  return s;
}

}  // namespace airs::pager
