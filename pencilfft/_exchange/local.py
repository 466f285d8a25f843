"""The pencil transpose between the CPU devices of one process, in one pass (exchange="local").

XLA's all_to_all between devices of one process copies the chunks out, through per-peer
buffers and back into one block, and the transpose around it (`_transforms.transpose`) adds two local
passes: on 8 CPU devices the exchange was the costliest step of a slab transform
(benchmarks/RESULTS.md, issue 36).  The devices of one process share its memory, so this
custom call (`local.cc`, compiled on first use with the C++ compiler found then,
`_native.load`) writes every device's transposed block straight from its peers' blocks: the
split, the exchange, the concatenation and the reordering `order` in one pass.

It is a primitive so that jit, grad, jvp, vmap and scan see a linear map: its jvp is itself,
its transpose the inverse exchange (split what was gathered, gather what was split, undo
`order`), and vmap's batch joins the block's axis 0 (or rides along in front).  Its CPU
lowering is the custom call; on any other platform it lowers to the all_to_all and transpose it replaces (it is only chosen on
CPUs).

A run of these exchanges with nothing between them (an N-D route's) is one pass too:
`reshard`, the same rendezvous with a table of boxes instead of one chunk per peer.

The devices of one call meet by XLA's run id, and never wait in silence (`local.cc`): a round
that some device never reaches fails after PENCILFFT_LOCAL_TIMEOUT seconds (600 by default),
or in a one-process job after half of that (20 s by default) in which no thread of the process
ran, saying which devices waited for which, and why that happens: XLA's CPU client runs each
device's part of a call on one of max(cores, devices) threads, and a call dispatched 32 calls
ahead of the results waits on one of them, so a loop that never waits for its results can hold
every thread while some devices of an earlier call have not started (issue 68; XLA's own
all_to_all hangs the same way, and aborts the process after 40 s).

"auto" takes it on CPUs when the job is one process (every device of every exchange is then
in this process) and a C++ compiler is found; a compiler that fails warns once and leaves
XLA's collectives.  The plain install never needs a compiler.
"""
from __future__ import annotations

import functools
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from .._native import build as _native, malloc as _malloc, threads as _threads
from ._common import (check_number_setting, coordinates, def_linear, traced_mesh,
                      within_processes)

__all__ = ["auto", "build_failure", "exchange", "ready_to_lower", "unavailable_reason", "TARGET"]

TARGET = "pencilfft_local_exchange"
RESHARD_TARGET = "pencilfft_local_reshard"  # several exchanges in one pass (`reshard`)
INSTANCE_TYPE = "pencilfft_local_instance"  # the FFI state where a call's devices meet


@functools.cache
def _library():
    """The handler's library, built once per machine and environment and registered with
    XLA; a string (why not) if it could not be had, after one warning if it failed."""
    missing = _native.missing_compiler()
    if missing is not None:
        return missing
    try:
        lib = _native.load(pathlib.Path(__file__).with_name("local.cc"))
        return _native.register(lib, {TARGET: ("PencilfftLocalInstantiate",
                                               "PencilfftLocalExchange"),
                                      RESHARD_TARGET: ("PencilfftLocalInstantiate",
                                                       "PencilfftLocalReshard")}, INSTANCE_TYPE)
    except (_native.BuildError, AttributeError, OSError, jax.errors.JaxRuntimeError) as e:
        warnings.warn(f"pencilfft: the local exchange could not be built or loaded, exchanges "
                      f"between the devices of this process use XLA's collectives instead (docs: "
                      f"CPU performance): {e}", RuntimeWarning, stacklevel=4)
        return f"its handler could not be built or loaded ({str(e).splitlines()[0]})"


def build_failure() -> str | None:
    """Why the handler cannot be had (no compiler, a failed build), or None: it is built."""
    lib = _library()
    return lib if isinstance(lib, str) else None


def unavailable_reason(mesh_size: int | None, platform: str) -> str | None:
    """Why the local exchange cannot run (None: it can).  The same answer on every process.
    In a job of several processes it runs only along mesh axes whose devices are all in one
    process (checked where the body is traced, `exchange`)."""
    if platform != "cpu":
        return f"it runs on CPU devices only (the devices are {platform})"
    return build_failure()


def auto(platform: str) -> bool:
    """Whether exchange="auto" takes it: one process on CPUs, with the handler built (several
    processes of several devices take "mixed", which uses it along axes inside processes)."""
    return jax.process_count() == 1 and unavailable_reason(None, platform) is None


# ----------------------------------------------------------------------------------------------
# The primitive


def exchange(x: jax.Array, axis_name: str, n: int, split: int, gather: int,
             order: tuple[int, ...]) -> jax.Array:
    """Inside shard_map: `_transforms.transpose.transpose_blocks` of per-device block x over mesh axis
    `axis_name` of n devices (chunk j of axis `split` to peer j, the chunks received
    concatenated along `gather` in peer order, then the axes in `order`)."""
    mesh = traced_mesh()
    if jax.process_count() > 1 and not within_processes(mesh, axis_name):
        raise ValueError(f"`exchange`='local' cannot run along mesh axis {axis_name!r}: its "
                         f"devices are in several processes (exchange='mixed' or 'auto' sends "
                         f"those through MPI)")
    return exchange_p.bind(x, coordinates(mesh, axis_name), n=n, split=split,
                           gather=gather, order=tuple(order), axis_name=axis_name)


exchange_p = Primitive(TARGET)


def _out_shape(shape, n, split, gather, order):
    chunked = list(shape)
    chunked[split] //= n
    chunked[gather] *= n
    return tuple(chunked[ax] for ax in order)


def _abstract_eval(x, where, *, n, split, gather, order, axis_name):
    del where, axis_name
    return x.update(shape=_out_shape(x.shape, n, split, gather, order))


def _inverse(ct, where, *, n, split, gather, order, axis_name):
    inv = tuple(order.index(i) for i in range(len(order)))
    return exchange_p.bind(ct, where, n=n, split=order.index(gather), gather=order.index(split),
                           order=inv, axis_name=axis_name)


def _batch(args, dims, *, n, split, gather, order, axis_name):
    (x, where), (d, dwhere) = args, dims
    if dwhere is not None:
        raise NotImplementedError("internal: the local exchange's coordinates are never batched")
    x = jnp.moveaxis(x, d, 0)
    params = dict(n=n, split=split, gather=gather, order=order, axis_name=axis_name)
    if order[0] == 0 and 0 not in (split, gather):
        # Axis 0 stays where it is (the stages' blocks: it is their batch axis): the batch
        # joins it, a free reshape, and the block keeps its rank however deep the vmaps.
        y = exchange_p.bind(x.reshape((-1,) + x.shape[2:]), where, **params)
        return y.reshape(x.shape[:2] + y.shape[1:]), 0
    return exchange_p.bind(x, where, n=n, split=split + 1, gather=gather + 1,
                           order=(0, *(ax + 1 for ax in order)), axis_name=axis_name), 0


def ready_to_lower() -> None:
    """What both custom calls' CPU lowerings do first: refuse if the handler cannot run, tell
    the handler how many processes the job has (only in a one-process job does "no thread of
    this process runs" mean that missing devices are not on their way: its watchdog then fails
    a round after half of PENCILFFT_LOCAL_TIMEOUT, 20 s by default, see `local.cc`), and set up
    glibc's malloc (`_malloc`)."""
    why = unavailable_reason(None, "cpu")
    if why is not None:
        raise ValueError(f"`exchange`='local' cannot run here: {why}")
    check_number_setting("PENCILFFT_LOCAL_TIMEOUT", whole=False,
                         meaning="how many seconds a round of the exchange may wait (0: 600)")
    _library().pencilfft_local_job(jax.process_count())  # fixed once jax's backend is up
    _malloc.configure()  # glibc keeps freed memory: fresh blocks do not fault (`_malloc`)


def _cpu_lowering(ctx, x, where, *, n, split, gather, order, axis_name):
    del axis_name
    ready_to_lower()
    # threads: the copying pool's size, every core of the process (one round is all devices')
    return jax.ffi.ffi_lowering(TARGET)(  # a pure map: XLA may merge or drop it
        ctx, x, where, n=np.int64(n), split=np.int64(split), gather=np.int64(gather),
        order=np.asarray(order, np.int64), threads=np.int64(_threads.available_cores()))


def _lower_other(x, where, *, n, split, gather, order, axis_name):
    del where, n  # XLA's collective, on platforms our custom call does not exist on
    return jnp.transpose(jax.lax.all_to_all(x, axis_name, split, gather, tiled=True), order)


exchange_p.def_abstract_eval(_abstract_eval)
def_linear(exchange_p, _inverse)  # its transpose: the inverse exchange
batching.primitive_batchers[exchange_p] = _batch
mlir.register_lowering(exchange_p, _cpu_lowering, platform="cpu")
mlir.register_lowering(exchange_p, mlir.lower_fun(_lower_other, multiple_results=False))
