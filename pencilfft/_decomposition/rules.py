"""The decomposition rules, in one place: which mesh axes split which array axes, what must
divide what, and how uneven sizes are padded.

A real-space array (..., X, Y, Z) is split X over the mesh's pencil axis `a` (size Pa) and Y over
`b` (size Pb; absent, size 1, on a 1-axis "slab" mesh): the last two axes of a mesh of two or
more, the only axis of a 1-axis mesh.  Mesh axes before those two are *batch* axes: the i-th
splits the i-th leading axis of the array (an ensemble of fields), and nothing moves across
them.  X must be divisible by Pa, Y by Pb and each leading axis by its batch axis; the k-space
axes that do not divide are padded at their end (`round_up`).
Everything here is static (shapes and meshes only) and raises ValueError/TypeError that name
the argument.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax.sharding import AbstractMesh, Mesh

__all__ = ["mesh_axes", "batch_axes", "check_mesh", "split_problem", "check_split",
           "check_batch", "check_leading", "fits", "round_up", "process_grids"]

Axes = tuple[str | None, str | None]
Pdims = tuple[int, int]


def check_mesh(mesh: Any, *, concrete: bool = False) -> Any:
    """`mesh` itself if it is a Mesh or AbstractMesh with at least one axis.

    Its last two axes (its only axis) split (X, Y) (X); axes before them are batch axes.
    `concrete`: refuse an AbstractMesh too (the loaders place data on the mesh's devices; the
    planner also takes the abstract mesh of a traced array under jit)."""
    if not isinstance(mesh, Mesh if concrete else (Mesh, AbstractMesh)):
        got = "None" if mesh is None else type(mesh).__name__
        raise TypeError(
            f"`mesh` must be a jax.sharding.Mesh (e.g. jax.make_mesh((4, 2), ('x', 'y')) for "
            f"4x2 pencils, jax.make_mesh((2, 4, 2), ('b', 'x', 'y')) for a batch split in 2 "
            f"besides); got {got}"
        )
    if len(mesh.axis_names) == 0:
        raise ValueError("`mesh` has no axes; expected 1 (slab), 2 (pencil) or more (batch axes "
                         "first, then the pencil axes)")
    return mesh


def mesh_axes(mesh: Any) -> tuple[Axes, Pdims]:
    """((a, b), (Pa, Pb)): the axis names splitting (X, Y) in real space and their sizes (the
    mesh's last two axes); b is None and Pb 1 on a 1-axis mesh; ((None, None), (1, 1)) for no
    mesh (one device)."""
    if mesh is None:
        return (None, None), (1, 1)
    check_mesh(mesh)
    names = tuple(mesh.axis_names)
    sizes = dict(zip(names, mesh.axis_sizes))
    a, b = (names[0], None) if len(names) == 1 else names[-2:]
    return (a, b), (sizes[a], sizes[b] if b is not None else 1)


def batch_axes(mesh: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(names, sizes) of the mesh's batch axes: every axis before the last two (none for no
    mesh, a 1-axis or a 2-axis mesh).  The i-th splits the array's i-th leading axis."""
    if mesh is None or len(mesh.axis_names) <= 2:
        return (), ()
    names = tuple(mesh.axis_names)[:-2]
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
    return names, tuple(sizes[n] for n in names)


def check_batch(shape: Sequence[int], mesh: Any, argname: str) -> None:
    """ValueError naming `argname` unless the array's leading axes carry the mesh's batch axes:
    one leading axis per batch axis, each divisible by its size."""
    names, sizes = batch_axes(mesh)
    if not names:
        return
    n_lead = len(shape) - 3
    if n_lead < len(names):
        raise ValueError(
            f"`{argname}` has shape {tuple(shape)}: {n_lead} leading (batch) axes before "
            f"(X, Y, Z), but the mesh's batch axes {names} (the axes before its last two, of "
            f"sizes {sizes}) each split one: give it at least {len(names)} leading axes (e.g. "
            f"an ensemble of fields stacked on axis 0), or use a mesh of the pencil axes only"
        )
    check_leading(shape, names, sizes, argname)


def check_leading(shape: Sequence[int], names: Sequence[str], sizes: Sequence[int],
                  argname: str) -> None:
    """ValueError naming `argname` unless the i-th leading axis divides by the i-th of the
    batch axes `names` (of `sizes`) that split the leading axes."""
    for i, (name, n) in enumerate(zip(names, sizes)):
        if shape[i] % n:
            raise ValueError(
                f"`{argname}.shape[{i}]` (={shape[i]}) must be divisible by mesh batch axis "
                f"{name!r} (={n}), which splits that leading axis"
            )


def _pdims2(pdims: Sequence[int]) -> Pdims:
    return (pdims[0], pdims[1] if len(pdims) == 2 else 1)


def split_problem(shape: Sequence[int], pdims: Sequence[int],
                  axes: Sequence[str | None] = ("a", "b")) -> tuple[int, str] | None:
    """None if a real-space array of global `shape` (..., X, Y, Z) splits on `pdims` ((Pa,) or
    (Pa, Pb)); else (index of the first axis that does not divide, a phrase that says why)."""
    ndim = len(shape)
    for i, (label, n, name) in enumerate(zip("XY", _pdims2(pdims), axes)):
        size = shape[ndim - 3 + i]
        if n > 1 and size % n:
            return ndim - 3 + i, (
                f"({label}={size}) must be divisible by mesh axis {name!r} (={n}), which splits "
                f"{label} in real space"
            )
    return None


def check_split(shape: Sequence[int], pdims: Sequence[int], axes: Axes, argname: str) -> None:
    """ValueError naming `argname` unless `shape` splits on the mesh (see `split_problem`)."""
    problem = split_problem(shape, pdims, axes)
    if problem is not None:
        index, why = problem
        raise ValueError(f"`{argname}.shape[{index}]` {why}")


def fits(shape: Sequence[int], pdims: Sequence[int]) -> bool:
    """Whether a real-space array of global `shape` splits on `pdims`."""
    return split_problem(shape, pdims) is None


def round_up(n: int, m: int) -> int:
    """n padded to a multiple of m: the length of a k-space axis of n points split m ways."""
    return -(-n // m) * m


def process_grids(n: int) -> list[Pdims]:
    """Every (P, Q) with P * Q = n, P ascending: the meshes n devices can form."""
    return [(p, n // p) for p in range(1, n + 1) if n % p == 0]
