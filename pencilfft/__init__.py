"""pencilfft: distributed slab and pencil 3D FFTs for JAX."""
from ._autotune import Tuning, autotune
from ._distributed import initialize
from ._fft import pfft3d, pifft3d, pirfft3d, pitransform3d, prfft3d, ptransform3d
from ._io import gather, load, save, scatter
from ._memory import MemoryLimitError
from ._freq import fftfreq3d, rfftfreq3d, wavenumbers3d
from ._halo import halo_exchange
from ._paint import paint, readout
from ._window import compensation as window_compensation
from ._power import power_spectrum
from ._sharding import get_fft_output_sharding, k_space_sharding, real_space_sharding
from . import compat  # noqa: E402,F401 - `pencilfft.compat` after `import pencilfft`, as before

__version__ = "0.1.0"

__all__ = [
    "autotune",
    "fftfreq3d",
    "gather",
    "get_fft_output_sharding",
    "halo_exchange",
    "initialize",
    "k_space_sharding",
    "load",
    "MemoryLimitError",
    "paint",
    "pfft3d",
    "pifft3d",
    "pirfft3d",
    "pitransform3d",
    "power_spectrum",
    "prfft3d",
    "readout",
    "ptransform3d",
    "real_space_sharding",
    "rfftfreq3d",
    "save",
    "scatter",
    "Tuning",
    "wavenumbers3d",
    "window_compensation",
]
