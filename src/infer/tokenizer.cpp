// SPDX-License-Identifier: Apache-2.0
#include "infer/tokenizer.hpp"

#include <queue>

namespace airs::infer {

namespace {

constexpr int32_t kTypeUnknown = 2, kTypeControl = 3, kTypeByte = 6;
constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581

// Bytes of the UTF-8 character that starts with `lead` (llama.cpp's
// unicode_len_utf8: continuation and invalid bytes count as one).
size_t utf8_len(char lead) {
  static constexpr size_t kLookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[static_cast<uint8_t>(lead) >> 4];
}

Result<std::vector<gguf::Scalar>> array_items(const gguf::File& f, std::span<const std::byte> mapping,
                                              const std::string& key) {
  const auto* v = f.find(key);
  if (!v || v->type != gguf::ValueType::kArray) return make_error(EINVAL, "tokenizer: {} is missing", key);
  if (v->array.loaded) return v->array.items;
  const gguf::MemorySource src(mapping);
  return gguf::load_array(src, v->array);
}

bool meta_bool(const gguf::File& f, std::string_view key, bool dflt) {
  const auto* v = f.find(key);
  if (!v) return dflt;
  if (const auto* b = std::get_if<bool>(&v->scalar)) return *b;
  return v->as_uint().value_or(dflt ? 1 : 0) != 0;
}

struct Symbol {
  int prev = -1;
  int next = -1;
  const char* text = nullptr;
  size_t n = 0;
};

struct Bigram {
  int left = 0;
  int right = 0;
  float score = 0.0F;
  size_t size = 0;
};

// Highest score first; on equal scores the leftmost pair (llama.cpp's order).
struct BigramLess {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const gguf::File& f, std::span<const std::byte> mapping) {
  const auto* model = f.find("tokenizer.ggml.model");
  const auto name = model ? model->as_string() : std::nullopt;
  if (!name) return make_error(EINVAL, "tokenizer: tokenizer.ggml.model is missing");
  if (*name != "llama") {
    return make_error(ENOTSUP, "tokenizer: vocabulary '{}' is not supported (only 'llama', SentencePiece)", *name);
  }
  auto toks = array_items(f, mapping, "tokenizer.ggml.tokens");
  if (!toks) return std::move(toks).error();
  Tokenizer t;
  t.pieces_.reserve(toks->size());
  for (const auto& s : *toks) {
    const auto* p = std::get_if<std::string>(&s);
    if (!p) return make_error(EINVAL, "tokenizer: tokenizer.ggml.tokens holds a non-string");
    t.pieces_.push_back(*p);
  }
  t.scores_.assign(t.pieces_.size(), 0.0F);
  if (f.find("tokenizer.ggml.scores")) {
    auto sc = array_items(f, mapping, "tokenizer.ggml.scores");
    if (!sc) return std::move(sc).error();
    if (sc->size() != t.pieces_.size()) return make_error(EINVAL, "tokenizer: scores and tokens differ in length");
    for (size_t i = 0; i < sc->size(); ++i) {
      const auto* p = std::get_if<float>(&(*sc)[i]);
      if (!p) return make_error(EINVAL, "tokenizer: tokenizer.ggml.scores holds a non-f32");
      t.scores_[i] = *p;
    }
  }
  t.types_.assign(t.pieces_.size(), 1);
  if (f.find("tokenizer.ggml.token_type")) {
    auto ty = array_items(f, mapping, "tokenizer.ggml.token_type");
    if (!ty) return std::move(ty).error();
    if (ty->size() != t.pieces_.size()) return make_error(EINVAL, "tokenizer: token_type and tokens differ in length");
    for (size_t i = 0; i < ty->size(); ++i) {
      const auto* p = std::get_if<int32_t>(&(*ty)[i]);
      if (!p) return make_error(EINVAL, "tokenizer: tokenizer.ggml.token_type holds a non-i32");
      t.types_[i] = *p;
    }
  }
  const auto n = t.pieces_.size();
  t.bos_ = static_cast<int32_t>(f.find_uint("tokenizer.ggml.bos_token_id").value_or(1));
  t.eos_ = static_cast<int32_t>(f.find_uint("tokenizer.ggml.eos_token_id").value_or(2));
  if (static_cast<size_t>(t.bos_) >= n || static_cast<size_t>(t.eos_) >= n) {
    return make_error(EINVAL, "tokenizer: bos {} or eos {} is past the vocabulary ({} tokens)", t.bos_, t.eos_, n);
  }
  t.add_bos_ = meta_bool(f, "tokenizer.ggml.add_bos_token", true);
  t.add_eos_ = meta_bool(f, "tokenizer.ggml.add_eos_token", false);
  t.add_space_prefix_ = meta_bool(f, "tokenizer.ggml.add_space_prefix", true);
  t.index();
  for (int b = 0; b < 256; ++b) {
    if (t.byte_ids_[b] < 0) return make_error(EINVAL, "tokenizer: no token for byte 0x{:02X} (byte fallback)", b);
  }
  return t;
}

Result<Tokenizer> Tokenizer::from_vocab(std::vector<std::string> pieces, std::vector<float> scores,
                                        std::vector<int32_t> types, int32_t bos, int32_t eos, bool add_bos,
                                        bool add_space_prefix) {
  Tokenizer t;
  if (scores.size() != pieces.size() || (!types.empty() && types.size() != pieces.size())) {
    return make_error(EINVAL, "tokenizer: pieces, scores and types differ in length");
  }
  if (types.empty()) types.assign(pieces.size(), 1);
  t.pieces_ = std::move(pieces);
  t.scores_ = std::move(scores);
  t.types_ = std::move(types);
  t.bos_ = bos;
  t.eos_ = eos;
  t.add_bos_ = add_bos;
  t.add_space_prefix_ = add_space_prefix;
  t.index();
  return t;
}

void Tokenizer::index() {
  ids_.clear();
  ids_.reserve(pieces_.size());
  // The first piece of a text wins, like llama.cpp's token_to_id map.
  for (size_t i = 0; i < pieces_.size(); ++i) ids_.emplace(pieces_[i], static_cast<int32_t>(i));
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    int32_t id = find(name);
    if (id < 0) id = find(std::string(1, static_cast<char>(b)));
    byte_ids_[b] = id;
  }
}

int32_t Tokenizer::find(std::string_view piece) const {
  const auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

void Tokenizer::tokenize_raw(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  for (size_t off = 0; off < text.size();) {
    Symbol s;
    s.text = text.data() + off;
    s.n = std::min(utf8_len(text[off]), text.size() - off);
    off += s.n;
    s.prev = static_cast<int>(sym.size()) - 1;
    s.next = off == text.size() ? -1 : static_cast<int>(sym.size()) + 1;
    sym.push_back(s);
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> work;
  // Which two symbols a merged text came from, to split it back (last wins).
  std::unordered_map<std::string, std::pair<int, int>, SeededStringHash, std::equal_to<>> rev_merge;
  auto try_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view pair(sym[static_cast<size_t>(left)].text,
                                sym[static_cast<size_t>(left)].n + sym[static_cast<size_t>(right)].n);
    const int32_t id = find(pair);
    if (id < 0) return;
    work.push(Bigram{left, right, scores_[static_cast<size_t>(id)], pair.size()});
    rev_merge.insert_or_assign(std::string(pair), std::pair{left, right});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
  while (!work.empty()) {
    const Bigram bg = work.top();
    work.pop();
    Symbol& l = sym[static_cast<size_t>(bg.left)];
    Symbol& r = sym[static_cast<size_t>(bg.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;  // stale: one side merged since
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
    try_add(l.prev, bg.left);
    try_add(bg.left, l.next);
  }
  auto resegment = [&](auto&& self, const Symbol& s) -> void {
    const std::string_view t(s.text, s.n);
    if (const int32_t id = find(t); id >= 0) {
      out.push_back(id);
      return;
    }
    const auto it = rev_merge.find(t);
    if (it == rev_merge.end()) {
      for (size_t j = 0; j < s.n; ++j) out.push_back(byte_ids_[static_cast<uint8_t>(s.text[j])]);
      return;
    }
    const auto [a, b] = it->second;
    self(self, sym[static_cast<size_t>(a)]);
    self(self, sym[static_cast<size_t>(b)]);
  };
  if (sym.empty()) return;
  for (int i = 0; i != -1; i = sym[static_cast<size_t>(i)].next) resegment(resegment, sym[static_cast<size_t>(i)]);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(bos_);
  if (!text.empty()) {
    std::string esc;
    esc.reserve(text.size() * 3 + 3);
    if (add_space_prefix_) esc += kSpace;
    for (char ch : text) {
      if (ch == ' ') {
        esc += kSpace;
      } else {
        esc += ch;
      }
    }
    tokenize_raw(esc, out);
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return {};
  const auto i = static_cast<size_t>(id);
  const std::string& p = pieces_[i];
  switch (types_[i]) {
    case kTypeControl: return {};
    case kTypeUnknown: return "\xE2\x96\x85";  // llama.cpp renders <unk> as U+2585
    case kTypeByte:
      if (p.size() == 6 && p.starts_with("<0x") && p[5] == '>') {
        return std::string(1, static_cast<char>(std::stoi(p.substr(3, 2), nullptr, 16)));
      }
      return p;
    default: break;
  }
  std::string out;
  out.reserve(p.size());
  for (size_t k = 0; k < p.size();) {
    if (p.compare(k, kSpace.size(), kSpace) == 0) {
      out += ' ';
      k += kSpace.size();
    } else {
      out += p[k++];
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool strip_prefix_space) const {
  std::string out;
  for (int32_t id : ids) out += piece(id);
  if (strip_prefix_space && add_space_prefix_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

}  // namespace airs::infer
