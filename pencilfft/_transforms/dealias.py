"""Dealiasing for the N-D transforms (`fftn`, `rfftn`, ...): the 2/3 rule's mask and the 3/2
rule's zero padding, each sharded like the spectrum it applies to.

* `dealias_mask(k, axes, s=, real=, keep=2/3)`: a boolean array that keeps the modes |m| <
  keep * n/2 along each transformed axis (Orszag's 2/3 rule), split over the mesh axes that
  split those axes of `k`, so that `k * mask` is local on every device.
* `pad_spectrum(k, s, axes, padding=1.5)` / `truncate_spectrum(...)`: the spectrum of N-point
  transforms as that of padding x N points (zeros at the high frequencies) and back, so that
  `truncate_spectrum(rfftn(irfftn(pad_spectrum(a)) * irfftn(pad_spectrum(b))))` is the product
  of two band-limited fields without aliasing (the 3/2 rule).  jnp.fft's `s` cannot do this:
  it pads or crops at the end of an axis, where the negative frequencies are.

Padding moves entries along an axis (the low modes stay, the negative ones move to the end of
the longer axis).  Along an axis that is whole on each device that is a local gather; along a
split axis each device's new block is built from at most a few old blocks, moved in rounds of
collective permutes (`_moves`: one block per device per round, at most 2 rounds for the 3/2
rule on the meshes tried), so that a device holds its old block, what the rounds bring and its
new block, never the whole axis.  The result keeps the input's PartitionSpec.  Where the mesh is
known (a concrete array, an Explicit type under jit) that runs in `shard_map`; under jit on an
Auto mesh as a `partitioned.LinearOp` whose layout XLA's partitioner gives (blocks of
ceil(n / P) there: the moves read the block length they are given).

An even n's Nyquist mode (n/2) has no symmetric place in a longer or a shorter grid: both maps
set it to zero (most pseudo-spectral codes do, its derivative being undefined); every other
mode of the shorter grid is kept exactly.  Shapes are global unless a name says block.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from .._decomposition.mesh import has_explicit_axes, is_tracer
from .numpy_fft import int_tuple
from .partitioned import LinearOp, apply

__all__ = ["dealias_mask", "pad_spectrum", "truncate_spectrum"]

NORMS = ("backward", "ortho", "forward")


# ----------------------------------------------------------------------------------------------
# Arguments


def _array(k, caller: str):
    """k's (shape, dtype); a jax.ShapeDtypeStruct is taken for the mask (shape and sharding)."""
    values = caller != "dealias_mask"  # the padding maps need the values
    if not (hasattr(k, "shape") and hasattr(k, "dtype")) or (
            values and isinstance(k, jax.ShapeDtypeStruct)):
        raise TypeError(f"`k` must be an array (jax.Array, numpy.ndarray or, for dealias_mask, "
                        f"a jax.ShapeDtypeStruct), the spectrum for {caller}; got "
                        f"{type(k).__name__}")
    if values and np.dtype(k.dtype).kind not in "fc":
        raise TypeError(f"`k` must be a complex (or real) floating spectrum for {caller}; got "
                        f"dtype {np.dtype(k.dtype)}")
    if isinstance(k, jax.Array) and not is_tracer(k) and k.is_deleted():
        raise ValueError("`k` has been deleted (donated to an earlier call?); pass a live array")
    shape = tuple(k.shape)
    if not shape or 0 in shape:
        raise ValueError(f"`k` must have at least one axis and no empty one; got shape {shape}")
    return shape, np.dtype(k.dtype)


def _axes(shape, s, axes) -> tuple[int, ...]:
    """The transformed axes as jnp.fft.fftn reads them: all, or the last len(s) with `s`."""
    ndim = len(shape)
    if axes is None:
        axes = tuple(range(ndim - len(s), ndim)) if s is not None else tuple(range(ndim))
    axes = int_tuple(axes, "axes")
    if not axes:
        raise ValueError("`axes` must name at least one axis")
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"`axes` = {axes} names axis {ax}, but `k` has {ndim} dimensions "
                             f"(shape {tuple(shape)})")
    axes = tuple(ax % ndim for ax in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"`axes` = {axes} repeats an axis")
    return axes


def _modes(shape, axes, s, real: bool, k_lengths=None) -> tuple[int, ...]:
    """The real-space lengths n along `axes` of the spectrum of shape `shape` (`s` if given,
    checked: each complex axis holds n entries, the half axis n//2+1); default as irfftn's:
    the lengths of `k`, the half axis 2 (h - 1).  `k_lengths`: the lengths `k` must have (the
    padded spectrum's), default `shape`'s."""
    have = tuple(shape[i] for i in axes) if k_lengths is None else k_lengths
    if s is None:
        return have[:-1] + (2 * (have[-1] - 1),) if real else have
    s = int_tuple(s, "s")
    if len(s) != len(axes):
        raise ValueError(f"`s` = {s} and `axes` = {axes} must have the same length")
    if any(n < 1 for n in s):
        raise ValueError(f"`s` = {s} must hold lengths >= 1")
    return s


def _check_lengths(shape, axes, n, real: bool, what: str) -> None:
    """`k`'s lengths along `axes` are those of the spectrum of n-point transforms."""
    for j, (i, m) in enumerate(zip(axes, n)):
        want = m // 2 + 1 if real and j == len(axes) - 1 else m
        if shape[i] != want:
            half = f" (the half axis of an rfftn of {m} points: {m} // 2 + 1)" if want != m else ""
            raise ValueError(f"`k` has {shape[i]} entries along axis {i}, but {what} makes it "
                             f"{want}{half}; pass the `s` (real-space lengths) of `k`'s transform")


def _factors(padding, n_axes: int) -> tuple[float, ...]:
    values = np.ravel(np.asarray(padding, dtype=object))
    try:
        if any(isinstance(v, (str, bytes, bool, np.bool_)) for v in values):
            raise TypeError
        factors = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"`padding` must be a number or one per axis, e.g. 1.5 for the 3/2 "
                        f"rule; got {padding!r}") from None
    if len(factors) == 1:
        factors *= n_axes
    if len(factors) != n_axes or np.ndim(padding) > 1:
        raise ValueError(f"`padding` must be one factor or {n_axes} (one per axis of `axes`); "
                         f"got {padding!r}")
    if not all(np.isfinite(f) and f >= 1 for f in factors):
        raise ValueError(f"`padding` factors must be finite and >= 1 (1.5: the 3/2 rule); got "
                         f"{padding!r}")
    return factors


def _grid(n: tuple[int, ...], factors) -> tuple[int, ...]:
    """The padded lengths padding x n (each must come out whole)."""
    out = []
    for j, (m, f) in enumerate(zip(n, factors)):
        fine = m * f
        if abs(fine - round(fine)) > 1e-9 * fine:
            raise ValueError(f"`s[{j}]` = {m} times `padding` = {f:g} is not a whole number of "
                             f"points; choose lengths that padding divides into whole grids")
        out.append(int(round(fine)))
    return tuple(out)


def _check_norm(norm) -> str:
    if norm is None:
        return "backward"
    if norm not in NORMS:
        raise ValueError(f"`norm` must be None or one of {NORMS} (the norm of the transforms "
                         f"`k` comes from and goes to); got {norm!r}")
    return norm


def _scale(norm: str, coarse, fine, to_fine: bool) -> float:
    """The factor that keeps a band-limited field's values: a spectrum with norm "backward"
    grows as the number of points (ortho: its square root; forward: not at all)."""
    ratio = math.prod(fine) / math.prod(coarse)
    power = {"backward": 1.0, "ortho": 0.5, "forward": 0.0}[norm]
    return ratio ** power if to_fine else ratio ** -power


# ----------------------------------------------------------------------------------------------
# Where k is


def _layout(k, caller: str, every_axis: bool = True):
    """(mesh, spec) where k's split is known (a concrete NamedSharding, an Explicit type, a
    ShapeDtypeStruct's sharding), (None, None) on one device, or (None, "compiler") where XLA's
    partitioner decides it (jit on an Auto mesh).  `every_axis`: an Explicit type must name
    every mesh axis of size > 1: under jax.vmap one may split the mapped axis, which only the
    partitioner sees (shard_map would gather it)."""
    if is_tracer(k):
        typed = getattr(jax.typeof(k), "sharding", None)
        if isinstance(typed, NamedSharding) and not typed.mesh.empty \
                and has_explicit_axes(typed.mesh):
            used = _names(typed.spec)
            if not every_axis or all(n == 1 or m in used for m, n in typed.mesh.shape.items()):
                return typed.mesh, typed.spec
        return None, "compiler"
    sharding = getattr(k, "sharding", None)
    if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
        return sharding.mesh, sharding.spec
    if sharding is not None and len(getattr(sharding, "device_set", ())) > 1:
        raise ValueError(f"`k` is spread over {len(sharding.device_set)} devices by a "
                         f"{type(sharding).__name__} that names no mesh; place it with a "
                         f"NamedSharding (as {caller}'s result is)")
    return None, None


def _names(spec) -> set[str]:
    return {m for e in spec if e is not None for m in ((e,) if isinstance(e, str) else e)}


def _entries(spec, ndim: int, mesh) -> tuple[tuple[str, ...], ...]:
    """Per array axis, the mesh axes of size > 1 that split it (major first)."""
    spec = tuple(spec) + (None,) * (ndim - len(tuple(spec)))
    sizes = dict(mesh.shape)
    return tuple(tuple(m for m in (() if e is None else (e,) if isinstance(e, str) else e)
                       if sizes[m] > 1) for e in spec)


def _linear_index(names: tuple[str, ...], sizes: dict):
    """This device's block index along an axis split over `names` (major first)."""
    index = 0
    for m in names:
        index = index * sizes[m] + jax.lax.axis_index(m)
    return index


# ----------------------------------------------------------------------------------------------
# The 2/3 rule


def _keep_fraction(keep) -> Fraction:
    if isinstance(keep, (bool, np.bool_, str, bytes)):
        raise TypeError(f"`keep` must be a number in (0, 1], e.g. 2/3; got {keep!r}")
    try:
        value = float(keep)
    except (TypeError, ValueError):
        raise TypeError(f"`keep` must be a number in (0, 1], e.g. 2/3; got {keep!r}") from None
    if not 0 < value <= 1:
        raise ValueError(f"`keep` must be in (0, 1] (2/3: the 2/3 rule for quadratic products, "
                         f"1/2 for cubic ones); got {keep!r}")
    # 2/3 as a float is not 2/3: the cut |m| < keep * n / 2 is decided in integers.
    return Fraction(keep).limit_denominator(1 << 20)


def _axis_keep(g, n: int, half: bool, keep: Fraction):
    """Whether entry g (global index) of an n-point transform's axis is kept: its signed
    frequency f has 2 |f| < keep * n (integers: 2 |f| q < p n for keep = p/q)."""
    f = g if half else jnp.where(2 * g < n, g, g - n)
    return 2 * jnp.abs(f) * keep.denominator < keep.numerator * n


@functools.partial(jax.jit, static_argnames=("shape", "axes", "n", "real", "keep", "mesh",
                                             "spec"))
def _mask_on_mesh(*, shape, axes, n, real, keep, mesh, spec):
    return _mask_sharded(shape, axes, n, real, keep, mesh, spec)


def _mask_sharded(shape, axes, n, real, keep, mesh, spec):
    sizes = dict(mesh.shape)
    entries = _entries(spec, len(shape), mesh)
    out_spec = P(*(None if i not in axes or not entries[i] else
                   entries[i][0] if len(entries[i]) == 1 else entries[i]
                   for i in range(len(shape))))
    for i in axes:
        parts = math.prod(sizes[m] for m in entries[i])
        if shape[i] % parts:
            raise ValueError(f"`k`'s axis {i} has {shape[i]} entries, split over mesh axes "
                             f"{entries[i]} ({parts} blocks) that do not divide it")

    def block():
        starts = {i: _linear_index(entries[i], sizes) * (shape[i] // math.prod(
            sizes[m] for m in entries[i])) for i in axes}
        return _mask_block(shape, axes, n, real, keep, starts,
                           {i: shape[i] // math.prod(sizes[m] for m in entries[i]) for i in axes})

    return jax.shard_map(block, mesh=mesh, in_specs=(), out_specs=out_spec)()


def _mask_block(shape, axes, n, real, keep, starts, lengths):
    """The mask's block: length `lengths[i]` from global index `starts[i]` along each of
    `axes`, 1 along the others."""
    mask = None
    for j, i in enumerate(axes):
        g = starts[i] + jnp.arange(lengths[i])
        ok = _axis_keep(g, n[j], real and j == len(axes) - 1, keep)
        view = [1] * len(shape)
        view[i] = lengths[i]
        ok = ok.reshape(view)
        mask = ok if mask is None else mask & ok
    return mask


def dealias_mask(k, axes=None, *, s=None, real: bool = False, keep=2 / 3):
    """The 2/3 rule's mask for the spectrum `k` of `fftn` or `rfftn` (any rank, any layout).

    True where every transformed axis's signed frequency m has abs(m) < keep * n / 2, n being
    that axis's real-space length: with keep = 2/3 (Orszag's rule) a quadratic product of
    fields so truncated has no aliased mode among the kept ones (abs(m) < n/3, exactly:
    3 abs(m) < n, decided in integers).  Multiply by it after each product:
    `jnp.where(mask, k, 0)` or `k * mask`.

    Args:
      k: the spectrum (global shape), a jax.Array in any NamedSharding, a numpy array, a tracer
        under jax.jit, or a jax.ShapeDtypeStruct with a `sharding` (only its shape and
        sharding are read).
      axes: the transformed axes, as given to `fftn`/`rfftn` (default: all; with `s`, the
        last len(s)).
      s: the real-space lengths along `axes` (what `irfftn` takes); default: `k`'s lengths,
        with `real` the last one 2 (h - 1) for h entries (pass `s` for an odd length).
      real: `k` is `rfftn`'s half spectrum: the last of `axes` holds the modes 0..n//2.
      keep: the fraction of each axis's band kept, in (0, 1]: 2/3 for quadratic products,
        1/2 for cubic ones.

    Returns:
      A bool array of `k`'s rank, of `k`'s length along `axes` and 1 along the other axes (it
      broadcasts against `k`), split over the mesh axes that split those axes of `k` (every
      device computes its own block: nothing is transferred, and `k * mask` stays local).  On
      one device, or under jit where XLA's partitioner decides the layout, it is computed where
      it is used (iotas that XLA splits like `k`).

    Raises:
      ValueError: bad `axes` or `s` (`s` that does not fit `k`'s lengths), `keep` outside
        (0, 1].
      TypeError: `k` is not an array; `s`, `axes` not ints; `keep` not a number.

    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> u = jax.device_put(np.ones((48, 48), np.float32), NamedSharding(mesh, P("x")))
      >>> k = pencilfft.rfftn(u)                   # (48, 25): modes 0..24 along the last axis
      >>> mask = pencilfft.dealias_mask(k, real=True)
      >>> mask.shape, mask.sharding.spec == k.sharding.spec, int(mask.sum())
      ((48, 25), True, 496)
      >>> k = k * mask                             # |m| < 16 along both axes: 31 x 16 modes
    """
    shape, _ = _array(k, "dealias_mask")
    axes = _axes(shape, s, axes)
    n = _modes(shape, axes, s, real)
    _check_lengths(shape, axes, n, real, "`s`" if s is not None else "its lengths")
    keep = _keep_fraction(keep)
    # The mask holds no batch axis: a mesh axis the type leaves out only replicates it.
    mesh, spec = _layout(k, "dealias_mask", every_axis=False)
    if mesh is not None:
        if is_tracer(k):
            return _mask_sharded(shape, axes, n, bool(real), keep, mesh, spec)
        return _mask_on_mesh(shape=shape, axes=axes, n=n, real=bool(real), keep=keep, mesh=mesh,
                             spec=P(*tuple(spec)))
    # One device, or jit where the partitioner decides: iotas, which XLA splits as it splits
    # what the mask multiplies (tests/test_dealias.py checks the program gathers nothing).
    return _mask_block(shape, axes, n, bool(real), keep, {i: 0 for i in axes},
                       {i: shape[i] for i in axes})


# ----------------------------------------------------------------------------------------------
# The 3/2 rule: moving the modes to a longer or a shorter axis


@functools.lru_cache(maxsize=64)
def _index_map(n_modes: int, grid_from: int, grid_to: int, half: bool) -> tuple[int, ...]:
    """For each entry of the new axis, the entry of the old one it takes (-1: zero): the
    modes f with 2 |f| < n_modes (f >= 0 on a half axis) of a `grid_from`-point transform
    put where a `grid_to`-point one has them."""
    length = grid_to // 2 + 1 if half else grid_to
    src = np.full(length, -1, dtype=np.int64)
    f = np.arange(0, (n_modes + 1) // 2) if half else np.arange(-((n_modes - 1) // 2),
                                                               (n_modes + 1) // 2)
    src[f % grid_to] = f % grid_from
    return tuple(int(v) for v in src)


def _moves(src: tuple[int, ...], in_block: int, parts: int):
    """How the new blocks (ceil(len(src) / parts) long) are built from the old ones
    (`in_block` long) of an axis split in `parts`: (rounds, slot, offset).  `rounds`: lists of
    (from block, to block) pairs, each block sending and receiving at most once per round
    (one collective permute each); `slot[d, l]`: where entry l of new block d comes from (0:
    the device's own old block, r + 1: what round r brought, -1: zero); `offset[d, l]`: its
    position in that block."""
    out_block = -(-len(src) // parts)
    full = np.full(parts * out_block, -1, dtype=np.int64)
    full[:len(src)] = src
    dest = np.arange(parts * out_block) // out_block
    source = np.where(full >= 0, full // in_block, -1)
    offset = np.where(full >= 0, full % in_block, 0).reshape(parts, out_block)
    pairs = sorted({(int(e), int(d)) for e, d in zip(source, dest) if e >= 0 and e != d})
    rounds: list[list[tuple[int, int]]] = []
    for e, d in pairs:  # greedy colouring of the (old block -> new block) edges
        for r in rounds:
            if all(e != a and d != b for a, b in r):
                r.append((e, d))
                break
        else:
            rounds.append([(e, d)])
    round_of = {pair: r + 1 for r, pairs_r in enumerate(rounds) for pair in pairs_r}
    slot = np.array([-1 if e < 0 else 0 if e == d else round_of[(int(e), int(d))]
                     for e, d in zip(source, dest)], dtype=np.int32).reshape(parts, out_block)
    return tuple(tuple(r) for r in rounds), slot, offset


def _move_axis(x, axis: int, src: tuple[int, ...], names: tuple[str, ...], sizes: dict):
    """x's block with the axis `axis` rebuilt by `src` (global indices; -1: zero); the axis is
    split over `names` (major first; () when whole)."""
    parts = math.prod(sizes[m] for m in names)
    if parts == 1:
        index = np.asarray(src)
        taken = jnp.take(x, jnp.asarray(np.maximum(index, 0)), axis=axis)
        return _where_along(index >= 0, taken, axis)
    rounds, slot, offset = _moves(src, x.shape[axis], parts)
    d = _linear_index(names, sizes)
    # jax (0.11 and later) takes a tuple of axis names in the mesh's order only: the pairs
    # are given as linear indices over the names in that order.
    order = sorted(names, key=list(sizes).index)

    def in_order(b: int) -> int:
        coords, rest = {}, b
        for m in reversed(names):
            coords[m], rest = rest % sizes[m], rest // sizes[m]
        index = 0
        for m in order:
            index = index * sizes[m] + coords[m]
        return index

    blocks = [x] + [jax.lax.ppermute(x, tuple(order) if len(order) > 1 else order[0],
                                     [(in_order(e), in_order(t)) for e, t in r]) for r in rounds]
    slot_d = jnp.asarray(slot)[d]
    offset_d = jnp.asarray(offset)[d]
    out = None
    for j, block in enumerate(blocks):
        taken = _where_along(slot_d == j, jnp.take(block, offset_d, axis=axis), axis)
        out = taken if out is None else out + taken
    return out


def _where_along(keep, x, axis: int):
    """x with the entries along `axis` where `keep` (a vector) is False set to zero."""
    view = [1] * x.ndim
    view[axis] = -1
    return jnp.where(jnp.reshape(keep, view), x, jnp.zeros((), x.dtype))


@dataclasses.dataclass(frozen=True)
class Respectrum(LinearOp):
    """The linear map of `pad_spectrum`/`truncate_spectrum`: each of `axes` rebuilt by its
    index map (`_index_map` of the `maps` entry: modes, old grid, new grid, half), then
    scaled."""

    in_shape: tuple[int, ...]
    dtype: np.dtype
    axes: tuple[int, ...]
    maps: tuple[tuple[int, int, int, bool], ...]
    scale: float
    transposed: bool = False
    reads_in_spec = True

    @property
    def out_shape(self) -> tuple[int, ...]:
        shape = list(self.in_shape)
        for i, (_, _, grid, half) in zip(self.axes, self.maps):
            shape[i] = grid // 2 + 1 if half else grid
        return tuple(shape)

    def body(self, x, entries=None, sizes=None):
        """The map on a block (the global array when `entries` is None)."""
        for i, axis_map in zip(self.axes, self.maps):
            x = _move_axis(x, i, _index_map(*axis_map), entries[i] if entries else (),
                           sizes or {})
        return x * jnp.asarray(self.scale, dtype=jnp.real(x).dtype)

    def primal_local(self, x):
        return self.body(x)

    def primal_on_mesh(self, mesh, in_spec=None):
        spec = P() if in_spec is None else P(*tuple(in_spec))
        entries = _entries(spec, len(self.in_shape), mesh)
        return functools.partial(self.body, entries=entries, sizes=dict(mesh.shape)), spec, spec

    def primal_rule(self):
        letters = " ".join(f"d{i}" for i in range(len(self.in_shape)))
        return letters, letters

    def batched(self, n: int):
        return dataclasses.replace(self, in_shape=(n,) + self.in_shape,
                                   axes=tuple(a + 1 for a in self.axes))


@functools.partial(jax.jit, static_argnames=("op", "mesh", "spec"))
def _on_mesh(x, *, op: Respectrum, mesh, spec):
    return _shard_mapped(x, op, mesh, spec)


def _shard_mapped(x, op: Respectrum, mesh, spec):
    body, _, _ = op.primal_on_mesh(mesh, spec)
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(x)


@functools.partial(jax.jit, static_argnames=("op",))
def _one_device(x, *, op: Respectrum):
    return op.body(x)


def _respectrum(k, op: Respectrum, caller: str):
    mesh, spec = _layout(k, caller)
    if spec == "compiler":
        return apply(op, k)
    if mesh is None:
        return _one_device(jnp.asarray(k), op=op)
    spec = P(*tuple(spec))
    entries = _entries(spec, len(op.in_shape), mesh)
    for i in op.axes:
        parts = math.prod(mesh.shape[m] for m in entries[i])
        length = op.out_shape[i]
        if length % parts:
            raise ValueError(
                f"{caller}: the result has {length} entries along axis {i}, which the mesh "
                f"axes {entries[i]} splitting `k` there ({parts} blocks) do not divide (jax "
                f"splits arrays evenly); choose lengths whose new grid they divide, or place "
                f"`k` with that axis whole")
    if is_tracer(k):
        return _shard_mapped(k, op, mesh, spec)
    return _on_mesh(k, op=op, mesh=mesh, spec=spec)


def _respectrum_op(k, s, axes, norm, padding, real, caller: str, to_fine: bool) -> Respectrum:
    shape, dtype = _array(k, caller)
    axes = _axes(shape, s, axes)
    norm = _check_norm(norm)
    factors = _factors(padding, len(axes))
    if to_fine:
        n = _modes(shape, axes, s, real)
        _check_lengths(shape, axes, n, real, "`s`" if s is not None else "its lengths")
        grid_from, grid_to = n, _grid(n, factors)
    else:
        if s is None:  # the coarse lengths from the padded spectrum's
            fine = _modes(shape, axes, None, real)
            n = tuple(int(round(m / f)) for m, f in zip(fine, factors))
        else:
            n = _modes(shape, axes, s, real)
        grid_from, grid_to = _grid(n, factors), n
        _check_lengths(shape, axes, grid_from, real,
                       f"`s` = {n} times `padding` = {factors}")
    maps = tuple((m, a, b, bool(real and j == len(axes) - 1))
                 for j, (m, a, b) in enumerate(zip(n, grid_from, grid_to)))
    scale = _scale(norm, n, _grid(n, factors), to_fine)
    return Respectrum(shape, dtype, axes, maps, scale)


def pad_spectrum(k, s=None, axes=None, norm=None, *, padding=1.5, real: bool = False):
    """The spectrum `k` of n-point transforms as that of padding x n points (the 3/2 rule).

    The modes of `k` keep their frequencies on the longer axes, the new (high) ones are zero,
    and the values are scaled for `norm`, so that the inverse transform of the result on the
    padded grid is the band-limited field of `k` sampled there (`fine[::3] == coarse[::2]` on
    a 3/2 grid).  Products of such fields, transformed back and cut by `truncate_spectrum`,
    are free of aliasing (quadratic products with padding >= 3/2; docs/howto/spectral-solvers.md
    has a 2-D example).  An even n's Nyquist mode is set to zero (it has no symmetric place
    on the longer grid).

    Args:
      k: the spectrum of `fftn` or `rfftn` (global shape; any rank, any NamedSharding, a numpy
        array or a tracer under jax.jit).
      s: the real-space lengths n along `axes` (what `irfftn` takes); default: `k`'s lengths,
        with `real` the last one 2 (h - 1) for h entries.
      axes: the transformed axes (default: all; with `s`, the last len(s)).
      norm: the norm of the transforms (None: "backward", jnp's default; "ortho", "forward").
      padding: one factor >= 1 or one per axis of `axes`; padding x n must be whole.
      real: `k` is `rfftn`'s half spectrum (the last of `axes` holds modes 0..n//2; it becomes
        (padding x n)//2 + 1 long).

    Returns:
      The padded spectrum, of `k`'s dtype, padding x n long along each of `axes` (the half
      axis (padding x n)//2 + 1), in `k`'s PartitionSpec: each device builds its new block from
      the old blocks (collective permutes along split axes; no gather).

    Raises:
      ValueError: bad `axes`, `s` (not `k`'s lengths), `norm` or `padding`; padding x n not
        whole; a split axis whose padded length its mesh axes do not divide.
      TypeError: `k` is not an array; `s`, `axes` or `padding` of the wrong type.

    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> x = np.cos(2 * np.pi * np.arange(32) / 32)[:, None] * np.ones((1, 16))
      >>> u = jax.device_put(x.astype(np.float32), NamedSharding(mesh, P("x")))
      >>> kp = pencilfft.pad_spectrum(pencilfft.rfftn(u), real=True)
      >>> kp.shape, kp.sharding.spec
      ((48, 13), P('x', None))
      >>> fine = pencilfft.irfftn(kp, s=(48, 24))
      >>> bool(np.allclose(np.asarray(fine)[::3, ::3], x[::2, ::2], atol=1e-5))
      True
    """
    op = _respectrum_op(k, s, axes, norm, padding, real, "pad_spectrum", to_fine=True)
    return _respectrum(k, op, "pad_spectrum")


def truncate_spectrum(k, s=None, axes=None, norm=None, *, padding=1.5, real: bool = False):
    """The spectrum `k` of padding x n-point transforms cut to the n-point one: the inverse
    of `pad_spectrum` (the modes abs(m) < n/2 kept, scaled for `norm`).

    After a product on the padded grid (`rfftn(a * b)`), this is the dealiased spectrum of
    the product on the n-point grid: exactly the product's modes abs(m) < n/2, where a and b
    are band-limited to them and padding >= 3/2.  An even n's Nyquist mode is zero.

    Args:
      k: the spectrum of `fftn` or `rfftn` on the padded grid (global shape; any rank, any
        NamedSharding, a numpy array or a tracer under jax.jit).
      s: the real-space lengths n of the result along `axes` (the coarse grid's); default:
        `k`'s lengths divided by `padding` (with `real`, the padded grid 2 (h - 1) long along
        the half axis: pass `s` when it is odd).
      axes, norm, padding, real: as `pad_spectrum`'s (`k` must be padding x n long along
        `axes`, the half axis (padding x n)//2 + 1).

    Returns:
      The n-mode spectrum, of `k`'s dtype, n long along each of `axes` (the half axis n//2 +
      1), in `k`'s PartitionSpec (collective permutes along split axes; no gather).

    Raises:
      ValueError: bad `axes`, `s`, `norm` or `padding`; `k` not padding x n long; a split
        axis whose new length its mesh axes do not divide.
      TypeError: `k` is not an array; `s`, `axes` or `padding` of the wrong type.

    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> u = jax.device_put(np.random.rand(32, 16).astype(np.float32),
      ...                    NamedSharding(mesh, P("x")))
      >>> k = pencilfft.rfftn(u)
      >>> back = pencilfft.truncate_spectrum(pencilfft.pad_spectrum(k, real=True), real=True)
      >>> back.shape, back.sharding.spec
      ((32, 9), P('x', None))
      >>> kept = np.asarray(pencilfft.dealias_mask(k, real=True, keep=1))  # |m| < n/2
      >>> bool(np.allclose(np.asarray(back), np.asarray(k) * kept, atol=1e-4))
      True
    """
    op = _respectrum_op(k, s, axes, norm, padding, real, "truncate_spectrum", to_fine=False)
    return _respectrum(k, op, "truncate_spectrum")
