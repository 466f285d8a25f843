"""Pipelined stages (issue 66): one piece's exchange in flight while the next piece is
transformed and packed and the last one unpacked and transformed.

A chunked stage (`chunks.Chunked`, `chunks.Pieces`) runs its pieces one after the other: the
link is idle while the cores compute, and the cores wait while the link moves the bytes, so a
transform across nodes costs communication + computation.  Pipelined, the stage's pieces
overlap: with piece i's messages in flight, piece i+1 goes through the steps before the
exchange (its FFT and the pack) and piece i-1 through those after it (the unpack and the next
FFT).  Its time tends to max(communication, computation), for one more piece in memory.

How the exchange is kept in flight depends on how it sends:

* "mpi" (our MPI custom call, CPU processes): posted by `mpi.exchange_start`, awaited by
  `mpi.exchange_wait`, the other pieces' work between the two calls, ordered so by data
  (`mpi.after`: XLA:CPU drops `optimization_barrier`s before it schedules).  MPI's progress
  thread moves the messages meanwhile, so the overlap does not depend on XLA running
  independent work concurrently (its CPU runtime often runs a loop body's few thunks one after
  the other).  At most one exchange is in flight: the next
  start waits for this wait.
* "xla" (XLA's collectives: GPUs, or gloo): the pieces are written out one after the other
  with each exchange independent of the next piece's FFT, so that XLA's asynchronous
  collectives and its latency-hiding scheduler can overlap them.

The pieces are unrolled (a Python loop, not `fori_loop`): a buffer in MPI's hands must not
cross a loop iteration, where XLA could copy it.  Reading the pieces from the block and writing
them back is `chunks._in_pieces`'s rule (in place where a piece keeps its shape and dtype).
Differentiation goes through the plain chunked stage (`linear`): the pipelined primitives
have no transpose, and the values are the same.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from .._exchange import in_mesh, mpi as _mpi, traced_mesh
from .stages import Exchange
from .transpose import crossing, packed_exchange

__all__ = ["Back", "crossing_at", "linear", "run_pipelined", "steps_of"]


class Back:
    """A stage run backward, seen as a forward step."""

    def __init__(self, stage):
        self.stage = stage

    def forward(self, k: jax.Array) -> jax.Array:
        return self.stage.backward(k)


def steps_of(stages, forward: bool) -> list:
    """`stages` in the order a direction runs them, each with a `forward` doing its part:
    backward, an `Exchange` is its inverse exchange (so that it splits as one does)."""
    if forward:
        return list(stages)
    return [s.inverse() if isinstance(s, Exchange) else Back(s) for s in reversed(stages)]


def crossing_at(steps) -> tuple[int, str] | None:
    """(index, how) of the one exchange of `steps` that sends between processes or devices
    ("mpi" or "xla", `transpose.crossing`); None where there is none or more than one (the
    group then runs as it is).  Inside the per-device body."""
    found = [(i, how) for i, step in enumerate(steps) if isinstance(step, Exchange)
             and (how := crossing(step.axis_name, step.n, step.algorithm)) is not None]
    return found[0] if len(found) == 1 else None


def linear(pipelined: Callable, plain: Callable) -> Callable:
    """`pipelined`, differentiated as `plain` (the same linear map, run in order).  Called
    inside the per-device body; jax traces the rule later, so it re-enters the body's mesh
    (where our exchanges find their peers)."""
    mesh = traced_mesh()

    def jvp(primals, tangents):
        with in_mesh(mesh):
            return pipelined(*primals), plain(*tangents)

    f = jax.custom_jvp(pipelined)
    f.defjvp(jvp)
    return f


def run_pipelined(steps, at: int, how: str, k: jax.Array, cut: int, cut_out: int, chunks: int,
                  enter: Callable = lambda p: p, leave: Callable = lambda y, p: y) -> jax.Array:
    """`steps` (run in order; the exchange at index `at`, sent `how`) on `chunks` pieces of
    block k along axis `cut` (the output's `cut_out`), pipelined.  `enter(piece)` and
    `leave(result, piece)` wrap each piece (the 3-D stages' batch reshape)."""
    n = k.shape[cut]
    m = -(-n // chunks)
    count = -(-n // m)
    exchange = steps[at]
    before = lambda p: _run(steps[:at], enter(p))  # noqa: E731
    after_steps = lambda y, p: leave(_run(steps[at + 1:], y), p)  # noqa: E731
    shape = k.shape[:cut] + (m,) + k.shape[cut + 1:]
    piece = jax.ShapeDtypeStruct(shape, k.dtype)
    out = jax.eval_shape(lambda p: after_steps(exchange.forward(before(p)), p), piece)
    outer, inner = math.prod(k.shape[:cut]), math.prod(k.shape[cut + 1:])
    outer_out, inner_out = math.prod(out.shape[:cut_out]), math.prod(out.shape[cut_out + 1:])
    source = k.reshape(outer, n, inner)
    in_place = (outer, inner, k.dtype) == (outer_out, inner_out, out.dtype)
    buf = source if in_place else jax.lax.full_like(k, 0, out.dtype, (outer_out, n, inner_out))
    # The last piece of an uneven count is the last m entries, overlapping the one before it:
    # it is read before that one is written back (each entry is transformed alone, so the
    # overlap gets the same values twice).
    starts = [min(i * m, n - m) for i in range(count)]

    def read(buf, i):
        return jax.lax.slice_in_dim(buf if in_place else source, starts[i], starts[i] + m,
                                    axis=1).reshape(shape)

    def write(buf, y, i):
        return jax.lax.dynamic_update_slice_in_dim(buf, y.reshape(outer_out, m, inner_out),
                                                   starts[i], axis=1)

    p0 = read(buf, 0)  # (the shape every piece has: `leave` needs only that)
    if how == "xla":
        a, prev = before(p0), None
        for i in range(count):
            b = exchange.forward(a)  # independent of the next piece's work: XLA may overlap
            if i + 1 < count:
                a = before(read(buf, i + 1))
            if prev is not None:
                buf = write(buf, after_steps(prev, p0), i - 1)
            prev = b
        buf = write(buf, after_steps(prev, p0), count - 1)
        return buf.reshape(out.shape[:cut_out] + (n,) + out.shape[cut_out + 1:])

    def pack(a):
        return packed_exchange(a, exchange.axis_name, exchange.n, exchange.split,
                               exchange.gather, exchange.order)

    # A fori_loop over the pieces, piece i's exchange in flight within its iteration (started
    # and awaited there: no buffer in MPI's hands crosses an iteration, where XLA may copy
    # it), the next piece packed and the last one finished between the two.  A loop, not the
    # pieces written out one by one: XLA writes a loop's pieces in place, but copies a whole
    # block into a chain of unrolled in-place writes.
    after = _mpi.after  # the order of the steps, by data (see `mpi.after`)
    last = read(source, count - 1) if n % m and in_place else None
    packed, unpack = pack(before(p0))
    finish = lambda y: after_steps(unpack(y), p0)  # noqa: E731
    received = jax.eval_shape(lambda a: a, packed)

    def step(i, carry):
        buf, packed, prev = carry
        token, sending, receiving = _mpi.exchange_start(packed, exchange.axis_name, exchange.n)
        # The next piece (at the last, piece i again: its work is dropped), after the start.
        j = jnp.minimum(i + 1, count - 1)
        start = jnp.minimum(j * m, n - m)
        nxt = jax.lax.dynamic_slice_in_dim(buf if in_place else source, start, m, axis=1)
        if last is not None:
            nxt = jnp.where(j == count - 1, last.reshape(nxt.shape), nxt)
        nxt = after(nxt.reshape(shape), token)
        packed = pack(before(nxt))[0]
        # The piece before (at the first: zeros, written where piece 0 was read, which piece 0
        # overwrites next), after the start, written back after the next one is read.
        done = after(finish(after(prev, token)), nxt)
        at = jnp.maximum(i - 1, 0) * m
        buf = jax.lax.dynamic_update_slice_in_dim(buf, done.reshape(outer_out, m, inner_out),
                                                  jnp.minimum(at, n - m), axis=1)
        prev = _mpi.exchange_wait(after(token, packed, done), sending, receiving)
        # The last piece is finished in the last iteration (a loop's result written outside
        # it would be copied whole).  The other iterations write zeros where the next piece
        # was read, which that piece overwrites two iterations later.
        final = jax.lax.cond(i == count - 1, finish, lambda y: jax.lax.full_like(
            done, 0), prev)
        buf = jax.lax.dynamic_update_slice_in_dim(buf, final.reshape(outer_out, m, inner_out),
                                                  start, axis=1)
        return buf, after(packed, prev), prev

    zeros = jax.lax.full_like(packed, 0, received.dtype, received.shape)
    buf, _, _ = jax.lax.fori_loop(0, count, step, (buf, packed, zeros))
    return buf.reshape(out.shape[:cut_out] + (n,) + out.shape[cut_out + 1:])


def _run(steps, k: jax.Array) -> jax.Array:
    for step in steps:
        k = step.forward(k)
    return k
