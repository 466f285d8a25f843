"""Angular wavenumbers laid out and sharded like the k-space arrays they multiply.

Each vector is shaped to broadcast against k in its layout (length 1 on the other two axes) and
split by the same mesh axis as that axis of k, so a kernel such as -1/k^2 or i*k applied to k
is purely local.  Padded positions (see `pfft3d`) hold 0.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ._plan import _is_tracer, check_norm_layout, find_mesh, _check_s, _xyz
from ._sharding import k_space_spec

__all__ = ["fftfreq3d", "rfftfreq3d"]


def _spacings(d) -> tuple[float, float, float]:
    if isinstance(d, Sequence) or np.ndim(d) == 1:
        d = tuple(float(v) for v in d)
        if len(d) != 3:
            raise ValueError(f"`d` must be a number or 3 numbers (dx, dy, dz); got {d}")
        return d
    return (float(d),) * 3


def _vectors(k, d, s, layout, mesh, real: bool):
    check_norm_layout("backward", layout)
    shape = tuple(np.shape(k))
    if len(shape) < 3:
        raise ValueError(f"`k` must have at least 3 dimensions; got shape {shape}")
    lengths = _xyz(shape[-3:], layout)  # (X, Y, Z) lengths of k, padded or not
    if s is None:
        if real:
            raise ValueError("`s` (the real-space shape (X, Y, Z)) is required for rfftfreq3d")
        s = lengths
    s = _check_s(s)
    n_k = (s[0], s[1], s[2] // 2 + 1 if real else s[2])
    if any(n > m for n, m in zip(n_k, lengths)) or lengths[0] != s[0]:
        raise ValueError(
            f"`k.shape[-3:]` = {shape[-3:]} ({layout} layout) does not fit the real-space shape "
            f"`s` = {s}: its (X, Y, Z) lengths {lengths} must be (X, >= Y, >= {n_k[2]})"
        )
    dtype = getattr(k, "dtype", np.result_type(k))
    fdtype = np.float64 if dtype in (np.complex128, np.float64) else np.float32
    dx, dy, dz = _spacings(d)
    freqs = [np.fft.fftfreq(s[0], dx), np.fft.fftfreq(s[1], dy),
             (np.fft.rfftfreq if real else np.fft.fftfreq)(s[2], dz)]
    # The position of X, Y, Z among k's last three axes.
    where = {"transposed": (2, 0, 1), "natural": (0, 1, 2)}[layout]
    mesh = find_mesh(k, mesh, "k")
    spec = tuple(k_space_spec(mesh, layout, 3)) if mesh is not None else (None,) * 3
    out = []
    for f, n, pos in zip(freqs, lengths, where):
        v = np.zeros(n, fdtype)
        v[: f.size] = 2 * np.pi * f
        shape3 = [1, 1, 1]
        shape3[pos] = n
        v = v.reshape(shape3)
        if mesh is None:
            out.append(jax.numpy.asarray(v))
            continue
        vspec = [None, None, None]
        vspec[pos] = spec[pos]
        sharding = NamedSharding(mesh, P(*vspec))
        if _is_tracer(k):
            out.append(jax.sharding.reshard(jax.numpy.asarray(v), sharding)
                       if _explicit(mesh) else jax.lax.with_sharding_constraint(v, sharding))
        else:
            out.append(jax.device_put(v, sharding))
    return tuple(out)


def _explicit(mesh) -> bool:
    return any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)


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
    return _vectors(k, d, s, layout, mesh, real=False)


def rfftfreq3d(k, d=1.0, *, s, layout: str = "transposed", mesh=None):
    """As `fftfreq3d` for the half spectrum of `prfft3d`: kz = 2*pi*rfftfreq(Z, d), padded.

    `s`, the real-space shape (X, Y, Z), is required.
    """
    return _vectors(k, d, s, layout, mesh, real=True)
