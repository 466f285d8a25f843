"""Moving whole arrays in and out of a distributed jax.Array: MPI scatter/gather and .npy files.

* `scatter(data, mesh)`: a numpy array held by one process -> a global array in the real-space
  sharding; every process receives only the blocks of its own devices.
* `gather(x)`: any global array -> one numpy array on one process.
* `save(path, x)` / `load(path, mesh)`: a standard .npy file that every process writes or reads
  its own blocks of (needs a file system all processes see).  `save` is atomic: the blocks go
  to a temporary file next to the target, which replaces the target only once complete.

Device ownership comes from jax (`device.process_index`), messages go through MPI.  Every call
is a sequence of steps separated by agreements (one small allgather each): each process checks
what it can (arguments, mesh, array, file, memory), and the agreement raises the first error of
any process on every process.  Nothing that can fail on one process alone happens between an
agreement and the point-to-point messages that follow it, so a bad argument or a failure on
one process is an exception everywhere instead of a process waiting forever.
With a single jax process no MPI is needed (mpi4py is not even imported).
"""
from __future__ import annotations

import errno
import hashlib
import io
import os
import secrets
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, Sharding

from .._decomposition.rules import check_batch, check_mesh, mesh_axes, split_problem
from .._decomposition.sharding import real_space_sharding
from .memory import MemoryLimitError, check_load
from .launch import srun_mpi_hint

__all__ = ["scatter", "gather", "save", "load"]

# Largest MPI message in bytes.  MPI counts are C ints (2**31 - 1), and not every MPI/mpi4py
# combination has the large-count API, so blocks are sent as byte chunks of at most this size.
# Tests lower it (monkeypatch) to exercise the chunking with small arrays.
MAX_MESSAGE_BYTES = 1 << 30
# Largest single pwrite: Linux writes at most 0x7ffff000 bytes per call.
MAX_WRITE_BYTES = 1 << 30

# Dtypes `save` writes: what a .npy file can describe without pickling.  ml_dtypes types such as
# bfloat16 are refused: numpy would read them back as raw bytes ('|V2').
_SAVE_KINDS = "biufc"

_TAG = 17  # all transfers of a call run on a private duplicate communicator

# The temporary file `save` writes: hidden, next to the target, with a random part.
_TMP_SUFFIX = ".pencilfft-tmp"

# Exceptions carried between processes by type name; anything else arrives as RuntimeError.
_EXCEPTIONS = {
    e.__name__: e
    for e in (ValueError, TypeError, FileNotFoundError, FileExistsError, IsADirectoryError,
              NotADirectoryError, PermissionError, OSError, MemoryLimitError, MemoryError,
              RuntimeError)
}

Key = tuple[tuple[int, int], ...]  # a block: (start, stop) per global axis


# ------------------------------------------------------------------------------ public API


def scatter(data: np.ndarray | None, mesh: Mesh, *, root: int = 0, comm: Any = None) -> jax.Array:
    """Distribute a numpy array held by one process over `mesh` in the real-space sharding.

    Args:
      data: on rank `root`, the whole array, global shape (..., X, Y, Z) with X divisible by
        the mesh's pencil axis a and Y by b (its last two axes; leading axes by its batch axes) (bool, integer, float or complex dtype);
        `None` on every other rank.
      mesh: a 1-axis (slab) or 2-axis (pencil) mesh over the devices of all processes, the
        same (axes, sizes, device order) on every process.
      root: the rank of `comm` holding `data`.
      comm: an mpi4py communicator with one rank per jax process; default `MPI.COMM_WORLD`
        when jax runs several processes, none needed with one.

    Returns:
      The global array, shape `data.shape`, sharded as `real_space_sharding(mesh, data.ndim)`.
      Each process receives exactly the blocks of its own devices (one message stream per
      distinct block); only `root` ever holds the whole array.  64-bit data becomes 32-bit,
      with a warning, when jax runs without `jax_enable_x64`.

    Raises:
      ValueError, TypeError: on every process at once (checked collectively before any data
        moves): a shape the mesh does not divide, a dtype it cannot carry, `data` on a non-root
        rank, arguments that differ between processes.
      MemoryLimitError: (a MemoryError) on every process at once, before any buffer is
        allocated or data moves: a process's devices cannot hold their blocks (on CPU devices
        the host copy each block is received into counts too), as in `load`; the message names
        the global shape, the mesh and both sizes (`PENCILFFT_MEMORY_LIMIT` sets the limit).

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> data = np.arange(16 * 8 * 4, dtype=np.float32).reshape(16, 8, 4)
      >>> x = pencilfft.scatter(data if jax.process_index() == 0 else None, mesh)
      >>> x.shape, x.sharding.spec, x.addressable_shards[0].data.shape
      ((16, 8, 4), P('x', 'y', None), (4, 4, 4))
    """
    with _session(comm, root) as s:
        is_root = s.rank == s.root
        error, info = None, None
        try:
            check_mesh(mesh, concrete=True)
            meta = None
            if is_root:
                if data is None:
                    raise ValueError(
                        f"`data` must be a numpy array on the root rank {root}; got None"
                    )
                data = np.asarray(data)
                _check_jax_dtype(data.dtype, "`data`")
                _check_fits(data.shape, mesh, "`data`")
                meta = (data.shape, _jax_dtype(data.dtype, "`data`", "scatter"))
            elif data is not None and s.problem is None:
                raise ValueError(
                    f"`data` must be None on every rank but the root rank {root}; rank {s.rank} "
                    f"passed {_describe_value(data)}"
                )
            info = (_mesh_description(mesh), meta)
        except Exception as e:  # noqa: BLE001 - every failure must reach every rank
            error = e
        infos = s.agree(error, info)
        _check_same([i[0] for i in infos], "`mesh`")
        shape, dtype = infos[s.root][1]
        shape = tuple(shape)
        sharding = real_space_sharding(mesh, len(shape))

        # The distinct blocks each rank needs, in one order every rank computes alike.
        needs: dict[int, list[Key]] = {r: [] for r in range(s.size)}
        for device, index in _sorted_index_map(sharding, shape):
            r, key = s.rank_of_process[device.process_index], _key(index, shape)
            if key not in needs[r]:
                needs[r].append(key)

        # Every buffer of the transfer exists before it starts: a rank that cannot allocate
        # one says so in the agreement instead of leaving its partner blocked in a send.  And
        # first, before any is allocated, each rank checks that its devices' blocks fit (as
        # `load` does): a block too big is a MemoryLimitError on every rank, not a process
        # growing until the OOM killer ends it.
        error, blocks, sendbuf = None, {}, None
        try:
            check_load("`data`", shape, dtype, mesh, verb="scattering", into="received into")
            if is_root:
                largest = max(
                    (_size(k) for d in range(s.size) if d != s.root for k in needs[d]), default=0
                )
                sendbuf = np.empty(largest, dtype)
            else:
                blocks = {key: np.empty(_block_shape(key), dtype) for key in needs[s.rank]}
        except Exception as e:  # noqa: BLE001
            error = e
        s.agree(error, None)

        if is_root:
            for dest in range(s.size):
                if dest == s.root:
                    continue
                for key in needs[dest]:
                    block = data[_slices(key)]
                    if block.dtype != dtype or not block.flags.c_contiguous:
                        buf = sendbuf[: _size(key)].reshape(_block_shape(key))
                        np.copyto(buf, block, casting="unsafe")  # unsafe: the x64-off narrowing
                        block = buf
                    _send(s.comm, block, dest)
            del sendbuf
        else:
            for key in needs[s.rank]:
                _recv(s.comm, blocks[key], s.root)

        error, out = None, None
        try:
            if is_root:
                # device_put copies, so the root's own blocks can stay views of `data`.
                blocks = {key: np.asarray(data[_slices(key)], dtype=dtype) for key in needs[s.root]}
            out = _assemble(shape, sharding, blocks)
        except Exception as e:  # noqa: BLE001
            error = e
        s.agree(error, None)  # no process returns an array the others failed to build
        return out


def gather(x: jax.Array, *, root: int = 0, comm: Any = None) -> np.ndarray | None:
    """Collect a global array into one numpy array on rank `root`.

    Works for any sharding (real space, k space in either layout, replicated ...): each
    distinct block is sent once, by one process holding it (the root itself when it can).

    Args:
      x: the same global jax.Array on every process (shape, dtype and sharding are compared).
      root: the rank of `comm` that receives the array.
      comm: as in `scatter`.

    Returns:
      On `root` the whole array (global shape `x.shape`, dtype `x.dtype`); None elsewhere.

    Raises:
      ValueError, TypeError: on every process at once, e.g. arrays that differ between processes.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> data = np.arange(16 * 8 * 4, dtype=np.float32).reshape(16, 8, 4)
      >>> back = pencilfft.gather(pencilfft.scatter(data, mesh))   # numpy on rank 0
      >>> bool((back == data).all())
      True
    """
    with _session(comm, root) as s:
        is_root = s.rank == s.root
        error, info, out = None, None, None
        try:
            _check_concrete_array(x, "x", "gather")
            info = _array_description(x)
            if is_root:
                out = np.empty(x.shape, x.dtype)  # before the agreement: it may not fit
        except Exception as e:  # noqa: BLE001
            error = e
        _check_same(s.agree(error, info), "`x`")
        owner = _owners(x, s, prefer=s.root)
        local = _local_shards(x)

        if not is_root:
            for key, r in owner.items():
                if r == s.rank:
                    _send(s.comm, np.ascontiguousarray(np.asarray(local[key].data)), s.root)
            return None
        for key, r in owner.items():
            if r == s.rank:
                out[_slices(key)] = np.asarray(local[key].data)
            else:
                buf = np.empty(_block_shape(key), x.dtype)  # one receive buffer at a time
                _recv(s.comm, buf, r)
                out[_slices(key)] = buf
        return out


def save(path: str | os.PathLike, x: jax.Array, *, comm: Any = None) -> None:
    """Write a global array to a standard .npy file, atomically, each process writing its blocks.

    Rank 0 creates a temporary file next to `path` (header, then the full size reserved with
    `posix_fallocate`, so that a full disk is an OSError now rather than a crash later);
    every process writes the distinct blocks it owns into it (each block once, with `pwrite`)
    and flushes them to disk (`fsync`); once every process has succeeded and the size is
    checked, rank 0 renames the temporary file over `path`.  So `path` holds either its old
    content or the complete new array, even if the job is killed meanwhile, and on any error
    every process raises, the temporary file is removed and `path` is untouched.  A job killed
    during `save` can leave a hidden `.<name>.<random>.pencilfft-tmp` file, safe to delete.

    All processes must see the same file system (local disk for one node; a parallel file
    system such as Lustre or GPFS for several).  The file holds the global array, shape
    `x.shape`, in C order; read it with `numpy.load` or `pencilfft.load`.

    `path` must be a new name, a regular file or a symbolic link to one (whose target is
    replaced).  A character or block device (/dev/null, /dev/full), a FIFO or a socket is
    refused before anything is written: `save` replaces its target, which would replace the
    device node itself with a regular file when run as root.

    Raises:
      OSError: the same error (errno kept: ENOSPC, EFBIG ...) on every process; `path` untouched.
        A `path` that is not a regular file: OSError with errno EINVAL (IsADirectoryError for a
        directory), naming `path` and what it is.
      TypeError: bfloat16 and other types a .npy file cannot describe (convert them first).

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> k = pencilfft.pfft3d(jax.device_put(np.ones((16, 8, 4), np.complex64),
      ...                                     pencilfft.real_space_sharding(mesh)))
      >>> pencilfft.save("spectrum.npy", k)     # doctest: +SKIP
      >>> np.load("spectrum.npy").shape          # doctest: +SKIP
      (8, 4, 16)
    """
    with _session(comm, 0) as s:
        error, info = None, None
        try:
            path = _check_path(path)
            _check_concrete_array(x, "x", "save")
            _check_savable(x.dtype)
            _check_target(path)
            info = (path, _array_description(x))
        except Exception as e:  # noqa: BLE001
            error = e
        infos = s.agree(error, info)
        _check_same([i[0] for i in infos], "`path`")
        _check_same([i[1] for i in infos], "`x`")

        tmp, renamed = None, False
        try:
            error, created = None, None
            if s.rank == 0:
                try:
                    tmp, header_len = _create_temporary(path, x.shape, x.dtype)
                    created = (tmp, header_len)
                except Exception as e:  # noqa: BLE001
                    error = _file_error(e, path)
            tmp, header_len = s.agree(error, created)[0]

            error = None
            owner = _owners(x, s, prefer=0)
            mine = [key for key, r in owner.items() if r == s.rank]
            try:
                if mine:
                    _write_blocks(tmp, header_len, x, mine)
            except FileNotFoundError as e:
                error = FileNotFoundError(
                    f"rank {s.rank} cannot open {tmp!r}, which rank 0 created to save {path!r}: "
                    f"all processes need the same (shared) file system ({e})"
                )
            except Exception as e:  # noqa: BLE001
                error = _file_error(e, path)
            s.agree(error, None)  # every block is on disk (fsync) once this returns

            error = None
            if s.rank == 0:
                try:
                    _commit(tmp, path, header_len + x.size * np.dtype(x.dtype).itemsize)
                    renamed = True
                except Exception as e:  # noqa: BLE001
                    error = _file_error(e, path)
            s.agree(error, None)
        finally:
            if s.rank == 0 and tmp is not None and not renamed:
                _remove_quietly(tmp)


def load(path: str | os.PathLike, mesh: Mesh, *, comm: Any = None) -> jax.Array:
    """Read a .npy file into a global array in the real-space sharding of `mesh`.

    Every process memory-maps the file and reads only the blocks of its own devices.  The
    array must have at least 3 dimensions (..., X, Y, Z), X divisible by the pencil axis a (the mesh's second-to-last),
    Y by the second, and a bool, integer, float or complex dtype.  `mesh` must be the same on
    every process.  64-bit data becomes 32-bit, with a warning, without `jax_enable_x64`.
    Blocks that cannot fit in the devices' memory are refused before any is read
    (`MemoryLimitError`, a MemoryError; see docs/howto/memory.md).

    Returns:
      The global array, shape as in the file, sharded as `real_space_sharding(mesh, ndim)`.

    Raises:
      OSError: a missing or unreadable file (FileNotFoundError, PermissionError ...), raised
        on every process at once.
      ValueError: not a .npy file, a corrupt header, a shape the mesh does not divide (on every
        process at once).
      TypeError: a dtype that is not bool, integer, float or complex.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> np.save("field.npy", np.ones((16, 8, 4), np.float32))   # doctest: +SKIP
      >>> x = pencilfft.load("field.npy", mesh)                    # doctest: +SKIP
      >>> x.shape, x.sharding.spec                                 # doctest: +SKIP
      ((16, 8, 4), P('x', 'y', None))
    """
    with _session(comm, 0) as s:
        error, info, mm = None, None, None
        try:
            check_mesh(mesh, concrete=True)
            path = _check_path(path)
            mm = _open_npy(path)
            what = f"the array in {path!r}"
            _check_jax_dtype(mm.dtype, what)
            _check_fits(mm.shape, mesh, what)
            # Only rank 0 warns (one message per job), but inside the checks: a warning turned
            # into an error must reach every process.
            dtype = _jax_dtype(mm.dtype, what, "load", warn=s.rank == 0)
            check_load(repr(path), mm.shape, dtype, mesh)  # before any block is read
            info = (path, (tuple(mm.shape), mm.dtype.str), _mesh_description(mesh))
        except Exception as e:  # noqa: BLE001
            error = e
        infos = s.agree(error, info)
        _check_same([i[0] for i in infos], "`path`")
        _check_same([i[1] for i in infos], f"the array in {path!r}")
        _check_same([i[2] for i in infos], "`mesh`")

        error, out = None, None
        try:
            shape = tuple(mm.shape)
            sharding = real_space_sharding(mesh, len(shape))
            blocks: dict[Key, np.ndarray] = {}
            for index in sharding.addressable_devices_indices_map(shape).values():
                key = _key(index, shape)
                if key not in blocks:  # several local devices may hold the same block
                    blocks[key] = np.asarray(mm[_slices(key)], dtype=dtype)
            out = _assemble(shape, sharding, blocks)
        except Exception as e:  # noqa: BLE001 - e.g. an I/O error on one process
            error = e
        finally:
            del mm
        s.agree(error, None)
        return out


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


@dataclass
class _Session:
    comm: Any  # a private duplicate of a communicator every rank shares (or _SingleProcess)
    rank: int
    size: int
    root: int | None  # `root` as a rank of `comm`; None where this rank's `root` is invalid
    problem: Exception | None  # what is wrong with this rank's `comm` or `root`
    given: tuple  # (root, description of the caller's comm): compared between ranks
    rank_of_process: dict[int, int] = field(default_factory=dict)  # jax process -> rank

    def agree(self, error: BaseException | None, info: Any) -> list[Any]:
        """One allgather: raise the same exception on every rank if any rank had one.

        The first call of a session also compares `root` and `comm` between ranks and maps
        jax processes to ranks; those checks come before the other errors, which they may
        explain (a rank that takes itself for the root finds no data ...).
        Returns every rank's `info`, in rank order.
        """
        first = not self.rank_of_process
        extra = None
        if first:
            extra = (
                None if self.problem is None else _exception_record(self.problem),
                self.given,
                jax.process_index(),
            )
        report = None if error is None else _exception_record(error)
        results = self.comm.allgather((report, info, extra))
        if first:
            extras = [e for _, _, e in results]
            _raise_first([e[0] for e in extras], self.problem)
            _check_same([e[1][0] for e in extras], "`root`")
            _check_same([e[1][1] for e in extras], "`comm`")
            processes = [e[2] for e in extras]
            if sorted(processes) != list(range(len(processes))):
                raise RuntimeError(
                    f"MPI ranks and jax processes do not match: jax process indices by rank are "
                    f"{processes}; start jax with pencilfft.initialize()"
                )
            self.rank_of_process = {p: r for r, p in enumerate(processes)}
        _raise_first([r for r, _, _ in results], error)
        return [i for _, i, _ in results]


def _exception_record(e: BaseException) -> tuple[str, str, int | None]:
    kind = type(e).__name__
    number = getattr(e, "errno", None) if isinstance(e, OSError) else None
    if kind in _EXCEPTIONS:
        return kind, str(e), number
    return "RuntimeError", f"{kind}: {e}", None


def _raise_first(records: list, own: BaseException | None) -> None:
    """Raise the lowest rank's error, saying which ranks had one when not all did."""
    failed = [r for r, rec in enumerate(records) if rec is not None]
    if not failed:
        return
    kind, message, number = records[failed[0]]
    if len(failed) < len(records):
        message += f" (on {_ranks(failed)})"
    exc = _EXCEPTIONS.get(kind, RuntimeError)(message)
    if number is not None:
        exc.errno = number
    # Where the error happened, its own traceback is the useful one.
    raise exc from own


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def _check_same(infos: list[Any], what: str) -> None:
    """Raise (on every rank alike) unless all ranks gave the same value."""
    if all(i == infos[0] for i in infos):
        return
    groups: dict[str, list[int]] = {}
    for r, i in enumerate(infos):
        groups.setdefault(repr(i) if not isinstance(i, str) else i, []).append(r)
    detail = "; ".join(f"{value} on {_ranks(ranks)}" for value, ranks in list(groups.items())[:4])
    raise ValueError(f"{what} must be the same on every rank; got {detail}")


@contextmanager
def _session(comm: Any, root: Any) -> Iterator[_Session]:
    """A private communicator for this call, duplicated before any argument can fail.

    The duplicate is made of MPI.COMM_WORLD whenever it spans exactly the jax processes (the
    case pencilfft.initialize() sets up), whatever `comm` each rank passed: a bad or
    different `comm` or `root` on one rank is then an error in the first agreement, on every
    rank, instead of a rank left waiting in a Dup the others never call.  The caller's
    `comm` only says which rank `root` is.
    """
    n_proc = jax.process_count()
    if n_proc == 1:
        base = world = _SingleProcess()
    else:
        try:
            from mpi4py import MPI
        except ImportError as e:
            raise ImportError(
                f"jax runs {n_proc} processes; moving arrays between them needs mpi4py ({e}): "
                f"pip install 'pencilfft[mpi]', or on a cluster mpi4py built for its MPI "
                f"(docs: howto/clusters)"
            ) from e
        world = MPI.COMM_WORLD
        if world.Get_size() == n_proc:
            base = world
        else:
            # jax spans another set of processes than MPI.COMM_WORLD: only the caller's comm
            # can carry the agreement, so a `comm` unusable here fails on this rank alone.
            _check_comm_type(comm)
            base = world if comm is None else comm
            _check_comm_size(base, n_proc)
    dup = base if isinstance(base, _SingleProcess) else base.Dup()
    try:
        problem, root_in_base, given = None, None, (_root_value(root), None)
        try:
            root_in_base, given = _resolve(comm, root, base, n_proc)
        except Exception as e:  # noqa: BLE001
            problem = e
        yield _Session(dup, dup.Get_rank(), dup.Get_size(), root_in_base, problem, given)
    finally:
        dup.Free()


def _resolve(comm: Any, root: Any, base: Any, n_proc: int) -> tuple[int, tuple]:
    """(root as a rank of `base`, (root, what comm is)) or the error in this rank's comm/root.

    What comm is, relative to MPI.COMM_WORLD, is compared between ranks: a rank that passed
    another communicator than the others is an error.  (Two different duplicates of
    MPI.COMM_WORLD cannot be told apart, nor need they be: the transfers run on a duplicate
    of MPI.COMM_WORLD either way.)
    """
    _check_comm_type(comm)
    single = isinstance(base, _SingleProcess)
    if comm is None or comm is base:
        comm = base
    _check_comm_size(comm, n_proc)
    size = comm.Get_size()
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise ValueError(f"`root` must be a rank in [0, {size}); got {root!r}")
    root = int(root)
    if single:
        return 0, (root, None)
    from mpi4py import MPI

    if base is not MPI.COMM_WORLD:  # jax spans a subset of the MPI processes: base is comm
        return root, (root, None)
    if comm is base:
        return root, (root, "MPI.COMM_WORLD")
    relation = MPI.Comm.Compare(comm, base)
    mine, theirs = comm.Get_group(), base.Get_group()
    try:
        order = mine.Translate_ranks(list(range(size)), theirs)
    finally:
        mine.Free()
        theirs.Free()
    if relation == MPI.IDENT:
        described = "MPI.COMM_WORLD"
    elif relation == MPI.CONGRUENT:
        described = "a duplicate of MPI.COMM_WORLD"
    else:
        described = f"MPI.COMM_WORLD's ranks in another order ({_digest(order)})"
    return order[root], (root, described)


def _check_comm_type(comm: Any) -> None:
    if comm is not None and not all(
        hasattr(comm, m) for m in ("Get_size", "Get_rank", "Dup", "allgather", "Send", "Recv")
    ):
        raise TypeError(f"`comm` must be an mpi4py communicator; got {type(comm).__name__}")


def _check_comm_size(comm: Any, n_proc: int) -> None:
    size = comm.Get_size()
    if size != n_proc:
        # srun without an MPI plug-in: MPI.COMM_WORLD is each task alone (the hint says so).
        hint = srun_mpi_hint()
        raise ValueError(
            f"`comm` must have one rank per jax process: it has {size} ranks but jax runs "
            f"{n_proc} processes ("
            + (hint or "launch with mpirun/mpiexec, or srun with an MPI plug-in (`srun "
                       "--mpi=pmi2` for the mpich of pencilfft[mpi]), so that MPI spans all "
                       "processes, and start jax with pencilfft.initialize()")
            + ")"
        )


def _root_value(root: Any) -> Any:
    return int(root) if isinstance(root, (int, np.integer)) and not isinstance(root, bool) else repr(root)


# ------------------------------------------------------------------------------ validation


def _jax_supports(dtype: np.dtype) -> bool:
    if dtype == jnp.bfloat16:
        return True
    return dtype.kind in "biufc" and dtype.itemsize <= (16 if dtype.kind == "c" else 8)


def _check_jax_dtype(dtype: np.dtype, what: str) -> None:
    """The dtypes `scatter` and `load` take: what `save` writes (bool, integers, floats,
    complex numbers) and bfloat16, which jax has but a .npy file cannot describe."""
    dtype = np.dtype(dtype)
    if not _jax_supports(dtype):
        extra = ", which jax does not support" if dtype.kind in "biufc" else ""
        raise TypeError(
            f"{what} must have a bool, integer, float or complex dtype; got dtype {dtype}{extra}"
        )


def _jax_dtype(dtype: np.dtype, what: str, func: str, *, warn: bool = True) -> np.dtype:
    """The dtype jax gives this data: 64-bit types are 32-bit without jax_enable_x64."""
    dtype = np.dtype(dtype).newbyteorder("=")  # jax wants native byte order
    target = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if target != dtype and warn:
        warnings.warn(
            f"pencilfft.{func}: {what} has dtype {dtype}, but jax_enable_x64 is off: the "
            f"result has dtype {target} (precision is lost, and integers beyond its range "
            f"wrap around). Call jax.config.update('jax_enable_x64', True) at start-up to keep "
            f"64-bit types, or convert the data to {target} yourself.",
            UserWarning,
            stacklevel=3,
        )
    return target


def _check_savable(dtype: Any) -> None:
    dtype = np.dtype(dtype)
    if dtype.kind not in _SAVE_KINDS:
        raise TypeError(
            f"`x` has dtype {dtype}, which a .npy file cannot describe (numpy would read it "
            f"back as raw bytes, dtype {dtype.str!r}); expected a bool, integer, float or "
            f"complex dtype: save x.astype(jnp.float32) (or another numpy type) instead"
        )


def _check_fits(shape: tuple[int, ...], mesh: Mesh, what: str) -> None:
    """Real-space arrays (..., X, Y, Z): X divisible by the pencil axis a, Y by b, and each
    leading axis the mesh's batch axes split by its batch axis."""
    if len(shape) < 3:
        raise ValueError(
            f"{what} must have at least 3 dimensions (..., X, Y, Z); got shape {tuple(shape)}"
        )
    axes, pdims = mesh_axes(mesh)
    problem = split_problem(shape, pdims, axes)
    if problem is not None:
        index, why = problem
        raise ValueError(f"{what} has shape {tuple(shape)}: axis {index} {why}")
    try:
        check_batch(shape, mesh, "data")
    except ValueError as e:
        raise ValueError(f"{what} has shape {tuple(shape)}, which the mesh's batch axes cannot "
                         f"split: {e}") from None


def _check_concrete_array(x: Any, what: str, func: str) -> None:
    """A live, concrete jax.Array: not a numpy array, not a tracer, not deleted (donated)."""
    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            f"`{what}` must be a concrete jax.Array; got a tracer ({type(x).__name__}): "
            f"pencilfft.{func} moves data between processes and cannot run inside jax.jit, "
            f"vmap or grad; call it on the result, outside the transformation"
        )
    if not isinstance(x, jax.Array):
        raise TypeError(f"`{what}` must be a jax.Array; got {_describe_value(x)}")
    if x.is_deleted():
        raise ValueError(
            f"`{what}` has been deleted (donated to an earlier call, e.g. "
            f"jax.jit(..., donate_argnums=0), or x.delete()); pass a live array"
        )


def _check_path(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike; got {type(path).__name__}")
    return os.path.abspath(os.fspath(path))


def _check_target(path: str) -> None:
    """Where `save` can write: an existing directory, and not a directory itself, nor anything
    else that is not a regular file (`_refuse_special`)."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"`path` {path!r} cannot be written: its directory {directory!r} does not exist"
        )
    if os.path.isdir(path):
        raise IsADirectoryError(f"`path` {path!r} is a directory; expected a file name")
    _refuse_special(path)


_SPECIAL_FILES = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                  (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def _refuse_special(path: str, unchanged: bool = True) -> None:
    """OSError (EINVAL) if `path`, or what its symbolic links lead to, exists and is not a
    regular file.  `save` replaces its target with a new file (a rename), so saving to
    /dev/null or /dev/full as root replaced the device node itself with a regular file
    (issue 57); numpy.save would write into the device instead (ENOSPC for /dev/full).
    pencilfft refuses: a new name, a regular file or a symbolic link to one."""
    target = os.path.realpath(path)
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return  # a new file (or a dangling link's target, created)
    except OSError:
        return  # unreadable: the temporary file's creation says why
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):  # a directory: IsADirectoryError above
        return
    kind = next((name for test, name in _SPECIAL_FILES if test(mode)), "a special file")
    via = f" (through symbolic links: {target!r})" if target != path else ""
    raise OSError(
        errno.EINVAL,
        f"`path` {path!r} is {kind}{via}, not a regular file: pencilfft.save replaces its target "
        f"with a new .npy file, so it writes only to a new name, a regular file or a symbolic "
        f"link to one" + (f"; {path!r} is unchanged" if unchanged else ""),
    )


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def _open_npy(path: str) -> np.ndarray:
    """Memory-map the array in a .npy file (reads nothing but the header).

    The header is read here first, so that a file that is not a .npy file, a corrupt or
    truncated one and one holding Python objects each get a message that says so (numpy's
    own would speak of pickles and an `allow_pickle` argument that `load` does not have).
    """
    if not os.path.lexists(path):
        raise FileNotFoundError(f"`path` names no file: {path!r}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"`path` {path!r} is a directory; expected a .npy file")
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype, offset = _read_npy_header(f, path)
    except PermissionError as e:
        raise PermissionError(f"`path` {path!r} cannot be read: {e.strerror}") from e
    except FileNotFoundError as e:  # e.g. a dangling symbolic link
        raise FileNotFoundError(f"`path` names no file: {path!r} ({e.strerror})") from e
    if dtype.hasobject:
        raise TypeError(
            f"the array in {path!r} holds Python objects (dtype {dtype}, stored as pickles); "
            f"pencilfft.load reads bool, integer, float and complex arrays only"
        )
    data = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < offset + data:
        raise ValueError(
            f"`path` {path!r} is truncated: its .npy header describes an array of shape "
            f"{tuple(shape)} and dtype {dtype} ({data} bytes after the header), but the file "
            f"holds only {size - offset} bytes after the header"
        )
    try:
        mm = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy says ValueError, OSError, EOFError ...
        raise ValueError(f"`path` {path!r} is not a readable .npy file: {e}") from e
    return mm


def _read_npy_header(f, path: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """(shape, fortran order, dtype, offset of the data) from an open .npy file."""
    start = f.read(len(_NPY_MAGIC))
    if start.startswith(_ZIP_MAGIC):
        raise ValueError(
            f"`path` {path!r} is a .npz archive (numpy.savez), not a .npy file; load one array "
            f"of it with numpy.load and write it with numpy.save or pencilfft.save"
        )
    if start != _NPY_MAGIC:
        what = "it is empty" if not start else (
            f"it does not start with numpy's magic string {_NPY_MAGIC!r} (its first bytes are "
            f"{start + f.read(10)!r})")
        raise ValueError(
            f"`path` {path!r} is not a .npy file: {what}; expected a file written by "
            f"numpy.save or pencilfft.save"
        )
    f.seek(0)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:  # 3.0 (utf-8 field names): numpy has no public reader for it
            shape, fortran, dtype = np.lib.format._read_array_header(f, version)
    except (ValueError, EOFError, SyntaxError, TypeError, AttributeError) as e:
        raise ValueError(f"`path` {path!r} has a corrupt .npy header: {e}") from e
    return tuple(shape), bool(fortran), np.dtype(dtype), f.tell()


def _describe_value(v: Any) -> str:
    kind = f"{type(v).__module__}.{type(v).__qualname__}".removeprefix("builtins.")
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"an array ({kind}) of shape {tuple(v.shape)} and dtype {v.dtype}"
    return f"a value of type {kind}"


def _digest(obj: Any) -> str:
    return "digest " + hashlib.sha256(repr(obj).encode()).hexdigest()[:12]


def _mesh_description(mesh: Mesh) -> str:
    """What must agree between ranks for a mesh to be one mesh (a short string at any size)."""
    ids = [int(d.id) for d in mesh.devices.flat]
    devices = str(ids) if len(ids) <= 16 else _digest(ids)
    types = tuple(str(t).rsplit(".", 1)[-1] for t in getattr(mesh, "axis_types", ()))
    return (
        f"axes {tuple(mesh.axis_names)} of sizes {tuple(mesh.axis_sizes)} ({', '.join(types)}), "
        f"devices {devices}"
    )


def _array_description(x: jax.Array) -> str:
    """What must agree between ranks for x to be one global array: shape, dtype, block map."""
    blocks = [(d.id, _key(i, x.shape)) for d, i in _sorted_index_map(x.sharding, x.shape)]
    return f"shape {tuple(x.shape)}, dtype {x.dtype}, blocks by device {_digest(blocks)}"


# ---------------------------------------------------------------------------------- blocks


def _key(index: tuple[slice, ...], shape: tuple[int, ...]) -> Key:
    """A hashable, normalized form of a device's index (slices with None filled in)."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def _slices(key: Key) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in key)


def _block_shape(key: Key) -> tuple[int, ...]:
    return tuple(b - a for a, b in key)


def _size(key: Key) -> int:
    return int(np.prod(_block_shape(key), dtype=np.int64))


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


# ----------------------------------------------------------------------------------- files


def _npy_header(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The header numpy writes for a C-order array (format 1.0, or 2.0 when it must)."""
    d = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
         "shape": tuple(int(n) for n in shape)}
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:  # a header longer than 64 KiB
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def _create_temporary(path: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[str, int]:
    """Rank 0: the temporary file next to `path`, header written and full size reserved.

    Returns (its name, the header length).  Next to the (resolved) target so that the final
    rename stays within one file system.
    """
    target = os.path.realpath(path)
    directory, name = os.path.split(target)
    header = _npy_header(shape, dtype)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}{_TMP_SUFFIX}")
        try:
            fd = os.open(tmp, flags, 0o666)  # 0o666 & ~umask, like numpy.save
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary file name next to {path!r}")
    try:
        try:
            if os.path.isfile(target):  # overwriting keeps the old file's permissions
                os.fchmod(fd, stat.S_IMODE(os.stat(target).st_mode))
        except OSError:
            pass
        _pwrite_all(fd, np.frombuffer(header, np.uint8), 0)
        _reserve(fd, len(header) + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        _remove_quietly(tmp)
        raise
    os.close(fd)
    return tmp, len(header)


def _reserve(fd: int, size: int) -> None:
    """Allocate the whole file now: a full disk or a size limit is an OSError here.

    Writing into a sparse file can fail later, and through a memory map that failure is a
    SIGBUS that kills the process.  Where the file system cannot preallocate, the file is
    only extended; `pwrite` then still reports a full disk as an OSError.
    """
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None and size > 0:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, size)


def _write_blocks(tmp: str, header_len: int, x: jax.Array, keys: list[Key]) -> None:
    """This rank's blocks into the temporary file, then fsync (each client its own data)."""
    fd = os.open(tmp, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        local = _local_shards(x)
        for key in keys:
            block = np.ascontiguousarray(np.asarray(local[key].data))
            _pwrite_block(fd, block, key, tuple(x.shape), header_len)
        os.fsync(fd)
    finally:
        os.close(fd)


def _pwrite_block(fd: int, block: np.ndarray, key: Key, shape: tuple[int, ...], base: int) -> None:
    """Write a C-contiguous block of a C-order array stored at byte `base` of the file.

    The block is a set of runs, each contiguous in the file: along the last axis the block
    does not span entirely, times all the axes after it (which it spans).
    """
    if block.size == 0:
        return
    n = len(shape)
    strides = [int(np.prod(shape[m + 1:], dtype=np.int64)) for m in range(n)]
    j = n
    while j > 0 and key[j - 1] == (0, shape[j - 1]):
        j -= 1
    offsets = np.zeros((), np.int64)
    if j == 0:
        run = block.size
    else:
        for m in range(j - 1):
            offsets = offsets[..., None] + np.arange(*key[m], dtype=np.int64) * strides[m]
        offsets = offsets + key[j - 1][0] * strides[j - 1]
        run = (key[j - 1][1] - key[j - 1][0]) * strides[j - 1]
    itemsize = block.dtype.itemsize
    rows = block.reshape(-1).view(np.uint8).reshape(-1, run * itemsize)
    for row, offset in zip(rows, offsets.reshape(-1).tolist()):
        _pwrite_all(fd, row, base + offset * itemsize)


def _pwrite_all(fd: int, data: np.ndarray, offset: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.pwrite(fd, view[done : done + MAX_WRITE_BYTES], offset + done)
        if written <= 0:
            raise OSError(errno.EIO, f"pwrite wrote nothing at offset {offset + done}")
        done += written


def _commit(tmp: str, path: str, expected: int) -> None:
    """Rank 0, after every rank wrote and synced its blocks: check the size, rename, sync."""
    size = os.stat(tmp).st_size
    if size != expected:
        raise OSError(
            errno.EIO,
            f"the temporary file {tmp!r} has {size} bytes after every process wrote its "
            f"blocks, not the {expected} of the array",
        )
    # Again: the file system may have changed since the first check (`_file_error` then says
    # that `path` is unchanged).
    _refuse_special(path, unchanged=False)
    target = os.path.realpath(path)
    os.replace(tmp, target)
    # The rename itself must reach the disk for the new file to survive a crash.
    try:
        dir_fd = os.open(os.path.dirname(target), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:  # some file systems cannot sync a directory
        pass
    finally:
        os.close(dir_fd)


def _file_error(e: Exception, path: str) -> Exception:
    """An OSError of `save`, with the target and the guarantee that it is unchanged."""
    if not isinstance(e, OSError) or type(e).__name__ not in _EXCEPTIONS:
        return e
    reason = e.strerror or str(e)
    detail = f" ({e.filename})" if e.filename and e.filename != path else ""
    out = type(e)(f"cannot save {path!r}: {reason}{detail}; {path!r} is unchanged")
    out.errno = e.errno
    return out


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
