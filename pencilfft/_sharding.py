"""Where the data lives: the real-space and k-space shardings of a mesh.

These are the only two places that decide which global axis each mesh axis splits; the
planner, the loaders and the frequency helpers all ask here.
"""
from __future__ import annotations

import operator

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ._decomposition import check_mesh, mesh_axes

__all__ = ["real_space_spec", "k_space_spec", "real_space_sharding", "k_space_sharding", "LAYOUTS"]

LAYOUTS = ("transposed", "natural")


def _axis_names(mesh) -> tuple[str, str | None]:
    """The (first, second) mesh axis names; the second is None on a 1-axis mesh."""
    # AbstractMesh too: the planner passes the abstract mesh of a traced array under jit.
    (a, b), _ = mesh_axes(check_mesh(mesh))
    return a, b


def _check_ndim(ndim) -> int:
    """`ndim` as an int >= 3: a spec with fewer entries would not describe (..., X, Y, Z)."""
    try:
        if isinstance(ndim, bool):
            raise TypeError
        n = operator.index(ndim)
    except TypeError:
        raise TypeError(
            f"`ndim` must be an integer >= 3 (the global dimensions (..., X, Y, Z)); got "
            f"{_describe(ndim)}"
        ) from None
    if n < 3:
        raise ValueError(
            f"`ndim` must be at least 3 (the global dimensions (..., X, Y, Z)); got {n}"
        )
    return n


def _describe(v) -> str:
    if v is None:
        return "None"
    return f"{v!r} ({type(v).__name__})" if isinstance(v, (int, float, str)) else type(v).__name__


def real_space_spec(mesh, ndim: int = 3) -> P:
    """PartitionSpec of a real-space array of `ndim` global dimensions (..., X, Y, Z).

    X is split by the first mesh axis, Y by the second (if any); Z and batch axes are whole.
    """
    a, b = _axis_names(mesh)
    return P(*([None] * (_check_ndim(ndim) - 3)), a, b, None)


def k_space_spec(mesh, layout: str = "transposed", ndim: int = 3) -> P:
    """PartitionSpec of a k-space array in `layout`.

    transposed: global order (..., Y, Z, X); Y split by the first mesh axis, Z by the second.
    natural:    global order (..., X, Y, Z); the same split of Y and Z, X whole.
    """
    a, b = _axis_names(mesh)
    batch = [None] * (_check_ndim(ndim) - 3)
    if layout == "transposed":
        return P(*batch, a, b, None)
    if layout == "natural":
        return P(*batch, None, a, b)
    raise ValueError(f"`layout` must be one of {LAYOUTS}; got {layout!r}")


def real_space_sharding(mesh: Mesh, ndim: int = 3) -> NamedSharding:
    """NamedSharding of a real-space array (global shape (..., X, Y, Z)) on `mesh`."""
    return NamedSharding(mesh, real_space_spec(mesh, ndim))


def k_space_sharding(mesh: Mesh, layout: str = "transposed", ndim: int = 3) -> NamedSharding:
    """NamedSharding of the k-space array that pfft3d returns on `mesh` in `layout`."""
    return NamedSharding(mesh, k_space_spec(mesh, layout, ndim))
