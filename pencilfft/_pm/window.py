"""Mass-assignment windows (NGP, CIC, TSC, PCS): their weights, derivatives and compensation.

A window of support s spreads a particle at position p (in grid units; cell c's centre is at the
integer c) over the s cells base, ..., base + s - 1 with base = floor(p + 1 - s/2), and the
weight of cell base + j is a polynomial in u = p + 1 - s/2 - base, in [0, 1).  Written this way
(not as W(p - cell)) every window is one formula per cell with no branches, which is what the
pure-JAX code and the CPU kernel (`paint.cc`, the same polynomials) both evaluate, and the
derivative with respect to p is the derivative in u.  CIC is JaxPM's `cic_paint` (1 - |d|); the
others are the B-splines of orders 1-4 (pmesh's and nbodykit's "nnb", "cic", "tsc", "pcs").

`compensation(kvecs, window)` is the Fourier transform of the window on the grid, to divide a
painted field's spectrum by (nbodykit's CompensateCIC etc., the exact form W(k) = prod_i
sinc(k_i / 2)^s, with k_i in radians per cell).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["WINDOWS", "support", "check_window", "check_kvecs", "weights", "derivatives",
           "compensation"]

# name -> support (cells per axis).  "nnb" is pmesh's name for NGP.
WINDOWS = {"ngp": 1, "cic": 2, "tsc": 3, "pcs": 4}
_ALIASES = {"nnb": "ngp"}


def check_window(window) -> str:
    """The canonical window name, or a ValueError naming the argument and the choices."""
    if not isinstance(window, str):
        raise TypeError(f"`window` must be one of {tuple(WINDOWS)} (a string); got "
                        f"{type(window).__name__}")
    name = _ALIASES.get(window.lower(), window.lower())
    if name not in WINDOWS:
        raise ValueError(f"`window` must be one of {tuple(WINDOWS)}; got {window!r}")
    return name


def support(window: str) -> int:
    return WINDOWS[check_window(window)]


def weights(u, window: str) -> list:
    """The s weights of one axis, cells base .. base + s - 1, as arrays like u (in [0, 1))."""
    s = WINDOWS[window]
    if s == 1:
        return [jnp.ones_like(u)]
    v = 1 - u
    if s == 2:
        return [v, u]
    if s == 3:
        return [0.5 * v * v, 0.75 - (u - 0.5) ** 2, 0.5 * u * u]
    return [v * v * v / 6, (4 - 6 * u * u + 3 * u * u * u) / 6,
            (4 - 6 * v * v + 3 * v * v * v) / 6, u * u * u / 6]


def derivatives(u, window: str) -> list:
    """d(weight)/du of each of the s weights (= the derivative in the particle's position)."""
    s = WINDOWS[window]
    if s == 1:
        return [jnp.zeros_like(u)]
    v = 1 - u
    if s == 2:
        return [-jnp.ones_like(u), jnp.ones_like(u)]
    if s == 3:
        return [-v, 1 - 2 * u, u]
    return [-0.5 * v * v, -2 * u + 1.5 * u * u, 2 * v - 1.5 * v * v, 0.5 * u * u]


def compensation(kvecs, window: str = "cic"):
    """The window's transfer function on the grid: prod_i sinc(k_i / 2)^s.

    kvecs: the wavenumbers (kx, ky, kz) in radians per cell, broadcasting against each other
    (e.g. `pencilfft.rfftfreq3d(k)`, which gives 2 pi fftfreq: radians per cell for a unit
    box spacing).  Divide a painted field's spectrum by it to undo the window's smoothing
    (deconvolution); divide twice for a power spectrum.  Aliasing is not undone.

    Args:
      kvecs: a tuple or list of the three wavenumber arrays (kx, ky, kz), real (integer or
        float), each of 3 dimensions, their shapes broadcasting against each other: what
        `rfftfreq3d` / `fftfreq3d` return, `np.meshgrid(..., indexing="ij", sparse=True)`, or
        1-D vectors reshaped to (X, 1, 1), (1, Y, 1), (1, 1, Z).  Global or per device, as
        they come: the result is computed where they are, sharded like their broadcast.
      window: "ngp", "cic", "tsc" or "pcs" (ValueError otherwise).

    Returns:
      A real array of the broadcast of the arrays' shapes, 1 at k = 0 and falling towards the
      Nyquist frequency, (2/pi)^s per axis there.

    Raises:
      TypeError: `kvecs` not a tuple or list (e.g. the spectrum itself, whose rows would
        otherwise broadcast into a meaningless array), or an element that is not a real array.
      ValueError: not three elements, an element not of 3 dimensions (three 1-D vectors of
        one length would broadcast into one 1-D array), or shapes that do not broadcast.

    Example:
      The CIC compensation of a 4^3 grid's half spectrum:

      >>> kx, ky, kz = (2 * np.pi * np.fft.fftfreq(4)[:, None, None],
      ...               2 * np.pi * np.fft.fftfreq(4)[None, :, None],
      ...               2 * np.pi * np.fft.rfftfreq(4)[None, None, :])
      >>> w = pencilfft.window_compensation((kx, ky, kz), "cic")
      >>> w.shape, float(w[0, 0, 0]), round(float(w[0, 0, 2]), 4)
      ((4, 4, 3), 1.0, 0.4053)
    """
    s = WINDOWS[check_window(window)]
    kvecs = check_kvecs(kvecs)
    out = 1.0
    for k in kvecs:
        # sin(k/2) / (k/2), written out: jnp.sinc's own derivative rule (lax.polynomial) is
        # refused inside shard_map on jax 0.12 when k varies over a mesh axis and its
        # coefficients do not (power_spectrum's compensation runs there).
        h = k / 2
        safe = jnp.where(h == 0, 1, h)
        out = out * jnp.where(h == 0, 1, jnp.sin(safe) / safe) ** s
    return out


def _describe(x) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"an array of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"a {type(x).__name__}"


def check_kvecs(kvecs) -> tuple:
    """`compensation`'s `kvecs` as a tuple of three real arrays of 3 dimensions that broadcast,
    or a TypeError/ValueError naming the argument (static: shapes and dtypes only, so the same
    under jax.jit)."""
    if not isinstance(kvecs, (tuple, list)):
        spectrum = (" (the spectrum itself? pass its wavenumbers, e.g. "
                    "pencilfft.rfftfreq3d(k, s=shape))" if hasattr(kvecs, "shape") else "")
        raise TypeError(f"`kvecs` must be a tuple or list of the three wavenumber arrays (kx, ky, "
                        f"kz); got {_describe(kvecs)}{spectrum}")
    if len(kvecs) != 3:
        raise ValueError(f"`kvecs` must hold three wavenumber arrays (kx, ky, kz); got "
                         f"{len(kvecs)}")
    out = []
    for i, k in enumerate(kvecs):
        if not (hasattr(k, "shape") and hasattr(k, "dtype")):
            if isinstance(k, (list, tuple)) or np.ndim(k) != 0:
                k = np.asarray(k)
            else:
                raise TypeError(f"`kvecs[{i}]` must be a real array of wavenumbers (3 "
                                f"dimensions); got {_describe(k)}")
        dtype = np.dtype(k.dtype)
        if dtype.kind not in "iuf" and dtype != jnp.bfloat16:
            what = " (a spectrum? pass its wavenumbers)" if dtype.kind == "c" else ""
            raise TypeError(f"`kvecs[{i}]` must hold real wavenumbers (integer or float); got "
                            f"dtype {dtype}{what}")
        if len(k.shape) != 3:
            raise ValueError(
                f"`kvecs[{i}]` must have 3 dimensions (e.g. kx of shape (X, 1, 1), as "
                f"pencilfft.rfftfreq3d returns); got shape {tuple(k.shape)}"
                + (": reshape 1-D vectors to (X, 1, 1), (1, Y, 1), (1, 1, Z)"
                   if len(k.shape) == 1 else ""))
        out.append(k)
    try:
        jax.numpy.broadcast_shapes(*(tuple(k.shape) for k in out))
    except ValueError:
        raise ValueError(f"`kvecs` must broadcast against each other; got shapes "
                         f"{[tuple(k.shape) for k in out]}") from None
    return tuple(out)
