"""One call of the loaders across processes: its private communicator, the agreements that
turn an error on one process into the same exception on every process, and the messages.

`scatter`, `gather`, `save` and `load` (`io`) each run in a `session`: a private duplicate of
`MPI.COMM_WORLD`, made before any argument is looked at, so that a bad `comm` or `root` on one
process is an error in the first agreement rather than a process left waiting in a `Dup` the
others never call.  An agreement (`Session.agree`) is one small allgather: each process says
whether it failed (and what it has to compare), and every process raises the lowest rank's
error.  Blocks travel as byte chunks of at most `MAX_MESSAGE_BYTES` (`send`, `recv`).
With a single jax process no MPI is needed (mpi4py is not even imported).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from .launch import srun_mpi_hint
from .memory import MemoryLimitError

__all__ = ["EXCEPTIONS", "MAX_MESSAGE_BYTES", "Session", "check_same", "digest", "recv", "send",
           "session"]

# Largest MPI message in bytes.  MPI counts are C ints (2**31 - 1), and not every MPI/mpi4py
# combination has the large-count API, so blocks are sent as byte chunks of at most this size.
# Tests lower it (monkeypatch) to exercise the chunking with small arrays.
MAX_MESSAGE_BYTES = 1 << 30

_TAG = 17  # all transfers of a call run on a private duplicate communicator

# Exceptions carried between processes by type name; anything else arrives as RuntimeError.
EXCEPTIONS = {
    e.__name__: e
    for e in (ValueError, TypeError, FileNotFoundError, FileExistsError, IsADirectoryError,
              NotADirectoryError, PermissionError, OSError, MemoryLimitError, MemoryError,
              RuntimeError)
}


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
class Session:
    """One call across the processes: its private communicator, this rank, and `root`."""

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
            check_same([e[1][0] for e in extras], "`root`")
            check_same([e[1][1] for e in extras], "`comm`")
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
    if kind in EXCEPTIONS:
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
    exc = EXCEPTIONS.get(kind, RuntimeError)(message)
    if number is not None:
        exc.errno = number
    # Where the error happened, its own traceback is the useful one.
    raise exc from own


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def check_same(infos: list[Any], what: str) -> None:
    """Raise (on every rank alike) unless all ranks gave the same value."""
    if all(i == infos[0] for i in infos):
        return
    groups: dict[str, list[int]] = {}
    for r, i in enumerate(infos):
        groups.setdefault(repr(i) if not isinstance(i, str) else i, []).append(r)
    detail = "; ".join(f"{value} on {_ranks(ranks)}" for value, ranks in list(groups.items())[:4])
    raise ValueError(f"{what} must be the same on every rank; got {detail}")


@contextmanager
def session(comm: Any, root: Any) -> Iterator[Session]:
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
        yield Session(dup, dup.Get_rank(), dup.Get_size(), root_in_base, problem, given)
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
        described = f"MPI.COMM_WORLD's ranks in another order ({digest(order)})"
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
    if isinstance(root, (int, np.integer)) and not isinstance(root, bool):
        return int(root)
    return repr(root)


def digest(obj: Any) -> str:
    """A short fingerprint of `obj`'s repr, for values too long to compare in a message."""
    return "digest " + hashlib.sha256(repr(obj).encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------- messages


def send(comm: Any, block: np.ndarray, dest: int) -> None:
    """Send a C-contiguous block as byte chunks of at most MAX_MESSAGE_BYTES."""
    flat = block.reshape(-1).view(np.uint8)
    step = MAX_MESSAGE_BYTES
    for start in range(0, flat.size, step):
        comm.Send(flat[start : start + step], dest=dest, tag=_TAG)


def recv(comm: Any, buf: np.ndarray, source: int) -> None:
    """Receive into a C-contiguous buffer what `send` sent (same chunking)."""
    flat = buf.reshape(-1).view(np.uint8)
    step = MAX_MESSAGE_BYTES
    for start in range(0, flat.size, step):
        comm.Recv(flat[start : start + step], source=source, tag=_TAG)
