"""Moving whole arrays in and out of a distributed jax.Array: MPI scatter/gather and .npy files.

* `scatter(data, sharding)`: a numpy array held by one process -> a global array in `sharding`
  (a NamedSharding: any rank, any split; or a Mesh: the real-space sharding of that mesh);
  every process receives only the blocks of its own devices.
* `gather(x)`: any global array -> one numpy array on one process.
* `save(path, x)` / `load(path, sharding)`: a standard .npy file that every process writes or
  reads its own blocks of (needs a file system all processes see).  `save` is atomic: the blocks
  go to a temporary file next to the target, which replaces the target only once complete.

Device ownership comes from jax (`device.process_index`), messages go through MPI.  Every call
is a sequence of steps separated by agreements (one small allgather each): each process checks
what it can (arguments, layout, array, file, memory), and the agreement raises the first error
of any process on every process.  Nothing that can fail on one process alone happens between an
agreement and the point-to-point messages that follow it, so a bad argument or a failure on
one process is an exception everywhere instead of a process waiting forever.
With a single jax process no MPI is needed (mpi4py is not even imported).

The parts: `blocks` (where an array goes, which process holds, sends or writes each block),
`transport` (a call's communicator, the agreements, the messages), `npyfile` (the file).
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, Sharding

from .blocks import (Key, array_description, block_key, block_shape, block_size, block_slices,
                     needs, owners, resolve)
# Imported under the names the tests replace (tests/test_reliability.py, tests/test_io.py and
# tests/mp/reliability_child.py set io._pwrite_block, io._local_shards, io._send, io._recv):
# the calls below go through this module's names.
from .blocks import local_shards as _local_shards
from .npyfile import (check_path, check_target, commit, create_temporary,
                      file_error, open_npy, remove_quietly)
from .npyfile import pwrite_block as _pwrite_block
from .transport import check_same, session
from .transport import recv as _recv, send as _send

__all__ = ["scatter", "gather", "save", "load"]

# Dtypes `save` writes: what a .npy file can describe without pickling.  ml_dtypes types such as
# bfloat16 are refused: numpy would read them back as raw bytes ('|V2').
_SAVE_KINDS = "biufc"


# ------------------------------------------------------------------------------ public API


def scatter(data: np.ndarray | None, sharding: NamedSharding | Mesh | None = None, *,
            root: int = 0, comm: Any = None, mesh: Mesh | None = None) -> jax.Array:
    """Distribute a numpy array held by one process over the devices of every process.

    Args:
      data: on rank `root`, the whole array: global shape of any rank, bool, integer, float or
        complex dtype; `None` on every other rank.
      sharding: where the result lives, the same on every process.  A `NamedSharding` places
        an array of any rank as its PartitionSpec says: each axis split by the mesh axes it
        names, whose sizes must divide it (jax splits arrays evenly, as for `fftn`'s input
        and result), mesh axes it leaves out holding copies; its mesh may span some of the
        devices only.  For example `NamedSharding(mesh, P("x", "y"))` for a 2-D field,
        `NamedSharding(mesh, P(None, "x", "y", None))` for a batch of 3-D fields, or the
        sharding of an earlier result (`y.sharding`).  A `Mesh` stands for the real-space
        sharding of a field (..., X, Y, Z) on it, `real_space_sharding(mesh, data.ndim)`:
        at least 3 dimensions, X divisible by the mesh's pencil axis a and Y by b (its last
        two axes), leading axes by its batch axes.
      root: the rank of `comm` holding `data`.
      comm: an mpi4py communicator with one rank per jax process; default `MPI.COMM_WORLD`
        when jax runs several processes, none needed with one.
      mesh: the former name of `sharding` (a Mesh), still taken as a keyword.

    Returns:
      The global array, shape `data.shape`, in `sharding` (for a Mesh,
      `real_space_sharding(mesh, data.ndim)`).  Each process receives exactly the blocks of
      its own devices, each distinct block once however many of its devices hold it (one
      message stream per block); only `root` ever holds the whole array.  64-bit data
      becomes 32-bit, with a warning, when jax runs without `jax_enable_x64`.

    Raises:
      ValueError, TypeError: on every process at once (checked collectively before any data
        moves): a `sharding` that is neither a NamedSharding nor a Mesh, a shape it does not
        divide (with a Mesh: fewer than 3 dimensions too), a dtype it cannot carry, `data`
        on a non-root rank, arguments that differ between processes.
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
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> field = np.ones((16, 8), np.float32)                         # a 2-D array
      >>> y = pencilfft.scatter(field, NamedSharding(mesh, P("x", "y")))
      >>> y.sharding.spec, y.addressable_shards[0].data.shape
      (P('x', 'y'), (4, 4))
    """
    with session(comm, root) as s:
        is_root = s.rank == s.root
        error, info = None, None
        try:
            layout = resolve(sharding, mesh)
            meta = None
            if is_root:
                if data is None:
                    raise ValueError(
                        f"`data` must be a numpy array on the root rank {root}; got None"
                    )
                data = np.asarray(data)
                _check_jax_dtype(data.dtype, "`data`")
                layout.check(data.shape, "`data`")
                meta = (data.shape, _jax_dtype(data.dtype, "`data`", "scatter"))
            elif data is not None and s.problem is None:
                raise ValueError(
                    f"`data` must be None on every rank but the root rank {root}; rank {s.rank} "
                    f"passed {_describe_value(data)}"
                )
            info = (layout.argname, layout.description(), meta)
        except Exception as e:  # noqa: BLE001 - every failure must reach every rank
            error = e
        infos = s.agree(error, info)
        check_same([i[1] for i in infos], f"`{infos[0][0]}`")
        shape, dtype = infos[s.root][2]
        shape = tuple(shape)
        target = layout.sharding(shape)
        wanted = needs(target, shape, s.rank_of_process, s.size)

        # Every buffer of the transfer exists before it starts: a rank that cannot allocate
        # one says so in the agreement instead of leaving its partner blocked in a send.  And
        # first, before any is allocated, each rank checks that its devices' blocks fit (as
        # `load` does): a block too big is a MemoryLimitError on every rank, not a process
        # growing until the OOM killer ends it.
        error, blocks, sendbuf = None, {}, None
        try:
            layout.check_memory("`data`", shape, dtype, verb="scattering", into="received into")
            if is_root:
                largest = max((block_size(k) for d in range(s.size) if d != s.root
                               for k in wanted[d]), default=0)
                sendbuf = np.empty(largest, dtype)
            else:
                blocks = {k: np.empty(block_shape(k), dtype) for k in wanted[s.rank]}
        except Exception as e:  # noqa: BLE001
            error = e
        s.agree(error, None)

        if is_root:
            for dest in range(s.size):
                if dest == s.root:
                    continue
                for k in wanted[dest]:
                    block = data[block_slices(k)]
                    if block.dtype != dtype or not block.flags.c_contiguous:
                        buf = sendbuf[: block_size(k)].reshape(block_shape(k))
                        np.copyto(buf, block, casting="unsafe")  # unsafe: the x64-off narrowing
                        block = buf
                    _send(s.comm, block, dest)
            del sendbuf
        else:
            for k in wanted[s.rank]:
                _recv(s.comm, blocks[k], s.root)

        error, out = None, None
        try:
            if is_root:
                # device_put copies, so the root's own blocks can stay views of `data`.
                blocks = {k: np.asarray(data[block_slices(k)], dtype=dtype)
                          for k in wanted[s.root]}
            out = _assemble(shape, target, blocks, dtype)
        except Exception as e:  # noqa: BLE001
            error = e
        s.agree(error, None)  # no process returns an array the others failed to build
        return out


def gather(x: jax.Array, *, root: int = 0, comm: Any = None) -> np.ndarray | None:
    """Collect a global array into one numpy array on rank `root`.

    Works for any rank and any sharding (real space, k space in either layout, what `fftn`
    returns, replicated or partly replicated, a mesh over some of the devices): each distinct
    block is sent once, by one process holding it (the root itself when it can, else the
    lowest rank that holds it).

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
    with session(comm, root) as s:
        is_root = s.rank == s.root
        error, info, out = None, None, None
        try:
            _check_concrete_array(x, "x", "gather")
            info = array_description(x)
            if is_root:
                out = np.empty(x.shape, x.dtype)  # before the agreement: it may not fit
        except Exception as e:  # noqa: BLE001
            error = e
        check_same(s.agree(error, info), "`x`")
        owner = owners(x.sharding, x.shape, s.rank_of_process, prefer=s.root)
        local = _local_shards(x)

        if not is_root:
            for k, r in owner.items():
                if r == s.rank:
                    _send(s.comm, np.ascontiguousarray(np.asarray(local[k].data)), s.root)
            return None
        for k, r in owner.items():
            if r == s.rank:
                out[block_slices(k)] = np.asarray(local[k].data)
            else:
                buf = np.empty(block_shape(k), x.dtype)  # one receive buffer at a time
                _recv(s.comm, buf, r)
                out[block_slices(k)] = buf
        return out


def save(path: str | os.PathLike, x: jax.Array, *, comm: Any = None) -> None:
    """Write a global array to a standard .npy file, atomically, each process writing its blocks.

    Any rank and any sharding.  Rank 0 creates a temporary file next to `path` (header, then
    the full size reserved with `posix_fallocate`, so that a full disk is an OSError now rather
    than a crash later); every process writes the distinct blocks it owns into it (each block
    once, with `pwrite`: a block held by several devices, a replicated mesh axis, is written by
    rank 0 if it holds it, else by the lowest rank that does) and flushes them to disk
    (`fsync`); once every process has succeeded and the size is checked, rank 0 renames the
    temporary file over `path`.  So `path` holds either its old content or the complete new
    array, even if the job is killed meanwhile, and on any error every process raises, the
    temporary file is removed and `path` is untouched.  A job killed during `save` can leave a
    hidden `.<name>.<random>.pencilfft-tmp` file, safe to delete.

    All processes must see the same file system (local disk for one node; a parallel file
    system such as Lustre or GPFS for several).  The file holds the global array, shape
    `x.shape`, in C order; read it with `numpy.load` or `pencilfft.load` (in any sharding:
    `load(path, x.sharding)` gives x back as it was).

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
    with session(comm, 0) as s:
        error, info = None, None
        try:
            path = check_path(path)
            _check_concrete_array(x, "x", "save")
            _check_savable(x.dtype)
            check_target(path)
            info = (path, array_description(x))
        except Exception as e:  # noqa: BLE001
            error = e
        infos = s.agree(error, info)
        check_same([i[0] for i in infos], "`path`")
        check_same([i[1] for i in infos], "`x`")

        tmp, renamed = None, False
        try:
            error, created = None, None
            if s.rank == 0:
                try:
                    tmp, header_len = create_temporary(path, x.shape, x.dtype)
                    created = (tmp, header_len)
                except Exception as e:  # noqa: BLE001
                    error = file_error(e, path)
            tmp, header_len = s.agree(error, created)[0]

            error = None
            owner = owners(x.sharding, x.shape, s.rank_of_process, prefer=0)
            mine = [k for k, r in owner.items() if r == s.rank]
            try:
                if mine:
                    _write_blocks(tmp, header_len, x, mine)
            except FileNotFoundError as e:
                error = FileNotFoundError(
                    f"rank {s.rank} cannot open {tmp!r}, which rank 0 created to save {path!r}: "
                    f"all processes need the same (shared) file system ({e})"
                )
            except Exception as e:  # noqa: BLE001
                error = file_error(e, path)
            s.agree(error, None)  # every block is on disk (fsync) once this returns

            error = None
            if s.rank == 0:
                try:
                    commit(tmp, path, header_len + x.size * np.dtype(x.dtype).itemsize)
                    renamed = True
                except Exception as e:  # noqa: BLE001
                    error = file_error(e, path)
            s.agree(error, None)
        finally:
            if s.rank == 0 and tmp is not None and not renamed:
                remove_quietly(tmp)


def load(path: str | os.PathLike, sharding: NamedSharding | Mesh | None = None, *,
         comm: Any = None, mesh: Mesh | None = None) -> jax.Array:
    """Read a .npy file into a global array in `sharding`, each process reading its own blocks.

    Every process memory-maps the file and reads only the blocks of its own devices (each
    distinct block once).  The array may have any rank and a bool, integer, float or complex
    dtype; `sharding` is what the next step needs, the same on every process: a
    `NamedSharding` (any split whose mesh axes divide the axes they split, as in `scatter`),
    e.g. `x.sharding` of the array that was saved, `pencilfft.get_fft_output_sharding(...)`
    or `k_space_sharding(mesh, layout, ndim)` for a saved spectrum; or a `Mesh`, which stands
    for `real_space_sharding(mesh, ndim)` as before (at least 3 dimensions (..., X, Y, Z), X
    divisible by the pencil axis a, the mesh's second-to-last, Y by b, its last).  `mesh=`,
    the former name of `sharding`, is still taken as a keyword.  64-bit data becomes 32-bit,
    with a warning, without `jax_enable_x64`.  Blocks that cannot fit in the devices' memory
    are refused before any is read (`MemoryLimitError`, a MemoryError; see docs/howto/memory.md).

    Returns:
      The global array, shape as in the file, in `sharding` (for a Mesh,
      `real_space_sharding(mesh, ndim)`).

    Raises:
      OSError: a missing or unreadable file (FileNotFoundError, PermissionError ...), raised
        on every process at once.
      ValueError: not a .npy file, a corrupt header, a shape `sharding` does not divide (on
        every process at once).
      TypeError: a dtype that is not bool, integer, float or complex; a `sharding` that is
        neither a NamedSharding nor a Mesh.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> np.save("field.npy", np.ones((16, 8, 4), np.float32))   # doctest: +SKIP
      >>> x = pencilfft.load("field.npy", mesh)                    # doctest: +SKIP
      >>> x.shape, x.sharding.spec                                 # doctest: +SKIP
      ((16, 8, 4), P('x', 'y', None))
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> np.save("plane.npy", np.ones((16, 8), np.float32))      # doctest: +SKIP
      >>> y = pencilfft.load("plane.npy", NamedSharding(mesh, P("x", "y")))  # doctest: +SKIP
      >>> y.sharding.spec                                          # doctest: +SKIP
      P('x', 'y')
    """
    with session(comm, 0) as s:
        error, info, mm = None, None, None
        try:
            layout = resolve(sharding, mesh)
            path = check_path(path)
            mm = open_npy(path)
            what = f"the array in {path!r}"
            _check_jax_dtype(mm.dtype, what)
            layout.check(mm.shape, what)
            # Only rank 0 warns (one message per job), but inside the checks: a warning turned
            # into an error must reach every process.
            dtype = _jax_dtype(mm.dtype, what, "load", warn=s.rank == 0)
            layout.check_memory(repr(path), mm.shape, dtype)  # before any block is read
            info = (path, (tuple(mm.shape), mm.dtype.str), layout.argname, layout.description())
        except Exception as e:  # noqa: BLE001
            error = e
        infos = s.agree(error, info)
        check_same([i[0] for i in infos], "`path`")
        check_same([i[1] for i in infos], f"the array in {path!r}")
        check_same([i[3] for i in infos], f"`{infos[0][2]}`")

        error, out = None, None
        try:
            shape = tuple(mm.shape)
            target = layout.sharding(shape)
            blocks: dict[Key, np.ndarray] = {}
            for index in target.addressable_devices_indices_map(shape).values():
                k = block_key(index, shape)
                if k not in blocks:  # several local devices may hold the same block
                    blocks[k] = np.asarray(mm[block_slices(k)], dtype=dtype)
            out = _assemble(shape, target, blocks, dtype)
        except Exception as e:  # noqa: BLE001 - e.g. an I/O error on one process
            error = e
        finally:
            del mm
        s.agree(error, None)
        return out


# ----------------------------------------------------------------------- jax arrays and files


def _assemble(shape: tuple[int, ...], sharding: Sharding, blocks: dict[Key, np.ndarray],
              dtype: np.dtype) -> jax.Array:
    """The global array from this process's blocks: each local device gets its block (a process
    without a device of the sharding holds no shard; jax then needs the dtype told)."""
    arrays = [
        jax.device_put(blocks[block_key(index, shape)], device)
        for device, index in sharding.addressable_devices_indices_map(shape).items()
    ]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays, dtype=dtype)


def _write_blocks(tmp: str, header_len: int, x: jax.Array, keys: list[Key]) -> None:
    """This rank's blocks into the temporary file, then fsync (each client its own data)."""
    fd = os.open(tmp, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        local = _local_shards(x)
        for k in keys:
            block = np.ascontiguousarray(np.asarray(local[k].data))
            _pwrite_block(fd, block, k, tuple(x.shape), header_len)
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _describe_value(v: Any) -> str:
    kind = f"{type(v).__module__}.{type(v).__qualname__}".removeprefix("builtins.")
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return f"an array ({kind}) of shape {tuple(v.shape)} and dtype {v.dtype}"
    return f"a value of type {kind}"
