"""Pipelined stages (issue 66): one piece's exchange in flight while the next piece is
transformed and packed and the last one unpacked and transformed.

A chunked stage (`chunks.Chunked`, `chunks.Pieces`) runs its pieces one after the other: the
link is idle while the cores compute, and the cores wait while the link moves the bytes, so a
transform across nodes costs communication + computation.  Pipelined, the stage's pieces
overlap: with piece i's messages in flight, piece i-1 goes through the steps after the
exchange (the unpack and the next FFT) and piece i+1 through those before it (its FFT and the
pack).  Its time tends to max(communication, computation).

How the exchange is kept in flight depends on how it sends:

* "mpi" (our MPI custom call, CPU processes): posted by `mpi.exchange_start`, awaited by
  `mpi.exchange_wait`, the other pieces' work between the two calls, ordered so by data
  (`mpi.after`: XLA:CPU drops `optimization_barrier`s before it schedules).  MPI's progress
  thread moves the messages meanwhile, so the overlap does not depend on XLA running
  independent work concurrently.  At most one exchange is in flight, and none crosses a loop
  iteration.  Three piece buffers turn around (`run_pipelined`'s `step`): each exchange
  receives into the buffer the exchange before it sent from, and each piece is packed into
  the buffer the piece before it was received in, so that XLA neither copies a piece into the
  loop's carry nor allocates one per piece.  With the FFTW kernel the pieces never leave the
  block otherwise (`_Windows`): the FFTs run in it in place, the pack reads from it and the
  unpack writes into it, at an offset the loop computes (`kernel.window`), so that the three
  slots are all a pipelined stage holds: one piece more than the chunked stage's exchange.
* "xla" (XLA's collectives: GPUs, or gloo): the pieces are written out one after the other
  with each exchange independent of the next piece's FFT, so that XLA's asynchronous
  collectives and its latency-hiding scheduler can overlap them.

Reading the pieces from the block and writing them back is `chunks._in_pieces`'s rule (in place
where a piece keeps its shape and dtype).  Differentiation goes through the plain chunked stage
(`linear`): the pipelined primitives have no transpose, and the values are the same.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from .._exchange import in_mesh, mpi as _mpi, traced_mesh
from . import kernel as _kernel
from .stages import Exchange, Fft
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
    def offset(i):  # piece i's first entry (i a Python int or traced in the MPI loop)
        return min(i * m, n - m) if isinstance(i, int) else jnp.minimum(i * m, n - m)

    def read(buf, i):
        return jax.lax.slice_in_dim(buf if in_place else source, offset(i), offset(i) + m,
                                    axis=1).reshape(shape)

    def write(buf, y, i):
        return jax.lax.dynamic_update_slice_in_dim(buf, y.reshape(outer_out, m, inner_out),
                                                   offset(i), axis=1)

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

    after = _mpi.after  # the order of the steps, by data (see `mpi.after`)
    # Pieces read and written in the block itself where the kernel can (`_Windows`): no piece
    # buffer beside the three slots; else copied out of the block and back.
    windows = _Windows.of(steps, at, k, cut, cut_out, m, out.shape) \
        if in_place and count * m == n else None
    at_ = lambda i: jnp.asarray(offset(i), jnp.int32)  # noqa: E731
    if not windows:
        prepare = lambda p: pack(before(p))  # noqa: E731
        slot0, unpack = prepare(p0)
        finish = lambda y: after_steps(unpack(y), p0)  # noqa: E731
    else:
        # Piece 0's FFT in a loop of one iteration that XLA cannot count (its bound comes from
        # the device's index): the block comes in through a reshape, and XLA copies the whole
        # block before an in-place call on a reshape (its layout assignment).
        once = jnp.minimum(jax.lax.axis_index(exchange.axis_name), 0) + 1
        _, buf = jax.lax.while_loop(lambda c: c[0] < once,
                                    lambda c: (c[0] + 1, windows.enter(c[1], at_(0))),
                                    (jnp.int32(0), buf))
        slot0 = windows.pack(buf, at_(0))
    # Piece 0's receiving buffer (the others reuse slots), its values never read: made from an
    # entry of the first piece, so that XLA makes it once that piece is there (made from
    # nothing, it was made first and held through the stage before: one piece more).
    entry = slot0.reshape(-1)[0]
    zeros = jax.lax.broadcast(entry, slot0.shape)

    def step(i, role: int, buf, slots, first: bool, last: bool):
        """Piece i's exchange in flight while piece i-1 is finished and piece i+1 packed.

        Three piece buffers ("slots") turn around: piece i is sent from slots[role], received
        into slots[role + 2] (sent from in step i-1, so free), and slots[role + 1] holds piece
        i-1 as received, finished first and then overwritten by piece i+1 packed.  Every value
        a step leaves in a slot was made after the slot's old one was last used, so XLA writes
        it there: no copy into the loop's carry, and one piece buffer more than a chunked
        stage's exchange holds (its piece sent and its piece received)."""
        send, keep, into = role % 3, (role + 1) % 3, (role + 2) % 3
        slots = list(slots)
        token, sending, receiving = _mpi.exchange_start(slots[send], exchange.axis_name,
                                                        exchange.n, slots[into])
        ready = [token]
        if not first:
            if windows:
                buf = windows.finish(after(slots[keep], token), buf, at_(i - 1))
                ready.append(buf.reshape(-1)[:1])  # (an entry: the block would be copied)
            else:
                done = finish(after(slots[keep], token))
                buf = write(buf, done, i - 1)
                ready.append(done)  # (not the block: XLA would copy it to keep a reader's view)
        if not last and windows:
            buf, slots[keep] = windows.prepare(after(buf, *ready), at_(i + 1))
            ready.append(slots[keep])
        elif not last:
            # Read after piece i-1 is written (disjoint from piece i+1: read from the written
            # block, so that XLA writes the block in place), packed into the slot piece i-1
            # was received in.
            nxt = jax.lax.dynamic_slice_in_dim(buf if in_place else source, offset(i + 1), m,
                                               axis=1).reshape(shape)
            slots[keep] = prepare(after(nxt, *ready))[0]
            ready.append(slots[keep])
        received = _mpi.exchange_wait(after(*ready), sending, receiving)
        if not last:
            slots[keep] = after(slots[keep], received)  # the next start after this wait
        slots[send], slots[into] = sending, received
        return buf, slots, token

    slots = [slot0, zeros, zeros]
    buf, slots, token = step(0, 0, buf, slots, True, count == 1)
    # Steps 1 .. count-2 in a loop of three (a slot's part turns with period 3: each part is
    # then the same in every iteration), the rest written out, the last one finishing.
    loops = max(count - 2, 0) // 3

    def body(k, carry):
        buf, *slots = carry
        for j in range(3):
            buf, slots, _ = step(1 + 3 * k + j, 1 + j, buf, slots, False, False)
        return (buf, *slots)

    if loops:
        buf, *slots = jax.lax.fori_loop(0, loops, body, (buf, *slots))
    for i in range(1 + 3 * loops, count):
        buf, slots, token = step(i, i, buf, slots, False, i == count - 1)
    if windows:
        buf = windows.finish(slots[(count + 1) % 3], buf, at_(count - 1))
        return buf.reshape(out.shape[:cut_out] + (n,) + out.shape[cut_out + 1:])
    done = finish(slots[(count + 1) % 3])
    # The last write in a loop of one iteration that XLA cannot count (its bound comes from
    # the token, always >= 1): written out here, XLA fuses it with the reshape the next stage
    # makes, which is then not in place, and copies the whole block before it.
    once = jnp.minimum(token[0], 1)
    _, buf = jax.lax.while_loop(lambda c: c[0] < once,
                                lambda c: (c[0] + 1, write(c[1], done, count - 1)),
                                (jnp.int32(0), buf))
    return buf.reshape(out.shape[:cut_out] + (n,) + out.shape[cut_out + 1:])


class _Windows:
    """A pipelined MPI stage's steps on pieces read from and written into the block in place
    (`kernel.window`: FFTW at an offset the loop computes), where they are what the 3-D stages
    make: at most a complex FFT along one axis before the exchange and one after it.  Then the
    slab or pencil stage holds the three slots and nothing else: the FFT before the exchange
    runs in the block, the pack reads it from there into a slot, the unpack writes the
    received slot into the block, and the FFT after it runs there (the block is the stage's
    output as well as its input: `chunks._in_pieces`'s rule).  Elsewhere (`of` returns None)
    the pieces are copied out of the block and back."""

    def __init__(self, before, after, exchange, dims, cut, out_dims, cut_out, m):
        self.before, self.after, self.exchange = before, after, exchange
        self.dims, self.cut, self.out_dims, self.cut_out, self.m = dims, cut, out_dims, cut_out, m

    @classmethod
    def of(cls, steps, at, k, cut, cut_out, m, piece_out):
        if not _kernel.windows_usable(k.dtype) or k.ndim != 4 or len(piece_out) != 4:
            return None  # (4-D: the 3-D stages' batched blocks, which `enter` leaves alone)
        before, after = steps[:at], steps[at + 1:]
        if len(before) > 1 or len(after) > 1:
            return None
        ffts = [_fft_of(s) for s in before + after]
        if any(f is None for f in ffts):
            return None
        exchange = steps[at]
        out_dims = tuple(piece_out[:cut_out]) + (k.shape[cut],) + tuple(piece_out[cut_out + 1:])
        # (the split axis is the input's, the gathered one sits at its place in `order`)
        if (exchange.split == cut or exchange.order.index(exchange.gather) == cut_out
                or k.shape[exchange.split] % exchange.n):
            return None
        return cls(ffts[0] if before else None, ffts[-1] if after else None, exchange,
                   tuple(k.shape), cut, out_dims, cut_out, m)

    def prepare(self, buf, offset):
        """The FFT before the exchange on the piece at `offset`, in the block, and the piece
        packed for the exchange (a new slot).  Returns (block, packed)."""
        buf = self.enter(buf, offset)
        return buf, self.pack(buf, offset)

    def enter(self, buf, offset):
        """The block with the FFT before the exchange run on the piece at `offset` (the
        block as it is, through an in-place call, where there is none)."""
        if self.before is None:
            return _mpi.after(buf)
        return _kernel.window(buf, offset, fft=self.before, order=None, in_dims=self.dims,
                              out_dims=self.dims, in_cut=self.cut, out_cut=self.cut, m=self.m)

    def pack(self, buf, offset):
        """The piece at `offset` packed for the exchange, read from the block (a new slot):
        `transpose._chunk_major`'s copy, the split axis cut in two."""
        dims, cut, m, n = self.dims, self.cut, self.m, self.exchange.n
        split = self.exchange.split
        dims5 = dims[:split] + (n, dims[split] // n) + dims[split + 1:]
        pos = {ax: (ax if ax < split else ax + 1) for ax in range(len(dims))}
        order = (split, *(pos[ax] for ax in self.exchange.order))
        piece5 = list(dims5)
        piece5[pos[cut]] = m
        return _kernel.window(buf, offset, fft=None, order=order, in_dims=dims5,
                              out_dims=tuple(piece5[a] for a in order), in_cut=pos[cut],
                              out_cut=-1, m=m)

    def finish(self, y, buf, offset):
        """The received piece y unpacked into the block at `offset`, and the FFT after the
        exchange on it there.  Returns the block."""
        out_dims, cut_out, m, n = self.out_dims, self.cut_out, self.m, self.exchange.n
        # `transpose._interleave`'s copy, written into the block: the gathered axis in two.
        g = self.exchange.order.index(self.exchange.gather)
        rest = list(range(1, y.ndim))
        order = (*rest[:g], 0, *rest[g:])
        dims5 = out_dims[:g] + (n, out_dims[g] // n) + out_dims[g + 1:]
        cut5 = cut_out if cut_out < g else cut_out + 1
        buf = _kernel.window(y, offset, fft=None, order=order, in_dims=y.shape, out_dims=dims5,
                             in_cut=-1, out_cut=cut5, m=m, into=buf)
        if self.after is not None:
            buf = _kernel.window(buf, offset, fft=self.after, order=None, in_dims=out_dims,
                                 out_dims=out_dims, in_cut=cut_out, out_cut=cut_out, m=m)
        return buf


def _fft_of(step) -> tuple[str, str, tuple[int, ...]] | None:
    """(type, norm, axes) of a step that is one complex FFT along one axis (a 3-D stage's
    `Fft`, forward or run backward), else None."""
    stage, backward = (step.stage, True) if isinstance(step, Back) else (step, False)
    if not isinstance(stage, Fft) or stage.order is not None or stage.kinds != ("fft",):
        return None
    return ("ifft" if backward else "fft"), stage.norm, stage.axes


def _run(steps, k: jax.Array) -> jax.Array:
    for step in steps:
        k = step.forward(k)
    return k
