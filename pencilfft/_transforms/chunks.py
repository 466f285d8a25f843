"""Chunked stages: each stage of the transform run in `chunks` pieces, written back in place.

An unchunked stage holds its input block, its output block and the exchange's buffers at once
(3-4 local blocks).  Cut along an axis that the stage's FFT and exchange do not touch, each
piece is transformed, exchanged and written back (`dynamic_update_slice`) into the block it
came from, inside a `fori_loop` (one piece alive at a time): about 1 block plus a few pieces.

Writing back in place needs a piece's output to land where its input was: seen as (outer, n,
inner) with n the cut axis, the input and output blocks must have the same outer and inner
sizes and dtype.  The chain below is chosen so that they do, on a cube (X == Y) and in every
mesh (a slab is the same chain with a one-device exchange, which is a local move):

    transposed:  (B, x, y, Z) --Z, exchange b--> (B, x, z, Y)   cut along x
                              --Y, exchange a--> (B, y', z, X)  cut along z  (in place if X == Y)
                              --X-->             (B, y', z, X)  cut along y'
    natural:     (B, x, y, Z) --Z, exchange b--> (B, x, Y, z)   cut along x
                              --Y, exchange a--> (B, X, y', z)  cut along z  (always in place)
                              --X-->             (B, X, y', z)  cut along y'

Where the sizes differ (real-to-complex first stage, padding, X != Y in the transposed layout)
a stage writes its pieces into a new output block instead: 2 blocks plus pieces.  The FFTs of
the natural chain run along strided axes (XLA transposes each piece around them), and each piece
is a loop step with a smaller exchange: on GPUs the unchunked chain (`stages.forward_stages`)
should be the fast one; on CPUs a piece that stays in cache made chunks=8 faster at 256^3
(benchmarks/RESULTS.md "Chunked stages").
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from . import pipeline as _pipeline
from .plan import Plan
from .routes import find_route
from .stages import (Exchange, Fft, Fit, Inverse, Permute, Reshard, Stage, Swap, Take, emit,
                     forward_stages, pencil_problem, run_backward, run_forward, run_route,
                     run_route_back, trailing)

__all__ = ["Chunked", "Pieces", "chunked_stages", "in_place", "route_groups",
           "route_in_pieces", "stages_of"]


@dataclasses.dataclass(frozen=True)
class Chunked:
    """`stages` run on `chunks` pieces of the block along axis `cut_in` (the output's
    `cut_out`); `pipeline`: with one piece's exchange in flight while the others are worked on
    (`pipeline.py`), where the stages hold an exchange between processes."""

    stages: tuple[Stage, ...]
    cut_in: int
    cut_out: int
    chunks: int
    pipeline: bool = False

    def forward(self, k: jax.Array) -> jax.Array:
        plain = lambda k: _in_pieces(functools.partial(run_forward, self.stages), k,  # noqa: E731
                                     self.cut_in, self.cut_out, self.chunks)
        return _pipelined_or(plain, self.stages, True, k, self.cut_in, self.cut_out,
                             self.chunks if self.pipeline else 1, batched=True)

    def backward(self, k: jax.Array) -> jax.Array:
        plain = lambda k: _in_pieces(functools.partial(run_backward, self.stages), k,  # noqa: E731
                                     self.cut_out, self.cut_in, self.chunks)
        return _pipelined_or(plain, self.stages, False, k, self.cut_out, self.cut_in,
                             self.chunks if self.pipeline else 1, batched=True)


def _pipelined_or(plain, stages, forward: bool, k: jax.Array, cut: int, cut_out: int,
                  chunks: int, batched: bool = False) -> jax.Array:
    """The stages pipelined in `chunks` pieces where they hold one exchange that sends between
    processes or devices (differentiated as `plain`), else `plain(k)`.  `batched`: the 3-D
    stages, which see a block with its leading axes flattened (`run_forward`)."""
    steps = _pipeline.steps_of(stages, forward)
    found = _pipeline.crossing_at(steps) if chunks > 1 and k.shape[cut] > 1 else None
    if found is None:
        return plain(k)
    at, how = found
    wrap = {}
    if batched:
        wrap = dict(enter=lambda p: p.reshape((-1,) + p.shape[-3:]),
                    leave=lambda y, p: y.reshape(p.shape[:-3] + y.shape[1:]))
    pipelined = lambda k: _pipeline.run_pipelined(steps, at, how, k, cut, cut_out,  # noqa: E731
                                                  chunks, **wrap)
    return _pipeline.linear(pipelined, plain)(k)


@dataclasses.dataclass(frozen=True)
class Pieces:
    """A route's `stages` (jnp.fft's names: the block's axes as they are) run on `chunks`
    pieces along the longest of the block's axes `free`, which they all leave alone (the
    lowest of equally long ones: a batch axis split down to one entry is no cut); `pipeline`:
    as `Chunked`'s."""

    stages: tuple[Stage, ...]
    free: tuple[int, ...]
    chunks: int
    pipeline: bool = False

    def _cut(self, k: jax.Array) -> int:
        return max(self.free, key=lambda i: (k.shape[i], -i))

    def forward(self, k: jax.Array) -> jax.Array:
        cut = self._cut(k)
        plain = lambda k: _in_pieces(functools.partial(run_route, self.stages), k, cut, cut,  # noqa: E731
                                     self.chunks)
        return _pipelined_or(plain, self.stages, True, k, cut, cut,
                             self.chunks if self.pipeline else 1)

    def backward(self, k: jax.Array) -> jax.Array:
        cut = self._cut(k)
        plain = lambda k: _in_pieces(functools.partial(run_route_back, self.stages), k, cut,  # noqa: E731
                                     cut, self.chunks)
        return _pipelined_or(plain, self.stages, False, k, cut, cut,
                             self.chunks if self.pipeline else 1)


def _in_pieces(f, k: jax.Array, cut: int, cut_out: int, chunks: int,
               unrolled: bool = False) -> jax.Array:
    """f on `chunks` pieces of k along axis `cut` (f keeps that axis, as `cut_out`), in a
    `fori_loop`, or `unrolled` (one copy of f's ops per piece).

    Pieces are ceil(n / chunks) long, so every count works on every axis length (at most n
    pieces)."""
    n = k.shape[cut]
    if chunks == 1 or n == 1:
        return f(k)
    m = -(-n // chunks)
    full, rest = divmod(n, m)
    piece_shape = lambda length: k.shape[:cut] + (length,) + k.shape[cut + 1:]  # noqa: E731
    out = jax.eval_shape(f, jax.ShapeDtypeStruct(piece_shape(m), k.dtype))
    out_shape = out.shape[:cut_out] + (n,) + out.shape[cut_out + 1:]
    outer, inner = math.prod(k.shape[:cut]), math.prod(k.shape[cut + 1:])
    outer_out, inner_out = math.prod(out_shape[:cut_out]), math.prod(out_shape[cut_out + 1:])
    source = k.reshape(outer, n, inner)
    # In place when piece i's output covers exactly the positions it was read from.
    in_place = (outer, inner, k.dtype) == (outer_out, inner_out, out.dtype)

    def run(p, length):
        return f(p.reshape(piece_shape(length))).reshape(outer_out, length, inner_out)

    # An uneven count: the last piece is the last m entries, overlapping the one before it
    # (each entry along the cut axis is transformed alone, so the overlap gets the same values
    # twice).  In place, its input is put aside before the loop overwrites it.  Everything runs
    # inside the loop: XLA copies a loop's result before writing into it outside.
    last = jax.lax.slice_in_dim(source, n - m, n, axis=1) if rest and in_place else None

    def step(i, buf):
        start = jnp.minimum(i * m, n - m)
        p = jax.lax.dynamic_slice_in_dim(buf if in_place else source, start, m, axis=1)
        if last is not None:
            p = jnp.where(i == full, last, p)
        return jax.lax.dynamic_update_slice_in_dim(buf, run(p, m), start, axis=1)

    buf = source if in_place else _zeros_like_varying((outer_out, n, inner_out), out.dtype, k)
    if unrolled:  # each piece its own ops (pipelined plans: XLA copies a loop's result when a
        # pipelined stage after it writes into it in place, a whole block)
        for i in range(full + (1 if rest else 0)):
            start = min(i * m, n - m)
            p = jax.lax.slice_in_dim(buf if in_place else source, start, start + m, axis=1)
            if last is not None and i == full:
                p = last
            buf = jax.lax.dynamic_update_slice_in_dim(buf, run(p, m), start, axis=1)
        return buf.reshape(out_shape)
    buf = jax.lax.fori_loop(0, full + (1 if rest else 0), step, buf)
    return buf.reshape(out_shape)


def _zeros_like_varying(shape, dtype, like: jax.Array) -> jax.Array:
    """Zeros that vary over the same mesh axes as `like` (inside shard_map a loop's carry must
    keep its type, and every piece written into it varies over them): `full_like` keeps them."""
    return jax.lax.full_like(like, 0, dtype, shape)


def _place(plan: Plan):
    """The orders the chain's exchanges write: the unchunked stages' in the transposed layout;
    in the natural one every axis stays where it is (a piece's output then lands where its
    input was: in place), the FFTs running along strided axes."""
    if plan.layout == "transposed":
        return lambda perm, nxt, last, algorithm: trailing(3, sorted(nxt))
    return lambda perm, nxt, last, algorithm: tuple(perm)


def _groups(plan: Plan) -> tuple[tuple[tuple[Stage, ...], int, int], ...]:
    """The chain of the module docstring: (stages, cut axis in, cut axis out) per FFT step of
    the pencil's route (`stages.pencil_problem` with every mesh axis, those of size 1 an
    exchange on one device).  The cut is the lowest global axis that the step's FFT and
    exchange leave alone, where it is before and after the step."""
    return tuple((stages, perm.index(cut) + 1, after.index(cut) + 1)
                 for stages, perm, after, free in _steps(plan) for cut in (min(free),))


def _steps(plan: Plan) -> list[tuple[tuple[Stage, ...], list[int], list[int], set[int]]]:
    """Each FFT step of the chain: its stages, the global dims' order before and after it, and
    the global dims its FFT and exchanges leave alone."""
    problem = pencil_problem(plan, every_axis=True)
    route = find_route(problem)
    groups = emit(plan, problem, route, _place(plan))
    out, perm = [], [0, 1, 2]
    for stages in groups:
        touched = {d for stage in stages if isinstance(stage, Fft) for d in
                   (perm[a - 1] for a in stage.axes)}
        after = list(perm)
        for stage in stages:
            if isinstance(stage, Exchange):
                touched |= {perm[stage.split - 1], perm[stage.gather - 1]}
                after = [perm[o - 1] for o in stage.order[1:]]
        out.append((tuple(stages), perm, after, set(range(3)) - touched))
        perm = after
    return out


def _pipelined_groups(plan: Plan) -> tuple[tuple[tuple[Stage, ...], int, int], ...]:
    """The chain for a pipelined plan: a step whose exchange crosses processes is joined with
    the step after it where one axis is left alone by both (the slab's Y and X steps, cut along
    Z): the FFT after the exchange then runs on each piece as it arrives, beside the next
    piece's exchange, instead of after the last one."""
    steps = _steps(plan)
    out, i = [], 0
    while i < len(steps):
        stages, perm, after, free = steps[i]
        if (i + 1 < len(steps) and any(isinstance(s, Exchange) and s.n > 1 for s in stages)
                and (common := free & steps[i + 1][3])):
            nxt_stages, _, nxt_after, _ = steps[i + 1]
            cut = min(common)
            out.append((stages + nxt_stages, perm.index(cut) + 1, nxt_after.index(cut) + 1))
            i += 2
            continue
        cut = min(free)
        out.append((stages, perm.index(cut) + 1, after.index(cut) + 1))
        i += 1
    return tuple(out)


def in_place(plan: Plan) -> tuple[bool, bool, bool]:
    """Whether each stage of the chain writes its pieces back in place (`_in_pieces`), from
    the global shapes alone (the memory estimate's rule; the same either direction)."""
    xg, yg, zg = plan.real_shape
    same_dtype = plan.real_dtype == plan.k_dtype
    first = same_dtype and zg == plan.zp  # y Z == Y z: Z neither halved, truncated nor padded
    if plan.layout == "transposed":
        second = xg == yg == plan.yp  # (x, z, Y) -> (y', z, X)
    else:
        second = yg == plan.yp  # (x, Y, z) -> (X, y', z)
    return first, second, xg == plan.modes[0]


def chunked_stages(plan: Plan) -> tuple[Chunked, ...]:
    """The forward stages of `plan` cut into `plan.chunks` pieces each (pipelined where
    `plan.pipeline` says)."""
    groups = _pipelined_groups(plan) if plan.pipeline else _groups(plan)
    return tuple(Chunked(stages, cut_in, cut_out, plan.chunks, plan.pipeline)
                 for stages, cut_in, cut_out in groups)


def stages_of(plan: Plan) -> tuple[Stage, ...]:
    """The forward transform's stages on a per-device block, chunked or not (`plan.chunks`);
    the backward transform walks them reversed."""
    return forward_stages(plan) if plan.chunks == 1 else chunked_stages(plan)


# ----------------------------------------------------------------------------------------------
# jnp.fft's names: a route's stages (array axes in their global order) in pieces


def _touches(stage) -> set[int]:
    """The block axes a route stage transforms, moves, cuts, pads or permutes."""
    if isinstance(stage, Inverse):
        stage = stage.stage
    if isinstance(stage, Fft):
        return set(stage.axes)
    if isinstance(stage, Exchange):  # and the axes its `order` moves (a piece must stay put)
        return {stage.split, stage.gather} | {i for i, o in enumerate(stage.order) if i != o}
    if isinstance(stage, Permute):
        return {i for i, o in enumerate(stage.order) if i != o}
    if isinstance(stage, Reshard):  # its boxes cut every axis
        return set(range(len(stage.in_perm)))
    if isinstance(stage, (Fit, Take)):
        return {stage.axis}
    if isinstance(stage, Swap):
        return set()  # a permute of whole blocks between devices: every axis stays as it is
    raise TypeError(f"not a route stage: {stage!r}")


def route_groups(stages: tuple[Stage, ...], ndim: int) -> list[tuple[tuple[Stage, ...],
                                                                     tuple[int, ...]]]:
    """A route's stages cut at each FFT (one group: a transform and the stages up to the next,
    the first group what comes before the first transform), each with the axes that none of
    its stages touches (empty: the group runs whole)."""
    groups: list[list[Stage]] = [[]]
    for stage in stages:
        # (a Permute, the route's last stage, in a group of its own: the FFT before it is cut)
        if isinstance(stage, (Fft, Inverse, Permute)) and groups[-1]:
            groups.append([])
        groups[-1].append(stage)
    return [(tuple(group), tuple(sorted(set(range(ndim)) - set().union(*map(_touches, group)))))
            for group in groups if group]


def route_in_pieces(stages: tuple[Stage, ...], ndim: int, chunks: int) -> tuple[Stage, ...]:
    """A route's stages with each group (`route_groups`) run in `chunks` pieces along a free
    axis (`Pieces`), written back in place where a piece keeps its shape and dtype."""
    if chunks == 1:
        return stages
    out: list[Stage] = []
    for group, free in route_groups(stages, ndim):
        if free:
            out.append(Pieces(group, free, chunks))
        else:
            out += group
    return tuple(out)
