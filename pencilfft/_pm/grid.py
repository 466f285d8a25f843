"""The grid a painter works on: one device's block of a split grid, padded by halos that the
neighbours fold (paint) and fill (readout) through the mesh.

Shared by the lattice form (`paint.py`) and catalogs (`catalog.py`): `GridPlan` is the static
part of both plans, `fold_halos` / `fill_halos` the traced neighbour exchanges (XLA's
collective permutes, or MPI inside XLA under mpirun), each the other's transpose; `run` runs a
per-device body on the plan's mesh, and `gather_devices` collects a body's checks from every
device (so that every process sees, and raises, the same).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .._decomposition.mesh import has_explicit_axes, is_tracer
from .._exchange import mpi as _mpi_exchange
from .._transforms.partitioned import place, with_mesh

__all__ = ["GridPlan", "device_rows", "fill_halos", "fold_halos", "gather_devices",
           "run"]


@dataclasses.dataclass(frozen=True)
class GridPlan:
    """The grid side of a paint/readout plan (hashable): `shape` (X, Y, Z) is the global grid,
    `names`/`sizes` the mesh axes splitting X and Y (None/1: not split), `halo` the pad
    (hx, hy) of each split axis (0 where not split).  A brick has three of each: X, Y and Z
    split by three mesh axes (`names` in the (X, Y, Z) order, any order of the mesh's axes),
    and `mesh_order` the mesh's own order of them, the order collectives name them in.

    A brick's padded block keeps Z's halos after its interior, [interior | high | low]: the
    CPU kernel offsets a particle's site along X and Y only, so a cell index below 0 along Z
    wraps (the kernel's indices are periodic in the padded block) onto the low pad at the end.
    """

    shape: tuple[int, int, int]
    window: str
    names: tuple[Any, ...]
    sizes: tuple[int, ...]
    halo: tuple[int, ...]
    mesh_order: tuple[Any, ...]

    @property
    def brick(self) -> bool:
        return len(self.names) == 3

    @property
    def block(self) -> tuple[int, int, int]:
        """One device's block of the grid (per device)."""
        bz = self.shape[2] // self.sizes[2] if self.brick else self.shape[2]
        return (self.shape[0] // self.sizes[0], self.shape[1] // self.sizes[1], bz)

    @property
    def padded(self) -> tuple[int, int, int]:
        """The block with its halos (per device)."""
        bx, by, bz = self.block
        hz = 2 * self.halo[2] if self.brick else 0
        return (bx + 2 * self.halo[0], by + 2 * self.halo[1], bz + hz)

    @property
    def offset(self) -> tuple[int, int]:
        """Where a block's interior starts in its padded block along X and Y (Z: at 0)."""
        return tuple(self.halo[:2])

    @property
    def devices(self) -> int:
        return int(np.prod(self.sizes))

    @property
    def axes(self) -> tuple:
        """The mesh axes splitting the grid, in the mesh's order (collectives' axis names)."""
        return tuple(n for n in self.mesh_order if n is not None)

    @property
    def field_spec(self) -> P:
        """The (X, Y, Z) part of the real-space spec."""
        return P(*self.names) if self.brick else P(*self.names, None)


def _send(x, name, n: int, direction: int, mpi: bool):
    """x to the neighbour `direction` (+1 / -1) along mesh axis `name` (periodic)."""
    if mpi:
        return _mpi_exchange.shift(x, name, n, direction, True)
    return jax.lax.ppermute(x, name, [(j, (j + direction) % n) for j in range(n)])


def _fold(g, axis: int, h: int, name, n: int, mpi: bool, wrapped: bool = False):
    """Add the pads (width h) of `axis` to the neighbours' edge cells; keep the interior.
    `wrapped`: the pads follow the interior, [interior | high | low] (a brick's Z)."""
    b = g.shape[axis] - 2 * h
    part = functools.partial(jax.lax.slice_in_dim, g, axis=axis)
    if wrapped:
        low, mid, high = part(b + h, b + 2 * h), part(0, b), part(b, b + h)
    else:
        low, mid, high = part(0, h), part(h, h + b), part(h + b, b + 2 * h)
    from_upper = _send(low, name, n, -1, mpi)  # the upper neighbour's low pad: my top cells
    from_lower = _send(high, name, n, +1, mpi)
    top = jax.lax.slice_in_dim(mid, b - h, b, axis=axis) + from_upper
    mid = jax.lax.dynamic_update_slice_in_dim(mid, top, b - h, axis=axis)
    bottom = jax.lax.slice_in_dim(mid, 0, h, axis=axis) + from_lower
    return jax.lax.dynamic_update_slice_in_dim(mid, bottom, 0, axis=axis)


def _fill(g, axis: int, h: int, name, n: int, mpi: bool, wrapped: bool = False):
    """g padded by h cells on both sides of `axis` with the neighbours' edge cells (the
    transpose of `_fold`; `wrapped`: both pads after the interior, high then low)."""
    b = g.shape[axis]
    low = _send(jax.lax.slice_in_dim(g, b - h, b, axis=axis), name, n, +1, mpi)
    high = _send(jax.lax.slice_in_dim(g, 0, h, axis=axis), name, n, -1, mpi)
    return jnp.concatenate([g, high, low] if wrapped else [low, g, high], axis=axis)


def fold_halos(g, p: GridPlan):
    """`_fold` along each split axis of p's grid (g's axes 1, 2 (and a brick's 3): X, Y (and
    Z) of a block), one after the other: the corners travel in two or three hops."""
    for axis in range(len(p.halo)):
        if p.halo[axis]:
            g = _fold(g, axis + 1, p.halo[axis], p.names[axis], p.sizes[axis], p.mpi,
                      wrapped=axis == 2)
    return g


def fill_halos(f, p: GridPlan):
    """`_fill` along each split axis of p's grid (f's axes 1, 2 (3)), the transpose of
    `fold_halos` (X, then Y, then Z: each round sends the pads the earlier ones filled, so the
    corners arrive too)."""
    for axis in range(len(p.halo)):
        if p.halo[axis]:
            f = _fill(f, axis + 1, p.halo[axis], p.names[axis], p.sizes[axis], p.mpi,
                      wrapped=axis == 2)
    return f


def run(body, args, in_specs, out_spec, mesh, p: GridPlan):
    """body(*args) on each device of `mesh` (shard_map with these specs), or on one device
    (mesh None).  Explicit or concrete inputs split otherwise are resharded first (shard_map
    refuses them)."""
    if mesh is None:
        return body(*args)
    args = [a if (np.ndim(a) == 0 or (is_tracer(a) and not has_explicit_axes(mesh))
                  or (not is_tracer(a) and not isinstance(mesh, jax.sharding.Mesh))) else
            place(a, NamedSharding(mesh, spec)) for a, spec in zip(args, in_specs)]
    if p.mpi:  # our MPI sends find their peers in the mesh the body is traced on
        body = with_mesh(body, mesh)
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec)(*args)


def device_rows(p: GridPlan):
    """(rows, spec): the identity matrix of the P devices, split one row per device: an input
    of `run` that tells each device its row for `gather_devices`.  (axis_index, which would say
    it too, and arrays made in the body, which jax must then mark as varying, are refused where
    jax evaluates a shard_map under ensure_compile_time_eval, jax 0.10.2.)"""
    axes = p.axes
    return jnp.eye(p.devices, dtype=jnp.int32), P(axes if axes else None)


def gather_devices(x, row, p: GridPlan):
    """Inside `run`'s body: x (varying over the plan's axes, 1-D) of every device, stacked
    along a new first axis, the same on all of them (out spec P()); `row` is this device's
    block of `device_rows`.  One collective for all of a body's checks: each one more costs
    a rendezvous of the devices."""
    axes = p.axes
    if not axes:
        return x[None]
    # a psum of one row per device: the result is typed invariant, which all_gather's is not
    return jax.lax.psum(row[0][:, None].astype(x.dtype) * x[None, :], axes)
