// Issue 55: what a fresh 128 MiB costs to touch, with and without MADV_HUGEPAGE (fftw.cc `HugePages`):
// page faults, system time and wall time of each of 8 fresh mappings (system time is the
// process's own, whatever else runs).  gcc -O2 -o /tmp/thp_touch benchmarks/native/thp_touch.c
//   /tmp/thp_touch 1; /tmp/thp_touch 0; grep -E "compact_stall|thp_fault" /proc/vmstat
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
static double sys_s(long* flt) { struct rusage r; getrusage(RUSAGE_SELF, &r); *flt = r.ru_minflt; return r.ru_stime.tv_sec + 1e-6 * r.ru_stime.tv_usec; }
int main(int argc, char** argv) {
  int huge = atoi(argv[1]); size_t bytes = (size_t)128 << 20; int reps = 8;
  for (int i = 0; i < reps; ++i) {
    char* p = mmap(NULL, bytes + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char* a = (char*)(((unsigned long)p + (2 << 20) - 1) & ~((2UL << 20) - 1));
    if (huge) madvise(a, bytes, MADV_HUGEPAGE);
    long f0, f1; struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0); double s0 = sys_s(&f0);
    memset(a, 1, bytes);
    double s1 = sys_s(&f1); clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("huge=%d touch 128 MiB: %ld faults, sys %.1f ms, wall %.1f ms\n", huge, f1 - f0, (s1 - s0) * 1e3, (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6);
    munmap(p, bytes + (2 << 20));
  }
}
