// SPDX-License-Identifier: Apache-2.0
#include "pager/access_order.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <xxhash.h>

namespace airs::pager {

namespace {

constexpr char kMagic[8] = {'A', 'I', 'R', 'S', 'O', 'R', 'D', '\n'};

// Little-endian on every host (the file may outlive the machine).
void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace

std::vector<uint8_t> encode_access_order(uint64_t unit_size, uint32_t unit_count, const std::vector<uint32_t>& order) {
  const auto n = static_cast<uint32_t>(std::min<size_t>(order.size(), kMaxRecordedUnits));
  std::vector<uint8_t> out;
  out.reserve(kAccessOrderHeaderBytes + 4ULL * n + 8);
  out.insert(out.end(), kMagic, kMagic + sizeof kMagic);
  put_le(out, kAccessOrderVersion, 4);
  put_le(out, unit_count, 4);
  put_le(out, unit_size, 8);
  put_le(out, n, 4);
  put_le(out, 0, 4);
  for (uint32_t i = 0; i < n; ++i) put_le(out, order[i], 4);
  put_le(out, XXH3_64bits(out.data(), out.size()), 8);
  return out;
}

Result<std::vector<uint32_t>> parse_access_order(const uint8_t* data, uint64_t len, uint64_t unit_size,
                                                 uint32_t unit_count) {
  if (len < kAccessOrderHeaderBytes + 8)
    return make_error(EBADMSG, "recorded order: {} bytes, shorter than its {}-byte header and checksum", len,
                      kAccessOrderHeaderBytes + 8);
  if (std::memcmp(data, kMagic, sizeof kMagic) != 0) return make_error(EBADMSG, "recorded order: wrong magic");
  const uint64_t n = get_le(data + 24, 4);
  if (n > kMaxRecordedUnits)
    return make_error(EBADMSG, "recorded order: {} entries, more than the {} allowed", n, kMaxRecordedUnits);
  const uint64_t want = kAccessOrderHeaderBytes + 4 * n + 8;
  if (len != want)
    return make_error(EBADMSG, "recorded order: {} bytes where {} entries take {} (truncated or padded)", len, n,
                      want);
  // The checksum before any other field: a torn or edited file says so.
  if (get_le(data + len - 8, 8) != XXH3_64bits(data, len - 8))
    return make_error(EBADMSG, "recorded order: checksum mismatch (torn or edited)");
  if (const uint64_t v = get_le(data + 8, 4); v != kAccessOrderVersion)
    return make_error(ENOTSUP, "recorded order: version {}, this daemon reads version {}", v, kAccessOrderVersion);
  if (get_le(data + 28, 4) != 0) return make_error(EBADMSG, "recorded order: reserved field is not zero");
  const uint64_t count = get_le(data + 12, 4);
  const uint64_t size = get_le(data + 16, 8);
  if (count != unit_count || size != unit_size)
    return make_error(ESTALE, "recorded order: made for {} units of {} bytes, this model has {} units of {} bytes",
                      count, size, unit_count, unit_size);
  if (n > unit_count)
    return make_error(EBADMSG, "recorded order: {} entries for {} units", n, unit_count);
  std::vector<uint32_t> out(n);
  std::vector<bool> seen(unit_count, false);
  for (uint64_t i = 0; i < n; ++i) {
    const auto u = static_cast<uint32_t>(get_le(data + kAccessOrderHeaderBytes + 4 * i, 4));
    if (u >= unit_count)
      return make_error(EBADMSG, "recorded order: entry {} is unit {}, past the model's {} units", i, u, unit_count);
    if (seen[u]) return make_error(EBADMSG, "recorded order: unit {} appears twice (entry {})", u, i);
    seen[u] = true;
    out[i] = u;
  }
  return out;
}

}  // namespace airs::pager
