"""The forward transform as a list of stages; the backward transform walks it reversed.

Each stage kind holds its data and defines its forward map and its inverse (`forward(k)`,
`backward(k)` on a per-device (B, ...) block): the stages are the whole interpreter.  Lists are
built from a `Plan`'s static data alone (nothing is traced here).  Axes are numbered in the
per-device block with the batch flattened to one leading axis: (B, x, y, Z) in real space.

Forward pencil (mesh (a, b) of sizes (Pa, Pb)), with [Truncate] only on padded (dealiased)
axes and [Pad] only where the mesh does not divide the spectrum:

    Fft(Z) [Truncate Z] [Pad Z]  Exchange(b: split 3, gather 2)  Fft(Y) [Truncate Y] [Pad Y]
    Exchange(a: split 3, gather 1)  Fft(X) [Truncate X]  [Move(3, 1) in the natural layout]

A slab over X (Pb == 1) replaces the first three stages with one 2-D `Fft` over (Y, Z) and its
exchange over a; a slab over Y (Pa == 1) is a slab in cost too: Fft(Z), the exchange over b to
(B, z, X, Y), one 2-D Fft over (X, Y) and one move to the layout (the pencil path would add a
reordering over the size-1 axis; benchmarks/RESULTS.md "margin"); with the local exchange
(`_exchange.local`, CPU devices of one process), which writes any order in its one pass, the
exchange writes the layout itself and the 2-D Fft runs on the strided axes there: no move.  One
device runs one 3-D `Fft` (in the transposed layout writing (B, Y, Z, X) itself, its `order`;
`Move(1, 3)` after it only where padding or truncation stages come between).

Where to add a transform kind: a per-axis kind is a name in `plan.KINDS` with its 1-D forward
and inverse in `_one_axis` (or its own module, as `r2r.py`), and an entry in the public API.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from . import kernel as _kernel
from .plan import FFT_KINDS, Plan
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
        the first one (a complex FFT) writing the order (backward: the first axis in place,
        then the others writing the order back).  FFTW's one 3-D plan writing (B, Y, Z,
        X) measured 1.3-1.8x slower than the 3-D FFT alone, and the two calls as fast as it
        (benchmarks/RESULTS.md, issue 43)."""
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
        if self._split():
            k = _kernel.fft(k, self.fourier, self.axes[1:], self.norm, self.sizes[1:])
            return _kernel.fft(k, "fft", self.axes[:1], self.norm, self.sizes[:1], self.order)
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
            # The first axis where it is (contiguous X), then the others (irfft last) writing
            # the computed order: strided reads, contiguous writes, as forward.
            k = _kernel.fft(k, "ifft", (self.order.index(self.axes[0]),), self.norm,
                            self.sizes[:1])
            rest = tuple(self.order.index(a) for a in self.axes[1:])
            return _kernel.fft(k, self._inverse, rest, self.norm, self.sizes[1:], self._undo)
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


# ----------------------------------------------------------------------------------------------
# The stage lists


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


def forward_stages(plan: Plan) -> tuple[Stage, ...]:
    """The stages of the forward transform of one (B, x, y, Z) block (see the module docstring)."""
    pa, pb = plan.pdims
    (name_a, name_b), (alg_a, alg_b) = plan.axes, plan.exchanges
    yc = plan.modes[1]
    if pa == pb == 1:  # one device: nothing to exchange, one 3-D transform
        # (padded all the same when planned for a mesh the partitioner has yet to give: the
        # same global shape wherever the program ends up)
        stages = (fft_stages(plan, (1, 2, 3), (0, 1, 2)) + pad_stages(2, yc, plan.yp)
                  + pad_stages(3, plan.zc, plan.zp))
        if plan.layout != "transposed":
            return stages
        if len(stages) == 1 and stages[0].fourier is not None:
            # The move to (B, Y, Z, X) written by the 3-D transform itself (FFTW's output
            # strides): one pass each way instead of two, the move was a third of the time.
            return (dataclasses.replace(stages[0], order=(0, 2, 3, 1)),)
        return stages + (Move(1, 3),)
    if pa == 1 and alg_b == "local":
        # The local exchange writes any order in its one pass: straight to the layout, (B, Y,
        # z, X) transposed or (B, X, Y, z) natural, and the 2-D Fft runs there (FFTW takes
        # strided axes as they are), with no move after it.
        if plan.layout == "transposed":  # (B, Y, z, X): Y (dim 1) at axis 1, X (dim 0) at 3
            order, xy, dims = (0, 2, 3, 1), (1, 3), (1, 0)
        else:  # (B, X, Y, z)
            order, xy, dims = (0, 1, 2, 3), (1, 2), (0, 1)
        return fft_stages(plan, (3,), (2,)) + pad_stages(3, plan.zc, plan.zp) + (
            Exchange(name_b, pb, split=3, gather=2, order=order, algorithm=alg_b),
        ) + fft_stages(plan, xy, dims)
    if pa == 1:  # slab over Y
        stages = fft_stages(plan, (3,), (2,)) + pad_stages(3, plan.zc, plan.zp) + (
            Exchange(name_b, pb, split=3, gather=2, order=(0, 3, 1, 2), algorithm=alg_b),
        ) + fft_stages(plan, (2, 3), (0, 1))  # (B, z, X, Y)
        # One move to the layout: (B, Y, z, X) transposed, (B, X, Y, z) natural.
        return stages + ((Move(3, 1),) if plan.layout == "transposed" else (Move(1, 3),))
    if pb == 1:  # slab over X: one 2-D transform of the whole local (Y, Z) planes
        stages = fft_stages(plan, (2, 3), (1, 2)) + pad_stages(2, yc, plan.yp) + (
            Exchange(name_a, pa, split=2, gather=1, order=(0, 2, 3, 1), algorithm=alg_a),
        )  # (B, y', Zc, X)
    else:
        stages = fft_stages(plan, (3,), (2,)) + pad_stages(3, plan.zc, plan.zp) + (
            Exchange(name_b, pb, split=3, gather=2, order=(0, 1, 3, 2), algorithm=alg_b),
        ) + fft_stages(plan, (3,), (1,)) + pad_stages(3, yc, plan.yp) + (  # (B, x, z, Y)
            Exchange(name_a, pa, split=3, gather=1, order=(0, 3, 2, 1), algorithm=alg_a),
        )  # (B, y', z, X)
    stages += fft_stages(plan, (3,), (0,))
    return stages + ((Move(3, 1),) if plan.layout == "natural" else ())  # natural: (B, X, y', z)

