"""The pencil-to-pencil exchange: the communication plus the local reordering around it.

Runs inside shard_map on per-device blocks.  The reordering is chosen so that the axis the next
FFT transforms comes out last (contiguous): XLA then runs batched FFTs over the minor axis instead
of transposing around a strided one, which is where a naive pencil FFT loses most of its time.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from . import _local_exchange, _mpi_exchange


def transpose_blocks(x: jax.Array, axis_name: str | None, n: int, split: int, gather: int,
                     order: tuple[int, ...], algorithm: str = "alltoall") -> jax.Array:
    """Split local axis `split` into `n` chunks over mesh axis `axis_name`, gather axis `gather`.

    x is a per-device block.  Chunk j of axis `split` goes to peer j; the chunks received are
    concatenated, in peer order, along axis `gather` (which grows n-fold while `split` shrinks
    n-fold).  The result's axes are then `order` (a permutation of x's axes, numbered as in x).
    With n == 1 (or no mesh axis) this is only the local permutation.

    With "alltoall" over at most `PLAIN_ALLTOALL_MAX` devices, one all_to_all of the block as it
    is (split along `split`, received chunks concatenated along `gather`: XLA's collective does
    both), then `order` in one transpose: the form whose buffers XLA packs best there (issue 27:
    a 4x2 or 2x4 pencil forward holds 3 local blocks donated, 4 kept, as jaxdecomp; the form below
    held 3.5-3.75 and 4.5-4.75).  Otherwise (more devices, where that form measured 8-11% slower
    on CPUs and saved no memory; "pairwise", n-1 collective permutes; "mpi", our MPI custom call,
    `_mpi_exchange`) the chunks are made contiguous: the chunk axis is made the leading one before
    the communication, and the received chunks are interleaved back in the same transpose that
    applies `order`: two local passes over the data, whatever `order` is.  "local" (the CPU
    devices of one process, `_local_exchange`) does all of it, `order` included, in one pass.
    """
    if n == 1 or axis_name is None:
        return jnp.transpose(x, order)
    if x.shape[split] % n:
        raise ValueError(f"internal: axis {split} of block {x.shape} does not split into {n}")
    if algorithm == "local":  # the whole of it in one pass
        return _local_exchange.exchange(x, axis_name, n, split, gather, order)
    if algorithm == "alltoall" and n <= PLAIN_ALLTOALL_MAX:
        return jnp.transpose(jax.lax.all_to_all(x, axis_name, split, gather, tiled=True), order)
    shape = x.shape
    chunked = list(shape)
    chunked[split] = shape[split] // n
    y = _chunk_major(x, n, split, order)
    y = ALGORITHMS[algorithm].send(y, axis_name, n)  # (c, ...) -> (c_src, ...)
    return _interleave(y, gather, order, chunked, shape[gather] * n)


# Every algorithm takes (chunk-major block, mesh axis, n) ("alltoall" runs on the block as it is
# in `transpose_blocks`; this form of it is for callers that have a chunk-major block).
def _alltoall(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    return jax.lax.all_to_all(y, axis_name, 0, 0, tiled=True)


def _pairwise(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    """At step `shift` every device sends the chunk of peer i - shift and receives its own from
    peer i + shift; its own chunk never moves (all_to_all copies it too).  The chunks arrive
    rotated by i, which a dynamic roll undoes inside the pass that interleaves them."""
    i = jax.lax.axis_index(axis_name)
    pieces = []
    for shift in range(n):
        piece = jax.lax.dynamic_index_in_dim(y, (i - shift) % n, 0, keepdims=True)
        if shift:
            piece = jax.lax.ppermute(piece, axis_name, [(j, (j - shift) % n) for j in range(n)])
        pieces.append(piece)  # came from peer (i + shift) % n
    return jnp.roll(jnp.concatenate(pieces, 0), i, axis=0)  # in source order


# ----------------------------------------------------------------------------------------------
# The exchange algorithms: one table


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One way of moving the chunks.

    `send(chunk-major block, mesh axis, n)`; `unavailable(mesh size, platform)`: why it cannot run
    there (None: it can; mesh size None: the compiler partitions the transform, the mesh is
    not known yet); `auto(n, platform, block bytes)`: whether "auto" takes it
    for a mesh axis of n devices (the first entry of `AUTO_ORDER` that says yes wins).
    """

    send: Callable[[jax.Array, str, int], jax.Array]
    unavailable: Callable[[int | None, str], str | None] = lambda size, platform: None
    auto: Callable[[int, str, int], bool] = lambda n, platform, nbytes: False


# Mesh axes of at most this many devices run "alltoall" on the blocks as they are
# (`transpose_blocks`).
PLAIN_ALLTOALL_MAX = 4

# Per-device blocks at least this large take the pairwise exchange under "auto" on CPUs.
PAIRWISE_MIN_BYTES = 8 << 20

ALGORITHMS: dict[str, Algorithm] = {
    # One all_to_all: the default, and on GPUs always (one grouped NCCL call beats n-1).
    "alltoall": Algorithm(_alltoall, auto=lambda n, platform, nbytes: True),
    # n-1 collective permutes (cuDecomp's pairwise): all_to_all also copies the device's own
    # chunk, while each permute costs a rendezvous, which dominates for small blocks (measured
    # on CPUs: faster for axes of 2-4 devices from PAIRWISE_MIN_BYTES per block).
    "pairwise": Algorithm(_pairwise, auto=lambda n, platform, nbytes: (
        platform == "cpu" and 1 < n <= 4 and nbytes >= PAIRWISE_MIN_BYTES)),
    # MPI inside XLA (our custom call, `_mpi_exchange`): CPU processes with one device each
    # under mpirun.  "auto" takes it there whenever MPI runs and the handler is built (several
    # times faster than gloo's TCP collectives across processes: benchmarks/RESULTS.md, issue 37).
    "mpi": Algorithm(_mpi_exchange.exchange, _mpi_exchange.unavailable_reason,
                     auto=lambda n, platform, nbytes: _mpi_exchange.auto(platform)),
    # The devices of one process (our custom call, `_local_exchange`): the split, the exchange,
    # the concatenation and `order` in one pass over shared memory; "auto" takes it on CPUs in a
    # one-process job wherever a C++ compiler builds it.  (`transpose_blocks` calls it on the
    # block as it is: `send` is for callers that have a chunk-major block.)
    "local": Algorithm(
        lambda y, axis_name, n: _local_exchange.exchange(y, axis_name, n, 0, 0, tuple(range(y.ndim))),
        _local_exchange.unavailable_reason,
        auto=lambda n, platform, nbytes: _local_exchange.auto(platform)),
}
AUTO_ORDER = ("mpi", "local", "pairwise", "alltoall")
EXCHANGES = ("auto",) + tuple(ALGORITHMS)


def choose(exchange: str, mesh_size: int | None, platform: str, pdims: tuple[int, ...],
           block_bytes: int) -> tuple[str, ...]:
    """The algorithm for each mesh axis of `pdims` (`mesh_size` None: no mesh yet)."""
    if exchange not in EXCHANGES:
        raise ValueError(f"`exchange` must be one of {EXCHANGES}; got {exchange!r}")
    if exchange != "auto":
        why = ALGORITHMS[exchange].unavailable(mesh_size, platform) if mesh_size else None
        if why is not None:
            raise ValueError(f"`exchange`={exchange!r} cannot run here: {why}")
        return (exchange,) * len(pdims)
    return tuple(next(name for name in AUTO_ORDER if ALGORITHMS[name].auto(n, platform, block_bytes))
                 for n in pdims)


def _chunk_major(x: jax.Array, n: int, split: int, order: tuple[int, ...]) -> jax.Array:
    """(c, *order): axis `split` cut into n chunks, the chunk index leading.

    Each peer's chunk is then one contiguous buffer, and after the exchange only the chunk index
    has to move next to the gathered axis.
    """
    shape = x.shape  # (split divisible by n: checked in `transpose_blocks`)
    y = x.reshape(shape[:split] + (n, shape[split] // n) + shape[split + 1:])
    pos = {ax: (ax if ax < split else ax + 1) for ax in range(x.ndim)}  # x axis -> y axis
    return jnp.transpose(y, (split, *(pos[ax] for ax in order)))


def _interleave(y: jax.Array, gather: int, order: tuple[int, ...], chunked: list[int],
                gathered: int) -> jax.Array:
    """(c_src, *order) -> *order with c_src merged into `gather` (just before it)."""
    g = order.index(gather)
    y = jnp.moveaxis(y, 0, g)
    out_shape = [chunked[ax] for ax in order]
    out_shape[g] = gathered
    return y.reshape(out_shape)
