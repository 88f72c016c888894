// SPDX-License-Identifier: Apache-2.0
// GGUF reader and writer throughput. Prints medians of several runs; the
// baseline next to each parse is the cost of just copying the header bytes
// (the least any reader must do), so the ratio is the parser's overhead.
//   bench_gguf            (no arguments; writes nothing to disk)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gguf/gguf.hpp"
#include "gguf/writer.hpp"
#include "util/units.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using airs::gguf::Builder;

// Header bytes, then zeros up to `size`: a multi-GiB model without the disk.
class SparseSource final : public airs::gguf::ByteSource {
 public:
  SparseSource(std::vector<std::byte> head, uint64_t size) : head_(std::move(head)), size_(size) {}
  uint64_t size() const override { return size_; }
  airs::Status read(uint64_t offset, void* dst, size_t len) const override {
    auto* p = static_cast<std::byte*>(dst);
    std::memset(p, 0, len);
    if (offset < head_.size()) {
      std::memcpy(p, head_.data() + offset, std::min<uint64_t>(head_.size() - offset, len));
    }
    return {};
  }

 private:
  std::vector<std::byte> head_;
  uint64_t size_;
};

template <typename F>
double median_ms(int runs, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto a = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main() {
  constexpr uint32_t kN = 100000;
  Builder b;
  b.header(3, kN, 2).kv_str("general.architecture", "llama").kv_u32("llama.block_count", (kN + 8) / 9);
  for (uint32_t i = 0; i < kN; ++i) {
    b.tensor_info(fmt::format("blk.{}.ffn_gate_{}.weight", i / 9, i % 9), std::vector<uint64_t>{32, 4}, 8,
                  uint64_t{i} * 160);
  }
  const size_t header_bytes = b.pos();
  b.pad_to(32).zeros(uint64_t{kN} * 160);
  const auto bytes = b.take();
  airs::gguf::MemorySource src(bytes);
  size_t sink = 0;
  std::vector<std::byte> copy_dst(header_bytes);
  const double copy = median_ms(9, [&] {
    std::memcpy(copy_dst.data(), bytes.data(), header_bytes);
    sink += static_cast<size_t>(copy_dst[100]);
  });
  bool ok = true;
  const double parse = median_ms(9, [&] {
    auto f = airs::gguf::parse(src);
    if (!f) std::fprintf(stderr, "%s\n", f.error().message.c_str());
    ok = ok && f.ok() && f->tensors.size() == kN;
  });
  std::printf("parse 100k tensors (%s header): %.1f ms  | memcpy of the header: %.2f ms  | ratio %.0fx  %s\n",
              airs::format_bytes(header_bytes).c_str(), parse, copy, parse / copy, ok ? "" : "PARSE FAILED");

  airs::gguf::ModelSpec spec;
  spec.n_layers = 16;
  auto sized = airs::gguf::spec_for_size(spec, airs::kGiB);
  auto plan = airs::gguf::plan_model(*sized);
  if (!plan) return 1;
  SparseSource big(plan->header, plan->file_size);
  const double hdr = median_ms(21, [&] {
    auto f = airs::gguf::parse(big);
    ok = ok && f.ok();
  });
  std::printf("parse header of a %s mixed-type model (%zu tensors): %.3f ms  %s\n",
              airs::format_bytes(plan->file_size).c_str(), plan->tensors.size(), hdr, ok ? "" : "PARSE FAILED");

  std::vector<std::byte> chunk(64 << 20);
  const double gen = median_ms(5, [&] {
    for (uint64_t off = 0; off + chunk.size() <= 256 * airs::kMiB; off += chunk.size()) {
      (void)airs::gguf::expected_file_bytes(*plan, plan->data_offset + off, chunk);
    }
  });
  std::printf("generate model bytes (expected_file_bytes): %.2f GiB/s  | memset of the same: ",
              0.25 / (gen / 1000.0));
  const double ms = median_ms(5, [&] {
    for (int i = 0; i < 4; ++i) std::memset(chunk.data(), i, chunk.size());
    sink += static_cast<size_t>(chunk[5]);
  });
  std::printf("%.2f GiB/s\n", 0.25 / (ms / 1000.0));
  return sink == 12345 ? 2 : (ok ? 0 : 1);
}
