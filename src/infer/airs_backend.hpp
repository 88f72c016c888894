// SPDX-License-Identifier: Apache-2.0
// KV blocks from airs-memd: a KvBackend over an airs_session (libairs C
// API). Each call is one D-Bus round trip (block_ptr and read_notices are
// local: the arena is mapped, notices are a shared ring; post_length is a
// one-way message).
#pragma once

#include "airs/airs.h"
#include "infer/sequence.hpp"

namespace airs::infer {

class AirsKv final : public KvBackend {
 public:
  // `session` stays owned by the caller and must outlive this object.
  explicit AirsKv(airs_session* session) : s_(session) {}
  Result<std::vector<uint32_t>> allocate(uint32_t n) override;
  Result<uint32_t> allocate_at(uint32_t index) override;
  Status free(std::span<const uint32_t> ids) override;
  std::byte* block_ptr(uint32_t id) override;
  Status commit(std::span<const uint32_t> ids, std::span<const uint64_t> hashes) override;
  Result<std::vector<uint32_t>> match_prefix(std::span<const uint64_t> hashes) override;
  Result<uint32_t> prepare_write(uint32_t id) override;
  Status set_length(uint32_t tokens) override;
  Status post_length(uint32_t tokens) override;  // one-way message (airs_session_post_length)
  Result<std::vector<uint32_t>> read_notices() override;
  bool wait_notice(int timeout_ms) override;  // poll(2) on the notice fd; false once the session is gone
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> tokens) const override;
  uint64_t restored_blocks() const override { return airs_session_restored_blocks(s_); }

 private:
  airs_session* s_;
};

}  // namespace airs::infer
