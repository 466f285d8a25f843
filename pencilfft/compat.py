"""jaxdecomp's five names, with jaxdecomp's signatures, running on pencilfft.

For code you edit, change the import::

    import pencilfft.compat as jaxdecomp

For code that imports jaxdecomp itself (JaxPM), register this module under that name first, once,
before the code is imported::

    import pencilfft.compat; pencilfft.compat.install()   # then `import jaxpm` as usual

`pfft3d(a, norm, backend)`, `pifft3d(a, norm, backend)`, `fftfreq3d(array, d)`,
`get_fft_output_sharding(fft_sharding)` and `halo_exchange(x, halo_extents, halo_periods, backend)`
take jaxdecomp's arguments, positionally too, and return the same global shapes and values.  The
`backend` argument ("jax" or "cudecomp", any case) is accepted and ignored: pencilfft is pure JAX.
What differs (see the README's migration table): on a (P, 1) mesh pencilfft's k space is split
along Y where jaxdecomp's is split along Z (same values); `fftfreq3d`'s vectors are sharded like
the spectrum; `halo_exchange` wraps within the block along a mesh axis of size 1 and leaves
non-periodic edges as they are (jaxdecomp leaves size-1 axes alone and zeroes those edges), and
its gradient is the true adjoint (halo cotangents are added back to the cells they came from).
"""
from __future__ import annotations

import sys
from types import ModuleType

from jax.sharding import NamedSharding

from . import _fft, _freq, _halo
from ._sharding import k_space_sharding

__all__ = ["fftfreq3d", "get_fft_output_sharding", "halo_exchange", "install", "pfft3d", "pifft3d"]

BACKENDS = ("jax", "cudecomp")


def _check_backend(backend) -> None:
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"`backend` must be one of {BACKENDS} (any case); got {backend!r}")


def pfft3d(a, norm: str | None = "backward", backend: str = "jax"):
    """jaxdecomp.pfft3d: 3D FFT of the global (X, Y, Z) array `a`, returned as (Y, Z, X)."""
    _check_backend(backend)
    return _fft.pfft3d(a, norm)


def pifft3d(a, norm: str | None = "backward", backend: str = "jax"):
    """jaxdecomp.pifft3d: inverse of `pfft3d`, (Y, Z, X) back to the global (X, Y, Z), complex."""
    _check_backend(backend)
    return _fft.pifft3d(a, norm)


def fftfreq3d(array, d: float = 1.0):
    """jaxdecomp.fftfreq3d: the angular wavenumbers of the (Y, Z, X) spectrum `array`, shaped
    (1, 1, X), (Y, 1, 1), (1, Z, 1) in that order (X, Y, Z frequencies)."""
    return _freq.fftfreq3d(array, d)


def halo_exchange(x, halo_extents, halo_periods=(True, True), backend: str = "jax"):
    """jaxdecomp.halo_exchange: fill the halos of every padded device block (see
    `pencilfft.halo_exchange`)."""
    _check_backend(backend)
    return _halo.halo_exchange(x, halo_extents, halo_periods)


def get_fft_output_sharding(fft_sharding, *, layout: str = "transposed", ndim: int | None = None):
    """The sharding of `pfft3d`'s output for an input in `fft_sharding` (jaxdecomp's function,
    also `pencilfft.get_fft_output_sharding`).

    Args:
      fft_sharding: a NamedSharding on a 1- or 2-axis mesh: the input's (pfft3d reshards any
        input to X split by the mesh's first axis and Y by its second, so only the mesh matters).
      layout: pfft3d's `layout`.
      ndim: number of global dimensions of the array (default: len(sharding.spec), at least 3);
        leading axes beyond 3 are an unsharded batch.
    Returns the k-space NamedSharding: Y split by the first mesh axis and Z by the second, X
    whole.  On a (P, 1) mesh jaxdecomp's splits Z instead.
    """
    if not isinstance(fft_sharding, NamedSharding):
        raise TypeError(
            f"`fft_sharding` must be a jax.sharding.NamedSharding (e.g. x.sharding); got "
            f"{type(fft_sharding).__name__}"
        )
    mesh = fft_sharding.mesh
    if len(mesh.axis_names) not in (1, 2):
        raise ValueError(
            f"`fft_sharding` must be on a mesh of 1 or 2 axes; got axes {tuple(mesh.axis_names)}"
        )
    if ndim is None:
        ndim = max(3, len(fft_sharding.spec))
    if isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 3:
        raise ValueError(f"`ndim` must be an int >= 3; got {ndim!r}")
    return k_space_sharding(mesh, layout, ndim)


def install() -> ModuleType:
    """Make `import jaxdecomp` give this module (call before the code that imports it).

    Raises RuntimeError when another jaxdecomp has already been imported: modules that hold it
    would keep using it.
    """
    current = sys.modules.get("jaxdecomp")
    me = sys.modules[__name__]
    if current is not None and current is not me:
        raise RuntimeError(
            "jaxdecomp is already imported (from "
            f"{getattr(current, '__file__', '?')}); call pencilfft.compat.install() before "
            "anything imports jaxdecomp"
        )
    sys.modules["jaxdecomp"] = me
    return me
