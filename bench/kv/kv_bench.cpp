// SPDX-License-Identifier: Apache-2.0
// KV allocator, in process: block operations per second next to a bare
// vector free list (the floor any allocator pays), waste on the design's
// scenario next to contiguous pre-allocation, and prefix-sharing savings.
// Ratios from one run; no assertions.
#include <chrono>
#include <cstdio>
#include <vector>

#include <fmt/format.h>

#include "kv/allocator.hpp"
#include "util/units.hpp"

namespace {

using namespace airs;
using namespace airs::kv;
using BenchClock = std::chrono::steady_clock;

class NullOps final : public ChunkOps {
 public:
  Status commit_chunk(ArenaId, uint32_t) override { return {}; }
  void release_chunk(ArenaId, uint32_t) override {}
  void copy_block(ArenaId, BlockId, BlockId) override {}
};

double seconds_since(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

template <typename F>
double best_rate(uint64_t ops, F&& body) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = BenchClock::now();
    body();
    best = std::max(best, static_cast<double>(ops) / seconds_since(t0));
  }
  return best;
}

void throughput() {
  const KvGeometry g = make_geometry({.bytes_per_token = 64 * kKiB, .page_bytes = 2 * kMiB}).value();
  NullOps ops;
  Allocator alloc(ops, Config{});
  const ArenaId a = alloc.open_arena(1, 1000, g, 2048).value();
  const TimePoint now{};
  const SessionId s = alloc.create_session(a, Priority::Interactive, now).value();
  std::vector<BlockId> out;
  out.reserve(64);
  std::vector<EvictionNotice> notices;
  constexpr uint64_t kIters = 2'000'000;

  // Keep a realistic table underneath (a 2K-token context) so the tail is not trivially empty.
  if (!alloc.allocate(s, 128, now, out, notices).ok()) std::abort();

  // 1 block at a time: allocate, free (2 block operations per iteration).
  const double single = best_rate(2 * kIters, [&] {
    for (uint64_t i = 0; i < kIters; ++i) {
      if (!alloc.allocate(s, 1, now, out, notices).ok()) std::abort();
      if (!alloc.free(s, out, now).ok()) std::abort();
    }
  });
  // 16 blocks per call (a 256-token chunk of prefill).
  std::vector<BlockId> batch;
  const double batched = best_rate(2 * 16 * (kIters / 16), [&] {
    for (uint64_t i = 0; i < kIters / 16; ++i) {
      if (!alloc.allocate(s, 16, now, batch, notices).ok()) std::abort();
      if (!alloc.free(s, batch, now).ok()) std::abort();
    }
  });
  // The floor: pop/push on a bare vector free list, nothing else.
  std::vector<uint32_t> fl(4096);
  for (uint32_t i = 0; i < fl.size(); ++i) fl[i] = i;
  volatile uint32_t sink = 0;
  const double floor = best_rate(2 * kIters, [&] {
    for (uint64_t i = 0; i < kIters; ++i) {
      const uint32_t b = fl.back();
      fl.pop_back();
      sink = sink + b;
      fl.push_back(b);
    }
  });
  fmt::print("## Block operations per second (in process, 1 core)\n\n");
  fmt::print("| path | M block ops/s | vs bare free list |\n|---|---:|---:|\n");
  fmt::print("| airs kv: allocate(1) + free(1) | {:.1f} | {:.2f}× |\n", single / 1e6, single / floor);
  fmt::print("| airs kv: allocate(16) + free(16) | {:.1f} | {:.2f}× |\n", batched / 1e6, batched / floor);
  fmt::print("| bare vector pop/push (floor) | {:.1f} | 1.00× |\n\n", floor / 1e6);
  fmt::print("target: ≥ 10 M block ops/s\n\n");
}

void waste(const char* name, uint64_t bytes_per_token) {
  const KvGeometry g = make_geometry({.bytes_per_token = bytes_per_token, .page_bytes = 2 * kMiB}).value();
  NullOps ops;
  Allocator alloc(ops, Config{});
  const ArenaId a = alloc.open_arena(1, 1000, g, 4096).value();
  const TimePoint now{};
  // Seed §6.3: 4 sessions, 8K max context, about 2K tokens used each.
  const uint32_t used[4] = {2000, 2048, 1990, 2100};
  constexpr uint32_t kMaxContext = 8192;
  SessionId s[4];
  for (auto& id : s) id = alloc.create_session(a, Priority::Interactive, now).value();
  std::vector<BlockId> out;
  std::vector<EvictionNotice> notices;
  // Sessions generate concurrently: blocks are requested interleaved, one at a time.
  uint32_t tokens[4] = {};
  for (bool more = true; more;) {
    more = false;
    for (int i = 0; i < 4; ++i) {
      if (tokens[i] >= used[i]) continue;
      more = true;
      if (!alloc.allocate(s[i], 1, now, out, notices).ok()) std::abort();
      tokens[i] = std::min(used[i], tokens[i] + g.tokens_per_block);
      if (!alloc.set_length(s[i], tokens[i], now).ok()) std::abort();
    }
  }
  const KvStats st = alloc.total_stats();
  uint64_t payload = 0;
  for (uint32_t u : used) payload += uint64_t{u} * bytes_per_token;
  const uint64_t contiguous = 4ULL * kMaxContext * bytes_per_token;
  const double paged_waste = 100.0 * static_cast<double>(st.waste_bytes()) / static_cast<double>(st.committed_bytes);
  const double contig_waste = 100.0 * static_cast<double>(contiguous - payload) / static_cast<double>(contiguous);
  fmt::print("| {} | {} | {} | {} | {:.2f} % | {} | {:.1f} % |\n", name, format_bytes(g.block_bytes),
             format_bytes(g.chunk_bytes), format_bytes(st.committed_bytes), paged_waste, format_bytes(contiguous),
             contig_waste);
  fmt::print("|   (waste split: unfilled tails {}, free blocks {}, chunk packing {}) | | | | | | |\n",
             format_bytes(st.unfilled_bytes), format_bytes(st.free_bytes), format_bytes(st.pack_loss_bytes));
}

void sharing() {
  const uint64_t bpt = 64 * kKiB;
  const KvGeometry g = make_geometry({.bytes_per_token = bpt, .page_bytes = 2 * kMiB}).value();
  constexpr uint32_t kPrompt = 200;
  const uint32_t blocks = (kPrompt + g.tokens_per_block - 1) / g.tokens_per_block;  // 13 (the last holds 8 prompt tokens)
  const uint32_t full = kPrompt / g.tokens_per_block;                                // 12 shareable
  std::vector<BlockId> out;
  std::vector<EvictionNotice> notices;
  const TimePoint now{};
  auto run = [&](bool share) {
    NullOps ops;
    Allocator alloc(ops, Config{});
    const ArenaId a = alloc.open_arena(1, 1000, g, 256).value();
    std::vector<uint64_t> hashes;
    for (uint32_t i = 0; i < full; ++i) hashes.push_back(0xabc000 + i);
    for (int i = 0; i < 3; ++i) {
      const SessionId s = alloc.create_session(a, Priority::Interactive, now).value();
      uint32_t have = 0;
      if (share && i > 0) {
        if (!alloc.match_prefix(s, hashes, now, out).ok()) std::abort();
        have = static_cast<uint32_t>(out.size());
      }
      if (!alloc.allocate(s, blocks - have, now, out, notices).ok()) std::abort();
      if (!alloc.set_length(s, kPrompt, now).ok()) std::abort();
      if (share && i == 0) {
        std::vector<BlockId> first(alloc.session_info(s).value().table);
        first.resize(full);
        if (!alloc.commit(s, first, hashes, now).ok()) std::abort();
      }
    }
    return alloc.total_stats();
  };
  const KvStats priv = run(false), shared = run(true);
  // The seed's measure: bytes of prompt KV (200 tokens × 3 sessions).
  const uint64_t prompt_priv = 3ULL * kPrompt * bpt;
  const uint64_t prompt_shared = uint64_t{full} * g.tokens_per_block * bpt + 3ULL * (kPrompt % g.tokens_per_block) * bpt;
  fmt::print("## Prefix sharing: 3 sessions, one 200-token system prompt (64 KiB/token, 16 tokens/block)\n\n");
  fmt::print("| measure | without sharing | with sharing | saved |\n|---|---:|---:|---:|\n");
  fmt::print("| prompt KV bytes (seed: 38.4 MB → 12.8 MB) | {} | {} | {:.1f} % |\n", format_bytes(prompt_priv),
             format_bytes(prompt_shared),
             100.0 * static_cast<double>(prompt_priv - prompt_shared) / static_cast<double>(prompt_priv));
  fmt::print("| blocks used (whole 1 MiB blocks, from the allocator) | {} | {} | {:.1f} % |\n",
             format_bytes(priv.used_bytes), format_bytes(shared.used_bytes),
             100.0 * static_cast<double>(priv.used_bytes - shared.used_bytes) / static_cast<double>(priv.used_bytes));
  fmt::print("\nThe 200-token prompt fills 12 blocks and 8 tokens of a 13th; the 13th also takes each session's own\n"
             "tokens, so it cannot be shared. target: ≥ 60 % saved\n\n");
}

}  // namespace

int main() {
  throughput();
  fmt::print("## Waste, seed scenario: 4 sessions, 8K max context, 2000/2048/1990/2100 tokens used\n\n");
  fmt::print("| geometry | block | chunk | paged: committed | paged: waste | contiguous: reserved | contiguous: waste |\n");
  fmt::print("|---|---:|---:|---:|---:|---:|---:|\n");
  waste("seed q8 (1 B/value, 64 KiB/token)", 64 * kKiB);
  waste("real q8_0 (68 KiB/token)", 68 * kKiB);
  waste("f16 (128 KiB/token)", 128 * kKiB);
  fmt::print("\nwaste = unfilled token slots + free blocks in committed chunks + chunk packing loss, over committed bytes.\n"
             "target: < 4 %\n\n");
  sharing();
  return 0;
}
