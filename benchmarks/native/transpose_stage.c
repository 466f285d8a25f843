// Issue 55: the permuted call of the one-device transform done as "FFT in the cache, then a
// tiled transpose", per plane of the axis that stays outermost, against FFTW's strided plans
// (what fftw.cc runs).  256^3 complex64, layouts as logical axes: ID (X, Y, Z), P (Y, Z, X).
//
//   cur: the stages' calls as fftw.cc plans them (FFTW's threads, T of them):
//        forward 2-D (Y, Z) ID -> ID, 1-D X ID -> P (strided reads);
//        inverse 1-D X P -> P, 2-D (Y, Z) P -> ID (strided reads).
//   new: per Y plane on T OpenMP threads, each with a one-thread plan:
//        forward: 2-D (Y, Z) as cur; then for each y, transpose ID[:, y, :] (X, Z) into
//                 P[y] (Z, X) and FFT X in place there, in the cache.
//        inverse: for each y, FFT X of P[y] into a thread's scratch (Z, X), transpose it into
//                 ID[:, y, :]; then the 2-D (Y, Z) in place on ID (FFTW's threads).
//
//   L=$(python -c "import pyfftw, pathlib; print(pathlib.Path(pyfftw.__file__).parent.parent / 'pyfftw.libs')")
//   gcc -O3 -fopenmp -o /tmp/tstage benchmarks/native/transpose_stage.c $L/libfftw3f-*.so* $L/libfftw3f_omp-*.so* -Wl,-rpath,$L
//   T=2 /tmp/tstage 256 9
#include <complex.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef struct { ptrdiff_t n, is, os; } iodim;
typedef void* plan_t;
plan_t fftwf_plan_guru64_dft(int, const iodim*, int, const iodim*, void*, void*, int, unsigned);
void fftwf_execute_dft(plan_t, void*, void*);
void* fftwf_malloc(size_t);
int fftwf_init_threads(void);
void fftwf_plan_with_nthreads(int);
typedef float complex cf;
static ptrdiff_t n;
static int T;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static const unsigned kFlags = 1u << 4;  // PRESERVE_INPUT, MEASURE

// Tiled transpose of a (rows, cols) matrix `a` (row stride lda) into `b` with row stride `ldb`:
// b[c * ldb + r] = s * a[r * lda + c].
#define TILE 16
static void transpose(const cf* restrict a, ptrdiff_t lda, ptrdiff_t rows, ptrdiff_t cols, cf* restrict b, ptrdiff_t ldb, float s) {
  for (ptrdiff_t r0 = 0; r0 < rows; r0 += TILE)
    for (ptrdiff_t c0 = 0; c0 < cols; c0 += TILE)
      for (ptrdiff_t c = c0; c < c0 + TILE; ++c)
        for (ptrdiff_t r = r0; r < r0 + TILE; ++r) b[c * ldb + r] = a[r * lda + c] * s;
}

static plan_t plan(int rank, iodim* d, int hr, iodim* h, void* in, void* out, int sign, int threads) {
  fftwf_plan_with_nthreads(threads);
  return fftwf_plan_guru64_dft(rank, d, hr, h, in, out, sign, kFlags);
}

int main(int argc, char** argv) {
  n = argc > 1 ? atoi(argv[1]) : 256;
  int rounds = argc > 2 ? atoi(argv[2]) : 9;
  T = getenv("T") ? atoi(getenv("T")) : 1;
  fftwf_init_threads();
  omp_set_num_threads(T);
  const ptrdiff_t nn = n * n, N = nn * n;
  cf *x = fftwf_malloc(N * 8), *k = fftwf_malloc(N * 8), *t = fftwf_malloc(N * 8), *y = fftwf_malloc(N * 8),
     *y2 = fftwf_malloc(N * 8), *k2 = fftwf_malloc(N * 8);
  cf* scratch[64];
  for (int i = 0; i < T; ++i) scratch[i] = fftwf_malloc(nn * 8);
  // strides of ID: X nn, Y n, Z 1; of P (Y, Z, X): Y nn, Z n, X 1.
  // forward cur
  iodim f1d[2] = {{n, n, n}, {n, 1, 1}}, f1h[1] = {{n, nn, nn}};
  plan_t pf1 = plan(2, f1d, 1, f1h, x, t, -1, T);
  iodim f2d[1] = {{n, nn, 1}}, f2h[2] = {{n, n, nn}, {n, 1, n}};
  plan_t pf2 = plan(1, f2d, 2, f2h, t, k, -1, T);
  // forward new: X FFT in place on one P plane (Z, X): dims X stride 1, howmany Z stride n
  iodim pd[1] = {{n, 1, 1}}, ph[1] = {{n, n, n}};
  plan_t pfx = plan(1, pd, 1, ph, k2, k2, -1, 1);
  // inverse cur
  iodim i1d[1] = {{n, 1, 1}}, i1h[2] = {{n, nn, nn}, {n, n, n}};
  plan_t pi1 = plan(1, i1d, 2, i1h, k, t, 1, T);
  iodim i2d[2] = {{n, nn, n}, {n, n, 1}}, i2h[1] = {{n, 1, nn}};
  plan_t pi2 = plan(2, i2d, 1, i2h, t, y, 1, T);
  // inverse new: X FFT of a P plane into scratch, then 2-D in place on ID
  plan_t pix = plan(1, pd, 1, ph, k, scratch[0], 1, 1);
  plan_t pi2n = plan(2, f1d, 1, f1h, y2, y2, 1, T);
  for (ptrdiff_t i = 0; i < N; ++i) x[i] = (float)((i * 7919) % 1013) / 1013.0f - 0.5f + I * ((float)((i * 104729) % 997) / 997.0f - 0.5f);
  double tf[64][4], ti[64][4];
  const float s = 1.0f / (float)N;
  for (int r = 0; r < rounds; ++r) {
    double a = now();
    fftwf_execute_dft(pf1, x, t);
    double b = now();
    fftwf_execute_dft(pf2, t, k);
    double c = now();
    tf[r][0] = b - a; tf[r][1] = c - b;
    a = now();
    fftwf_execute_dft(pf1, x, t);
    b = now();
#pragma omp parallel for schedule(static)
    for (ptrdiff_t yy = 0; yy < n; ++yy) {
      cf* dst = k2 + yy * nn;
      transpose(t + yy * n, nn, n, n, dst, n, 1.0f);  // t[x, yy, z] -> P[yy] (Z, X)
      fftwf_execute_dft(pfx, dst, dst);
    }
    c = now();
    tf[r][2] = b - a; tf[r][3] = c - b;
    a = now();
    fftwf_execute_dft(pi1, k, t);
    b = now();
    fftwf_execute_dft(pi2, t, y);
    for (ptrdiff_t i = 0; i < N; ++i) y[i] *= s;
    c = now();
    ti[r][0] = b - a; ti[r][1] = c - b;
    a = now();
#pragma omp parallel for schedule(static)
    for (ptrdiff_t yy = 0; yy < n; ++yy) {
      cf* sc = scratch[omp_get_thread_num()];
      fftwf_execute_dft(pix, k + yy * nn, sc);
      transpose(sc, n, n, n, y2 + yy * n, nn, s);  // sc (Z, X) -> y2[x, yy, z]
    }
    b = now();
    fftwf_execute_dft(pi2n, y2, y2);
    c = now();
    ti[r][2] = b - a; ti[r][3] = c - b;
  }
  double ek = 0, ey = 0;
  for (ptrdiff_t i = 0; i < N; ++i) {
    ek = fmax(ek, cabsf(k[i] - k2[i]));
    ey = fmax(ey, cabsf(y[i] - y2[i]));
  }
  double mk = 0;
  for (ptrdiff_t i = 0; i < N; ++i) mk = fmax(mk, cabsf(k[i]));
  printf("max |k - k_new| %.3g (of max |k| %.3g), max |y - y_new| %.3g, max |y - x| %.3g\n", ek, mk, ey,
         (double)cabsf(y[12345] - x[12345]));
  int cmp(const void* p, const void* q) { double u = *(double*)p, v = *(double*)q; return (u > v) - (u < v); }
  const char* names[2][4] = {{"fwd cur 2-D", "fwd cur 1-D X->P", "fwd new 2-D", "fwd new T+X"},
                             {"inv cur 1-D X", "inv cur 2-D P->ID+scale", "inv new X+T", "inv new 2-D in place"}};
  for (int w = 0; w < 2; ++w) {
    double med[4];
    for (int j = 0; j < 4; ++j) {
      double v[64];
      for (int r = 0; r < rounds; ++r) v[r] = (w ? ti : tf)[r][j];
      qsort(v, rounds, 8, cmp);
      med[j] = v[rounds / 2] * 1e3;
      printf("%-26s median %7.1f ms  min %7.1f\n", names[w][j], med[j], v[0] * 1e3);
    }
    printf("%s cur %.1f new %.1f ms\n", w ? "INVERSE" : "FORWARD", med[0] + med[1], med[2] + med[3]);
  }
  return 0;
}
