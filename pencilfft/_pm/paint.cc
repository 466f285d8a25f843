// pencilfft's CPU paint and readout kernels: two XLA FFI handlers (pencilfft/_paint_kernel.py).
//
// A block of particles on a lattice (bx, by, Z): particle p = site (i, j, k) sits at
// (i + ox, j + oy, k) + dx[i, j, k, :] in the cells of a grid g (C, nx, ny, nz), every index
// taken modulo the grid's shape; with `absolute` (catalogs) at (ox, oy, 0) + dx[i, j, k, :].  A window of support S (1 NGP, 2 CIC, 3 TSC, 4 PCS) gives the
// cells base .. base + S - 1 along each axis, base = floor(x + 1 - S/2), with weights that are
// polynomials in u = x + 1 - S/2 - base (the same formulas as pencilfft/_window.py).
//
//   paint:   g[c, cell] = sum_p v[c, p] W(p, cell)        (deriv: sum_p sum_d v[c, p, d] dW/dx_d)
//   readout: out[c, p]  = sum_cell g[c, cell] W(p, cell)  (deriv: out[c, p, d] with dW/dx_d)
//
// Threads (`threads`, computed by _paint_kernel._threads_per_device): readout splits the
// particles between threads (each writes its own outputs).  Paint with one thread goes through
// the particles in order; with several, each thread owns a slab of output rows (X) and paints,
// of the particles whose cells reach its rows (found by a counting sort of the particles by
// their first row, stable), only the cells in its rows: no two threads write one cell, and
// every cell receives its particles in the same order whatever the thread count > 1 (so the
// result is deterministic; it differs from one thread's only by the rounding of the order).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

inline int64_t Mod(int64_t a, int64_t n) {
  int64_t r = a % n;
  return r < 0 ? r + n : r;
}

// One axis of one particle: the S cell indices (mod n), weights and derivatives.
template <int S, typename R>
inline void Axis(R d, int64_t site, int64_t n, int64_t* idx, R* w, R* g) {
  R t = d + R(1.0 - S / 2.0);
  R fl = std::floor(t);
  R u = t - fl;
  int64_t base = site + static_cast<int64_t>(fl);
  for (int j = 0; j < S; ++j) idx[j] = Mod(base + j, n);
  R v = R(1) - u;
  if constexpr (S == 1) {
    w[0] = R(1);
    g[0] = R(0);
  } else if constexpr (S == 2) {
    w[0] = v, w[1] = u;
    g[0] = R(-1), g[1] = R(1);
  } else if constexpr (S == 3) {
    R m = u - R(0.5);
    w[0] = R(0.5) * v * v, w[1] = R(0.75) - m * m, w[2] = R(0.5) * u * u;
    g[0] = -v, g[1] = R(1) - R(2) * u, g[2] = u;
  } else {
    w[0] = v * v * v / R(6);
    w[1] = (R(4) - R(6) * u * u + R(3) * u * u * u) / R(6);
    w[2] = (R(4) - R(6) * v * v + R(3) * v * v * v) / R(6);
    w[3] = u * u * u / R(6);
    g[0] = R(-0.5) * v * v, g[1] = R(-2) * u + R(1.5) * u * u;
    g[2] = R(2) * v - R(1.5) * v * v, g[3] = R(0.5) * u * u;
  }
}

struct Geom {
  int64_t C, bx, by, bz, nx, ny, nz, ox, oy;
  bool absolute;  // catalogs: every particle's site is (0, 0, 0), dx its position
  int64_t M() const { return bx * by * bz; }
  int64_t N() const { return nx * ny * nz; }
};

// The cells and weights of particle p (site i, j, k).
template <int S, typename R>
struct Particle {
  int64_t ix[S], iy[S], iz[S];
  R wx[S], wy[S], wz[S], gx[S], gy[S], gz[S];
  void Set(const Geom& G, const R* dx, int64_t i, int64_t j, int64_t k) {
    if (G.absolute) i = j = k = 0;
    Axis<S, R>(dx[0], i + G.ox, G.nx, ix, wx, gx);
    Axis<S, R>(dx[1], j + G.oy, G.ny, iy, wy, gy);
    Axis<S, R>(dx[2], k, G.nz, iz, wz, gz);
  }
};

// Paint particles [rows r0, r1) x all (j, k), or (rows == nullptr) only the cells of output
// rows [o0, o1) of the particles listed in `order`.
template <int S, typename R, bool D>
void PaintParticle(const Geom& G, const Particle<S, R>& q, const R* v, int64_t p, R* g,
                   int64_t o0, int64_t o1) {
  const int64_t M = G.M(), N = G.N();
  for (int a = 0; a < S; ++a) {
    if (q.ix[a] < o0 || q.ix[a] >= o1) continue;
    for (int b = 0; b < S; ++b) {
      const int64_t row = (q.ix[a] * G.ny + q.iy[b]) * G.nz;
      for (int c = 0; c < S; ++c) {
        const int64_t cell = row + q.iz[c];
        if constexpr (D) {
          const R w0 = q.gx[a] * q.wy[b] * q.wz[c], w1 = q.wx[a] * q.gy[b] * q.wz[c],
                  w2 = q.wx[a] * q.wy[b] * q.gz[c];
          for (int64_t ch = 0; ch < G.C; ++ch) {
            const R* vv = v + (ch * M + p) * 3;
            g[ch * N + cell] += vv[0] * w0 + vv[1] * w1 + vv[2] * w2;
          }
        } else {
          const R w = q.wx[a] * q.wy[b] * q.wz[c];
          for (int64_t ch = 0; ch < G.C; ++ch) g[ch * N + cell] += v[ch * M + p] * w;
        }
      }
    }
  }
}

template <typename F>
void Parallel(int64_t threads, int64_t n, F f) {
  // f(t, lo, hi) on `threads` contiguous ranges of [0, n).
  threads = std::max<int64_t>(1, std::min(threads, n));
  if (threads == 1) {
    f(0, 0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t)
    pool.emplace_back(f, t, n * t / threads, n * (t + 1) / threads);
  f(0, 0, n / threads);
  for (auto& th : pool) th.join();
}

template <int S, typename R, bool D>
void Paint(const Geom& G, const R* dx, const R* v, R* g, int64_t threads) {
  std::memset(g, 0, sizeof(R) * G.C * G.N());
  const int64_t M = G.M();
  threads = std::max<int64_t>(1, std::min(threads, G.nx));
  if (threads == 1) {
    Particle<S, R> q;
    int64_t p = 0;
    for (int64_t i = 0; i < G.bx; ++i)
      for (int64_t j = 0; j < G.by; ++j)
        for (int64_t k = 0; k < G.bz; ++k, ++p) {
          q.Set(G, dx + 3 * p, i, j, k);
          PaintParticle<S, R, D>(G, q, v, p, g, 0, G.nx);
        }
    return;
  }
  // Bucket the particles by their first output row (a stable counting sort).
  std::vector<int32_t> first(M);
  Parallel(threads, G.bx, [&](int64_t, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      for (int64_t p = i * G.by * G.bz; p < (i + 1) * G.by * G.bz; ++p) {
        R t = dx[3 * p] + R(1.0 - S / 2.0);
        const int64_t site = G.absolute ? 0 : i;
        first[p] = static_cast<int32_t>(
            Mod(site + G.ox + static_cast<int64_t>(std::floor(t)), G.nx));
      }
  });
  std::vector<int64_t> start(G.nx + 1, 0);
  for (int64_t p = 0; p < M; ++p) ++start[first[p] + 1];
  for (int64_t r = 0; r < G.nx; ++r) start[r + 1] += start[r];
  std::vector<int64_t> order(M), fill(start.begin(), start.end() - 1);
  for (int64_t p = 0; p < M; ++p) order[fill[first[p]]++] = p;
  Parallel(threads, G.nx, [&](int64_t, int64_t o0, int64_t o1) {
    Particle<S, R> q;
    for (int64_t r = 0; r < G.nx; ++r) {
      bool reaches = false;  // does a particle starting on row r touch rows [o0, o1)?
      for (int a = 0; a < S; ++a) {
        int64_t row = (r + a) % G.nx;
        reaches |= row >= o0 && row < o1;
      }
      if (!reaches) continue;
      for (int64_t n = start[r]; n < start[r + 1]; ++n) {
        const int64_t p = order[n];
        const int64_t k = p % G.bz, j = (p / G.bz) % G.by, i = p / (G.bz * G.by);
        q.Set(G, dx + 3 * p, i, j, k);
        PaintParticle<S, R, D>(G, q, v, p, g, o0, o1);
      }
    }
  });
}

template <int S, typename R, bool D>
void Readout(const Geom& G, const R* g, const R* dx, R* out, int64_t threads) {
  const int64_t M = G.M(), N = G.N();
  Parallel(threads, G.bx, [&](int64_t, int64_t lo, int64_t hi) {
    Particle<S, R> q;
    for (int64_t i = lo; i < hi; ++i)
      for (int64_t j = 0; j < G.by; ++j)
        for (int64_t k = 0; k < G.bz; ++k) {
          const int64_t p = (i * G.by + j) * G.bz + k;
          q.Set(G, dx + 3 * p, i, j, k);
          for (int64_t ch = 0; ch < G.C; ++ch) {
            const R* gc = g + ch * N;
            R s = 0, s0 = 0, s1 = 0, s2 = 0;
            for (int a = 0; a < S; ++a)
              for (int b = 0; b < S; ++b) {
                const int64_t row = (q.ix[a] * G.ny + q.iy[b]) * G.nz;
                for (int c = 0; c < S; ++c) {
                  const R val = gc[row + q.iz[c]];
                  if constexpr (D) {
                    s0 += val * q.gx[a] * q.wy[b] * q.wz[c];
                    s1 += val * q.wx[a] * q.gy[b] * q.wz[c];
                    s2 += val * q.wx[a] * q.wy[b] * q.gz[c];
                  } else {
                    s += val * (q.wx[a] * q.wy[b] * q.wz[c]);
                  }
                }
              }
            if constexpr (D) {
              R* o = out + (ch * M + p) * 3;
              o[0] = s0, o[1] = s1, o[2] = s2;
            } else {
              out[ch * M + p] = s;
            }
          }
        }
  });
}

// Dispatch on (window support, precision, derivative) to the templates.
template <template <int, typename, bool> class Op, typename... A>
bool Dispatch(int32_t window, bool dbl, bool deriv, A&&... args) {
#define PENCILFFT_CASE(S)                                          \
  case S:                                                          \
    if (dbl) {                                                     \
      if (deriv) Op<S, double, true>::Run(args...);                \
      else Op<S, double, false>::Run(args...);                     \
    } else {                                                       \
      if (deriv) Op<S, float, true>::Run(args...);                 \
      else Op<S, float, false>::Run(args...);                      \
    }                                                              \
    return true;
  switch (window) {
    PENCILFFT_CASE(1)
    PENCILFFT_CASE(2)
    PENCILFFT_CASE(3)
    PENCILFFT_CASE(4)
  }
#undef PENCILFFT_CASE
  return false;
}

template <int S, typename R, bool D>
struct PaintOp {
  static void Run(const Geom& G, const void* dx, const void* v, void* g, int64_t threads) {
    Paint<S, R, D>(G, static_cast<const R*>(dx), static_cast<const R*>(v), static_cast<R*>(g),
                   threads);
  }
};

template <int S, typename R, bool D>
struct ReadOp {
  static void Run(const Geom& G, const void* g, const void* dx, void* out, int64_t threads) {
    Readout<S, R, D>(G, static_cast<const R*>(g), static_cast<const R*>(dx), static_cast<R*>(out),
                     threads);
  }
};

ffi::Error Check(ffi::AnyBuffer a, ffi::AnyBuffer b, bool* dbl) {
  auto t = a.element_type();
  if (t != b.element_type() || (t != ffi::DataType::F32 && t != ffi::DataType::F64))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_paint: float32 or float64");
  *dbl = t == ffi::DataType::F64;
  return ffi::Error::Success();
}

ffi::Error PaintImpl(ffi::AnyBuffer dx, ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> g,
                     int32_t window, bool deriv, ffi::Span<const int64_t> offset,
                     int64_t threads, bool absolute) {
  bool dbl;
  if (auto e = Check(dx, v, &dbl); e.failure()) return e;
  auto d = dx.dimensions(), o = g->dimensions();
  if (d.size() != 4 || o.size() != 4 || offset.size() != 2)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_paint: bad ranks");
  Geom G{o[0], d[0], d[1], d[2], o[1], o[2], o[3], offset[0], offset[1], absolute};
  if (!Dispatch<PaintOp>(window, dbl, deriv, G, dx.untyped_data(), v.untyped_data(),
                         g->untyped_data(), threads))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_paint: bad window");
  return ffi::Error::Success();
}

ffi::Error ReadImpl(ffi::AnyBuffer g, ffi::AnyBuffer dx, ffi::Result<ffi::AnyBuffer> out,
                    int32_t window, bool deriv, ffi::Span<const int64_t> offset,
                    int64_t threads, bool absolute) {
  bool dbl;
  if (auto e = Check(g, dx, &dbl); e.failure()) return e;
  auto d = dx.dimensions(), n = g.dimensions();
  if (d.size() != 4 || n.size() != 4 || offset.size() != 2)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_readout: bad ranks");
  Geom G{n[0], d[0], d[1], d[2], n[1], n[2], n[3], offset[0], offset[1], absolute};
  if (!Dispatch<ReadOp>(window, dbl, deriv, G, g.untyped_data(), dx.untyped_data(),
                        out->untyped_data(), threads))
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "pencilfft_readout: bad window");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftPaint, PaintImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("window")
                                  .Attr<bool>("deriv")
                                  .Attr<ffi::Span<const int64_t>>("offset")
                                  .Attr<int64_t>("threads")
                                  .Attr<bool>("absolute"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PencilfftReadout, ReadImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("window")
                                  .Attr<bool>("deriv")
                                  .Attr<ffi::Span<const int64_t>>("offset")
                                  .Attr<int64_t>("threads")
                                  .Attr<bool>("absolute"));
