// Issue 55: the inverse's two calls (256^3 complex64, the transposed layout) with the
// normalisation as a pass of its own over the output (as before: `./scale_pass whole`) or per
// 4 MiB chunk right after FFTW wrote it (fftw.cc `Execute`: `./scale_pass chunked`).  Load-free
// counts of the memory traffic come from cachegrind's simulated 32 MiB last-level cache:
//
//   gcc -O3 -o /tmp/scale_pass benchmarks/native/scale_pass.c $L/libfftw3f-*.so* -Wl,-rpath,$L
//   WISDOM_OUT=/tmp/w-whole.txt /tmp/scale_pass whole   # plan once natively (MEASURE), then:
//   WISDOM=/tmp/w-whole.txt valgrind --tool=cachegrind --cache-sim=yes --LL=33554432,16,64 \
//       --D1=32768,8,64 /tmp/scale_pass whole             # and the same with `chunked`
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
typedef struct { ptrdiff_t n, is, os; } iodim;
typedef void* plan_t;
plan_t fftwf_plan_guru64_dft(int, const iodim*, int, const iodim*, void*, void*, int, unsigned);
void fftwf_execute_dft(plan_t, void*, void*);
void* fftwf_malloc(size_t);
int fftwf_import_wisdom_from_filename(const char*);
int fftwf_export_wisdom_to_filename(const char*);
static void scale(float* x, size_t n, float s) { for (size_t i = 0; i < n; ++i) x[i] *= s; }
int main(int argc, char** argv) {
  const ptrdiff_t n = 256, N = n * n * n; int chunked = argc > 1 && !strcmp(argv[1], "chunked");
  if (getenv("WISDOM")) fftwf_import_wisdom_from_filename(getenv("WISDOM"));
  unsigned flags = (1u << 4);  // MEASURE | PRESERVE_INPUT
  float *a = fftwf_malloc(N * 8), *b = fftwf_malloc(N * 8), *c = fftwf_malloc(N * 8);
  ptrdiff_t C = chunked ? 8 : n;  // X indices (step 2) or Y rows (step 1) per chunk
  // step 1: 1-D along X (contiguous) in the (Y,Z,X) layout; howmany Y (outer), Z
  iodim d1[1] = {{n, 1, 1}}, h1[2] = {{C, n * n, n * n}, {n, n, n}};
  // step 2: 2-D over Y,Z of (Y,Z,X) writing (X,Y,Z); howmany X (outer in the output)
  iodim d2[2] = {{n, n * n, n}, {n, n, 1}}, h2[1] = {{C, 1, n * n}};
  plan_t p1 = fftwf_plan_guru64_dft(1, d1, 2, h1, a, b, 1, flags);
  plan_t p2 = fftwf_plan_guru64_dft(2, d2, 1, h2, b, c, 1, flags);
  if (getenv("WISDOM_OUT")) fftwf_export_wisdom_to_filename(getenv("WISDOM_OUT"));
  for (ptrdiff_t i = 0; i < 2 * N; ++i) a[i] = (float)(i % 7);
  for (ptrdiff_t k = 0; k < n / C; ++k) {
    fftwf_execute_dft(p1, a + 2 * k * C * n * n, b + 2 * k * C * n * n);
    if (chunked) scale(b + 2 * k * C * n * n, 2 * C * n * n, 1.0f / n);
  }
  if (!chunked) scale(b, 2 * N, 1.0f / n);
  for (ptrdiff_t k = 0; k < n / C; ++k) {
    fftwf_execute_dft(p2, b + 2 * k * C, c + 2 * k * C * n * n);
    if (chunked) scale(c + 2 * k * C * n * n, 2 * C * n * n, 1.0f / (n * n));
  }
  if (!chunked) scale(c, 2 * N, 1.0f / (n * n));
  printf("%s %g\n", chunked ? "chunked" : "whole", c[2 * 12345]);
  return 0;
}
