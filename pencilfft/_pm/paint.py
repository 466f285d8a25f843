"""Painting particles onto a sharded grid and reading fields out at them: `paint`, `readout`.

The lattice form of particle-mesh codes (JaxPM's `cic_paint_dx` / `cic_read_dx`): particle
(i, j, k) sits at (i, j, k) + dx[i, j, k] (grid units, periodic box) and dx (X, Y, Z, 3) is split
like a real-space field, P(a, b) over (X, Y).  Each device paints its own particles into its
block padded by h cells on each side of every split axis, sends the pads to its neighbours, who
add them to their edge cells, and keeps its interior; readout fills the same pads with the
neighbours' edge cells and reads there.  An axis that no mesh axis splits (Z, but on a brick; X
or Y on slabs or one device) is not padded: its cell indices wrap around the whole axis.

Bricks: on a mesh of three axes dx may be split P(a, b, c, None), over X, Y and Z in any order
of the mesh's axes (`brick_order` tells from dx's sharding, or, where it is unknown, takes a
3-axis mesh in its order); the field is then split P(a, b, c), the block padded along all
three axes (`grid.GridPlan`) and folded one axis after the other.  Catalogs on a 3-axis mesh
paint onto the brick in the mesh's order.

The halo h is chosen here, from the window's support s and the bound D on the displacements
(`max_displacement`, default `DEFAULT_MAX_DISPLACEMENT`): h = floor(D + s / 2) covers every cell
a particle within D cells of its site touches (with interlacing, floor(D + 1/2 + s/2): the
second copy is painted 1/2 cell lower).  A particle beyond the halo (|dx| >= h + 1 - s/2 along a
split axis) would be painted into the wrong cells: an eager call raises ValueError naming the
largest displacement and the halo, and either the max_displacement that covers it or, where no
halo fits in a block, the largest this mesh allows and the ways out; under jit (where values are
unknown) the device holding it turns its whole block, and what it sends its neighbours, into
NaN, so the error shows in the result instead of passing silently.  A NaN or infinite
displacement is treated alike (a ValueError eagerly, its device's block NaN under jit); a NaN
or infinite weight is a ValueError eagerly and, under jit, painted as it is (NaN in the cells
its particle reaches).

Eager calls: every call (lattice or catalog, paint or readout, interlaced or not) is one
program, `_eager_program`, compiled once per static configuration (`_Call`: plan, mesh,
interlacing) and per shapes, dtypes and shardings, and cached by jax.jit; it returns the result
and the checks of the concrete inputs (largest displacement, non-finite values, fullest bucket),
which are then read on the host and refused with a ValueError.  Dispatching the ~200 operations
of a call one by one took seconds; the cached program takes about as long as under jit.
Under a transformation the call is one jit too (`_traced_program`): inlined under jax.jit, and
under an eager jax.grad or jax.vmap its derivative or batched form is compiled once and kept
(an eager grad of a 16^3 paint took 6.5 s per call op by op, 7 ms so).  Nothing is checked
there, but a concrete position array closed over by a traced function: `_compiled_checks` runs
the checks on it when it is traced.

Static planning (`plan`: mesh axes, halo widths, limits) is apart from the traced bodies
(`_paint_body`, `_read_body`).  The per-block work is `kernel.py` (the CPU kernel, or XLA's
scatter/gather elsewhere).  Catalogs (positions (N, 3)) are `catalog.py`'s; interlacing
(`paint(..., interlace=True)`) is `_apply` here.  Where the mesh is known (given, in a
sharding, an Explicit type, `jax.set_mesh`) or only in an Auto type under jit, the bodies run in
`shard_map` on it (`grid.run`); with no mesh at all, on one device.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .._decomposition.mesh import (current_spec, find_mesh, has_explicit_axes, is_tracer,
                                   typed_mesh)
from .._decomposition.rules import mesh_axes
from .._exchange import mpi as _mpi_exchange
from .._transforms.fft import pirfft3d, prfft3d
from .._transforms.freq import rfftfreq3d
from .._transforms.numpy_fft import irfftn, rfftn
from .._transforms.partitioned import place
from . import catalog as _catalog
from .catalog import CatalogPlan, paint_catalog, plan_catalog, read_catalog
from .grid import (GridPlan, device_rows, fill_halos, fold_halos, gather_devices,
                   run)
from .kernel import paint_block, read_block
from .window import WINDOWS, check_window

__all__ = ["paint", "readout", "DEFAULT_MAX_DISPLACEMENT"]

DEFAULT_MAX_DISPLACEMENT = 4.0  # cells: the halo's default bound on |dx| along split axes
INTERLACE_SHIFT = 0.5  # cells: interlacing's second copy is painted this much lower on each axis


# ----------------------------------------------------------------------------------------------
# Static planning


@dataclasses.dataclass(frozen=True)
class PaintPlan(GridPlan):
    """Everything static about one lattice paint/readout: the grid (`GridPlan`), `limit` the
    largest |dx| (exclusive) along a split axis that the halo takes, `mpi` whether the
    neighbour sends go through MPI inside XLA."""

    limit: float
    mpi: bool


def halo_width(window: str, max_displacement: float) -> int:
    """h = floor(D + s/2): the cells a window of support s reaches beyond a particle's own site
    when it has moved at most D cells."""
    return int(math.floor(max_displacement + WINDOWS[window] / 2))


def _check_displacement(max_displacement) -> float | None:
    if max_displacement is None:
        return None
    if isinstance(max_displacement, bool) or not isinstance(max_displacement, numbers.Real):
        raise TypeError(f"`max_displacement` must be a number of cells (the bound on |dx|); got "
                        f"{type(max_displacement).__name__}")
    d = float(max_displacement)
    if not (d >= 0 and math.isfinite(d)):
        raise ValueError(f"`max_displacement` must be a finite number >= 0 (cells); got {d}")
    return d


def split_axes(mesh, order=None):
    """(names, sizes, mesh_order) of the mesh axes splitting the grid: (X, Y) by the mesh's last
    two axes (`mesh_axes`), or a brick's (X, Y, Z) by `order` (three of the mesh's axes, in any
    order; `mesh_order` is the mesh's own order of them)."""
    if order is None:
        names, sizes = mesh_axes(mesh)
        return names, sizes, names
    return (tuple(order), tuple(int(mesh.shape[n]) for n in order),
            tuple(n for n in mesh.axis_names if n in order))


def plan(shape, mesh, window: str, max_displacement, mpi: bool = False,
         shift: float = 0.0, order=None) -> PaintPlan:
    """The plan of a lattice paint/readout of global `shape` on `mesh` (None: one device).
    `shift`: interlacing also paints every particle `shift` cells lower, so the halo takes
    max_displacement + shift.  `order`: a brick's mesh axes splitting (X, Y, Z) (`brick_order`),
    None for X and Y split by the mesh's last two axes."""
    window = check_window(window)
    d = _check_displacement(max_displacement)
    names, sizes, mesh_order = split_axes(mesh, order)
    k = len(names)
    for axis, (n, size, name) in enumerate(zip(shape[:k], sizes, names)):
        if n % size:
            raise ValueError(f"the grid's {'XYZ'[axis]} axis ({n} cells) does not split evenly "
                             f"over mesh axis {name!r} of size {size}")
    s = WINDOWS[window]
    blocks = [n // size for n, size in zip(shape[:k], sizes) if size > 1]
    along = "X or Y" if k == 2 else "X, Y or Z"
    if d is None:  # the default bound, or as much as the blocks allow
        h = min([halo_width(window, DEFAULT_MAX_DISPLACEMENT + shift)] + blocks)
        if h + 1 - s / 2 <= 0:
            raise ValueError(f"the blocks ({min(blocks)} cells along a split axis) are too "
                             f"small for window {window!r}: use fewer devices along {along}")
    else:
        h = halo_width(window, d + shift)
        for axis, (n, size) in enumerate(zip(shape[:k], sizes)):
            block = n // size
            label = "XYZ"[axis]
            if size > 1 and h > block and block + 1 - s / 2 - shift <= 0:
                raise ValueError(
                    f"the blocks along {label} ({block} cells: {n} split {size} ways) are "
                    f"too thin for window {window!r}{' and interlacing' if shift else ''} with "
                    f"any max_displacement: use a mesh with fewer devices along {label}, "
                    f"or leave max_displacement out (the default halo is the block)")
            if size > 1 and h > block:
                # block + 1 - s/2 - shift: the largest D with floor(D + shift + s/2) <= block,
                # exclusive
                raise ValueError(
                    f"`max_displacement` ({d:g} cells) needs a halo of {h} cells with window "
                    f"{window!r}{' and interlacing' if shift else ''}, more than the {block} "
                    f"cells of a block along {label} ({n} split {size} ways): particles "
                    f"may only move into the neighbouring blocks, so on this mesh "
                    f"max_displacement must be below {block + 1 - s / 2 - shift:g}; for more, "
                    f"use a mesh with fewer devices along {label}, a larger grid, or paint "
                    f"the particles as a catalog (positions (N, 3) and shape=: no such bound)")
    halo = tuple(h if size > 1 else 0 for size in sizes)
    return PaintPlan(tuple(shape), window, names, sizes, halo, mesh_order, h + 1 - s / 2, mpi)


def _entry(e):
    """A spec entry as one mesh axis name, None (not split), or a tuple of several."""
    if isinstance(e, tuple):
        return e[0] if len(e) == 1 else (e or None)
    return e


def known_spec(x):
    """x's spec where its split is known: a concrete array's, or a traced one's typed on a mesh
    with Explicit axes (an Auto type shows no split); else None."""
    if is_tracer(x):
        typed = typed_mesh(x)
        if typed is None or not has_explicit_axes(typed):
            return None
    elif not isinstance(getattr(x, "sharding", None), NamedSharding):
        return None
    return current_spec(x)


def brick_order(x, mesh, grid_axis: int):
    """The mesh axes splitting (X, Y, Z) of a brick, in that order, or None (X and Y split by
    the mesh's last two axes, Z whole: pencils, slabs, one device).  `x` is the array whose
    split tells (dx, or a field), its grid's (X, Y, Z) starting at axis `grid_axis` (negative:
    from the end).  A brick is a mesh of 3 or more axes and: x split over X, Y and Z by three
    of them, any order; or, x's split unknown (numpy input, an Auto type under jit), a mesh of
    exactly 3 axes: its axes in order."""
    if mesh is None or len(mesh.axis_names) < 3:
        return None
    spec = known_spec(x)
    if spec is None:
        return tuple(mesh.axis_names) if len(mesh.axis_names) == 3 else None
    axis = grid_axis % len(spec)
    entries = tuple(_entry(e) for e in spec[axis:axis + 3])
    if (len(entries) == 3 and all(isinstance(e, str) and e in mesh.axis_names for e in entries)
            and len(set(entries)) == 3):
        return entries
    return None


# ----------------------------------------------------------------------------------------------
# Per-device bodies


def check_weights(weights, dtype, shape: tuple, axes: str, expected: str, mesh=None):
    """`weights` as an array of `dtype`: a finite real number, or a real array of `shape` (or
    a scalar array); `axes` and `expected` name that shape in the messages.  A number becomes
    an array on every device of `mesh` (a concrete Mesh), kept for the next call."""
    if not (hasattr(weights, "shape") and hasattr(weights, "dtype")):
        if not isinstance(weights, numbers.Real) or isinstance(weights, bool):
            raise TypeError(f"`weights` must be a number or an array {axes}; got "
                            f"{type(weights).__name__}")
        if not math.isfinite(weights):
            raise ValueError(f"`weights` must be finite (the particles' masses); got {weights}")
        if isinstance(mesh, jax.sharding.Mesh):
            return _replicated(float(weights), np.dtype(dtype), mesh)
        return jnp.asarray(weights, dtype)
    if not any(jnp.issubdtype(weights.dtype, kind)
               for kind in (jnp.floating, jnp.integer, jnp.bool_)):
        raise TypeError(f"`weights` must be real numbers (the particles' masses); got dtype "
                        f"{weights.dtype}")
    if tuple(weights.shape) not in ((), tuple(shape)):
        raise ValueError(f"`weights` must be a scalar or have {expected}; got shape "
                         f"{tuple(weights.shape)}")
    return weights


_REPLICATED: dict = {}  # (value, dtype, mesh) -> that number on every device of the mesh


def _replicated(value: float, dtype, mesh):
    """The number on every device of the mesh, kept: copying the default weight 1.0 to 8
    devices at every eager call took about as long as painting a 16^3 lattice.  (Not kept when
    a trace turns the copy into a tracer.)"""
    key = (value, dtype, mesh)
    if key not in _REPLICATED:
        out = jax.device_put(np.asarray(value, dtype), NamedSharding(mesh, P()))
        if is_tracer(out):
            return out
        if len(_REPLICATED) >= 64:
            _REPLICATED.clear()
        _REPLICATED[key] = out
    return _REPLICATED[key]


def _split(p: PaintPlan):
    """The components of dx along the split axes (those with a halo): a slice (or, for a
    brick split along X and Z only, a list), or None."""
    if p.brick:
        comps = [d for d in range(3) if p.halo[d]]
        if not comps:
            return None
        return slice(comps[0], comps[-1] + 1) if len(comps) == comps[-1] - comps[0] + 1 else comps
    lo, hi = (0 if p.halo[0] else 1), (2 if p.halo[1] else 1)
    return slice(lo, hi) if hi > lo else None


def _poisoned(dx, p: PaintPlan):
    """True where this device holds a particle beyond the halo along a split axis, or a NaN or
    infinite displacement along any axis."""
    # Reductions of comparisons, not jnp.max: with jax 0.10.2 on XLA:CPU, max drops NaN from
    # arrays of 4096 elements or more (reproduced without pencilfft), so a NaN would pass.
    bad = ~jnp.all(jnp.isfinite(dx))
    comps = _split(p)
    if comps is not None:
        bad = bad | ~jnp.all(jnp.abs(dx[..., comps]) < p.limit)
    return bad


def _finite(dx):
    """dx with its non-finite values replaced by 0: what the kernel is given (a NaN cast to a
    cell index is undefined behaviour); `_poisoned` makes the result NaN for them."""
    return jnp.where(jnp.isfinite(dx), dx, 0)


def _paint_body(dx, w, *, p: PaintPlan):
    """One device: its particles (dx block (bx, by, Z, 3), weights block or scalar) -> its
    density block (bx, by, Z)."""
    v = jnp.broadcast_to(jnp.asarray(w, dx.dtype), dx.shape[:3])[None]
    g = paint_block(_finite(dx), v, offset=p.offset, shape=p.padded, window=p.window)
    g = jnp.where(_poisoned(dx, p), jnp.nan, g)  # before the fold: what is sent is NaN too
    return fold_halos(g, p)[0]


def _read_body(f, dx, *, p: PaintPlan):
    """One device: its field block (C, bx, by, Z) -> the values at its particles (C, bx, by, Z)."""
    out = read_block(fill_halos(f, p), _finite(dx), offset=p.offset, window=p.window)
    return jnp.where(_poisoned(dx, p), jnp.nan, out)


def _stats_body(dx, row, *, p: PaintPlan, shift: float):
    """One device, reduced over all: [the largest finite |dx| along a split axis, the farther
    of that and |dx - shift|, the number of non-finite values of dx] in dx's dtype (the count
    exact up to 2^24 in float32, and never 0 when it is not)."""
    finite = jnp.isfinite(dx)
    comps = _split(p)
    d = jnp.where(finite, dx, 0)
    d = d[..., comps] if comps is not None else jnp.zeros_like(d[..., :1])
    user = jnp.max(jnp.abs(d))  # no NaN left in d: the jnp.max bug above cannot bite
    reach = jnp.maximum(user, jnp.max(jnp.abs(d - shift))) if shift else user
    every = gather_devices(jnp.stack([user, reach, jnp.sum(~finite).astype(dx.dtype)]), row,
                           p)
    return jnp.concatenate([jnp.max(every[:, :2], axis=0), jnp.sum(every[:, 2:], axis=0)])


# ----------------------------------------------------------------------------------------------
# Validation


def _check_dx(dx) -> tuple[int, int, int]:
    if not (hasattr(dx, "shape") and hasattr(dx, "dtype")):
        raise TypeError(f"`dx` must be an array of displacements (X, Y, Z, 3); got "
                        f"{type(dx).__name__}")
    if np.dtype(dx.dtype) not in (np.float32, np.float64):
        raise TypeError(f"`dx` must be float32 or float64; got {np.dtype(dx.dtype)}")
    if len(dx.shape) != 4 or dx.shape[-1] != 3:
        raise ValueError(f"`dx` must have shape (X, Y, Z, 3) (the displacement of the particle "
                         f"of each lattice site, in cells); got shape {tuple(dx.shape)}")
    return tuple(dx.shape[:3])


def _check_positions(pos) -> None:
    if np.dtype(pos.dtype) not in (np.float32, np.float64):
        raise TypeError(f"`positions` must be float32 or float64; got {np.dtype(pos.dtype)}")
    if pos.shape[-1] != 3:
        raise ValueError(f"`positions` of a catalog must have shape (N, 3); got shape "
                         f"{tuple(pos.shape)}")


def _check_field(field, grid) -> None:
    """`field` (..., X, Y, Z) of numbers; `grid` the lattice's (X, Y, Z), None for catalogs."""
    if not (hasattr(field, "shape") and hasattr(field, "dtype")):
        raise TypeError(f"`field` must be an array (..., X, Y, Z); got {type(field).__name__}")
    if len(field.shape) < 3 or (grid is not None and tuple(field.shape[-3:]) != grid):
        within = "" if grid is None else f" with (X, Y, Z) = {grid} (dx's lattice)"
        raise ValueError(f"`field` must have shape (..., X, Y, Z){within}; got shape "
                         f"{tuple(field.shape)}")
    if not jnp.issubdtype(field.dtype, jnp.inexact):  # integers and bools too: no cast
        raise TypeError(f"`field` must hold real or complex numbers (a floating or complex "
                        f"dtype, read in the precision of the positions or better); got dtype "
                        f"{field.dtype}")


def _mesh_for(x, mesh):
    """The mesh to run on: find_mesh's, else (under jit) the Auto mesh in x's type, else None."""
    found = find_mesh(x, mesh)
    if found is None:
        found = typed_mesh(x)
    if found is None and not is_tracer(x):
        sharding = getattr(x, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1:
            raise ValueError(f"`dx` is spread over {len(sharding.device_set)} devices by a "
                             f"{type(sharding).__name__} that names no mesh; pass `mesh=` or "
                             "place it with a NamedSharding")
    return found


def _catalog_order(field, mesh):
    """A catalog's brick (`brick_order`), told by the field read (None: painting) where its
    split is known, else by the mesh: 3 axes, a brick in the mesh's order."""
    if field is not None and mesh is not None and known_spec(field) is not None:
        return brick_order(field, mesh, -3)
    if mesh is None or len(mesh.axis_names) != 3:
        return None
    return tuple(mesh.axis_names)


def _at_least(x: float) -> float:
    """x rounded up to 4 significant digits: advice printed short and never below x."""
    y = float(f"{x:.4g}")
    return y if y >= x else float(f"{x + 10.0 ** (math.floor(math.log10(x)) - 3):.4g}")


def _refuse_displacement(m: float, reach: float, p: PaintPlan, shift: float) -> None:
    """The ValueError for a displacement `m` (the user's largest |dx| along a split axis;
    `reach` the farther of it and interlacing's shifted copy) that the halo does not cover:
    the max_displacement that covers it, or, where no halo fits in a block, the largest this
    mesh allows and the ways out."""
    s = WINDOWS[p.window]
    blocks = {axis: p.block[axis] for axis in range(len(p.halo)) if p.halo[axis]}
    widest = min(blocks.values())  # the widest halo this mesh allows (one in every block)
    need = math.floor(reach + s / 2)  # the narrowest halo that covers `reach`
    copy = (f" (with interlace=True: {reach:.4g} cells for the copy painted {shift:g} cell "
            f"lower)" if shift else "")
    if need > widest:
        axes = " and ".join("XYZ"[axis] for axis, b in blocks.items() if b < need)
        raise ValueError(
            f"`dx`: the largest displacement along a split axis is {m:.4g} cells{copy}, more "
            f"than any halo on this mesh takes: a halo is at most a block ({widest} cells), "
            f"which takes displacements below {widest + 1 - s / 2:g} cells with window "
            f"{p.window!r}, so max_displacement must stay below "
            f"{widest + 1 - s / 2 - shift:g}; use a mesh with fewer devices along {axes}, a "
            f"larger grid, or paint the particles as a catalog (positions (N, 3) and shape=: "
            f"no such bound)")
    advice = _at_least(m)
    if halo_width(p.window, advice + shift) > widest:
        # m itself would ask for a halo wider than a block (interlacing's half cell, or the
        # rounding up), yet a narrower one covers `reach`: advise the least bound giving it
        advice = max(0.0, need - shift - s / 2)
    raise ValueError(
        f"`dx`: the largest displacement along a split axis is {m:.4g} cells{copy}, but the "
        f"halo of {max(p.halo)} cells (window {p.window!r}) takes less than {p.limit:g}: pass "
        f"max_displacement >= {advice:g} (the halo grows with it)")


# ----------------------------------------------------------------------------------------------
# One call: static configuration, what it computes, its checks


@dataclasses.dataclass(frozen=True)
class _Call:
    """Everything static about one paint or readout (hashable: the key of its compiled
    program): `op` "paint" or "readout", the plan (`PaintPlan` for the lattice form,
    `CatalogPlan` for catalogs), the mesh (None: one device), interlacing."""

    op: str
    plan: Any
    mesh: Any
    interlace: bool = False

    @property
    def shift(self) -> float:
        return INTERLACE_SHIFT if self.interlace else 0.0


def _paint_once(pos, w, call: _Call):
    p = call.plan
    if isinstance(p, CatalogPlan):
        return paint_catalog(pos, w, p, call.mesh)
    w_spec = P() if w.ndim == 0 else p.field_spec
    return run(functools.partial(_paint_body, p=p), (pos, w),
               (P(*p.field_spec, None), w_spec), p.field_spec, call.mesh, p)


def _read(field, pos, call: _Call):
    """Readout of field (..., X, Y, Z), any leading channels, real or complex."""
    p = call.plan
    lead, grid = tuple(field.shape[:-3]), tuple(field.shape[-3:])
    dtype = jnp.result_type(field.dtype, pos.dtype)
    cplx = jnp.issubdtype(dtype, jnp.complexfloating)
    f = jnp.asarray(field).astype(dtype).reshape((math.prod(lead),) + grid)
    if cplx:  # readout is linear: the real and imaginary parts are channels of one pass
        f = jnp.concatenate([f.real, f.imag])
    pos = pos.astype(f.dtype)
    if isinstance(p, CatalogPlan):
        out = read_catalog(f, pos, p, call.mesh)
    else:
        out = run(functools.partial(_read_body, p=p), (f, pos),
                  (P(None, *p.field_spec), P(*p.field_spec, None)), P(None, *p.field_spec),
                  call.mesh, p)
    if cplx:
        n = out.shape[0] // 2
        out = jax.lax.complex(out[:n], out[n:])
    return out.reshape(lead + tuple(out.shape[1:]))


def _apply(call: _Call, a, b):
    """The call on its arrays (traced, or concrete on one device): paint(dx, w) or
    readout(field, dx).

    Interlacing: (F1 + F2 exp(-i k.h)) / 2 with h = (1/2, 1/2, 1/2): F2 paints every particle at
    x - h, so F2 ~ W(k) exp(-i k.(x - h)), and the phase realigns it with F1; an aliased image
    at k + 2 pi m gets the factor (-1)^(m_x + m_y + m_z) and the odd ones cancel."""
    if call.op == "readout":
        return _read(a, b, call)
    f1 = _paint_once(a, b, call)
    if not call.interlace:
        return f1
    f2 = _paint_once(a - jnp.asarray(call.shift, a.dtype), b, call)
    grid = tuple(f1.shape)
    if call.plan.brick:
        return _interlace_brick(f1, f2, call)
    k1, k2 = prfft3d(f1), prfft3d(f2)
    kx, ky, kz = rfftfreq3d(k1, s=grid)
    k = (k1 + k2 * jnp.exp(-1j * call.shift * (kx + ky + kz)).astype(k1.dtype)) * 0.5
    return pirfft3d(k, grid).astype(f1.dtype)


def _interlace_brick(f1, f2, call: _Call):
    """`_apply`'s interlacing average on a brick: the any-layout transforms (`rfftn`, which
    take the brick's P(a, b, c) in and out), the phase as three 1-D factors."""
    p, grid = call.plan, tuple(f1.shape)
    # the spectrum split over X and Y only (the half axis Z//2+1 seldom divides)
    rest = tuple(n for n in p.mesh_order if n != p.names[0])
    kw = dict(mesh=call.mesh, out_sharding=P(p.names[0], rest, None))
    k1, k2 = rfftn(f1, **kw), rfftn(f2, **kw)
    dtype = k1.dtype
    for axis, n in enumerate(grid):
        k = 2 * np.pi * (np.fft.rfftfreq(n) if axis == 2 else np.fft.fftfreq(n))
        phase = np.exp(-1j * call.shift * k).reshape([-1 if a == axis else 1 for a in range(3)])
        k2 = k2 * jnp.asarray(phase, dtype)
    return irfftn((k1 + k2) * 0.5, s=grid, mesh=call.mesh,
                  out_sharding=p.field_spec).astype(f1.dtype)


def _checks(pos, w, *, call: _Call):
    """What `_verify` refuses, computed on the arrays, as one vector (one transfer to the
    host): the positions' checks, then the number of non-finite weights (w None: 0).  Lattice:
    [largest |dx| along a split axis, the farther of it and the shifted copy's, non-finite dx
    values, non-finite weights] in dx's dtype; catalogs: `catalog.stats` and the weights'
    count, int32 (a bucket's count is compared exactly)."""
    p = call.plan
    bad_w = (jnp.zeros((), jnp.int32) if w is None else
             jnp.sum(~jnp.isfinite(w), dtype=jnp.int32))
    if isinstance(p, CatalogPlan):
        found = _catalog.stats(pos, p, call.mesh)
        if call.interlace:  # the shifted copy is routed too: its buckets must fit as well
            shifted = _catalog.stats(pos - jnp.asarray(call.shift, pos.dtype), p, call.mesh)
            found = jnp.maximum(found, shifted)
        return jnp.concatenate([found, bad_w[None]])
    rows, spec = device_rows(p)
    found = run(functools.partial(_stats_body, p=p, shift=call.shift), (pos, rows),
                (P(*p.field_spec, None), spec), P(), call.mesh, p)
    return jnp.concatenate([found, bad_w.astype(found.dtype)[None]])


def _verify(call: _Call, values) -> None:
    """Refuse, with the numbers, what `_checks` found (its values, concrete)."""
    values = np.asarray(values)
    p = call.plan
    bad_w = values[-1]
    if isinstance(p, CatalogPlan):
        _catalog.check(values[:-1], p)
    else:
        user, reach, bad = values[:3]
        if bad:
            raise ValueError(f"`dx` holds {int(bad)} NaN or infinite values; displacements "
                             f"must be finite (under jax.jit the device holding one returns NaN "
                             f"for its whole block)")
        if _split(p) is not None and not reach < p.limit:
            _refuse_displacement(float(user), float(reach), p, call.shift)
    if bad_w:
        raise ValueError(f"`weights` holds {int(bad_w)} NaN or infinite values; the masses must "
                         f"be finite (under jax.jit they are painted as they are: NaN in the "
                         f"cells their particles reach)")


def _program(a, b, *, call: _Call):
    pos, w = (a, b) if call.op == "paint" else (b, None)
    return _apply(call, a, b), _checks(pos, w, call=call)


# One compiled program per static configuration (`call`) and per shapes, dtypes and shardings
# of the arrays, cached by jax.jit: an eager call runs one program instead of dispatching its
# operations one by one.
_eager_program = jax.jit(_program, static_argnames=("call",))
# Under a transformation, the call as one jit too: inlined under jax.jit, and under an eager
# jax.grad or jax.vmap its derivative or batched form is compiled once and kept.
_traced_program = jax.jit(lambda a, b, *, call: _apply(call, a, b), static_argnames=("call",))
_check_program = jax.jit(_checks, static_argnames=("call",))


def _specs(call: _Call, a, b) -> tuple:
    """How the bodies split the call's two arrays on the mesh."""
    p = call.plan
    field = P(*(None,) * (np.ndim(a) - 3), *p.field_spec)
    if isinstance(p, CatalogPlan):
        if call.op == "readout":
            return field, p.particle_spec
        return p.particle_spec, P(p.particle_spec[0])
    return ((P(*p.field_spec, None), p.field_spec) if call.op == "paint" else
            (field, P(*p.field_spec, None)))


def _execute(call: _Call, a, b):
    """The call, eagerly through its cached program with its checks; traced as it is under a
    transformation (a concrete positions array is still checked, now)."""
    pos, w = (a, b) if call.op == "paint" else (b, None)
    out = None
    if not (is_tracer(a) or is_tracer(b)):
        if isinstance(call.mesh, jax.sharding.Mesh):  # split as the program expects
            a, b = (x if np.ndim(x) == 0 else place(x, NamedSharding(call.mesh, spec))
                    for x, spec in zip((a, b), _specs(call, a, b)))
        out, values = _eager_program(a, b, call=call)
        if not is_tracer(out):
            _verify(call, values)
            return out
        # traced after all: concrete arrays closed over by a function jax is tracing
    if not is_tracer(pos):
        w = None if w is None or is_tracer(w) else w
        _verify(call, _compiled_checks(call, pos, w)(pos, w))
    return _traced_program(a, b, call=call) if out is None else out


_CHECKS: dict = {}  # (call, the arrays' shapes, dtypes, shardings) -> compiled `_checks`


def _compiled_checks(call: _Call, pos, w):
    """`_checks` compiled ahead of time for these arrays, kept: a compiled program runs now
    even inside a trace, on the arrays as they are (placing them would be traced, and
    ensure_compile_time_eval cannot run the checks' shard_map across processes)."""
    key = (call,) + tuple(None if x is None else (tuple(np.shape(x)), np.dtype(x.dtype),
                                                  getattr(x, "sharding", None))
                          for x in (pos, w))
    if key not in _CHECKS:
        if len(_CHECKS) >= 64:
            _CHECKS.clear()
        _CHECKS[key] = _check_program.lower(pos, w, call=call).compile()
    return _CHECKS[key]


# ----------------------------------------------------------------------------------------------
# Public functions


def paint(dx, weights=1.0, window: str = "cic", *, max_displacement: float | None = None,
          mesh=None, shape=None, capacity: int | None = None,
          interlace: bool = False) -> jax.Array:
    """Paint the particles of a displaced lattice onto the grid (JaxPM's `cic_paint_dx`).

    Args:
      dx: displacements, global shape (X, Y, Z, 3), in cells, split like a real-space field
        (X by the mesh's pencil axis a, Y by b: `pencilfft.displacement_sharding(mesh)`, not
        `real_space_sharding(mesh, 4)`, which would read X as a batch axis), or, on a mesh of
        three axes, a brick: P(a, b, c, None), X, Y and Z split in any order of its axes.  The
        particle of lattice site (i, j, k) sits at (i, j, k) + dx[i, j, k] on the periodic
        grid.  They must be finite.
      weights: the particles' masses: a finite scalar, or a real array (X, Y, Z) split like the
        grid.
      window: "ngp", "cic" (default), "tsc" or "pcs".
      max_displacement: the bound D on ``abs(dx)`` along the split axes, in cells; the halo is
        h = floor(D + s/2) cells for a window of support s, and must fit in a block.  Default:
        `DEFAULT_MAX_DISPLACEMENT` (4 cells), or less where the blocks are smaller than that
        halo (h = the block: D just under h + 1 - s/2).  A particle beyond: ValueError
        eagerly, NaN under jit (see the module doc).
      mesh: the mesh; by default dx's sharding, its type under jit, the ambient mesh, else one
        device (under jit with an Auto mesh: the mesh in dx's type).

    Catalogs: `dx` of shape (N, 3) holds absolute positions (grid units, periodic), split over
    all the mesh's devices along N in any order, `weights` a scalar or (N,) split alike, and
    `shape` = (X, Y, Z) the grid's (on a mesh of three axes, a brick split P(a, b, c) in the
    mesh's order).  Particles travel to the devices owning their cells and
    back in fixed-size buckets of `capacity` per pair of devices, at most the particles each
    device holds (a larger value is capped there; see `catalog.py` for the policy when one
    overflows: ValueError eagerly, NaN under jit).

    interlace: paint twice, the second time with every particle moved by -1/2 cell along each
      axis, and average the two spectra with the phase that aligns them (nbodykit's
      interlacing, Sefusatti et al. 2016): the odd aliased images cancel.  Returns the real
      field of that average (3 FFTs more); with the lattice form, the halo takes
      max_displacement + 1/2, so that it covers dx - 1/2 too.

    Eagerly, each call runs one program compiled on the first call with the same arguments'
    shapes, dtypes, shardings and static settings, and checks the values: ValueError for NaN or
    infinite displacements or weights, a particle beyond the halo, a full bucket.

    Returns:
      The painted field, global shape (X, Y, Z), dx's dtype, split like dx (X, Y; a brick's
      X, Y, Z).  With unit
      weights and one particle per cell its mean is 1.

    Example:
      One particle per cell of a 32^3 grid on a 4x2 mesh, displaced by 0.3 cells r.m.s.:

      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", "y"))
      >>> dx = np.random.default_rng(0).normal(size=(32, 32, 32, 3)).astype(np.float32) * 0.3
      >>> rho = pencilfft.paint(jax.device_put(dx, sharding))
      >>> rho.shape, rho.sharding.spec, round(float(rho.mean()), 4)
      ((32, 32, 32), P('x', 'y', None), 1.0)

      A catalog of absolute positions, in any order, with a TSC window:

      >>> pos = np.random.default_rng(1).uniform(0, 32, size=(4096, 3)).astype(np.float32)
      >>> pos = jax.device_put(pos, jax.sharding.NamedSharding(
      ...     mesh, jax.sharding.PartitionSpec(("x", "y"))))
      >>> round(float(pencilfft.paint(pos, 1.0, "tsc", shape=(32, 32, 32)).sum()))
      4096
    """
    if not isinstance(interlace, (bool, np.bool_)):
        raise TypeError(f"`interlace` must be a bool; got {type(interlace).__name__}")
    interlace = bool(interlace)
    if getattr(dx, "ndim", None) == 2:  # a catalog
        _check_positions(dx)
        if shape is None:
            raise ValueError("`shape` (X, Y, Z) is required to paint a catalog (positions (N, 3))")
        mesh = _mesh_for(dx, mesh)
        mpi = _mpi_exchange.auto(jax.default_backend(), mesh)  # alike on every process
        w = check_weights(weights, dx.dtype, dx.shape[:1], "(N,)",
                          f"shape (N,) = {dx.shape[:1]}", mesh)
        p = plan_catalog(shape, dx.shape[0], mesh, window, capacity, mpi,
                         _catalog_order(None, mesh))
    else:
        grid = _check_dx(dx)
        mesh = _mesh_for(dx, mesh)
        mpi = _mpi_exchange.auto(jax.default_backend(), mesh)  # alike on every process
        p = plan(grid, mesh, window, max_displacement, mpi,
                 INTERLACE_SHIFT if interlace else 0.0, brick_order(dx, mesh, 0))
        w = check_weights(weights, dx.dtype, grid, "(X, Y, Z)", f"the grid's shape {grid}",
                          mesh)
    return _execute(_Call("paint", p, mesh, interlace), dx, w)


def readout(field, dx, window: str = "cic", *, max_displacement: float | None = None,
            mesh=None, capacity: int | None = None) -> jax.Array:
    """The field's values at the particles of a displaced lattice (JaxPM's `cic_read_dx`).

    Args:
      field: global shape (..., X, Y, Z), split like a real-space field over (X, Y) (a brick:
        over (X, Y, Z)); leading
        axes are channels (e.g. the 3 force components), read with the same weights.  Real or
        complex (readout is linear: the real and imaginary parts are read alike); any other
        dtype (integers, bools) is a TypeError naming `field`.
      dx: displacements (X, Y, Z, 3), as in `paint`.
      window, max_displacement, mesh: as in `paint`.

    Returns:
      The interpolated values, global shape (..., X, Y, Z) (one per particle, at its lattice
      site), the field's dtype promoted with dx's, split like dx.  readout is the transpose of
      paint: for a scalar s(field) = sum(readout(field, dx) * w), d s / d field = paint(dx, w).

    Catalogs: `dx` of shape (N, 3) holds absolute positions, as in `paint`; returns (..., N).

    Example:
      A linear field read at displaced particles gives its value at their positions:

      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", "y"))
      >>> x = np.arange(32, dtype=np.float32)[:, None, None] * np.ones((1, 32, 32), np.float32)
      >>> dx = np.zeros((32, 32, 32, 3), np.float32)
      >>> dx[..., 0] = 0.25
      >>> vals = pencilfft.readout(jax.device_put(x, sharding), jax.device_put(dx, sharding))
      >>> float(np.asarray(vals)[5, 0, 0]), vals.shape
      (5.25, (32, 32, 32))
    """
    catalog = getattr(dx, "ndim", None) == 2
    if catalog:
        _check_positions(dx)
        _check_field(field, None)
    else:
        grid = _check_dx(dx)
        _check_field(field, grid)
    mesh = _mesh_for(dx, mesh)
    mpi = _mpi_exchange.auto(jax.default_backend(), mesh)  # alike on every process
    p = (plan_catalog(field.shape[-3:], dx.shape[0], mesh, window, capacity, mpi,
                      _catalog_order(field, mesh)) if catalog
         else plan(grid, mesh, window, max_displacement, mpi, order=brick_order(dx, mesh, 0)))
    return _execute(_Call("readout", p, mesh), field, dx)
