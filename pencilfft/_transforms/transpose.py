"""The pencil-to-pencil exchange: the communication plus the local reordering around it.

Runs inside shard_map on per-device blocks.  The reordering is chosen so that the axis the next
FFT transforms comes out last (contiguous): XLA then runs batched FFTs over the minor axis instead
of transposing around a strided one, which is where a naive pencil FFT loses most of its time.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from . import kernel as _kernel
from .._exchange import ALGORITHMS, PLAIN_ALLTOALL_MAX, local, mixed


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
    `_exchange.mpi`) the chunks are made contiguous: the chunk axis is made the leading one before
    the communication, and the received chunks are interleaved back in the same transpose that
    applies `order`: two local passes over the data, whatever `order` is.  "local" (the CPU
    devices of one process, `_exchange.local`) does all of it, `order` included, in one pass;
    "mixed" is "local" along an axis whose groups stay inside processes, else "mpi".
    """
    if n == 1 or axis_name is None:
        return jnp.transpose(x, order)
    if x.shape[split] % n:
        raise ValueError(f"internal: axis {split} of block {x.shape} does not split into {n}")
    if algorithm == "mixed":
        algorithm = "local" if mixed.uses_local(axis_name) else "mpi"
    if algorithm == "local":  # the whole of it in one pass
        return local.exchange(x, axis_name, n, split, gather, order)
    if algorithm == "alltoall" and n <= PLAIN_ALLTOALL_MAX:
        return jnp.transpose(jax.lax.all_to_all(x, axis_name, split, gather, tiled=True), order)
    shape = x.shape
    chunked = list(shape)
    chunked[split] = shape[split] // n
    # Around MPI's send (CPU processes), the two local passes through FFTW's rank-0 plan: XLA's
    # CPU transpose that moves the gathered axis innermost took as long as the 2-D FFT under
    # mpirun -np 2 (`kernel.permute`).  Elsewhere XLA's transposes, as they were.
    permute = _kernel.permute if algorithm == "mpi" else jnp.transpose
    y = _chunk_major(x, n, split, order, permute)
    y = ALGORITHMS[algorithm].send(y, axis_name, n)  # (c, ...) -> (c_src, ...)
    return _interleave(y, gather, order, chunked, shape[gather] * n, permute)


def crossing(axis_name: str | None, n: int, algorithm: str) -> str | None:
    """How an exchange over `axis_name` sends between processes, for a pipelined stage
    (`_transforms.pipeline`): "mpi" (our MPI custom call: posted and awaited in two calls),
    "xla" (XLA's collectives, which XLA itself can run asynchronously), or None where there is
    nothing to overlap (one device, or the local exchange inside a process).  Inside the
    per-device body (a "mixed" axis is resolved on its traced mesh)."""
    if n == 1 or axis_name is None:
        return None
    if algorithm == "mixed":
        algorithm = "local" if mixed.uses_local(axis_name) else "mpi"
    if algorithm == "local":
        return None
    return "mpi" if algorithm == "mpi" else "xla"


def packed_exchange(x: jax.Array, axis_name: str, n: int, split: int, gather: int,
                    order: tuple[int, ...]):
    """`transpose_blocks` with the "mpi" algorithm in three parts, for a pipelined stage: the
    chunk-major block `pack` makes (the local pass before the send), the send itself
    (`mpi.exchange_start`/`exchange_wait` on it) and `unpack` (the pass after), which takes
    the received chunk-major block.  Returns (packed block, unpack)."""
    if x.shape[split] % n:
        raise ValueError(f"internal: axis {split} of block {x.shape} does not split into {n}")
    chunked = list(x.shape)
    chunked[split] = x.shape[split] // n
    gathered = x.shape[gather] * n
    packed = _chunk_major(x, n, split, order, _kernel.permute)
    return packed, lambda y: _interleave(y, gather, order, chunked, gathered, _kernel.permute)


def _chunk_major(x: jax.Array, n: int, split: int, order: tuple[int, ...],
                 permute=jnp.transpose) -> jax.Array:
    """(c, *order): axis `split` cut into n chunks, the chunk index leading.

    Each peer's chunk is then one contiguous buffer, and after the exchange only the chunk index
    has to move next to the gathered axis.
    """
    shape = x.shape  # (split divisible by n: checked in `transpose_blocks`)
    y = x.reshape(shape[:split] + (n, shape[split] // n) + shape[split + 1:])
    pos = {ax: (ax if ax < split else ax + 1) for ax in range(x.ndim)}  # x axis -> y axis
    return permute(y, (split, *(pos[ax] for ax in order)))


def _interleave(y: jax.Array, gather: int, order: tuple[int, ...], chunked: list[int],
                gathered: int, permute=jnp.transpose) -> jax.Array:
    """(c_src, *order) -> *order with c_src merged into `gather` (just before it)."""
    g = order.index(gather)
    rest = list(range(1, y.ndim))
    y = permute(y, (*rest[:g], 0, *rest[g:]))  # (jnp.moveaxis(y, 0, g))
    out_shape = [chunked[ax] for ax in order]
    out_shape[g] = gathered
    return y.reshape(out_shape)
