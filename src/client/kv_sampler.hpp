// SPDX-License-Identifier: Apache-2.0
#pragma once
// KV access sampling: how often a session's KV is read, for the daemon's
// eviction order (idle KV goes first within a priority). The kernel's
// DAMON could say, but Debian 12's 6.1 and stock Raspberry Pi OS have
// none, and where a kernel has it the daemon, without CAP_SYS_PTRACE, may
// not read where another user's process maps its KV
// (docs/kernel-facts.md, DAMON). So libairs measures it on every kernel,
// as it does for the units of a streamed model (client/sampler.hpp).
//
// Each session maps the arena on its own, and only that session's blocks
// are read through that mapping. A round drops chunks that hold the
// session's blocks from the mapping (MADV_DONTNEED of a shared mapping:
// the pages stay in the arena, their bytes untouched), and the next round
// counts how many of them are mapped again (/proc/self/pagemap's present
// bit, which needs no privilege): those were read or written since. A
// round takes at most 8 chunks (round robin), so a big KV costs a decode
// loop a bounded number of minor faults per round. A read fault of a shmem
// page also maps the neighbours the kernel has in its fault-around window
// (64 KiB by default), so a read near a chunk's edge can count the next
// chunk too; huge pages (the pool's usual pages) have no fault-around. One
// report per round goes to the daemon (wire/kv_access.hpp), on the
// session's wake channel: no round trip, and nothing on the decode path
// but those faults.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "util/result.hpp"
#include "wire/kv_access.hpp"

namespace airs::client {

// AIRS_KV_SAMPLE_MS: a round's period (default 1000; 0 turns KV sampling
// off; otherwise clamped to the range the daemon takes, 10 to 10000). Not
// a number: the default.
[[nodiscard]] std::chrono::milliseconds kv_sample_period_from_env();

// One session's sampling over its own mapping of the arena. Thread-safe:
// the caller's calls record blocks, the sampler thread runs rounds.
class KvSampling {
 public:
  static constexpr size_t kChunksPerRound = 8;
  KvSampling(std::byte* base, uint64_t size, uint64_t chunk_bytes, uint64_t blocks_per_chunk,
             size_t chunks_per_round = kChunksPerRound);
  void held(std::span<const uint32_t> blocks);     // blocks the daemon gave the session
  void dropped(std::span<const uint32_t> blocks);  // blocks it freed, or the daemon evicted
  void dropped_all();                              // every block is lost (a notice ring overflow)
  // Counts which chunks the last round dropped were touched since (none
  // dropped: which of the chunks it takes now were touched since they were
  // mapped or last dropped), then drops the next chunks that hold the
  // session's blocks. No report for a session without blocks. An error (a
  // mapping the kernel cannot drop pages of, say) ends its sampling. One
  // thread at a time (the sampler's).
  [[nodiscard]] Result<std::optional<wire::KvAccess>> round(int pagemap_fd, std::chrono::milliseconds period);

 private:
  [[nodiscard]] Result<bool> mapped(int pagemap_fd, uint64_t chunk) const;
  [[nodiscard]] Status drop(const std::vector<uint64_t>& chunks) const;

  std::byte* const base_;
  const uint64_t size_;
  const uint64_t chunk_bytes_;
  const uint64_t blocks_per_chunk_;
  const size_t per_round_;
  std::mutex mu_;  // blocks_: the caller's calls and the sampler
  std::set<uint32_t> blocks_;
  // The sampler's own: the chunks the last round dropped, and where the
  // next round starts.
  std::vector<uint64_t> dropped_;
  uint64_t next_chunk_ = 0;
};

// The thread that runs every session's rounds, one per client, started
// with its first session.
class KvSampler {
 public:
  explicit KvSampler(std::chrono::milliseconds period) : period_(period) {}
  ~KvSampler();
  KvSampler(const KvSampler&) = delete;
  KvSampler& operator=(const KvSampler&) = delete;
  // `report_fd`: the session's end of its wake channel. False if the
  // thread could not be started (no sampling, then).
  [[nodiscard]] bool add(KvSampling* s, int report_fd);
  // Returns once no round uses `s` (the caller may unmap it then).
  void remove(KvSampling* s);

 private:
  void run();
  struct Entry {
    KvSampling* sampling;
    int report_fd;
  };
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<Entry> sessions_;
  bool warned_ = false;  // a session's sampling ended on an error (said once)
  std::thread thread_;
};

}  // namespace airs::client
