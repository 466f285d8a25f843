"""The exchanges through XLA's own collectives: one all_to_all ("alltoall", every platform) or
n-1 collective permutes ("pairwise").  Each takes a chunk-major block (n, ...) inside shard_map
(chunk j for peer j) and returns the chunks received, chunk j from peer j."""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["alltoall", "pairwise"]


def alltoall(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    # ("alltoall" runs on the block as it is in `_transforms.transpose.transpose_blocks`; this form of it
    # is for callers that have a chunk-major block.)
    return jax.lax.all_to_all(y, axis_name, 0, 0, tiled=True)


def pairwise(y: jax.Array, axis_name: str, n: int) -> jax.Array:
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
