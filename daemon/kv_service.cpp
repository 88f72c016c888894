// SPDX-License-Identifier: Apache-2.0
#include "daemon/kv_service.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

#include "wire/kv_access.hpp"
#include "wire/notice_page.hpp"
#include "dbus/names.hpp"
#include "policy/policy.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"
#include "util/hash.hpp"
#include "util/units.hpp"

namespace airs::daemon {
namespace {

constexpr uint32_t kNoticeCapacity = 4096;
// Reports read per wake-up of a session's channel: a client that floods it
// costs the loop a bounded time per turn (the rest waits in the socket).
constexpr int kReportsPerWake = 16;
// How long a report counts: ten of the client's rounds, and at least 5 s,
// so a sampler thread that a busy machine delays a round or two does not
// drop out of the ranking, while one that stopped (a stopped or frozen
// client) does.
std::chrono::nanoseconds report_valid_for(uint32_t period_ms) {
  return std::max<std::chrono::nanoseconds>(std::chrono::milliseconds(uint64_t{period_ms} * 10), std::chrono::seconds(5));
}

kv::Config allocator_config(const config::KvConfig& c) {
  kv::Config k;
  k.idle_threshold = c.idle_threshold;
  k.max_sessions_per_uid = c.max_sessions_per_uid;
  if (c.max_blocks_per_uid > 0) k.max_blocks_per_uid = static_cast<uint32_t>(std::min<uint64_t>(c.max_blocks_per_uid, UINT32_MAX));
  k.hash_seed = process_hash_seed();
  return k;
}

}  // namespace

KvService::KvService(pool::Pool& pool, Models& models, const config::KvConfig& cfg, EvictedFn on_evicted)
    : pool_(pool), models_(models), cfg_(cfg), on_evicted_(std::move(on_evicted)), alloc_(*this, allocator_config(cfg)) {}

KvService::~KvService() = default;

Status KvService::commit_chunk(kv::ArenaId arena, uint32_t chunk) {
  auto& a = arenas_.at(arena);
  if (a.closing)
    return make_error(EIO, "KV arena {} (uid {}) is closing: its client cut the file {} times", arena, a.uid, a.cuts);
  if (!a.exempt) {
    // The allocator counts the chunk once this returns: `held` is without it.
    const uint64_t held = alloc_.committed_bytes_of_uid(a.uid);
    const uint64_t share = cfg_.max_pool_bytes_per_uid.resolve(pool_.counts().total_bytes());
    if (held + a.geo.chunk_bytes > share) {
      share_refusal_ = fmt::format(
          "uid {}: KV pool share exceeded: its KV arenas hold {}, one more chunk is {}, kv.max_pool_bytes_per_uid = {}; "
          "free blocks or close sessions",
          a.uid, format_bytes(held), format_bytes(a.geo.chunk_bytes), format_bytes(share));
      return make_error(EDQUOT, "{}", *share_refusal_);
    }
  }
  AIRS_TRY(pool_.alloc_pages(*a.region, {uint64_t{chunk} * a.pages_per_chunk, a.pages_per_chunk}));
  return {};
}

void KvService::release_chunk(kv::ArenaId arena, uint32_t chunk) {
  auto& a = arenas_.at(arena);
  if (auto s = pool_.free_pages(*a.region, {uint64_t{chunk} * a.pages_per_chunk, a.pages_per_chunk}); !s)
    spdlog::error("KV arena {}: releasing chunk {}: {}", arena, chunk, s.error().message);
}

void KvService::copy_block(kv::ArenaId arena, kv::BlockId src, kv::BlockId dst) {
  auto& a = arenas_.at(arena);
  // The arena's clients can cut its file under this mapping: a checked
  // copy fails where a memcpy would take the daemon down with SIGBUS.
  if (auto st = sys::copy_checked(a.map.bytes() + a.geo.block_offset(dst), a.map.bytes() + a.geo.block_offset(src),
                                  a.geo.block_bytes);
      !st) {
    spdlog::warn("KV arena {} (uid {}): copy of block {} to {}: {}", arena, a.uid, src, dst, st.error().message);
    restore(arena, a);
  }
}

void KvService::restore(kv::ArenaId id, Arena& a) {
  if (a.closing) return;
  const uint64_t size = a.region->size();
  auto r = pool_.restore_kv_region(*a.region, a.cuts < kCutRepairs ? pool::Pool::Refill::Yes : pool::Pool::Refill::No);
  if (!r) {
    spdlog::error("KV arena {} (uid {}): {}", id, a.uid, r.error().message);
    return;
  }
  if (!r->any(size)) return;
  if (r->refilled(size)) {
    if (a.cuts >= kCutRepairs) {
      // Past its repairs: this cut (or punch of the pool's pages) closes it.
      a.closing = true;
      spdlog::warn("KV arena {} (uid {}) was cut by a client once more after {} repairs (now {} bytes long, the "
                   "arena is {}): not refilled again; it closes with its sessions",
                   id, a.uid, a.cuts, r->found_size, size);
      return;
    }
    // Counted once put back: a repair that failed is tried again, not counted again.
    ++a.cuts;
  }
  ++arena_repairs_;
  spdlog::warn("KV arena {} (uid {}) was changed by a client: {} bytes long (the arena is {}), {} in pages the pool "
               "never gave, {} of its pages gone; put back (that uid's blocks that were cut are zeros now)",
               id, a.uid, r->found_size, a.region->size(), format_bytes(r->stray_bytes), format_bytes(r->missing_bytes));
}

void KvService::restore_arenas() {
  for (auto& [id, a] : arenas_) restore(id, a);
}

std::optional<SpillKey> KvService::spill_key(Arena& a) {
  if (!spill_) return std::nullopt;
  if (const ModelEntry* m = models_.find(a.model); m != nullptr && m->content_id) a.content_id = m->content_id;
  if (!a.content_id) return std::nullopt;  // not hashed yet: nothing to tie an entry to
  SpillKey k;
  k.model_high = a.content_id->high;
  k.model_low = a.content_id->low;
  k.uid = a.uid;
  k.tokens_per_block = a.geo.tokens_per_block;
  k.block_bytes = static_cast<uint32_t>(a.geo.block_bytes);
  return k;
}

bool KvService::spill_block(kv::ArenaId arena, kv::BlockId block, uint64_t hash) {
  auto& a = arenas_.at(arena);
  auto k = spill_key(a);
  if (!k) return false;
  k->hash = hash;
  if (spill_->put(*k, a.map.bytes() + a.geo.block_offset(block)) == SpillStore::Put::Kept) return true;
  spill_->count_dropped();
  return false;
}

uint64_t KvService::spill_all(std::chrono::steady_clock::time_point deadline) {
  if (!spill_) return 0;
  uint64_t kept = 0, lost = 0;
  for (auto& [aid, a] : arenas_) {
    auto k = spill_key(a);
    if (!k) continue;
    for (const auto& [b, h] : alloc_.published(aid)) {
      k->hash = h;
      SpillStore::Put r = SpillStore::Put::Busy;
      // Busy: the writes in flight are at their bound; let some finish.
      while ((r = spill_->put(*k, a.map.bytes() + a.geo.block_offset(b))) == SpillStore::Put::Busy &&
             std::chrono::steady_clock::now() < deadline) {
        (void)spill_->drain(std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
      }
      if (r == SpillStore::Put::Kept) ++kept;
      else ++lost;
    }
  }
  const size_t unfinished = spill_->drain(deadline);
  spill_->sync_dirs();
  spdlog::info("KV spill tier: {} published blocks kept at stop ({} not kept, {} writes unfinished)", kept, lost + unfinished,
               unfinished);
  return kept;
}

Result<CreatedSession> KvService::create(ModelEntry& model, const dbus::Caller& caller, policy::Priority priority,
                                         bool admin) {
  if (!model.meta.geometry)
    return make_error(EINVAL, "model '{}' has no llama-like KV geometry (block_count, head counts) in its metadata",
                      model.name);
  const auto kvt = cfg_.kv_type == config::KvType::Q8_0 ? gguf::KvType::kQ8_0 : gguf::KvType::kF16;
  kv::GeometryParams gp;
  gp.bytes_per_token = gguf::kv_bytes_per_token(*model.meta.geometry, kvt);
  gp.tokens_per_block = cfg_.tokens_per_block;
  gp.page_bytes = pool_.page_size();
  auto geo = kv::make_geometry(gp);
  if (!geo) return std::move(geo).error();

  uint64_t cap = cfg_.max_arena_bytes != 0 ? cfg_.max_arena_bytes : pool_.counts().total_bytes();
  uint32_t max_chunks = static_cast<uint32_t>(std::max<uint64_t>(1, cap / geo->chunk_bytes));
  // The (model, uid) arena keeps the size it was made with, whatever the
  // pool has grown or shrunk to since.
  for (const auto& [id, a] : arenas_)
    if (a.model == model.id && a.uid == caller.uid) max_chunks = static_cast<uint32_t>(a.region->size() / geo->chunk_bytes);
  auto aid = alloc_.open_arena(model.id, caller.uid, *geo, max_chunks);
  if (!aid) return std::move(aid).error();
  if (!arenas_.contains(*aid)) {
    Arena a;
    auto region = pool_.create_kv_region(fmt::format("{}-uid{}", model.name, caller.uid), uint64_t{max_chunks} * geo->chunk_bytes);
    if (!region) {
      (void)alloc_.close_arena(*aid);
      return std::move(region).error();
    }
    a.region = std::move(region).value();
    auto map = sys::map_shared(a.region->fd(), a.region->size(), PROT_READ | PROT_WRITE, MAP_NORESERVE,
                               "KV arena of " + model.name);
    if (!map) {
      (void)alloc_.close_arena(*aid);
      return std::move(map).error();
    }
    a.map = std::move(map).value();
    a.geo = *geo;
    a.pages_per_chunk = geo->chunk_bytes / pool_.page_size();
    a.model = model.id;
    a.uid = caller.uid;
    a.exempt = admin;
    a.content_id = model.content_id;
    arenas_.emplace(*aid, std::move(a));
  }
  auto sid = alloc_.create_session(*aid, priority, Clock::now());
  if (!sid) return std::move(sid).error();

  auto s = std::make_unique<KvSession>();
  s->id = *sid;
  s->path = std::string(dbus::kSessionPathPrefix) + std::to_string(*sid);
  s->owner = caller.name;
  s->uid = caller.uid;
  s->model = model.id;
  s->model_name = model.name;
  s->priority = priority;
  s->admin = admin;
  s->arena = *aid;
  auto fail = [&](const Error& e) {
    (void)alloc_.close(*sid, Clock::now());
    return make_error(e.code, "session for model '{}': {}", model.name, e.message);
  };
  auto page = sys::SealedMemfd::create("airs-notices", wire::notice_page_bytes(kNoticeCapacity));
  if (!page) return fail(page.error());
  s->notice_page = std::move(page).value();
  s->notices = wire::NoticeWriter(s->notice_page.bytes(), kNoticeCapacity);
  auto wake = sys::wake_channel();
  if (!wake) return fail(wake.error());
  s->event_fd = std::move(wake->ours);
  if (auto i = sys::inode_of(wake->theirs.get())) s->wake_inode = *i;
  if (loop_ != nullptr) {
    const kv::SessionId id = s->id;
    if (auto st = s->reports.start(*loop_, s->event_fd.get(), [this, id](uint32_t ev) { on_reports(id, ev); }); !st)
      return fail(st.error());
  }

  CreatedSession out;
  auto arena_fd = sys::dup_cloexec(arenas_.at(*aid).region->fd());
  auto notice_ro = s->notice_page.open_read_only();
  if (!notice_ro) return fail(notice_ro.error());
  if (!arena_fd) return fail(arena_fd.error());
  out.arena_fd = std::move(arena_fd).value();
  out.notice_fd = std::move(notice_ro).value();
  out.event_fd = std::move(wake->theirs);
  out.geometry.geo = *geo;
  out.geometry.arena_bytes = arenas_.at(*aid).region->size();
  out.geometry.kv_type = config::to_string(cfg_.kv_type);
  out.session = s.get();
  by_path_[s->path] = s->id;
  spdlog::debug("session {} ({}, uid {}) on '{}': {} per block", s->path, policy::to_string(priority), caller.uid,
                model.name, format_bytes(geo->block_bytes));
  sessions_.emplace(s->id, std::move(s));
  return out;
}

Result<KvSession*> KvService::get(const std::string& path, const dbus::Caller& caller) {
  auto it = by_path_.find(path);
  if (it == by_path_.end()) return make_error(ENOENT, "no session {}", path);
  auto& s = *sessions_.at(it->second);
  if (s.owner != caller.name)
    return make_error(EACCES, "session {} belongs to another client (uid {}); a client uses only its own sessions", path,
                      s.uid);
  // Nothing more is done in an arena that closes (commits included: one
  // refused would read as a full pool and make room across it).
  if (const auto& a = arenas_.at(s.arena); a.closing)
    return make_error(ENOENT, "session {} is closing: a client of uid {} cut its KV arena after {} repairs", path,
                      a.uid, a.cuts);
  return &s;
}

void KvService::publish(std::vector<kv::EvictionNotice>& notices) {
  for (auto& n : notices) {
    auto it = sessions_.find(n.session);
    if (it == sessions_.end()) continue;
    auto& s = *it->second;
    s.notices.append(n.blocks, n.spilled);
    sys::wake(s.event_fd.get());
    s.evicted_blocks += n.blocks.size();
    const uint64_t bytes = n.blocks.size() * arenas_.at(n.arena).geo.block_bytes;
    spdlog::info("session {} lost {} KV blocks ({}): {}", s.path, n.blocks.size(), format_bytes(bytes), n.reason);
    if (on_evicted_) on_evicted_(s, n.blocks, bytes, n.reason);
  }
  notices.clear();
}

Status KvService::make_room(KvSession& s, uint64_t bytes) {
  // Across arenas and models, by the same rule as inside the arena.
  if (!make_room_) return make_error(ENOMEM, "no room maker");
  auto req = policy::Request::for_kv_allocation(s.priority, s.id, bytes);
  // A user's KV may not push out models other users loaded; an admin's may.
  req.include_models = s.admin;
  return make_room_(req, fmt::format("KV allocation of session {}", s.path));
}

Status KvService::allocate_with_room(KvSession& s, uint32_t n,
                                     const std::function<Status(std::vector<kv::EvictionNotice>&)>& attempt) {
  std::vector<kv::EvictionNotice> notices;
  share_refusal_.reset();
  auto r = attempt(notices);
  publish(notices);
  // Past its share, room made elsewhere would not be the uid's to take.
  if (!r && r.error().code == ENOMEM && share_refusal_) return make_error(EDQUOT, "{}", *share_refusal_);
  if (!r && r.error().code == ENOMEM) {
    // Room across arenas: whole chunks are what the pool hands out.
    const auto& g = arenas_.at(s.arena).geo;
    // Ask only for what the pool is missing, not for the whole request.
    const uint64_t want = div_round_up(uint64_t{n}, g.blocks_per_chunk) * g.chunk_bytes;
    const uint64_t have = pool_.counts().free_bytes();
    if (want > have) {
      auto room = make_room(s, want - have);
      // The room is on its way back: the caller runs this again once it is.
      if (!room && room.error().code == EINPROGRESS) return room;
      if (room) {
        notices.clear();
        r = attempt(notices);
        publish(notices);
      }
    }
  }
  return r;
}

Result<std::vector<uint32_t>> KvService::allocate(KvSession& s, uint32_t n) {
  std::vector<kv::BlockId> blocks;
  AIRS_TRY(allocate_with_room(s, n, [&](std::vector<kv::EvictionNotice>& notices) {
    return alloc_.allocate(s.id, n, Clock::now(), blocks, notices);
  }));
  return std::vector<uint32_t>(blocks.begin(), blocks.end());
}

Result<uint32_t> KvService::allocate_at(KvSession& s, uint32_t index) {
  kv::BlockId block = 0;
  AIRS_TRY(allocate_with_room(s, 1, [&](std::vector<kv::EvictionNotice>& notices) {
    return alloc_.allocate_at(s.id, index, Clock::now(), block, notices);
  }));
  return uint32_t{block};
}

Status KvService::free(KvSession& s, const std::vector<uint32_t>& blocks) {
  return alloc_.free(s.id, std::span<const kv::BlockId>(blocks.data(), blocks.size()), Clock::now());
}

Status KvService::commit(KvSession& s, const std::vector<uint32_t>& blocks, const std::vector<uint64_t>& hashes) {
  if (blocks.size() != hashes.size())
    return make_error(EINVAL, "Commit: {} blocks but {} hashes (one hash per block)", blocks.size(), hashes.size());
  auto r = alloc_.commit(s.id, std::span<const kv::BlockId>(blocks.data(), blocks.size()),
                         std::span<const uint64_t>(hashes.data(), hashes.size()), Clock::now());
  if (!r) return std::move(r).error();
  return {};
}

Result<std::vector<uint32_t>> KvService::match_prefix(KvSession& s, const std::vector<uint64_t>& hashes) {
  std::vector<kv::BlockId> blocks;
  AIRS_TRY(alloc_.match_prefix(s.id, std::span<const uint64_t>(hashes.data(), hashes.size()), Clock::now(), blocks));
  std::vector<uint32_t> out(blocks.begin(), blocks.end());
  if (spill_ && out.size() < hashes.size()) restore_spilled(s, hashes, out);
  return out;
}

void KvService::restore_spilled(KvSession& s, const std::vector<uint64_t>& hashes, std::vector<uint32_t>& out) {
  auto& a = arenas_.at(s.arena);
  auto k = spill_key(a);
  if (!k) return;
  // hashes[i] names logical block table_size+i at the call; the in-memory
  // run took the first out.size(), so fresh blocks appended now get the
  // indices of the rest.
  std::vector<uint64_t> run;
  for (size_t i = out.size(); i < hashes.size(); ++i) {
    k->hash = hashes[i];
    if (!spill_->contains(*k)) break;
    run.push_back(hashes[i]);
  }
  if (run.empty()) {
    spill_->count_miss();
    return;
  }
  const auto now = Clock::now();
  std::vector<kv::BlockId> fresh;
  std::vector<kv::EvictionNotice> notices;
  auto r = alloc_.allocate(s.id, static_cast<uint32_t>(run.size()), now, fresh, notices);
  publish(notices);
  if (!r) {
    spdlog::info("session {}: {} spilled blocks not restored: {}", s.path, run.size(), r.error().message);
    return;
  }
  size_t ok = 0;
  for (; ok < run.size(); ++ok) {
    k->hash = run[ok];
    if (!spill_->get(*k, a.map.bytes() + a.geo.block_offset(fresh[ok]))) break;
  }
  if (ok < fresh.size())
    (void)alloc_.free(s.id, std::span<const kv::BlockId>(fresh.data() + ok, fresh.size() - ok), now);
  if (auto p = alloc_.publish_restored(s.id, std::span<const kv::BlockId>(fresh.data(), ok),
                                       std::span<const uint64_t>(run.data(), ok));
      !p)
    spdlog::error("session {}: publishing restored blocks: {}", s.path, p.error().message);
  s.restored_blocks += ok;
  s.notices.add_restored(ok);
  out.insert(out.end(), fresh.begin(), fresh.begin() + static_cast<std::ptrdiff_t>(ok));
}

Result<uint32_t> KvService::prepare_write(KvSession& s, uint32_t block) {
  std::vector<kv::EvictionNotice> notices;
  auto r = alloc_.prepare_write(s.id, block, Clock::now(), notices);
  publish(notices);
  if (!r) return std::move(r).error();
  return *r;
}

Status KvService::set_length(KvSession& s, uint32_t tokens) { return alloc_.set_length(s.id, tokens, Clock::now()); }

Status KvService::close(KvSession& s) {
  AIRS_TRY(alloc_.close(s.id, Clock::now()));
  by_path_.erase(s.path);
  sessions_.erase(s.id);
  restore_arenas();
  return {};
}

std::vector<std::string> KvService::drop_caller(const std::string& caller) {
  std::vector<std::string> closed;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second->owner == caller) {
      (void)alloc_.close(it->first, Clock::now());
      closed.push_back(it->second->path);
      by_path_.erase(it->second->path);
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  if (!closed.empty()) restore_arenas();
  return closed;
}

bool KvService::rename_caller(const std::string& from, const std::string& to) {
  bool any = false;
  for (auto& [id, s] : sessions_)
    if (s->owner == from) {
      s->owner = to;
      any = true;
    }
  return any;
}

uint32_t KvService::sessions_on(uint64_t model) const {
  uint32_t n = 0;
  for (auto& [id, s] : sessions_)
    if (s->model == model) ++n;
  return n;
}

std::vector<std::string> KvService::close_model(uint64_t model, const std::string& reason) {
  return close_arenas([model](const Arena& a) { return a.model == model; }, reason);
}

std::vector<std::string> KvService::close_cut_arenas() {
  if (std::none_of(arenas_.begin(), arenas_.end(), [](const auto& e) { return e.second.closing; })) return {};
  return close_arenas([](const Arena& a) { return a.closing; },
                      fmt::format("its KV arena was closed: a client of its uid cut the arena file more than {} times",
                                  kCutRepairs));
}

std::vector<std::string> KvService::close_arenas(const std::function<bool(const Arena&)>& which,
                                                 const std::string& reason) {
  std::vector<std::string> closed;
  const auto now = Clock::now();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    KvSession& s = *it->second;
    if (!which(arenas_.at(s.arena))) {
      ++it;
      continue;
    }
    // Every block is lost: tell the client before the arena goes.
    if (auto info = alloc_.session_info(s.id); info && info->blocks > 0) {
      std::vector<kv::EvictionNotice> n(1);
      n[0].session = s.id;
      n[0].arena = s.arena;
      n[0].reason = reason;
      // The ids are the session's table; the client treats them all as lost.
      for (auto b : info->table)
        if (b != kv::kNoBlock) n[0].blocks.push_back(b);
      publish(n);
    }
    (void)alloc_.close(s.id, now);
    closed.push_back(s.path);
    by_path_.erase(s.path);
    it = sessions_.erase(it);
  }
  for (auto it = arenas_.begin(); it != arenas_.end();) {
    if (!which(it->second)) {
      ++it;
      continue;
    }
    if (it->second.closing) ++arenas_closed_;  // however it closes: the cuts closed it
    if (auto st = alloc_.close_arena(it->first); !st)
      spdlog::error("KV arena {} closing ({}): {}", it->first, reason, st.error().message);
    // Clients still mapping the arena get SIGBUS, never another uid's bytes.
    (void)sys::truncate_to_zero(it->second.region->fd(), "KV arena");
    it = arenas_.erase(it);
  }
  return closed;
}

void KvService::add_inodes(sys::InodeSet& out) const {
  for (auto& [id, a] : arenas_)
    if (auto i = sys::inode_of(a.region->fd())) out.insert(*i);
  for (auto& [id, s] : sessions_) {
    if (auto i = sys::inode_of(s->notice_page.read_only_fd())) out.insert(*i);
    if (s->wake_inode) out.insert(*s->wake_inode);
  }
}

policy::PoolState KvService::snapshot() const { return alloc_.snapshot(Clock::now()); }

Result<uint64_t> KvService::execute(const policy::Action& a) {
  std::vector<kv::EvictionNotice> notices;
  const uint64_t before = pool_.counts().free_bytes();
  auto r = alloc_.evict(a, Clock::now(), notices);
  publish(notices);
  if (!r) return std::move(r).error();
  alloc_.trim();
  return pool_.counts().free_bytes() - std::min(before, pool_.counts().free_bytes());
}

const KvSession* KvService::find_id(kv::SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

std::optional<kv::SessionInfo> KvService::info(const std::string& path) const {
  auto it = by_path_.find(path);
  if (it == by_path_.end()) return std::nullopt;
  auto r = alloc_.session_info(it->second);
  if (!r) return std::nullopt;
  return std::move(r).value();
}

KvStatus KvService::status() const {
  KvStatus k;
  k.totals = alloc_.total_stats();
  if (spill_) k.spill = SpillTierStatus{spill_->dir(), spill_->stats()};
  k.arena_repairs = arena_repairs_;
  k.arenas_closed = arenas_closed_;
  return k;
}

Status ReportWatch::start(sys::EventLoop& loop, int fd, sys::EventLoop::Callback cb) {
  stop();
  AIRS_TRY(loop.add(fd, EPOLLIN, std::move(cb)));
  loop_ = &loop;
  fd_ = fd;
  return {};
}

void ReportWatch::stop() {
  if (loop_ != nullptr) loop_->remove(fd_);
  loop_ = nullptr;
  fd_ = -1;
}

// No more reports from this session's client: what it queued is dropped
// (fds passed along are closed by the kernel), and its later sends fail
// (EPIPE), so nothing it sends stays held in the daemon's socket.
void KvService::refuse_reports(KvSession& s) {
  s.reports.stop();
  s.reports_refused = true;
  for (int n = 0; n < 1 << 16; ++n) {
    std::byte buf[64];
    if (sys::read_message(s.event_fd.get(), buf, sizeof buf).state != sys::MessageRead::Message) break;
  }
  (void)::shutdown(s.event_fd.get(), SHUT_RD);
}

// A client's KV access reports, on its session's wake channel. A report
// rates the session (kv::Allocator::rate_access). A malformed one ends the
// reports (refuse_reports), a client that closed its end the watch: the
// session stays, ranked by its last use from then on (its rate runs out).
void KvService::on_reports(kv::SessionId id, uint32_t events) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  KvSession& s = *it->second;
  const auto now = Clock::now();
  int n = 0;
  for (; n < kReportsPerWake; ++n) {
    // One byte more than a report: a longer message is seen as too long.
    alignas(uint32_t) std::byte buf[wire::kKvAccessBytes + 1];
    const sys::MessageRead r = sys::read_message(s.event_fd.get(), buf, sizeof buf);
    if (r.state == sys::MessageRead::Again) break;
    if (r.state != sys::MessageRead::Message) {
      s.reports.stop();  // closed or failed: nothing more comes
      return;
    }
    const wire::DecodedKvAccess d = wire::decode_kv_access(buf, r.bytes);
    if (d.error != nullptr) {
      spdlog::warn("session {} (uid {}): a malformed KV access report of {} bytes ({}): its reports are not read "
                   "any more, and its KV is ranked by last use",
                   s.path, s.uid, r.bytes, d.error);
      refuse_reports(s);
      return;
    }
    if (alloc_.rate_access(id, d.access.share(), now, report_valid_for(d.access.period_ms)).ok()) ++s.access_reports;
  }
  if (n == 0 && (events & (EPOLLHUP | EPOLLERR)) != 0) s.reports.stop();
}

std::vector<SessionStatus> KvService::sessions() const {
  std::vector<SessionStatus> out;
  const auto now = Clock::now();
  for (auto& [id, s] : sessions_) {
    auto info = alloc_.session_info(id);
    if (!info) continue;
    SessionStatus d;
    d.path = s->path;
    d.owner = s->owner;
    d.uid = static_cast<uint32_t>(s->uid);
    d.model = s->model_name;
    d.priority = s->priority;
    d.blocks = info->blocks;
    d.shared_blocks = info->shared;
    d.tokens = info->length;
    d.idle_s = std::chrono::duration<double>(now - info->last_used).count();
    d.evicted_blocks = s->evicted_blocks;
    d.restored_blocks = s->restored_blocks;
    d.access_rate = info->access_rate;
    d.access_reports = s->access_reports;
    d.access_reports_refused = s->reports_refused;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace airs::daemon
