"""Painting and readout on one block of cells: pure JAX, and the CPU kernel (`paint.cc`).

The per-device work of `pencilfft.paint` / `readout` (`paint.py`), on local arrays only:

    paint_block(dx, v)  -> g (C, nx, ny, nz)   g[c] = sum_p v[c, p] W(x_p - cell)
    read_block(g, dx)   -> (C, bx, by, Z)      out[c, p] = sum_cells g[c, cell] W(x_p - cell)

where particle p = site (i, j, k) of the (bx, by, Z) lattice block sits at x_p = (i + ox, j + oy,
k) + dx[i, j, k] in the cells of g, every cell index taken modulo g's shape (periodic; on a
split axis the caller pads the block so that nothing wraps); `absolute=True` (catalogs) puts
every particle at (ox, oy, 0) + dx, its site ignored.  `deriv=True` gives the derivative
in the particle positions instead: paint spreads a vector v[c, p, :] (3 components) with the
window's gradient, readout returns the gradient (C, bx, by, Z, 3).  These four maps are closed
under jvp and transposition: readout is paint's transpose in v and g, and the derivatives in dx
are the deriv=True maps (second derivatives in dx are not provided).

Both are primitives (`paint_p`, `read_p`) when the kernel is in use: on CPU they lower to the
custom call of `paint.cc` (threads per device: `_threads_per_device`), on every other
platform (GPUs) and on CPU without the kernel to the pure-JAX code below (XLA's scatter-add and
gathers).  PENCILFFT_PAINT_KERNEL = "auto" (default: the kernel if it builds, else pure JAX
with one warning), "native" (the same), or "xla" (the primitives are not even bound: plain JAX,
which also differentiates to any order).
"""
from __future__ import annotations

import functools
import math
import os
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._native import build as _native, threads as _threads
from .window import WINDOWS, derivatives, weights

__all__ = ["paint_block", "read_block", "kernel", "TARGETS", "paint_p", "read_p"]

KERNELS = ("auto", "native", "xla")
TARGETS = ("pencilfft_paint", "pencilfft_readout")
_WINDOW_CODE = {"ngp": 1, "cic": 2, "tsc": 3, "pcs": 4}


# ----------------------------------------------------------------------------------------------
# Configuration and the library


def _setting() -> str:
    value = os.environ.get("PENCILFFT_PAINT_KERNEL", "").strip().lower() or "auto"
    if value not in KERNELS:
        raise ValueError(f"environment variable PENCILFFT_PAINT_KERNEL must be one of "
                         f"{', '.join(KERNELS)}; got {value!r}")
    return value


def _threads_per_device() -> int:
    """Threads each CPU device's painting may use: the FFT kernel's rule (`_native.threads`: the
    cores this process may run on, shared by its CPU devices; PENCILFFT_THREADS)."""
    return _threads.threads_per_device()


@functools.cache
def _library():
    """The built, registered paint library, or why it cannot be had (a string)."""
    try:
        lib = _native.register(_native.load(pathlib.Path(__file__).with_name("paint.cc")),
                               {TARGETS[0]: "PencilfftPaint", TARGETS[1]: "PencilfftReadout"})
    except (_native.BuildError, AttributeError, OSError) as e:
        return str(e)
    return lib


@functools.cache
def _warn_once(why: str) -> None:
    warnings.warn(f"pencilfft: the CPU paint kernel is unavailable, painting and readout use "
                  f"XLA's scatter and gather (slower on CPU; PENCILFFT_PAINT_KERNEL=xla silences "
                  f"this): {why}", RuntimeWarning, stacklevel=3)


def kernel() -> str:
    """What paints on CPU devices now: "native" (the custom call) or "xla"."""
    if _setting() == "xla":
        return "xla"
    lib = _library()
    if isinstance(lib, str):
        _warn_once(lib)
        return "xla"
    return "native"


# ----------------------------------------------------------------------------------------------
# Pure JAX (the reference, the GPU programs, the fallback)


def _axis_cells(dx_d, site, off: int, n: int, window: str, deriv: bool):
    """Per axis: the s cell indices (mod n), the s weights and (deriv) their derivatives."""
    s = WINDOWS[window]
    t = dx_d + (1 - s / 2)
    fl = jnp.floor(t)
    u = t - fl
    base = site + off + fl.astype(jnp.int32)
    idx = [jnp.mod(base + j, n) for j in range(s)]
    return idx, weights(u, window), (derivatives(u, window) if deriv else None)


def _corners(dx, offset, shape, window: str, deriv: bool, absolute: bool = False):
    """For each of the s^3 cells a particle touches: its flat index in g (shape) and its
    weight (deriv: the 3 components of the weight's gradient).  `absolute`: every particle's
    site is (0, 0, 0) (catalogs: dx is the position)."""
    bx, by, bz = dx.shape[:3]
    sites = [jnp.zeros((), jnp.int32) if absolute else
             jnp.arange(b, dtype=jnp.int32).reshape([-1 if a == d else 1 for a in range(3)])
             for d, b in enumerate((bx, by, bz))]
    axes = [_axis_cells(dx[..., d], sites[d], (offset + (0,))[d], shape[d], window, deriv)
            for d in range(3)]
    nynz, nz = shape[1] * shape[2], shape[2]
    s = WINDOWS[window]
    out = []
    for a in range(s):
        for b in range(s):
            for c in range(s):
                (ix, wx, gx), (iy, wy, gy), (iz, wz, gz) = axes
                flat = ix[a] * nynz + iy[b] * nz + iz[c]
                if deriv:
                    w = (gx[a] * wy[b] * wz[c], wx[a] * gy[b] * wz[c], wx[a] * wy[b] * gz[c])
                else:
                    w = wx[a] * wy[b] * wz[c]
                out.append((flat, w))
    return out


def paint_block_xla(dx, v, *, offset, shape, window, deriv, absolute=False):
    """g (C, *shape) from v (C, bx, by, Z) (deriv: (C, bx, by, Z, 3)): XLA's scatter-add."""
    C = v.shape[0]
    corners = _corners(dx, offset, shape, window, deriv, absolute)
    flat = jnp.stack([f for f, _ in corners]).reshape(-1)
    if deriv:
        vals = jnp.stack([sum(v[..., d] * w[d] for d in range(3)) for _, w in corners], axis=1)
    else:
        vals = jnp.stack([v * w for _, w in corners], axis=1)
    vals = vals.reshape(C, -1).astype(v.dtype)
    n = math.prod(shape)
    # A 1-D scatter per channel (XLA compiles it faster than a 3-D one, see benchmarks/pm.py).
    if C == 1:
        g = jnp.zeros(n, v.dtype).at[flat].add(vals[0])[None]
    else:
        g = jnp.zeros((C, n), v.dtype).at[:, flat].add(vals)
    return g.reshape((C,) + tuple(shape))


def read_block_xla(g, dx, *, offset, window, deriv, absolute=False):
    """(C, bx, by, Z) (deriv: (C, bx, by, Z, 3)) values of g (C, nx, ny, nz) at the particles."""
    C = g.shape[0]
    flat_g = g.reshape(C, -1)
    out = 0
    for flat, w in _corners(dx, offset, g.shape[1:], window, deriv, absolute):
        vals = flat_g[:, flat]
        out = out + (jnp.stack([vals * wd for wd in w], axis=-1) if deriv else vals * w)
    return out.astype(g.dtype)


# ----------------------------------------------------------------------------------------------
# What _paint calls


def _varying(*xs):
    """xs typed as varying (in shard_map) over every mesh axis any of them varies over: the
    primitives' transposes then give each cotangent its input's type (pcast's transpose is the
    psum that a replicated input, e.g. scalar weights, needs)."""
    axes = [getattr(getattr(jax.typeof(x), "manual_axis_type", None), "varying", frozenset())
            for x in xs]
    union = frozenset().union(*axes)
    return [x if not (union - a) else jax.lax.pcast(x, tuple(sorted(union - a)), to="varying")
            for x, a in zip(xs, axes)]


def paint_block(dx, v, *, offset, shape, window: str, deriv: bool = False,
                absolute: bool = False):
    dx, v = _varying(dx, v)
    if _setting() == "xla":
        return paint_block_xla(dx, v, offset=offset, shape=tuple(shape), window=window,
                               deriv=deriv, absolute=absolute)
    return paint_p.bind(dx, v, offset=tuple(offset), shape=tuple(shape), window=window,
                        deriv=deriv, absolute=absolute)


def read_block(g, dx, *, offset, window: str, deriv: bool = False, absolute: bool = False):
    g, dx = _varying(g, dx)
    if _setting() == "xla":
        return read_block_xla(g, dx, offset=offset, window=window, deriv=deriv,
                              absolute=absolute)
    return read_p.bind(g, dx, offset=tuple(offset), window=window, deriv=deriv,
                       absolute=absolute)


# ----------------------------------------------------------------------------------------------
# The primitives


paint_p = Primitive("pencilfft_paint_block")
read_p = Primitive("pencilfft_read_block")


def _out_aval(shape, dtype, a, b):
    """The output's abstract value: varying (in shard_map) over the axes either input varies
    over, on the inputs' mesh with no split of its own (it only runs per device)."""
    types = [x.manual_axis_type for x in (a, b)]
    mat = types[0]
    varying = types[0].varying | types[1].varying
    if varying != mat.varying:
        mat = mat.update(varying=varying)
    sharding = a.sharding
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None:
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.core.ShapedArray(shape, dtype, sharding=sharding, manual_axis_type=mat)


def _paint_abstract(dx, v, *, offset, shape, window, deriv, absolute):
    return _out_aval((v.shape[0],) + tuple(shape), v.dtype, v, dx)


def _read_abstract(g, dx, *, offset, window, deriv, absolute):
    shape = (g.shape[0],) + tuple(dx.shape[:3]) + ((3,) if deriv else ())
    return _out_aval(shape, g.dtype, g, dx)


def _paint_impl(dx, v, **params):
    return jax.jit(functools.partial(paint_p.bind, **params))(dx, v)


def _read_impl(g, dx, **params):
    return jax.jit(functools.partial(read_p.bind, **params))(g, dx)


def _no_second(deriv: bool, what: str) -> None:
    if deriv:
        raise NotImplementedError(
            f"pencilfft: second derivatives of {what} with respect to the positions are not "
            "implemented by the paint kernel; set PENCILFFT_PAINT_KERNEL=xla for plain JAX")


def _paint_jvp(primals, tangents, *, offset, shape, window, deriv, absolute):
    dx, v = primals
    tdx, tv = tangents
    params = dict(offset=offset, shape=shape, window=window, absolute=absolute)
    y = paint_p.bind(dx, v, deriv=deriv, **params)
    out = None
    if type(tv) is not ad.Zero:
        out = paint_p.bind(dx, tv, deriv=deriv, **params)
    if type(tdx) is not ad.Zero:
        _no_second(deriv, "paint")
        vt = v[..., None] * tdx[None].astype(v.dtype)
        d = paint_p.bind(dx, vt, deriv=True, **params)
        out = d if out is None else out + d
    if out is None:
        return y, ad.Zero.from_primal_value(y)
    return y, out


def _paint_transpose(ct, dx, v, *, offset, shape, window, deriv, absolute):
    if ad.is_undefined_primal(dx):
        raise ValueError("pencilfft: paint is not linear in the positions")
    if type(ct) is ad.Zero:
        return None, ad.Zero(v.aval)
    return None, read_p.bind(ct, dx, offset=offset, window=window, deriv=deriv,
                             absolute=absolute)


def _read_jvp(primals, tangents, *, offset, window, deriv, absolute):
    g, dx = primals
    tg, tdx = tangents
    params = dict(offset=offset, window=window, absolute=absolute)
    y = read_p.bind(g, dx, deriv=deriv, **params)
    out = None
    if type(tg) is not ad.Zero:
        out = read_p.bind(tg, dx, deriv=deriv, **params)
    if type(tdx) is not ad.Zero:
        _no_second(deriv, "readout")
        grad = read_p.bind(g, dx, deriv=True, **params)
        d = jnp.sum(grad * tdx[None].astype(grad.dtype), axis=-1)
        out = d if out is None else out + d
    if out is None:
        return y, ad.Zero.from_primal_value(y)
    return y, out


def _read_transpose(ct, g, dx, *, offset, window, deriv, absolute):
    if ad.is_undefined_primal(dx):
        raise ValueError("pencilfft: readout is not linear in the positions")
    if type(ct) is ad.Zero:
        return ad.Zero(g.aval), None
    shape = g.aval.shape[1:]
    return paint_p.bind(dx, ct, offset=offset, shape=tuple(shape), window=window,
                        deriv=deriv, absolute=absolute), None


def _batch(prim, args, dims, **params):
    """vmap: one call per batch element (lax.map); the kernel takes no extra leading axis."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    args = [jnp.broadcast_to(a, (size,) + a.shape) if d is None
            else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    return jax.lax.map(lambda xs: prim.bind(*xs, **params), tuple(args)), 0


def _paint_xla_lowering(ctx, dx, v, **params):
    return mlir.lower_fun(paint_block_xla, multiple_results=False)(ctx, dx, v, **params)


def _read_xla_lowering(ctx, g, dx, **params):
    return mlir.lower_fun(read_block_xla, multiple_results=False)(ctx, g, dx, **params)


def _usable(*avals) -> bool:
    dtypes = {np.dtype(a.dtype) for a in avals}
    return (len(dtypes) == 1 and dtypes <= {np.dtype(np.float32), np.dtype(np.float64)}
            and all(0 not in a.shape for a in avals) and kernel() == "native")


def _paint_cpu_lowering(ctx, dx, v, *, offset, shape, window, deriv, absolute):
    params = dict(offset=offset, shape=shape, window=window, deriv=deriv, absolute=absolute)
    if not _usable(*ctx.avals_in):
        return _paint_xla_lowering(ctx, dx, v, **params)
    return jax.ffi.ffi_lowering(TARGETS[0])(
        ctx, dx, v, window=np.int32(_WINDOW_CODE[window]), deriv=bool(deriv),
        offset=np.asarray(offset, np.int64), threads=np.int64(_threads_per_device()),
        absolute=bool(absolute))


def _read_cpu_lowering(ctx, g, dx, *, offset, window, deriv, absolute):
    params = dict(offset=offset, window=window, deriv=deriv, absolute=absolute)
    if not _usable(*ctx.avals_in):
        return _read_xla_lowering(ctx, g, dx, **params)
    return jax.ffi.ffi_lowering(TARGETS[1])(
        ctx, g, dx, window=np.int32(_WINDOW_CODE[window]), deriv=bool(deriv),
        offset=np.asarray(offset, np.int64), threads=np.int64(_threads_per_device()),
        absolute=bool(absolute))


paint_p.def_abstract_eval(_paint_abstract)
paint_p.def_impl(_paint_impl)
ad.primitive_jvps[paint_p] = _paint_jvp
ad.primitive_transposes[paint_p] = _paint_transpose
batching.primitive_batchers[paint_p] = functools.partial(_batch, paint_p)
mlir.register_lowering(paint_p, _paint_xla_lowering)
mlir.register_lowering(paint_p, _paint_cpu_lowering, platform="cpu")

read_p.def_abstract_eval(_read_abstract)
read_p.def_impl(_read_impl)
ad.primitive_jvps[read_p] = _read_jvp
ad.primitive_transposes[read_p] = _read_transpose
batching.primitive_batchers[read_p] = functools.partial(_batch, read_p)
mlir.register_lowering(read_p, _read_xla_lowering)
mlir.register_lowering(read_p, _read_cpu_lowering, platform="cpu")
