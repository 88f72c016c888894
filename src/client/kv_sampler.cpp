// SPDX-License-Identifier: Apache-2.0
#include "client/kv_sampler.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <utility>

#include "sys/fd.hpp"
#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/proc_handles.hpp"

namespace airs::client {

std::chrono::milliseconds kv_sample_period_from_env() {
  // A round a second: a chunk is dropped at most once a second, which costs
  // a decode loop a minor fault per page of at most 8 chunks a second.
  constexpr std::chrono::milliseconds kDefaultPeriod{1000};
  const char* v = std::getenv("AIRS_KV_SAMPLE_MS");
  if (v == nullptr || v[0] < '0' || v[0] > '9') return kDefaultPeriod;
  char* end = nullptr;
  const unsigned long n = std::strtoul(v, &end, 10);
  if (*end != '\0') return kDefaultPeriod;
  if (n == 0) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(
      std::clamp<unsigned long>(n, wire::kMinKvSamplePeriodMs, wire::kMaxKvSamplePeriodMs));
}

KvSampling::KvSampling(std::byte* base, uint64_t size, uint64_t chunk_bytes, uint64_t blocks_per_chunk,
                       size_t chunks_per_round)
    : base_(base),
      size_(size),
      chunk_bytes_(chunk_bytes),
      blocks_per_chunk_(std::max<uint64_t>(blocks_per_chunk, 1)),
      per_round_(std::max<size_t>(chunks_per_round, 1)) {}

void KvSampling::held(std::span<const uint32_t> blocks) {
  std::lock_guard lock(mu_);
  blocks_.insert(blocks.begin(), blocks.end());
}

void KvSampling::dropped(std::span<const uint32_t> blocks) {
  std::lock_guard lock(mu_);
  for (const uint32_t b : blocks) blocks_.erase(b);
}

void KvSampling::dropped_all() {
  std::lock_guard lock(mu_);
  blocks_.clear();
}

// Whether any page of `chunk` is in this process's page tables: one
// pagemap entry (8 bytes) per base page, bit 63 set when present.
Result<bool> KvSampling::mapped(int pagemap_fd, uint64_t chunk) const {
  const uint64_t page = sys::base_page_size();
  const auto first = reinterpret_cast<uintptr_t>(base_ + chunk * chunk_bytes_) / page;
  const uint64_t pages = chunk_bytes_ / page;
  uint64_t entries[512];
  for (uint64_t done = 0; done < pages;) {
    const uint64_t n = std::min<uint64_t>(pages - done, std::size(entries));
    auto got = sys::read_at(pagemap_fd, entries, n * sizeof(uint64_t), (first + done) * 8);
    if (!got) return make_error(got.error().code, "reading /proc/self/pagemap: {}", got.error().message);
    if (*got != n * sizeof(uint64_t)) return make_error(EIO, "reading /proc/self/pagemap: a short read");
    for (uint64_t i = 0; i < n; ++i)
      if ((entries[i] >> 63) != 0) return true;
    done += n;
  }
  return false;
}

// Drops `chunks` (sorted) from the mapping, one call per run of adjacent
// ones: each call costs the process a TLB flush.
Status KvSampling::drop(const std::vector<uint64_t>& chunks) const {
  for (size_t i = 0; i < chunks.size();) {
    size_t j = i + 1;
    while (j < chunks.size() && chunks[j] == chunks[j - 1] + 1) ++j;
    // The system call itself: libairs-preload.so interposes madvise().
    if (::syscall(SYS_madvise, base_ + chunks[i] * chunk_bytes_, (j - i) * chunk_bytes_, MADV_DONTNEED) != 0)
      return make_error(errno, "madvise(MADV_DONTNEED) of the KV arena: {}", std::strerror(errno));
    i = j;
  }
  return {};
}

Result<std::optional<wire::KvAccess>> KvSampling::round(int pagemap_fd, std::chrono::milliseconds period) {
  // The chunks that hold the session's blocks now (sorted, as blocks_ is),
  // taken under the lock; the work below runs without it, so the caller's
  // calls never wait for page tables.
  std::vector<uint64_t> held;
  {
    std::lock_guard lock(mu_);
    for (const uint32_t b : blocks_) {
      const uint64_t c = b / blocks_per_chunk_;
      if ((c + 1) * chunk_bytes_ > size_) continue;  // not a block of this arena
      if (held.empty() || held.back() != c) held.push_back(c);
    }
  }
  // This round's chunks: the next per_round_ from where the last stopped.
  std::vector<uint64_t> take;
  auto from = std::lower_bound(held.begin(), held.end(), next_chunk_);
  for (size_t i = 0; i < held.size() && take.size() < per_round_; ++i) {
    if (from == held.end()) from = held.begin();
    take.push_back(*from++);
  }
  std::sort(take.begin(), take.end());
  if (!take.empty()) next_chunk_ = (from == held.end() ? held.front() : *from);

  // What the report counts: the chunks the last round dropped, or, after a
  // round that dropped none, this round's before they are dropped.
  const std::vector<uint64_t>& counted = dropped_.empty() ? take : dropped_;
  std::optional<wire::KvAccess> report;
  if (!counted.empty()) {
    wire::KvAccess a;
    a.period_ms = static_cast<uint32_t>(period.count());
    a.chunks = static_cast<uint32_t>(std::min<size_t>(counted.size(), UINT32_MAX));
    for (const uint64_t c : counted) {
      auto m = mapped(pagemap_fd, c);
      if (!m) return std::move(m).error();
      if (*m) ++a.touched;
    }
    report = a;
  }
  AIRS_TRY(drop(take));
  dropped_ = std::move(take);
  return report;
}

KvSampler::~KvSampler() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool KvSampler::add(KvSampling* s, int report_fd) {
  std::lock_guard lock(mu_);
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      return false;  // no thread (a pids limit, say): no sampling
    }
    pthread_setname_np(thread_.native_handle(), "airs-kv-sample");
  }
  sessions_.push_back(Entry{s, report_fd});
  return true;
}

void KvSampler::remove(KvSampling* s) {
  std::lock_guard lock(mu_);  // a round holds it: none runs on `s` after this
  std::erase_if(sessions_, [s](const Entry& e) { return e.sampling == s; });
}

void KvSampler::run() {
  auto pm = sys::open_file("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  std::unique_lock lock(mu_);
  for (;;) {
    if (cv_.wait_for(lock, period_, [this] { return stop_; })) return;
    if (!pm) continue;  // no pagemap (no /proc): nothing can be measured
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      auto r = it->sampling->round(pm->get(), period_);
      if (!r) {
        // Not sampled any more: the daemon ranks its KV by last use.
        if (!std::exchange(warned_, true))
          std::fprintf(stderr, "airs: KV access sampling of a session stopped: %s\n", r.error().message.c_str());
        it = sessions_.erase(it);
        continue;
      }
      if (*r) {
        std::byte buf[wire::kKvAccessBytes];
        const size_t len = wire::encode_kv_access(**r, buf);
        (void)sys::send_message(it->report_fd, buf, len);  // a full or closed channel drops the report
      }
      ++it;
    }
  }
}

}  // namespace airs::client
