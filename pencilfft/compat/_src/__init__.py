"""`jaxdecomp._src` as far as code outside jaxdecomp reaches into it: the decomposition kinds.

jaxdecomp's own tests (and clients that copied their imports) do
`from jaxdecomp._src import PENCILS, SLAB_XY, SLAB_YZ` and
`from jaxdecomp._src.spmd_ops import ALLOW_SHARDY_PARTITIONER`; `install()` registers this
package as `jaxdecomp._src` so that those lines work.  Nothing else of jaxdecomp's internals is
here (cuDecomp's handles, grid descriptors, primitives): importing any other name fails.
"""
# (No other public name here, not even an import: the package holds exactly what it stands for.)
from .._config import PencilType as _PencilType
from . import spmd_ops

__all__ = ["NO_DECOMP", "PENCILS", "SLAB_XY", "SLAB_YZ", "spmd_ops"]

# compat's own objects, the same as `pencilfft.compat.PENCILS` ...
NO_DECOMP, SLAB_XY, SLAB_YZ, PENCILS = (_PencilType.NO_DECOMP, _PencilType.SLAB_XY,
                                        _PencilType.SLAB_YZ, _PencilType.PENCILS)
