"""Halo exchange of padded blocks, with jaxdecomp's semantics (`jaxdecomp.halo_exchange`).

A real-space array (..., X, Y, Z) split P(a, b) over a mesh (a, b) whose every device block has
been padded by `hx` cells on both sides of X and `hy` on both sides of Y: blocks of
(X/Pa, Y/Pb, Z) = (ix + 2 hx, iy + 2 hy, Z) global cells, of which the inner (ix, iy) are the
device's own ("interior") cells.  The exchange overwrites each block's halo cells with its
neighbours' cells as they were before the call, corners included: the low halo of width h gets
the lower neighbour's slice [-2h:-h], the high one the upper neighbour's [h:2h], the corners
the diagonal neighbour's.  Where h <= the interior, that is: with G the array of all interior
cells (shape (Pa ix, Pb iy, Z)), every block becomes its window of `np.pad(G, wrap)`; a wider
halo (jaxdecomp takes any block of at least 2h cells) receives part of the neighbour's own halo.
Halo cells beyond a non-periodic edge of G keep their values (jaxdecomp's rule, which `compat`
follows: they become 0).  A mesh axis of size 1 wraps within the block (periodic) or leaves the
halo alone (jaxdecomp: leaves it alone).

A *brick*, (..., X, Y, Z) split over three mesh axes, P(a, b, c) in any order of the mesh's axes
(the split particle codes use: every block a box, the least surface per volume), takes three
extents (hx, hy, hz) and three periods: a third round, along Z, carries whole Z-halo faces, X
and Y halos included, so that the edges and corners arrive in two or three hops.

Per device it is two rounds of neighbour sends (`ppermute`; across CPU processes with one
device each, MPI inside XLA, `_mpi_exchange.shift`, where the transforms' exchanges use it), X
then Y: the X round carries
whole X-halo rows, the Y round whole columns, X halos included, so the corners arrive from the
diagonal neighbour in two hops without a third round.  Like the transforms, it runs in
`shard_map` when the mesh is known and through the compiler-partitioned path
(`_transforms/partitioned.py`) when it is not; the adjoint (for grad) is `jax.linear_transpose` of the
same body: each halo's cotangent goes back to the cell it was copied from.
"""
from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .._decomposition.mesh import (batch_mesh, current_spec, find_mesh, has_explicit_axes,
                                   is_tracer)
from .._decomposition.rules import (batch_axes, check_batch, check_leading, check_split,
                                    mesh_axes)
from .._decomposition.sharding import real_space_spec
from .._exchange import mpi as _mpi_exchange
from .._transforms.partitioned import LinearOp, apply, place, run, with_mesh

__all__ = ["halo_exchange", "HaloExchange"]

_LABELS = ("X", "Y", "Z")


# ----------------------------------------------------------------------------------------------
# Per-device body (all shapes here are local blocks (..., bx, by, Z))


def _exchange_block(x: jax.Array, *, extents, periods, names, sizes,
                    like_jaxdecomp: bool = False, mpi: bool = False) -> jax.Array:
    """Fill the halos of one device's block; `names`/`sizes`: mesh axes splitting (X, Y), or
    (X, Y, Z) for a brick (one per extent).

    Every halo gets the cells its neighbour held *before* the call (jaxdecomp's rule): the low
    halo of width h the slice [-2h:-h] of the lower neighbour, the high one its upper
    neighbour's [h:2h], the corners the diagonal neighbour's.  Where h is wider than a block's
    interior those slices reach into the sender's own halo, as jaxdecomp's do (JaxPM paints
    into the halos, exchanges them, then folds them back).  The X round covers whole rows, Y
    halo columns included, so that the Y round, which sends whole columns, carries the corners
    from the diagonal neighbour in a second hop (and a brick's Z round, whole faces, the edges
    and corners in a second or third).  `like_jaxdecomp`: zero the halos beyond a
    non-periodic edge and leave the halos along a mesh axis of size 1 alone (jaxdecomp's
    values), instead of keeping the former and wrapping the latter within the block.  `mpi`:
    the sends go through MPI inside XLA (`_mpi_exchange.shift`) instead of ppermute.
    """
    first = x.ndim - 3  # the block axis of X
    orig = x
    keep = []  # (h, name, n, axis) of the earlier non-periodic axes (native rule)
    for i, (h, periodic, name, n) in enumerate(zip(extents, periods, names, sizes)):
        if h and not (like_jaxdecomp and n == 1):
            # Native: the halos beyond an earlier non-periodic edge keep their values too.
            x = _exchange_axis(x, orig, first + i, h, periodic, name, n,
                               keep_rows=tuple(keep), zero_edges=like_jaxdecomp, mpi=mpi)
        if h and not (periodic or like_jaxdecomp):
            keep.append((h, name, n, first + i))
    return x


def _index(name, size):
    # A Python 0, not an array, off the mesh: custom_partitioning refuses traced constants.
    return jax.lax.axis_index(name) if size > 1 else 0


def _exchange_axis(x, orig, axis: int, h: int, periodic: bool, name, n: int, keep_rows,
                   zero_edges: bool, mpi: bool = False):
    """One round along `axis`: the low and high halos of width h, sent from `x` (whole slabs
    across the other axes); what a halo keeps comes from `orig`, the block before the call.

    `keep_rows`: (h, name, n, axis) of every earlier axis that is not periodic (native rule):
    the halo rows along it of the blocks on its global edges keep their values (those corners
    and edges lie beyond that edge).  `zero_edges`: halos beyond a non-periodic edge become 0
    (jaxdecomp) instead of keeping their values.
    """
    b = x.shape[axis]

    def part(v, lo, hi):
        return jax.lax.slice_in_dim(v, lo, hi, axis=axis)

    low_edge, high_edge = part(x, h, 2 * h), part(x, b - 2 * h, b - h)
    old_low, old_high = part(orig, 0, h), part(orig, b - h, b)
    if n == 1:  # both halos lie beyond the global edges: wrap within the block, or keep
        new_low, new_high = (high_edge, low_edge) if periodic else (old_low, old_high)
    else:
        up = [(j, j + 1) for j in range(n - 1)] + ([(n - 1, 0)] if periodic else [])
        down = [(j + 1, j) for j in range(n - 1)] + ([(0, n - 1)] if periodic else [])
        if mpi:  # the same sends, through MPI inside XLA
            new_low = _mpi_exchange.shift(high_edge, name, n, 1, periodic)
            new_high = _mpi_exchange.shift(low_edge, name, n, -1, periodic)
        else:
            new_low = jax.lax.ppermute(high_edge, name, up)
            new_high = jax.lax.ppermute(low_edge, name, down)
        if not (periodic or zero_edges):  # ppermute left zeros on the edge blocks: keep
            i = _index(name, n)
            new_low = jnp.where(i == 0, old_low, new_low)
            new_high = jnp.where(i == n - 1, old_high, new_high)
    for hk, name_k, n_k, other in keep_rows:
        new_low = _keep_edges(new_low, old_low, hk, name_k, n_k, axis=other)
        new_high = _keep_edges(new_high, old_high, hk, name_k, n_k, axis=other)
    x = jax.lax.dynamic_update_slice_in_dim(x, new_low, 0, axis=axis)
    return jax.lax.dynamic_update_slice_in_dim(x, new_high, b - h, axis=axis)


def _keep_edges(new, old, hx: int, name, n: int, axis: int):
    """`new` with its first (last) hx rows along `axis` taken from `old` on the low (high)
    global edge of mesh axis `name` (which splits `axis`)."""
    i = _index(name, n)
    rows = jax.lax.broadcasted_iota(jnp.int32, new.shape, axis)
    keep = ((rows < hx) & (i == 0)) | ((rows >= new.shape[axis] - hx) & (i == n - 1))
    return jnp.where(keep, old, new)


# ----------------------------------------------------------------------------------------------
# The op, for shard_map (mesh known) and the compiler-partitioned path (mesh unknown)


@dataclasses.dataclass(frozen=True)
class HaloExchange(LinearOp):
    """halo_exchange of a global array of `shape` (a LinearOp: its mesh may be left open).

    Two extents: X and Y split P(a, b) by the mesh's last two axes.  Three: a brick, X, Y and Z
    split by the mesh axes `order` (None: as XLA's partitioner holds the input, else the mesh's
    last three axes in order)."""

    shape: tuple[int, ...]
    dtype: Any  # a numpy dtype (hashable)
    extents: tuple[int, ...]
    periods: tuple[bool, ...]
    like_jaxdecomp: bool = False  # jaxdecomp's values at non-periodic edges and size-1 axes
    deferred: Any = None  # a named mesh whose batch axes x (traced) lacks: see _decomposition.mesh.batch_mesh
    mpi: bool = False  # the sends through MPI inside XLA (`_mpi_exchange.auto`)
    order: tuple[str, str, str] | None = None  # a brick's mesh axes splitting (X, Y, Z)
    transposed: bool = False

    @property
    def brick(self) -> bool:
        return len(self.extents) == 3

    @property
    def reads_in_spec(self) -> bool:
        # A brick's mesh axes may split (X, Y, Z) in any order: the partitioner's spec says which.
        return self.brick

    @property
    def primal_in(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.shape, self.dtype)

    primal_out = primal_in

    def batched(self, n: int) -> HaloExchange:
        return dataclasses.replace(self, shape=(n,) + self.shape)

    def check_local(self) -> None:
        if self.brick and self.deferred is not None:
            _check_brick_batch(self.shape, self.deferred, _brick_order(None, self.deferred))
        else:
            super().check_local()

    def primal_local(self, x: jax.Array) -> jax.Array:
        return self._body(None)(x)

    def primal_on_mesh(self, mesh, in_spec=None):
        if self.brick:
            order = self.order or _brick_order(in_spec, mesh, len(self.shape))
            _check_brick_batch(self.shape, mesh, order)
            spec = _brick_spec(mesh, order, len(self.shape))
        else:
            order = None
            _check_pencil_batch(self.shape, mesh)
            check_batch(self.shape, mesh, "x")
            spec = real_space_spec(mesh, len(self.shape))
        body = self._body(mesh, order)
        if self.mpi:  # its sends find their peers in the concrete mesh
            body = with_mesh(body, mesh)
        return body, spec, spec

    def _body(self, mesh, order=None):
        """The per-device body on `mesh` (None: one device), after checking the blocks."""
        names, sizes = _split_axes(mesh, order, len(self.extents))
        _check_blocks(self.shape, self.extents, sizes, names, self.like_jaxdecomp)
        return functools.partial(_exchange_block, extents=self.extents, periods=self.periods,
                                 names=names, sizes=sizes, like_jaxdecomp=self.like_jaxdecomp,
                                 mpi=self.mpi and mesh is not None)

    def primal_rule(self) -> tuple[str, str]:
        return "i j k", "i j k"


def _split_axes(mesh, order, k: int):
    """(names, sizes) of the mesh axes splitting the k axes with halos: (X, Y) as the
    transforms split them, or a brick's (X, Y, Z) by `order`; None and 1 off the mesh."""
    if k == 2:
        return mesh_axes(mesh)
    if mesh is None:
        return (None,) * 3, (1,) * 3
    return tuple(order), tuple(mesh.shape[name] for name in order)


# ----------------------------------------------------------------------------------------------
# Bricks: which mesh axes split (X, Y, Z)


def _brick_order(spec, mesh, ndim: int = 3) -> tuple[str, str, str]:
    """The mesh axes splitting a brick's (X, Y, Z): those `spec` names there, one each, in any
    order of the mesh's axes; else (spec unknown, or not a brick) the mesh's last three axes."""
    names = tuple(mesh.axis_names)
    if len(names) < 3:
        raise ValueError(
            f"`halo_extents` has 3 entries (hx, hy, hz), the halos of a brick: an array split "
            f"over X, Y and Z by three mesh axes, P(a, b, c); but the mesh has {len(names)} "
            f"axes {names}: give 2 extents (hx, hy) and 2 periods for an array split P(a, b) "
            f"(P(a) on a 1-axis mesh)"
        )
    if spec is not None:
        entries = (tuple(spec) + (None,) * (ndim - len(spec)))[-3:]
        entries = tuple(e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in entries)
        if all(isinstance(e, str) and e in names for e in entries) and len(set(entries)) == 3:
            return entries
    return names[-3:]


def _brick_spec(mesh, order, ndim: int) -> P:
    """The brick's spec: (X, Y, Z) split by `order`, the other mesh axes (batch axes, in the
    mesh's order) splitting one leading axis each, the rest whole."""
    lead = [n for n in mesh.axis_names if n not in order]
    return P(*lead, *([None] * (ndim - 3 - len(lead))), *order)


def _check_brick_batch(shape, mesh, order) -> None:
    """ValueError naming `x` unless it has a leading axis for every mesh axis that is not one
    of the brick's, and every axis divides by the mesh axis splitting it."""
    lead = [n for n in mesh.axis_names if n not in order]
    n_lead = len(shape) - 3
    if n_lead < len(lead):
        raise ValueError(
            f"`x` has shape {tuple(shape)}: {n_lead} leading (batch) axes before (X, Y, Z), but "
            f"the mesh axes {tuple(lead)}, besides the brick's {tuple(order)}, each split one: "
            f"give it at least {len(lead)} leading axes, or use a mesh of the brick's 3 axes only"
        )
    check_leading(shape, lead, [mesh.shape[name] for name in lead], "x")
    for i, (name, label) in enumerate(zip(order, _LABELS)):
        index = len(shape) - 3 + i
        if shape[index] % mesh.shape[name]:
            raise ValueError(
                f"`x.shape[{index}]` ({label}={shape[index]}) must be divisible by mesh axis "
                f"{name!r} (={mesh.shape[name]}), which splits {label} in the brick"
            )


def _check_pencil_batch(shape, mesh) -> None:
    """With 2 extents the axes of a mesh of 3 or more before its last two are batch axes: an
    array with too few leading axes for them is most likely a brick."""
    names = batch_axes(mesh)[0]
    if len(shape) - 3 < len(names):
        raise ValueError(
            f"`x` has shape {tuple(shape)} on a mesh of {len(mesh.axis_names)} axes "
            f"{tuple(mesh.axis_names)}: with 2 `halo_extents` (hx, hy) the axes before the last "
            f"two are batch axes {names}, each splitting a leading axis of `x`, which has "
            f"{len(shape) - 3}; for a brick (X, Y and Z split over three mesh axes) give "
            f"`halo_extents` and `halo_periods` of length 3"
        )


def _brick_mesh(x, shape, mesh, known):
    """(mesh, deferred, order) for a brick, as `batch_mesh` for pencils: a traced x with too
    few leading axes for the mesh's other axes (under vmap) leaves them to the partitioner."""
    if mesh is None:
        return None, None, None
    order = _brick_order(known, mesh, len(shape))
    lead = [n for n in mesh.axis_names if n not in order]
    if lead and is_tracer(x) and len(shape) - 3 < len(lead):
        return None, mesh, None
    _check_brick_batch(shape, mesh, order)
    return mesh, None, order


# ----------------------------------------------------------------------------------------------
# Validation


def _check_extents(halo_extents) -> tuple[int, ...]:
    try:
        values = tuple(halo_extents)
        ints = tuple(operator.index(v) for v in values)
        bad = any(isinstance(v, (bool, np.bool_)) for v in values)
    except TypeError:
        bad = True
    if bad:
        raise TypeError(f"`halo_extents` must be 2 ints (hx, hy) or 3 (hx, hy, hz) for a brick; "
                        f"got {halo_extents!r}")
    if len(ints) not in (2, 3) or min(ints) < 0:
        raise ValueError(
            f"`halo_extents` must be 2 non-negative ints (hx, hy), the halo widths along X and Y, "
            f"or 3 (hx, hy, hz) for a brick (X, Y and Z split); got {halo_extents!r}"
        )
    return ints


def _check_periods(halo_periods, k: int) -> tuple[bool, ...]:
    """`halo_periods` as k bools, one per extent (None: all True)."""
    axes = "X, Y, Z"[: 3 * k - 2]
    if halo_periods is None:
        return (True,) * k
    try:
        values = tuple(halo_periods)
    except TypeError:
        values = None
    if values is None or not all(isinstance(v, (bool, np.bool_)) for v in values):
        raise TypeError(f"`halo_periods` must be {k} bools (along {axes}); got {halo_periods!r}")
    if len(values) != k:
        raise ValueError(f"`halo_periods` must be {k} bools (along {axes}), one per halo extent; "
                         f"got {halo_periods!r}")
    return tuple(bool(v) for v in values)


def _check_array(x) -> tuple[int, ...]:
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"`x` must be an array (jax.Array); got {type(x).__name__}")
    dtype = np.dtype(x.dtype)
    if not (dtype.kind in "biufc" or dtype == jnp.bfloat16):
        raise TypeError(f"`x` must have a numeric dtype; got {dtype}")
    shape = tuple(x.shape)
    if len(shape) < 3:
        raise ValueError(f"`x` must have at least 3 dimensions (..., X, Y, Z); got shape {shape}")
    return shape


def _check_blocks(shape, extents, sizes, names, like_jaxdecomp: bool = False) -> None:
    """Each block must split evenly and, along every axis exchanged, hold its two halos: a
    block of at least 2h cells (jaxdecomp's rule; the sender's slices [h:2h] and [-2h:-h])."""
    if len(extents) == 2:
        check_split(shape, sizes, names, "x")  # a brick's split: `_check_brick_batch`
    first = len(shape) - 3
    for i, (h, n, name, label) in enumerate(zip(extents, sizes, names, _LABELS)):
        axis = first + i
        if h == 0 or (like_jaxdecomp and n == 1):  # no round along this axis
            continue
        size = shape[axis]
        where = f"mesh axis {name!r} (={n})" if name is not None else "one block (no mesh axis)"
        block = size // n
        if block < 2 * h:
            raise ValueError(
                f"`halo_extents[{i}]` ({h}) is too large for the blocks along {label}: "
                f"{label}={size} split by {where} gives padded blocks of {block} cells, fewer "
                f"than its two halos (2*{h}); a block padded by h cells on each side must hold "
                f"at least 2h cells"
            )


def _canonical(spec, mesh, ndim: int) -> tuple:
    """A PartitionSpec as one entry per dimension, mesh axes of size 1 dropped."""
    out = []
    for entry in tuple(spec) + (None,) * (ndim - len(spec)):
        names = entry if isinstance(entry, tuple) else (entry,)
        kept = tuple(n for n in names if n is not None and mesh.shape[n] > 1)
        out.append(kept or None)
    return tuple(out)


def _known_spec(x):
    """x's spec where it is known at the call: a concrete array's, or a traced one's whose
    type is on a mesh with Explicit axes (an Auto one shows no split); else None."""
    if is_tracer(x):
        typed = getattr(jax.typeof(x), "sharding", None)
        if not (isinstance(typed, NamedSharding) and not typed.mesh.empty
                and has_explicit_axes(typed.mesh)):
            return None
    return current_spec(x)


def _refuse_brick(known, mesh, ndim: int) -> None:
    """2 extents for an array whose Z is split (a brick): the message names `halo_extents`."""
    if known is None or mesh is None:
        return
    if _canonical(known, mesh, ndim)[-1] is not None:
        raise ValueError(
            f"`x` is split over X, Y and Z as {P(*known)} (a brick), but `halo_extents` has 2 "
            f"entries (hx, hy): give `halo_extents` (hx, hy, hz) and `halo_periods` of length 3 "
            f"for a brick, or split Z by no mesh axis (P(a, b), X and Y only)"
        )


def _check_spec(x, mesh, spec, ndim: int, brick: bool = False) -> None:
    """Refuse an array whose blocks are not the blocks the halos belong to: P(a, b), or a
    brick's P(a, b, c)."""
    current = _known_spec(x)
    if current is None:
        return
    # Only the (X, Y, Z) blocks matter: leading (batch) axes are resharded as need be.
    if _canonical(current, mesh, ndim)[-3:] != _canonical(spec, mesh, ndim)[-3:]:
        if brick:
            raise ValueError(
                f"`x` is sharded as {P(*current)}; halo_exchange with 3 `halo_extents` fills "
                f"the halos of a brick, padded blocks split over X, Y and Z by one mesh axis "
                f"each (here {spec}; any order of the mesh's axes): place it so (e.g. as the "
                f"output of a shard_map that pads each block)"
            )
        raise ValueError(
            f"`x` is sharded as {P(*current)}; halo_exchange fills the halos of padded blocks "
            f"split {spec} (X by the pencil axis a, Y by b: the mesh's last two axes): place it with "
            f"pencilfft.real_space_sharding(mesh) (e.g. as the output of a shard_map that pads "
            f"each block)"
        )


# ----------------------------------------------------------------------------------------------
# Public function


def halo_exchange(x, halo_extents, halo_periods=None, *, mesh=None) -> jax.Array:
    """Fill the halo cells of every padded device block from its neighbours (jaxdecomp's op).

    Args:
      x: global array of shape (..., X, Y, Z), split P(a, b) over (X, Y) on a mesh (a, b) (P(a)
        on a 1-axis mesh), whose every device block, of (X/Pa, Y/Pb, Z) cells, is already padded
        by `hx` cells on both sides of X and `hy` on both sides of Y.  Leading axes are a
        batch, split by the mesh's batch axes if it has any (a mesh (c, ..., a, b)).  X/Pa must
        be at least 2 hx and Y/Pb at least 2 hy.  With 3 extents, a *brick*: X, Y and Z split
        by three mesh axes, P(a, b, c) in any order of the mesh's axes (x's sharding says
        which; where it is not known, the mesh's last three in order), every block of
        (X/Pa, Y/Pb, Z/Pc) cells padded by `hz` on both sides of Z too; the mesh's other axes,
        if any, split leading axes as batch axes do.
      halo_extents: (hx, hy), or (hx, hy, hz) for a brick: the halo widths (per side, per
        device block).  A halo may be wider than the block's interior (as jaxdecomp allows):
        the neighbours then send part of their own halos (the low halo gets the lower
        neighbour's cells [-2h:-h], the high one the upper neighbour's [h:2h], as they were
        before the call).
      halo_periods: one bool per extent, (along X, along Y[, along Z]): wrap around the global
        edges of the interior grid where True; where False the halo cells beyond the edge keep
        their values.  None (the default): periodic along every axis.
      mesh: the mesh; by default x's sharding, x's type under jit (Explicit axes), the ambient
        mesh, else (under jit) the one XLA's partitioner finds.

    Returns:
      An array like `x` (same global shape, dtype and sharding) whose halo cells hold the
      neighbouring blocks' edge cells, corners (and a brick's edges) included.  A mesh axis of
      size 1 wraps within the block (periodic) or leaves those halos alone.

    Raises:
      ValueError: extents too large for the blocks, fewer than 3 dimensions, an array not split
        P(a, b), 2 extents for a brick or 3 for an array that is not one, periods of another
        length than the extents (the message names the argument).
      TypeError: an argument of the wrong type.

    Example:
      Blocks of (8, 16, 16) cells on a 4x2 mesh, each padded by 1 cell on both sides of X and Y
      ((10, 18, 16)), then filled from the neighbours:

      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> spec = jax.sharding.PartitionSpec("x", "y")
      >>> pad = jax.shard_map(lambda b: jnp.pad(b, ((1, 1), (1, 1), (0, 0))), mesh=mesh,
      ...                     in_specs=spec, out_specs=spec)
      >>> x = jax.device_put(np.ones((32, 32, 16), np.float32), pencilfft.real_space_sharding(mesh))
      >>> y = pencilfft.halo_exchange(pad(x), (1, 1))
      >>> y.shape, y.addressable_shards[0].data.shape, float(y.min())
      ((40, 36, 16), (10, 18, 16), 1.0)

      A brick: blocks of (8, 8, 8) cells on a 2x2x2 mesh, padded by 2 cells on every side:

      >>> mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"))
      >>> spec = jax.sharding.PartitionSpec("a", "b", "c")
      >>> pad = jax.shard_map(lambda b: jnp.pad(b, 2), mesh=mesh, in_specs=spec, out_specs=spec)
      >>> x = jax.device_put(np.ones((16, 16, 16), np.float32),
      ...                    jax.sharding.NamedSharding(mesh, spec))
      >>> y = pencilfft.halo_exchange(pad(x), (2, 2, 2))
      >>> y.shape, y.addressable_shards[0].data.shape, float(y.min())
      ((24, 24, 24), (12, 12, 12), 1.0)
    """
    return exchange_halos(x, halo_extents, halo_periods, mesh, like_jaxdecomp=False)


def exchange_halos(x, halo_extents, halo_periods, mesh, *, like_jaxdecomp: bool) -> jax.Array:
    """`halo_exchange`; `like_jaxdecomp` gives jaxdecomp's values where the two differ (zeros
    beyond non-periodic edges, size-1 mesh axes untouched): `pencilfft.compat`'s."""
    extents = _check_extents(halo_extents)
    periods = _check_periods(halo_periods, len(extents))
    shape = _check_array(x)
    k = len(extents)
    mesh = find_mesh(x, mesh)
    known = _known_spec(x) if mesh is not None else None
    if k == 2:
        _refuse_brick(known, mesh, len(shape))
        if mesh is not None and not is_tracer(x):
            _check_pencil_batch(shape, mesh)
        mesh, deferred = batch_mesh(x, shape, mesh, "x")
        order = None
    else:
        mesh, deferred, order = _brick_mesh(x, shape, mesh, known)
    op = HaloExchange(shape, np.dtype(x.dtype), extents, periods, like_jaxdecomp, deferred,
                      mpi=_mpi_exchange.auto(jax.default_backend(), mesh), order=order)
    if mesh is None:
        if is_tracer(x):  # under jit with an Auto mesh: the partitioner will tell the mesh
            # What can be told without the mesh (the rest is checked when XLA partitions).
            _check_blocks(shape, extents, (1,) * k, (None,) * k, like_jaxdecomp)
            return apply(op, x) if any(extents) else x
        _refuse_unsharded(x)
    _, sharding, _ = op.on_mesh(mesh)  # validates the sizes
    _check_spec(x, mesh, sharding.spec, len(shape), brick=k == 3)
    if not any(extents):
        return place(x, sharding)
    return run(op, x, mesh)


def _refuse_unsharded(x) -> None:
    sharding = getattr(x, "sharding", None)
    n = len(sharding.device_set) if sharding is not None else 1
    if n > 1:
        raise ValueError(
            f"`x` is spread over {n} devices by a {type(sharding).__name__} that names no mesh; "
            "pass `mesh=` or place it with a NamedSharding"
        )
    raise ValueError(
        f"`x` is not sharded over a device mesh (a {type(x).__name__} on one device): "
        "halo_exchange fills the halos of the blocks of a global array split P(a, b) (a brick: "
        "P(a, b, c)) over a mesh; place it with "
        "jax.device_put(x, pencilfft.real_space_sharding(mesh)) or pass `mesh=`"
    )
