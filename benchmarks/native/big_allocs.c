// Issue 55: who takes the large buffers, with which alignment, from which thread.  An LD_PRELOAD
// shim that passes every posix_memalign, aligned_alloc and memalign call to glibc and logs the
// ones of 32 MiB or more to stderr: the thread (main=1: the process's first thread, whose
// allocations come from glibc's main heap; main=0: another thread, which glibc gives an arena
// of its own), the alignment, the size and the address returned.  (malloc itself is not
// wrapped: XLA's CPU buffers all came through posix_memalign here.)
//
//   gcc -O2 -shared -fPIC -o /tmp/big_allocs.so benchmarks/native/big_allocs.c -ldl
//   LD_PRELOAD=/tmp/big_allocs.so python -m benchmarks.steady heap --calls 12 2>/tmp/allocs.log
//   awk '{print $1, $3, $4, $5}' /tmp/allocs.log | sort | uniq -c
//
// The summary of one run is benchmarks/data/big-allocs.txt.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
static int (*real_pm)(void**, size_t, size_t);
static void* (*real_aligned)(size_t, size_t);
static void* (*real_memalign)(size_t, size_t);
#define BIG (32u << 20)
static void logit(const char* what, size_t a, size_t n, void* p) {
  char buf[200];
  long tid = syscall(SYS_gettid);
  int k = snprintf(buf, sizeof buf, "%s tid=%ld main=%d align=%zu size=%zu p=%p\n", what, tid,
                   (int)(tid == getpid()), a, n, p);
  write(2, buf, k);
}
int posix_memalign(void** r, size_t a, size_t n) {
  if (!real_pm) real_pm = dlsym(RTLD_NEXT, "posix_memalign");
  int e = real_pm(r, a, n);
  if (n >= BIG) logit("posix_memalign", a, n, *r);
  return e;
}
void* aligned_alloc(size_t a, size_t n) {
  if (!real_aligned) real_aligned = dlsym(RTLD_NEXT, "aligned_alloc");
  void* p = real_aligned(a, n);
  if (n >= BIG) logit("aligned_alloc", a, n, p);
  return p;
}
void* memalign(size_t a, size_t n) {
  if (!real_memalign) real_memalign = dlsym(RTLD_NEXT, "memalign");
  void* p = real_memalign(a, n);
  if (n >= BIG) logit("memalign", a, n, p);
  return p;
}
