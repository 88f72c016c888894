// SPDX-License-Identifier: Apache-2.0
#include "daemon/extents.hpp"

#include <algorithm>
#include <string_view>

namespace airs::daemon {
namespace {

// blk.N.ffn_{gate,up,down}_exps.weight with the expert index outermost:
// the number of experts (its last dimension), 0 for any other tensor.
uint64_t experts_in(const gguf::TensorInfo& t) {
  if (t.slot != gguf::LayerSlot::kBlock || t.dims.size() != 3) return 0;
  const std::string_view n = t.name;
  const auto dot = n.find('.', 4);  // after "blk.N"
  if (dot == std::string_view::npos) return 0;
  const std::string_view rest = n.substr(dot + 1);
  if (rest != "ffn_gate_exps.weight" && rest != "ffn_up_exps.weight" && rest != "ffn_down_exps.weight") return 0;
  const uint64_t experts = t.dims[2];
  return experts > 0 && t.nbytes % experts == 0 ? experts : 0;
}

}  // namespace

std::vector<pager::Extent> extents_of(const gguf::File& f) {
  std::vector<pager::Extent> ex;
  ex.reserve(f.tensors.size() + 2);
  ex.push_back({0, f.data_offset, 0, pager::Access::Once});
  const auto post = static_cast<uint32_t>(f.n_layers) + 1;
  const bool has_output = std::any_of(f.tensors.begin(), f.tensors.end(), [](const gguf::TensorInfo& t) {
    return t.name == "output.weight";
  });
  for (const auto& t : f.tensors) {
    uint32_t rank = 0;
    if (t.slot == gguf::LayerSlot::kBlock) rank = static_cast<uint32_t>(t.layer) + 1;
    else if (t.slot == gguf::LayerSlot::kPost) rank = post;
    if (const uint64_t experts = experts_in(t); experts > 0) {
      const uint64_t slice = t.nbytes / experts;
      for (uint64_t e = 0; e < experts; ++e)
        ex.push_back({t.offset + e * slice, slice, rank, pager::Access::Expert, static_cast<uint32_t>(t.layer),
                      static_cast<uint32_t>(e)});
      continue;
    }
    const bool embeddings = t.name == "token_embd.weight";
    ex.push_back({t.offset, t.nbytes, rank, embeddings ? pager::Access::Rows : pager::Access::EveryToken});
    if (embeddings && !has_output) ex.push_back({t.offset, t.nbytes, post, pager::Access::EveryToken});
  }
  return ex;
}

}  // namespace airs::daemon
