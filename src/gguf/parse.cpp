// SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "gguf/gguf.hpp"
#include "util/units.hpp"

namespace airs::gguf {

std::string_view value_type_name(ValueType t) noexcept {
  switch (t) {
    case ValueType::kUint8: return "UINT8";
    case ValueType::kInt8: return "INT8";
    case ValueType::kUint16: return "UINT16";
    case ValueType::kInt16: return "INT16";
    case ValueType::kUint32: return "UINT32";
    case ValueType::kInt32: return "INT32";
    case ValueType::kFloat32: return "FLOAT32";
    case ValueType::kBool: return "BOOL";
    case ValueType::kString: return "STRING";
    case ValueType::kArray: return "ARRAY";
    case ValueType::kUint64: return "UINT64";
    case ValueType::kInt64: return "INT64";
    case ValueType::kFloat64: return "FLOAT64";
  }
  return "unknown";
}

uint64_t value_type_size(ValueType t) noexcept {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool: return 1;
    case ValueType::kUint16:
    case ValueType::kInt16: return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32: return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64: return 8;
    case ValueType::kString:
    case ValueType::kArray: return 0;
  }
  return 0;
}

std::string_view kv_type_name(KvType t) noexcept { return t == KvType::kF16 ? "f16" : "q8_0"; }

std::optional<uint64_t> checked_kv_bytes_per_token(const ModelGeometry& g, KvType t) noexcept {
  uint64_t rows = 0;
  uint64_t per_row = 0;  // bytes of one head's key row plus value row
  uint64_t out = 0;
  if (__builtin_mul_overflow(g.block_count, g.head_count_kv, &rows)) return std::nullopt;
  if (t == KvType::kF16) {
    if (__builtin_add_overflow(g.key_length, g.value_length, &per_row) ||
        __builtin_mul_overflow(per_row, uint64_t{2}, &per_row)) {
      return std::nullopt;
    }
  } else {
    // q8_0 quantises each head's row in 32-element blocks of 34 bytes.
    if (__builtin_add_overflow(div_round_up(g.key_length, 32), div_round_up(g.value_length, 32), &per_row) ||
        __builtin_mul_overflow(per_row, uint64_t{34}, &per_row)) {
      return std::nullopt;
    }
  }
  if (__builtin_mul_overflow(rows, per_row, &out)) return std::nullopt;
  return out;
}

uint64_t kv_bytes_per_token(const ModelGeometry& g, KvType t) noexcept {
  return checked_kv_bytes_per_token(g, t).value_or(std::numeric_limits<uint64_t>::max());
}

std::optional<uint64_t> MetaValue::as_uint() const {
  if (type == ValueType::kArray) return std::nullopt;
  return std::visit(
      [](const auto& v) -> std::optional<uint64_t> {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, bool>) {
          return v ? 1 : 0;
        } else if constexpr (std::is_integral_v<V> && std::is_unsigned_v<V>) {
          return uint64_t{v};
        } else if constexpr (std::is_integral_v<V>) {
          if (v < 0) return std::nullopt;
          return static_cast<uint64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      scalar);
}

std::optional<std::string_view> MetaValue::as_string() const {
  if (type != ValueType::kString) return std::nullopt;
  return std::string_view(std::get<std::string>(scalar));
}

std::optional<uint32_t> File::find_tensor(std::string_view name) const {
  const auto it = tensor_index.find(name);
  if (it == tensor_index.end()) return std::nullopt;
  return it->second;
}

const MetaValue* File::find(std::string_view key) const {
  const auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &it->second;
}

std::optional<uint64_t> File::find_uint(std::string_view key) const {
  const auto* v = find(key);
  return v ? v->as_uint() : std::nullopt;
}

uint64_t File::data_end() const noexcept {
  uint64_t end = data_offset;
  for (const auto& t : tensors) end = std::max(end, t.offset + t.nbytes);
  return end;
}

namespace {

// Buffered little-endian reads over a ByteSource. Every read is checked
// against the bytes that remain; field names are built only on failure (a
// callable) so the 100k-tensor path formats nothing.
class Cursor {
 public:
  static constexpr size_t kBufBytes = 64 * 1024;

  explicit Cursor(const ByteSource& src) : src_(src), size_(src.size()) {}

  [[nodiscard]] uint64_t pos() const noexcept { return pos_; }
  [[nodiscard]] uint64_t remaining() const noexcept { return size_ - pos_; }
  [[nodiscard]] uint64_t size() const noexcept { return size_; }
  void seek(uint64_t p) noexcept { pos_ = p; }

  template <typename F>
  Status need(uint64_t n, const F& field) const {
    if (n > remaining()) {
      return make_error(EBADMSG, "gguf: {} at byte {}: needs {} bytes but only {} remain (truncated file?)", field(),
                        pos_, n, remaining());
    }
    return {};
  }

  template <typename F>
  Status raw(void* dst, size_t n, const F& field) {
    AIRS_TRY(need(n, field));
    if (pos_ >= buf_off_ && pos_ - buf_off_ + n <= buf_len_) {
      std::memcpy(dst, buf_.data() + (pos_ - buf_off_), n);
      pos_ += n;
      return {};
    }
    if (n > kBufBytes / 2) {
      AIRS_TRY(wrap(src_.read(pos_, dst, n), field));
      pos_ += n;
      return {};
    }
    if (buf_.empty()) buf_.resize(kBufBytes);
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kBufBytes, remaining()));
    AIRS_TRY(wrap(src_.read(pos_, buf_.data(), len), field));
    buf_off_ = pos_;
    buf_len_ = len;
    std::memcpy(dst, buf_.data(), n);
    pos_ += n;
    return {};
  }

  template <typename T, typename F>
  Result<T> scalar(const F& field) {
    static_assert(std::endian::native == std::endian::little, "GGUF is read on little-endian hosts only");
    T v{};
    AIRS_TRY(raw(&v, sizeof v, field));
    return v;
  }

  template <typename F>
  Status skip(uint64_t n, const F& field) {
    AIRS_TRY(need(n, field));
    pos_ += n;
    return {};
  }

  // A GGUF string: u64 length then bytes. `max` caps the length.
  template <typename F>
  Result<std::string> string(uint64_t max, const F& field) {
    const uint64_t at = pos_;
    auto len = scalar<uint64_t>([&] { return field() + " length"; });
    if (!len) return std::move(len).error();
    if (*len > max) {
      return make_error(EBADMSG, "gguf: {} length at byte {}: {} bytes exceeds the limit of {}", field(), at, *len,
                        max);
    }
    AIRS_TRY(need(*len, field));
    std::string s(static_cast<size_t>(*len), '\0');
    AIRS_TRY(raw(s.data(), s.size(), field));
    return s;
  }

  // Skips a string without allocating.
  template <typename F>
  Status skip_string(uint64_t max, const F& field) {
    const uint64_t at = pos_;
    auto len = scalar<uint64_t>([&] { return field() + " length"; });
    if (!len) return std::move(len).error();
    if (*len > max) {
      return make_error(EBADMSG, "gguf: {} length at byte {}: {} bytes exceeds the limit of {}", field(), at, *len,
                        max);
    }
    return skip(*len, field);
  }

 private:
  template <typename F>
  Status wrap(Status s, const F& field) const {
    if (s.ok()) return s;
    return make_error(s.error().code, "gguf: reading {} at byte {}: {}", field(), pos_, s.error().message);
  }

  const ByteSource& src_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::vector<std::byte> buf_;
  uint64_t buf_off_ = 0;
  size_t buf_len_ = 0;
};

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::kFloat64); }

template <typename F>
Result<Scalar> read_scalar(Cursor& c, ValueType t, const ParseLimits& lim, const F& field) {
  switch (t) {
    case ValueType::kUint8: { auto v = c.scalar<uint8_t>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kInt8: { auto v = c.scalar<int8_t>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kUint16: { auto v = c.scalar<uint16_t>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kInt16: { auto v = c.scalar<int16_t>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kUint32: { auto v = c.scalar<uint32_t>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kInt32: { auto v = c.scalar<int32_t>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kFloat32: { auto v = c.scalar<float>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kUint64: { auto v = c.scalar<uint64_t>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kInt64: { auto v = c.scalar<int64_t>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kFloat64: { auto v = c.scalar<double>(field); if (!v) return std::move(v).error(); return Scalar{*v}; }
    case ValueType::kBool: {
      const uint64_t at = c.pos();
      auto v = c.scalar<uint8_t>(field);
      if (!v) return std::move(v).error();
      if (*v > 1) return make_error(EBADMSG, "gguf: {} at byte {}: BOOL value is {}, not 0 or 1", field(), at, *v);
      return Scalar{*v == 1};
    }
    case ValueType::kString: {
      auto s = c.string(lim.max_string_bytes, field);
      if (!s) return std::move(s).error();
      return Scalar{std::move(*s)};
    }
    case ValueType::kArray: break;
  }
  return make_error(EBADMSG, "gguf: {} at byte {}: not a scalar type", field(), c.pos());
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }
bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }

// Reads `a.count` elements at the cursor into a.items when `load`, else
// skips them. With a `budget` (bytes of memory eager decoding may still
// take), an array that would exceed it is skipped instead and stays on disk
// (a.loaded = false): its Scalars up front, string bytes as they are read.
// The caller has checked count × minimum element size against the file.
template <typename F>
Status read_array_elements(Cursor& c, ArrayValue& a, bool load, uint64_t* budget, const ParseLimits& lim,
                           const F& field) {
  const uint64_t esize = value_type_size(a.elem_type);
  if (load && budget != nullptr) {
    uint64_t cost = 0;
    if (mul_overflows(a.count, sizeof(Scalar), &cost) || cost > *budget) {
      load = false;
    } else {
      *budget -= cost;
    }
  }
  a.loaded = load;
  if (load) a.items.reserve(static_cast<size_t>(a.count));
  if (esize != 0 && !load) return c.skip(a.count * esize, field);  // <= remaining (checked by the caller)
  for (uint64_t i = 0; i < a.count; ++i) {
    auto elem = [&] { return fmt::format("{}[{}]", field(), i); };
    if (a.loaded) {
      auto v = read_scalar(c, a.elem_type, lim, elem);
      if (!v) return std::move(v).error();
      if (budget != nullptr && a.elem_type == ValueType::kString) {
        const uint64_t len = std::get<std::string>(*v).size();
        if (len > *budget) {
          // Out of budget mid-array: drop what was decoded, skip the rest.
          a.loaded = false;
          a.items.clear();
          a.items.shrink_to_fit();
          continue;
        }
        *budget -= len;
      }
      a.items.push_back(std::move(*v));
    } else {
      AIRS_TRY(c.skip_string(lim.max_string_bytes, elem));
    }
  }
  return {};
}

// Array header (elem type, count) with every check done before allocating.
template <typename F>
Status read_array(Cursor& c, ArrayValue& a, uint64_t* budget, const ParseLimits& lim, const F& field) {
  const uint64_t type_at = c.pos();
  auto et = c.scalar<uint32_t>([&] { return field() + " element type"; });
  if (!et) return std::move(et).error();
  if (*et == static_cast<uint32_t>(ValueType::kArray)) {
    return make_error(EBADMSG, "gguf: {} element type at byte {}: nested arrays are not supported", field(), type_at);
  }
  if (!valid_value_type(*et)) {
    return make_error(EBADMSG, "gguf: {} element type at byte {}: unknown value type {}", field(), type_at, *et);
  }
  a.elem_type = static_cast<ValueType>(*et);
  const uint64_t count_at = c.pos();
  auto n = c.scalar<uint64_t>([&] { return field() + " count"; });
  if (!n) return std::move(n).error();
  if (*n > lim.max_array_elements) {
    return make_error(EBADMSG, "gguf: {} count at byte {}: {} elements exceeds the limit of {}", field(), count_at, *n,
                      lim.max_array_elements);
  }
  // Strings need at least their 8-byte length each. The product can wrap
  // only with a raised max_array_elements, and is then as impossible.
  const uint64_t min_elem = a.elem_type == ValueType::kString ? 8 : value_type_size(a.elem_type);
  uint64_t min_bytes = 0;
  if (mul_overflows(*n, min_elem, &min_bytes)) {
    return make_error(EBADMSG, "gguf: {} count at byte {}: {} elements of {} overflow 64 bits of bytes", field(),
                      count_at, *n, value_type_name(a.elem_type));
  }
  if (min_bytes > c.remaining()) {
    return make_error(EBADMSG, "gguf: {} count at byte {}: {} elements of {} need at least {} bytes, only {} remain",
                      field(), count_at, *n, value_type_name(a.elem_type), min_bytes, c.remaining());
  }
  a.count = *n;
  a.data_offset = c.pos();
  AIRS_TRY(read_array_elements(c, a, a.count <= lim.eager_array_elements, budget, lim, field));
  a.byte_size = c.pos() - a.data_offset;
  return {};
}

struct LayerName {
  LayerSlot slot = LayerSlot::kPre;
  uint64_t block = 0;
  bool is_output_norm = false;
};

LayerName classify(std::string_view name) {
  auto starts = [&](std::string_view p) { return name.substr(0, p.size()) == p; };
  if (starts("output_norm.") || name == "output_norm") return {LayerSlot::kPost, 0, true};
  if (starts("output.") || name == "output") return {LayerSlot::kPost, 0, false};
  if (!starts("blk.")) return {};
  uint64_t n = 0;
  size_t i = 4;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    if (i - 4 >= 9) return {};  // > 999,999,999 blocks is not a block index
    n = n * 10 + static_cast<uint64_t>(name[i] - '0');
  }
  if (i == 4 || (i < name.size() && name[i] != '.')) return {};
  return {LayerSlot::kBlock, n, false};
}

struct PendingTensor {
  uint64_t rel_offset = 0;
  uint64_t offset_field_at = 0;
};

Status check_geometry_value(const File& f, const std::string& key, uint64_t v, const ParseLimits& lim) {
  const MetaValue* m = f.find(key);
  if (v == 0) return make_error(EBADMSG, "gguf: key '{}' at byte {}: must be at least 1", key, m ? m->offset : 0);
  if (v > lim.max_geometry_value) {
    return make_error(EBADMSG, "gguf: key '{}' at byte {}: {} exceeds the limit of {}", key, m ? m->offset : 0, v,
                      lim.max_geometry_value);
  }
  return {};
}

// llama-like KV geometry. Absent or non-integer keys give no geometry (a
// non-llama model is not malformed); present but impossible values reject.
Result<std::optional<ModelGeometry>> read_geometry(const File& f, const ParseLimits& lim) {
  if (f.architecture.empty()) return std::optional<ModelGeometry>{};
  const std::string& a = f.architecture;
  auto get = [&](const std::string& key) -> std::optional<uint64_t> {
    const MetaValue* m = f.find(key);
    return m ? m->as_uint() : std::nullopt;
  };
  const auto blocks = get(a + ".block_count");
  const auto heads = get(a + ".attention.head_count");
  const auto embd = get(a + ".embedding_length");
  if (!blocks || !heads || !embd) return std::optional<ModelGeometry>{};
  ModelGeometry g;
  g.block_count = *blocks;
  g.head_count = *heads;
  g.embedding_length = *embd;
  AIRS_TRY(check_geometry_value(f, a + ".block_count", g.block_count, lim));
  AIRS_TRY(check_geometry_value(f, a + ".attention.head_count", g.head_count, lim));
  AIRS_TRY(check_geometry_value(f, a + ".embedding_length", g.embedding_length, lim));
  g.head_count_kv = get(a + ".attention.head_count_kv").value_or(g.head_count);
  AIRS_TRY(check_geometry_value(f, a + ".attention.head_count_kv", g.head_count_kv, lim));
  if (g.head_count_kv > g.head_count) {
    return make_error(EBADMSG, "gguf: key '{}.attention.head_count_kv' at byte {}: {} KV heads exceed {} heads", a,
                      f.find(a + ".attention.head_count_kv")->offset, g.head_count_kv, g.head_count);
  }
  const auto kl = get(a + ".attention.key_length");
  const auto vl = get(a + ".attention.value_length");
  if ((!kl || !vl) && g.embedding_length % g.head_count != 0) {
    return make_error(EBADMSG,
                      "gguf: key '{}.embedding_length' at byte {}: {} is not a multiple of head_count {} and no "
                      "key_length/value_length is given",
                      a, f.find(a + ".embedding_length")->offset, g.embedding_length, g.head_count);
  }
  g.key_length = kl.value_or(g.embedding_length / g.head_count);
  g.value_length = vl.value_or(g.embedding_length / g.head_count);
  AIRS_TRY(check_geometry_value(f, a + ".attention.key_length", g.key_length, lim));
  AIRS_TRY(check_geometry_value(f, a + ".attention.value_length", g.value_length, lim));
  g.context_length = get(a + ".context_length").value_or(0);
  // Each factor is capped, their product is not: 2^24 layers × 2^24 KV
  // heads × 2^25 elements wraps u64. Callers size KV arenas by it.
  for (KvType kt : {KvType::kF16, KvType::kQ8_0}) {
    const auto per = checked_kv_bytes_per_token(g, kt);
    if (!per || *per > lim.max_kv_bytes_per_token) {
      return make_error(EBADMSG,
                        "gguf: key '{}.block_count' at byte {}: a {} KV cache of {} layers x {} KV heads x (key {} + "
                        "value {}) is {} bytes per token, above the limit of {}",
                        a, f.find(a + ".block_count")->offset, kv_type_name(kt), g.block_count, g.head_count_kv,
                        g.key_length, g.value_length, per ? std::to_string(*per) : std::string("more than 2^64"),
                        lim.max_kv_bytes_per_token);
    }
  }
  return std::optional<ModelGeometry>{g};
}

// Tokenizer arrays a runtime indexes by token id must agree, and special
// token ids must index into the vocabulary (an out-of-range bos/eos id is a
// heap read in runtimes that trust it). Keys are checked in file order so a
// file with several defects always reports the same one.
Status check_tokenizer(const File& f) {
  constexpr std::string_view kPrefix = "tokenizer.ggml.";
  constexpr std::string_view kIdSuffix = "_token_id";
  auto expect_array = [&](std::string_view key, ValueType elem) -> Status {
    const MetaValue* m = f.find(key);
    if (m == nullptr) return {};
    if (m->type != ValueType::kArray) {
      return make_error(EBADMSG, "gguf: key '{}' at byte {}: type is {}, expected ARRAY of {}", key, m->offset,
                        value_type_name(m->type), value_type_name(elem));
    }
    if (m->array.elem_type != elem) {
      return make_error(EBADMSG, "gguf: key '{}' at byte {}: type is ARRAY of {}, expected ARRAY of {}", key,
                        m->offset, value_type_name(m->array.elem_type), value_type_name(elem));
    }
    return {};
  };
  AIRS_TRY(expect_array("tokenizer.ggml.tokens", ValueType::kString));
  AIRS_TRY(expect_array("tokenizer.ggml.scores", ValueType::kFloat32));
  AIRS_TRY(expect_array("tokenizer.ggml.token_type", ValueType::kInt32));
  AIRS_TRY(expect_array("tokenizer.ggml.merges", ValueType::kString));
  const MetaValue* tokens = f.find("tokenizer.ggml.tokens");
  // A plain count, not an optional: gcc's -Wmaybe-uninitialized misfires on it.
  const uint64_t n_tokens = tokens != nullptr ? tokens->array.count : 0;
  if (tokens != nullptr) {
    for (std::string_view key : {"tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
      const MetaValue* m = f.find(key);
      if (m != nullptr && m->array.count != n_tokens) {
        return make_error(EBADMSG,
                          "gguf: key '{}' at byte {}: {} elements, expected {} (one per entry of "
                          "'tokenizer.ggml.tokens' at byte {})",
                          key, m->offset, m->array.count, n_tokens, tokens->offset);
      }
    }
  }
  std::vector<std::pair<std::string_view, const MetaValue*>> ids;
  for (const auto& [key, v] : f.metadata) {
    const std::string_view k = key;
    if (k.size() > kPrefix.size() + kIdSuffix.size() && k.starts_with(kPrefix) && k.ends_with(kIdSuffix)) {
      ids.emplace_back(k, &v);
    }
  }
  std::sort(ids.begin(), ids.end(), [](const auto& x, const auto& y) { return x.second->offset < y.second->offset; });
  for (const auto& [key, m] : ids) {
    const bool integer = m->type != ValueType::kArray && m->type != ValueType::kString && m->type != ValueType::kBool &&
                         m->type != ValueType::kFloat32 && m->type != ValueType::kFloat64;
    if (!integer) {
      return make_error(EBADMSG, "gguf: key '{}' at byte {}: type is {}, expected an unsigned integer token id", key,
                        m->offset, value_type_name(m->type));
    }
    const auto id = m->as_uint();
    if (!id) {
      return make_error(EBADMSG, "gguf: key '{}' at byte {}: token id is negative", key, m->offset);
    }
    if (tokens != nullptr && *id >= n_tokens) {
      return make_error(EBADMSG,
                        "gguf: key '{}' at byte {}: token id {} is out of range for {} tokens "
                        "('tokenizer.ggml.tokens' at byte {})",
                        key, m->offset, *id, n_tokens, tokens->offset);
    }
  }
  return {};
}

Status parse_kvs(Cursor& c, File& f, const ParseLimits& lim) {
  const uint64_t kv_start = c.pos();
  f.metadata.reserve(static_cast<size_t>(f.n_kv));
  uint64_t eager_budget = lim.max_eager_bytes;
  for (uint64_t i = 0; i < f.n_kv; ++i) {
    const uint64_t key_at = c.pos();
    auto key = c.string(lim.max_string_bytes, [&] { return fmt::format("kv[{}] key", i); });
    if (!key) return std::move(key).error();
    if (key->empty()) return make_error(EBADMSG, "gguf: kv[{}] key at byte {}: key is empty", i, key_at);
    const std::string& k = *key;
    auto field = [&] { return fmt::format("kv[{}] '{}'", i, k); };
    const uint64_t type_at = c.pos();
    auto type = c.scalar<uint32_t>([&] { return field() + " value type"; });
    if (!type) return std::move(type).error();
    if (!valid_value_type(*type)) {
      return make_error(EBADMSG, "gguf: {} value type at byte {}: unknown value type {}", field(), type_at, *type);
    }
    MetaValue v;
    v.type = static_cast<ValueType>(*type);
    v.offset = c.pos();
    if (v.type == ValueType::kArray) {
      AIRS_TRY(read_array(c, v.array, &eager_budget, lim, field));
    } else {
      auto s = read_scalar(c, v.type, lim, field);
      if (!s) return std::move(s).error();
      v.scalar = std::move(*s);
    }
    if (c.pos() - kv_start > lim.max_metadata_bytes) {
      return make_error(EBADMSG, "gguf: {} at byte {}: metadata exceeds the limit of {} bytes", field(), key_at,
                        lim.max_metadata_bytes);
    }
    if (k == "general.alignment") {
      if (v.type != ValueType::kUint32) {
        return make_error(EBADMSG, "gguf: key 'general.alignment' at byte {}: type is {}, expected UINT32", v.offset,
                          value_type_name(v.type));
      }
      const uint32_t al = std::get<uint32_t>(v.scalar);
      if (!is_pow2(al)) {
        return make_error(EBADMSG, "gguf: key 'general.alignment' at byte {}: {} is not a power of two", v.offset, al);
      }
      if (al > lim.max_alignment) {
        return make_error(EBADMSG, "gguf: key 'general.alignment' at byte {}: {} exceeds the limit of {}", v.offset, al,
                          lim.max_alignment);
      }
      f.alignment = al;
    } else if (k == "general.architecture") {
      if (v.type != ValueType::kString) {
        return make_error(EBADMSG, "gguf: key 'general.architecture' at byte {}: type is {}, expected STRING",
                          v.offset, value_type_name(v.type));
      }
      f.architecture = std::get<std::string>(v.scalar);
    }
    const auto [it, inserted] = f.metadata.try_emplace(std::move(*key), std::move(v));
    if (!inserted) {
      return make_error(EBADMSG, "gguf: kv[{}] key '{}' at byte {}: duplicate key (first defined at byte {})", i,
                        it->first, key_at, it->second.offset);
    }
  }
  return {};
}

Status parse_tensor_info(Cursor& c, File& f, uint64_t i, std::vector<PendingTensor>& pending,
                         const ParseLimits& lim) {
  TensorInfo t;
  t.info_offset = c.pos();
  auto name = c.string(kMaxNameBytes, [&] { return fmt::format("tensor[{}] name", i); });
  if (!name) return std::move(name).error();
  if (name->empty()) return make_error(EBADMSG, "gguf: tensor[{}] name at byte {}: name is empty", i, t.info_offset);
  t.name = std::move(*name);
  auto field = [&] { return fmt::format("tensor[{}] '{}'", i, t.name); };
  const uint64_t nd_at = c.pos();
  auto nd = c.scalar<uint32_t>([&] { return field() + " n_dims"; });
  if (!nd) return std::move(nd).error();
  if (*nd == 0 || *nd > kMaxDims) {
    return make_error(EBADMSG, "gguf: {} n_dims at byte {}: {} dimensions, expected 1 to {}", field(), nd_at, *nd,
                      kMaxDims);
  }
  t.dims.resize(*nd);
  uint64_t elements = 1;
  for (uint32_t d = 0; d < *nd; ++d) {
    const uint64_t at = c.pos();
    auto dim = c.scalar<uint64_t>([&] { return fmt::format("{} dims[{}]", field(), d); });
    if (!dim) return std::move(dim).error();
    if (*dim == 0) return make_error(EBADMSG, "gguf: {} dims[{}] at byte {}: dimension is 0", field(), d, at);
    if (*dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return make_error(EBADMSG, "gguf: {} dims[{}] at byte {}: dimension {} exceeds INT64_MAX", field(), d, at, *dim);
    }
    if (mul_overflows(elements, *dim, &elements) ||
        elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return make_error(EBADMSG, "gguf: {} dims[{}] at byte {}: element count overflows 63 bits", field(), d, at);
    }
    t.dims[d] = *dim;
  }
  t.n_elements = elements;
  const uint64_t type_at = c.pos();
  auto type = c.scalar<uint32_t>([&] { return field() + " type"; });
  if (!type) return std::move(type).error();
  const TypeTraits tr = type_traits(*type);
  switch (tr.status) {
    case TypeStatus::kSupported: break;
    case TypeStatus::kDeprecated:
    case TypeStatus::kRemoved:
      return make_error(ENOTSUP, "gguf: {} type at byte {}: ggml type id {} is no longer supported ({})", field(),
                        type_at, *type, tr.name);
    case TypeStatus::kUnknown:
      return make_error(ENOTSUP, "gguf: {} type at byte {}: unknown ggml type id {}", field(), type_at, *type);
  }
  t.type_id = *type;
  t.type_name = tr.name;
  if (t.dims[0] % tr.block_size != 0) {
    return make_error(EBADMSG, "gguf: {} dims[0] at byte {}: ne0 = {} is not a multiple of the {} block size {}",
                      field(), nd_at + 4, t.dims[0], tr.name, tr.block_size);
  }
  // ne0 < 2^63 blocks of up to 8 bytes (f64, i64) wrap on their own, so
  // the first factor is checked like the others.
  const uint64_t blocks = t.dims[0] / tr.block_size;
  uint64_t bytes = 0;
  if (mul_overflows(blocks, tr.type_size, &bytes)) {
    return make_error(EBADMSG,
                      "gguf: {} dims[0] at byte {}: byte size overflows 64 bits ({} {} blocks of {} bytes)", field(),
                      nd_at + 4, blocks, tr.name, tr.type_size);
  }
  for (size_t d = 1; d < t.dims.size(); ++d) {
    if (mul_overflows(bytes, t.dims[d], &bytes)) {
      return make_error(EBADMSG, "gguf: {} dims[{}] at byte {}: byte size overflows 64 bits", field(), d,
                        nd_at + 4 + 8 * d);
    }
  }
  t.nbytes = bytes;
  const uint64_t off_at = c.pos();
  auto off = c.scalar<uint64_t>([&] { return field() + " offset"; });
  if (!off) return std::move(off).error();
  if (*off % f.alignment != 0) {
    return make_error(EBADMSG, "gguf: {} offset at byte {}: {} is not a multiple of the alignment {}", field(), off_at,
                      *off, f.alignment);
  }
  (void)lim;
  const auto idx = static_cast<uint32_t>(i);
  const auto [it, inserted] = f.tensor_index.try_emplace(t.name, idx);
  if (!inserted) {
    return make_error(EBADMSG, "gguf: {} name at byte {}: duplicate tensor name (first is tensor[{}] at byte {})",
                      field(), t.info_offset, it->second, f.tensors[it->second].info_offset);
  }
  pending.push_back({*off, off_at});
  f.tensors.push_back(std::move(t));
  return {};
}

Status place_tensors(File& f, const std::vector<PendingTensor>& pending) {
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    TensorInfo& t = f.tensors[i];
    const PendingTensor& p = pending[i];
    uint64_t end = 0;
    if (__builtin_add_overflow(f.data_offset, p.rel_offset, &t.offset) ||
        __builtin_add_overflow(t.offset, t.nbytes, &end)) {
      return make_error(EBADMSG, "gguf: tensor[{}] '{}' offset at byte {}: data offset {} + {} bytes overflows", i,
                        t.name, p.offset_field_at, p.rel_offset, t.nbytes);
    }
    if (end > f.file_size) {
      return make_error(EBADMSG,
                        "gguf: tensor[{}] '{}' offset at byte {}: data [{}, {}) extends past the end of the file ({} "
                        "bytes)",
                        i, t.name, p.offset_field_at, t.offset, end, f.file_size);
    }
  }
  std::vector<uint32_t> by_offset(f.tensors.size());
  std::iota(by_offset.begin(), by_offset.end(), 0U);
  std::sort(by_offset.begin(), by_offset.end(), [&](uint32_t a, uint32_t b) {
    return f.tensors[a].offset != f.tensors[b].offset ? f.tensors[a].offset < f.tensors[b].offset : a < b;
  });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const TensorInfo& prev = f.tensors[by_offset[k - 1]];
    const TensorInfo& cur = f.tensors[by_offset[k]];
    if (cur.offset < prev.offset + prev.nbytes) {
      return make_error(EBADMSG,
                        "gguf: tensor[{}] '{}' offset at byte {}: data [{}, {}) overlaps tensor[{}] '{}' [{}, {})",
                        by_offset[k], cur.name, pending[by_offset[k]].offset_field_at, cur.offset,
                        cur.offset + cur.nbytes, by_offset[k - 1], prev.name, prev.offset, prev.offset + prev.nbytes);
    }
  }
  return {};
}

Status assign_layers(File& f, const ParseLimits& lim) {
  std::optional<uint64_t> block_count;
  if (!f.architecture.empty()) {
    const std::string key = f.architecture + ".block_count";
    if (const MetaValue* m = f.find(key)) {
      block_count = m->as_uint();
      if (!block_count) {
        return make_error(EBADMSG, "gguf: key '{}' at byte {}: type is {}, expected an unsigned integer", key,
                          m->offset, value_type_name(m->type));
      }
      // n_layers sizes per-layer state in callers and the post-layer rank
      // below adds to it: bounded even when there is no other geometry.
      if (*block_count > lim.max_geometry_value) {
        return make_error(EBADMSG, "gguf: key '{}' at byte {}: {} exceeds the limit of {}", key, m->offset,
                          *block_count, lim.max_geometry_value);
      }
    }
  }
  std::vector<LayerName> names(f.tensors.size());
  uint64_t highest = 0;
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    names[i] = classify(f.tensors[i].name);
    if (names[i].slot == LayerSlot::kBlock) {
      if (block_count && names[i].block >= *block_count) {
        return make_error(EBADMSG, "gguf: tensor[{}] '{}' name at byte {}: block {} is outside {}.block_count = {}", i,
                          f.tensors[i].name, f.tensors[i].info_offset, names[i].block, f.architecture, *block_count);
      }
      highest = std::max(highest, names[i].block + 1);
    }
  }
  f.n_layers = block_count.value_or(highest);
  std::vector<uint64_t> group(f.tensors.size());
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    TensorInfo& t = f.tensors[i];
    t.slot = names[i].slot;
    switch (t.slot) {
      case LayerSlot::kPre: t.layer = -1; group[i] = 0; break;
      case LayerSlot::kBlock:
        t.layer = static_cast<int64_t>(names[i].block);
        group[i] = names[i].block + 1;
        break;
      case LayerSlot::kPost:
        t.layer = static_cast<int64_t>(f.n_layers);
        group[i] = f.n_layers + (names[i].is_output_norm ? 1 : 2);
        break;
    }
  }
  f.load_order.resize(f.tensors.size());
  std::iota(f.load_order.begin(), f.load_order.end(), 0U);
  std::sort(f.load_order.begin(), f.load_order.end(), [&](uint32_t a, uint32_t b) {
    if (group[a] != group[b]) return group[a] < group[b];
    return f.tensors[a].offset < f.tensors[b].offset;
  });
  for (size_t r = 0; r < f.load_order.size(); ++r) f.tensors[f.load_order[r]].load_rank = static_cast<uint32_t>(r);
  return {};
}

}  // namespace

Result<File> parse(const ByteSource& src, const ParseLimits& lim) {
  Cursor c(src);
  File f;
  f.file_size = c.size();
  if (f.file_size < 24) {
    if (f.file_size >= 4) {
      auto magic = c.scalar<uint32_t>([] { return std::string("magic"); });
      if (!magic) return std::move(magic).error();
      if (*magic != kMagic) {
        return make_error(EBADMSG, "gguf: magic at byte 0: 0x{:08x} is not \"GGUF\" (not a GGUF file)", *magic);
      }
    }
    return make_error(EBADMSG, "gguf: header at byte 0: file is {} bytes, shorter than the 24-byte GGUF header",
                      f.file_size);
  }
  auto magic = c.scalar<uint32_t>([] { return std::string("magic"); });
  if (!magic) return std::move(magic).error();
  if (*magic != kMagic) {
    return make_error(EBADMSG, "gguf: magic at byte 0: 0x{:08x} is not \"GGUF\" (not a GGUF file)", *magic);
  }
  auto version = c.scalar<uint32_t>([] { return std::string("version"); });
  if (!version) return std::move(version).error();
  f.version = *version;
  if (f.version == 1) {
    return make_error(ENOTSUP,
                      "gguf: version at byte 4: version 1 is not supported (only 2 and 3); re-convert the model with a "
                      "current llama.cpp");
  }
  if (f.version != 2 && f.version != 3) {
    const uint32_t swapped = __builtin_bswap32(f.version);
    if (swapped >= 1 && swapped <= 3) {
      return make_error(ENOTSUP, "gguf: version at byte 4: big-endian GGUF (version {}) is not supported", swapped);
    }
    return make_error(ENOTSUP, "gguf: version at byte 4: unknown version {} (only 2 and 3 are supported)", f.version);
  }
  auto n_tensors = c.scalar<uint64_t>([] { return std::string("tensor count"); });
  if (!n_tensors) return std::move(n_tensors).error();
  auto n_kv = c.scalar<uint64_t>([] { return std::string("kv count"); });
  if (!n_kv) return std::move(n_kv).error();
  // Tensor indices are u32 (load_order, tensor_index), whatever the limit.
  const uint64_t max_tensors = std::min<uint64_t>(lim.max_tensors, std::numeric_limits<uint32_t>::max());
  if (*n_tensors > max_tensors) {
    return make_error(EBADMSG, "gguf: tensor count at byte 8: {} tensors exceeds the limit of {}", *n_tensors,
                      max_tensors);
  }
  if (*n_kv > lim.max_kv) {
    return make_error(EBADMSG, "gguf: kv count at byte 16: {} keys exceeds the limit of {}", *n_kv, lim.max_kv);
  }
  // Minimum record sizes: a KV is key length (8) + type (4) + a 1-byte value;
  // a tensor info is name length (8) + n_dims (4) + one dim (8) + type (4) +
  // offset (8). The default caps keep these products far from overflow; a
  // raised max_kv can wrap them, so they are checked.
  constexpr uint64_t kMinKv = 13;
  constexpr uint64_t kMinTensor = 32;
  auto bytes_text = [](bool wraps, uint64_t v) { return wraps ? std::string("more than 2^64") : std::to_string(v); };
  uint64_t kv_min = 0;
  const bool kv_wraps = mul_overflows(*n_kv, kMinKv, &kv_min);
  if (kv_wraps || kv_min > c.remaining()) {
    return make_error(EBADMSG, "gguf: kv count at byte 16: {} keys need at least {} bytes, only {} remain", *n_kv,
                      bytes_text(kv_wraps, kv_min), c.remaining());
  }
  uint64_t tensor_min = 0;
  uint64_t all_min = 0;
  const bool tensor_wraps = mul_overflows(*n_tensors, kMinTensor, &tensor_min);
  if (tensor_wraps || add_overflows(tensor_min, kv_min, &all_min) || all_min > c.remaining()) {
    return make_error(EBADMSG, "gguf: tensor count at byte 8: {} tensors need at least {} bytes, only {} remain",
                      *n_tensors, bytes_text(tensor_wraps, tensor_min), c.remaining() - kv_min);
  }
  f.n_kv = *n_kv;
  AIRS_TRY(parse_kvs(c, f, lim));
  AIRS_TRY(check_tokenizer(f));

  std::vector<PendingTensor> pending;
  pending.reserve(static_cast<size_t>(*n_tensors));
  f.tensors.reserve(static_cast<size_t>(*n_tensors));
  f.tensor_index.reserve(static_cast<size_t>(*n_tensors));
  for (uint64_t i = 0; i < *n_tensors; ++i) AIRS_TRY(parse_tensor_info(c, f, i, pending, lim));

  // A ByteSource may claim any size up to 2^64 - 1, so the rounding is checked.
  const auto data_offset = round_up(c.pos(), f.alignment);
  if (!data_offset) {
    return make_error(EBADMSG, "gguf: data section at byte {}: rounding up to the alignment {} overflows 64 bits",
                      c.pos(), f.alignment);
  }
  f.data_offset = *data_offset;
  if (!f.tensors.empty() && f.data_offset > f.file_size) {
    return make_error(EBADMSG, "gguf: data section at byte {}: starts past the end of the file ({} bytes)",
                      f.data_offset, f.file_size);
  }
  AIRS_TRY(place_tensors(f, pending));
  AIRS_TRY(assign_layers(f, lim));
  auto geo = read_geometry(f, lim);
  if (!geo) return std::move(geo).error();
  f.geometry = *geo;
  return f;
}

Result<std::vector<Scalar>> load_array(const ByteSource& src, const ArrayValue& a, const ParseLimits& lim) {
  if (a.loaded) return a.items;
  if (a.count > lim.max_array_elements) {
    return make_error(EBADMSG, "gguf: array at byte {}: {} elements exceeds the limit of {}", a.data_offset, a.count,
                      lim.max_array_elements);
  }
  Cursor c(src);
  if (a.data_offset > c.size()) {
    return make_error(EBADMSG, "gguf: array at byte {}: past the end of the file", a.data_offset);
  }
  c.seek(a.data_offset);
  ArrayValue copy = a;
  copy.items.clear();
  const uint64_t min_elem = a.elem_type == ValueType::kString ? 8 : value_type_size(a.elem_type);
  uint64_t min_bytes = 0;
  if (min_elem == 0 || mul_overflows(a.count, min_elem, &min_bytes) || min_bytes > c.remaining()) {
    return make_error(EBADMSG, "gguf: array at byte {}: {} elements do not fit in the file", a.data_offset, a.count);
  }
  AIRS_TRY(read_array_elements(c, copy, true, nullptr, lim,
                               [&] { return fmt::format("array at byte {}", a.data_offset); }));
  return std::move(copy.items);
}

}  // namespace airs::gguf
