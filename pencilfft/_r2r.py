"""Real-to-real transforms (DCT and DST, types 1-4) along one axis, built from `jnp.fft`.

Values, normalisations and inverses are scipy.fft's (`dct`, `dst`, `idct`, `idst`; for
norm="ortho" scipy's default `orthogonalize=True`).  Every kind is

    y_k = c g_k sum_n h_n x_n trig(pi (n + a)(k + b) / M),   M in {N-1, N, N+1},

with a scale c and end-point weights h (types 1, 3) and g (types 1, 2 under "ortho").
* Types 2 and 3 (the common ones) use Makhoul's N-point algorithm: DCT-II is a real FFT of the
  reordered input (x0, x2, x4, ..., x3, x1) times a twiddle, DCT-III its inverse through an
  inverse real FFT of a Hermitian half spectrum; DST-II/III are DCT-II/III of sign-alternated
  or reversed data, reversed or sign-alternated.
* Types 1 and 4 use a zero-padded FFT of length 2M, since
  sum_n z_n e^{-i pi (n+a)(k+b)/M} = e^{-i pi a (k+b)/M} FFT_2M(z_n e^{-i pi n b/M})[k],
  whose real part is the cosine sum and minus its imaginary part the sine sum.  Type 1 has
  integer shifts, which are index shifts instead of twiddles, so it is a plain real FFT.
Only FFTs, slices, pads, reshapes and products with constant (numpy-built,
float64-accurate) twiddles are used: it runs on any backend, under jit, vmap and shard_map, and
being linear it differentiates and `jax.linear_transpose`s.  Complex input is transformed as a
real batch (real and imaginary parts stacked), so in one FFT call.
"""
from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["KINDS", "forward", "backward", "min_length"]

KINDS = ("dct1", "dct2", "dct3", "dct4", "dst1", "dst2", "dst3", "dst4")
_NORMS = ("backward", "ortho", "forward")
_INVERSE_KIND = {"dct1": "dct1", "dct2": "dct3", "dct3": "dct2", "dct4": "dct4",
                 "dst1": "dst1", "dst2": "dst3", "dst3": "dst2", "dst4": "dst4"}
_INVERSE_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


def _check(kind: str, norm: str | None = None) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got kind={kind!r}")
    if norm is not None and norm not in _NORMS:
        raise ValueError(f"norm must be one of {', '.join(_NORMS)}; got norm={norm!r}")


def min_length(kind: str) -> int:
    """Shortest axis the kind accepts (2 for dct1, as scipy; 1 otherwise)."""
    _check(kind)
    return 2 if kind == "dct1" else 1


def _period(kind: str, n: int) -> int:
    """M of the kind's kernel; scipy's norm="forward" divides by 2M."""
    return n + {"dct1": -1, "dst1": 1}.get(kind, 0)


def _weights(kind: str, n: int, norm: str) -> tuple[float, np.ndarray, np.ndarray]:
    """Scale c, input weights h and output weights g (see the module docstring)."""
    m = _period(kind, n)
    c = {"backward": 2.0, "ortho": np.sqrt(2.0 / m), "forward": 1.0 / m}[norm]
    ends = {"dct1": [0, -1], "dct2": [0], "dct3": [0], "dst2": [-1], "dst3": [-1]}.get(kind, [])
    h, g = np.ones(n), np.ones(n)
    if kind[3] in "13":  # scipy's half-weighted end samples (x0 and/or x_{N-1})
        h[ends] = np.sqrt(0.5) if norm == "ortho" else 0.5
    if kind[3] in "12" and norm == "ortho":  # ... and its orthonormalising output factors
        g[ends] = np.sqrt(0.5)
    return c, h, g


def _const(values: np.ndarray, dtype) -> jax.Array:
    return jnp.asarray(np.asarray(values).astype(dtype))


def _reorder(x: jax.Array) -> jax.Array:
    """Makhoul's reordering: even samples, then odd samples reversed (slices, not a gather)."""
    return jnp.concatenate([x[..., 0::2], jnp.flip(x[..., 1::2], -1)], axis=-1)


def _unreorder(v: jax.Array) -> jax.Array:
    """The inverse of `_reorder`: interleave the two halves back."""
    n, h = v.shape[-1], (v.shape[-1] + 1) // 2
    odd = jnp.pad(jnp.flip(v[..., h:], -1), [(0, 0)] * (v.ndim - 1) + [(0, n % 2)])
    return jnp.stack([v[..., :h], odd], axis=-1).reshape(*v.shape[:-1], 2 * h)[..., :n]


def _dct2(x: jax.Array, c: float, g: np.ndarray) -> jax.Array:
    n = x.shape[-1]
    cplx = jnp.result_type(x.dtype, jnp.complex64)
    half = n // 2 + 1  # the rfft's bins; y_k and y_{N-k} both come from bin k
    k = np.arange(half)
    w = jnp.fft.rfft(_reorder(x), axis=-1)
    w = w * _const(c * g[:half] * np.exp(-0.5j * np.pi * k / n), cplx)
    # y_k = Re w_k and, from the Hermitian symmetry of the spectrum, y_{N-k} = -Im w_k.
    return jnp.concatenate([w.real, -jnp.flip(w.imag[..., 1:(n + 1) // 2], -1)], axis=-1)


def _dct3(x: jax.Array, c: float, h: np.ndarray) -> jax.Array:
    n = x.shape[-1]
    cplx = jnp.result_type(x.dtype, jnp.complex64)
    half = n // 2 + 1
    k = np.arange(half)
    # DCT-III = 2N * DCT-II^-1 (scipy), with the 1/2 on x0 folded into the weights and the
    # 2N into the twiddle (cancelling the irfft's 1/N and Makhoul's 1/2).
    z = x * _const(c * h * np.where(np.arange(n) == 0, 1.0, 0.5), x.dtype)
    pad = [(0, 0)] * (x.ndim - 1) + [(1, 0)]
    z_rev = jnp.pad(jnp.flip(z, -1)[..., : half - 1], pad)  # z_{N-k}, with z_N = 0
    v = jax.lax.complex(z[..., :half], -z_rev) * _const(n * np.exp(0.5j * np.pi * k / n), cplx)
    return _unreorder(jnp.fft.irfft(v, n=n, axis=-1))


def _padded(x: jax.Array, kind: str, c: float, h: np.ndarray, g: np.ndarray) -> jax.Array:
    """Types 1 and 4 through an FFT of length 2M."""
    n = x.shape[-1]
    m = _period(kind, n)
    if kind[3] == "1":
        # Integer shifts a = b = s: prepend s zeros and drop the first s bins; no twiddles.
        s = int(kind == "dst1")
        z = jnp.pad(x * _const(h, x.dtype), [(0, 0)] * (x.ndim - 1) + [(s, 0)])
        f = jnp.fft.rfft(z, n=2 * m, axis=-1)[..., s: s + n]
        trig = f.real if kind == "dct1" else -f.imag
        return trig * _const(c * g, x.dtype)
    cplx = jnp.result_type(x.dtype, jnp.complex64)
    k = np.arange(n) + 0.5  # a = b = 1/2
    pre = h * np.exp(-1j * np.pi * (k - 0.5) * 0.5 / m)
    post = c * g * np.exp(-1j * np.pi * 0.5 * k / m) * (1 if kind == "dct4" else 1j)
    f = jnp.fft.fft(x * _const(pre, cplx), n=2 * m, axis=-1)[..., :n]
    return (f * _const(post, cplx)).real


def _last_axis(x: jax.Array, kind: str, norm: str) -> jax.Array:
    """The transform of real `x` along its last axis."""
    n = x.shape[-1]
    alternate = _const((-1.0) ** np.arange(n), x.dtype)
    if kind[3] in "23":
        c, h, g = _weights("dct" + kind[3], n, norm)  # the DST weights are these, mirrored
        if kind == "dct2":
            return _dct2(x, c, g)
        if kind == "dst2":  # DST-II_k(x) = DCT-II_{N-1-k}((-1)^n x_n)
            return jnp.flip(_dct2(x * alternate, c, g), -1)
        if kind == "dct3":
            return _dct3(x, c, h)
        return _dct3(jnp.flip(x, -1), c, h) * alternate  # DST-III_k(x) = (-1)^k DCT-III_k(x rev.)
    return _padded(x, kind, *_weights(kind, n, norm))


def forward(x: jax.Array, kind: str, axis: int, norm: str) -> jax.Array:
    """scipy.fft.dct(x, type=t, axis=axis, norm=norm) (or dst), for kind 'dct<t>' / 'dst<t>'."""
    _check(kind, norm)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(float)
    axis = operator.index(axis)
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for an array of {x.ndim} dimensions")
    n = x.shape[axis]
    if n < min_length(kind):
        raise ValueError(f"{kind} needs an axis of length >= {min_length(kind)}; got length {n}")
    y = jnp.moveaxis(x, axis, -1)  # XLA's FFT works on the last axis anyway
    if jnp.iscomplexobj(y):
        parts = _last_axis(jnp.stack([y.real, y.imag]), kind, norm)
        y = jax.lax.complex(parts[0], parts[1])
    else:
        y = _last_axis(y, kind, norm)
    return jnp.moveaxis(y, -1, axis)


def backward(x: jax.Array, kind: str, axis: int, norm: str) -> jax.Array:
    """scipy.fft.idct(x, type=t, axis=axis, norm=norm) (or idst): the inverse of forward."""
    _check(kind, norm)
    # scipy: idct type t with norm is dct of the inverse type with the opposite norm.
    return forward(x, _INVERSE_KIND[kind], axis, _INVERSE_NORM[norm])
