"""The transforms as lists of stages; the backward transform walks the forward list reversed.

Each stage kind holds its data and defines its forward map and its inverse (`forward(k)`,
`backward(k)` on a per-device block): the stages are the whole interpreter.  Lists are built
from static data alone (nothing is traced here), from the route that the one planner,
`routes.find_route`, chooses: which axes are transformed when, which mesh axis moves from which
array axis to which.  This module only emits them.

The 3-D transforms (a `Plan`; axes numbered in the per-device block with the batch flattened to
one leading axis: (B, x, y, Z) in real space) ask for the route from P(a, b, None) to
(None, a, b) (`pencil_problem`).  On a pencil mesh (a, b) of sizes (Pa, Pb), with [Truncate]
only on padded (dealiased) axes and [Pad] only where the mesh does not divide the spectrum:

    Fft(Z) [Truncate Z] [Pad Z]  Exchange(b: split 3, gather 2)  Fft(Y) [Truncate Y] [Pad Y]
    Exchange(a: split 3, gather 1)  Fft(X) [Truncate X]  [Move(3, 1) in the natural layout]

Every exchange writes the axes of the next FFT last, in their global order, and the others
before them (`emit`, `_place_pencil`), so the transforms run on contiguous trailing axes: a
slab over X (Pb == 1) is one 2-D `Fft` over (Y, Z) and the exchange over a to (B, y', Z, X);
a slab over Y (Pa == 1) is Fft(Z), the exchange over b to (B, z, X, Y), one 2-D Fft over (X, Y)
and one move to the layout; the local exchange (`_exchange.local`, CPU devices of one process),
which writes any order in its one pass, writes the layout itself where the last FFT is over
several axes, which then runs on the strided axes there: no move.  One device runs one 3-D
`Fft` (in the transposed layout writing (B, Y, Z, X) itself, its `order`; `Move(1, 3)` after it
only where padding or truncation stages come between).  The chunked chain (`chunks.py`) is the
same search's pencil route on every mesh.

jnp.fft's names (`numpy_fft.py`) run a route's stages on the block's axes in their global order
(`route_stages`: `Fft`, `Exchange`, `Fit`, `Take`, `Swap`, `Inverse`).

Where to add a transform kind: a per-axis kind is a name in `plan.KINDS` with its 1-D forward
and inverse in `_one_axis` (or its own module, as `r2r.py`), and an entry in the public API.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from . import kernel as _kernel
from .plan import FFT_KINDS, Plan
from .routes import Problem, Route, exact_length, find_route
from .._exchange import reshard as _reshard
from .transpose import transpose_blocks


def _one_axis(k: jax.Array, kind: str, axis: int, norm: str, forward: bool, size: int) -> jax.Array:
    """One 1-D transform of `kind` along `axis` (`size`: the real length, for irfft).  Every
    local transform goes through `kernel` (FFTW on CPU with the fftw extra, else XLA's)."""
    if kind in FFT_KINDS:
        fft_type = {"fft": ("fft", "ifft"), "rfft": ("rfft", "irfft")}[kind][not forward]
        return _kernel.fft(k, fft_type, (axis,), norm, (size,))
    return _kernel.r2r(k, kind, axis, norm, forward)


@dataclasses.dataclass(frozen=True)
class Fft:
    """Transforms of `kinds` over local `axes` (whole on every device).  "rfft" is only ever the
    last axis; `sizes` are the real-space lengths of `axes` (the irfft output).  `order`: the
    output's axes, jnp.transpose's (None: as they are); the FFTW kernel writes them there in
    the same call (the one-device transform's layout: no pass of its own, issue 43)."""

    axes: tuple[int, ...]
    kinds: tuple[str, ...]
    sizes: tuple[int, ...]
    norm: str
    order: tuple[int, ...] | None = None

    @property
    def fourier(self) -> str | None:
        """"fft" or "rfft" when every axis is Fourier (at most the last a half spectrum): then
        one multi-dimensional call does them all; None for mixed kinds."""
        if all(kind == "fft" for kind in self.kinds[:-1]) and self.kinds[-1] in FFT_KINDS:
            return self.kinds[-1]
        return None

    def _split(self) -> bool:
        """Whether the transform with an `order` runs as two calls: the last axes in place, then
        the first one (a complex FFT) writing the order (backward: the first axis writing the
        order back, then the others in place).  FFTW's one 3-D plan writing (B, Y, Z, X)
        measured 1.3-1.8x slower than the 3-D FFT alone, and the two calls as fast as it
        (benchmarks/RESULTS.md, issues 43 and 55)."""
        return (self.order is not None and self.fourier is not None and len(self.axes) > 1
                and self.kinds[0] == "fft")

    def forward(self, k: jax.Array) -> jax.Array:
        if self.order is not None and self.fourier is not None:
            # FFTW writes the order itself on CPUs; elsewhere the program stays XLA's FFT and a
            # transpose, which XLA cancels against the inverse's in one jit (the split form
            # held 2 blocks of temporaries on an H100 where this holds 1, and took 1.3x).
            return jax.lax.platform_dependent(k, cpu=self._forward_fftw,
                                              default=self._forward_xla)
        if self.fourier is not None:
            return _kernel.fft(k, self.fourier, self.axes, self.norm, self.sizes)
        # Mixed kinds, last axis first (an rfft must see the real input); the 1-D transforms
        # along different axes commute otherwise.
        for axis, kind, size in reversed(list(zip(self.axes, self.kinds, self.sizes))):
            k = _one_axis(k, kind, axis, self.norm, True, size)
        return k if self.order is None else jnp.transpose(k, self.order)

    def _forward_fftw(self, k: jax.Array) -> jax.Array:
        if self._split():  # (the first call unscaled, the second scaling for both: one pass)
            k = _kernel.fft(k, self.fourier, self.axes[1:], "backward", self.sizes[1:])
            return _kernel.fft(k, "fft", self.axes[:1], self.norm, self.sizes[:1], self.order,
                               extra=math.prod(self.sizes[1:]))
        return _kernel.fft(k, self.fourier, self.axes, self.norm, self.sizes, self.order)

    def _forward_xla(self, k: jax.Array) -> jax.Array:
        return jnp.transpose(_kernel.fft(k, self.fourier, self.axes, self.norm, self.sizes),
                             self.order)

    @property
    def _inverse(self) -> str:
        return {"fft": "ifft", "rfft": "irfft"}[self.fourier]

    @property
    def _undo(self) -> tuple[int, ...]:
        return tuple(self.order.index(i) for i in range(len(self.order)))

    def backward(self, k: jax.Array) -> jax.Array:
        if self.order is not None:
            if self.fourier is not None:
                return jax.lax.platform_dependent(k, cpu=self._backward_fftw,
                                                  default=self._backward_xla)
            k = jnp.transpose(k, self._undo)
        if self.fourier is not None:
            return _kernel.fft(k, self._inverse, self.axes, self.norm, self.sizes)
        for axis, kind, size in zip(self.axes, self.kinds, self.sizes):  # irfft last: real out
            k = _one_axis(k, kind, axis, self.norm, False, size)
        return k

    def _backward_fftw(self, k: jax.Array) -> jax.Array:
        # The transform commutes with moving axes: run it on k's own layout (each axis where
        # `order` put it) and write the output back in the computed order.
        if self._split():
            # The forward's mirror: the first axis where it is (contiguous X) writing the
            # computed order (the kernel transforms it in cache-sized blocks and transposes
            # them: fftw.cc `PlaneWise`), then the others (irfft last) on contiguous axes.
            # The second call writing the order instead read every element at a plane's
            # stride: 1.26-1.47x the forward on AVX-512 (issue 55).  The first call scales for
            # both, as it transposes (a scaled call of its own is a pass over the block, or
            # runs in chunks: fftw.cc `Execute`); the second is unscaled ("forward").
            k = _kernel.fft(k, "ifft", (self.order.index(self.axes[0]),), self.norm,
                            self.sizes[:1], self._undo, extra=math.prod(self.sizes[1:]))
            # The second call stays out of place.  Writing over the first call's output (its
            # custom call aliased) saved the temporary block, but with the argument donated
            # XLA must return the result in the argument's buffer and copied it there: 1.25x
            # the time, and no memory saved (benchmarks/RESULTS.md, issue 55).
            return _kernel.fft(k, self._inverse, self.axes[1:], "forward", self.sizes[1:])
        axes = tuple(self.order.index(a) for a in self.axes)
        return _kernel.fft(k, self._inverse, axes, self.norm, self.sizes, self._undo)

    def _backward_xla(self, k: jax.Array) -> jax.Array:
        return _kernel.fft(jnp.transpose(k, self._undo), self._inverse, self.axes, self.norm,
                           self.sizes)


@dataclasses.dataclass(frozen=True)
class Truncate:
    """Dealiasing along a padded Fourier axis: keep the `modes` lowest of the `fine` grid's
    frequencies, scaled by `scale` (backward: zero-pad to `fine`, scaled back).

    An even `modes` has a Nyquist mode, which the backward map splits evenly between +N/2 and
    -N/2 (so a real field stays real) and the forward map sums back.  On the half spectrum
    (`half`, an rfft axis of `fine // 2 + 1` entries) -N/2 is implicit: it is the conjugate of
    +N/2 as long as the other axes are still in real space (the stage lists truncate Z right
    after its own rfft for that), so the sum is 2 Re(K[N/2]) and the backward map puts
    Re(k[N/2]) / 2 there (an N-point irfft ignores the imaginary part of its Nyquist too).
    """

    axis: int
    fine: int  # length of the padded grid along the axis
    modes: int  # N, the spectrum's length before halving (Z//2+1 entries when `half`)
    half: bool
    scale: float

    def forward(self, k: jax.Array) -> jax.Array:
        n, ax = self.modes, self.axis
        take = lambda a, b: jax.lax.slice_in_dim(k, a, b, axis=ax)  # noqa: E731
        if self.half:
            out = take(0, n // 2 + 1)
            if n % 2 == 0:
                out = _nyquist_real(out, ax, n // 2, 2.0)
        elif n % 2:
            out = jnp.concatenate([take(0, (n + 1) // 2), take(self.fine - n // 2, self.fine)], ax)
        else:
            nyquist = take(n // 2, n // 2 + 1) + take(self.fine - n // 2, self.fine - n // 2 + 1)
            out = jnp.concatenate([take(0, n // 2), nyquist,
                                   take(self.fine - n // 2 + 1, self.fine)], ax)
        return out * jnp.asarray(self.scale, out.real.dtype)

    def backward(self, k: jax.Array) -> jax.Array:
        n, ax = self.modes, self.axis
        k = k * jnp.asarray(1 / self.scale, k.real.dtype)
        take = lambda a, b: jax.lax.slice_in_dim(k, a, b, axis=ax)  # noqa: E731

        def zeros(m):
            shape = list(k.shape)
            shape[ax] = m
            return jnp.zeros(shape, k.dtype)

        if self.half:
            out = _nyquist_real(k, ax, n // 2, 0.5) if n % 2 == 0 else k
            return jnp.concatenate([out, zeros(self.fine // 2 + 1 - (n // 2 + 1))], ax)
        if n % 2:
            return jnp.concatenate([take(0, (n + 1) // 2), zeros(self.fine - n),
                                    take((n + 1) // 2, n)], ax)
        nyquist = take(n // 2, n // 2 + 1) * 0.5
        return jnp.concatenate([take(0, n // 2), nyquist, zeros(self.fine - n - 1), nyquist,
                                take(n // 2 + 1, n)], ax)


def _nyquist_real(k: jax.Array, axis: int, i: int, factor: float) -> jax.Array:
    """k with entry i along `axis` replaced by factor * its real part (the last entry here)."""
    last = jax.lax.slice_in_dim(k, i, i + 1, axis=axis)
    return jnp.concatenate([jax.lax.slice_in_dim(k, 0, i, axis=axis),
                            (factor * last.real).astype(k.dtype)], axis)


@dataclasses.dataclass(frozen=True)
class Pad:
    """Zero-pad local `axis` at its end from `length` to `padded` (backward: crop to `length`)."""

    axis: int
    length: int
    padded: int

    def forward(self, k: jax.Array) -> jax.Array:
        widths = [(0, 0)] * k.ndim
        widths[self.axis] = (0, self.padded - k.shape[self.axis])
        return jnp.pad(k, widths)

    def backward(self, k: jax.Array) -> jax.Array:
        return jax.lax.slice_in_dim(k, 0, self.length, axis=self.axis)


@dataclasses.dataclass(frozen=True)
class Exchange:
    """`transpose.transpose_blocks` over mesh axis `axis_name` of size `n` with `algorithm`.

    The inverse exchange splits what was gathered, gathers what was split and undoes `order`."""

    axis_name: str
    n: int
    split: int
    gather: int
    order: tuple[int, ...]
    algorithm: str = "alltoall"

    def inverse(self) -> Exchange:
        inv = tuple(self.order.index(i) for i in range(len(self.order)))
        return dataclasses.replace(self, split=self.order.index(self.gather),
                                   gather=self.order.index(self.split), order=inv)

    def forward(self, k: jax.Array) -> jax.Array:
        return transpose_blocks(k, self.axis_name, self.n, self.split, self.gather, self.order,
                                algorithm=self.algorithm)

    def backward(self, k: jax.Array) -> jax.Array:
        return self.inverse().forward(k)


@dataclasses.dataclass(frozen=True)
class Move:
    """jnp.moveaxis(k, source, destination) (backward: the other way)."""

    source: int
    destination: int

    def forward(self, k: jax.Array) -> jax.Array:
        return jnp.moveaxis(k, self.source, self.destination)

    def backward(self, k: jax.Array) -> jax.Array:
        return jnp.moveaxis(k, self.destination, self.source)


Stage = Fft | Truncate | Pad | Exchange | Move


def run_forward(stages: tuple[Stage, ...], x: jax.Array) -> jax.Array:
    """Real-space block (..., x, y, Z) -> k-space block, the leading axes flattened meanwhile."""
    batch = x.shape[:-3]
    k = x.reshape((-1,) + x.shape[-3:])
    for stage in stages:
        k = stage.forward(k)
    return k.reshape(batch + k.shape[1:])


def run_backward(stages: tuple[Stage, ...], k: jax.Array) -> jax.Array:
    """k-space block -> real-space block (..., x, y, Z): the stages reversed, each inverted."""
    batch = k.shape[:-3]
    x = k.reshape((-1,) + k.shape[-3:])
    for stage in reversed(stages):
        x = stage.backward(x)
    return x.reshape(batch + x.shape[1:])


def run_route(stages, k: jax.Array) -> jax.Array:
    """A route's stages (`route_stages`, jnp.fft's names) on a block as it is."""
    for stage in stages:
        k = stage.forward(k)
    return k


def run_route_back(stages, k: jax.Array) -> jax.Array:
    """A route's stages reversed, each inverted, on a block as it is."""
    for stage in reversed(stages):
        k = stage.backward(k)
    return k


# ----------------------------------------------------------------------------------------------
# The 3-D transforms' stage lists: the route of `routes.find_route`, emitted on a (B, ., ., .) block


def _after(plan: Plan, axes: tuple[int, ...], dims: tuple[int, ...]) -> tuple[Stage, ...]:
    """Truncations after the transform of block `axes` (global dims `dims`: 0 X, 1 Y, 2 Z),
    last axis first, for the padded ones."""
    out: list[Stage] = []
    for axis, d in reversed(list(zip(axes, dims))):
        if plan.real_shape[d] != plan.modes[d]:
            out.append(Truncate(axis, plan.real_shape[d], plan.modes[d],
                                plan.kinds[d] == "rfft", plan.truncation_scale(d)))
    return tuple(out)


def fft_stages(plan: Plan, axes: tuple[int, ...], dims: tuple[int, ...]) -> tuple[Stage, ...]:
    """The transform of block `axes` (global dims `dims`) and the truncations after it."""
    if len(dims) > 1 and plan.kinds[dims[-1]] == "rfft" and plan.real_shape[2] != plan.modes[2]:
        # A padded half spectrum is truncated while X and Y are still in real space (see
        # `Truncate`): Z alone first.
        return fft_stages(plan, axes[-1:], dims[-1:]) + fft_stages(plan, axes[:-1], dims[:-1])
    kinds = tuple(plan.kinds[d] for d in dims)
    sizes = tuple(plan.real_shape[d] for d in dims)
    return (Fft(axes, kinds, sizes, plan.norm),) + _after(plan, axes, dims)


def pad_stages(axis: int, length: int, padded: int) -> tuple[Stage, ...]:
    """Zero-padding of block `axis` from `length` to `padded` (none where they are equal)."""
    return (Pad(axis, length, padded),) if padded != length else ()


# A mesh axis of size 1 in the chunked chain's problem: no name, an exchange on one device.
_ONE = ("\0a", "\0b")


def pencil_problem(plan: Plan, every_axis: bool = False) -> Problem:
    """The 3-D transform as a route problem over (X, Y, Z) (the batch, flattened to B, and the
    mesh's batch axes are no part of it): from P(a, b, None) to k space's split (None, a, b),
    the same in both layouts (a layout is the order the block stores its axes in, which the
    emission decides).  `every_axis`: keep the mesh axes of size 1 too (the chunked chain, which
    runs the pencil's route on every mesh, `chunks.py`)."""
    (pa, pb), names = plan.pdims, tuple(n if n is not None else one
                                         for n, one in zip(plan.axes, _ONE))
    kept = [(name, n) for name, n in zip(names, (pa, pb)) if n > 1 or every_axis]
    a, b = (((name,) if any(name == m for m, _ in kept) else ()) for name in names)
    z = plan.zc
    return Problem(
        sizes=tuple(kept), lengths=plan.real_shape, stored=plan.real_shape, in_spec=(a, b, ()),
        axes=(0, 1, 2), kind="r2c" if plan.real else "c2c", fit=plan.real_shape,
        after=(plan.modes[0], plan.modes[1], z),
        itemsizes=(np.dtype(plan.real_dtype).itemsize, np.dtype(plan.k_dtype).itemsize),
        target=((), a, b), exchanges_first=every_axis)


@functools.lru_cache(maxsize=256)
def _route(p: Problem) -> Route:
    return find_route(p)


def _layout(plan: Plan) -> tuple[int, ...]:
    """The global dims in the order k space stores them."""
    return (1, 2, 0) if plan.layout == "transposed" else (0, 1, 2)


def _moved(perm: list[int], target: tuple[int, ...]) -> Move | None:
    """The one `Move` taking block order `perm` (global dims) to `target` (None if none does)."""
    for src in range(3):
        for dst in range(3):
            order = list(perm)
            order.insert(dst, order.pop(src))
            if tuple(order) == target:
                return Move(src + 1, dst + 1)
    return None


def emit(plan: Plan, problem: Problem, route: Route, place) -> list[list[Stage]]:
    """The 3-D stages of `route`, one list per FFT step (its transform, truncations, paddings
    and the exchanges up to the next FFT step) on a (B, ., ., .) block.

    `place(perm, nxt, last_exchange, algorithm)` gives the global dims' order an exchange
    writes (perm: the order before it, nxt: the dims of the next FFT step).  Every axis is
    padded for the mesh right before the exchange that splits it (`Pad`), after its transform
    and truncation; the last exchange's layout is k space's or one `Move` from it."""
    perm, stored = [0, 1, 2], list(plan.real_shape)
    groups: list[list[Stage]] = []
    steps = route.steps
    moves = [k for k, step in enumerate(steps) if step[0] == "move"]
    index = {name: i for i, name in enumerate(plan.axes) if name is not None}
    index.update({name: i for i, name in enumerate(_ONE)})
    k_lengths = (plan.modes[0], plan.yp, plan.zp)
    for k, step in enumerate(steps):
        if step[0] == "fft":
            dims = tuple(sorted(step[1], key=perm.index))
            groups.append(list(fft_stages(plan, tuple(1 + perm.index(d) for d in dims), dims)))
            for d in dims:
                stored[d] = problem.after[d]
            continue
        if step[0] != "move":  # a 3-D input is split by every mesh axis: no take, no swap
            raise AssertionError(f"the 3-D route has a {step[0]} step: {route.steps}")
        _, m, i, j, length = step
        if j not in {d for s in steps[:k] if s[0] == "fft" for d in s[1]}:
            raise AssertionError(f"the 3-D route splits axis {j} before its transform: "
                                 f"{route.steps}")
        # To k space's length (the route's, or more where the spectrum is padded for a mesh
        # the partitioner has yet to give, `Plan.padded_for`)
        padded = max(length, k_lengths[j])
        groups[-1] += pad_stages(1 + perm.index(j), stored[j], padded)
        stored[j] = padded
        nxt = next((s[1] for s in steps[k + 1:] if s[0] == "fft"), ())
        algorithm = plan.exchanges[index[m]]
        new = place(perm, nxt, k == moves[-1], algorithm)
        groups[-1].append(Exchange(plan.axes[index[m]], problem.size(m), split=1 + perm.index(j),
                                   gather=1 + perm.index(i),
                                   order=(0,) + tuple(1 + perm.index(d) for d in new),
                                   algorithm=algorithm))
        perm = list(new)
    for d in (1, 2):  # padded for a mesh the partitioner has yet to give (no exchange padded it)
        groups[-1] += pad_stages(1 + perm.index(d), stored[d], k_lengths[d])
    target = _layout(plan)
    if tuple(perm) != target:
        only = groups[-1][0] if len(groups) == 1 and len(groups[0]) == 1 else None
        if isinstance(only, Fft) and only.fourier is not None:
            # The move to the layout written by the one transform itself (FFTW's output
            # strides): one pass each way instead of two, the move was a third of the time.
            groups[-1] = [dataclasses.replace(only, order=(0,) + tuple(1 + perm.index(d)
                                                                       for d in target))]
        else:
            move = _moved(perm, target)
            if move is None:
                raise AssertionError(f"no one move from {perm} to the layout {target}")
            groups[-1].append(move)
    return groups


def trailing(ndim: int, last) -> tuple[int, ...]:
    """The global order of a block whose axes `last` (the next FFT's, in that order) come last
    and the others before them in their global order: the transform then runs on contiguous
    trailing axes."""
    return tuple(d for d in range(ndim) if d not in last) + tuple(last)


def _place_pencil(plan: Plan):
    """The orders exchanges write in the unchunked stages: the dims of the next FFT step last
    (contiguous: the next transform runs on the block's trailing axes), the others before them,
    each part in global order.  The local exchange (`_exchange.local`, one pass that writes any
    order) writes k space's layout itself where the last transform is over several axes (FFTW's
    multi-axis plan takes strided axes as they are): no move after it."""
    def place(perm, nxt, last, algorithm):
        if last and algorithm == "local" and len(nxt) > 1:
            return _layout(plan)
        return trailing(3, sorted(nxt))
    return place


def forward_stages(plan: Plan) -> tuple[Stage, ...]:
    """The stages of the forward transform of one (B, x, y, Z) block: the route `find_route`
    picks for `pencil_problem(plan)`, emitted (see the module docstring)."""
    problem = pencil_problem(plan)
    groups = emit(plan, problem, _route(problem), _place_pencil(plan))
    return tuple(stage for group in groups for stage in group)


# ----------------------------------------------------------------------------------------------
# The N-D names' stages of a route (on the per-device block, array axes in their global order)


@dataclasses.dataclass(frozen=True)
class Fit:
    """Crop or zero-pad local (whole) `axis` at its end to `length` (backward: back to
    `original`).  The entries past an axis's exact length are zeros, so cropping there and
    padding again give the same array."""

    axis: int
    length: int
    original: int

    def forward(self, k: jax.Array) -> jax.Array:
        return _fit(k, self.axis, self.length)

    def backward(self, k: jax.Array) -> jax.Array:
        return _fit(k, self.axis, self.original)


def _fit(k: jax.Array, axis: int, length: int) -> jax.Array:
    k = jax.lax.slice_in_dim(k, 0, min(length, k.shape[axis]), axis=axis)
    widths = [(0, 0)] * k.ndim
    widths[axis] = (0, length - k.shape[axis])
    return jnp.pad(k, widths) if length > k.shape[axis] else k


@dataclasses.dataclass(frozen=True)
class Take:
    """Keep this device's 1/n of local `axis` over mesh axis `axis_name`, over which the block
    is replicated (no communication)."""

    axis_name: str
    n: int
    axis: int

    def forward(self, k: jax.Array) -> jax.Array:
        size = k.shape[self.axis] // self.n
        start = jax.lax.axis_index(self.axis_name) * size
        return jax.lax.dynamic_slice_in_dim(k, start, size, axis=self.axis)


@dataclasses.dataclass(frozen=True)
class Swap:
    """An axis split (..., u, v) becomes split (..., v, u): the device at (iu, iv) then holds
    chunk iv |u| + iu of its parent block, which the device at linear (u, v) index
    iv |u| + iu held (one collective permute over (u, v))."""

    axis_names: tuple[str, str]
    sizes: tuple[int, int]
    # Whether v comes before u among the mesh's axes: the collective then names (v, u), as
    # jax (0.11 and later) requires a tuple of axis names in the mesh's order.
    mesh_order_vu: bool = False

    def forward(self, k: jax.Array) -> jax.Array:
        nu, nv = self.sizes
        perm = [(iv * nu + iu, iu * nv + iv) for iu in range(nu) for iv in range(nv)]
        if not self.mesh_order_vu:
            return jax.lax.ppermute(k, self.axis_names, perm)
        # The same pairs, as linear indices over (v, u): (iu, iv) -> iv |u| + iu.
        vu = lambda n: (n % nv) * nu + n // nv
        return jax.lax.ppermute(k, self.axis_names[::-1], [(vu(a), vu(b)) for a, b in perm])


@dataclasses.dataclass(frozen=True)
class Inverse:
    """`stage` run the other way (an inverse transform as a forward step)."""

    stage: object

    def forward(self, k: jax.Array) -> jax.Array:
        return self.stage.backward(k)

    def backward(self, k: jax.Array) -> jax.Array:
        return self.stage.forward(k)


@dataclasses.dataclass(frozen=True)
class Permute:
    """jnp.transpose(k, order) (backward: its inverse): a route's block back to the global
    order of its axes where its last step was an FFT of axes held last (`_contiguous`)."""

    order: tuple[int, ...]

    def forward(self, k: jax.Array) -> jax.Array:
        return jnp.transpose(k, self.order)

    def backward(self, k: jax.Array) -> jax.Array:
        return jnp.transpose(k, tuple(self.order.index(i) for i in range(len(self.order))))


@dataclasses.dataclass(frozen=True)
class Reshard:
    """Consecutive exchanges of the CPU devices of one process in one pass
    (`_exchange.reshard`): the block of layout (`in_spec`, `in_perm`: per global axis its mesh
    axes, and the global axis each local axis holds) written as the block of (`out_spec`,
    `out_perm`).  `exchanges`: the ones it replaces (where the custom call does not exist)."""

    exchanges: tuple[Exchange, ...]
    in_spec: tuple[tuple[str, ...], ...]
    in_perm: tuple[int, ...]
    out_spec: tuple[tuple[str, ...], ...]
    out_perm: tuple[int, ...]

    @property
    def _steps(self) -> tuple:
        return tuple((e.axis_name, e.n, e.split, e.gather, e.order) for e in self.exchanges)

    @property
    def _moved(self) -> tuple[str, ...]:
        return tuple(e.axis_name for e in self.exchanges)

    def forward(self, k: jax.Array) -> jax.Array:
        return _reshard.reshard(k, self._moved, self.in_spec, self.in_perm, self.out_spec,
                                self.out_perm, self._steps)

    def backward(self, k: jax.Array) -> jax.Array:
        return _reshard.reshard(k, self._moved, self.out_spec, self.out_perm, self.in_spec,
                                self.in_perm, _reshard.inverse_steps(self._steps))


def _fused(stages: list, perms: list, specs: dict) -> list:
    """Runs of two or more local exchanges (`Exchange`, "local", nothing between them) as one
    `Reshard`: one pass over the block instead of one per exchange.  `perms[k]`: the block's
    axis order before stage k and after it; `specs[k]`: the layout before and after exchange k."""
    out: list = []
    k = 0
    while k < len(stages):
        end = k
        while (end < len(stages) and isinstance(stages[end], Exchange)
               and stages[end].algorithm == "local"):
            end += 1
        if end - k >= 2:
            out.append(Reshard(tuple(stages[k:end]), specs[k][0], tuple(perms[k][0]),
                               specs[end - 1][1], tuple(perms[end - 1][1])))
            k = end
        else:
            out.append(stages[k])
            k += 1
    return out


def _contiguous(stages: list, ndim: int, specs: dict | None = None) -> list:
    """The same route with every FFT's axes last in the block: each exchange also writes (its
    `order`, in the same pass) the axes the next FFT transforms last and the others in their
    global order before them, and the last one writes the global order back (a `Permute` where
    an FFT ends the route).  An FFT along a strided axis of a block larger than the caches runs
    at a fraction of a contiguous one's speed; the exchange's permuted write costs less there
    (benchmarks/RESULTS.md, "Any layout": the brick round trip 1.50x -> 1.31x pfft3d's)."""
    perm = list(range(ndim))  # local axis -> the global axis it holds
    out: list = []
    perms: list = []  # (before, after) of each stage
    for k, s in enumerate(stages):
        before = list(perm)
        inner = s.stage if isinstance(s, Inverse) else s
        if isinstance(inner, Exchange):
            nxt = next((t.stage if isinstance(t, Inverse) else t for t in stages[k + 1:]
                        if isinstance(t.stage if isinstance(t, Inverse) else t, Fft)), None)
            axes = () if nxt is None else nxt.axes
            want = list(trailing(ndim, axes))
            out.append(dataclasses.replace(inner, split=perm.index(inner.split),
                                           gather=perm.index(inner.gather),
                                           order=tuple(perm.index(a) for a in want)))
            perm = want
        elif isinstance(inner, Fft):
            f = dataclasses.replace(inner, axes=tuple(perm.index(a) for a in inner.axes))
            out.append(Inverse(f) if isinstance(s, Inverse) else f)
        elif isinstance(inner, (Fit, Take)):
            out.append(dataclasses.replace(inner, axis=perm.index(inner.axis)))
        else:  # a Swap permutes whole blocks between devices: the block's axes stay
            out.append(s)
        perms.append((before, list(perm)))
    if specs is not None:
        out = _fused(out, perms, specs)
    if perm != list(range(ndim)):
        out.append(Permute(tuple(perm.index(a) for a in range(ndim))))
    return out


def route_stages(p: Problem, route: Route, norm: str, inverse: bool, algorithms: dict) -> tuple:
    """The stages of `route` on a per-device block (array axes in their global order at both
    ends; in between, each FFT's axes last: `_contiguous`)."""
    stages = []
    stored = list(p.stored)
    spec = [tuple(s) for s in p.in_spec]
    done = frozenset()
    specs: dict = {}  # stage index -> the layout before and after that exchange (`_fused`)
    for step in route.steps:
        if step[0] == "fft":
            axes = step[1]
            done = done | set(axes)
            for i in axes:
                if stored[i] != p.fit[i]:
                    stages.append(Fit(i, p.fit[i], stored[i]))
                stored[i] = p.after[i]
            kinds = tuple("rfft" if i == p.half else "fft" for i in axes)
            sizes = tuple(p.after[i] if p.kind == "c2r" and i == p.half else p.fit[i]
                          for i in axes)
            fft = Fft(axes, kinds, sizes, norm)
            stages.append(Inverse(fft) if inverse else fft)
            continue
        if step[0] == "swap":
            j = step[1]
            u, v = spec[j][-2:]
            spec[j] = spec[j][:-2] + (v, u)
            order = [m for m, _ in p.sizes]  # the mesh's order (Problem.sizes keeps it)
            stages.append(Swap((u, v), (p.size(u), p.size(v)), order.index(v) < order.index(u)))
            continue
        kind, m, *rest = step
        j, length = rest[-2], rest[-1]
        if not spec[j] and stored[j] != length:
            stages.append(Fit(j, length, stored[j]))
        before = tuple(spec)
        stored[j] = length
        spec[j] = spec[j] + (m,)
        if kind == "take":
            stages.append(Take(m, p.size(m), j))
        else:
            i = rest[0]
            spec[i] = spec[i][:-1]
            stages.append(Exchange(m, p.size(m), split=j, gather=i,
                                   order=tuple(range(len(spec))), algorithm=algorithms[m]))
            specs[len(stages) - 1] = (before, tuple(spec))
            n = exact_length(p, done, i)
            if not spec[i] and stored[i] != n:  # whole again: back to its exact length
                stages.append(Fit(i, n, stored[i]))
                stored[i] = n
    for i, s in enumerate(spec):  # whole axes back to their exact length
        if not s and stored[i] != route.lengths[i]:
            stages.append(Fit(i, route.lengths[i], stored[i]))
            stored[i] = route.lengths[i]
    if not any(isinstance(s, Exchange) for s in stages):
        return tuple(stages)  # one device, or FFTs where the axes lie: nothing to write anew
    return tuple(_contiguous(stages, len(p.stored), specs))


