// SPDX-License-Identifier: Apache-2.0
// A model's identity by content: XXH3-128 of every byte of its GGUF file.
// Anything the daemon keeps about a model across unloads, restarts and
// reboots (spilled KV blocks, the recorded access order) is tied to this,
// never to a path or a name: a file replaced under the same path is another
// model, and the same bytes under another path are the same model.
//
// Hashing a multi-GiB file costs a full read, so a ContentIdCache remembers
// the id by the file's stat identity (device, inode, size, mtime, ctime): a
// file unchanged since it was hashed keeps its id without being read. ctime
// cannot be set by a file's owner (any write or metadata change moves it),
// so a rewritten file never keeps the old id.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "util/result.hpp"

namespace airs::gguf {

struct ContentId {
  uint64_t high = 0;
  uint64_t low = 0;
  // 32 lowercase hex digits.
  [[nodiscard]] std::string hex() const;
  // Exactly 32 hex digits (either case); nullopt otherwise.
  [[nodiscard]] static std::optional<ContentId> from_hex(std::string_view s);
  friend bool operator==(const ContentId&, const ContentId&) = default;
};

// XXH3-128 of `len` bytes.
[[nodiscard]] ContentId content_id_of(const void* data, size_t len);

// XXH3-128 of the first `length` bytes of `fd` (pread, 4 MiB at a time; the
// fd's position is untouched, so it may be shared). A file shorter than
// `length` is EBADMSG. `cancel` (may be null) set by another thread stops
// the read with ECANCELED. Thread-safe.
[[nodiscard]] Result<ContentId> content_id_of_fd(int fd, uint64_t length, const std::atomic<bool>* cancel = nullptr);

// Content ids by stat identity, one small file per identity under `dir`
// (mode 0700, created on first store; written atomically). An empty `dir`
// keeps nothing (every lookup misses). Entries are untrusted input: one that
// does not parse is a miss.
class ContentIdCache {
 public:
  explicit ContentIdCache(std::string dir) : dir_(std::move(dir)) {}
  [[nodiscard]] std::optional<ContentId> lookup(const struct stat& st) const;
  [[nodiscard]] Status store(const struct stat& st, const ContentId& id) const;
  [[nodiscard]] const std::string& dir() const { return dir_; }

 private:
  [[nodiscard]] std::string entry_path(const struct stat& st) const;
  std::string dir_;
};

}  // namespace airs::gguf
