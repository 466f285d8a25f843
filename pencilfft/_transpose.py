"""The pencil-to-pencil exchange: one all_to_all plus the local reordering around it.

Runs inside shard_map on per-device blocks.  The reordering is chosen so that the axis the next
FFT transforms comes out last (contiguous): XLA then runs batched FFTs over the minor axis instead
of transposing around a strided one, which is where a naive pencil FFT loses most of its time.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def exchange(x: jax.Array, axis_name: str | None, n: int, split: int, gather: int,
             order: tuple[int, ...]) -> jax.Array:
    """Split local axis `split` into `n` chunks over mesh axis `axis_name`, gather axis `gather`.

    x is a per-device block.  Chunk j of axis `split` goes to peer j; the chunks received are
    concatenated, in peer order, along axis `gather` (which grows n-fold while `split` shrinks
    n-fold).  The result's axes are then `order` (a permutation of x's axes, numbered as in x).
    With n == 1 (or no mesh axis) this is only the local permutation.

    The chunk axis is made the leading one before the all_to_all, so every message is one
    contiguous buffer, and the received chunks are interleaved back in the same transpose that
    applies `order`: two local passes over the data, whatever `order` is.
    """
    if n == 1 or axis_name is None:
        return jnp.transpose(x, order)
    shape = x.shape
    if shape[split] % n:
        raise ValueError(f"internal: axis {split} of block {shape} does not split into {n}")
    # Name the axes of the chunked array: 'c' is the chunk index, the others keep x's numbering.
    chunked = list(shape)
    chunked[split] = shape[split] // n
    y = x.reshape(shape[:split] + (n, shape[split] // n) + shape[split + 1:])
    pos = {ax: (ax if ax < split else ax + 1) for ax in range(x.ndim)}  # x axis -> y axis
    chunk_pos = split
    # Before the exchange: (c, *order) so each peer's chunk is contiguous and, after it, only the
    # received chunk index has to move next to `gather`.
    y = jnp.transpose(y, (chunk_pos, *(pos[ax] for ax in order)))
    y = jax.lax.all_to_all(y, axis_name, 0, 0, tiled=True)
    # y is (c_src, *order); put c_src just before `gather` and merge the two.
    g = order.index(gather)
    y = jnp.moveaxis(y, 0, g)
    out_shape = [chunked[ax] for ax in order]
    out_shape[g] = shape[gather] * n
    return y.reshape(out_shape)
