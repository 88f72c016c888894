// SPDX-License-Identifier: Apache-2.0
// A GGUF's byte ranges as the pager sees them (pager::Extent): their load
// ranks and how a token reads them. Pure.
#pragma once

#include <vector>

#include "gguf/gguf.hpp"
#include "pager/fill_plan.hpp"

namespace airs::daemon {

// Ranks are layers, so the prefetch window counts layers: the header
// (clients parse it before any weight) and token_embd first, blk.N next,
// output_norm/output last. A token reads every layer and the output in
// full, in that order, but only a row of the embeddings; where the model
// has no output tensor, the embeddings are the output too (read in full,
// last). A mixture of experts' 3-D expert tensors
// (blk.N.ffn_{gate,up,down}_exps.weight, the expert index outermost) are
// one Access::Expert extent per expert slice: a token reads only the
// experts its router chose. The router and shared experts (*_shexp) are
// read by every token, as any dense tensor.
[[nodiscard]] std::vector<pager::Extent> extents_of(const gguf::File& f);

}  // namespace airs::daemon
