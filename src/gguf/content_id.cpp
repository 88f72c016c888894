// SPDX-License-Identifier: Apache-2.0
#include "gguf/content_id.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "sys/fd.hpp"
#include "sys/files.hpp"

namespace airs::gguf {

namespace {

ContentId from_xxh(XXH128_hash_t h) { return ContentId{h.high64, h.low64}; }

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string ContentId::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

std::optional<ContentId> ContentId::from_hex(std::string_view s) {
  if (s.size() != 32) return std::nullopt;
  ContentId id;
  for (size_t i = 0; i < 32; ++i) {
    const int d = hex_digit(s[i]);
    if (d < 0) return std::nullopt;
    uint64_t& word = i < 16 ? id.high : id.low;
    word = (word << 4) | static_cast<uint64_t>(d);
  }
  return id;
}

ContentId content_id_of(const void* data, size_t len) { return from_xxh(XXH3_128bits(data, len)); }

Result<ContentId> content_id_of_fd(int fd, uint64_t length, const std::atomic<bool>* cancel) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), XXH3_freeState);
  if (!state || XXH3_128bits_reset(state.get()) != XXH_OK) return make_error(ENOMEM, "xxh3 state");
  constexpr size_t kChunk = 4u << 20;
  std::vector<unsigned char> buf(kChunk);
  uint64_t off = 0;
  while (off < length) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) return make_error(ECANCELED, "hash cancelled");
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, length - off));
    const auto n = sys::read_at(fd, buf.data(), want, off);
    if (!n) return make_error(n.error().code, "reading at offset {}: {}", off, std::strerror(n.error().code));
    if (*n == 0) return make_error(EBADMSG, "file ends at {} of {} bytes", off, length);
    if (XXH3_128bits_update(state.get(), buf.data(), *n) != XXH_OK) return make_error(EIO, "xxh3 update");
    off += *n;
  }
  return from_xxh(XXH3_128bits_digest(state.get()));
}

std::string ContentIdCache::entry_path(const struct stat& st) const {
  return fmt::format("{}/{:x}-{:x}-{:x}-{}.{:09}-{}.{:09}", dir_, static_cast<uint64_t>(st.st_dev),
                     static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec), st.st_mtim.tv_nsec,
                     static_cast<int64_t>(st.st_ctim.tv_sec), st.st_ctim.tv_nsec);
}

std::optional<ContentId> ContentIdCache::lookup(const struct stat& st) const {
  if (dir_.empty()) return std::nullopt;
  // A regular file only: a FIFO here would block the open (and the loop).
  auto fd = sys::open_regular(entry_path(st), O_RDONLY);
  if (!fd) return std::nullopt;
  char buf[40];
  const auto n = sys::read_at(fd->get(), buf, sizeof buf, 0);
  // "<32 hex>\n", nothing else.
  if (!n || *n != 33 || buf[32] != '\n') return std::nullopt;
  return ContentId::from_hex(std::string_view(buf, 32));
}

Status ContentIdCache::store(const struct stat& st, const ContentId& id) const {
  if (dir_.empty()) return {};
  AIRS_TRY(sys::make_dir(dir_, 0700));
  // A cache, written on the daemon's loop: no fsync. An entry's name is the
  // file's identity and only the id hashed from that file is ever written
  // under it, so a crash leaves that id or a torn entry, which is not
  // "<32 hex>\n": lookup() ignores it and the file is hashed again.
  return sys::write_file_atomic(entry_path(st), id.hex() + "\n", 0600, sys::Durability::Readers);
}

}  // namespace airs::gguf
