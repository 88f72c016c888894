// SPDX-License-Identifier: Apache-2.0
#include "daemon/kv_spill.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <chrono>
#include <ctime>
#include <tuple>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "sys/files.hpp"
#include "sys/proc_handles.hpp"
#include "util/units.hpp"

namespace airs::daemon {
namespace {

static_assert(std::endian::native == std::endian::little, "spill entries are little-endian");

constexpr char kMagic[8] = {'A', 'I', 'R', 'S', 'K', 'V', 'S', '1'};
constexpr uint32_t kVersion = 1;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t model_high;
  uint64_t model_low;
  uint32_t uid;
  uint32_t tokens_per_block;
  uint32_t block_bytes;
  uint32_t reserved;
  uint64_t hash;
  uint64_t checksum;  // XXH3-64 of the payload, seeded with XXH3-64 of this header with checksum 0
};
static_assert(sizeof(FileHeader) == SpillStore::kHeaderBytes);

FileHeader header_for(const SpillKey& k) {
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.header_bytes = sizeof(FileHeader);
  h.model_high = k.model_high;
  h.model_low = k.model_low;
  h.uid = k.uid;
  h.tokens_per_block = k.tokens_per_block;
  h.block_bytes = k.block_bytes;
  h.hash = k.hash;
  return h;
}

uint64_t checksum_of(FileHeader h, const void* payload, size_t len) {
  h.checksum = 0;
  return XXH3_64bits_withSeed(payload, len, XXH3_64bits(&h, sizeof h));
}

// Why the header does not describe `k` (empty if it does); the checksum is not checked here.
std::string header_mismatch(const FileHeader& h, const SpillKey& k) {
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return "bad magic";
  if (h.version != kVersion) return fmt::format("version {} (this daemon writes {})", h.version, kVersion);
  if (h.header_bytes != sizeof(FileHeader)) return fmt::format("header size {}", h.header_bytes);
  const FileHeader want = header_for(k);
  if (h.model_high != want.model_high || h.model_low != want.model_low) return "another model's content id";
  if (h.uid != want.uid) return fmt::format("uid {} in a directory of uid {}", h.uid, want.uid);
  if (h.tokens_per_block != want.tokens_per_block || h.block_bytes != want.block_bytes) return "another KV geometry";
  if (h.hash != want.hash) return "another prefix hash";
  return {};
}

template <typename T>
bool parse_hex(std::string_view s, T& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc() && p == s.data() + s.size();
}

template <typename T>
bool parse_dec(std::string_view s, T& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 10);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

std::string SpillKey::file_name() const {
  return fmt::format("{:016x}{:016x}-{}-{}-{:016x}", model_high, model_low, tokens_per_block, block_bytes, hash);
}

std::optional<SpillKey> SpillKey::from_file_name(std::string_view name, uint32_t uid) {
  // 32 hex - dec - dec - 16 hex
  if (name.size() < 32 + 1 + 1 + 1 + 1 + 1 + 16 || name[32] != '-') return std::nullopt;
  SpillKey k;
  k.uid = uid;
  if (!parse_hex(name.substr(0, 16), k.model_high) || !parse_hex(name.substr(16, 16), k.model_low)) return std::nullopt;
  auto rest = name.substr(33);
  const auto d1 = rest.find('-');
  if (d1 == std::string_view::npos || !parse_dec(rest.substr(0, d1), k.tokens_per_block)) return std::nullopt;
  rest = rest.substr(d1 + 1);
  const auto d2 = rest.find('-');
  if (d2 == std::string_view::npos || !parse_dec(rest.substr(0, d2), k.block_bytes)) return std::nullopt;
  rest = rest.substr(d2 + 1);
  if (rest.size() != 16 || !parse_hex(rest, k.hash)) return std::nullopt;
  if (k.file_name() != name) return std::nullopt;  // one spelling per key (no upper case, no leading zeros)
  return k;
}

SpillStore::SpillStore(sys::EventLoop& loop, sys::Ring ring, std::string dir, uint64_t limit)
    : loop_(loop), ring_(std::move(ring)), dir_(std::move(dir)), limit_(limit) {
  stats_.limit_bytes = limit;
}

Result<std::unique_ptr<SpillStore>> SpillStore::open(sys::EventLoop& loop, std::string dir, uint64_t limit) {
  if (auto st = sys::ensure_private_dir(dir); !st)
    return make_error(st.error().code, "KV spill directory {}", st.error().message);
  auto ring = sys::Ring::create(64);
  if (!ring) return std::move(ring).error();
  std::unique_ptr<SpillStore> s(new SpillStore(loop, std::move(ring).value(), std::move(dir), limit));
  AIRS_TRY(s->scan());
  SpillStore* self = s.get();
  AIRS_TRY(loop.add(s->ring_.event_fd(), EPOLLIN, [self](uint32_t) {
    self->ring_.reap([self](uint64_t ud, int32_t res) { self->on_completion(ud, res); });
  }));
  spdlog::info("KV spill tier: {} ({} entries, {} of {})", s->dir_, s->index_.size(), format_bytes(s->stats_.used_bytes),
               format_bytes(limit));
  return s;
}

SpillStore::~SpillStore() {
  // The kernel reads our buffers until each write completes.
  if (drain(std::chrono::steady_clock::now() + std::chrono::seconds(2)) > 0)
    spdlog::warn("KV spill tier: {} writes still in flight at exit; their entries are lost", pending_.size());
  loop_.remove(ring_.event_fd());
}

std::string SpillStore::uid_dir(uint32_t uid) const { return fmt::format("{}/{}", dir_, uid); }

Status SpillStore::ensure_uid_dir(uint32_t uid) {
  if (uid_dirs_.contains(uid)) return {};
  const std::string d = uid_dir(uid);
  if (auto st = sys::make_dir(d, 0700); !st)
    return make_error(st.error().code, "KV spill directory {}", st.error().message);
  uid_dirs_.insert(uid);
  return {};
}

Status SpillStore::scan() {
  struct Found {
    SpillKey key;
    uint64_t bytes;
    timespec mtime;
  };
  std::vector<Found> found;
  auto top = sys::list_dir(dir_);
  if (!top) return make_error(top.error().code, "KV spill directory {}", top.error().message);
  for (const std::string& uname : *top) {
    uint32_t uid = 0;
    const std::string ud = dir_ + "/" + uname;
    const auto ust = sys::lstat_path(ud);
    if (!parse_dec(uname, uid) || std::to_string(uid) != uname || !ust || !S_ISDIR(ust->st_mode)) {
      spdlog::warn("KV spill tier: {}: not a uid directory; ignored", ud);
      continue;
    }
    if ((ust->st_mode & 07777) != 0700) (void)sys::chmod_path(ud, 0700);
    uid_dirs_.insert(uid);
    auto names = sys::list_dir(ud);
    if (!names) continue;
    for (const std::string& name : *names) {
      const std::string path = ud + "/" + name;
      if (name.front() == '.') {  // an interrupted write
        (void)sys::remove_file(path);
        continue;
      }
      auto key = SpillKey::from_file_name(name, uid);
      std::string why;
      struct stat fst {};
      if (!key) {
        why = "not an entry name";
      } else if (auto ls = sys::lstat_path(path); !ls || !S_ISREG((fst = *ls).st_mode)) {
        why = "not a regular file";
      } else if (static_cast<uint64_t>(fst.st_size) != kHeaderBytes + uint64_t{key->block_bytes}) {
        why = fmt::format("{} bytes, expected {} (torn?)", fst.st_size, kHeaderBytes + uint64_t{key->block_bytes});
      } else {
        FileHeader h{};
        // Opened as a regular file only: a FIFO put here after the lstat
        // above would block the open, and the loop with it.
        auto fd = sys::open_regular(path, O_RDONLY);
        if (!fd) why = fd.error().message;
        else if (auto n = sys::read_at(fd->get(), &h, sizeof h, 0); !n || *n != sizeof h) why = "unreadable header";
        else why = header_mismatch(h, *key);
      }
      if (!why.empty()) {
        spdlog::warn("KV spill tier: {} rejected: {}; deleted", path, why);
        ++stats_.rejected;
        (void)sys::remove_file(path);
        continue;
      }
      found.push_back(Found{*key, static_cast<uint64_t>(fst.st_size), fst.st_mtim});
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec) < std::tie(b.mtime.tv_sec, b.mtime.tv_nsec);
  });
  for (const Found& f : found) insert(f.key, f.bytes, next_seq_++);
  if (!found.empty()) last_stamp_ = found.back().mtime;
  while (stats_.used_bytes > limit_ && !lru_.empty()) remove(lru_.begin()->second, "over the limit");
  return {};
}

void SpillStore::insert(const SpillKey& k, uint64_t bytes, uint64_t seq) {
  index_[k] = Entry{bytes, seq};
  lru_[seq] = k;
  stats_.used_bytes += bytes;
}

void SpillStore::touch(const SpillKey& k) {
  auto it = index_.find(k);
  if (it == index_.end()) return;
  lru_.erase(it->second.seq);
  it->second.seq = next_seq_++;
  lru_[it->second.seq] = k;
}

void SpillStore::remove(SpillKey k, const char* why) {
  auto it = index_.find(k);
  if (it == index_.end()) return;
  const std::string path = uid_dir(k.uid) + "/" + k.file_name();
  if (auto st = sys::remove_file(path); !st) spdlog::warn("KV spill tier: {}", st.error().message);
  spdlog::debug("KV spill tier: {} removed ({})", path, why);
  stats_.used_bytes -= it->second.bytes;
  lru_.erase(it->second.seq);
  index_.erase(it);
}

void SpillStore::reject(const SpillKey& k, const std::string& why) {
  spdlog::warn("KV spill tier: entry {}/{} rejected: {}; deleted, never served (the client recomputes it)",
               uid_dir(k.uid), k.file_name(), why);
  ++stats_.rejected;
  remove(k, "rejected");
}

SpillStore::Put SpillStore::put(const SpillKey& k, const void* bytes) {
  if (index_.contains(k)) {
    touch(k);
    return Put::Kept;
  }
  if (pending_keys_.contains(k)) return Put::Kept;
  const uint64_t size = kHeaderBytes + uint64_t{k.block_bytes};
  if (size > limit_) return Put::Refused;
  if (stats_.inflight_bytes + size > kInflightLimit) return Put::Busy;
  if (ring_.sq_space() < 2) {
    (void)ring_.submit();
    if (ring_.sq_space() < 2) return Put::Busy;
  }
  if (auto st = ensure_uid_dir(k.uid); !st) {
    spdlog::warn("KV spill tier: {}", st.error().message);
    return Put::Refused;
  }
  while (stats_.used_bytes + stats_.inflight_bytes + size > limit_ && !lru_.empty())
    remove(lru_.begin()->second, "least recently used, over the limit");
  if (stats_.used_bytes + stats_.inflight_bytes + size > limit_) return Put::Busy;  // the rest is in flight

  Pending p;
  p.key = k;
  p.buf.resize(size);
  // The block lives in a file its client can truncate under us: a checked
  // copy, never a SIGBUS.
  if (auto st = sys::copy_checked(p.buf.data() + kHeaderBytes, bytes, k.block_bytes); !st) {
    spdlog::warn("KV spill tier: block not kept: {}", st.error().message);
    return Put::Refused;
  }
  const uint64_t id = next_id_++;
  p.tmp = fmt::format("{}/.{}.{}.tmp", uid_dir(k.uid), k.file_name(), id);
  auto created = sys::open_file(p.tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  if (!created) {
    spdlog::warn("KV spill tier: {}", created.error().message);
    return Put::Refused;
  }
  p.fd = std::move(created).value();
  FileHeader h = header_for(k);
  h.checksum = checksum_of(h, p.buf.data() + kHeaderBytes, k.block_bytes);
  std::memcpy(p.buf.data(), &h, sizeof h);
  // Both slots were checked free above.
  (void)ring_.queue_write_linked(p.fd.get(), p.buf.data(), static_cast<uint32_t>(size), 0, id << 1);
  (void)ring_.queue_fsync(p.fd.get(), (id << 1) | 1);
  if (auto st = ring_.submit(); !st) {
    // Queued entries go with the next submit; the completion still arrives.
    spdlog::warn("KV spill tier: {}", st.error().message);
  }
  stats_.inflight_bytes += size;
  pending_keys_.insert(k);
  pending_.emplace(id, std::move(p));
  return Put::Kept;
}

void SpillStore::on_completion(uint64_t user_data, int32_t res) {
  const uint64_t id = user_data >> 1;
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending& p = it->second;
  const bool fsync = (user_data & 1) != 0;
  if (fsync ? res != 0 : res != static_cast<int32_t>(p.buf.size())) {
    if (p.ok)
      spdlog::warn("KV spill tier: {} of {}: {}", fsync ? "fsync" : "write", p.tmp,
                   res < 0 ? std::strerror(-res) : fmt::format("short, {} of {} bytes", res, p.buf.size()));
    p.ok = false;
  }
  if (++p.done == 2) finish(id);
}

void SpillStore::finish(uint64_t id) {
  auto node = pending_.extract(id);
  Pending& p = node.mapped();
  const uint64_t size = p.buf.size();
  stats_.inflight_bytes -= size;
  pending_keys_.erase(p.key);
  p.fd.reset();
  const std::string final_path = uid_dir(p.key.uid) + "/" + p.key.file_name();
  if (p.ok) {
    if (auto st = sys::rename_file(p.tmp, final_path); !st) {
      spdlog::warn("KV spill tier: {}", st.error().message);
      p.ok = false;
    }
  }
  if (!p.ok) {
    (void)sys::remove_file(p.tmp);
    ++stats_.dropped;
    return;
  }
  stats_.written_bytes += size;
  if (auto old = index_.find(p.key); old != index_.end()) {  // replaced by the rename: forget, do not unlink
    stats_.used_bytes -= old->second.bytes;
    lru_.erase(old->second.seq);
    index_.erase(old);
  }
  insert(p.key, size, next_seq_++);
  stamp(-1, final_path);
}

void SpillStore::stamp(int fd, const std::string& path) {
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
  timespec now{};
  now.tv_sec = static_cast<time_t>(secs.count());
  now.tv_nsec = static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch - secs).count());
  // 1 µs past the last stamp at least: file systems keep µs or finer.
  timespec next = last_stamp_;
  next.tv_nsec += 1000;
  if (next.tv_nsec >= 1'000'000'000) {
    next.tv_nsec -= 1'000'000'000;
    ++next.tv_sec;
  }
  if (std::tie(now.tv_sec, now.tv_nsec) > std::tie(next.tv_sec, next.tv_nsec)) next = now;
  if (auto st = sys::set_mtime(fd, path, next); !st) {
    spdlog::debug("KV spill tier: setting the mtime of {}", st.error().message);
    return;
  }
  last_stamp_ = next;
}

Status SpillStore::get(const SpillKey& k, void* dst) {
  if (!index_.contains(k)) return make_error(ENOENT, "no spilled block");
  const std::string path = uid_dir(k.uid) + "/" + k.file_name();
  // A regular file only: opening a FIFO planted here would block the loop.
  auto opened = sys::open_regular(path, O_RDONLY);
  if (!opened) {
    reject(k, opened.error().message);
    return make_error(EBADMSG, "spilled block unreadable");
  }
  const sys::UniqueFd fd = std::move(opened).value();
  // Read and checked in memory of our own, then copied into `dst` through
  // the kernel: `dst` is a KV arena its client can cut at any moment, and a
  // plain read of it (the checksum) would be a SIGBUS that ends the daemon.
  FileHeader h{};
  scratch_.resize(k.block_bytes);
  const iovec iov[2] = {{&h, sizeof h}, {scratch_.data(), k.block_bytes}};
  const uint64_t want = kHeaderBytes + uint64_t{k.block_bytes};
  const auto n = sys::read_at(fd.get(), iov, 0);
  std::string why;
  if (!n) why = n.error().message;
  else if (auto st = sys::stat_of(fd.get(), path); *n != want || !st || static_cast<uint64_t>(st->st_size) != want)
    why = fmt::format("{} bytes, expected {} (torn)", *n, want);
  else if (why = header_mismatch(h, k); why.empty() && h.checksum != checksum_of(h, scratch_.data(), k.block_bytes))
    why = "checksum mismatch (corrupt)";
  if (!why.empty()) {
    reject(k, why);
    return make_error(EBADMSG, "spilled block rejected: {}", why);
  }
  // The entry is sound: a block that cannot take it keeps it stored.
  if (auto st = sys::copy_checked(dst, scratch_.data(), k.block_bytes); !st)
    return make_error(EFAULT, "spilled block not restored: {}", st.error().message);
  ++stats_.hits;
  stats_.read_bytes += want;
  touch(k);
  stamp(fd.get(), path);
  return {};
}

size_t SpillStore::drain(std::chrono::steady_clock::time_point deadline) {
  (void)ring_.submit();
  while (!pending_.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    auto st = ring_.wait_and_reap_for(static_cast<int>(std::min<int64_t>(left.count(), 1000)),
                                      [this](uint64_t ud, int32_t res) { on_completion(ud, res); });
    if (!st && st.error().code != ETIME) break;
  }
  return pending_.size();
}

void SpillStore::sync_dirs() const {
  auto sync = [](const std::string& d) {
    if (auto st = sys::sync_dir(d); !st) spdlog::warn("KV spill tier: {}", st.error().message);
  };
  for (const uint32_t uid : uid_dirs_) sync(uid_dir(uid));
  sync(dir_);
}

SpillStats SpillStore::stats() const {
  SpillStats s = stats_;
  s.entries = index_.size();
  return s;
}

}  // namespace airs::daemon
