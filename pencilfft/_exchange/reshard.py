"""Several exchanges between the CPU devices of one process in one pass (a reshard).

A route often moves two or three mesh axes one after the other with no FFT between (a brick
P(a, b, c) onto the slab P((a, b, c), None, None): three exchanges).  Each exchange of ours
(`local`) is one pass over the block, so three in a row are three passes, where the layout
they reach could be written in one: every device's new block is a set of boxes of its peers'
blocks (heFFTe's reshape, in one process's shared memory).  This primitive is that one pass:
`local.cc`'s rendezvous, with a table of (source offset, destination offset, box) for every
pair of devices of a group (the devices that differ only along the mesh axes the exchanges
move), computed here from the two layouts when the program is lowered.

A layout: per array (global) axis, the mesh axes that split it, major first (`spec`); the
global axis each local axis of the block holds (`perm`, the block's axis order); every split
even (the exchanges it replaces need that too).  It is linear: its transpose is the reshard back
(the layouts swapped), vmap adds a whole leading axis.  On other platforms than CPUs it lowers
to the exchanges it replaces (XLA's all_to_all and transposes); it is only chosen on CPUs.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from .._native import threads as _threads
from . import local
from ._common import coordinates, def_linear, traced_mesh, within_processes

__all__ = ["RESHARD_TARGET", "inverse_steps", "reshard", "table"]

RESHARD_TARGET = local.RESHARD_TARGET

Spec = tuple[tuple[str, ...], ...]


def reshard(x: jax.Array, moved: tuple[str, ...], in_spec: Spec, in_perm: tuple[int, ...],
            out_spec: Spec, out_perm: tuple[int, ...], steps: tuple[tuple, ...]) -> jax.Array:
    """Inside shard_map: per-device block x of layout (in_spec, in_perm) as the block of layout
    (out_spec, out_perm), the same global array.  `moved`: the mesh axes whose place changes
    (a group: the devices that differ along them); `steps`: the exchanges (axis, n, split,
    gather, order) it replaces, for platforms without the custom call."""
    mesh = traced_mesh()
    moved = tuple(m for m in mesh.axis_names if m in moved)  # the mesh's order, as `where`'s
    if jax.process_count() > 1 and not all(within_processes(mesh, m) for m in moved):
        raise ValueError(f"`exchange`='local' cannot move mesh axes {moved} in one pass: their "
                         f"devices are in several processes (exchange='mixed' or 'auto' sends "
                         f"those through MPI)")
    sizes = tuple(zip(mesh.axis_names, (int(n) for n in mesh.axis_sizes)))
    return reshard_p.bind(x, coordinates(mesh, moved), sizes=sizes, moved=moved,
                          in_spec=in_spec, in_perm=tuple(in_perm), out_spec=out_spec,
                          out_perm=tuple(out_perm), steps=tuple(steps))


reshard_p = Primitive(RESHARD_TARGET)


def _splits(entry: tuple[str, ...], sizes: dict) -> int:
    return math.prod(sizes[m] for m in entry)


def _global_shape(local_shape, spec: Spec, perm, sizes: dict) -> tuple[int, ...]:
    out = [0] * len(local_shape)
    for k, g in enumerate(perm):
        out[g] = local_shape[k] * _splits(spec[g], sizes)
    return tuple(out)


def _local_shape(global_shape, spec: Spec, perm, sizes: dict) -> tuple[int, ...]:
    return tuple(global_shape[g] // _splits(spec[g], sizes) for g in perm)


def _strides(local_shape, perm) -> list[int]:
    """Each global axis's stride in a row-major block whose local axis k holds perm[k]."""
    local = [1] * len(local_shape)
    for k in range(len(local_shape) - 2, -1, -1):
        local[k] = local[k + 1] * local_shape[k + 1]
    out = [0] * len(local_shape)
    for k, g in enumerate(perm):
        out[g] = local[k]
    return out


def _starts(coords: dict, spec: Spec, shape, sizes: dict) -> list[int]:
    """Where a device's block starts along each global axis (its chunk of each split axis)."""
    out = []
    for g, entry in enumerate(spec):
        index = 0
        for m in entry:
            index = index * sizes[m] + coords.get(m, 0)
        out.append(index * (shape[g] // _splits(entry, sizes)))
    return out


def table(local_shape, sizes, moved, in_spec, in_perm, out_spec, out_perm):
    """(n, table, source strides, destination strides): per (destination i, source p) of a
    group, the box of p's block in i's, as (source offset, destination offset, dims per global
    axis), zeros where they do not meet (the other mesh axes' coordinates are
    alike within a group, so they are left at 0 on both sides)."""
    sizes = dict(sizes)
    shape = _global_shape(local_shape, in_spec, in_perm, sizes)
    out_local = _local_shape(shape, out_spec, out_perm, sizes)
    src, dst = _strides(local_shape, in_perm), _strides(out_local, out_perm)
    src_len = [shape[g] // _splits(e, sizes) for g, e in enumerate(in_spec)]
    dst_len = [shape[g] // _splits(e, sizes) for g, e in enumerate(out_spec)]
    groups = [dict(zip(moved, c)) for c in np.ndindex(*(sizes[m] for m in moved))]
    rows = []
    for ci in groups:
        d0 = _starts(ci, out_spec, shape, sizes)
        for cp in groups:
            s0 = _starts(cp, in_spec, shape, sizes)
            lo = [max(a, b) for a, b in zip(s0, d0)]
            hi = [min(a + la, b + lb) for a, la, b, lb in zip(s0, src_len, d0, dst_len)]
            if any(h <= lv for lv, h in zip(lo, hi)):
                rows += [0, 0] + [0] * len(shape)
                continue
            rows += [sum((lv - a) * st for lv, a, st in zip(lo, s0, src)),
                     sum((lv - b) * st for lv, b, st in zip(lo, d0, dst))]
            rows += [h - lv for lv, h in zip(lo, hi)]
    return len(groups), rows, src, dst


def _abstract_eval(x, where, *, sizes, moved, in_spec, in_perm, out_spec, out_perm, steps):
    del where, moved, steps
    shape = _global_shape(x.shape, in_spec, in_perm, dict(sizes))
    return x.update(shape=_local_shape(shape, out_spec, out_perm, dict(sizes)))


def inverse_steps(steps):
    out = []
    for name, n, split, gather, order in reversed(steps):
        out.append((name, n, order.index(gather), order.index(split),
                    tuple(order.index(i) for i in range(len(order)))))
    return tuple(out)


def _inverse(ct, where, *, sizes, moved, in_spec, in_perm, out_spec, out_perm, steps):
    return reshard_p.bind(ct, where, sizes=sizes, moved=moved, in_spec=out_spec,
                          in_perm=out_perm, out_spec=in_spec, out_perm=in_perm,
                          steps=inverse_steps(steps))


def _batch(args, dims, *, sizes, moved, in_spec, in_perm, out_spec, out_perm, steps):
    (x, where), (d, dwhere) = args, dims
    if dwhere is not None:
        raise NotImplementedError("internal: the reshard's coordinates are never batched")
    x = jnp.moveaxis(x, d, 0)  # a whole leading axis, first in both blocks
    shift = lambda perm: (0, *(g + 1 for g in perm))  # noqa: E731
    steps = tuple((name, n, split + 1, gather + 1, shift(order))
                  for name, n, split, gather, order in steps)
    return reshard_p.bind(x, where, sizes=sizes, moved=moved, in_spec=((),) + in_spec,
                          in_perm=shift(in_perm), out_spec=((),) + out_spec,
                          out_perm=shift(out_perm), steps=steps), 0


def _cpu_lowering(ctx, x, where, *, sizes, moved, in_spec, in_perm, out_spec, out_perm, steps):
    del steps
    local.ready_to_lower()
    n, rows, src, dst = table(ctx.avals_in[0].shape, sizes, moved, in_spec, in_perm,
                                 out_spec, out_perm)
    return jax.ffi.ffi_lowering(RESHARD_TARGET)(
        ctx, x, where, n=np.int64(n), table=np.asarray(rows, np.int64),
        src_strides=np.asarray(src, np.int64), dst_strides=np.asarray(dst, np.int64),
        threads=np.int64(_threads.available_cores()))


def _lower_other(x, where, *, sizes, moved, in_spec, in_perm, out_spec, out_perm, steps):
    del where, sizes, moved, in_spec, in_perm, out_spec, out_perm
    for name, _, split, gather, order in steps:  # the exchanges it stands for, XLA's way
        x = jnp.transpose(jax.lax.all_to_all(x, name, split, gather, tiled=True), order)
    return x


reshard_p.def_abstract_eval(_abstract_eval)
def_linear(reshard_p, _inverse)
batching.primitive_batchers[reshard_p] = _batch
mlir.register_lowering(reshard_p, _cpu_lowering, platform="cpu")
mlir.register_lowering(reshard_p, mlir.lower_fun(_lower_other, multiple_results=False))
