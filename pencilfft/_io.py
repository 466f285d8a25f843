"""Moving whole arrays in and out of a distributed jax.Array: MPI scatter/gather and .npy files.

* `scatter(data, mesh)`: a numpy array held by one process -> a global array in the real-space
  sharding; every process receives only the blocks of its own devices.
* `gather(x)`: any global array -> one numpy array on one process.
* `save(path, x)` / `load(path, mesh)`: a standard .npy file that every process writes or reads
  its own blocks of, through a memory map (needs a file system all processes see).

Device ownership comes from jax (`device.process_index`), messages go through MPI: the jax
process index of each MPI rank is exchanged once per call.  Every call first makes all
processes agree on whether the input is valid (a small allgather), so that bad input raises
the same exception on every process instead of leaving some of them waiting in a transfer.
With a single jax process no MPI is needed (mpi4py is not even imported).
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, Sharding

from ._sharding import _mesh_axes, real_space_sharding

__all__ = ["scatter", "gather", "save", "load"]

# Largest MPI message in bytes.  MPI counts are C ints (2**31 - 1), and not every MPI/mpi4py
# combination has the large-count API, so blocks are sent as byte chunks of at most this size.
# Tests lower it (monkeypatch) to exercise the chunking with small arrays.
MAX_MESSAGE_BYTES = 1 << 30

# Dtypes the transforms accept as input (integers are promoted): signed/unsigned integers,
# floats and complex numbers.  bool, object, strings, datetimes and void records are refused.
_FFT_KINDS = "iufc"
# Dtypes `save` writes: those plus bool (what a .npy file can describe without pickling).
_SAVE_KINDS = "biufc"

_TAG = 17  # all transfers of a call run on a private duplicate of the communicator

# Exceptions carried between processes by type name; anything else arrives as RuntimeError.
_EXCEPTIONS = {
    e.__name__: e
    for e in (ValueError, TypeError, FileNotFoundError, IsADirectoryError, PermissionError,
              OSError, RuntimeError)
}

Key = tuple[tuple[int, int], ...]  # a block: (start, stop) per global axis


# ------------------------------------------------------------------------------ public API


def scatter(data: np.ndarray | None, mesh: Mesh, *, root: int = 0, comm: Any = None) -> jax.Array:
    """Distribute a numpy array held by one process over `mesh` in the real-space sharding.

    Args:
      data: on rank `root`, the whole array, global shape (..., X, Y, Z) with X divisible by
        the first mesh axis and Y by the second (integer, float or complex dtype); `None` on
        every other rank.
      mesh: a 1-axis (slab) or 2-axis (pencil) mesh over the devices of all processes.
      root: the MPI rank holding `data`.
      comm: an mpi4py communicator with one rank per jax process; default `MPI.COMM_WORLD`
        when jax runs several processes, none needed with one.

    Returns:
      The global array, shape `data.shape`, sharded as `real_space_sharding(mesh, data.ndim)`.
      Each process receives exactly the blocks of its own devices (one message stream per
      distinct block); only `root` ever holds the whole array.
    """
    with _session(comm, root) as s:
        error, meta = None, None
        try:
            _check_mesh(mesh)
            if s.rank == root:
                if data is None:
                    raise ValueError(
                        f"`data` must be a numpy array on the root rank {root}; got None"
                    )
                data = np.asarray(data)
                _check_dtype(data.dtype, "`data`", _FFT_KINDS)
                _check_fits(data.shape, mesh, "`data`")
                meta = (data.shape, data.dtype.str)
            elif data is not None:
                raise ValueError(
                    f"`data` must be None on every rank but the root rank {root}; rank {s.rank} "
                    f"passed {_describe_value(data)}"
                )
        except Exception as e:  # noqa: BLE001 - every failure must reach every rank
            error = e
        shape, dtype_str = s.agree(error, meta, root=root)[root]
        dtype = np.dtype(dtype_str).newbyteorder("=")  # jax wants native byte order
        shape = tuple(shape)
        sharding = real_space_sharding(mesh, len(shape))

        # The distinct blocks each rank needs, in one order every rank computes alike.
        needs: dict[int, list[Key]] = {r: [] for r in range(s.size)}
        for device, index in _sorted_index_map(sharding, shape):
            r, key = s.rank_of_process[device.process_index], _key(index, shape)
            if key not in needs[r]:
                needs[r].append(key)

        blocks: dict[Key, np.ndarray] = {}
        if s.rank == root:
            for dest in range(s.size):
                if dest == root:
                    continue
                for key in needs[dest]:
                    # One contiguous send buffer at a time; a view when already contiguous.
                    _send(s.comm, np.ascontiguousarray(data[_slices(key)], dtype=dtype), dest)
            # device_put below copies, so the root's own blocks can stay views of `data`.
            blocks = {key: np.asarray(data[_slices(key)], dtype=dtype) for key in needs[root]}
        else:
            for key in needs[s.rank]:
                buf = np.empty(_block_shape(key), dtype)
                _recv(s.comm, buf, root)
                blocks[key] = buf
        return _assemble(shape, sharding, blocks)


def gather(x: jax.Array, *, root: int = 0, comm: Any = None) -> np.ndarray | None:
    """Collect a global array into one numpy array on rank `root`.

    Works for any sharding (real space, k space in either layout, replicated ...): each
    distinct block is sent once, by one process holding it (the root itself when it can).

    Args:
      x: the same global jax.Array on every process.
      root: the MPI rank that receives the array.
      comm: as in `scatter`.

    Returns:
      On `root` the whole array (global shape `x.shape`, dtype `x.dtype`); None elsewhere.
    """
    with _session(comm, root) as s:
        error, meta = None, None
        try:
            _check_jax_array(x, "x")
            meta = _global_description(x)
        except Exception as e:  # noqa: BLE001
            error = e
        _check_same(s.agree(error, meta, root=root), "x")
        owner = _owners(x, s, prefer=root)
        local = _local_shards(x)

        if s.rank != root:
            for key, r in owner.items():
                if r == s.rank:
                    _send(s.comm, np.ascontiguousarray(np.asarray(local[key].data)), root)
            return None
        out = np.empty(x.shape, x.dtype)
        for key, r in owner.items():
            if r == root:
                out[_slices(key)] = np.asarray(local[key].data)
            else:
                buf = np.empty(_block_shape(key), x.dtype)  # one receive buffer at a time
                _recv(s.comm, buf, r)
                out[_slices(key)] = buf
        return out


def save(path: str | os.PathLike, x: jax.Array, *, comm: Any = None) -> None:
    """Write a global array to a standard .npy file, each process writing its own blocks.

    Rank 0 creates the file (header and full size), then every process memory-maps it and
    writes the distinct blocks it owns (each block once).  All processes must see the same
    file system (local disk for one node; a parallel file system such as Lustre or GPFS
    for several).  The file holds the global array, shape `x.shape`, in C order; read it
    with `numpy.load` or `pencilfft.load`.
    """
    with _session(comm, 0) as s:
        error, meta = None, None
        try:
            path = _check_path(path)
            _check_jax_array(x, "x")
            _check_dtype(x.dtype, "`x`", _SAVE_KINDS)
            meta = (path, *_global_description(x))
        except Exception as e:  # noqa: BLE001
            error = e
        _check_same(s.agree(error, meta, root=0), "x and path")

        error = None
        if s.rank == 0:
            try:
                np.lib.format.open_memmap(path, mode="w+", dtype=x.dtype, shape=x.shape).flush()
            except Exception as e:  # noqa: BLE001
                error = e
        s.agree(error, None, root=0)  # also the barrier: the file exists for everyone now

        error = None
        owner = _owners(x, s, prefer=0)
        mine = [key for key, r in owner.items() if r == s.rank]
        try:
            if mine:
                local = _local_shards(x)
                mm = np.lib.format.open_memmap(path, mode="r+")
                if mm.shape != x.shape or mm.dtype != x.dtype:
                    raise RuntimeError(
                        f"rank {s.rank} opened {path!r} and found shape {mm.shape}, dtype "
                        f"{mm.dtype}, not the file rank 0 created (shape {x.shape}, dtype "
                        f"{x.dtype}): all processes need the same (shared) file system"
                    )
                for key in mine:
                    mm[_slices(key)] = np.asarray(local[key].data)
                mm.flush()
                del mm
        except FileNotFoundError as e:
            error = FileNotFoundError(
                f"rank {s.rank} cannot open {path!r}, which rank 0 created: all processes need "
                f"the same (shared) file system ({e})"
            )
        except Exception as e:  # noqa: BLE001
            error = e
        s.agree(error, None, root=0)  # the barrier after which the file is complete


def load(path: str | os.PathLike, mesh: Mesh, *, comm: Any = None) -> jax.Array:
    """Read a .npy file into a global array in the real-space sharding of `mesh`.

    Every process memory-maps the file and reads only the blocks of its own devices.  The
    array must have at least 3 dimensions (..., X, Y, Z), X divisible by the first mesh axis,
    Y by the second, and an integer, float or complex dtype.

    Returns:
      The global array, shape as in the file, sharded as `real_space_sharding(mesh, ndim)`.
    """
    with _session(comm, 0) as s:
        error, meta, mm = None, None, None
        try:
            _check_mesh(mesh)
            path = _check_path(path)
            mm = _open_npy(path)
            _check_dtype(mm.dtype, f"the array in {path!r}", _FFT_KINDS)
            _check_fits(mm.shape, mesh, f"the array in {path!r}")
            meta = (path, mm.shape, mm.dtype.str)
        except Exception as e:  # noqa: BLE001
            error = e
        _check_same(s.agree(error, meta, root=0), "path (and the file it names)")

        shape = tuple(mm.shape)
        dtype = mm.dtype.newbyteorder("=")
        sharding = real_space_sharding(mesh, len(shape))
        blocks: dict[Key, np.ndarray] = {}
        for index in sharding.addressable_devices_indices_map(shape).values():
            key = _key(index, shape)
            if key not in blocks:  # several local devices may hold the same block
                blocks[key] = np.asarray(mm[_slices(key)], dtype=dtype)
        del mm
        return _assemble(shape, sharding, blocks)


# ------------------------------------------------------------------- processes and agreement


class _SingleProcess:
    """The part of an mpi4py communicator used here, for one process without MPI."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def Free(self) -> None:
        pass


@dataclass(frozen=True)
class _Session:
    comm: Any  # a private duplicate of the user's communicator (or _SingleProcess)
    rank: int
    size: int
    rank_of_process: dict[int, int]  # jax process index -> MPI rank

    def agree(self, error: BaseException | None, info: Any, *, root: int) -> list[Any]:
        """Exchange (error, info, root) between all ranks; raise the first error everywhere.

        Returns every rank's `info`, in rank order, when no rank had an error.
        """
        report = None if error is None else _exception_record(error)
        results = self.comm.allgather((report, info, root))
        for rec, _, _ in results:
            if rec is not None:
                kind, message = rec
                raise _EXCEPTIONS.get(kind, RuntimeError)(message)
        roots = [r for _, _, r in results]
        if len(set(roots)) > 1:
            raise ValueError(f"`root` must be the same on every rank; got {roots} (by rank)")
        return [i for _, i, _ in results]


def _exception_record(e: BaseException) -> tuple[str, str]:
    kind = type(e).__name__
    if kind in _EXCEPTIONS:
        return kind, str(e)
    return "RuntimeError", f"{kind}: {e}"


@contextmanager
def _session(comm: Any, root: int) -> Iterator[_Session]:
    """Resolve the communicator, duplicate it for this call and map jax processes to ranks."""
    n_proc = jax.process_count()
    if comm is None:
        if n_proc == 1:
            comm = _SingleProcess()
        else:
            try:
                from mpi4py import MPI
            except ImportError as e:
                raise RuntimeError(
                    f"jax runs {n_proc} processes; moving arrays between them needs mpi4py "
                    f"({e}); install mpi4py or pass `comm`"
                ) from e
            comm = MPI.COMM_WORLD
    if not isinstance(comm, _SingleProcess) and not all(
        hasattr(comm, m) for m in ("Get_size", "Dup", "allgather", "Send", "Recv")
    ):
        raise TypeError(f"`comm` must be an mpi4py communicator; got {type(comm).__name__}")
    size = comm.Get_size()
    # These checks use values that are the same on all ranks: they raise on all or on none.
    if size != n_proc:
        raise ValueError(
            f"`comm` must have one rank per jax process: it has {size} ranks but jax runs "
            f"{n_proc} processes (launch with mpirun/mpiexec or srun --mpi=pmix so that MPI "
            "spans all processes, and start jax with pencilfft.initialize())"
        )
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"`root` must be a rank in [0, {size}); got {root!r}")

    dup = comm if isinstance(comm, _SingleProcess) else comm.Dup()
    try:
        processes = dup.allgather(jax.process_index())
        if sorted(processes) != list(range(n_proc)):
            raise RuntimeError(
                f"MPI ranks and jax processes do not match: jax process indices by rank are "
                f"{processes}; start jax with pencilfft.initialize()"
            )
        yield _Session(dup, dup.Get_rank(), size, {p: r for r, p in enumerate(processes)})
    finally:
        dup.Free()


def _check_same(infos: list[Any], what: str) -> None:
    """Raise (on every rank alike) unless all ranks described the same thing."""
    if any(i != infos[0] for i in infos):
        detail = "; ".join(f"rank {r}: {i}" for r, i in enumerate(infos))
        raise ValueError(f"`{what}` must be the same on every rank; got {detail}")


# ------------------------------------------------------------------------------ validation


def _check_mesh(mesh: Any) -> None:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"`mesh` must be a jax.sharding.Mesh; got {type(mesh).__name__}")
    _mesh_axes(mesh)  # ValueError unless 1 or 2 axes


def _check_dtype(dtype: np.dtype, what: str, kinds: str) -> None:
    if np.dtype(dtype).kind not in kinds:
        expected = {
            _FFT_KINDS: "an integer, float or complex dtype",
            _SAVE_KINDS: "a bool, integer, float or complex dtype",
        }[kinds]
        raise TypeError(f"{what} must have {expected}; got dtype {np.dtype(dtype)}")


def _check_fits(shape: tuple[int, ...], mesh: Mesh, what: str) -> None:
    """Real-space arrays (..., X, Y, Z): X divisible by mesh axis 0, Y by mesh axis 1."""
    if len(shape) < 3:
        raise ValueError(
            f"{what} must have at least 3 dimensions (..., X, Y, Z); got shape {tuple(shape)}"
        )
    for axis, label, name in zip((-3, -2), "XY", _mesh_axes(mesh)):
        if name is None:
            continue
        n = mesh.shape[name]
        if shape[axis] % n:
            raise ValueError(
                f"{what} has shape {tuple(shape)}: axis {len(shape) + axis} ({label}) has size "
                f"{shape[axis]}, which is not divisible by mesh axis '{name}' of size {n}"
            )


def _check_jax_array(x: Any, what: str) -> None:
    if not isinstance(x, jax.Array):
        raise TypeError(f"`{what}` must be a jax.Array; got {_describe_value(x)}")


def _check_path(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike; got {type(path).__name__}")
    return os.path.abspath(os.fspath(path))


def _open_npy(path: str) -> np.ndarray:
    """Memory-map the array in a .npy file (reads nothing but the header)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`path` names no file: {path!r}")
    try:
        mm = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy says ValueError, OSError, EOFError ...
        raise ValueError(f"`path` {path!r} is not a readable .npy file: {e}") from e
    if not isinstance(mm, np.ndarray):  # e.g. an .npz archive
        if hasattr(mm, "close"):
            mm.close()
        raise ValueError(f"`path` {path!r} is not a .npy file (got {type(mm).__name__})")
    return mm


def _describe_value(v: Any) -> str:
    kind = f"{type(v).__module__}.{type(v).__qualname__}".removeprefix("builtins.")
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"an array ({kind}) of shape {tuple(v.shape)} and dtype {v.dtype}"
    return f"a value of type {kind}"


def _global_description(x: jax.Array) -> tuple:
    """What must agree between ranks for x to be one global array."""
    return tuple(x.shape), np.dtype(x.dtype).str, sorted(d.id for d in x.sharding.device_set)


# ---------------------------------------------------------------------------------- blocks


def _key(index: tuple[slice, ...], shape: tuple[int, ...]) -> Key:
    """A hashable, normalized form of a device's index (slices with None filled in)."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _slices(key: Key) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in key)


def _block_shape(key: Key) -> tuple[int, ...]:
    return tuple(b - a for a, b in key)


def _sorted_index_map(sharding: Sharding, shape: tuple[int, ...]):
    """(device, index) for all devices, by device id: an order every process agrees on."""
    return sorted(sharding.devices_indices_map(shape).items(), key=lambda kv: kv[0].id)


def _owners(x: jax.Array, s: _Session, *, prefer: int) -> dict[Key, int]:
    """Each distinct block of x -> the rank that sends or writes it (`prefer` if it holds it).

    Identical on every rank, in the same order (by the lowest device id holding the block).
    """
    holders: dict[Key, list[int]] = {}
    for device, index in _sorted_index_map(x.sharding, x.shape):
        holders.setdefault(_key(index, x.shape), []).append(s.rank_of_process[device.process_index])
    return {key: prefer if prefer in ranks else ranks[0] for key, ranks in holders.items()}


def _local_shards(x: jax.Array) -> dict[Key, Any]:
    """This process's shards by block (one per distinct block)."""
    out: dict[Key, Any] = {}
    for shard in x.addressable_shards:
        out.setdefault(_key(shard.index, x.shape), shard)
    return out


def _assemble(
    shape: tuple[int, ...], sharding: Sharding, blocks: dict[Key, np.ndarray]
) -> jax.Array:
    """The global array from this process's blocks: each local device gets its block."""
    arrays = [
        jax.device_put(blocks[_key(index, shape)], device)
        for device, index in sharding.addressable_devices_indices_map(shape).items()
    ]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


# -------------------------------------------------------------------------------- messages


def _send(comm: Any, block: np.ndarray, dest: int) -> None:
    """Send a C-contiguous block as byte chunks of at most MAX_MESSAGE_BYTES."""
    flat = block.reshape(-1).view(np.uint8)
    step = MAX_MESSAGE_BYTES
    for start in range(0, flat.size, step):
        comm.Send(flat[start : start + step], dest=dest, tag=_TAG)


def _recv(comm: Any, buf: np.ndarray, source: int) -> None:
    """Receive into a C-contiguous buffer what `_send` sent (same chunking)."""
    flat = buf.reshape(-1).view(np.uint8)
    step = MAX_MESSAGE_BYTES
    for start in range(0, flat.size, step):
        comm.Recv(flat[start : start + step], source=source, tag=_TAG)
