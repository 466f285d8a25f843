"""pencilfft: distributed slab and pencil 3D FFTs for JAX.

The public API is the explicit list `__all__` below; everything else is private.  The package
is cut by concept (docs/development.md draws it), each part a private subpackage that imports
only the parts below it:

* `_decomposition`: which mesh an array runs on, which mesh axis splits which array axis, and
  the shardings of the two sides (static: shapes and meshes only);
* `_native`: the runtime of the compiled CPU handlers (the build rule and cache, threads, the
  allocator);
* `_processes`: several processes (`initialize`, one decision on every process, memory, the
  loaders `scatter`/`gather`/`save`/`load`);
* `_exchange`: every way the transposes move data between devices (XLA's collectives, the
  local and MPI custom calls);
* `_transforms`: the distributed transforms (plan -> stages -> runner), the local FFT kernel,
  frequencies, `autotune`;
* `_pm`: the particle-mesh tools (painting and readout, catalogs, windows, halos, power
  spectra, Gaussian fields and their Zel'dovich displacement);
* `compat` (jaxdecomp's API) and `_cli` (`pencilfft check`) on top.
"""
from ._jax_private import warn_if_untested as _warn_if_untested
from ._decomposition.sharding import (displacement_sharding, get_fft_output_sharding,
                                      k_space_sharding, real_space_sharding)
from ._pm.fields import gaussian_field, zeldovich_displacement
from ._pm.halo import halo_exchange
from ._pm.paint import paint, readout
from ._pm.power import power_spectrum
from ._pm.window import compensation as window_compensation
from ._processes.io import gather, load, save, scatter
from ._processes.launch import initialize
from ._processes.memory import MemoryLimitError
from ._transforms.autotune import Tuning, autotune
from ._transforms.fft import pfft3d, pifft3d, pirfft3d, pitransform3d, prfft3d, ptransform3d
from ._transforms.numpy_fft import (fft2, fftn, ifft2, ifftn, irfft2, irfftn, rfft2,
                                    rfftn)
from ._transforms.freq import fftfreq3d, rfftfreq3d, wavenumbers3d
from ._transforms.dealias import dealias_mask, pad_spectrum, truncate_spectrum
from . import compat  # noqa: E402,F401 - `pencilfft.compat` after `import pencilfft`, as before

__version__ = "0.1.0"

_warn_if_untested()  # once, where jax is outside the releases the suite has passed on

__all__ = [
    "autotune",
    "dealias_mask",
    "displacement_sharding",
    "fft2",
    "fftfreq3d",
    "fftn",
    "gather",
    "gaussian_field",
    "get_fft_output_sharding",
    "halo_exchange",
    "ifft2",
    "ifftn",
    "initialize",
    "irfft2",
    "irfftn",
    "k_space_sharding",
    "load",
    "MemoryLimitError",
    "pad_spectrum",
    "paint",
    "pfft3d",
    "pifft3d",
    "pirfft3d",
    "pitransform3d",
    "power_spectrum",
    "prfft3d",
    "readout",
    "rfft2",
    "rfftn",
    "ptransform3d",
    "real_space_sharding",
    "rfftfreq3d",
    "save",
    "scatter",
    "truncate_spectrum",
    "Tuning",
    "wavenumbers3d",
    "window_compensation",
    "zeldovich_displacement",
]
