// SPDX-License-Identifier: Apache-2.0
// libFuzzer entry: any byte string through the reader must give a File that
// satisfies its invariants or an error naming an offset — never a crash,
// leak, UB, or unbounded time/memory.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "airsctl/inspect.hpp"
#include "gguf/gguf.hpp"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace airs::gguf;
  MemorySource src(std::as_bytes(std::span(data, size)));
  ParseLimits lim;
  lim.eager_array_elements = 16;  // exercise the lazy path too
  auto f = parse(src, lim);
  if (!f.ok()) {
    check(f.error().message.find(" at byte ") != std::string::npos);
    return 0;
  }
  check(f->data_offset % f->alignment == 0);
  check(f->load_order.size() == f->tensors.size());
  for (const auto& t : f->tensors) {
    check(t.offset >= f->data_offset && t.offset + t.nbytes <= f->file_size && t.nbytes > 0);
    check(f->tensors[f->load_order[t.load_rank]].name == t.name);
    check(t.layer >= -1 && t.layer <= static_cast<int64_t>(f->n_layers));
  }
  for (const auto& [key, v] : f->metadata) {
    if (v.type == ValueType::kArray && !v.array.loaded) {
      auto items = load_array(src, v.array, lim);
      check(items.ok() && items->size() == v.array.count);
    }
  }
  if (f->geometry) {
    (void)kv_bytes_per_token(*f->geometry, KvType::kF16);
    (void)kv_bytes_per_token(*f->geometry, KvType::kQ8_0);
  }
  const airs::cli::InspectOptions opts;
  (void)airs::cli::inspect_json(*f, opts);
  (void)airs::cli::inspect_text(*f, "fuzz", opts);
  return 0;
}
