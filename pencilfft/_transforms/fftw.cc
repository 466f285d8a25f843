// pencilfft's CPU FFT kernel: XLA FFI handlers running FFTW's guru interface (pencilfft/_kernel.py):
// `PencilfftFftw` (a whole buffer) and `PencilfftFftwWindow` (one piece of a block, in place at
// an offset known when the program runs: the pipelined stages, `ImplWindow`).
//
// One call transforms `axes` of a dense row-major (XLA's default layout) buffer; every other
// axis is a "howmany" dimension of the same plan, so a transform along a non-last axis needs no
// transpose.  Kinds: c2c (sign -1 forward / +1 backward), r2c, c2r and r2r (DCT/DST I-IV as
// FFTW's REDFT/RODFT kinds; complex data as the real and imaginary parts, a howmany dimension
// of 2 with stride 1).  FFTW is unnormalised: `scale` multiplies the output in the same call
// (on large blocks chunk by chunk while in the cache, `Execute`).
//
// FFTW comes from pyFFTW's wheel (libfftw3, libfftw3f and their _omp threads libraries with
// hashed names, linked by full path); its few prototypes are declared here by hand, so no
// fftw3.h is needed.
//
// Plans are cached per (kind, precision, shape, axes, r2r kinds, in-place, the alignments of
// both buffers, planner flags) and run with FFTW's new-array execute functions on whatever
// buffers XLA hands us (those are thread-safe; planning is not, hence the mutex).  The
// alignment is part of the key because a plan made for SIMD-aligned arrays must not run on
// unaligned ones (and FFTW_UNALIGNED plans measured 2.7x slower: we plan per alignment).
//
// Threads.  Every plan is made for `threads` threads (an attribute: `_threads.threads_per_device()`
// when the program was lowered, so that the devices of a process share its cores) with FFTW's
// threaded planner (libfftw3[f]_omp from the same wheel, OpenMP from its bundled libgomp); the
// count is part of the plan's key.  FFTW keeps a plan for 1 thread free of OpenMP: with as
// many devices as cores nothing changes.  A scaling pass of its own (blocks under 16 MiB) is
// split over as many std::threads.  A 1-D call that transposes (the one-device transform's
// permuted calls, `PlaneWise`) runs in cache-sized blocks with one-thread plans, shared among
// the calling thread and helper threads it keeps (`Helpers`).
//
// c2r over several axes: FFTW has no input-preserving multi-dimensional c2r, and XLA's input
// buffer must not be overwritten, so it runs as a c2c over the leading axes into a per-thread
// scratch buffer followed by a 1-D c2r over the last axis that may destroy the scratch (no copy
// pass: the first transform is the copy).  The scratch buffer is kept per thread and reused
// (a fresh large allocation per call costs page faults, see README "CPU FFT kernel").
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" {
typedef struct {
  ptrdiff_t n, is, os;
} fftw_iodim64;
typedef void* fftw_plan_t;
// The same entry points in double (fftw_) and single (fftwf_) precision.
#define PENCILFFT_FFTW_DECLARE(P, R)                                                           \
  fftw_plan_t P##_plan_guru64_dft(int, const fftw_iodim64*, int, const fftw_iodim64*, void*,   \
                                  void*, int, unsigned);                                       \
  fftw_plan_t P##_plan_guru64_dft_r2c(int, const fftw_iodim64*, int, const fftw_iodim64*, R*,  \
                                      void*, unsigned);                                        \
  fftw_plan_t P##_plan_guru64_dft_c2r(int, const fftw_iodim64*, int, const fftw_iodim64*,      \
                                      void*, R*, unsigned);                                    \
  fftw_plan_t P##_plan_guru64_r2r(int, const fftw_iodim64*, int, const fftw_iodim64*, R*, R*,  \
                                  const int*, unsigned);                                       \
  void P##_execute_dft(fftw_plan_t, void*, void*);                                             \
  void P##_execute_dft_r2c(fftw_plan_t, R*, void*);                                            \
  void P##_execute_dft_c2r(fftw_plan_t, void*, R*);                                            \
  void P##_execute_r2r(fftw_plan_t, R*, R*);                                                   \
  int P##_alignment_of(R*);                                                                    \
  int P##_init_threads();                                                                      \
  void P##_plan_with_nthreads(int);                                                            \
  __attribute__((weak)) void P##_make_planner_thread_safe();
PENCILFFT_FFTW_DECLARE(fftw, double)
PENCILFFT_FFTW_DECLARE(fftwf, float)
void* fftw_malloc(size_t);
void fftw_free(void*);
}

namespace {

constexpr unsigned kDestroyInput = 1u;
constexpr unsigned kPreserveInput = 1u << 4;
constexpr unsigned kEstimate = 1u << 6;
constexpr unsigned kMeasureMask = (1u << 5) | (1u << 3);  // FFTW_PATIENT, FFTW_EXHAUSTIVE

enum Kind : int32_t { kC2C = 0, kR2C = 1, kC2R = 2, kR2R = 3 };

// The FFTW entry points of one precision.
template <typename Real>
struct Api;

#define PENCILFFT_FFTW_API(P, R)                                                   \
  template <>                                                                      \
  struct Api<R> {                                                                  \
    static constexpr auto dft = P##_plan_guru64_dft;                               \
    static constexpr auto r2c = P##_plan_guru64_dft_r2c;                           \
    static constexpr auto c2r = P##_plan_guru64_dft_c2r;                           \
    static constexpr auto r2r = P##_plan_guru64_r2r;                               \
    static constexpr auto exec_dft = P##_execute_dft;                              \
    static constexpr auto exec_r2c = P##_execute_dft_r2c;                          \
    static constexpr auto exec_c2r = P##_execute_dft_c2r;                          \
    static constexpr auto exec_r2r = P##_execute_r2r;                              \
    static int align(void* p) { return P##_alignment_of(static_cast<R*>(p)); }    \
    static void threads(int n) {                                                   \
      static bool ok = Init(); /* once, under plan_mutex */                        \
      if (ok) P##_plan_with_nthreads(n);                                           \
    }                                                                              \
    /* FFTW's planner is one per library and process: pyFFTW (the same wheel's */  \
    /* library) may plan on another thread while XLA runs our call, and two    */  \
    /* planners at once corrupt FFTW's heap (a crash, issue 55). FFTW >= 3.3.5 */  \
    /* serialises every planner call of the process behind its own lock.       */  \
    static bool Init() {                                                           \
      if (P##_make_planner_thread_safe) P##_make_planner_thread_safe();            \
      return P##_init_threads() != 0;                                              \
    }                                                                              \
  };
PENCILFFT_FFTW_API(fftw, double)
PENCILFFT_FFTW_API(fftwf, float)

// One transform's geometry in FFTW's guru terms (strides in elements of each array's type).
struct Geometry {
  std::vector<fftw_iodim64> dims, howmany;
};

// Row-major strides of `shape`, times `unit`.
std::vector<ptrdiff_t> Strides(const std::vector<int64_t>& shape, ptrdiff_t unit) {
  std::vector<ptrdiff_t> s(shape.size());
  ptrdiff_t acc = unit;
  for (size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= shape[i];
  }
  return s;
}

// `axes` of the logical shape `n` are transformed, the others are howmany dimensions.  `is`
// and `os`: each logical axis's stride in elements of the input and of the output (they differ
// along the last axis for r2c/c2r, and the output's are permuted when it is written
// transposed); `unit` multiplies both (2: complex data through a real plan).
Geometry MakeGeometry(const std::vector<int64_t>& n, const std::vector<int64_t>& axes,
                      std::vector<ptrdiff_t> is, std::vector<ptrdiff_t> os, ptrdiff_t unit) {
  for (auto* v : {&is, &os})
    for (auto& s : *v) s *= unit;
  Geometry g;
  std::vector<bool> transformed(n.size(), false);
  for (int64_t a : axes) {
    transformed[a] = true;
    g.dims.push_back({n[a], is[a], os[a]});
  }
  for (size_t i = 0; i < n.size(); ++i)
    if (!transformed[i]) g.howmany.push_back({n[i], is[i], os[i]});
  if (unit == 2) g.howmany.push_back({2, 1, 1});  // complex data through a real (r2r) plan
  return g;
}

std::mutex plan_mutex;                         // FFTW's planner is not thread-safe
std::map<std::vector<int64_t>, fftw_plan_t> plans;  // never freed: a process has few shapes

std::vector<int64_t> Key(int32_t kind, int32_t sign, bool dbl, const Geometry& g,
                         const std::vector<int64_t>& r2r_kinds, bool in_place, int align_in,
                         int align_out, unsigned flags, int threads) {
  std::vector<int64_t> key{kind, sign, dbl, in_place, align_in, align_out, flags, threads,
                           static_cast<int64_t>(g.dims.size())};
  for (const auto* v : {&g.dims, &g.howmany})
    for (const auto& d : *v) key.insert(key.end(), {d.n, d.is, d.os});
  key.insert(key.end(), r2r_kinds.begin(), r2r_kinds.end());
  return key;
}

// An FFTW-allocated buffer of at least `bytes`, offset by `offset` bytes (so that its
// alignment as FFTW sees it matches an XLA buffer's); kept per thread, grown as needed.
struct Scratch {
  void* base = nullptr;
  size_t size = 0;
  ~Scratch() {
    if (base) fftw_free(base);
  }
  char* get(size_t bytes) {
    if (bytes + 64 > size) {
      if (base) fftw_free(base);
      base = fftw_malloc(bytes + 64);
      size = base ? bytes + 64 : 0;
    }
    return static_cast<char*>(base);
  }
};
thread_local Scratch scratch;  // c2r's intermediate (see the top)

template <typename Real>
fftw_plan_t Plan(int32_t kind, int32_t sign, const Geometry& g,
                 const std::vector<int64_t>& r2r_kinds, void* in, void* out, size_t in_bytes,
                 size_t out_bytes, unsigned flags, int threads) {
  using A = Api<Real>;
  bool in_place = in == out;
  int ai = A::align(in), ao = A::align(out);
  auto key = Key(kind, sign, sizeof(Real) == 8, g, r2r_kinds, in_place, ai, ao, flags, threads);
  std::lock_guard<std::mutex> lock(plan_mutex);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  A::threads(threads);  // the planner's global setting: set under the lock, for this plan
  // FFTW_ESTIMATE never touches the arrays while planning; the other planners overwrite them,
  // so they plan on stand-in arrays of the same alignment.
  void *pin = in, *pout = out, *mem_in = nullptr, *mem_out = nullptr;
  // Stand-ins for a block of several GiB would double the memory a large run needs: those
  // few plans are estimated instead (still cached per key, which includes the asked-for flags).
  constexpr size_t kMaxStandIn = size_t{1} << 31;
  if (!(flags & kEstimate) && in_bytes + (in_place ? 0 : out_bytes) > kMaxStandIn)
    flags = (flags & ~kMeasureMask) | kEstimate;
  if (!(flags & kEstimate)) {
    mem_in = fftw_malloc(in_bytes + 64);
    pin = static_cast<char*>(mem_in) + (reinterpret_cast<uintptr_t>(in) % 64);
    if (in_place) {
      pout = pin;
    } else {
      mem_out = fftw_malloc(out_bytes + 64);
      pout = static_cast<char*>(mem_out) + (reinterpret_cast<uintptr_t>(out) % 64);
    }
  }
  int rank = g.dims.size(), hr = g.howmany.size();
  fftw_plan_t p = nullptr;
  if (kind == kC2C) {
    p = A::dft(rank, g.dims.data(), hr, g.howmany.data(), pin, pout, sign, flags);
  } else if (kind == kR2C) {
    p = A::r2c(rank, g.dims.data(), hr, g.howmany.data(), static_cast<Real*>(pin), pout, flags);
  } else if (kind == kC2R) {
    p = A::c2r(rank, g.dims.data(), hr, g.howmany.data(), pin, static_cast<Real*>(pout), flags);
  } else {
    std::vector<int> k(r2r_kinds.begin(), r2r_kinds.end());
    p = A::r2r(rank, g.dims.data(), hr, g.howmany.data(), static_cast<Real*>(pin),
               static_cast<Real*>(pout), k.data(), flags);
  }
  if (mem_in) fftw_free(mem_in);
  if (mem_out) fftw_free(mem_out);
  if (p) plans.emplace(std::move(key), p);
  return p;
}

// Ask for transparent huge pages on a large output buffer before FFTW first writes it.  XLA's
// CPU allocator takes large buffers from glibc, which maps each one anew (and unmaps it when
// freed): with 4 KiB pages the first touch of a 64 MiB block costs 16384 page faults, measured
// as long as the FFT itself.  With 2 MiB pages that is 32 faults.  A hint on this range only
// (where the system's THP mode is "madvise"; without effect on pages already touched, and where
// THP is "never"); no process-wide setting changes.
void HugePages(void* data, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t{1} << 21;
  if (bytes < 4 * kHuge) return;
  uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

template <typename Real>
void Scale(void* data, size_t count, double scale, int threads) {
  if (scale == 1.0) return;
  Real* x = static_cast<Real*>(data);
  const Real s = static_cast<Real>(scale);
  auto part = [x, s](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) x[i] *= s;
  };
  // Threads of our own only where the pass is worth a thread's start (tens of microseconds).
  constexpr size_t kPerThread = size_t{1} << 18;
  size_t n = std::min<size_t>(std::max(threads, 1), std::max<size_t>(count / kPerThread, 1));
  if (n <= 1) return part(0, count);
  std::vector<std::thread> helpers;
  size_t step = (count + n - 1) / n;
  for (size_t t = 1; t < n; ++t)
    helpers.emplace_back(part, t * step, std::min(count, (t + 1) * step));
  part(0, std::min(count, step));
  for (auto& h : helpers) h.join();
}

template <typename Real>
void ExecPlan(int32_t kind, fftw_plan_t p, void* in, void* out) {
  using A = Api<Real>;
  if (kind == kC2C)
    A::exec_dft(p, in, out);
  else if (kind == kR2C)
    A::exec_r2c(p, static_cast<Real*>(in), out);
  else if (kind == kC2R)
    A::exec_c2r(p, in, static_cast<Real*>(out));
  else
    A::exec_r2r(p, static_cast<Real*>(in), static_cast<Real*>(out));
}

// The normalisation without a pass of its own over memory.  A separate pass over a block larger
// than the caches reads and writes it all once more (the one-device inverse's two calls each
// scaled 128 MiB at 256^3, issue 55).  Instead the transform runs in chunks along its outermost
// output dimension where that is a howmany dimension (each chunk a contiguous slab of the
// output of at most kChunkBytes), and each chunk is scaled right after FFTW wrote it, while it
// is still in the cache.  The chunks' plan is FFTW's for that slab (planned once, cached like
// any other), run with the new-array functions at offsets that keep the plan's alignment.
// Blocks under kChunkMin, unit scales and geometries without such a dimension run whole, then
// `Scale`.  `in_unit`, `out_unit`: the bytes of one stride step of each array.
constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr size_t kChunkMin = size_t{16} << 20;

template <typename Real>
bool Execute(int32_t kind, int32_t sign, const Geometry& g, const std::vector<int64_t>& r2r_kinds,
             void* in, void* out, size_t in_bytes, size_t out_bytes, unsigned flags, int threads,
             size_t in_unit, size_t out_unit, double scale) {
  size_t h = g.howmany.size();  // the dimension to chunk, if any
  int64_t c = 0;                // its indices per chunk
  if (scale != 1.0 && out_bytes >= kChunkMin && in != out) {
    for (size_t i = 0; i < g.howmany.size(); ++i)  // (a dimension of 1 is no chunking)
      if (g.howmany[i].n > 1 && (h == g.howmany.size() || g.howmany[i].os > g.howmany[h].os))
        h = i;
    if (h < g.howmany.size()) {
      const fftw_iodim64& d = g.howmany[h];
      const size_t slab = static_cast<size_t>(d.os) * out_unit;  // output bytes per index
      if (d.os > 0 && d.is > 0 && slab * d.n == out_bytes)  // the outermost output dimension
        for (int64_t k = 1; k < d.n; ++k)
          if (d.n % k == 0 && k * slab <= kChunkBytes && (k * slab) % 64 == 0 &&
              (k * d.is * in_unit) % 64 == 0)
            c = k;
    }
  }
  if (c == 0) {
    fftw_plan_t p =
        Plan<Real>(kind, sign, g, r2r_kinds, in, out, in_bytes, out_bytes, flags, threads);
    if (!p) return false;
    ExecPlan<Real>(kind, p, in, out);
    Scale<Real>(out, out_bytes / sizeof(Real), scale, threads);
    return true;
  }
  const fftw_iodim64 d = g.howmany[h];
  Geometry chunk = g;
  chunk.howmany[h].n = c;
  fftw_plan_t p =
      Plan<Real>(kind, sign, chunk, r2r_kinds, in, out, in_bytes, out_bytes, flags, threads);
  if (!p) return false;
  // The chunks run one after the other on this thread, each with FFTW's threads.  (Threads of
  // our own per call, each running whole chunks with a one-thread plan, were tried: 917 page
  // faults per call at 256^3, issue 55, likely FFTW's buffers taken from each new thread's
  // fresh memory.)
  const size_t step_in = c * d.is * in_unit, step_out = c * d.os * out_unit;
  for (int64_t k = 0; k < d.n / c; ++k) {
    char* o = static_cast<char*>(out) + k * step_out;
    ExecPlan<Real>(kind, p, static_cast<char*>(in) + k * step_in, o);
    Scale<Real>(o, step_out / sizeof(Real), scale, 1);
  }
  return true;
}

// Helper threads of one calling thread, kept for its next calls.  Threads started per call
// were measured to fault FFTW's buffers in from each new thread's fresh memory (917 page faults
// per call at 256^3, issue 55); these live as long as the XLA thread that calls us.  A forked
// child has none of them: it starts its own (the parent's state is left alone, never joined).
class Helpers {
 public:
  ~Helpers() {
    if (!state_ || state_->pid != getpid()) return;  // (none, or the parent's)
    {
      std::lock_guard<std::mutex> lock(state_->m);
      state_->stop = true;
    }
    state_->wake.notify_all();
    for (auto& t : state_->threads) t.join();
    delete state_;
  }
  // fn(t) for t in [0, n): t == 0 on this thread, the others on helpers; returns when all ended.
  void Run(int n, const std::function<void(int)>& fn) {
    if (n <= 1) return fn(0);
    if (!state_ || state_->pid != getpid()) state_ = new State{getpid()};
    State& s = *state_;
    while (static_cast<int>(s.threads.size()) < n - 1)
      s.threads.emplace_back(Loop, &s, static_cast<int>(s.threads.size()) + 1);
    {
      std::lock_guard<std::mutex> lock(s.m);
      s.fn = &fn;
      s.active = n;
      s.pending = n - 1;
      ++s.generation;
    }
    s.wake.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(s.m);
    s.done.wait(lock, [&s] { return s.pending == 0; });
    s.fn = nullptr;
  }

 private:
  struct State {
    pid_t pid;
    std::vector<std::thread> threads;
    std::mutex m;
    std::condition_variable wake, done;
    const std::function<void(int)>* fn = nullptr;
    uint64_t generation = 0;
    int active = 0, pending = 0;
    bool stop = false;
  };
  static void Loop(State* s, int id) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      {
        std::unique_lock<std::mutex> lock(s->m);
        s->wake.wait(lock, [&] { return s->stop || s->generation != seen; });
        if (s->stop) return;
        seen = s->generation;
        if (id >= s->active) continue;
        fn = s->fn;
      }
      (*fn)(id);
      std::lock_guard<std::mutex> lock(s->m);
      if (--s->pending == 0) s->done.notify_one();
    }
  }
  State* state_ = nullptr;
};
thread_local Helpers helpers;

// b[c * ldb + r] = s * a[r * lda + c] for r < rows, c < cols: a tiled transpose of complex
// elements (pairs of Real), so that both sides move whole cache lines.
template <typename Real>
void Transpose(const Real* a, ptrdiff_t lda, ptrdiff_t rows, ptrdiff_t cols, Real* b,
               ptrdiff_t ldb, Real s) {
  constexpr ptrdiff_t kTile = 16;
  for (ptrdiff_t r0 = 0; r0 < rows; r0 += kTile)
    for (ptrdiff_t c0 = 0; c0 < cols; c0 += kTile) {
      const ptrdiff_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (ptrdiff_t c = c0; c < c1; ++c)
        for (ptrdiff_t r = r0; r < r1; ++r) {
          b[2 * (c * ldb + r)] = s * a[2 * (r * lda + c)];
          b[2 * (c * ldb + r) + 1] = s * a[2 * (r * lda + c) + 1];
        }
    }
}

// A 1-D c2c along axis `a` whose output swaps `a` with the input's other innermost axis `c`
// (the one-device transform's permuted calls: the forward's X writing (B, Y, Z, X), the
// inverse's X reading it and writing (B, X, Y, Z)).  FFTW's plan for it reads or writes every
// element at a stride of a whole plane: on AVX-512 with two threads the inverse's permuted call
// was 1.26-1.47x the forward's (issue 55).  Here each plane (one index of every other axis) runs
// in blocks of `c` that fit the cache: the forward transposes a block into the output, where `a`
// is contiguous, and transforms it in place there; the inverse transforms a block into a
// thread's scratch and transposes it into the output, scaling as it goes.  Blocks are shared
// among `threads` (this thread and its helpers), each with one-thread plans.  Returns false
// (nothing done) where the geometry is not this one.
constexpr size_t kBlockBytes = size_t{1} << 20;  // a block's transform: about a core's L2
constexpr size_t kPlaneWiseMin = size_t{1} << 20;

template <typename Real>
bool PlaneWise(int32_t sign, const std::vector<int64_t>& n, const std::vector<int64_t>& axes,
               const std::vector<ptrdiff_t>& is, const std::vector<ptrdiff_t>& os, void* in,
               void* out, size_t bytes, unsigned flags, int threads, double scale, bool& ok) {
  const size_t rank = n.size();
  if (axes.size() != 1 || in == out || bytes < kPlaneWiseMin) return false;
  const int64_t a = axes[0];
  int64_t ci = -1, co = -1;
  for (size_t i = 0; i < rank; ++i) {
    if (n[i] > 1 && is[i] == 1) ci = i;
    if (n[i] > 1 && os[i] == 1) co = i;
  }
  const bool inverse = ci == a;  // reads `a` contiguous, writes `c` contiguous
  if (ci < 0 || co < 0 || (ci == a) == (co == a) || n[a] < 8) return false;
  const int64_t c = inverse ? co : ci;
  if (n[c] < 8) return false;
  const ptrdiff_t na = n[a], nc = n[c];
  const size_t elem = 2 * sizeof(Real);
  const ptrdiff_t cb = std::max<ptrdiff_t>(
      1, std::min<ptrdiff_t>(nc, static_cast<ptrdiff_t>(kBlockBytes / (na * elem))));
  const ptrdiff_t blocks = (nc + cb - 1) / cb;
  std::vector<int64_t> planes;  // the other axes
  int64_t count = 1;
  for (size_t i = 0; i < rank; ++i)
    if (static_cast<int64_t>(i) != a && static_cast<int64_t>(i) != c) {
      planes.push_back(i);
      count *= n[i];
    }
  const int64_t tasks = count * blocks;
  // Split among the threads that run: with fewer blocks than `threads`, a split by `threads`
  // left blocks to threads never started, and their planes untransformed.
  const int used = static_cast<int>(std::min<int64_t>(std::max(threads, 1), tasks));
  const Real s = static_cast<Real>(scale);
  Real* const x = static_cast<Real*>(in);
  Real* const y = static_cast<Real*>(out);
  std::atomic<bool> good{true};
  auto work = [&](int t) {
    const int64_t begin = tasks * t / used, end = tasks * (t + 1) / used;
    Real* tmp = nullptr;
    if (inverse) {
      tmp = reinterpret_cast<Real*>(scratch.get(cb * na * elem));
      if (!tmp) return void(good = false);
    }
    for (int64_t task = begin; task < end && good; ++task) {
      int64_t p = task / blocks;
      const ptrdiff_t c0 = (task % blocks) * cb, rows = std::min(cb, nc - c0);
      ptrdiff_t io = c0 * is[c], oo = c0 * os[c];  // offsets in complex elements
      for (size_t k = planes.size(); k-- > 0;) {
        const int64_t i = planes[k];
        io += (p % n[i]) * is[i];
        oo += (p % n[i]) * os[i];
        p /= n[i];
      }
      Real* src = x + 2 * io;
      Real* dst = y + 2 * oo;
      if (inverse) {  // transform rows of `a` into tmp (rows x na), then transpose into `out`
        Geometry g{{{na, 1, 1}}, {{rows, is[c], na}}};
        fftw_plan_t plan = Plan<Real>(kC2C, sign, g, {}, src, tmp,
                                      ((rows - 1) * is[c] + na) * elem, rows * na * elem,
                                      flags | kPreserveInput, 1);
        if (!plan) return void(good = false);
        ExecPlan<Real>(kC2C, plan, src, tmp);
        Transpose<Real>(tmp, na, rows, na, dst, os[a], s);
      } else {  // transpose into `out`, where `a` is contiguous, then transform it there
        Transpose<Real>(src, is[a], na, rows, dst, os[c], Real(1));
        Geometry g{{{na, 1, 1}}, {{rows, os[c], os[c]}}};
        const size_t extent = ((rows - 1) * os[c] + na) * elem;
        fftw_plan_t plan = Plan<Real>(kC2C, sign, g, {}, dst, dst, extent, extent, flags, 1);
        if (!plan) return void(good = false);
        ExecPlan<Real>(kC2C, plan, dst, dst);
        for (ptrdiff_t r = 0; r < rows; ++r) Scale<Real>(dst + 2 * r * os[c], 2 * na, scale, 1);
      }
    }
  };
  helpers.Run(used, work);
  ok = good;
  return true;
}

template <typename Real>
ffi::Error Run(int32_t kind, int32_t sign, const std::vector<int64_t>& axes,
               const std::vector<int64_t>& r2r_kinds, double scale, unsigned planner,
               bool complex_data, const std::vector<int64_t>& in_shape,
               const std::vector<int64_t>& out_shape, const std::vector<ptrdiff_t>& out_strides,
               void* in, void* out, size_t in_bytes, size_t out_bytes, int threads,
               const std::vector<ptrdiff_t>& is) {
  // out_shape, out_strides: the output's logical shape (in the input's axis order) and each
  // logical axis's stride in the buffer (row-major, or permuted: `out_order`).
  // `is`: each logical input axis's stride (row-major, or a window's: `ImplWindow`).
  using A = Api<Real>;
  const auto fail = [] { return ffi::Error(ffi::ErrorCode::kInternal, "FFTW returned no plan"); };
  if (kind == kC2C || kind == kR2R) {
    // Out of place, XLA's input must survive (in place: the input was donated to us).
    unsigned flags = planner | (in == out ? 0u : kPreserveInput);
    bool ok = true;
    if (kind == kC2C && PlaneWise<Real>(sign, in_shape, axes, is, out_strides, in, out,
                                        out_bytes, flags, threads, scale, ok))
      return ok ? ffi::Error::Success() : fail();
    Geometry g = MakeGeometry(in_shape, axes, is, out_strides,
                              kind == kR2R && complex_data ? 2 : 1);
    // (strides in complex elements for c2c, in reals for r2r: MakeGeometry's unit)
    const size_t unit = kind == kR2R ? sizeof(Real) : 2 * sizeof(Real);
    if (!Execute<Real>(kind, sign, g, r2r_kinds, in, out, in_bytes, out_bytes, flags, threads,
                       unit, unit, scale))
      return fail();
    return ffi::Error::Success();
  } else if (kind == kR2C) {
    Geometry g = MakeGeometry(in_shape, axes, is, out_strides, 1);
    if (!Execute<Real>(kind, 0, g, {}, in, out, in_bytes, out_bytes, planner | kPreserveInput,
                       threads, sizeof(Real), 2 * sizeof(Real), scale))
      return fail();
    return ffi::Error::Success();
  } else {  // c2r: the logical shape is the output's
    std::vector<int64_t> last{axes.back()};
    if (axes.size() == 1) {
      Geometry g = MakeGeometry(out_shape, last, is, out_strides, 1);
      if (!Execute<Real>(kind, 0, g, {}, in, out, in_bytes, out_bytes, planner | kPreserveInput,
                         threads, 2 * sizeof(Real), sizeof(Real), scale))
        return fail();
      return ffi::Error::Success();
    } else {
      // c2c over the leading axes into scratch, then a 1-D c2r that may destroy the scratch.
      char* tmp = scratch.get(in_bytes);
      if (!tmp) return ffi::Error(ffi::ErrorCode::kResourceExhausted, "no scratch memory");
      std::vector<int64_t> lead(axes.begin(), axes.end() - 1);
      Geometry g1 = MakeGeometry(in_shape, lead, is, is, 1);
      fftw_plan_t p1 = Plan<Real>(kC2C, +1, g1, {}, in, tmp, in_bytes, in_bytes,
                                  planner | kPreserveInput, threads);
      if (!p1) return fail();
      A::exec_dft(p1, in, tmp);
      Geometry g2 = MakeGeometry(out_shape, last, is, out_strides, 1);
      if (!Execute<Real>(kind, 0, g2, {}, tmp, out, in_bytes, out_bytes, planner | kDestroyInput,
                         threads, 2 * sizeof(Real), sizeof(Real), scale))
        return fail();
    }
  }
  return ffi::Error::Success();
}

// The output's logical shape and each logical axis's stride, from the buffer's shape and
// strides and `out_order` (buffer axis k is logical axis out_order[k]); false where out_order is
// not a permutation of the buffer's axes' count.
bool Ordered(const std::vector<int64_t>& buffer, const std::vector<ptrdiff_t>& strides,
             ffi::Span<const int64_t> out_order, std::vector<int64_t>& shape,
             std::vector<ptrdiff_t>& logical) {
  if (out_order.size() != buffer.size()) return false;
  shape.assign(buffer.size(), 0);
  logical.assign(buffer.size(), 0);
  for (size_t k = 0; k < buffer.size(); ++k) {
    const int64_t a = out_order[k];
    if (a < 0 || a >= static_cast<int64_t>(buffer.size())) return false;
    shape[a] = buffer[k];
    logical[a] = strides[k];
  }
  return true;
}

ffi::Error Impl(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y, int32_t kind, int32_t sign,
                ffi::Span<const int64_t> axes, ffi::Span<const int64_t> r2r_kinds, double scale,
                int32_t planner, bool huge_pages, int32_t threads,
                ffi::Span<const int64_t> out_order) {
  auto dt = x.element_type(), ot = y->element_type();
  bool dbl = dt == ffi::DataType::F64 || dt == ffi::DataType::C128;
  bool cplx = dt == ffi::DataType::C64 || dt == ffi::DataType::C128;
  bool ocplx = ot == ffi::DataType::C64 || ot == ffi::DataType::C128;
  bool known = dt == ffi::DataType::F32 || dt == ffi::DataType::F64 || cplx;
  bool ok = known && (kind == kC2C   ? cplx && ocplx
                      : kind == kR2C ? !cplx && ocplx
                      : kind == kC2R ? cplx && !ocplx
                                     : cplx == ocplx);
  // No axes: a c2c of rank 0, FFTW's copy, writing `out_order` (`kernel.permute`).
  if (!ok || (axes.size() == 0 && kind != kC2C))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_fftw: bad dtypes or axes");
  std::vector<int64_t> in_shape(x.dimensions().begin(), x.dimensions().end());
  std::vector<int64_t> y_shape(y->dimensions().begin(), y->dimensions().end());
  // The output buffer holds the logical result transposed: buffer axis k is logical axis
  // out_order[k] (identity: written as computed).  FFTW writes it there through its strides.
  std::vector<int64_t> out_shape;
  std::vector<ptrdiff_t> out_strides;
  if (!Ordered(y_shape, Strides(y_shape, 1), out_order, out_shape, out_strides))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_fftw: bad out_order");
  std::vector<int64_t> ax(axes.begin(), axes.end()), rk(r2r_kinds.begin(), r2r_kinds.end());
  if (kind != kR2R) rk.clear();
  if (huge_pages) HugePages(y->untyped_data(), y->size_bytes());
  auto run = dbl ? Run<double> : Run<float>;
  return run(kind, sign, ax, rk, scale, static_cast<unsigned>(planner), cplx, in_shape, out_shape,
             out_strides, x.untyped_data(), y->untyped_data(), x.size_bytes(), y->size_bytes(),
             std::max(threads, 1), Strides(in_shape, 1));
}

// The elements of a strided array (`shape`, `strides` in complex elements) times `scale`.
template <typename Real>
void ScaleStrided(Real* x, const std::vector<int64_t>& shape, const std::vector<ptrdiff_t>& strides,
                  size_t axis, Real scale) {
  if (axis + 1 == shape.size()) {
    for (int64_t i = 0; i < shape[axis]; ++i) {
      x[2 * i * strides[axis]] *= scale;
      x[2 * i * strides[axis] + 1] *= scale;
    }
    return;
  }
  for (int64_t i = 0; i < shape[axis]; ++i)
    ScaleStrided<Real>(x + 2 * i * strides[axis], shape, strides, axis + 1, scale);
}

// One byte past the last element a strided view reaches, from its first (`unit` bytes each).
size_t Extent(const std::vector<int64_t>& shape, const std::vector<ptrdiff_t>& strides,
              size_t unit) {
  ptrdiff_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) last += (shape[i] - 1) * strides[i];
  return (last + 1) * unit;
}

// Reads one byte of every cache line of a strided view (`shape`, `strides` in elements of
// `unit` bytes) before a transform reads it.  A window's rows lie a plane apart in a block far
// larger than the caches, and FFTW, reading them row by row in place, waited on memory for each:
// the pipelined round trip took 1.12-1.15x the one whose pieces were copied out of the block
// first (XLA's copy streams them).  These plain loads (not prefetch hints, which the core
// drops once its few line-fill buffers are busy) bring the piece into the cache the same way:
// 1.03-1.04x (issue 66, mpirun -np 2, 256^3 in 128 pieces).
void Touch(const char* base, const std::vector<int64_t>& shape,
           const std::vector<ptrdiff_t>& strides, size_t unit, size_t axis = 0) {
  if (shape.empty()) return;
  const size_t last = shape.size() - 1;
  if (axis == last || (axis + 1 == last && strides[last] == 1)) {
    // the innermost runs (one contiguous run per index of `axis` where the last stride is 1)
    const int64_t runs = axis == last ? 1 : shape[axis];
    const size_t bytes = strides[last] == 1 ? shape[last] * unit : unit;
    for (int64_t r = 0; r < runs; ++r) {
      const char* row = base + (axis == last ? 0 : r * strides[axis] * unit);
      for (size_t b = 0; b < bytes; b += 64) (void)*reinterpret_cast<const volatile char*>(row + b);
    }
    return;
  }
  for (int64_t i = 0; i < shape[axis]; ++i)
    Touch(base + i * strides[axis] * unit, shape, strides, unit, axis + 1);
}

// A strided copy of complex elements (`shape`; strides `is`, `os` in complex elements) that
// transposes the input's contiguous axis with the output's: a tiled transpose (`Transpose`)
// for every index of the other axes.  A window's pack reads its rows a whole plane apart; FFTW's
// copy of that geometry read them in its innermost loop (1.3x the piece copied out and packed,
// issue 66).  Returns false (nothing done) where the geometry is not this one.
template <typename Real>
bool CopyTransposed(const Real* in, const std::vector<int64_t>& shape,
                    const std::vector<ptrdiff_t>& is, Real* out,
                    const std::vector<ptrdiff_t>& os) {
  int64_t ci = -1, co = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] > 1 && is[i] == 1) ci = i;
    if (shape[i] > 1 && os[i] == 1) co = i;
  }
  if (ci < 0 || co < 0 || ci == co) return false;
  std::vector<int64_t> rest;  // the other axes, and an odometer over them
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i)
    if (static_cast<int64_t>(i) != ci && static_cast<int64_t>(i) != co) {
      rest.push_back(i);
      count *= shape[i];
    }
  for (int64_t t = 0; t < count; ++t) {
    ptrdiff_t io = 0, oo = 0;
    for (size_t k = rest.size(), p = t; k-- > 0;) {
      const int64_t i = rest[k];
      io += (p % shape[i]) * is[i];
      oo += (p % shape[i]) * os[i];
      p /= shape[i];
    }
    Transpose<Real>(in + 2 * io, is[co], shape[co], shape[ci], out + 2 * oo, os[ci], Real(1));
  }
  return true;
}

// A complex FFT (or, with no axes, FFTW's copy) of one piece of a block, for the pipelined
// stages (pipeline.py): the pieces are read from, and written into, the block itself at an
// offset known only when the program runs, so that no piece needs a buffer of its own.
//
// `in_dims`, `out_dims`: the logical shapes the input and output buffers are read as (row-major,
// the buffers' own sizes).  `in_cut` >= 0: the input is the `m` entries of in_dims' axis
// `in_cut` from entry `offset`; `out_cut` >= 0: the output is written there in the output
// buffer (which XLA aliased to an operand: the block, kept around the piece).  `out_order` as
// `Impl`'s, over the output window's axes.
ffi::Error ImplWindow(ffi::AnyBuffer x, ffi::AnyBuffer offset, ffi::RemainingArgs,
                      ffi::Result<ffi::AnyBuffer> y, int32_t sign, ffi::Span<const int64_t> axes,
                      double scale, int32_t planner, int32_t threads,
                      ffi::Span<const int64_t> out_order, ffi::Span<const int64_t> in_dims,
                      ffi::Span<const int64_t> out_dims, int64_t in_cut, int64_t out_cut,
                      int64_t m) {
  auto dt = x.element_type();
  bool dbl = dt == ffi::DataType::C128;
  if ((dt != ffi::DataType::C64 && !dbl) || y->element_type() != dt ||
      offset.element_type() != ffi::DataType::S32)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_fftw_window: bad dtypes");
  const size_t elem = dbl ? 16 : 8;
  std::vector<int64_t> in_shape(in_dims.begin(), in_dims.end());
  std::vector<int64_t> buffer(out_dims.begin(), out_dims.end());
  auto count = [](const std::vector<int64_t>& v) {
    int64_t c = 1;
    for (int64_t d : v) c *= d;
    return c;
  };
  const int64_t off = *static_cast<const int32_t*>(offset.untyped_data());
  if (count(in_shape) * static_cast<int64_t>(elem) != static_cast<int64_t>(x.size_bytes()) ||
      count(buffer) * static_cast<int64_t>(elem) != static_cast<int64_t>(y->size_bytes()) ||
      in_cut >= static_cast<int64_t>(in_shape.size()) ||
      out_cut >= static_cast<int64_t>(buffer.size()) || off < 0 ||
      (in_cut >= 0 && off + m > in_shape[in_cut]) || (out_cut >= 0 && off + m > buffer[out_cut]))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_fftw_window: bad window");
  const auto is = Strides(in_shape, 1);
  char* in = static_cast<char*>(x.untyped_data());
  if (in_cut >= 0) {
    in += off * is[in_cut] * elem;
    in_shape[in_cut] = m;
  }
  const auto bs = Strides(buffer, 1);
  char* out = static_cast<char*>(y->untyped_data());
  if (out_cut >= 0) {
    out += off * bs[out_cut] * elem;
    buffer[out_cut] = m;
  }
  std::vector<int64_t> out_shape;
  std::vector<ptrdiff_t> out_strides;
  if (!Ordered(buffer, bs, out_order, out_shape, out_strides))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_fftw_window: bad out_order");
  if (out_shape != in_shape)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_fftw_window: bad shapes");
  std::vector<int64_t> ax(axes.begin(), axes.end());
  if (in_cut >= 0) Touch(in, in_shape, is, elem);
  if (ax.empty() && in != out) {
    const bool done =
        dbl ? CopyTransposed<double>(reinterpret_cast<const double*>(in), in_shape, is,
                                     reinterpret_cast<double*>(out), out_strides)
            : CopyTransposed<float>(reinterpret_cast<const float*>(in), in_shape, is,
                                    reinterpret_cast<float*>(out), out_strides);
    if (done) return ffi::Error::Success();
  }
  // Scaled here, over the window only (Run's own scaling is of the whole span it writes).
  auto run = dbl ? Run<double> : Run<float>;
  ffi::Error e = run(kC2C, sign, ax, {}, 1.0, static_cast<unsigned>(planner), true, in_shape,
                     out_shape, out_strides, in, out, Extent(in_shape, is, elem),
                     Extent(out_shape, out_strides, elem), std::max(threads, 1), is);
  if (e.failure() || scale == 1.0) return e;
  if (dbl)
    ScaleStrided<double>(reinterpret_cast<double*>(out), out_shape, out_strides, 0, scale);
  else
    ScaleStrided<float>(reinterpret_cast<float*>(out), out_shape, out_strides, 0,
                        static_cast<float>(scale));
  return e;
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftFftw, Impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("kind")
                                  .Attr<int32_t>("sign")
                                  .Attr<ffi::Span<const int64_t>>("axes")
                                  .Attr<ffi::Span<const int64_t>>("r2r_kinds")
                                  .Attr<double>("scale")
                                  .Attr<int32_t>("planner")
                                  .Attr<bool>("huge_pages")
                                  .Attr<int32_t>("threads")
                                  .Attr<ffi::Span<const int64_t>>("out_order"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftFftwWindow, ImplWindow,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("sign")
                                  .Attr<ffi::Span<const int64_t>>("axes")
                                  .Attr<double>("scale")
                                  .Attr<int32_t>("planner")
                                  .Attr<int32_t>("threads")
                                  .Attr<ffi::Span<const int64_t>>("out_order")
                                  .Attr<ffi::Span<const int64_t>>("in_dims")
                                  .Attr<ffi::Span<const int64_t>>("out_dims")
                                  .Attr<int64_t>("in_cut")
                                  .Attr<int64_t>("out_cut")
                                  .Attr<int64_t>("m"));

// The number of cached plans (for the tests: a repeated shape must not plan again).
extern "C" int64_t PencilfftFftwPlanCount() {
  std::lock_guard<std::mutex> lock(plan_mutex);
  return static_cast<int64_t>(plans.size());
}
