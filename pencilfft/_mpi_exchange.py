"""The exchange through MPI: for CPU processes with one jax device each (mpirun, one rank a core).

jax's cross-process CPU collectives go through gloo over TCP; between processes of one node MPI
moves the same bytes through shared memory, 6-14x faster (benchmarks/RESULTS.md, issue 14).
This exchange hands the per-device block to the host (an ordered `io_callback`), where mpi4py
sends chunk j to peer j and receives the peers' chunks in their place, and gives the result back
to XLA.  It is a primitive so that jit, grad, jvp, vmap and scan see a linear map: the exchange
of chunk-major blocks is its own transpose (chunk j of device i goes to slot i of device j, and
back), and a batch axis rides along behind the chunk axis.

The ordered effect makes every process run its exchanges in program order, so the messages of
two independent exchanges in one program can never be matched with each other across ranks.
Who the peers are is learnt when the exchange runs: every process says its coordinates along the
exchanged mesh axis and the other one (a small Allgather over COMM_WORLD), so no mapping between
jax process ids and MPI ranks is assumed.  That needs every process of COMM_WORLD to take part,
which `available` checks: one device per process, the mesh spanning all of them.
"""
from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ._jax_private import needs_devices_when_lowered

__all__ = ["available", "exchange", "unavailable_reason"]

# Point-to-point messages of the exchange carry this tag, apart from pencilfft's scatter/gather
# and from anything the user's own code sends on COMM_WORLD.
_TAG = 0x5046  # "PF"


def unavailable_reason(mesh_size: int, platform: str) -> str | None:
    """Why the MPI exchange cannot run for a mesh of `mesh_size` devices, or None if it can.

    It does not import mpi4py: MPI must already have been started (by `pencilfft.initialize`,
    jax's mpi4py cluster detection or the user), so that choosing it never starts MPI as a side
    effect and every process of the job decides alike.
    """
    if platform != "cpu":
        return f"it runs on CPU devices only (the devices are {platform})"
    module = sys.modules.get("mpi4py.MPI")
    if module is None or not module.Is_initialized() or module.Is_finalized():
        return "MPI is not running in this process (start it with pencilfft.initialize())"
    nproc, size = jax.process_count(), module.COMM_WORLD.Get_size()
    if nproc != size:
        return f"jax has {nproc} processes but MPI.COMM_WORLD has {size} ranks"
    if jax.local_device_count() != 1:
        return f"it needs one device per process (this process has {jax.local_device_count()})"
    if mesh_size != nproc:
        return f"the mesh ({mesh_size} devices) must span all {nproc} processes"
    return None


def available(mesh_size: int, platform: str) -> bool:
    return unavailable_reason(mesh_size, platform) is None


def exchange(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    """Inside shard_map: the all_to_all of a chunk-major block (n, ...) over mesh axis
    `axis_name` (chunk j to peer j; the result's chunk j came from peer j).

    The devices that exchange together are those that share their coordinates along every
    other mesh axis (the other pencil axis and any batch axes, which the shard_map's mesh
    names): their flat index over those axes tells the groups apart."""
    mesh = jax.sharding.get_abstract_mesh()
    group = 0
    for name, size in zip(mesh.axis_names, mesh.axis_sizes):
        if name != axis_name:
            group = group * size + jax.lax.axis_index(name)
    where = jnp.stack([jnp.asarray(jax.lax.axis_index(axis_name), jnp.int32),
                       jnp.asarray(group, jnp.int32)])
    return exchange_p.bind(y, where, n=n)


def _host_exchange(y: np.ndarray, where: np.ndarray, *, n: int) -> np.ndarray:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    table = np.empty((comm.Get_size(), 2), np.int32)
    comm.Allgather(np.ascontiguousarray(where, np.int32), table)
    i, group = int(where[0]), int(where[1])
    peers = [-1] * n
    for rank, (pos, g) in enumerate(table):
        if g == group:
            peers[pos] = rank
    y = np.ascontiguousarray(y)
    out = np.empty_like(y)
    out[i] = y[i]  # one's own chunk stays
    requests = [comm.Irecv(out[(i - s) % n], source=peers[(i - s) % n], tag=_TAG)
                for s in range(1, n)]
    requests += [comm.Isend(y[(i + s) % n], dest=peers[(i + s) % n], tag=_TAG)
                 for s in range(1, n)]
    MPI.Request.Waitall(requests)
    return out


# ----------------------------------------------------------------------------------------------
# The primitive


exchange_p = Primitive("pencilfft_mpi_exchange")


@functools.cache
def _effects():
    """The effects of an ordered io_callback, read off a traced one (their type is private)."""
    def probe():
        return io_callback(lambda: np.int32(0), jax.ShapeDtypeStruct((), np.int32), ordered=True)
    effects = jax.make_jaxpr(probe)().effects
    if not effects:
        raise RuntimeError("internal: an ordered io_callback shows no effect on this jax")
    return effects


def _abstract_eval(y, where, *, n):
    del where, n
    return y, _effects()  # same shape, dtype and varying manual axes (inside shard_map)


def _lower(y, where, *, n):
    return io_callback(functools.partial(_host_exchange, n=n),
                       jax.ShapeDtypeStruct(y.shape, y.dtype), y, where, ordered=True)


def _jvp(primals, tangents, *, n):
    (y, where), (dy, _) = primals, tangents
    out = exchange_p.bind(y, where, n=n)
    if type(dy) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    return out, exchange_p.bind(dy, where, n=n)


def _transpose(ct, y, where, *, n):
    if type(ct) is ad.Zero:
        return ad.Zero(y.aval), None
    return exchange_p.bind(ct, where, n=n), None


def _batch(args, dims, *, n):
    (y, where), (dy, dwhere) = args, dims
    if dwhere is not None:  # not mapped
        raise NotImplementedError("internal: the MPI exchange's coordinates are never batched")
    y = jnp.moveaxis(y, dy, 1)  # behind the chunk axis: every chunk carries the whole batch
    return exchange_p.bind(y, where, n=n), 1


exchange_p.def_effectful_abstract_eval(_abstract_eval)
ad.primitive_jvps[exchange_p] = _jvp
ad.primitive_transposes[exchange_p] = _transpose
batching.primitive_batchers[exchange_p] = _batch
mlir.register_lowering(exchange_p, mlir.lower_fun(_lower, multiple_results=False),
                       cacheable=False)
needs_devices_when_lowered(exchange_p)  # io_callback's lowering needs the devices
