"""`jaxdecomp.fft`: the transforms and wavenumbers with jaxdecomp's signatures.

`backend` ("jax" or "cudecomp", any case) is accepted and ignored: pencilfft is pure JAX.  The
k-space layout follows `config.transpose_axis_contiguous` (True: (Y, Z, X), jaxdecomp's default;
False: (X, Y, Z)).  jaxdecomp 0.3 has no real transforms ("Not implemented"); here `prfft3d`
and `pirfft3d` are pencilfft's, the half spectrum along Z.  With jaxdecomp's signatures the
real-space Z is taken as 2 (Zh - 1) from the spectrum's Zh: an even Z whose Z//2+1 the mesh
axis splitting it divides (else Zh is padded; call pencilfft.pirfft3d(k, s) with the shape).
"""
from __future__ import annotations

import numpy as np

from .._transforms import fft as _fft, freq as _freq
from ._config import layout

__all__ = ["fftfreq3d", "pfft3d", "pifft3d", "pirfft3d", "prfft3d", "rfftfreq3d"]

BACKENDS = ("jax", "cudecomp")


def check_backend(backend) -> None:
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"`backend` must be one of {BACKENDS} (any case); got {backend!r}")


def pfft3d(a, norm: str | None = "backward", backend: str = "jax"):
    """jaxdecomp.pfft3d: 3D FFT of the global (X, Y, Z) array `a`, returned as (Y, Z, X)
    (as (X, Y, Z) with `transpose_axis_contiguous` False).

    Raises the errors of `pencilfft.pfft3d`, and ValueError for a `backend` other than "jax" or
    "cudecomp" (any case).

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 16, 8), np.complex64), pencilfft.real_space_sharding(mesh))
      >>> k = jaxdecomp.pfft3d(x)            # global (Y, Z, X), split P('x', 'y')
      >>> k.shape, k.sharding.spec
      ((16, 8, 32), P('x', 'y', None))
    """
    check_backend(backend)
    return _fft.pfft3d(a, norm, layout=layout())


def pifft3d(a, norm: str | None = "backward", backend: str = "jax"):
    """jaxdecomp.pifft3d: inverse of `pfft3d`, back to the global (X, Y, Z), complex.

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 16, 8), np.complex64), pencilfft.real_space_sharding(mesh))
      >>> y = jaxdecomp.pifft3d(jaxdecomp.pfft3d(x))
      >>> y.shape, y.sharding.spec, bool(np.allclose(y, 1))
      ((32, 16, 8), P('x', 'y', None), True)
    """
    check_backend(backend)
    return _fft.pifft3d(a, norm, layout=layout())


def prfft3d(a, norm: str | None = "backward", backend: str = "jax"):
    """The real-to-complex `pfft3d` (jaxdecomp's name): Z halved to Z//2+1 (pencilfft.prfft3d).

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 16, 30), np.float32), pencilfft.real_space_sharding(mesh))
      >>> jaxdecomp.prfft3d(x).shape          # (Y, Z//2+1, X): 16 planes, divisible by 2
      (16, 16, 32)
    """
    check_backend(backend)
    return _fft.prfft3d(a, norm, layout=layout())


def pirfft3d(a, norm: str | None = "backward", backend: str = "jax"):
    """Inverse of `prfft3d` for an even Z = 2 (Zh - 1) (jaxdecomp's signature has no shape).

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 16, 30), np.float32), pencilfft.real_space_sharding(mesh))
      >>> y = jaxdecomp.pirfft3d(jaxdecomp.prfft3d(x))   # Z = 2 (16 - 1) = 30
      >>> y.shape, y.dtype, bool(np.allclose(y, 1))
      ((32, 16, 30), dtype('float32'), True)
    """
    check_backend(backend)
    return _fft.pirfft3d(a, _real_shape(a), norm, layout=layout())


def fftfreq3d(array, d: float = 1.0):
    """jaxdecomp.fftfreq3d: the angular wavenumbers of the spectrum `array`, in jaxdecomp's order
    and shapes: of its last axis (1, 1, n2), its first (n0, 1, 1), its second (1, n1, 1); in the
    default layout (Y, Z, X) that is (kx, ky, kz).

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> k = jaxdecomp.pfft3d(jax.device_put(np.ones((32, 16, 8), np.complex64),
      ...                                     pencilfft.real_space_sharding(mesh)))
      >>> [a.shape for a in jaxdecomp.fftfreq3d(k)]   # k is (Y, Z, X) = (16, 8, 32)
      [(1, 1, 32), (16, 1, 1), (1, 8, 1)]
    """
    return _reorder(_freq.fftfreq3d(array, d, layout=layout()))


def rfftfreq3d(array, d: float = 1.0):
    """As `fftfreq3d` for `prfft3d`'s half spectrum (an even Z).  jaxdecomp 0.3's takes the
    rfftfreq of the halved length itself, which matches no spectrum; this one matches `prfft3d`.

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> k = jaxdecomp.prfft3d(jax.device_put(np.ones((32, 16, 30), np.float32),
      ...                                      pencilfft.real_space_sharding(mesh)))
      >>> [a.shape for a in jaxdecomp.rfftfreq3d(k)]
      [(1, 1, 32), (16, 1, 1), (1, 16, 1)]
    """
    return _reorder(_freq.rfftfreq3d(array, d, s=_real_shape(array), layout=layout()))


def _reorder(kxyz):
    """(kx, ky, kz) -> jaxdecomp's order, which follows the spectrum's axes (last, first, second)."""
    kx, ky, kz = kxyz
    return (kx, ky, kz) if layout() == "transposed" else (kz, kx, ky)


def _real_shape(k) -> tuple[int, int, int]:
    """(X, Y, Z) of a half spectrum in the current layout, Z even."""
    last3 = tuple(np.shape(k)[-3:])
    if len(last3) < 3:
        return last3  # the transform's own check names the argument
    y, zh, x = last3 if layout() == "transposed" else (last3[1], last3[2], last3[0])
    return (x, y, 2 * (zh - 1))
