// SPDX-License-Identifier: Apache-2.0
#include "airsctl/inspect.hpp"

#include <algorithm>
#include <exception>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gguf/file_io.hpp"
#include "util/units.hpp"

namespace airs::cli {
namespace {

struct Footprint {
  uint64_t pages = 0;
  uint64_t bytes = 0;
};

Footprint pool_footprint(const gguf::File& f, uint64_t page) {
  // The region is laid out byte for byte like the file, rounded up to a page.
  const uint64_t pages = div_round_up(f.file_size, page);
  return {pages, pages * page};
}

nlohmann::json scalar_json(const gguf::Scalar& s) {
  return std::visit(
      [](const auto& v) -> nlohmann::json {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, float> || std::is_same_v<V, double>) {
          // JSON has no NaN/Inf; keep the field, make it null.
          return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
        } else {
          return nlohmann::json(v);
        }
      },
      s);
}

std::string dims_text(const std::vector<uint64_t>& d) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) s += (i ? " x " : "") + std::to_string(d[i]);
  return s;
}

std::string layer_text(const gguf::TensorInfo& t) {
  switch (t.slot) {
    case gguf::LayerSlot::kPre: return "pre";
    case gguf::LayerSlot::kBlock: return std::to_string(t.layer);
    case gguf::LayerSlot::kPost: return "post";
  }
  return "?";
}

}  // namespace

std::string inspect_json(const gguf::File& f, const InspectOptions& opts) {
  nlohmann::json j;
  j["schema"] = 1;  // airsctl's --json schema (kJsonSchema in common.hpp)
  j["version"] = f.version;
  j["alignment"] = f.alignment;
  j["data_offset"] = f.data_offset;
  j["file_size"] = f.file_size;
  j["architecture"] = f.architecture;
  j["n_layers"] = f.n_layers;
  j["kv_count"] = f.n_kv;
  j["tensor_count"] = f.tensors.size();
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [k, v] : f.metadata) {
    if (v.type != gguf::ValueType::kArray) {
      meta[k] = scalar_json(v.scalar);
    } else {
      meta[k] = {{"array", gguf::value_type_name(v.array.elem_type)}, {"count", v.array.count}};
    }
  }
  j["metadata"] = std::move(meta);
  const Footprint fp = pool_footprint(f, opts.huge_page_bytes);
  j["pool"] = {{"huge_page_bytes", opts.huge_page_bytes}, {"huge_pages", fp.pages}, {"bytes", fp.bytes}};
  if (f.geometry) {
    const auto& g = *f.geometry;
    nlohmann::json kv = {{"block_count", g.block_count},       {"head_count", g.head_count},
                         {"head_count_kv", g.head_count_kv},   {"embedding_length", g.embedding_length},
                         {"key_length", g.key_length},         {"value_length", g.value_length},
                         {"context_length", g.context_length}, {"tokens_per_block", opts.tokens_per_block}};
    for (auto t : {gguf::KvType::kF16, gguf::KvType::kQ8_0}) {
      const uint64_t per = gguf::kv_bytes_per_token(g, t);
      kv[std::string(gguf::kv_type_name(t))] = {{"bytes_per_token", per},
                                                 {"bytes_per_1k_tokens", per * 1000},
                                                 {"block_bytes", per * opts.tokens_per_block}};
    }
    j["kv"] = std::move(kv);
  } else {
    j["kv"] = nullptr;
  }
  nlohmann::json ts = nlohmann::json::array();
  for (const auto& t : f.tensors) {
    ts.push_back({{"name", t.name},
                  {"type", t.type_name},
                  {"type_id", t.type_id},
                  {"dims", t.dims},
                  {"offset", t.offset},
                  {"nbytes", t.nbytes},
                  {"layer", t.layer},
                  {"load_rank", t.load_rank}});
  }
  j["tensors"] = std::move(ts);
  // Names and strings come from the file: replace invalid UTF-8, never throw.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string inspect_text(const gguf::File& f, const std::string& path, const InspectOptions& opts) {
  std::string s;
  auto line = [&](std::string_view k, const std::string& v) { s += fmt::format("{:<16}{}\n", k, v); };
  line("file", fmt::format("{} ({} bytes, {})", path, f.file_size, format_bytes(f.file_size)));
  line("gguf version", std::to_string(f.version));
  line("alignment", std::to_string(f.alignment));
  line("data offset", std::to_string(f.data_offset));
  line("architecture", f.architecture.empty() ? "(none)" : f.architecture);
  if (const auto* n = f.find("general.name"); n && n->as_string()) line("name", std::string(*n->as_string()));
  line("metadata keys", std::to_string(f.n_kv));
  line("layers", std::to_string(f.n_layers));
  std::map<std::string_view, std::pair<uint64_t, uint64_t>> by_type;
  uint64_t data = 0;
  for (const auto& t : f.tensors) {
    auto& e = by_type[t.type_name];
    ++e.first;
    e.second += t.nbytes;
    data += t.nbytes;
  }
  line("tensors", fmt::format("{} ({} of tensor data)", f.tensors.size(), format_bytes(data)));
  std::string types;
  for (const auto& [name, e] : by_type) {
    types += fmt::format("{}{} x{} ({})", types.empty() ? "" : ", ", name, e.first, format_bytes(e.second));
  }
  if (!types.empty()) line("types", types);
  const Footprint fp = pool_footprint(f, opts.huge_page_bytes);
  line("pool footprint",
       fmt::format("{} huge pages of {} = {}", fp.pages, format_bytes(opts.huge_page_bytes), format_bytes(fp.bytes)));
  if (f.geometry) {
    const auto& g = *f.geometry;
    line("geometry", fmt::format("{} blocks, {} heads, {} KV heads, n_embd {}, head dim k {} / v {}, context {}",
                                 g.block_count, g.head_count, g.head_count_kv, g.embedding_length, g.key_length,
                                 g.value_length, g.context_length));
    s += fmt::format("KV cache        {:>14} {:>16} {:>22}\n", "per token", "per 1K tokens",
                     fmt::format("per block ({} tok)", opts.tokens_per_block));
    for (auto t : {gguf::KvType::kF16, gguf::KvType::kQ8_0}) {
      const uint64_t per = gguf::kv_bytes_per_token(g, t);
      s += fmt::format("  {:<14}{:>14} {:>16} {:>22}\n", gguf::kv_type_name(t), format_bytes(per),
                       format_bytes(per * 1000), format_bytes(per * opts.tokens_per_block));
    }
  } else {
    line("geometry", "(not a llama-like model: no KV estimate)");
  }
  s += fmt::format("\n{:>5}  {:<32} {:<8} {:<24} {:>14} {:>12} {:>6}\n", "#", "name", "type", "dims", "offset",
                   "bytes", "layer");
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const auto& t = f.tensors[i];
    s += fmt::format("{:>5}  {:<32} {:<8} {:<24} {:>14} {:>12} {:>6}\n", i, t.name, t.type_name, dims_text(t.dims),
                     t.offset, t.nbytes, layer_text(t));
  }
  return s;
}

int run_inspect(const std::string& path, bool json, std::FILE* out, std::FILE* err, const InspectOptions& opts) {
  try {
    if (opts.huge_page_bytes == 0 || opts.tokens_per_block == 0) {
      std::fprintf(err, "airsctl inspect: huge page size and tokens per block must be positive\n");
      return 1;
    }
    auto src = gguf::FdSource::open(path);
    if (!src) {
      std::fprintf(err, "airsctl inspect: %s\n", src.error().message.c_str());
      return 1;
    }
    auto file = gguf::parse(*src);
    if (!file) {
      std::fprintf(err, "airsctl inspect: %s: %s\n", path.c_str(), file.error().message.c_str());
      return 1;
    }
    const std::string report = json ? inspect_json(*file, opts) : inspect_text(*file, path, opts);
    if (std::fwrite(report.data(), 1, report.size(), out) != report.size() || std::fflush(out) != 0) {
      std::fprintf(err, "airsctl inspect: writing the report failed\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    // Only allocation failure can get here; report it as one line, no crash.
    std::fprintf(err, "airsctl inspect: %s: %s\n", path.c_str(), e.what());
    return 1;
  }
}

}  // namespace airs::cli
