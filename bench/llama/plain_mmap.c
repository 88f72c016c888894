// SPDX-License-Identifier: Apache-2.0
/* bench/llama: llama.cpp without its prefetch ("plain mmap" demand paging).
 * llama.cpp maps the model MAP_SHARED|MAP_POPULATE and advises WILLNEED; it
 * has no switch to turn that off. Preloaded into llama-gen, this strips
 * MAP_POPULATE from mmap and drops MADV_WILLNEED / POSIX_FADV_WILLNEED, so
 * every page comes in on its first touch, as with a plain mmap loader. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/types.h>

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  static void *(*real)(void *, size_t, int, int, int, off_t);
  if (!real) real = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
  return real(addr, len, prot, flags & ~MAP_POPULATE, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}

int madvise(void *addr, size_t len, int advice) {
  static int (*real)(void *, size_t, int);
  if (advice == MADV_WILLNEED) return 0;
  if (!real) real = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "madvise");
  return real(addr, len, advice);
}

int posix_fadvise(int fd, off_t off, off_t len, int advice) {
  static int (*real)(int, off_t, off_t, int);
  if (advice == POSIX_FADV_WILLNEED) return 0;
  if (!real) real = (int (*)(int, off_t, off_t, int))dlsym(RTLD_NEXT, "posix_fadvise");
  return real(fd, off, len, advice);
}
