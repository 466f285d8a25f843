"""jaxdecomp's configuration object, `jaxdecomp.config`, and its constants.

jaxdecomp keeps its settings in one module-level object that clients change with
`jaxdecomp.config.update(key, value)`.  The one setting that changes results is
`transpose_axis_contiguous`: True (default) gives the transposed k-space layout (Y, Z, X),
False the natural one (X, Y, Z); the compat functions read it when they are called (traced).
The communication back-ends choose among cuDecomp's transports, which pencilfft does not use:
they are accepted, stored and ignored.  An unknown key is a ValueError, as in jaxdecomp.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

__all__ = ["Config", "config", "layout", "PencilType", "HaloCommBackend", "TransposeCommBackend"]


# The values are jaxdecomp's (its C++ enums, cuDecomp's for the transports), so that code that
# stores or compares them as integers sees the same numbers.


class PencilType(enum.IntEnum):
    """jaxdecomp's decomposition kinds, named after the mesh shape (Pa, Pb) they describe."""

    SLAB_XY = 0  # (P, 1): X split
    SLAB_YZ = 1  # (1, P): Y split
    PENCILS = 2  # (Pa, Pb), both > 1
    NO_DECOMP = 3  # (1, 1)


class HaloCommBackend(enum.IntEnum):
    """cuDecomp's halo transports (accepted by `config.update`, ignored)."""

    HALO_COMM_MPI = 1
    HALO_COMM_MPI_BLOCKING = 2
    HALO_COMM_NCCL = 3
    HALO_COMM_NVSHMEM = 4
    HALO_COMM_NVSHMEM_BLOCKING = 5


class TransposeCommBackend(enum.IntEnum):
    """cuDecomp's transpose transports (accepted by `config.update`, ignored)."""

    TRANSPOSE_COMM_MPI_P2P = 1
    TRANSPOSE_COMM_MPI_P2P_PL = 2
    TRANSPOSE_COMM_MPI_A2A = 3
    TRANSPOSE_COMM_NCCL = 4
    TRANSPOSE_COMM_NCCL_PL = 5
    TRANSPOSE_COMM_NVSHMEM = 6
    TRANSPOSE_COMM_NVSHMEM_PL = 7


_ENUMS = {"halo_comm_backend": HaloCommBackend, "transpose_comm_backend": TransposeCommBackend}


@dataclasses.dataclass
class Config:
    """The settings of `pencilfft.compat`, as `jaxdecomp.config`.

    `transpose_axis_contiguous`: True (default) gives the transposed k-space layout (Y, Z, X),
    False the natural one (X, Y, Z); read when a compat function is traced, so set it before
    `jax.jit` compiles the code.  `halo_comm_backend`, `transpose_comm_backend` (cuDecomp's
    transports) are accepted, stored and ignored.  `update` with another key is a ValueError,
    with a value of the wrong kind a ValueError or TypeError, as in jaxdecomp.

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> jaxdecomp.config.update("transpose_axis_contiguous", False)   # natural layout (X, Y, Z)
      >>> jaxdecomp.config.transpose_axis_contiguous
      False
      >>> jaxdecomp.config.update("transpose_axis_contiguous", True)    # back to (Y, Z, X)
    """

    halo_comm_backend: Any = HaloCommBackend.HALO_COMM_NCCL
    transpose_comm_backend: Any = TransposeCommBackend.TRANSPOSE_COMM_NCCL
    transpose_axis_contiguous: bool = True

    def update(self, key: str, value: Any) -> None:
        """Set one setting (jaxdecomp's `config.update`)."""
        names = tuple(f.name for f in dataclasses.fields(self))
        if key not in names:
            raise ValueError(f"key {key!r} is not a valid configuration key; expected one of "
                             f"{names}")
        if key == "transpose_axis_contiguous" and not isinstance(value, (bool, int)):
            raise TypeError(f"`transpose_axis_contiguous` must be a bool; got {value!r}")
        if key in _ENUMS and value not in set(_ENUMS[key]):
            raise ValueError(f"`{key}` must be one of {[m.name for m in _ENUMS[key]]}; got "
                             f"{value!r}")
        setattr(self, key, bool(value) if key == "transpose_axis_contiguous" else value)


# jaxdecomp's API is a module-level settings object; this is pencilfft's only global state.
config = Config()


def layout() -> str:
    """The pencilfft layout jaxdecomp's current setting gives."""
    return "transposed" if config.transpose_axis_contiguous else "natural"
