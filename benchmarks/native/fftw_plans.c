// Issue 55: the FFTW guru plans of pencilfft's one-device transform (fftw.cc MakeGeometry, 256^3
// complex64, (B, X, Y, Z) with B = 1 left out) and the alternatives for the permuted calls:
// FFTW's plan text (fftwf_sprint_plan), its flop counts, and CPU and wall times of interleaved
// rounds on the same three buffers.  Single precision, MEASURE, PRESERVE_INPUT, one thread
// (T=2: FFTW's threads), the FFTW library of pyFFTW's wheel (the kernel's):
//
//   L=$(python -c "import pyfftw, pathlib; print(pathlib.Path(pyfftw.__file__).parent.parent / 'pyfftw.libs')")
//   gcc -O2 -o /tmp/fftw_plans benchmarks/native/fftw_plans.c $L/libfftw3f-*.so* $L/libfftw3f_omp-*.so* -Wl,-rpath,$L
//   LD_LIBRARY_PATH=$L /tmp/fftw_plans 256 9 > benchmarks/data/fftw-plans-256.txt
//
// Logical axes X, Y, Z = 0, 1, 2; a layout is the buffer's axes as logical ones (ID: (X, Y, Z),
// P: (Y, Z, X), the transposed layout's spectrum).  Variants: fwd_cur, inv_cur are what the
// stages run (`stages.Fft._split`); the others were measured against them (benchmarks/RESULTS.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <time.h>
typedef struct { ptrdiff_t n, is, os; } iodim;
typedef void* plan_t;
plan_t fftwf_plan_guru64_dft(int, const iodim*, int, const iodim*, void*, void*, int, unsigned);
void fftwf_execute_dft(plan_t, void*, void*);
char* fftwf_sprint_plan(plan_t);
void fftwf_flops(plan_t, double*, double*, double*);
void* fftwf_malloc(size_t);
int fftwf_init_threads(void); void fftwf_plan_with_nthreads(int);
int fftwf_export_wisdom_to_filename(const char*); int fftwf_import_wisdom_from_filename(const char*);
#define NSTEP 2
typedef struct { int naxes; int axes[3]; int in[3]; int out[3]; int sign; } step_t;
typedef struct { const char* name; int nsteps; step_t s[NSTEP]; } var_t;
static int n;
static void strides(const int* order, ptrdiff_t* st) { // st[logical axis]
  ptrdiff_t acc = 1; for (int k = 2; k >= 0; --k) { st[order[k]] = acc; acc *= n; } }
static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#define ID {0,1,2}
#define P {1,2,0}
var_t vars[] = {
  {"fwd_cur", 2, {{2, {1,2}, ID, ID, -1}, {1, {0}, ID, P, -1}}},
  {"fwd_3d_natural", 1, {{3, {0,1,2}, ID, ID, -1}}},
  {"fwd_3d_perm", 1, {{3, {0,1,2}, ID, P, -1}}},
  {"inv_cur", 2, {{1, {0}, P, P, 1}, {2, {1,2}, P, ID, 1}}},
  {"inv_mirror", 2, {{1, {0}, P, ID, 1}, {2, {1,2}, ID, ID, 1}}},
  {"inv_2d_first", 2, {{2, {1,2}, P, P, 1}, {1, {0}, P, ID, 1}}},
  {"inv_2dperm_first", 2, {{2, {1,2}, P, ID, 1}, {1, {0}, ID, ID, 1}}},
  {"inv_3d_perm", 1, {{3, {0,1,2}, P, ID, 1}}},
  {"inv_yxz", 2, {{1, {0}, P, {1,0,2}, 1}, {2, {1,2}, {1,0,2}, ID, 1}}},
  {"inv_zxy", 2, {{1, {0}, P, {2,0,1}, 1}, {2, {1,2}, {2,0,1}, ID, 1}}},
};
int main(int argc, char** argv) {
  n = argc > 1 ? atoi(argv[1]) : 256; int rounds = argc > 2 ? atoi(argv[2]) : 9;
  int threads = getenv("T") ? atoi(getenv("T")) : 1;
  const char* only = getenv("ONLY");
  unsigned flags = (1u << 4) | (getenv("ESTIMATE") ? (1u << 6) : 0);  // PRESERVE_INPUT | MEASURE/ESTIMATE
  if (threads > 1) { fftwf_init_threads(); fftwf_plan_with_nthreads(threads); }
  if (getenv("WISDOM")) fftwf_import_wisdom_from_filename(getenv("WISDOM"));
  size_t bytes = (size_t)n * n * n * 8;
  float* buf[3]; for (int i = 0; i < 3; ++i) { buf[i] = fftwf_malloc(bytes); memset(buf[i], 0, bytes); }
  int nv = sizeof(vars) / sizeof(vars[0]);
  plan_t plans[16][NSTEP]; double cpu[16][NSTEP][64], wall[16][NSTEP][64];
  for (int v = 0; v < nv; ++v) {
    if (only && !strstr(only, vars[v].name)) { vars[v].nsteps = 0; continue; }
    for (int s = 0; s < vars[v].nsteps; ++s) {
      step_t* st = &vars[v].s[s]; ptrdiff_t is[3], os[3]; strides(st->in, is); strides(st->out, os);
      iodim dims[3], how[3]; int nd = 0, nh = 0, tr[3] = {0,0,0};
      for (int a = 0; a < st->naxes; ++a) { tr[st->axes[a]] = 1; dims[nd++] = (iodim){n, is[st->axes[a]], os[st->axes[a]]}; }
      for (int a = 0; a < 3; ++a) if (!tr[a]) how[nh++] = (iodim){n, is[a], os[a]};
      float* in = vars[v].nsteps == 1 ? buf[0] : buf[s]; float* out = vars[v].nsteps == 1 ? buf[2] : buf[s + 1];
      double t0 = now(CLOCK_MONOTONIC);
      plans[v][s] = fftwf_plan_guru64_dft(nd, dims, nh, how, in, out, st->sign, flags);
      double add, mul, fma; fftwf_flops(plans[v][s], &add, &mul, &fma);
      char* txt = fftwf_sprint_plan(plans[v][s]);
      printf("PLAN %s step %d (planned %.1f s) flops add %.3g mul %.3g fma %.3g\n%s\n", vars[v].name, s, now(CLOCK_MONOTONIC) - t0, add, mul, fma, txt);
      free(txt); fflush(stdout);
    }
  }
  if (getenv("WISDOM_OUT")) fftwf_export_wisdom_to_filename(getenv("WISDOM_OUT"));
  for (int i = 0; i < 3; ++i) for (size_t j = 0; j < bytes / 4; ++j) buf[i][j] = (float)(j % 7);
  for (int r = 0; r < rounds; ++r)
    for (int v = 0; v < nv; ++v)
      for (int s = 0; s < vars[v].nsteps; ++s) {
        float* in = vars[v].nsteps == 1 ? buf[0] : buf[s]; float* out = vars[v].nsteps == 1 ? buf[2] : buf[s + 1];
        double c0 = now(CLOCK_PROCESS_CPUTIME_ID), w0 = now(CLOCK_MONOTONIC);
        fftwf_execute_dft(plans[v][s], in, out);
        cpu[v][s][r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0; wall[v][s][r] = now(CLOCK_MONOTONIC) - w0;
      }
  int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return (x > y) - (x < y); }
  for (int v = 0; v < nv; ++v) {
    double tc = 0, tw = 0;
    for (int s = 0; s < vars[v].nsteps; ++s) {
      qsort(cpu[v][s], rounds, 8, cmp); qsort(wall[v][s], rounds, 8, cmp);
      printf("TIME %-18s step %d cpu median %7.1f min %7.1f ms  wall median %7.1f min %7.1f\n", vars[v].name, s,
             cpu[v][s][rounds / 2] * 1e3, cpu[v][s][0] * 1e3, wall[v][s][rounds / 2] * 1e3, wall[v][s][0] * 1e3);
      tc += cpu[v][s][0]; tw += wall[v][s][0];
    }
    if (vars[v].nsteps) printf("TOTAL %-18s min cpu %7.1f ms  min wall %7.1f ms\n", vars[v].name, tc * 1e3, tw * 1e3);
  }
  return 0;
}
