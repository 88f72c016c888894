// SPDX-License-Identifier: Apache-2.0
#include "kv/geometry.hpp"

#include <limits>

#include "util/units.hpp"

namespace airs::kv {
namespace {

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

}  // namespace

Result<uint64_t> kv_bytes_per_token(uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim, KvType type) {
  if (n_layer == 0 || n_head_kv == 0 || head_dim == 0) {
    return make_error(EINVAL, "KV geometry: n_layer={}, n_head_kv={}, head_dim={}: all must be positive", n_layer,
                      n_head_kv, head_dim);
  }
  const uint64_t row = uint64_t{n_head_kv} * head_dim;  // values per token per layer, for K (and again for V)
  uint64_t row_bytes = 0;
  switch (type) {
    case KvType::F16:
      row_bytes = row * 2;
      break;
    case KvType::Q8_0:
      // q8_0 stores 32 values as 32 int8 + one f16 scale; a row that is not
      // whole blocks cannot be stored in that type.
      if (row % 32 != 0) {
        return make_error(EINVAL, "KV geometry: q8_0 needs n_head_kv*head_dim to be a multiple of 32, got {}", row);
      }
      row_bytes = row / 32 * 34;
      break;
  }
  uint64_t total = 0;
  if (mul_overflows(row_bytes, uint64_t{n_layer} * 2, total)) {
    return make_error(EOVERFLOW, "KV geometry: bytes per token overflow ({} layers, row {} bytes)", n_layer, row_bytes);
  }
  return total;
}

Result<KvGeometry> make_geometry(const GeometryParams& p) {
  if (p.bytes_per_token == 0 || p.tokens_per_block == 0 || p.page_bytes == 0) {
    return make_error(EINVAL,
                      "KV geometry: bytes_per_token={}, tokens_per_block={}, page_bytes={}: all must be positive",
                      p.bytes_per_token, p.tokens_per_block, p.page_bytes);
  }
  KvGeometry g;
  g.bytes_per_token = p.bytes_per_token;
  g.tokens_per_block = p.tokens_per_block;
  g.page_bytes = p.page_bytes;
  if (mul_overflows(p.bytes_per_token, p.tokens_per_block, g.block_bytes)) {
    return make_error(EOVERFLOW, "KV geometry: block of {} tokens × {} bytes overflows", p.tokens_per_block,
                      p.bytes_per_token);
  }
  if (p.chunk_bytes != 0) {
    if (p.chunk_bytes % p.page_bytes != 0) {
      return make_error(EINVAL, "KV geometry: chunk_bytes {} is not a multiple of the huge page size {}; use a multiple",
                        p.chunk_bytes, p.page_bytes);
    }
    if (p.chunk_bytes < g.block_bytes) {
      return make_error(EINVAL,
                        "KV geometry: a block ({} = {} tokens × {}) does not fit a chunk of {}; raise chunk_bytes to a "
                        "multiple of {} of at least the block size, or lower tokens_per_block",
                        format_bytes(g.block_bytes), p.tokens_per_block, format_bytes(p.bytes_per_token),
                        format_bytes(p.chunk_bytes), format_bytes(p.page_bytes));
    }
    g.chunk_bytes = p.chunk_bytes;
  } else {
    const uint64_t min_pages = div_round_up(g.block_bytes, p.page_bytes);
    const uint64_t max_pages = std::max<uint64_t>(min_pages, p.max_pages_per_chunk);
    uint64_t best_pages = 0;
    uint64_t best_loss_ppm = std::numeric_limits<uint64_t>::max();
    for (uint64_t k = min_pages; k <= max_pages; ++k) {
      uint64_t bytes = 0;
      if (mul_overflows(k, p.page_bytes, bytes)) break;
      const uint64_t loss = bytes % g.block_bytes;
      // In double: loss × 10^6 may overflow uint64 for absurd sizes; loss < bytes keeps the result < 10^6.
      const auto loss_ppm = static_cast<uint64_t>(static_cast<double>(loss) * 1e6 / static_cast<double>(bytes));
      if (loss_ppm < best_loss_ppm) {
        best_loss_ppm = loss_ppm;
        best_pages = k;
      }
      if (loss_ppm <= p.max_pack_loss_ppm) break;  // the fewest pages that are good enough
    }
    if (best_pages == 0) {
      return make_error(EOVERFLOW, "KV geometry: no chunk of whole {} pages holds a {} block",
                        format_bytes(p.page_bytes), format_bytes(g.block_bytes));
    }
    g.chunk_bytes = best_pages * p.page_bytes;
  }
  const uint64_t bpc = g.chunk_bytes / g.block_bytes;
  if (bpc > std::numeric_limits<uint32_t>::max() / 2) {
    return make_error(EINVAL, "KV geometry: {} blocks per chunk is too many; raise tokens_per_block", bpc);
  }
  g.blocks_per_chunk = static_cast<uint32_t>(bpc);
  return g;
}

}  // namespace airs::kv
