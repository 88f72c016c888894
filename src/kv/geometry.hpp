// SPDX-License-Identifier: Apache-2.0
// KV block geometry: how many bytes a token's K and V take, how tokens group
// into blocks, and how blocks pack into chunks — the unit the daemon commits
// to (fallocate) and releases from (punch hole) an arena file.
//
// Chunks are a whole number of huge pages. Blocks never straddle a chunk, so
// releasing a chunk frees exactly the blocks in it. When a block does not
// divide a page evenly (q8_0 on Llama-3.1-8B: 16 × 68 KiB = 1088 KiB against
// 2 MiB pages fits one block and wastes 47 %), the chunk grows to several
// pages until the packing loss is under a tolerance (seven 2 MiB pages hold
// thirteen 1088 KiB blocks, 1.3 % lost). Blocks larger than a page (70B-class
// f16: 5 MiB) are handled the same way: a chunk of several pages.
//
// Block id b lives at arena offset
//   (b / blocks_per_chunk) * chunk_bytes + (b % blocks_per_chunk) * block_bytes
// (block_offset()); clients get chunk_bytes and blocks_per_chunk with the
// geometry and compute the same.
#pragma once

#include <cstdint>

#include "util/result.hpp"

namespace airs::kv {

enum class KvType : uint8_t { F16, Q8_0 };

// Bytes of K plus V for one token: 2 × n_layer × n_head_kv × head_dim × the
// type's size (f16: 2 bytes; q8_0: 34 bytes per 32 values, so a row must be a
// multiple of 32). Errors: EINVAL for zeros or a q8_0 row that is not a
// multiple of 32, EOVERFLOW. Pure.
[[nodiscard]] Result<uint64_t> kv_bytes_per_token(uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim,
                                                  KvType type);

struct GeometryParams {
  uint64_t bytes_per_token = 0;
  uint32_t tokens_per_block = 16;
  uint64_t page_bytes = 0;   // huge page size of the pool (from sysfs; never assumed)
  uint64_t chunk_bytes = 0;  // 0: choose (see make_geometry); else a multiple of page_bytes ≥ block_bytes
  // Automatic choice: the fewest pages whose packing loss is at most this
  // many parts per million (default 1/64), looking at up to
  // max_pages_per_chunk pages; if none is that good, the least lossy.
  uint32_t max_pack_loss_ppm = 15625;
  uint32_t max_pages_per_chunk = 64;
};

struct KvGeometry {
  uint64_t bytes_per_token = 0;
  uint32_t tokens_per_block = 0;
  uint64_t block_bytes = 0;
  uint64_t page_bytes = 0;
  uint64_t chunk_bytes = 0;
  uint32_t blocks_per_chunk = 0;

  [[nodiscard]] constexpr uint64_t chunk_offset(uint32_t chunk) const { return uint64_t{chunk} * chunk_bytes; }
  [[nodiscard]] constexpr uint32_t chunk_of(uint32_t block) const { return block / blocks_per_chunk; }
  [[nodiscard]] constexpr uint64_t block_offset(uint32_t block) const {
    return chunk_offset(chunk_of(block)) + uint64_t{block % blocks_per_chunk} * block_bytes;
  }
  // Bytes at the end of every chunk that no block can use.
  [[nodiscard]] constexpr uint64_t pack_loss_bytes() const {
    return chunk_bytes - uint64_t{blocks_per_chunk} * block_bytes;
  }
  friend bool operator==(const KvGeometry&, const KvGeometry&) = default;
};

// Validates params and computes the geometry. Errors (EINVAL, with the
// numbers and what to change): zero sizes; an explicit chunk_bytes that is not
// a multiple of page_bytes or smaller than a block; overflow. Pure.
[[nodiscard]] Result<KvGeometry> make_geometry(const GeometryParams& params);

}  // namespace airs::kv
