"""XLA's FFT as `jnp.fft` computes it, with the FFT's operand and result pinned to the default
(dim0-major) layout on CPUs: every local FFT that is not FFTW's goes through here.

XLA:CPU's FFT thunk refuses any other layout, at run time (`RET_CHECK fft_thunk.cc:168
IsMonotonicWithDim0Major`), yet its layout assignment lets a layout that the FFT's users ask for
(a transpose, a dynamic-update-slice into a loop's buffer) travel back through the FFT, an op
that cannot change layouts, onto its operand.  jax 0.11.2's CPU programs met that on `pencilfft
check`'s path; on jax 0.10.2 `with_layout_constraint` on an FFT's result reproduces it
(tests/test_hlo.py).  With lax.fft's own operand and result pinned to the default layout, XLA
puts the copy that such a demand needs after the FFT instead (on jax 0.10.2 the compiled
programs hold the same ops and the same memory as before).  On every other platform this is
`jnp.fft` itself (`platform_dependent`), so the GPU programs are unchanged.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

try:  # experimental in jax (jax/_src/pjit.py), in 0.10.2 and 0.11 alike
    from jax.experimental.layout import Layout, with_layout_constraint
except ImportError:  # a jax without it: the layout test of the compiled programs guards
    Layout = with_layout_constraint = None

__all__ = ["fftn", "FFT_TYPES"]

FFT_TYPES = ("fft", "ifft", "rfft", "irfft")
_LAX_TYPES = {"fft": lax.FftType.FFT, "ifft": lax.FftType.IFFT,
              "rfft": lax.FftType.RFFT, "irfft": lax.FftType.IRFFT}


def _pinned(v: jax.Array) -> jax.Array:
    """v with XLA's default layout (dim0-major: minor_to_major {n-1, ..., 0})."""
    if with_layout_constraint is None:
        return v
    return with_layout_constraint(v, Layout(tuple(range(v.ndim))))


def _norm_factor(fft_type: str, norm: str | None, lengths: Sequence[int]) -> float:
    """jnp.fft's factor for `norm` (XLA's inverse FFTs already divide by n)."""
    n = math.prod(lengths)
    inverse = fft_type.startswith("i")
    if norm in (None, "backward"):
        return 1.0
    if norm == "ortho":
        return math.sqrt(n) if inverse else 1 / math.sqrt(n)
    return float(n) if inverse else 1 / n


def _cpu_fftn(x: jax.Array, fft_type: str, axes: tuple[int, ...], norm: str | None,
              s: tuple[int, ...] | None) -> jax.Array:
    """`jnp.fft._fft_core` (axes last, crop or pad to `s`, one lax.fft, the norm, axes back)
    with lax.fft's operand and result pinned."""
    last = tuple(range(x.ndim - len(axes), x.ndim))
    x = jnp.moveaxis(x, axes, last)
    if s is not None:
        lengths = tuple(s)
        wanted = list(x.shape)
        for axis, n in zip(last, lengths):
            wanted[axis] = n
        if fft_type == "irfft":
            wanted[-1] = wanted[-1] // 2 + 1
        x = x[tuple(slice(n) for n in wanted)]
        x = jnp.pad(x, [(0, w - n) for w, n in zip(wanted, x.shape)])
    elif fft_type == "irfft":
        lengths = (*x.shape[-len(axes):-1], 2 * (x.shape[-1] - 1))
    else:
        lengths = x.shape[-len(axes):]
    y = _pinned(lax.fft(_pinned(x), _LAX_TYPES[fft_type], tuple(lengths)))
    factor = _norm_factor(fft_type, norm, lengths)
    if factor != 1.0:
        y = y * jnp.asarray(factor, y.dtype)
    return jnp.moveaxis(y, last, axes)


def fftn(x: jax.Array, fft_type: str, axes: Sequence[int], norm: str | None = None,
         s: Sequence[int] | None = None) -> jax.Array:
    """`jnp.fft.{fftn, ifftn, rfftn, irfftn}(x, s, axes, norm)` (`fft_type`: "fft", "ifft",
    "rfft", "irfft"), at most 3 axes; on CPUs with the FFT's layouts pinned (see above)."""
    axes = tuple(int(a) % jnp.ndim(x) for a in axes)
    s = None if s is None else tuple(int(n) for n in s)
    plain = getattr(jnp.fft, fft_type + "n")

    def default(v):
        return plain(v, s=s, axes=axes, norm=norm)

    def cpu(v):
        return _cpu_fftn(v, fft_type, axes, norm, s)

    return lax.platform_dependent(jnp.asarray(x), cpu=cpu, default=default)
