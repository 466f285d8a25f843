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

from ._plan import plan_backward

__all__ = ["fftfreq3d", "rfftfreq3d"]


def _spacings(d) -> tuple[float, float, float]:
    """(dx, dy, dz) from one number or three; each finite and non-zero."""
    values = np.ravel(np.asarray(d, dtype=object))
    try:
        if any(isinstance(v, (str, bytes, bool, np.bool_)) for v in values):
            raise TypeError  # float("1") and float(True) would pass
        spacings = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"`d` must be a number or 3 numbers (dx, dy, dz); got {d!r}") from None
    if len(spacings) == 1:
        spacings *= 3
    if len(spacings) != 3 or np.ndim(d) > 1:
        raise ValueError(f"`d` must be a number or 3 numbers (dx, dy, dz); got {d!r}")
    if not all(np.isfinite(v) and v != 0 for v in spacings):
        raise ValueError(f"`d` (the sample spacing) must be finite and non-zero; got {d!r}")
    return spacings


def _vectors(k, d, s, layout, mesh, real: bool, caller: str):
    # The inverse transform's plan validates k against s exactly as pifft3d/pirfft3d would.
    plan = plan_backward(k, s, norm="backward", layout=layout, mesh=mesh, real=real,
                         caller=caller)
    padded = tuple(np.shape(k)[-3:]) == plan.k_shape
    X, Y, Z = plan.real_shape
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
    fdtype = jnp.float64 if np.dtype(plan.k_dtype) == np.complex128 else jnp.float32
    where = {"transposed": (2, 0, 1), "natural": (0, 1, 2)}[plan.layout]  # X, Y, Z positions
    axis_of = tuple(plan.k_spec)[-3:] if plan.mesh is not None else (None,) * 3
    sizes = dict(zip(plan.axes, plan.pdims))
    half = (False, False, plan.real)  # rfftfreq along Z for the real transforms
    specs = []
    for pos in where:
        spec = [None, None, None]
        spec[pos] = axis_of[pos]
        specs.append(P(*spec))

    def block():
        """Each device computes its own slice of each vector: nothing is transferred."""
        out = []
        for n_true, n, d, pos, spec, h in zip(plan.real_shape, lengths, spacings, where, specs, half):
            name = spec[pos]
            local = n // sizes[name] if name is not None else n
            start = jax.lax.axis_index(name) * local if name is not None else 0
            g = start + jnp.arange(local)
            f = g if h else jnp.where(g < (n_true + 1) // 2, g, g - n_true)
            n_valid = n_true // 2 + 1 if h else n_true
            v = jnp.where(g < n_valid, (2 * np.pi / (n_true * d)) * f, 0)
            shape3 = [1, 1, 1]
            shape3[pos] = local
            out.append(v.astype(fdtype).reshape(shape3))
        return tuple(out)

    if plan.mesh is None:
        return block()
    return jax.shard_map(block, mesh=plan.mesh, in_specs=(), out_specs=tuple(specs))()


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
    """
    return _vectors(k, d, s, layout, mesh, real=False, caller="fftfreq3d")


def rfftfreq3d(k, d=1.0, *, s, layout: str = "transposed", mesh=None):
    """As `fftfreq3d` for the half spectrum of `prfft3d`: kz = 2*pi*rfftfreq(Z, d), padded.

    `s`, the real-space shape (X, Y, Z), is required.
    """
    return _vectors(k, d, s, layout, mesh, real=True, caller="rfftfreq3d")
