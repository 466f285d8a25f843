"""Painting particles onto a sharded grid and reading fields out at them: `paint`, `readout`.

The lattice form of particle-mesh codes (JaxPM's `cic_paint_dx` / `cic_read_dx`): particle
(i, j, k) sits at (i, j, k) + dx[i, j, k] (grid units, periodic box) and dx (X, Y, Z, 3) is split
like a real-space field, P(a, b) over (X, Y).  Each device paints its own particles into its
block padded by h cells on each side of every split axis, sends the pads to its neighbours, who
add them to their edge cells, and keeps its interior; readout fills the same pads with the
neighbours' edge cells and reads there.  An axis that no mesh axis splits (Z always; X or Y on
slabs or one device) is not padded: its cell indices wrap around the whole axis.

The halo h is chosen here, from the window's support s and the bound D on the displacements
(`max_displacement`, default `DEFAULT_MAX_DISPLACEMENT`): h = floor(D + s / 2) covers every cell
a particle within D cells of its site touches.  A particle beyond the halo (|dx| >= h + 1 - s/2
along a split axis) would be painted into the wrong cells: an eager call raises ValueError
naming the largest displacement and the halo; under jit (where values are unknown) the device
holding it turns its whole block, and what it sends its neighbours, into NaN, so the error
shows in the result instead of passing silently.

Static planning (`plan`: mesh axes, halo widths, limits) is apart from the traced bodies
(`_paint_body`, `_read_body`).  The per-block work is `kernel.py` (the CPU kernel, or XLA's
scatter/gather elsewhere).  Catalogs (positions (N, 3)) are `catalog.py`'s; interlacing
(`paint(..., interlace=True)`) is `_interlaced` here.  Where the mesh is known (given, in a
sharding, an Explicit type, `jax.set_mesh`) or only in an Auto type under jit, the bodies run in
`shard_map` on it; with no mesh at all, on one device.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .._decomposition.mesh import find_mesh, has_explicit_axes, is_tracer, typed_mesh
from .._decomposition.rules import mesh_axes
from .._exchange import mpi as _mpi_exchange
from .._transforms.fft import pirfft3d, prfft3d
from .._transforms.freq import rfftfreq3d
from .._transforms.partitioned import place, with_mesh
from .catalog import paint_catalog, read_catalog
from .grid import GridPlan, fill_halos, fold_halos
from .kernel import paint_block, read_block
from .window import WINDOWS, check_window

__all__ = ["paint", "readout", "DEFAULT_MAX_DISPLACEMENT"]

DEFAULT_MAX_DISPLACEMENT = 4.0  # cells: the halo's default bound on |dx| along split axes


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


def plan(shape, mesh, window: str, max_displacement, mpi: bool = False) -> PaintPlan:
    """The plan of a lattice paint/readout of global `shape` on `mesh` (None: one device)."""
    window = check_window(window)
    d = _check_displacement(max_displacement)
    (a, b), (pa, pb) = mesh_axes(mesh)
    names, sizes = (a, b), (pa, pb)
    for axis, (n, size, name) in enumerate(zip(shape[:2], sizes, names)):
        if n % size:
            raise ValueError(f"the grid's {'XY'[axis]} axis ({n} cells) does not split evenly "
                             f"over mesh axis {name!r} of size {size}")
    blocks = [n // s for n, s in zip(shape[:2], sizes) if s > 1]
    if d is None:  # the default bound, or as much as the blocks allow
        h = min([halo_width(window, DEFAULT_MAX_DISPLACEMENT)] + blocks)
        d = h + 1 - WINDOWS[window] / 2
        if d <= 0:
            raise ValueError(f"the blocks ({min(blocks)} cells along a split axis) are too "
                             f"small for window {window!r}: use fewer devices along X or Y")
    else:
        h = halo_width(window, d)
    halo = tuple(h if s > 1 else 0 for s in sizes)
    for axis, (hh, size) in enumerate(zip(halo, sizes)):
        block = shape[axis] // size
        if hh > block:
            raise ValueError(
                f"`max_displacement` ({d} cells) needs a halo of {hh} cells with window "
                f"{window!r}, more than the {block} cells of a block along {'XY'[axis]} "
                f"({shape[axis]} split {size} ways): particles may only move into the "
                f"neighbouring blocks; lower max_displacement or use fewer devices along "
                f"{'XY'[axis]}")
    return PaintPlan(tuple(shape), window, names, sizes, halo, h + 1 - WINDOWS[window] / 2, mpi)


# ----------------------------------------------------------------------------------------------
# Per-device body


def check_weights(weights, dtype, shape: tuple, axes: str, expected: str):
    """`weights` as an array of `dtype`: a real number, or an array of `shape` (or a scalar
    array); `axes` and `expected` name that shape in the messages."""
    if not (hasattr(weights, "shape") and hasattr(weights, "dtype")):
        if not isinstance(weights, numbers.Real) or isinstance(weights, bool):
            raise TypeError(f"`weights` must be a number or an array {axes}; got "
                            f"{type(weights).__name__}")
        return jnp.asarray(weights, dtype)
    if tuple(weights.shape) not in ((), tuple(shape)):
        raise ValueError(f"`weights` must be a scalar or have {expected}; got shape "
                         f"{tuple(weights.shape)}")
    return weights


def _beyond(dx, p: PaintPlan):
    """True where this device holds a particle beyond the halo along a split axis."""
    comps = [d for d in range(2) if p.halo[d]]
    if not comps:
        return None
    m = jnp.max(jnp.abs(dx[..., jnp.array(comps)]))
    return ~(m < p.limit)  # NaN displacements count as beyond


def _paint_body(dx, w, *, p: PaintPlan):
    """One device: its particles (dx block (bx, by, Z, 3), weights block or scalar) -> its
    density block (bx, by, Z)."""
    v = jnp.broadcast_to(jnp.asarray(w, dx.dtype), dx.shape[:3])[None]
    g = paint_block(dx, v, offset=p.halo, shape=p.padded, window=p.window)
    bad = _beyond(dx, p)
    if bad is not None:  # poison before the fold: what is sent is poisoned too
        g = jnp.where(bad, jnp.nan, g)
    return fold_halos(g, p)[0]


def _read_body(f, dx, *, p: PaintPlan):
    """One device: its field block (C, bx, by, Z) -> the values at its particles (C, bx, by, Z)."""
    out = read_block(fill_halos(f, p), dx, offset=p.halo, window=p.window)
    bad = _beyond(dx, p)
    return out if bad is None else jnp.where(bad, jnp.nan, out)


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


def _check_eager(dx, p: PaintPlan) -> None:
    """Concrete displacements: refuse, with the numbers, what the halo cannot take."""
    if is_tracer(dx) or not any(p.halo):
        return
    comps = [d for d in range(2) if p.halo[d]]
    # A concrete dx closed over by a jit-traced function is checked too, now.
    with jax.ensure_compile_time_eval():
        m = float(jnp.max(jnp.abs(jnp.asarray(dx)[..., jnp.array(comps)])))
    if not m < p.limit:
        raise ValueError(
            f"`dx`: the largest displacement along a split axis is {m:.4g} cells, but the halo "
            f"of {max(p.halo)} cells (window {p.window!r}) takes less than {p.limit:g}: pass "
            f"max_displacement >= {m:.4g} (the halo grows with it)")


def _run(body, args, in_specs, out_spec, mesh, p: PaintPlan):
    if mesh is None:
        return body(*args)
    # Explicit or concrete inputs split otherwise are resharded (shard_map refuses them).
    args = [a if (np.ndim(a) == 0 or (is_tracer(a) and not has_explicit_axes(mesh))
                  or (not is_tracer(a) and not isinstance(mesh, jax.sharding.Mesh))) else
            place(a, NamedSharding(mesh, spec)) for a, spec in zip(args, in_specs)]
    if p.mpi:  # our MPI sends find their peers in the mesh the body is traced on
        body = with_mesh(body, mesh)
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec)(*args)


# ----------------------------------------------------------------------------------------------
# Public functions


def paint(dx, weights=1.0, window: str = "cic", *, max_displacement: float | None = None,
          mesh=None, shape=None, capacity: int | None = None,
          interlace: bool = False) -> jax.Array:
    """Paint the particles of a displaced lattice onto the grid (JaxPM's `cic_paint_dx`).

    Args:
      dx: displacements, global shape (X, Y, Z, 3), in cells, split like a real-space field
        (X by the mesh's pencil axis a, Y by b: `pencilfft.real_space_sharding(mesh)` of the
        first three axes).  The particle of lattice site (i, j, k) sits at (i, j, k) +
        dx[i, j, k] on the periodic grid.
      weights: the particles' masses: a scalar, or an array (X, Y, Z) split like the grid.
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
    `shape` = (X, Y, Z) the grid's.  Particles travel to the devices owning their cells and
    back in fixed-size buckets of `capacity` per pair of devices (see `catalog.py` for the
    policy when one overflows: ValueError eagerly, NaN under jit).

    interlace: paint twice, the second time with every particle moved by -1/2 cell along each
      axis, and average the two spectra with the phase that aligns them (nbodykit's
      interlacing, Sefusatti et al. 2016): the odd aliased images cancel.  Returns the real
      field of that average (3 FFTs more); with the lattice form, the bound on ``abs(dx)`` applies
      to dx - 1/2 too.

    Returns:
      The painted field, global shape (X, Y, Z), dx's dtype, split like dx (X, Y).  With unit
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
    if interlace:
        return _interlaced(dx, weights, window, max_displacement, mesh, shape, capacity)
    if getattr(dx, "ndim", None) == 2:
        return _catalog_call(dx, weights, window, shape, capacity, mesh)
    shape = _check_dx(dx)
    mesh = _mesh_for(dx, mesh)
    p = plan(shape, mesh, window, max_displacement, _mpi_exchange.auto(jax.default_backend()))
    w = check_weights(weights, dx.dtype, shape, "(X, Y, Z)", f"the grid's shape {shape}")
    _check_eager(dx, p)
    w_spec = P() if w.ndim == 0 else p.field_spec
    return _run(functools.partial(_paint_body, p=p), (dx, w),
                (P(*p.field_spec, None), w_spec), p.field_spec, mesh, p)


def readout(field, dx, window: str = "cic", *, max_displacement: float | None = None,
            mesh=None, capacity: int | None = None) -> jax.Array:
    """The field's values at the particles of a displaced lattice (JaxPM's `cic_read_dx`).

    Args:
      field: global shape (..., X, Y, Z), split like a real-space field over (X, Y); leading
        axes are channels (e.g. the 3 force components), read with the same weights.
      dx: displacements (X, Y, Z, 3), as in `paint`.
      window, max_displacement, mesh: as in `paint`.

    Returns:
      The interpolated values, global shape (..., X, Y, Z) (one per particle, at its lattice
      site), the field's dtype, split like dx.  readout is the transpose of paint: for a
      scalar s(field) = sum(readout(field, dx) * w), d s / d field = paint(dx, w).

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
    if getattr(dx, "ndim", None) == 2:
        return _catalog_read(field, dx, window, capacity, mesh)
    shape = _check_dx(dx)
    if not (hasattr(field, "shape") and hasattr(field, "dtype")):
        raise TypeError(f"`field` must be an array (..., X, Y, Z); got {type(field).__name__}")
    if tuple(field.shape[-3:]) != shape or len(field.shape) < 3:
        raise ValueError(f"`field` must have shape (..., X, Y, Z) with (X, Y, Z) = {shape} "
                         f"(dx's lattice); got shape {tuple(field.shape)}")
    mesh = _mesh_for(dx, mesh)
    p = plan(shape, mesh, window, max_displacement, _mpi_exchange.auto(jax.default_backend()))
    _check_eager(dx, p)
    lead = tuple(field.shape[:-3])
    field = jnp.asarray(field).astype(jnp.result_type(field.dtype, dx.dtype))
    f = field.reshape((math.prod(lead),) + shape)
    out = _run(functools.partial(_read_body, p=p), (f, dx.astype(f.dtype)),
               (P(None, *p.field_spec), P(*p.field_spec, None)), P(None, *p.field_spec),
               mesh, p)
    return out.reshape(lead + shape)


# ----------------------------------------------------------------------------------------------
# Catalogs (`catalog.py`)


def _check_positions(pos) -> None:
    if np.dtype(pos.dtype) not in (np.float32, np.float64):
        raise TypeError(f"`positions` must be float32 or float64; got {np.dtype(pos.dtype)}")
    if pos.shape[-1] != 3:
        raise ValueError(f"`positions` of a catalog must have shape (N, 3); got shape "
                         f"{tuple(pos.shape)}")


def _catalog_call(pos, weights, window, shape, capacity, mesh) -> jax.Array:
    _check_positions(pos)
    if shape is None:
        raise ValueError("`shape` (X, Y, Z) is required to paint a catalog (positions (N, 3))")
    w = check_weights(weights, pos.dtype, pos.shape[:1], "(N,)",
                      f"shape (N,) = {pos.shape[:1]}")
    mesh = _mesh_for(pos, mesh)
    return paint_catalog(pos, w, window, shape, capacity, mesh,
                         _mpi_exchange.auto(jax.default_backend()), _run)


def _catalog_read(field, pos, window, capacity, mesh) -> jax.Array:
    _check_positions(pos)
    if not (hasattr(field, "shape") and hasattr(field, "dtype")) or len(field.shape) < 3:
        raise ValueError(f"`field` must be an array (..., X, Y, Z); got "
                         f"{getattr(field, 'shape', type(field).__name__)}")
    mesh = _mesh_for(pos, mesh)
    lead = tuple(field.shape[:-3])
    field = jnp.asarray(field).astype(jnp.result_type(field.dtype, pos.dtype))
    f = field.reshape((math.prod(lead),) + tuple(field.shape[-3:]))
    out = read_catalog(f, pos.astype(f.dtype), window, capacity, mesh,
                       _mpi_exchange.auto(jax.default_backend()), _run)
    return out.reshape(lead + pos.shape[:1])


# ----------------------------------------------------------------------------------------------
# Interlacing


def _interlaced(dx, weights, window, max_displacement, mesh, shape, capacity) -> jax.Array:
    """(F1 + F2 exp(-i k.h) ) / 2 with h = (1/2, 1/2, 1/2): F2 paints every particle at x - h,
    so F2 ~ W(k) exp(-i k.(x - h)), and the phase realigns it with F1; an aliased image at
    k + 2 pi m gets the factor (-1)^(m_x + m_y + m_z) and the odd ones cancel."""
    kw = dict(window=window, mesh=mesh, shape=shape, capacity=capacity)
    shifted = dict(kw)
    if getattr(dx, "ndim", None) != 2:  # the lattice form: the bound grows by the shift
        kw["max_displacement"] = max_displacement
        shifted["max_displacement"] = (None if max_displacement is None else
                                       _check_displacement(max_displacement) + 0.5)
    f1 = paint(dx, weights, **kw)
    f2 = paint(dx - jnp.asarray(0.5, dx.dtype), weights, **shifted)
    grid = tuple(f1.shape)
    k1, k2 = prfft3d(f1), prfft3d(f2)
    kx, ky, kz = rfftfreq3d(k1, s=grid)
    k = (k1 + k2 * jnp.exp(-0.5j * (kx + ky + kz)).astype(k1.dtype)) * 0.5
    return pirfft3d(k, grid).astype(f1.dtype)
