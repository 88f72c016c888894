// SPDX-License-Identifier: Apache-2.0
#include "infer/airs_backend.hpp"

#include <poll.h>

namespace airs::infer {

namespace {

Error airs_error(int rc, std::string_view what) {
  return make_error(-rc, "kv: {}: {}", what, airs_last_error());
}

}  // namespace

Result<std::vector<uint32_t>> AirsKv::allocate(uint32_t n) {
  std::vector<uint32_t> ids(n);
  if (const int rc = airs_session_allocate(s_, n, ids.data()); rc < 0) return airs_error(rc, "allocate");
  return ids;
}

Result<uint32_t> AirsKv::allocate_at(uint32_t index) {
  uint32_t id = 0;
  if (const int rc = airs_session_allocate_at(s_, index, &id); rc < 0) return airs_error(rc, "allocate at");
  return id;
}

Status AirsKv::free(std::span<const uint32_t> ids) {
  if (const int rc = airs_session_free(s_, ids.data(), ids.size()); rc < 0) return airs_error(rc, "free");
  return {};
}

std::byte* AirsKv::block_ptr(uint32_t id) { return static_cast<std::byte*>(airs_session_block_ptr(s_, id)); }

Status AirsKv::commit(std::span<const uint32_t> ids, std::span<const uint64_t> hashes) {
  if (const int rc = airs_session_commit(s_, ids.data(), hashes.data(), std::min(ids.size(), hashes.size())); rc < 0) {
    return airs_error(rc, "commit");
  }
  return {};
}

Result<std::vector<uint32_t>> AirsKv::match_prefix(std::span<const uint64_t> hashes) {
  std::vector<uint32_t> ids(hashes.size());
  const int rc = airs_session_match_prefix(s_, hashes.data(), hashes.size(), ids.data());
  if (rc < 0) return airs_error(rc, "match prefix");
  ids.resize(static_cast<size_t>(rc));
  return ids;
}

Result<uint32_t> AirsKv::prepare_write(uint32_t id) {
  uint32_t w = id;
  if (const int rc = airs_session_prepare_write(s_, id, &w); rc < 0) return airs_error(rc, "prepare write");
  return w;
}

Status AirsKv::set_length(uint32_t tokens) {
  if (const int rc = airs_session_set_length(s_, tokens); rc < 0) return airs_error(rc, "set length");
  return {};
}

Status AirsKv::post_length(uint32_t tokens) {
  if (const int rc = airs_session_post_length(s_, tokens); rc < 0) return airs_error(rc, "post length");
  return {};
}

Result<std::vector<uint32_t>> AirsKv::read_notices() {
  std::vector<uint32_t> out;
  uint32_t buf[256];
  for (;;) {
    const int rc = airs_session_read_notices(s_, buf, std::size(buf));
    if (rc < 0) return airs_error(rc, "read notices");
    out.insert(out.end(), buf, buf + rc);
    if (static_cast<size_t>(rc) < std::size(buf)) return out;
  }
}

bool AirsKv::wait_notice(int timeout_ms) {
  pollfd p{airs_session_notice_fd(s_), POLLIN, 0};
  // POLLHUP: the daemon closed the session; no notice will come, and the
  // fd polls readable for good.
  return p.fd >= 0 && ::poll(&p, 1, timeout_ms) == 1 && (p.revents & (POLLHUP | POLLERR)) == 0;
}

uint64_t AirsKv::chain_hash(uint64_t parent, std::span<const int32_t> tokens) const {
  return airs_kv_chain_hash(parent, tokens.data(), tokens.size());
}

}  // namespace airs::infer
