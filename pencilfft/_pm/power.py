"""Power spectra of sharded fields, binned on each device: `power_spectrum`.

The arguments and the result mean what they mean in JaxPM's `jaxpm.utils.power_spectrum` (a
JaxPM user switches by import), computed without gathering anything:

    F = prfft3d(field)                      half spectrum (..., Y, Z//2+1, X), split like k space
    q = |F|^2  (cross: Re(F1 conj F2))      per mode, on each device's block
    S[ell, bin] = sum over modes of q * h * (2 ell + 1) L_ell(mu)     per device, then one psum

where h counts each stored mode for the modes of the full grid it stands for: the kz = 0 and
(Z even) kz = Z/2 planes once, the others twice (themselves and their Hermitian mirrors, whose
mu and |k| are evaluated too: they differ where a component is a Nyquist frequency), padded
positions zero: nbodykit's `hermitian_weights`, whose sums are its `modes`.  A window
compensation divides q by the assignment windows' transfer functions W(k) (`window.py`) in the
same weights, mode by mode: no extra transform; the shot noise is subtracted from the binned
monopole.  The binning is a linear map of q (`BinSums`, a `_transforms.partitioned.LinearOp`): in
shard_map where the mesh is known, through the compiler-partitioned primitive under jit with
no mesh in scope, its transpose giving the gradient.  Each device computes the wavenumbers, mu
and bins of its own block from the block's global indices: nothing of size N^3 exists on the
host, and the compiled program has one all-reduce of the per-bin sums and no all-gather.

A brick (X, Y, Z split over three mesh axes, `brick_mesh`) is transformed by `rfftn` instead,
to the evenly split layout of the half spectrum (X, Y, Z//2+1) it picks (`brick_layout`, named
as its `out_sharding` so that the partitioner's path knows it too), and binned by `BrickSums`
from each block's offsets along the three axes, read off that layout.

Static planning (`plan_bins`: bin edges, poles, line of sight; `brick_layout`) is apart from
the traced code.
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
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .._decomposition.mesh import find_mesh, has_explicit_axes, is_tracer, typed_mesh
from .._decomposition.rules import batch_axes, mesh_axes
from .._exchange import mpi as _mpi_exchange
from .._jax_private import concrete_mesh
from .._transforms.fft import prfft3d
from .._transforms.freq import wavenumbers
from .._transforms.numpy_fft import Call, partition_spec, rfftn, spec_entries
from .._transforms.routes import find_route, spec_text
from .._transforms.partitioned import LinearOp, place, run, tile, with_mesh
from .._transforms.plan import fft_dtype, float_dtype, plan_forward
from . import window as _window

__all__ = ["power_spectrum", "box_lengths", "brick_mesh", "brick_layout"]


# ----------------------------------------------------------------------------------------------
# Static planning


@dataclasses.dataclass(frozen=True)
class BinPlan:
    """The bins of one spectrum, all static (hashable: a parameter of the compiled program).

    `shape` (X, Y, Z) is the field's global grid, `box` its physical size, `edges` the bin
    edges in |k| (np.digitize's rule: bin i holds edges[i-1] <= |k| < edges[i]; bin 0 and the
    last one, below and above the edges, are computed and dropped as JaxPM does), `poles` the
    Legendre orders, `los` the unit line of sight (None: mu is not needed, every pole is 0),
    `windows` the assignment windows whose transfer functions divide each mode's power (one per
    painted field: ("cic", "cic") compensates an auto spectrum of a CIC-painted field).
    """

    shape: tuple[int, int, int]
    box: tuple[float, float, float]
    edges: tuple[float, ...]
    poles: tuple[int, ...]
    los: tuple[float, float, float] | None
    windows: tuple[str, ...] = ()

    @property
    def n_bins(self) -> int:
        """Bins computed, the two outer ones included (JaxPM's `n_bins`)."""
        return len(self.edges) + 1

    @property
    def scale(self) -> float:
        """prod(box) / N^2: from sums of |F|^2 of the unnormalised ("backward") transform to
        JaxPM's (|F_ortho|^2 = |F|^2 / N, times the cell volume prod(box / shape))."""
        n = math.prod(self.shape)
        return math.prod(self.box) / n / n


def kedges_for(kedges, shape, box) -> np.ndarray:
    """JaxPM's bin edges: kmax = pi * min(shape / box) (the smallest Nyquist wavenumber); an int
    n gives dk = kmax / (n + 1), a float is dk itself, None gives dk = 2 * (2 pi / min(box));
    then edges = arange(dk, kmax, dk) + dk / 2.  An array is taken as the edges."""
    shape, box = np.asarray(shape, float), np.asarray(box, float)
    kmax = np.pi * np.min(shape / box)
    if kedges is None or _is_int(kedges) or _is_float(kedges):
        if kedges is None:
            dk = 2 * np.pi / np.min(box) * 2
        elif _is_int(kedges):
            if kedges < 2:
                raise ValueError(f"`kedges` as an int is the number of edges (n - 1 bins), at "
                                 f"least 2; got {kedges!r}")
            dk = kmax / (int(kedges) + 1)
        else:
            dk = float(kedges)
            if not (np.isfinite(dk) and dk > 0):
                raise ValueError(f"`kedges` as a float is the bin width dk, finite and > 0; "
                                 f"got {kedges!r}")
        edges = np.arange(dk, kmax, dk) + dk / 2
        if len(edges) < 2:
            raise ValueError(
                f"`kedges`={kedges!r} gives {len(edges)} bin edge(s) below the Nyquist "
                f"wavenumber kmax = pi * min(shape / box_shape) = {kmax:.6g} (dk = {dk:.6g}); "
                f"at least 2 are needed: a smaller dk, or a larger box_shape"
            )
        return edges
    try:
        edges = np.asarray(kedges, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"`kedges` must be None, an int, a float or an array of edges; got "
                        f"{kedges!r}") from None
    if edges.ndim != 1 or len(edges) < 2:
        raise ValueError(f"`kedges` as an array must be 1-D with at least 2 edges; got shape "
                         f"{edges.shape}")
    if not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
        raise ValueError(f"`kedges` must be finite and strictly increasing; got {edges}")
    return edges


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _is_float(v) -> bool:
    return isinstance(v, (float, np.floating))


def _poles(multipoles) -> tuple[tuple[int, ...], bool]:
    """(orders, scalar): an int or a sequence of ints, each >= 0."""
    scalar = np.ndim(multipoles) == 0
    values = [multipoles] if scalar else list(np.ravel(np.asarray(multipoles, dtype=object)))
    if not values or not all(_is_int(v) for v in values):
        raise TypeError(f"`multipoles` must be an int or a sequence of ints (Legendre orders); "
                        f"got {multipoles!r}")
    if any(v < 0 for v in values):
        raise ValueError(f"`multipoles` must be >= 0 (Legendre orders); got {multipoles!r}")
    return tuple(int(v) for v in values), scalar


def _los(los) -> tuple[float, float, float]:
    try:
        v = np.asarray(los, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"`los` must be 3 numbers (the line of sight along X, Y, Z); got "
                        f"{los!r}") from None
    if v.shape != (3,) or not np.all(np.isfinite(v)):
        raise ValueError(f"`los` must be 3 finite numbers (the line of sight along X, Y, Z); "
                         f"got {los!r}")
    norm = np.linalg.norm(v)
    if norm == 0:
        raise ValueError(f"`los` (the line of sight) must not be zero; got {los!r}")
    return tuple(float(c) for c in v / norm)


def box_lengths(box_shape, shape) -> tuple[float, float, float]:
    """(Lx, Ly, Lz) from `box_shape` (3 finite positive numbers), or the grid `shape` for None."""
    if box_shape is None:
        return tuple(float(n) for n in shape)
    try:
        box = np.asarray(box_shape, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"`box_shape` must be 3 numbers (the box's size along X, Y, Z); got "
                        f"{box_shape!r}") from None
    if box.shape != (3,) or not np.all(np.isfinite(box)) or np.any(box <= 0):
        raise ValueError(f"`box_shape` must be 3 finite positive numbers (the box's size along "
                         f"X, Y, Z); got {box_shape!r}")
    return tuple(float(v) for v in box)


def _windows(compensation, cross: bool) -> tuple[str, ...]:
    """The windows whose transfer functions divide each mode's power: one name compensates
    every field (twice for an auto spectrum: |F|^2 / W^2); a cross spectrum may name one per
    field, None for a field that was not painted."""
    if compensation is None:
        return ()
    expected = ("None, a window name " + str(tuple(_window.WINDOWS)) +
                (", or a pair (window of `field`, window of `field2`), each a name or None"
                 if cross else ""))
    if isinstance(compensation, str):
        names = (compensation, compensation)
    elif cross and isinstance(compensation, (tuple, list)) and len(compensation) == 2:
        names = tuple(compensation)
    else:
        raise (TypeError if not isinstance(compensation, (tuple, list)) else ValueError)(
            f"`compensation` must be {expected}; got {compensation!r}")
    out = []
    for name in names:
        if name is None:
            continue
        try:
            out.append(_window.check_window(name))
        except (TypeError, ValueError):
            raise ValueError(f"`compensation` must be {expected}; got {compensation!r}") from None
    return tuple(out)


def plan_bins(shape, box_shape=None, kedges=None, multipoles=0, los=(0, 0, 1), *,
              compensation=None, cross: bool = False) -> tuple[BinPlan, bool]:
    """(BinPlan, scalar multipoles) for a field of global grid `shape` (X, Y, Z), with JaxPM's
    rules: box_shape None is the grid itself (unit cells); the line of sight is used (and
    normalised) unless multipoles is the scalar 0."""
    box = box_lengths(box_shape, shape)
    edges = kedges_for(kedges, shape, box)
    poles, scalar = _poles(multipoles)
    direction = None if (scalar and poles == (0,)) else _los(los)
    plan = BinPlan(tuple(int(n) for n in shape), box, tuple(float(e) for e in edges), poles,
                   direction, _windows(compensation, cross))
    return plan, scalar


def shot_noise_for(shot_noise, n_particles, box) -> Any:
    """The power to subtract from the monopole: `shot_noise` as given (a real scalar, traced
    too), or nbodykit's Poisson shot noise V / N from `n_particles`; None for neither."""
    if shot_noise is not None and n_particles is not None:
        raise ValueError(f"give `shot_noise` (the power to subtract) or `n_particles` (for "
                         f"V / N), not both; got shot_noise={shot_noise!r}, "
                         f"n_particles={n_particles!r}")
    if n_particles is not None:
        if not _is_int(n_particles) and not (_is_float(n_particles)
                                             and float(n_particles).is_integer()):
            raise TypeError(f"`n_particles` must be an int (the number of particles painted); "
                            f"got {n_particles!r}")
        if n_particles <= 0:
            raise ValueError(f"`n_particles` must be > 0 (the number of particles painted); "
                             f"got {n_particles!r}")
        return math.prod(box) / int(n_particles)
    if shot_noise is None:
        return None
    if isinstance(shot_noise, (bool, np.bool_)) or not (
            isinstance(shot_noise, numbers.Real) or
            (hasattr(shot_noise, "dtype") and np.ndim(shot_noise) == 0
             and np.dtype(shot_noise.dtype).kind in "iuf")):
        raise TypeError(f"`shot_noise` must be a real number (the power to subtract from the "
                        f"monopole, in the units of pk); got {shot_noise!r}")
    if isinstance(shot_noise, numbers.Real) and not np.isfinite(float(shot_noise)):
        raise ValueError(f"`shot_noise` must be finite; got {shot_noise!r}")
    return shot_noise


# ----------------------------------------------------------------------------------------------
# Per-mode weights of one block (traced)


def _legendre(ell: int, mu):
    """L_ell(mu) by the three-term recurrence (n + 1) L_{n+1} = (2n + 1) mu L_n - n L_{n-1}."""
    prev, cur = jnp.ones_like(mu), mu
    if ell == 0:
        return prev
    for n in range(1, ell):
        prev, cur = cur, ((2 * n + 1) * mu * cur - n * prev) / (n + 1)
    return cur


def _tie_tolerance(dtype) -> float:
    """Relative tolerance on |k|^2 below an edge still counted on the edge: a mode whose |k|
    equals an edge in exact arithmetic (JaxPM's default edges put many there) goes to the upper
    bin, as np.digitize's rule says, whatever the rounding of |k| and of the edge."""
    return 16 * float(np.finfo(dtype).eps)


def _block_rows(bins: BinPlan, rows: tuple, q, starts):
    """Per-bin sums (..., len(rows), n_bins) of one block q (..., y, z, X) of the half spectrum
    whose first element has global indices (starts[0], starts[1], 0) along (Y, Z, X).

    rows: "count" (the modes' multiplicity h), "ksum" (h |k|), or an int ell (h (2 ell + 1)
    L_ell(mu), summing L over each stored mode and its mirror).  Positions outside the exact
    half spectrum (mesh padding) weigh 0 whatever q holds there.
    """
    ny, nz, nx = q.shape[-3:]
    gy = (starts[0] + jnp.arange(ny))[:, None, None]
    gz = (starts[1] + jnp.arange(nz))[None, :, None]
    gx = jnp.arange(nx)[None, None, :]
    return _rows_of(bins, rows, q, gx, gy, gz)


def _brick_block_rows(bins: BinPlan, rows: tuple, q, starts):
    """`_block_rows` of a block q (..., x, y, z) of the half spectrum in its natural order
    (X, Y, Z//2+1), whose first element has global indices `starts` (X, Y, Z)."""
    nx, ny, nz = q.shape[-3:]
    gx = (starts[0] + jnp.arange(nx))[:, None, None]
    gy = (starts[1] + jnp.arange(ny))[None, :, None]
    gz = (starts[2] + jnp.arange(nz))[None, None, :]
    return _rows_of(bins, rows, q, gx, gy, gz)


def _rows_of(bins: BinPlan, rows: tuple, q, gx, gy, gz):
    """The per-bin sums of a block q whose global indices along X, Y and Z are gx, gy and gz
    (integer arrays that broadcast to q's last three axes, in whatever order they hold them)."""
    X, Y, Z = bins.shape
    dx, dy, dz = (b / n for b, n in zip(bins.box, bins.shape))
    rdtype = q.dtype
    # fftfreq's wavenumbers along every axis (Z too: the kz = Z/2 plane is the full grid's
    # -Z/2 plane, as JaxPM's fftn sees it), and those of the Hermitian mirror (-m mod n).
    k = [wavenumbers("fft", g, n, d).astype(rdtype) for g, n, d in ((gx, X, dx), (gy, Y, dy),
                                                                     (gz, Z, dz))]
    km = [wavenumbers("fft", (n - g) % n, n, d).astype(rdtype)
          for g, n, d in ((gx, X, dx), (gy, Y, dy), (gz, Z, dz))]
    k2 = k[0] ** 2 + k[1] ** 2 + k[2] ** 2
    valid = (gy < Y) & (gz < Z // 2 + 1)
    once = (gz == 0) | ((Z % 2 == 0) & (gz == Z // 2))
    h = jnp.where(valid, jnp.where(once, 1, 2), 0).astype(rdtype)
    mirrored = (valid & ~once).astype(rdtype)  # the mirror's own term, for the poles
    b = jnp.where(valid, _bin_index(bins.edges, k2), 0)  # padding: bin 0, dropped, weight 0

    kmag = jnp.sqrt(k2)
    safe = jnp.where(k2 > 0, kmag, 1)
    if bins.los is not None:
        mu = jnp.where(k2 > 0, sum(c * l for c, l in zip(k, bins.los)) / safe, 0)
        mum = jnp.where(k2 > 0, sum(c * l for c, l in zip(km, bins.los)) / safe, 0)

    if bins.windows:
        # The windows' transfer functions in radians per cell, even in k: the mirror's too.
        cell = tuple(wavenumbers("fft", g, n, 1.0).astype(rdtype) for g, n in ((gx, X), (gy, Y),
                                                                                (gz, Z)))
        transfer = 1.0
        for name in bins.windows:
            transfer = transfer * _window.compensation(cell, name)
        inverse = 1 / transfer  # > 0: sinc(k / 2) >= 2 / pi for |k| <= pi

    q = jnp.where(valid, q, 0)  # XLA's padding of uneven blocks may hold anything
    out = []
    for row in rows:
        if row == "count":
            w = h
        elif row == "ksum":
            w = h * kmag
        elif row == 0 or bins.los is None:
            w = h
        else:
            w = (2 * row + 1) * (jnp.where(valid, _legendre(row, mu), 0)
                                 + mirrored * _legendre(row, mum))
        if bins.windows and row not in ("count", "ksum"):
            w = w * inverse
        out.append(q * w)
    return _segment_sum(jnp.stack(out, axis=-1), b, bins.n_bins)


def _bin_index(edges: tuple[float, ...], k2):
    """np.digitize(|k|, edges) from |k|^2, ties (to rounding) in the upper bin: the number of
    edges e with e^2 (1 - tol) <= k2.  Uniform edges (JaxPM's rules make them) give the bin by
    arithmetic, then one comparison with each neighbouring edge settles rounding; others take
    a binary search."""
    e = np.asarray(edges, np.float64)
    # An edge at or below 0 is below every |k| (the DC mode included)
    thresholds = np.where(e > 0, e ** 2 * (1 - _tie_tolerance(k2.dtype)), -np.inf)
    widths = np.diff(e)
    if not np.allclose(widths, widths[0], rtol=1e-9, atol=0):
        return jnp.searchsorted(jnp.asarray(thresholds, k2.dtype), k2, side="right")
    n = len(e)
    first, width = float(e[0]), float(widths[0])  # Python floats: k2's dtype is kept
    guess = jnp.floor((jnp.sqrt(k2) - first) / width).astype(jnp.int32) + 1
    guess = jnp.clip(guess, 0, n)
    # table[i] = threshold of edge i - 1 (-inf before the first, +inf after the last)
    table = jnp.asarray(np.concatenate([[-np.inf], thresholds, [np.inf]]), k2.dtype)
    return (guess + (k2 >= table[guess + 1]).astype(jnp.int32)
            - (k2 < table[guess]).astype(jnp.int32))


def _segment_sum(v, b, n: int):
    """Sums of v (..., y, z, x, rows) per bin b (y, z, x) -> (..., rows, n): local, over the
    block, one scatter for all rows."""
    lead, rows = v.shape[:-4], v.shape[-1]
    flat_v = v.reshape(lead + (-1, rows))
    flat_b = jnp.broadcast_to(b, v.shape[-4:-1]).reshape(-1)
    seg = lambda u: jax.ops.segment_sum(u, flat_b, num_segments=n).T
    for _ in lead:
        seg = jax.vmap(seg)
    return seg(flat_v)


# ----------------------------------------------------------------------------------------------
# The binning as a linear map of q, placed by the partitioner when the mesh is unknown


@dataclasses.dataclass(frozen=True)
class BinSums(LinearOp):
    """q (..., Y', Zh', X) in the transposed k-space layout -> per-bin sums (..., rows, bins).

    `in_shape` is q's global shape: padded for the mesh (the mesh known) or exact (XLA's
    uneven blocks, the mesh decided by the partitioner).  Each device sums its own block, then
    one psum over the pencil axes; batch mesh axes keep their fields apart.
    """

    bins: BinPlan
    rows: tuple
    in_shape: tuple[int, ...]
    dtype: Any
    deferred: Any = None
    mpi: bool = False  # the sum through MPI inside XLA (`_mpi_exchange.auto`)
    transposed: bool = False

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.in_shape[:-3] + (len(self.rows), self.bins.n_bins)

    def batched(self, n: int) -> BinSums:
        return dataclasses.replace(self, in_shape=(n,) + self.in_shape)

    def primal_local(self, q):
        return _block_rows(self.bins, self.rows, q, (0, 0))

    def primal_on_mesh(self, mesh):
        local, in_spec, out_spec, pencil = self._blocks_on_mesh(mesh)
        if not self.mpi:
            return (lambda q: jax.lax.psum(local(q), pencil)), in_spec, out_spec

        def summed(q):  # over one pencil axis, then the other: their sizes are known here
            s = local(q)
            for name in pencil:
                s = _mpi_exchange.allreduce(s, name, mesh.shape[name])
            return s

        return with_mesh(summed, mesh), in_spec, out_spec

    def _blocks_on_mesh(self, mesh):
        """(per-device sums of a block, without the psum; q's spec; the sums' spec; the
        pencil axes).  Leading axes are split by the mesh's batch axes in order (pencilfft's
        k-space spec); batch axes left without an array axis hold copies (the counts)."""
        n_lead = len(self.in_shape) - 3
        (a, b), _ = mesh_axes(mesh)
        names = batch_axes(mesh)[0]
        lead = tuple(names[:n_lead]) + (None,) * max(0, n_lead - len(names))
        in_spec, out_spec = P(*lead, a, b, None), P(*lead, None, None)
        pencil = tuple(n for n in (a, b) if n is not None)

        def local(q):
            ny, nz = q.shape[-3:-1]
            starts = (jax.lax.axis_index(a) * ny, jax.lax.axis_index(b) * nz if b else 0)
            return _block_rows(self.bins, self.rows, q, starts)

        return local, in_spec, out_spec, pencil

    def on_mesh(self, mesh, in_spec=None):
        if not self.transposed:
            return super().on_mesh(mesh, in_spec)
        # The adjoint of psum(local(q)) for a cotangent that is the same on every device (the
        # sums are replicated) is local^T on each block, with no collective: jax's transpose of
        # a psum outside shard_map (here, in the partitioner's per-device body) sums again.
        local, in_spec, out_spec, _ = self._blocks_on_mesh(mesh)
        block = jax.ShapeDtypeStruct(tile(self.in_shape, in_spec, mesh), self.dtype)
        body = lambda ct: jax.linear_transpose(local, block)(ct)[0]
        return body, NamedSharding(mesh, out_spec), NamedSharding(mesh, in_spec)

    def primal_rule(self) -> tuple[str, str]:
        return "i j k", "r n"


@dataclasses.dataclass(frozen=True)
class BrickSums(BinSums):
    """`BinSums` of q (..., X, Y, Z//2+1), the half spectrum of a brick in its natural order,
    split as `spec` says (per axis, the mesh axes that split it, major to minor, evenly: the
    layout `rfftn` was asked for).  Each device bins its block from the block's global offsets
    (its linear index over each axis's mesh axes times the block's length), then one psum
    over the mesh axes that split q, in the mesh's order."""

    spec: tuple = ()

    def primal_local(self, q):
        return _brick_block_rows(self.bins, self.rows, q, (0, 0, 0))

    def _blocks_on_mesh(self, mesh):
        lead = (None,) * (len(self.in_shape) - 3)
        in_spec = P(*lead, *partition_spec(self.spec))
        out_spec = P(*lead, None, None)
        named = {m for names in self.spec for m in names}
        summed = tuple(m for m in mesh.axis_names if m in named)

        def local(q):
            starts = tuple(_linear_index(names, mesh) * n
                           for names, n in zip(self.spec, q.shape[-3:]))
            return _brick_block_rows(self.bins, self.rows, q, starts)

        return local, in_spec, out_spec, summed



def _linear_index(names: tuple[str, ...], mesh):
    """This device's block index along an array axis split by `names` (major to minor): one
    axis_index per mesh axis (a tuple of names in another order than the mesh's is refused by
    jax's next releases)."""
    index = 0
    for name in names:
        index = index * mesh.shape[name] + jax.lax.axis_index(name)
    return index


# ----------------------------------------------------------------------------------------------
# Bricks: fields split over X, Y and Z (static planning, then the traced spectrum)


def _under_vmap(x) -> bool:
    """Whether traced x is mapped by jax.vmap (its tracer, or one it wraps, carries a batch
    dimension): there the mesh may split the mapped axis, which only the partitioner sees."""
    for _ in range(64):  # a chain of nested transformations, never a cycle
        if not is_tracer(x):
            return False
        if hasattr(x, "batch_dim"):
            return True
        inner = getattr(x, "primal", None)
        x = getattr(x, "val", None) if inner is None else inner
    return False


def _known_spec(field, mesh):
    """The field's spec where it is known before the partitioner runs (a concrete NamedSharding
    on `mesh`, an Explicit type), else None."""
    if not is_tracer(field):
        sharding = _known_sharding(field)
        return sharding.spec if sharding is not None and sharding.mesh.shape == mesh.shape \
            else None
    typed = getattr(jax.typeof(field), "sharding", None)
    if isinstance(typed, NamedSharding) and not typed.mesh.empty and \
            has_explicit_axes(typed.mesh):
        return typed.spec
    return None


def brick_mesh(field):
    """The mesh of a *brick* field (X, Y, Z split over three mesh axes, any names, any order),
    or None for the pencil path.

    A field is taken for a brick where its mesh has more axes than the pencil path can place:
    the axes before a mesh's last two split one leading (batch) axis of the field each, so a
    mesh of 3 or more axes with too few leading axes is a brick's.  Except under jax.vmap, and
    where an Explicit type leaves a mesh axis out: there the mapped axis, which the field does
    not show, is the batch axis (the pencil path leaves it to the partitioner, as before)."""
    mesh = find_mesh(field, None)
    if mesh is None:
        mesh = typed_mesh(field)  # jit with an Auto mesh and nothing in scope
    if mesh is None or len(mesh.axis_names) < 3:
        return None
    if len(field.shape) - 3 >= len(mesh.axis_names) - 2:
        return None  # a batch of pencil fields
    if is_tracer(field):
        if _under_vmap(field):
            return None
        spec = _known_spec(field, mesh)
        if spec is not None:
            named = {m for e in spec if e is not None for m in ((e,) if isinstance(e, str) else e)}
            if any(n > 1 and m not in named for m, n in mesh.shape.items()):
                return None
    return mesh


def _check_brick_shape(shape, mesh) -> None:
    if len(shape) != 3:
        raise ValueError(
            f"`field` has shape {shape} on a mesh of {len(mesh.axis_names)} axes "
            f"{dict(mesh.shape)}: a field split over X, Y and Z (a brick) must be 3-D (X, Y, Z), "
            f"one spectrum per call (for a batch of fields use a mesh whose axes before its last "
            f"two split the leading axes: pencils)")


def _assumed_spec(sizes: dict) -> tuple[tuple[str, ...], ...]:
    """Where the field's split is the partitioner's (an Auto mesh under jit): the mesh's axes
    of size > 1 in its order over X, Y and Z (the last array axis takes any left over)."""
    entries = [(), (), ()]
    for k, name in enumerate(m for m, n in sizes.items() if n > 1):
        entries[min(k, 2)] += (name,)
    return tuple(entries)


@functools.lru_cache(maxsize=256)
def brick_layout(shape: tuple[int, int, int], dtype: str, sizes: tuple,
                 in_spec: tuple) -> tuple[tuple[str, ...], ...]:
    """The layout of the half spectrum (X, Y, Z//2+1) of a brick of global `shape` (static):
    per axis, the mesh axes that split it (major to minor).  It is the one `rfftn` picks
    itself from the field's split `in_spec` (the cheapest route to a layout split evenly over
    every mesh axis of size > 1), named as its `out_sharding` so that the binning knows it in
    every calling form, the partitioner's too."""
    X, Y, Z = shape
    cplx = np.dtype(fft_dtype(np.dtype(dtype), "field"))
    call = Call(tuple(shape), (0, 1, 2), "r2c", False, tuple(shape), (X, Y, Z // 2 + 1),
                "backward", np.dtype(float_dtype(cplx)), cplx, "auto")
    sizes = dict(sizes)
    try:
        route = find_route(call.problem(sizes, in_spec, None, even=True))
    except ValueError:
        raise ValueError(
            f"`field` of shape {tuple(shape)} split {spec_text(in_spec)} over mesh axes {sizes}: "
            f"no route of exchanges takes it to a half spectrum of shape {call.out_shape} split "
            f"evenly over every mesh axis of size > 1 (nothing is gathered): use a grid whose "
            f"axes the mesh axes divide, or a mesh with fewer devices") from None
    return route.spec


def _brick_spectrum_of(field, field2, bins: BinPlan, mesh):
    """(k, pk (poles, bins), modes per bin) of a brick: its layout planned, then traced (one
    program when called eagerly)."""
    sizes = tuple((m, int(n)) for m, n in mesh.shape.items())
    spec = _known_spec(field, mesh)
    in_spec = (spec_entries(spec, 3, dict(sizes), "field.sharding") if spec is not None
               else _assumed_spec(dict(sizes)))
    target = brick_layout(tuple(field.shape), np.dtype(field.dtype).name, sizes, in_spec)
    # Where the mesh is known (a concrete field, an Explicit type, jax.set_mesh) the binning
    # runs in shard_map on it; else (jit, an Auto mesh, nothing in scope) the partitioner
    # places it, with the layout named.
    known = find_mesh(field, None)
    # A field with no split of its own (numpy, one device, a value the program makes) under
    # jax.set_mesh: placed as the layout was planned for, so that rfftn has one to start from.
    place_as = None
    if spec is None and typed_mesh(field) is None:
        # The concrete mesh: a traced value constrained to the abstract one carries no mesh in
        # its type, and rfftn's partitioner path then cannot tell it.
        concrete = known if isinstance(known, Mesh) else concrete_mesh()
        if concrete is not None:
            place_as = NamedSharding(concrete, partition_spec(in_spec))
    kw = dict(bins=bins, mesh=known, target=target, place_as=place_as)
    if not (is_tracer(field) or is_tracer(field2)):
        return _brick_spectrum_jit(field, field2, **kw)
    return _brick_spectrum(field, field2, **kw)


def _brick_spectrum(field, field2, *, bins: BinPlan, mesh, target, place_as):
    """The traced spectrum of a brick: `rfftn` to the layout `target`, binned block by block."""
    if place_as is not None:
        field = place(field, place_as)
        field2 = None if field2 is None else place(field2, place_as)
    out = partition_spec(target)
    q = _cross(rfftn(field, out_sharding=out),
               None if field2 is None else rfftn(field2, out_sharding=out))
    mpi = _mpi_exchange.auto(jax.default_backend(), mesh)
    sums = run(BrickSums(bins, tuple(bins.poles), tuple(q.shape), q.dtype, mpi=mpi, spec=target),
               q, mesh)
    counts = run(BrickSums(bins, ("count", "ksum"), tuple(q.shape), q.dtype, mpi=mpi,
                           spec=target), jnp.ones(q.shape, q.dtype), mesh)
    count, ksum = counts[0], counts[1]
    k = (ksum / count)[1:-1]
    pk = (sums / count)[..., 1:-1] * bins.scale
    return k, pk, count[1:-1]


_brick_spectrum_jit = jax.jit(_brick_spectrum, static_argnames=("bins", "mesh", "target",
                                                               "place_as"))


# ----------------------------------------------------------------------------------------------
# The public function


def power_spectrum(field, field2=None, *, box_shape=None, kedges=None, multipoles=0,
                   los=(0, 0, 1), compensation=None, shot_noise=None, n_particles=None,
                   return_counts=False):
    """The power spectrum of a sharded 3-D field (or the cross spectrum of two), with multipoles.

    As JaxPM's `jaxpm.utils.power_spectrum` (same arguments and results, so that a JaxPM user
    switches by import), computed from `prfft3d` on each device's block with one all-reduce of
    the per-bin sums and no gather; eagerly, under `jax.jit` (with the mesh known or left to the
    compiler), `jax.vmap` and `jax.grad`.  Three options for analysts (nbodykit's FFTPower's,
    differences in docs/howto/power-spectra.md): the mode counts, a window compensation applied
    mode by mode in the same pass, and the shot noise.

    A *brick*, a 3-D field split over X, Y and Z by three mesh axes (P(a, b, c), any names in
    any order of the mesh's; `brick_mesh` says when a field is one), takes `rfftn` to the layout
    it picks (`brick_layout`) instead of `prfft3d`, and is binned block by block the same way
    (docs/howto/power-spectra.md, "Bricks").

    Args:
      field: real array of global shape (X, Y, Z), or (..., X, Y, Z) for one spectrum per field
        (the leading axes split by a mesh's batch axes), in pencilfft's real-space sharding
        (any other is resharded), or a brick (X, Y, Z) split over three mesh axes; float32 or
        float64.
      field2: None for the auto spectrum, or a second field of the same shape and sharding for
        the cross spectrum: the real part of the binned cross power Re(F1 conj F2), the usual
        estimator (nbodykit, pypower).  JaxPM returns the modulus of the complex per-bin sum
        instead; they differ where the binned imaginary part is not zero (odd multipoles).
      box_shape: the box's physical size (Lx, Ly, Lz); None: the grid shape (unit cells).
      kedges: bin edges in `|k|`: None (width dk = 2 * 2 pi / min(box)), an int n (n edges below
        the Nyquist wavenumber kmax = pi * min(shape / box): dk = kmax / (n + 1)), a float (dk),
        each giving edges arange(dk, kmax, dk) + dk / 2; or an increasing array of edges.
        Bin i holds `edges[i-1] <= |k| < edges[i]` (len(edges) - 1 bins); a mode on an edge
        (`|k|^2` within 16 float eps of edge^2, the field's precision) is in the upper bin.
      multipoles: a Legendre order or a sequence of them (each >= 0).
      los: the line of sight (X, Y, Z), normalised; used unless multipoles is 0.
      compensation: None, or the mass-assignment window the field was painted with ("ngp",
        "cic", "tsc", "pcs"): each mode's power is divided by W(k)^2, W(k) = prod_i
        sinc(k_i / 2)^s (k_i in radians per cell, `window_compensation`), in the same pass (no
        extra transform).  For a cross spectrum, a name compensates both fields, a pair
        (window of `field`, window of `field2`) each its own (None: not painted).
      shot_noise: a real number (traced too) subtracted from the monopole (ell = 0) of every
        bin, in the units of pk (volume); None: nothing subtracted.
      n_particles: the number N of particles painted (unit weights): subtracts nbodykit's
        Poisson shot noise V / N from the monopole, V = prod(box_shape).  Not with `shot_noise`.
      return_counts: also return the number of modes in each bin.

    Returns:
      `(k, pk)`, or `(k, pk, nmodes)` with `return_counts`: k (n_bins,) the mean `|k|` of the
      modes in each bin; pk (..., n_bins) for an int `multipoles`, (..., len(multipoles),
      n_bins) for a sequence: the mean over the bin's modes of `(2 ell + 1) L_ell(mu)
      |F_ortho|^2` times the cell volume prod(box / shape), as JaxPM's (an empty bin is NaN),
      divided by W(k)^2 mode by mode and less the shot noise when asked; nmodes (n_bins,) int32,
      the modes of the full grid in each bin (the Hermitian mirrors of the half spectrum
      counted, as nbodykit's `modes`; exact up to 2^24 modes per bin in float32).  k and nmodes
      are replicated on every device, pk too except along batch axes split by the mesh, which
      keep their split.

    Raises:
      TypeError: a complex field; a `compensation`, `shot_noise` or `n_particles` of the wrong
        type.
      ValueError: fields of different shapes or shardings; bad `kedges`, `multipoles`, `los`,
        `compensation` or `n_particles`; both `shot_noise` and `n_particles`; a brick with
        leading axes, or whose half spectrum has no even layout over every mesh axis.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> with jax.set_mesh(mesh):
      ...     delta = jax.random.normal(jax.random.key(0), (32, 32, 32),
      ...                               out_sharding=pencilfft.real_space_sharding(mesh))
      >>> k, pk = pencilfft.power_spectrum(delta, box_shape=(100.0, 100.0, 100.0))
      >>> k.shape, pk.shape
      ((6,), (6,))
      >>> k, pl = pencilfft.power_spectrum(delta, multipoles=(0, 2, 4))
      >>> pl.shape[0]
      3

      The modes per bin, a CIC compensation and the Poisson shot noise of 32^3 particles:

      >>> k, pk, nmodes = pencilfft.power_spectrum(delta, box_shape=(100.0, 100.0, 100.0),
      ...                                          compensation="cic", n_particles=32**3,
      ...                                          return_counts=True)
      >>> nmodes.dtype, [int(n) for n in nmodes[:3]]
      (dtype('int32'), [392, 880, 1604])
    """
    shape = _field_shape(field, "field")
    if np.dtype(field.dtype).kind == "c":
        raise TypeError(f"`field` must be real (float32 or float64); got {field.dtype}")
    if not isinstance(return_counts, (bool, np.bool_)):
        raise TypeError(f"`return_counts` must be True or False; got {return_counts!r}")
    brick = brick_mesh(field)
    if brick is not None:
        _check_field2(field, field2, shape)
        _check_brick_shape(shape, brick)
    else:
        plan = plan_forward(field, norm="backward", layout="transposed", mesh=None, real=True,
                            argname="field")
        _check_field2(field, field2, shape)
    bins, scalar = plan_bins(shape[-3:], box_shape, kedges, multipoles, los,
                             compensation=compensation, cross=field2 is not None)
    shot = shot_noise_for(shot_noise, n_particles, bins.box)
    if field2 is not None and field2.dtype != field.dtype:
        field2 = field2.astype(field.dtype)
    if brick is not None:
        k, pk, count = _brick_spectrum_of(field, field2, bins, brick)
        return _finished(k, pk, count, bins, shot, scalar, return_counts)
    mesh = plan.mesh
    if field2 is not None and mesh is None and plan.deferred is None:
        # A field traced on an Auto mesh (no mesh in scope) with the other one concrete (closed
        # over): both on the concrete one's mesh, so that the two spectra have one layout.
        mesh = plan_forward(field2, norm="backward", layout="transposed", mesh=None, real=True,
                            argname="field2").mesh
    spectrum = _spectrum
    if not (is_tracer(field) or is_tracer(field2)):
        spectrum = _spectrum_jit  # called eagerly: one program instead of op-by-op dispatch
    k, pk, count = spectrum(field, field2, bins=bins, mesh=mesh, deferred=plan.deferred)
    return _finished(k, pk, count, bins, shot, scalar, return_counts)


def _finished(k, pk, count, bins: BinPlan, shot, scalar: bool, return_counts: bool):
    """The public result from the binned (k, pk (..., poles, bins), modes per bin): the shot
    noise off the monopole, the pole axis dropped for an int `multipoles`, the counts as ints."""
    if shot is not None:
        monopole = np.array([[1.0 if ell == 0 else 0.0] for ell in bins.poles])  # (poles, 1)
        pk = pk - jnp.asarray(shot, pk.dtype) * monopole.astype(pk.dtype)
    pk = pk[..., 0, :] if scalar else pk
    if return_counts:
        return k, pk, jnp.round(count).astype(jnp.int32)
    return k, pk


def _cross(f1, f2):
    """Re(f1 conj(f2)) of two spectra, |f1|^2 without f2, as real arrays."""
    if f2 is None:
        return f1.real ** 2 + f1.imag ** 2
    return f1.real * f2.real + f1.imag * f2.imag


def _spectrum(field, field2, *, bins: BinPlan, mesh, deferred):
    """(k, pk (..., poles, bins), the modes per bin) of the planned spectrum (traced)."""
    q = _cross(prfft3d(field, mesh=mesh), None if field2 is None else prfft3d(field2, mesh=mesh))
    sums = _bin(bins, bins.poles, q, deferred, mesh)
    # The modes' counts and mean |k| are those of one field, whatever the batch: binned from a
    # 3-D array of ones, split over the pencil axes only (copies on the batch axes).
    counts = _bin(bins, ("count", "ksum"), jnp.ones(q.shape[-3:], q.dtype), None, mesh)
    count, ksum = counts[0], counts[1]
    k = (ksum / count)[1:-1]
    pk = (sums / count)[..., 1:-1] * bins.scale
    return k, pk, count[1:-1]


_spectrum_jit = jax.jit(_spectrum, static_argnames=("bins", "mesh", "deferred"))


def _bin(bins: BinPlan, rows, q, deferred, mesh):
    t = BinSums(bins, tuple(rows), tuple(q.shape), q.dtype, deferred=deferred,
                mpi=_mpi_exchange.auto(jax.default_backend(), mesh))
    return run(t, q, mesh)


def _check_field2(field, field2, shape) -> None:
    """A second field of the first one's shape and sharding, real (None: an auto spectrum)."""
    if field2 is None:
        return
    shape2 = _field_shape(field2, "field2")
    if shape2 != shape:
        raise ValueError(f"`field2` must have the shape of `field` {shape}; got {shape2}")
    if np.dtype(field2.dtype).kind == "c":
        raise TypeError(f"`field2` must be real (float32 or float64); got {field2.dtype}")
    _check_same_sharding(field, field2)


def _field_shape(x, argname: str) -> tuple[int, ...]:
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"`{argname}` must be an array (jax.Array or numpy.ndarray); got "
                        f"{type(x).__name__}")
    shape = tuple(x.shape)
    if len(shape) < 3:
        raise ValueError(f"`{argname}` must be a 3-D field (X, Y, Z), or (..., X, Y, Z) for a "
                         f"batch of fields; got shape {shape}")
    return shape


def _known_sharding(x):
    """A concrete x's NamedSharding (None for numpy or another sharding)."""
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
        return sharding
    return None


def _check_same_sharding(field, field2) -> None:
    """Two concrete fields on different meshes or in different shardings: refused (the second
    would be resharded, or not run at all, silently).  Traced fields are not compared (their
    types need not show the shardings they will have)."""
    if is_tracer(field) or is_tracer(field2):
        return
    s1, s2 = _known_sharding(field), _known_sharding(field2)
    if s1 is None or s2 is None:
        return
    if s1.mesh != s2.mesh or not s1.is_equivalent_to(s2, len(field.shape)):
        raise ValueError(f"`field2` must be sharded as `field` ({s1.spec} on mesh "
                         f"{dict(s1.mesh.shape)}); got {s2.spec} on mesh {dict(s2.mesh.shape)}")
