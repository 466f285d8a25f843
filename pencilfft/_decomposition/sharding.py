"""Where the data lives: the real-space and k-space shardings of a mesh.

These are the only two places that decide which global axis each mesh axis splits; the
planner, the loaders and the frequency helpers all ask here.
"""
from __future__ import annotations

import operator

from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .rules import batch_axes, check_mesh, mesh_axes

__all__ = ["real_space_spec", "k_space_spec", "real_space_sharding", "k_space_sharding",
           "displacement_sharding", "get_fft_output_sharding", "LAYOUTS"]

LAYOUTS = ("transposed", "natural")


def _axis_names(mesh) -> tuple[str, str | None]:
    """The (first, second) mesh axis names; the second is None on a 1-axis mesh."""
    # AbstractMesh too: the planner passes the abstract mesh of a traced array under jit.
    (a, b), _ = mesh_axes(check_mesh(mesh))
    return a, b


def _lead(mesh, ndim) -> list:
    """The spec entries of the leading (batch) axes: the mesh's batch axes in order, then None.

    `ndim` None: 3 plus one per batch axis (the smallest array the mesh splits)."""
    names, sizes = batch_axes(mesh)
    n = len(names) + 3 if ndim is None else _check_ndim(ndim)
    if n - 3 < len(names):
        raise ValueError(
            f"`ndim` (={n}) is too small for the mesh's batch axes {names} (of sizes {sizes}), "
            f"which split one leading axis each: expected at least {len(names) + 3}"
        )
    return list(names) + [None] * (n - 3 - len(names))


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


def real_space_spec(mesh, ndim: int | None = None) -> P:
    """PartitionSpec of a real-space array of `ndim` global dimensions (..., X, Y, Z).

    X is split by the pencil axis a (the mesh's second-to-last axis, its only one on a 1-axis
    mesh), Y by b (its last, if any); Z is whole; the leading axes are split by the mesh's
    batch axes in order, the rest whole.  `ndim` None: 3 plus one per batch axis.
    """
    a, b = _axis_names(mesh)
    return P(*_lead(mesh, ndim), a, b, None)


def k_space_spec(mesh, layout: str = "transposed", ndim: int | None = None) -> P:
    """PartitionSpec of a k-space array in `layout`.

    transposed: global order (..., Y, Z, X); Y split by the pencil axis a, Z by b.
    natural:    global order (..., X, Y, Z); the same split of Y and Z, X whole.
    Leading axes as in `real_space_spec`.
    """
    a, b = _axis_names(mesh)
    batch = _lead(mesh, ndim)
    if layout == "transposed":
        return P(*batch, a, b, None)
    if layout == "natural":
        return P(*batch, None, a, b)
    raise ValueError(f"`layout` must be one of {LAYOUTS}; got {layout!r}")


def real_space_sharding(mesh: Mesh, ndim: int | None = None) -> NamedSharding:
    """NamedSharding of a real-space array (global shape (..., X, Y, Z)) on `mesh`.

    `ndim` (default: 3 plus one per batch axis of the mesh) is the global number of dimensions:
    X is split by the mesh's pencil axis a, Y by b, Z is whole, and the leading axes by the batch
    axes in order.

    Raises:
      ValueError, TypeError: `ndim` below 3, or too small for the mesh's batch axes.

    Example:
      >>> pencilfft.real_space_sharding(jax.make_mesh((4, 2), ("x", "y"))).spec
      P('x', 'y', None)
      >>> pencilfft.real_space_sharding(jax.make_mesh((2, 2, 2), ("c", "x", "y"))).spec
      P('c', 'x', 'y', None)
    """
    return NamedSharding(mesh, real_space_spec(mesh, ndim))


def displacement_sharding(mesh: Mesh, ndim: int | None = None) -> NamedSharding:
    """NamedSharding of a vector field on the grid, global shape (..., X, Y, Z, C): `paint`'s and
    `readout`'s displacements `dx` (X, Y, Z, 3), `zeldovich_displacement`'s psi.

    The grid axes are split as in `real_space_sharding` (X by the mesh's pencil axis a, Y by
    b, the leading axes by its batch axes), the last axis (the components) whole.
    `real_space_sharding(mesh, 4)` is not this: it takes the first of 4 axes for a batch axis.
    `ndim` (default: 4 plus one per batch axis of the mesh) counts the component axis.

    Raises:
      ValueError, TypeError: `ndim` below 4, or too small for the mesh's batch axes.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> pencilfft.displacement_sharding(mesh).spec
      P('x', 'y', None, None)
      >>> pencilfft.real_space_sharding(mesh, 4).spec      # a batch of fields instead
      P(None, 'x', 'y', None)
      >>> dx = jax.device_put(np.zeros((32, 32, 32, 3), np.float32),
      ...                     pencilfft.displacement_sharding(mesh))
      >>> float(pencilfft.paint(dx).mean())
      1.0
    """
    names, sizes = batch_axes(check_mesh(mesh))
    if ndim is not None:
        try:
            if isinstance(ndim, bool):
                raise TypeError
            ndim = operator.index(ndim)
        except TypeError:
            raise TypeError(f"`ndim` must be an integer >= 4 (the global dimensions (..., X, Y, "
                            f"Z, C)); got {_describe(ndim)}") from None
        if ndim < 4:
            raise ValueError(f"`ndim` must be at least 4 (the global dimensions (..., X, Y, Z, "
                             f"C)); got {ndim}")
        if ndim < 4 + len(names):
            raise ValueError(
                f"`ndim` (={ndim}) is too small for the mesh's batch axes {names} (of sizes "
                f"{sizes}), which split one leading axis each: expected at least "
                f"{4 + len(names)}")
    spec = real_space_spec(mesh, None if ndim is None else ndim - 1)
    return NamedSharding(mesh, P(*spec, None))


def k_space_sharding(mesh: Mesh, layout: str = "transposed",
                     ndim: int | None = None) -> NamedSharding:
    """NamedSharding of the k-space array that pfft3d returns on `mesh` in `layout`.

    Y is split by the mesh's pencil axis a and Z by b, in both layouts: `(..., Y, Z, X)`
    transposed, `(..., X, Y, Z)` natural; leading axes as in `real_space_sharding`.

    Raises:
      ValueError: a bad `layout`, or `ndim` as in `real_space_sharding`.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> pencilfft.k_space_sharding(mesh).spec
      P('x', 'y', None)
      >>> pencilfft.k_space_sharding(mesh, "natural").spec
      P(None, 'x', 'y')
    """
    return NamedSharding(mesh, k_space_spec(mesh, layout, ndim))


def get_fft_output_sharding(fft_sharding, *, layout: str = "transposed",
                            ndim: int | None = None) -> NamedSharding:
    """The sharding of `pfft3d`'s output for an input in `fft_sharding` (jaxdecomp's function,
    also `pencilfft.get_fft_output_sharding`).

    Args:
      fft_sharding: a NamedSharding, the input's (pfft3d reshards any input to X split by the
        mesh's pencil axis a and Y by b, so only the mesh matters).
      layout: pfft3d's `layout` (`compat`'s follows jaxdecomp's `transpose_axis_contiguous`).
      ndim: number of global dimensions of the array (default: len(sharding.spec), at least 3
        plus one per batch axis of the mesh); leading axes beyond 3 are a batch, split by the
        mesh's batch axes (those before its last two) in order.
    Returns the k-space NamedSharding: Y split by a and Z by b, X whole.  On a (P, 1) mesh
    jaxdecomp's splits Z instead.

    Raises:
      TypeError: `fft_sharding` is not a NamedSharding.
      ValueError: a bad `layout` or `ndim`.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> pencilfft.get_fft_output_sharding(pencilfft.real_space_sharding(mesh),
      ...                                   layout="natural").spec
      P(None, 'x', 'y')
    """
    if not isinstance(fft_sharding, NamedSharding):
        raise TypeError(
            f"`fft_sharding` must be a jax.sharding.NamedSharding (e.g. x.sharding); got "
            f"{type(fft_sharding).__name__}"
        )
    mesh = fft_sharding.mesh
    if ndim is None:
        ndim = max(3 + len(batch_axes(mesh)[0]), len(fft_sharding.spec))
    return k_space_sharding(mesh, layout, ndim)
