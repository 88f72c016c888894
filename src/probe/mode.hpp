// SPDX-License-Identifier: Apache-2.0
// The platform mode chosen from probed capabilities, and
// the exact change that would enable each missing capability. Pure: no I/O.
//
//   full         hugetlbfs pool, lazy loading via userfaultfd MISSING|MINOR:
//                needs userfaultfd with MISSING_HUGETLBFS + MINOR_HUGETLBFS
//                and hugetlbfs with at least one page size
//   small-pages  shmem (memfd) pool + mlock, userfaultfd on shmem: needs
//                userfaultfd with MISSING_SHMEM + MINOR_SHMEM
//   cooperative  shmem pool, background fill, per-layer readiness: needs
//                nothing beyond a stock kernel
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "probe/capabilities.hpp"
#include "util/result.hpp"

namespace airs::probe {

enum class Mode : uint8_t { Full, SmallPages, Cooperative };

// "full", "small-pages", "cooperative".
[[nodiscard]] const char* to_string(Mode m);

// One missing (or restricted) capability and the change that enables it.
struct Advice {
  std::string topic;  // "userfaultfd", "hugetlbfs", "psi", "io_uring", "memcg", "thp", "odirect"
  std::string text;   // "PSI is off: add psi=1 to /boot/firmware/cmdline.txt ..."
};

struct ModeChoice {
  Mode mode = Mode::Cooperative;
  std::string reason;          // why this mode, naming what decided it
  std::vector<Advice> advice;  // every missing capability, in a fixed order
};

// Advice for everything `caps` lacks, whatever the mode: userfaultfd,
// hugetlbfs, io_uring, PSI, memcg, THP, O_DIRECT (that order).
[[nodiscard]] std::vector<Advice> advise(const Capabilities& caps);

// Empty when `caps` can run `mode`; otherwise what is missing, e.g.
// "hugetlbfs (not in /proc/filesystems)".
[[nodiscard]] std::vector<std::string> missing_for(const Capabilities& caps, Mode mode);

// Picks the mode: `forced` is the config value models.mode — "auto" takes
// the best mode `caps` allows (full, then small-pages, then cooperative);
// "full" / "small-pages" / "cooperative" take that mode. Errors: EINVAL for
// any other string; EOPNOTSUPP when the forced mode needs something `caps`
// lacks (the message names each missing piece and how to get it).
[[nodiscard]] Result<ModeChoice> choose_mode(const Capabilities& caps, std::string_view forced);

// "mode", "mode.reason", "advice.<topic>" (several lines of one topic are
// joined with "; ") for `airsctl status`.
[[nodiscard]] std::map<std::string, std::string> to_key_values(const ModeChoice& choice);

}  // namespace airs::probe
