// Issue 55: the inverse's permuted 2-D call (256^3 complex64, (Y, Z, X) -> (X, Y, Z), chunks of 8 X)
// run directly, or as a gather of each chunk into a contiguous scratch (FFTW rank-0 copy plan)
// followed by contiguous 2-D FFTs: process CPU time, minimum of 9 rounds; HUGE=1 madvises the
// buffers as the kernel does.  gcc -O2 -o /tmp/gather benchmarks/native/gather_chunks.c $L/libfftw3f-*.so* -Wl,-rpath,$L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <time.h>
#include <sys/mman.h>
typedef struct { ptrdiff_t n, is, os; } iodim;
typedef void* plan_t;
plan_t fftwf_plan_guru64_dft(int, const iodim*, int, const iodim*, void*, void*, int, unsigned);
void fftwf_execute_dft(plan_t, void*, void*);
void* fftwf_malloc(size_t);
char* fftwf_sprint_plan(plan_t);
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static void* big(size_t b) { void* p = aligned_alloc(1 << 21, b); if (getenv("HUGE")) madvise(p, b, MADV_HUGEPAGE); memset(p, 0, b); return p; }
int main(void) {
  const ptrdiff_t n = 256, N = n * n * n, C = 8;
  unsigned flags = (1u << 4);
  float *b = big(N * 8), *c = big(N * 8), *s = fftwf_malloc(C * n * n * 8);
  for (ptrdiff_t i = 0; i < 2 * N; ++i) b[i] = (float)(i % 7);
  // (a) direct: 2-D over Y,Z of (Y,Z,X) writing (X,Y,Z), howmany C X's
  iodim d2[2] = {{n, n * n, n}, {n, n, 1}}, h2[1] = {{C, 1, n * n}};
  plan_t pa = fftwf_plan_guru64_dft(2, d2, 1, h2, b, c, 1, flags);
  // (b) gather: rank-0 copy of the chunk (Y,Z,Xc) -> scratch (Xc,Y,Z), then 2-D in scratch layout -> out
  iodim g[3] = {{n, n * n, n}, {n, n, 1}, {C, 1, n * n}};
  plan_t pg = fftwf_plan_guru64_dft(0, NULL, 3, g, b, s, 1, flags);
  iodim d3[2] = {{n, n, n}, {n, 1, 1}}, h3[1] = {{C, n * n, n * n}};
  plan_t pb = fftwf_plan_guru64_dft(2, d3, 1, h3, s, c, 1, flags | 1u);  // may destroy scratch
  if (getenv("PRINT")) { printf("%s\n%s\n%s\n", fftwf_sprint_plan(pa), fftwf_sprint_plan(pg), fftwf_sprint_plan(pb)); }
  double ta[9], tb[9];
  for (int r = 0; r < 9; ++r) {
    double t0 = cpu();
    for (ptrdiff_t k = 0; k < n / C; ++k) fftwf_execute_dft(pa, b + 2 * k * C, c + 2 * k * C * n * n);
    double t1 = cpu();
    for (ptrdiff_t k = 0; k < n / C; ++k) { fftwf_execute_dft(pg, b + 2 * k * C, s); fftwf_execute_dft(pb, s, c + 2 * k * C * n * n); }
    double t2 = cpu(); ta[r] = t1 - t0; tb[r] = t2 - t1;
  }
  double ma = 1e9, mb = 1e9; for (int r = 0; r < 9; ++r) { if (ta[r] < ma) ma = ta[r]; if (tb[r] < mb) mb = tb[r]; }
  printf("huge=%d direct chunks min cpu %.1f ms; gather + contiguous 2-D min cpu %.1f ms (first rounds %.1f / %.1f)\n", getenv("HUGE") != NULL, ma * 1e3, mb * 1e3, ta[4] * 1e3, tb[4] * 1e3);
}
