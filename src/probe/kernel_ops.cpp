// SPDX-License-Identifier: Apache-2.0
// The real KernelOps. Where src/sys already wraps a call (userfaultfd from
// one named source, PSI triggers, io_uring rings) it is used as is; the rest
// are the few raw calls a probe needs that nothing else in the daemon makes
// (an O_DIRECT open of an arbitrary file).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "probe/probe.hpp"
#include "sys/fd.hpp"
#include "sys/files.hpp"
#include "sys/hugetlbfs.hpp"
#include "sys/procfs.hpp"
#include "sys/psi.hpp"
#include "sys/uffd.hpp"
#include "sys/uring.hpp"

namespace airs::probe {
namespace {

// UFFDIO_API with no requested features answers with every feature the
// kernel has; that is the whole point of asking.
Result<uint64_t> api_features(sys::UniqueFd fd, const std::string& what) {
  auto f = sys::uffd_api(fd.get(), 0);
  if (!f) return make_error(f.error().code, "UFFDIO_API on a userfaultfd from {}: {}", what, std::strerror(f.error().code));
  return f;
}

Result<uint64_t> real_uffd_syscall() {
  auto fd = sys::uffd_create_syscall();
  if (!fd) return std::move(fd).error();
  return api_features(std::move(fd).value(), "userfaultfd(2)");
}

Result<uint64_t> real_uffd_device(const std::string& device) {
  auto fd = sys::uffd_create_device(device);
  if (!fd) return std::move(fd).error();
  return api_features(std::move(fd).value(), device);
}

Status real_io_uring_setup() {
  auto ring = sys::Ring::create(2);
  if (!ring) return std::move(ring).error();
  return {};
}

Status real_psi_trigger(const std::string& path) {
  // PsiTriggerSpec's default is exactly "some 150000 2000000" (a 2 s window
  // works without CAP_SYS_RESOURCE); create() writes the trailing NUL.
  auto t = sys::PsiTrigger::create(path, sys::PsiTriggerSpec{});
  if (!t) return std::move(t).error();
  return {};
}

Status open_direct_file(const std::string& path) {
  auto fd = sys::open_file(path, O_RDONLY | O_DIRECT);
  if (!fd) return make_error(fd.error().code, "open {} with O_DIRECT: {}", path, std::strerror(fd.error().code));
  return {};
}

Status real_open_direct(const std::string& path) {
  const auto st = sys::stat_path(path);
  if (!st) return make_error(st.error().code, "stat {}: {}", path, std::strerror(st.error().code));
  if (!S_ISDIR(st->st_mode)) return open_direct_file(path);
  // An unnamed file leaves nothing behind in the models directory.
  auto fd = sys::open_file(path, O_TMPFILE | O_RDWR | O_DIRECT, 0600);
  if (fd) return {};
  const int e = fd.error().code;
  if (e != EOPNOTSUPP && e != EISDIR && e != EACCES && e != EROFS)
    return make_error(e, "O_TMPFILE with O_DIRECT in {}: {}", path, std::strerror(e));
  // No O_TMPFILE here, or no write access: any existing file answers too.
  const auto names = sys::list_dir(path);
  if (!names) return make_error(names.error().code, "cannot list {}: {}", path, std::strerror(names.error().code));
  for (const std::string& name : *names) {
    const std::string file = path + "/" + name;
    if (auto fst = sys::stat_path(file); fst && S_ISREG(fst->st_mode)) return open_direct_file(file);
  }
  return make_error(e, "cannot tell whether {} supports O_DIRECT: O_TMPFILE failed ({}) and it holds no file",
                    path, std::strerror(e));
}

}  // namespace

KernelOps KernelOps::real() {
  KernelOps ops;
  ops.uffd_syscall = real_uffd_syscall;
  ops.uffd_device = real_uffd_device;
  ops.io_uring_setup = real_io_uring_setup;
  ops.psi_trigger = real_psi_trigger;
  ops.page_size = sys::base_page_size;
  ops.open_direct = real_open_direct;
  ops.read_file = [](const std::string& path) { return sys::read_text_file(path); };
  return ops;
}

}  // namespace airs::probe
