"""Every way the pencil transposes move data between devices: one table, one place.

Each entry of `ALGORITHMS` says how it sends a chunk-major block, why it cannot run somewhere,
and when exchange="auto" takes it; `choose` turns the user's `exchange=` into one algorithm per
mesh axis.  The modules:

* `xla`: XLA's collectives, "alltoall" (every platform; always on GPUs) and "pairwise";
* `local`: our custom call between the CPU devices of one process (shared memory, one pass);
* `reshard`: several of those exchanges in a row, in one pass (the N-D routes' runs);
* `mpi`: our custom call through MPI inside XLA, between processes (mpirun, srun);
* `mixed`: several processes of several CPU devices each: `local` along the mesh axes that stay
  inside processes, `mpi` along the others;
* `_common`: what the custom calls share (the traced mesh, a device's coordinates, which
  processes hold a group, the linear rules); registration with XLA and the compiler rule are
  `pencilfft._native.build`'s.

The transpose around the exchange (splitting, interleaving, reordering) is
`pencilfft._transforms.transpose`'s.  Data flow: a per-device block inside the traced body of a
transform (or a halo, a paint) -> `ALGORITHMS[name].send` -> the peers' blocks.  May import:
jax, numpy, `_jax_private`, `_native` (the custom calls' build and threads), `_decomposition`,
`_processes` (what every process must decide alike); mpi4py lazily.  The transforms and the particle-mesh tools build on it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax

from . import local, mixed, mpi, reshard, xla
from ._common import concrete, in_mesh, process_groups, traced_mesh, within_processes

__all__ = ["ALGORITHMS", "AUTO_ORDER", "Algorithm", "EXCHANGES", "PAIRWISE_MIN_BYTES",
           "PLAIN_ALLTOALL_MAX", "choose", "concrete", "in_mesh", "local", "local_status",
           "mixed", "mpi", "process_groups", "reshard", "traced_mesh", "within_processes",
           "xla"]


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
# (`_transforms.transpose.transpose_blocks`).
PLAIN_ALLTOALL_MAX = 4

# Per-device blocks at least this large take the pairwise exchange under "auto" on CPUs.
PAIRWISE_MIN_BYTES = 8 << 20


def _local_send(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    return local.exchange(y, axis_name, n, 0, 0, tuple(range(y.ndim)))


def _mixed_send(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    return (_local_send if mixed.uses_local(axis_name) else mpi.exchange)(y, axis_name, n)


ALGORITHMS: dict[str, Algorithm] = {
    # One all_to_all: the default, and on GPUs always (one grouped NCCL call beats n-1).
    "alltoall": Algorithm(xla.alltoall, auto=lambda n, platform, nbytes: True),
    # n-1 collective permutes (cuDecomp's pairwise): all_to_all also copies the device's own
    # chunk, while each permute costs a rendezvous, which dominates for small blocks (measured
    # on CPUs: faster for axes of 2-4 devices from PAIRWISE_MIN_BYTES per block).
    "pairwise": Algorithm(xla.pairwise, auto=lambda n, platform, nbytes: (
        platform == "cpu" and 1 < n <= 4 and nbytes >= PAIRWISE_MIN_BYTES)),
    # MPI inside XLA (our custom call, `mpi`): CPU processes under mpirun or srun.  "auto" takes
    # it with one device per process whenever MPI runs and the handler is built (several times
    # faster than gloo's TCP collectives across processes: benchmarks/RESULTS.md, issue 37).
    "mpi": Algorithm(mpi.exchange, mpi.unavailable_reason,
                     auto=lambda n, platform, nbytes: mpi.auto(platform)),
    # The devices of one process (our custom call, `local`): the split, the exchange, the
    # concatenation and `order` in one pass over shared memory; "auto" takes it on CPUs in a
    # one-process job wherever a C++ compiler builds it.  (`transpose_blocks` calls it on the
    # block as it is: `send` is for callers that have a chunk-major block.)
    "local": Algorithm(_local_send, local.unavailable_reason,
                       auto=lambda n, platform, nbytes: local.auto(platform)),
    # Several processes of several CPU devices each (`mixed`): "local" along the mesh axes
    # inside processes, "mpi" along the others; "auto" takes it there.
    "mixed": Algorithm(_mixed_send, mixed.unavailable_reason,
                       auto=lambda n, platform, nbytes: mixed.auto(platform)),
}
AUTO_ORDER = ("mixed", "mpi", "local", "pairwise", "alltoall")
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


def local_status(platform: str | None = None) -> str:
    """One line for `pencilfft check`: how the devices of this process exchange, and why."""
    platform = platform or jax.default_backend()
    why = local.unavailable_reason(None, platform)
    if why is not None:
        return f"XLA's collectives (the local exchange does not run: {why})"
    if jax.process_count() == 1:
        return "the local exchange (pencilfft's custom call, one pass; exchange='auto' and 'local')"
    if mixed.auto(platform):
        return ("the local exchange, along the mesh axes whose devices are all in this process "
                "(exchange='auto' takes 'mixed')")
    return "XLA's collectives (exchange='auto' takes 'mixed' only with several devices per process)"
