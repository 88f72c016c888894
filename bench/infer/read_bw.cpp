// SPDX-License-Identifier: Apache-2.0
// read_bw FILE [--reps N]: read bandwidth of a file's pages through a
// mapping (populated first, so it measures memory, not the disk): GB/s of
// summing every 8-byte word with independent accumulators, best of N.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs("usage: read_bw FILE [--reps N]\n", stderr);
    return 2;
  }
  const int reps = argc >= 4 && std::strcmp(argv[2], "--reps") == 0 ? std::atoi(argv[3]) : 5;
  const int fd = ::open(argv[1], O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    std::perror(argv[1]);
    return 1;
  }
  const auto n = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  const auto* w = static_cast<const uint64_t*>(p);
  const size_t words = n / 8;
  double best = 0;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t a[8] = {};
    for (size_t i = 0; i + 8 <= words; i += 8) {
      for (size_t j = 0; j < 8; ++j) a[j] += w[i + j];
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (uint64_t v : a) sink += v;
    const double s = std::chrono::duration<double>(t1 - t0).count();
    if (static_cast<double>(n) / s > best) best = static_cast<double>(n) / s;
  }
  std::printf("read_gb_s %.3f\nsink %llu\n", best / 1e9, static_cast<unsigned long long>(sink & 1));
  return 0;
}
