"""jaxdecomp's public API, with jaxdecomp's signatures and values, running on pencilfft.

For code you edit, change the import::

    import pencilfft.compat as jaxdecomp

For code that imports jaxdecomp itself (JaxPM, jax-power, DISCO-DJ), register this package under
that name first, once, before the code is imported::

    import pencilfft.compat; pencilfft.compat.install()   # then `import jaxpm` as usual

After `install()`, `import jaxdecomp`, `import jaxdecomp.fft` (also `.halo`, `.transpose`) and
`from jaxdecomp import ...` give these modules.  Everything takes jaxdecomp's arguments,
positionally too; `backend` ("jax" or "cudecomp", any case) is accepted and ignored: pencilfft
is pure JAX.  `config.update("transpose_axis_contiguous", False)` switches to the natural
k-space layout, as in jaxdecomp; the cuDecomp transport settings are accepted and ignored.
What differs (the migration table in docs/howto/particle-mesh.md): on a (P, 1) mesh the spectrum is split along Y
where jaxdecomp's is split along Z (same values); `fftfreq3d`'s vectors are sharded like the
spectrum; the gradient of `halo_exchange` is its adjoint; the real transforms work.
jaxdecomp's internals (cuDecomp's autotuning and grid descriptors) are not provided:
`jaxdecomp._src` carries only what code outside jaxdecomp imports from it (`PENCILS`,
`SLAB_XY`, `SLAB_YZ`, `NO_DECOMP`, `spmd_ops.ALLOW_SHARDY_PARTITIONER`).
"""
from __future__ import annotations

import sys
from types import ModuleType

from .._decomposition.sharding import get_fft_output_sharding as _native_output_sharding
from . import _src, fft, halo, transpose
from ._config import HaloCommBackend, PencilType, TransposeCommBackend, config
from ._config import layout as _current_layout
from ._specs import FftType, get_output_specs, validate_spec_matches_mesh
from .fft import fftfreq3d, pfft3d, pifft3d, pirfft3d, prfft3d, rfftfreq3d
from .halo import halo_exchange
from .transpose import (transposeXtoY, transposeXtoZ, transposeYtoX, transposeYtoZ,
                        transposeZtoX, transposeZtoY)

__all__ = [
    "FftType",
    "HaloCommBackend",
    "NO_DECOMP",
    "PENCILS",
    "PencilType",
    "SLAB_XY",
    "SLAB_YZ",
    "TransposeCommBackend",
    "config",
    "fft",
    "fftfreq3d",
    "finalize",
    "get_fft_output_sharding",
    "get_output_specs",
    "halo",
    "halo_exchange",
    "init",
    "install",
    "pfft3d",
    "pifft3d",
    "pirfft3d",
    "prfft3d",
    "rfftfreq3d",
    "transpose",
    "transposeXtoY",
    "transposeXtoZ",
    "transposeYtoX",
    "transposeYtoZ",
    "transposeZtoX",
    "transposeZtoY",
    "validate_spec_matches_mesh",
]

NO_DECOMP, SLAB_XY, SLAB_YZ, PENCILS = (PencilType.NO_DECOMP, PencilType.SLAB_XY,
                                        PencilType.SLAB_YZ, PencilType.PENCILS)
# jaxdecomp's transport constants (HALO_COMM_NCCL, TRANSPOSE_COMM_MPI_A2A, ...) by name.
globals().update({m.name: m for m in (*HaloCommBackend, *TransposeCommBackend)})


def get_fft_output_sharding(fft_sharding, *, layout: str | None = None, ndim: int | None = None):
    """jaxdecomp.get_fft_output_sharding: the sharding `pfft3d` gives an input in
    `fft_sharding`; the layout follows `config` (see `pencilfft.get_fft_output_sharding`).

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> jaxdecomp.get_fft_output_sharding(pencilfft.real_space_sharding(mesh)).spec
      P('x', 'y', None)
    """
    return _native_output_sharding(fft_sharding, layout=layout or _current_layout(), ndim=ndim)


def init() -> None:
    """jaxdecomp.init: nothing to set up (cuDecomp's handles); kept so that clients run.

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> jaxdecomp.init()
    """


def finalize() -> None:
    """jaxdecomp.finalize: nothing to release; kept so that clients run.

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> jaxdecomp.finalize()
    """


# What `install()` registers under jaxdecomp's names: the public modules, and the two modules of
# jaxdecomp's internals that its tests (and clients that copied them) import names from.
_SUBMODULES = ("fft", "halo", "transpose", "_src", "_src.spmd_ops")


def _modules() -> dict[str, ModuleType]:
    """jaxdecomp's module names -> this package's modules that stand for them."""
    me = sys.modules[__name__]
    mods = {"jaxdecomp": me}
    for sub in _SUBMODULES:
        mod = me
        for part in sub.split("."):
            mod = getattr(mod, part)
        mods[f"jaxdecomp.{sub}"] = mod
    return mods


def install() -> ModuleType:
    """Make `import jaxdecomp` (and `jaxdecomp.fft`, `.halo`, `.transpose`, and the few names
    of `jaxdecomp._src` that clients import) give this package (call before the code that
    imports it).

    Raises RuntimeError when another jaxdecomp has already been imported: modules that hold it
    would keep using it.

    Example:
      At the top of a program that uses JaxPM (which imports jaxdecomp):

      >>> import pencilfft.compat; pencilfft.compat.install()   # doctest: +SKIP
      >>> import jaxdecomp, jaxpm                                 # doctest: +SKIP
      >>> jaxdecomp is pencilfft.compat                           # doctest: +SKIP
      True
    """
    mods = _modules()
    for name, mine in mods.items():
        current = sys.modules.get(name)
        if current is not None and current is not mine:
            raise RuntimeError(
                f"{name} is already imported (from {getattr(current, '__file__', '?')}); call "
                "pencilfft.compat.install() before anything imports jaxdecomp"
            )
    sys.modules.update(mods)
    return mods["jaxdecomp"]
