// SPDX-License-Identifier: Apache-2.0
// `airsctl inspect FILE.gguf`: what a model will cost in the pool before it
// is loaded — header, tensor table, huge-page footprint, KV bytes per token.
// Library target airs_cli_inspect (defined in src/gguf/CMakeLists.txt).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "gguf/gguf.hpp"

namespace airs::cli {

struct InspectOptions {
  // The pool's huge page size; the caller reads the default from
  // /sys/kernel/mm/hugepages (sys::read_hugepage_sizes) — never assumed here.
  uint64_t huge_page_bytes = uint64_t{2} << 20;
  uint64_t tokens_per_block = 16;
};

// Parses `path` and prints a report to `out`: a human table, or with `json`
// exactly one JSON object (one line) with at least
//   {"version","alignment","data_offset","file_size","architecture",
//    "tensors":[{"name","type","dims","offset","nbytes","layer"}]}
// plus n_layers, kv_count, geometry, pool and kv sections. On any failure
// (unreadable or malformed file) prints nothing to `out`, one line naming the
// defect to `err`, and returns 1; 0 on success. Never throws. Not
// thread-safe with respect to the FILE streams.
[[nodiscard]] int run_inspect(const std::string& path, bool json, std::FILE* out, std::FILE* err,
                              const InspectOptions& opts = {});

// The report for an already parsed file (no I/O). Throws only std::bad_alloc.
[[nodiscard]] std::string inspect_json(const gguf::File& f, const InspectOptions& opts);
[[nodiscard]] std::string inspect_text(const gguf::File& f, const std::string& path, const InspectOptions& opts);

}  // namespace airs::cli
