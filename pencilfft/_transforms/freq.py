"""Angular wavenumbers laid out and sharded like the k-space arrays they multiply.

Each vector is shaped to broadcast against k in its layout (length 1 on the other two axes) and
split by the same mesh axis as that axis of k, so a kernel such as -1/k^2 or i*k applied to k
is purely local.  Padded positions (see `pfft3d`) hold 0.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from .plan import plan_backward, three_numbers

__all__ = ["fftfreq3d", "rfftfreq3d", "wavenumbers", "wavenumbers3d"]


def _spacings(d) -> tuple[float, float, float]:
    """(dx, dy, dz) from one number or three; each finite and non-zero."""
    spacings = three_numbers(d, "d", "(dx, dy, dz)")
    if not all(np.isfinite(v) and v != 0 for v in spacings):
        raise ValueError(f"`d` (the sample spacing) must be finite and non-zero; got {d!r}")
    return spacings


def _vectors(k, d, s, layout, mesh, kinds, caller: str):
    # The inverse transform's plan validates k against s exactly as its inverse would.
    plan = plan_backward(k, s, norm="backward", layout=layout, mesh=mesh, kinds=kinds,
                         caller=caller)
    padded = tuple(np.shape(k)[-3:]) == plan.k_shape
    X, Y, Z = plan.modes
    lengths = (X, plan.yp, plan.zp) if padded else (X, Y, plan.zc)
    spacings = _spacings(d)
    if plan.mesh is None and isinstance(k, jax.core.Tracer):
        # Under jit with the mesh left to the partitioner: constants (small: X + Y + Z values),
        # which every device slices as its use needs; traced iotas would be sharded by
        # propagation and then gathered.
        with jax.ensure_compile_time_eval():
            vectors = _make_vectors(plan=plan, lengths=lengths, spacings=spacings)
        return tuple(jnp.asarray(np.asarray(v)) for v in vectors)
    return _make_vectors(plan=plan, lengths=lengths, spacings=spacings)


# Static arguments only: jax caches one compiled program per (plan, lengths, spacings).
@functools.partial(jax.jit, static_argnames=("plan", "lengths", "spacings"))
def _make_vectors(*, plan, lengths, spacings):
    fdtype = jnp.float64 if np.dtype(plan.k_dtype) in (np.complex128, np.float64) else jnp.float32
    where = {"transposed": (2, 0, 1), "natural": (0, 1, 2)}[plan.layout]  # X, Y, Z positions
    axis_of = tuple(plan.k_spec)[-3:] if plan.mesh is not None else (None,) * 3
    sizes = dict(zip(plan.axes, plan.pdims))
    specs = []
    for pos in where:
        spec = [None, None, None]
        spec[pos] = axis_of[pos]
        specs.append(P(*spec))

    def block():
        """Each device computes its own slice of each vector: nothing is transferred."""
        out = []
        for n_true, n, d, pos, spec, kind in zip(plan.modes, lengths, spacings, where, specs,
                                                 plan.kinds):
            name = spec[pos]
            local = n // sizes[name] if name is not None else n
            start = jax.lax.axis_index(name) * local if name is not None else 0
            g = start + jnp.arange(local)
            n_valid = n_true // 2 + 1 if kind == "rfft" else n_true
            v = jnp.where(g < n_valid, wavenumbers(kind, g, n_true, d), 0)
            shape3 = [1, 1, 1]
            shape3[pos] = local
            out.append(v.astype(fdtype).reshape(shape3))
        return tuple(out)

    if plan.mesh is None:
        return block()
    return jax.shard_map(block, mesh=plan.mesh, in_specs=(), out_specs=tuple(specs))()


def wavenumbers(kind: str, m, n: int, d: float):
    """The angular wavenumber of mode m of an n-point transform of `kind` with spacing d: the
    k of its basis function (cos(k x) or sin(k x) for the DCTs and DSTs, on the grid each type
    samples: nodes n*d for types 1 and 3, cell centres (n + 1/2)*d for types 2 and 4)."""
    if kind == "fft":
        return (2 * np.pi / (n * d)) * jnp.where(m < (n + 1) // 2, m, m - n)
    if kind == "rfft":
        return (2 * np.pi / (n * d)) * m
    length, shift = _R2R_BASIS[kind]
    return (np.pi / ((n + length) * d)) * (m + shift)


# kind -> (L - n in points, the mode's offset): k_m = pi * (m + offset) / (L * d)
_R2R_BASIS = {"dct1": (-1, 0.0), "dct2": (0, 0.0), "dct3": (0, 0.5), "dct4": (0, 0.5),
              "dst1": (1, 1.0), "dst2": (0, 1.0), "dst3": (0, 0.5), "dst4": (0, 0.5)}


def wavenumbers3d(k, kinds, d=1.0, *, s=None, layout: str = "transposed", mesh=None):
    """Angular wavenumbers (kx, ky, kz) of the spectrum of `ptransform3d` with `kinds`.

    As `fftfreq3d` (same shapes and shardings, broadcasting against `k`; padded positions 0),
    per axis: 2*pi*fftfreq(n, d) for "fft", 2*pi*rfftfreq(n, d) for "rfft", and for the DCTs
    and DSTs the wavenumber of each basis function: pi*m/(n*d) for dct2 (m = 0..n-1),
    pi*m/((n-1)*d) for dct1, pi*(m+1)/((n+1)*d) for dst1, pi*(m+1)/(n*d) for dst2 and
    pi*(m+1/2)/(n*d) for dct3, dct4, dst3 and dst4.  `s` (the real-space shape) is required
    with "rfft" or when `k` is padded for the mesh.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> kinds = ("dct2", "fft", "fft")
      >>> k = pencilfft.ptransform3d(jax.device_put(np.ones((32, 32, 32), np.float32),
      ...                                           pencilfft.real_space_sharding(mesh)), kinds)
      >>> kx, ky, kz = pencilfft.wavenumbers3d(k, kinds)
      >>> kx.shape, float(kx[0, 0, 1])        # DCT-II: pi * m / n
      ((1, 1, 32), 0.09817477315664291)
    """
    return _vectors(k, d, s, layout, mesh, kinds, caller="wavenumbers3d")


def fftfreq3d(k, d=1.0, *, s=None, layout: str = "transposed", mesh=None):
    """Angular wavenumbers (kx, ky, kz) = 2*pi*fftfreq(n, d) along the original X, Y, Z axes.

    Args:
      k: the k-space array from `pfft3d` (global shape (..., Y, Z, X) or (..., X, Y, Z)); only its
        shape, dtype and sharding are used.
      d: sample spacing, one number or (dx, dy, dz).
      s: the real-space shape (X, Y, Z); required when `k` is zero-padded.
    Returns three float arrays (float32 for complex64 k), each of 3 dimensions with length 1 on
    two of them so they broadcast against `k`; for "transposed" kx is (1, 1, X), ky (Y, 1, 1) and
    kz (1, Z, 1), as `jaxdecomp.fftfreq3d`.  Each is split like the axis of `k` it spans.

    Raises:
      ValueError: `d` not finite and non-zero; `s` not fitting `k`; a bad `layout`.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> k = pencilfft.pfft3d(jax.device_put(np.ones((32, 16, 8), np.complex64),
      ...                                     pencilfft.real_space_sharding(mesh)))
      >>> kx, ky, kz = pencilfft.fftfreq3d(k)     # k is (Y, Z, X) = (16, 8, 32)
      >>> kx.shape, ky.shape, kz.shape
      ((1, 1, 32), (16, 1, 1), (1, 8, 1))
      >>> (kx**2 + ky**2 + kz**2).shape           # broadcasts against k, sharded like it
      (16, 8, 32)
    """
    return _vectors(k, d, s, layout, mesh, ("fft",) * 3, caller="fftfreq3d")


def rfftfreq3d(k, d=1.0, *, s, layout: str = "transposed", mesh=None):
    """As `fftfreq3d` for the half spectrum of `prfft3d`: kz = 2*pi*rfftfreq(Z, d), padded.

    `s`, the real-space shape (X, Y, Z), is required.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> k = pencilfft.prfft3d(jax.device_put(np.ones((32, 32, 32), np.float32),
      ...                                      pencilfft.real_space_sharding(mesh)))
      >>> kx, ky, kz = pencilfft.rfftfreq3d(k, s=(32, 32, 32))
      >>> kz.shape, np.asarray(kz)[0, 15:, 0]   # Z//2+1 = 17 (the last pi), one padded plane: 0
      ((1, 18, 1), array([2.9452431, 3.1415927, 0.       ], dtype=float32))
    """
    return _vectors(k, d, s, layout, mesh, ("fft", "fft", "rfft"), caller="rfftfreq3d")
