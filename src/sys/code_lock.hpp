// SPDX-License-Identifier: Apache-2.0
#pragma once
// The daemon's own code, kept resident.
//
// A memory manager acts when memory is short, which is when the kernel
// drops clean file pages: kswapd, a memory cgroup's limit, or a proactive
// reclaimer (DAMON_RECLAIM or a DAMOS pageout scheme) take the text of a
// process as readily as any page cache. The daemon's loop would then fault
// its own code back in from the disk, behind the model reads that keep the
// disk busy: a reply, or the response to pressure, waits for them. Code that
// runs rarely (an exception's unwinder, an error path) is the first to go.
//
// lock_loaded_code() locks every read-only mapping of every object mapped
// executable at the time of the call (the binary and its shared libraries:
// text, read-only data, unwind tables). Writable mappings are left alone,
// and so is anything mapped later, such as the model regions.
#include <cstdint>
#include <string>
#include <vector>

#include "util/result.hpp"

namespace airs::sys {

struct LockedCode {
  uint64_t bytes = 0;    // locked, over all objects
  uint32_t objects = 0;  // files with at least one locked mapping
};

// Parses a /proc/PID/maps text into the ranges lock_loaded_code() locks:
// [start, end) of each read-only mapping of a file that is mapped
// executable somewhere in the text. Exposed for tests.
struct CodeRange {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string path;
};
[[nodiscard]] std::vector<CodeRange> code_ranges(const std::string& maps_text);

// Locks code_ranges(/proc/self/maps). Uses the mlock system call itself:
// sanitizer runtimes intercept mlock(3) and make it a no-op. Errors name the
// object, errno and RLIMIT_MEMLOCK; what was locked before stays locked.
[[nodiscard]] Result<LockedCode> lock_loaded_code();

}  // namespace airs::sys
