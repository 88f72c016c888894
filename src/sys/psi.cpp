// SPDX-License-Identifier: Apache-2.0
#include "sys/psi.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "sys/procfs.hpp"

namespace airs::sys {
namespace {

constexpr const char* kEnablePsi = "boot with psi=1 on the kernel command line (cmdline.txt on Raspberry Pi OS)";

std::string_view next_field(std::string_view& s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  size_t n = 0;
  while (n < s.size() && s[n] != ' ' && s[n] != '\t') ++n;
  auto tok = s.substr(0, n);
  s.remove_prefix(n);
  return tok;
}

bool parse_double(std::string_view v, double& out) {
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc{} && p == v.data() + v.size();
}

Result<PsiLine> parse_line(std::string_view rest, const std::string& path, std::string_view line) {
  PsiLine l;
  unsigned seen = 0;
  for (auto tok = next_field(rest); !tok.empty(); tok = next_field(rest)) {
    auto eq = tok.find('=');
    if (eq == std::string_view::npos) continue;
    auto key = tok.substr(0, eq);
    auto val = tok.substr(eq + 1);
    bool ok = true;
    if (key == "avg10") ok = parse_double(val, l.avg10), seen |= 1;
    else if (key == "avg60") ok = parse_double(val, l.avg60), seen |= 2;
    else if (key == "avg300") ok = parse_double(val, l.avg300), seen |= 4;
    else if (key == "total") {
      auto [p, ec] = std::from_chars(val.data(), val.data() + val.size(), l.total_us);
      ok = ec == std::errc{} && p == val.data() + val.size();
      seen |= 8;
    }
    if (!ok) return make_error(EINVAL, "{}: bad value in '{}'", path, line);
  }
  if (seen != 15) return make_error(EINVAL, "{}: line '{}' lacks avg10/avg60/avg300/total", path, line);
  return l;
}

}  // namespace

Result<PsiStats> parse_psi(std::string_view text, const std::string& path) {
  PsiStats st;
  bool has_some = false;
  while (!text.empty()) {
    auto nl = text.find('\n');
    auto line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    auto rest = line;
    auto kind = next_field(rest);
    if (kind.empty()) continue;
    if (kind == "some" || kind == "full") {
      auto l = parse_line(rest, path, line);
      if (!l) return std::move(l).error();
      if (kind == "some") {
        st.some = *l;
        has_some = true;
      } else {
        st.full = *l;
        st.has_full = true;
      }
    } else {
      return make_error(EINVAL, "{}: unexpected line '{}' (not a PSI file?)", path, line);
    }
  }
  if (!has_some) return make_error(EINVAL, "{}: no 'some' line (not a PSI file?)", path);
  return st;
}

Result<PsiStats> read_psi(const std::string& path) {
  auto text = read_text_file(path, 4096);
  if (!text) {
    const int code = text.error().code;
    if (code == ENOENT || code == EOPNOTSUPP)
      return make_error(code, "PSI is disabled: {}: {}; {}", path, std::strerror(code), kEnablePsi);
    return std::move(text).error();
  }
  return parse_psi(*text, path);
}

const char* to_string(PsiKind k) { return k == PsiKind::Full ? "full" : "some"; }

std::string describe(const PsiTriggerSpec& spec) {
  auto fmt_us = [](std::chrono::microseconds d) {
    const auto us = d.count();
    if (us % 1000000 == 0) return fmt::format("{}s", us / 1000000);
    if (us % 1000 == 0) return fmt::format("{}ms", us / 1000);
    return fmt::format("{}us", us);
  };
  return fmt::format("{} {}/{}", to_string(spec.kind), fmt_us(spec.threshold), fmt_us(spec.window));
}

Result<PsiTrigger> PsiTrigger::create(const std::string& path, const PsiTriggerSpec& spec) {
  const std::string what = describe(spec);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    const int e = errno;
    if (e == ENOENT || e == EOPNOTSUPP)
      return make_error(e, "PSI is disabled: cannot open {}: {}; {}", path, std::strerror(e), kEnablePsi);
    if (e == EACCES || e == EPERM)
      return make_error(e, "cannot open {} for a PSI trigger ({}): {}; run as root or give the daemon write access",
                        path, what, std::strerror(e));
    return make_error(e, "cannot open {} for a PSI trigger ({}): {}", path, what, std::strerror(e));
  }
  // A trigger write to an ordinary file "succeeds" and never fires: refuse
  // anything that is not procfs or cgroup2 (e.g. a fixture path in config).
  struct statfs fs {};
  if (::fstatfs(fd.get(), &fs) != 0) return make_error(errno, "fstatfs {}: {}", path, std::strerror(errno));
  if (fs.f_type != PROC_SUPER_MAGIC && fs.f_type != CGROUP2_SUPER_MAGIC)
    return make_error(EINVAL, "{} is not a kernel pressure file (not on procfs or cgroup2): cannot put a PSI trigger on it",
                      path);
  // The kernel replaces the last byte written with a NUL: write ours.
  const std::string cmd = fmt::format("{} {} {}", to_string(spec.kind), spec.threshold.count(), spec.window.count());
  const ssize_t n = ::write(fd.get(), cmd.c_str(), cmd.size() + 1);
  if (n < 0) {
    const int e = errno;
    if (e == EINVAL) {
      const bool two_s = spec.window.count() % 2000000 == 0;
      return make_error(
          e, "PSI trigger '{}' on {} rejected: {}", what, path,
          two_s ? std::string("threshold must be > 0 and <= window, window 500 ms..10 s")
                : std::string("without CAP_SYS_RESOURCE the window must be a multiple of 2 s (this process lacks it; "
                              "use a 2 s window or grant CAP_SYS_RESOURCE)"));
    }
    if (e == EPERM)
      return make_error(e, "PSI trigger '{}' on {}: {}; needs CAP_SYS_RESOURCE for windows that are not multiples of 2 s",
                        what, path, std::strerror(e));
    if (e == EOPNOTSUPP)
      return make_error(e, "PSI trigger '{}' on {}: {}; {}", what, path, std::strerror(e), kEnablePsi);
    return make_error(e, "PSI trigger '{}' on {}: {}", what, path, std::strerror(e));
  }
  if (static_cast<size_t>(n) != cmd.size() + 1) return make_error(EIO, "short write of PSI trigger '{}' to {}", what, path);
  return PsiTrigger(std::move(fd), path, spec);
}

}  // namespace airs::sys
