"""Catalogs: painting particles given by absolute positions, in any order on any device.

`pencilfft.paint(positions, weights, window, shape=...)` and `pencilfft.readout(field,
positions)` with positions (N, 3) (grid units, periodic box [0, X) x [0, Y) x [0, Z)) split over
all the mesh's devices along N.  Each device sends every particle to the device that owns the
cell it lies in, with one all_to_all of fixed-size buckets: `capacity` particles per (sender,
receiver) pair, so every shape is static under jit and nothing is gathered.  The owner paints
them into its block padded by a halo of (s + 1) // 2 cells (a window of support s reaches at most
that far from the particle's own cell), and the pads are folded into the neighbours as in the
lattice form (`grid.fold_halos`).  Readout sends the particles the same way, reads on the owner's
block with filled halos, and sends the values back along the reverse all_to_all.

On a mesh of three axes the grid is a brick (X, Y and Z split, `GridPlan`): the owner is found
along the three axes and the buckets go over all three mesh axes, in the mesh's order.

Capacity policy (explicit): a particle that does not fit in its bucket (more than `capacity`
particles on one device bound for one device) is not painted.  Eagerly this is a ValueError
naming the largest bucket and the capacity; under jit the sending device's block of the painted
field is NaN (and so are the neighbours' edge cells it sends), and readout returns NaN for
each particle that did not fit.  The default capacity is 2 N_local / P + 64 (N_local the
particles per device, P the devices), at most N_local: enough for particles in random order;
a catalog whose particles mostly sit on their owners' devices (e.g. sorted) wants capacity =
N_local (the buffers then hold P N_local particles per device).  A larger capacity is capped at
N_local: one device never sends more particles than it holds, so nothing can overflow then, and
the buffers stay P N_local (capacity=10**9 would otherwise ask for P 10**9 slots per device).

Non-finite positions (NaN, inf): eagerly a ValueError (`check`); under jit such a particle is
painted nowhere and its sending device's block is NaN, like an overflow, and readout returns
NaN for it.  Positions are made finite before routing (NaN cast to a cell index is undefined).
"""
from __future__ import annotations

import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from .._decomposition.rules import mesh_axes
from .grid import GridPlan, device_rows, fill_halos, fold_halos, gather_devices, run
from .kernel import paint_block, read_block
from .window import WINDOWS, check_window

__all__ = ["CatalogPlan", "plan_catalog", "paint_catalog", "read_catalog", "stats", "check"]


@dataclasses.dataclass(frozen=True)
class CatalogPlan(GridPlan):
    """Everything static about one catalog paint/readout: the grid (`GridPlan`), the particles
    each device holds (`n_local`) and the slots each device may receive (`capacity`)."""

    n_local: int
    capacity: int
    mpi: bool = False

    @property
    def particle_spec(self) -> P:
        return P(self.axes if self.axes else None, None)


def _check_shape(shape) -> tuple[int, int, int]:
    try:
        out = tuple(int(n) for n in shape)
    except TypeError:
        out = ()
    if len(out) != 3 or min(out) < 1:
        raise ValueError(f"`shape` must be the grid's 3 sizes (X, Y, Z) for a catalog; got "
                         f"{shape!r}")
    return out


def plan_catalog(shape, n: int, mesh, window: str, capacity, mpi: bool = False,
                 order=None) -> CatalogPlan:
    """The plan of a catalog of n particles painted onto (read from) a grid of `shape` on
    `mesh`; `order`: a brick's mesh axes splitting (X, Y, Z), None for X and Y split by the
    mesh's last two axes."""
    window = check_window(window)
    shape = _check_shape(shape)
    if order is None:
        names, sizes = mesh_axes(mesh)
        mesh_order = names
    else:
        names, sizes = tuple(order), tuple(int(mesh.shape[name]) for name in order)
        mesh_order = tuple(name for name in mesh.axis_names if name in order)
    ndev = int(np.prod(sizes))
    for axis, (size, name) in enumerate(zip(sizes, names)):
        if shape[axis] % size:
            raise ValueError(f"the grid's {'XYZ'[axis]} axis ({shape[axis]} cells) does not "
                             f"split evenly over mesh axis {name!r} of size {size}")
    if n % ndev:
        raise ValueError(f"`positions`: the catalog's {n} particles do not split evenly over "
                         f"the mesh's {ndev} devices; pad it with zero-weight particles")
    n_local = n // ndev
    if capacity is None:
        capacity = n_local if ndev == 1 else min(n_local, 2 * -(-n_local // ndev) + 64)
    elif isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral):
        raise TypeError(f"`capacity` must be a positive int (particles one device may send "
                        f"to another); got {type(capacity).__name__}")
    elif capacity < 1:
        raise ValueError(f"`capacity` must be a positive int (particles one device may send "
                         f"to another); got {capacity!r}")
    # A device sends at most the N_local particles it holds to any one device: more slots could
    # never fill, and would only grow the buffers (P * capacity per device).  Capped silently.
    capacity = max(1, min(int(capacity), n_local))
    # cells floor(x) - (s - 1) // 2 ... floor(x) + s // 2 + (s odd): (s + 1) // 2 each way
    h = max(1, (WINDOWS[window] + 1) // 2)
    halo = tuple(h if s > 1 else 0 for s in sizes)
    for axis, (hh, size) in enumerate(zip(halo, sizes)):
        if hh > shape[axis] // max(size, 1):
            raise ValueError(f"`shape`: the blocks along {'XYZ'[axis]} ({shape[axis]} cells "
                             f"split {size} ways: {shape[axis] // size}) are thinner than the "
                             f"halo of window {window!r} ({hh} cells)")
    return CatalogPlan(shape, window, names, sizes, halo, mesh_order, n_local, int(capacity),
                       mpi)


# ----------------------------------------------------------------------------------------------
# Per-device body


def _index(name, size):
    return jax.lax.axis_index(name) if size > 1 else 0


def _owners(pos, p: CatalogPlan):
    """(positions wrapped into the box, their cells, the device owning each, whether each
    particle's position is finite).  A non-finite position is routed as if at the origin (a NaN
    cast to an index is undefined); the caller poisons what it touches."""
    finite = jnp.all(jnp.isfinite(pos), axis=-1)
    posm = jnp.mod(jnp.where(finite[:, None], pos, 0), jnp.asarray(p.shape, pos.dtype))
    cells = jnp.clip(jnp.floor(posm).astype(jnp.int32), 0, jnp.asarray(p.shape, jnp.int32) - 1)
    bx, by, bz = p.block
    if not p.brick:
        dest = (cells[:, 0] // bx) * p.sizes[1] + cells[:, 1] // by
        return posm, cells, dest, finite
    # the owner's index in the all_to_all over p.axes: row-major in the mesh's order
    dest, stride = 0, 1
    for name in reversed(p.mesh_order):
        axis = p.names.index(name)
        dest = dest + (cells[:, axis] // p.block[axis]) * stride
        stride *= p.sizes[axis]
    return posm, cells, dest, finite


def _route(pos, p: CatalogPlan):
    """Where each local particle goes: (order, bucket of each sorted particle, its slot, kept,
    local padded coordinates of the particles on their owners, sorted, finite)."""
    posm, cells, dest, finite = _owners(pos, p)
    bx, by, _ = p.block
    order = jnp.argsort(dest, stable=True)
    sd = dest[order]
    counts = jnp.bincount(dest, length=p.devices)
    starts = jnp.cumsum(counts) - counts
    slot = jnp.arange(pos.shape[0], dtype=jnp.int32) - starts[sd].astype(jnp.int32)
    kept = slot < p.capacity
    # coordinates in the owner's padded block (Z whole, or a brick's Z from its block's start:
    # its pads follow the interior, `GridPlan`; an unsplit axis keeps the global one)
    bz = p.block[2]
    owner = jnp.stack([(cells[:, 0] // bx) * bx, (cells[:, 1] // by) * by,
                       (cells[:, 2] // bz) * bz if p.brick else jnp.zeros_like(cells[:, 0])],
                      axis=-1).astype(pos.dtype)
    halo = jnp.asarray(p.offset + (0,), pos.dtype)
    local = (posm - owner + halo)[order]
    return order, sd, slot, kept, local, finite


def _exchange(x, p: CatalogPlan, axis: int):
    """The all_to_all of buckets along `axis` (P buckets, one per device in the order of
    p.axes: the mesh's)."""
    if p.devices == 1:
        return x
    return jax.lax.all_to_all(x, p.axes, axis, axis, tiled=True)


def _buckets(vals, sd, slot, p: CatalogPlan, fill):
    """(P, capacity, ...) buckets of the sorted particles' `vals` (the rest `fill`)."""
    buf = jnp.full((p.devices, p.capacity) + vals.shape[1:], fill, vals.dtype)
    return buf.at[sd, slot].set(vals, mode="drop")


def _send_positions(local, sd, slot, p: CatalogPlan):
    """The buckets of positions; empty slots at the block's first interior cell (they carry
    weight 0, and their readouts are dropped)."""
    inside = jnp.asarray(p.offset + (0,), local.dtype)
    used = _buckets(jnp.ones(local.shape[:1], jnp.bool_), sd, slot, p, False)[..., None]
    return jnp.where(used, _buckets(local, sd, slot, p, 0), inside)


def _paint_body(pos, w, *, p: CatalogPlan):
    order, sd, slot, kept, local, finite = _route(pos, p)
    w = jnp.broadcast_to(jnp.asarray(w, pos.dtype), pos.shape[:1])[order]
    recv_pos = _exchange(_send_positions(local, sd, slot, p), p, 0).reshape(-1, 1, 1, 3)
    recv_w = _exchange(_buckets(w, sd, slot, p, 0), p, 0).reshape(1, -1, 1, 1)
    g = paint_block(recv_pos, recv_w, offset=(0, 0), shape=p.padded, window=p.window,
                    absolute=True)
    # a particle dropped here, or one with no position: this block is NaN
    g = jnp.where(jnp.all(kept) & jnp.all(finite), g, jnp.nan)
    return fold_halos(g, p)[0]


def _read_body(f, pos, *, p: CatalogPlan):
    f = fill_halos(f, p)
    order, sd, slot, kept, local, finite = _route(pos, p)
    recv_pos = _exchange(_send_positions(local, sd, slot, p), p, 0).reshape(-1, 1, 1, 3)
    vals = read_block(f, recv_pos, offset=(0, 0), window=p.window, absolute=True)
    C = f.shape[0]
    back = _exchange(vals.reshape(C, p.devices, p.capacity), p, 1)
    got = back[:, sd, jnp.minimum(slot, p.capacity - 1)]
    # particles that did not fit, or have no position: NaN, never 0
    got = jnp.where(kept & finite[order], got, jnp.nan)
    return jnp.zeros_like(got).at[:, order].set(got)


# ----------------------------------------------------------------------------------------------
# Entry points (from paint.paint / readout), on global (traced) arrays


def paint_catalog(pos, w, p: CatalogPlan, mesh) -> jax.Array:
    """The painted grid (X, Y, Z), split P(a, b), of positions (N, 3) and weights (scalar or
    (N,)) split over all devices along N."""
    w_spec = P() if w.ndim == 0 else P(p.particle_spec[0])
    return run(functools.partial(_paint_body, p=p), (pos, w), (p.particle_spec, w_spec),
               p.field_spec, mesh, p)


def read_catalog(f, pos, p: CatalogPlan, mesh) -> jax.Array:
    """(C, N): the channels of f (C, X, Y, Z) at the positions (N, 3)."""
    return run(functools.partial(_read_body, p=p), (f, pos), (P(None, *p.field_spec),
               p.particle_spec), P(None, p.particle_spec[0]), mesh, p)


# ----------------------------------------------------------------------------------------------
# Checks of concrete positions (paint.py runs `stats` in the same program as the call, and
# `check` on its values)


def _stats_body(pos, row, *, p: CatalogPlan):
    _, _, dest, finite = _owners(pos, p)
    fullest = jnp.max(jnp.bincount(dest, length=p.devices))
    every = gather_devices(jnp.stack([fullest, jnp.sum(~finite)]).astype(jnp.int32), row, p)
    return jnp.stack([jnp.max(every[:, 0]), jnp.sum(every[:, 1])])


def stats(pos, p: CatalogPlan, mesh):
    """[the fullest bucket of any device, the particles with a non-finite position] (int32,
    the same on every device and process)."""
    rows, spec = device_rows(p)
    return run(functools.partial(_stats_body, p=p), (pos, rows), (p.particle_spec, spec),
               P(), mesh, p)


def check(values, p: CatalogPlan) -> None:
    """Refuse, with the numbers, what `stats` found (concrete values)."""
    fullest, bad = (int(v) for v in values)
    if bad:
        raise ValueError(f"`positions`: {bad} particles have a NaN or infinite coordinate; "
                         f"positions must be finite (under jax.jit their device's block of "
                         f"the painted field is NaN, and readout gives NaN for them)")
    if fullest > p.capacity:
        raise ValueError(f"`positions`: a device holds {fullest} particles bound for one "
                         f"device, more than `capacity` ({p.capacity}); pass capacity >= "
                         f"{fullest} (particles one device may send to another)")
