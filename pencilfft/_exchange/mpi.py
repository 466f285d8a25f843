"""The exchange through MPI inside XLA: CPU processes under mpirun or srun.

jax's cross-process CPU collectives go through gloo over TCP; MPI moves the same bytes through
shared memory (one node) or the cluster's fabric, several times faster (benchmarks/RESULTS.md,
issues 14 and 37).  This exchange is a custom call of our own (`mpi.cc`, compiled on first
use with the MPI compiler wrapper that mpi4py was built with, `_native.load`): XLA hands it the
chunk-major block (n, ...) in its own buffers and it sends chunk j to peer j with MPI_Isend /
MPI_Irecv, with no copy to or from the host and no Python in the loop.

It is a primitive so that jit, grad, jvp, vmap and scan see a linear map: the exchange of
chunk-major blocks is its own transpose (chunk j of device i goes to slot i of device j, and
back), and a batch axis rides along behind the chunk axis.  Its CPU lowering is the custom
call; on any other platform it lowers to XLA's all_to_all (it is only chosen on CPUs).

Who the peers are is decided when the per-device body is traced, where pencilfft knows the
mesh (`in_mesh`: shard_map's, or the one XLA's partitioner hands the compiler-partitioned
transform): the world ranks of the processes of every group of devices that exchange together
(same coordinates on every other mesh axis), ordered by coordinate along the exchanged axis.
The whole table is an attribute, so every process compiles the same program and finds its own
group in it (jax's process index must be the MPI rank: `pencilfft.initialize` makes it so).
An Explicit-typed array under jit gives only an abstract mesh, which names no devices: then
the mesh of `jax.set_mesh`, else `jax.make_mesh`'s order (`_common.concrete`); the handler
checks its own place in the table against jax's axis_index, so a wrong guess fails, never
mixes data.  A process may hold several devices of a group ("mixed" sends through this along
the axes that span processes): every message between two devices carries a tag of its own,
the pair's, so the messages of the devices of one process are never matched with each other.

Ordering (see mpi.cc): every exchange of a compiled program has an MPI tag of its own,
and the handler is asynchronous (it posts its messages and returns a future that a progress
thread completes), so exchanges that XLA runs in different orders on different processes are
never matched with each other and never wait for each other.  The tag is given to each call of
the compiled program when XLA instantiates it (two uses of one jitted function that jax lowered
once are two calls there), from the call's `key` (a hash of its shapes and peers, `_key`) and
its number among the calls of that key compiled so far (and, for each message, the pair of
devices: `mpi.cc`'s `Tag`): every process must compile the same programs in the same
order, as SPMD code does.
"""
from __future__ import annotations

import ctypes
import functools
import pathlib
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._native import build as _native
from .._processes.launch import running_mpi, srun_mpi_hint
from .._jax_private import invariant_over
from .._processes import agree
from ._common import (check_number_setting, concrete, coordinates, def_linear, process_groups,
                      traced_mesh)

__all__ = ["after", "allreduce", "available", "exchange", "exchange_start", "exchange_wait",
           "shift", "status", "unavailable_reason"]

TARGET = "pencilfft_mpi_exchange"
SHIFT_TARGET = "pencilfft_mpi_shift"  # halo_exchange's neighbour sends
ALLREDUCE_TARGET = "pencilfft_mpi_allreduce"  # power_spectrum's sum over processes
START_TARGET = "pencilfft_mpi_exchange_start"  # a pipelined stage's exchange, posted...
WAIT_TARGET = "pencilfft_mpi_exchange_wait"  # ... and completed after the next piece's work
AFTER_TARGET = "pencilfft_mpi_after"  # x, ordered after other values (the pipeline's steps)

INSTANCE_TYPE = "pencilfft_mpi_instance"  # the FFI state holding each call's MPI tag


# ----------------------------------------------------------------------------------------------
# Building and loading the handler


@functools.cache
def _library():
    """The handler's library, built once per machine and environment and registered with
    XLA; a string (the compiler's message) if it could not be built, after one warning."""
    try:
        lib = _native.load(pathlib.Path(__file__).with_name("mpi.cc"), mpi=True)
    except _native.BuildError as e:
        warnings.warn(f"pencilfft: the MPI exchange could not be built, cross-process exchanges "
                      f"use jax's gloo collectives instead (docs: howto/cpu-layouts): {e}",
                      RuntimeWarning, stacklevel=4)
        return f"its handler could not be built ({str(e).splitlines()[0]})"
    instantiate = "PencilfftMpiInstantiate"
    return _native.register(lib, {TARGET: (instantiate, "PencilfftMpiExchange"),
                                  SHIFT_TARGET: (instantiate, "PencilfftMpiShift"),
                                  START_TARGET: (instantiate, "PencilfftMpiExchangeStart"),
                                  WAIT_TARGET: "PencilfftMpiExchangeWait",
                                  AFTER_TARGET: "PencilfftAfter",
                                  ALLREDUCE_TARGET: (instantiate, "PencilfftMpiAllReduce")},
                            INSTANCE_TYPE)


def _load() -> str | None:
    """None if the handler is built and registered, else why not (and a bad setting of its
    own refused: `_common.check_number_setting`)."""
    check_number_setting("PENCILFFT_MPI_POLL_US", whole=True,
                         meaning="the MPI progress thread's interval in microseconds")
    lib = _library()
    return lib if isinstance(lib, str) else None


# ----------------------------------------------------------------------------------------------
# Where it runs


def unavailable_reason(mesh_size: int | None, platform: str) -> str | None:
    """Why the MPI exchange cannot run for a mesh of `mesh_size` devices (None: the mesh is
    not known yet), or None if it can.  The same answer on every process of a job."""
    if platform != "cpu":
        return f"it runs on CPU devices only (the devices are {platform})"
    mpi = running_mpi()  # never started as a side effect of choosing it
    # srun without an MPI plug-in: jax spans the tasks, MPI cannot (each task alone).
    hint = srun_mpi_hint()
    if mpi is None:
        return hint or "MPI is not running in this process (start it with pencilfft.initialize())"
    nproc, size = jax.process_count(), mpi.COMM_WORLD.Get_size()
    if nproc != size:
        return f"jax has {nproc} processes but MPI.COMM_WORLD has {size} ranks" + (
            f": {hint}" if hint else "")
    if jax.process_index() != mpi.COMM_WORLD.Get_rank():
        return (f"jax's process index ({jax.process_index()}) is not the MPI rank "
                f"({mpi.COMM_WORLD.Get_rank()}); start jax with pencilfft.initialize()")
    lib = _library()
    if isinstance(lib, str):
        return lib
    if lib.pencilfft_mpi_thread_multiple() != 1:
        return ("MPI was started without MPI_THREAD_MULTIPLE, which its progress thread needs "
                "(mpi4py asks for it unless mpi4py.rc.thread_level says otherwise)")
    return None


def available(mesh_size: int | None, platform: str) -> bool:
    return unavailable_reason(mesh_size, platform) is None


def auto(platform: str, mesh=None) -> bool:
    """Whether "auto" sends through it: across processes on CPUs, whenever MPI runs and the
    handler is built (a failed build warns once and leaves gloo).  The transforms' exchanges
    take "mixed" instead where the processes hold several devices each (`_exchange.mixed`);
    halo_exchange's sends, power_spectrum's sum and the painters' take this whatever the
    devices.  Where `mesh` holds the devices of several processes, their answers are compared
    (`agree.same`): one process sending through MPI and another through gloo would wait for
    each other forever, so that is one error on every process instead."""
    why = unavailable_reason(None, platform) if jax.process_count() > 1 else "one process"
    if agree.spans_processes(mesh):
        agree.same({"sends through MPI inside XLA": why is None}, "how to send between processes",
                   settings={"why not": why})
    return why is None


def status(platform: str | None = None) -> str:
    """One line for `pencilfft check`: which transport the cross-process exchanges use, and
    why."""
    platform = platform or jax.default_backend()
    if jax.process_count() == 1:
        return "one process: exchanges stay inside XLA (no cross-process transport)"
    why = unavailable_reason(None, platform)
    if why is None:
        return "MPI inside XLA (pencilfft's custom call; exchange='auto' and 'mpi')"
    kind = "gloo" if platform == "cpu" else "XLA's collectives"
    return f"{kind} (the MPI exchange does not run: {why})"


# ----------------------------------------------------------------------------------------------
# The primitive


def exchange(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    """Inside shard_map: the all_to_all of a chunk-major block (n, ...) over mesh axis
    `axis_name` (per-device; chunk j to peer j; the result's chunk j came from peer j)."""
    mesh = concrete(traced_mesh())
    return exchange_p.bind(y, coordinates(mesh, axis_name), groups=process_groups(mesh, axis_name), n=n,
                           axis_name=axis_name)


def exchange_start(y: jax.Array, axis_name: str, n: int, into: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Inside shard_map: `exchange`'s messages posted, not awaited: (a token, the block being
    sent (`y`'s buffer itself), the block being received into (`into`'s buffer itself: a
    block of y's shape and dtype the caller is done with; its values are not read)).  Give
    all three to `exchange_wait`, with the work to overlap between the two calls: both blocks
    are in MPI's hands until then (the wait holds them alive; nothing else may use them).  Not
    differentiable by itself: a pipelined stage differentiates through the plain `exchange`
    (`_transforms.chunks`)."""
    mesh = concrete(traced_mesh())
    return start_p.bind(y, coordinates(mesh, axis_name), into,
                        groups=process_groups(mesh, axis_name), n=n, axis_name=axis_name)


def exchange_wait(token: jax.Array, sent: jax.Array, received: jax.Array) -> jax.Array:
    """The block `exchange_start` received into, once its messages are in (the same result as
    `exchange` of `sent`)."""
    return wait_p.bind(token, sent, received)


def after(x: jax.Array, *deps: jax.Array) -> jax.Array:
    """`x` itself, computed only once every one of `deps` is (an order XLA keeps between work
    that shares no data: XLA:CPU drops `optimization_barrier`s before it schedules).  No copy:
    the result is `x`'s buffer.  On CPUs (the pipelined MPI exchange)."""
    return after_p.bind(x, *deps)


def shift(y: jax.Array, axis_name: str, n: int, by: int, periodic: bool) -> jax.Array:
    """Inside shard_map: every device's block y goes to the device `by` positions further
    along mesh axis `axis_name` (a ppermute; per-device shapes unchanged).  Along a
    non-periodic axis the devices with nobody `by` positions before them get zeros."""
    mesh = concrete(traced_mesh())
    return shift_p.bind(y, coordinates(mesh, axis_name), groups=process_groups(mesh, axis_name), n=n,
                        axis_name=axis_name, by=by, periodic=periodic)


def allreduce(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    """Inside shard_map: the sum of y over mesh axis `axis_name` (a psum; float or complex),
    the same bits on every device."""
    mesh = concrete(traced_mesh())
    return allreduce_p.bind(y, coordinates(mesh, axis_name), groups=process_groups(mesh, axis_name), n=n,
                            axis_name=axis_name)


exchange_p = Primitive(TARGET)


def _abstract_eval(y, where, **params):
    del where, params
    return y  # same shape, dtype and varying manual axes


def _key(ctx, target: str, **params) -> np.int64:
    """The same number on every process for calls with the same target, block and peers (not
    Python's hash: salted per process).  mpi.cc numbers the compiled calls of one key and
    makes their MPI tags from both."""
    (aval, *_) = ctx.avals_in
    text = repr((target, aval.shape, str(aval.dtype), sorted(params.items())))
    return np.int64(zlib.crc32(text.encode()))


def instantiated() -> list[tuple[int, int, int]]:
    """(key, number, MPI tag) of every call (exchange, shift, sum) compiled so far in this
    process, oldest first (for the tests)."""
    lib = _library()
    if isinstance(lib, str):
        return []
    lib.pencilfft_mpi_instances.restype = ctypes.c_int64
    count = lib.pencilfft_mpi_instances(None, ctypes.c_int64(0))
    out = np.zeros(3 * count, np.int64)
    lib.pencilfft_mpi_instances(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(count))
    return [tuple(int(v) for v in row) for row in out.reshape(-1, 3)]


def poll_interval_us(us: int | None = None) -> int:
    """The MPI progress thread's interval between two tests of a pipelined exchange that
    nothing waits on yet, in microseconds (PENCILFFT_MPI_POLL_US, default 200; 0 spins); with
    `us`, set to it (for the benchmarks).  Returns the interval before."""
    lib = _library()
    if isinstance(lib, str):
        raise RuntimeError(f"pencilfft's MPI exchange is not available: {lib}")
    lib.pencilfft_mpi_poll_us.restype = ctypes.c_int64
    lib.pencilfft_mpi_poll_us.argtypes = [ctypes.c_int64]
    return int(lib.pencilfft_mpi_poll_us(-1 if us is None else max(int(us), 0)))


def _cpu_lowering(target: str, what: str, attrs=lambda **params: {}):
    """The CPU lowering of one of our primitives: the custom call `target` with the peers, the
    call's key, and `attrs(**params)` (the primitive's own parameters the handler needs)."""
    def lower(ctx, y, where, *, groups, n, axis_name, **params):
        del axis_name
        why = _load()
        if why is not None:
            raise ValueError(f"{what} cannot run here: {why}")
        return jax.ffi.ffi_lowering(target, has_side_effect=True)(
            ctx, y, where, n=np.int64(n), **attrs(**params),
            key=_key(ctx, target, groups=groups, n=n, **params),
            ranks=np.asarray(groups, np.int32).reshape(-1))
    return lower


def _lower_other(y, where, *, groups, n, axis_name):
    del where, groups, n  # XLA's collective, on platforms our custom call does not exist on
    return jax.lax.all_to_all(y, axis_name, 0, 0, tiled=True)


def _batch(args, dims, **params):
    (y, where), (d, dwhere) = args, dims
    if dwhere is not None:
        raise NotImplementedError("internal: the MPI exchange's coordinates are never batched")
    y = jnp.moveaxis(y, d, 1)  # behind the chunk axis: every chunk carries the whole batch
    return exchange_p.bind(y, where, **params), 1


exchange_p.def_abstract_eval(_abstract_eval)
def_linear(exchange_p, exchange_p.bind)  # the chunk-major all-to-all is its own transpose
batching.primitive_batchers[exchange_p] = _batch
mlir.register_lowering(exchange_p, _cpu_lowering(TARGET, "`exchange`='mpi'"), platform="cpu")
mlir.register_lowering(exchange_p, mlir.lower_fun(_lower_other, multiple_results=False))


# ----------------------------------------------------------------------------------------------
# The shift (halo_exchange's neighbour sends): linear, its transpose the shift back


shift_p = Primitive(SHIFT_TARGET)


def _lower_shift_other(y, where, *, groups, n, axis_name, by, periodic):
    del where, groups  # XLA's collective, on platforms our custom call does not exist on
    pairs = [(j, (j + by) % n) for j in range(n) if periodic or 0 <= j + by < n]
    return jax.lax.ppermute(y, axis_name, pairs)


def _batch_whole(prim: Primitive):
    """The batching rule of a primitive that moves or sums the whole block: the batch axis
    rides along where it is."""
    def rule(args, dims, **params):
        (y, where), (d, dwhere) = args, dims
        if dwhere is not None:
            raise NotImplementedError(f"internal: {prim.name}'s coordinates are never batched")
        return prim.bind(y, where, **params), d
    return rule


shift_p.def_abstract_eval(_abstract_eval)
def_linear(shift_p, lambda ct, where, by, **params: shift_p.bind(ct, where, by=-by, **params))
batching.primitive_batchers[shift_p] = _batch_whole(shift_p)
mlir.register_lowering(shift_p, _cpu_lowering(
    SHIFT_TARGET, "the MPI halo exchange",
    lambda by, periodic: {"shift": np.int64(by), "periodic": bool(periodic)}), platform="cpu")
mlir.register_lowering(shift_p, mlir.lower_fun(_lower_shift_other, multiple_results=False))


# ----------------------------------------------------------------------------------------------
# The sum over processes (power_spectrum's reduction): linear, its transpose psum's (the
# cotangent, the same on every device, goes back to each device's block as it is).


allreduce_p = Primitive(ALLREDUCE_TARGET)


def _lower_allreduce_other(y, where, *, groups, n, axis_name):
    del where, groups, n  # XLA's collective, on platforms our custom call does not exist on
    return jax.lax.psum(y, axis_name)


def _varying(x, axis_name: str):
    """x, typed as differing along `axis_name` (what psum's transpose gives shard_map)."""
    try:
        return jax.lax.pcast(x, axis_name, to="varying")
    except ValueError:  # already varying there
        return x


def _allreduce_abstract_eval(y, where, *, axis_name, **params):
    del where, params
    return invariant_over(y, axis_name)  # the same on every device of the axis, as psum's


allreduce_p.def_abstract_eval(_allreduce_abstract_eval)
def_linear(allreduce_p, lambda ct, where, *, axis_name, **params: _varying(ct, axis_name))
batching.primitive_batchers[allreduce_p] = _batch_whole(allreduce_p)
mlir.register_lowering(allreduce_p, _cpu_lowering(ALLREDUCE_TARGET, "the MPI reduction"),
                       platform="cpu")
mlir.register_lowering(allreduce_p, mlir.lower_fun(_lower_allreduce_other,
                                                   multiple_results=False))


# ----------------------------------------------------------------------------------------------
# The pipelined exchange (issue 66): `exchange` in two calls, the next piece's work between them.
# On CPUs only (the "mpi" exchange runs nowhere else); under vmap the batch rides behind the
# chunk axis, as for `exchange`.


start_p = Primitive(START_TARGET)
start_p.multiple_results = True
wait_p = Primitive(WAIT_TARGET)


def _start_abstract_eval(y, where, into, **params):
    del where, params
    if (into.shape, into.dtype) != (y.shape, y.dtype):
        raise ValueError(f"internal: the MPI exchange receives into a {into.str_short()} block "
                         f"for a {y.str_short()} one")
    return y.update(shape=(1,), dtype=np.dtype(np.int32)), y, into


def _start_batch(args, dims, **params):
    (y, where, into), (d, dwhere, dinto) = args, dims
    if dwhere is not None:
        raise NotImplementedError("internal: the MPI exchange's coordinates are never batched")
    y = jnp.moveaxis(y, d, 1)  # (the chunk index stays first: it is what is exchanged)
    if dinto is None:
        into = jnp.broadcast_to(into[:, None], y.shape)  # (values not read: any block does)
    else:
        into = jnp.moveaxis(into, dinto, 1)
    return start_p.bind(y, where, into, **params), (None, 1, 1)


def _wait_batch(args, dims):
    token, sent, received = args
    dtoken, dsent, dreceived = dims
    if dtoken is not None or dsent != 1 or dreceived != 1:
        raise NotImplementedError("internal: a pipelined exchange batched unlike its start")
    return wait_p.bind(token, sent, received), 1


def _lower_start(ctx, y, where, into, *, groups, n, axis_name):
    del axis_name
    why = _load()
    if why is not None:
        raise ValueError(f"a pipelined `exchange`='mpi' cannot run here: {why}")
    return jax.ffi.ffi_lowering(START_TARGET, has_side_effect=True,
                                operand_output_aliases={0: 1, 2: 2})(
        ctx, y, where, into, n=np.int64(n), key=_key(ctx, START_TARGET, groups=groups, n=n),
        ranks=np.asarray(groups, np.int32).reshape(-1))


start_p.def_abstract_eval(_start_abstract_eval)
batching.primitive_batchers[start_p] = _start_batch
mlir.register_lowering(start_p, _lower_start, platform="cpu")
wait_p.def_abstract_eval(lambda token, sent, received: received)
batching.primitive_batchers[wait_p] = _wait_batch
# The result is the received buffer itself: nothing is copied, and the wait checks it.
mlir.register_lowering(wait_p, jax.ffi.ffi_lowering(WAIT_TARGET, has_side_effect=True,
                                                    operand_output_aliases={2: 0}),
                       platform="cpu")


after_p = Primitive(AFTER_TARGET)


def _after_batch(args, dims):
    x, *deps = args
    return after_p.bind(x, *deps), dims[0]


def _lower_after(ctx, x, *deps):
    why = _load()
    if why is not None:
        raise ValueError(f"a pipelined `exchange`='mpi' cannot run here: {why}")
    return jax.ffi.ffi_lowering(AFTER_TARGET, operand_output_aliases={0: 0})(ctx, x, *deps)


after_p.def_abstract_eval(lambda x, *deps: x)
batching.primitive_batchers[after_p] = _after_batch
mlir.register_lowering(after_p, _lower_after, platform="cpu")
