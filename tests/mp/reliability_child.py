"""Child processes for tests/test_reliability.py: situations a test process must not live through.

    python reliability_child.py abort                (under mpirun -np 2)
    python reliability_child.py stop                 (under mpirun -np 2)
    python reliability_child.py end HOW              (under mpirun -np 2 or srun -n 2;
                                                      HOW: exit-3, raise-3, exit-0, all-4,
                                                      raise)
    python reliability_child.py differ               (mpirun: rank 1 with JAX_ENABLE_X64=1)
    python reliability_child.py callback GRACE       (under mpirun -np 2, several devices each)
    python reliability_child.py top                  (one process)
    python reliability_child.py statuses DIR STATUS...   (one process, forked per status)
    python reliability_child.py spawn [coordinator]  (under mpirun -np 2, or alone with a
                                                      coordinator at PENCILFFT_TEST_COORDINATOR)
    python reliability_child.py kill-save PATH MARKER
    python reliability_child.py size-limit PATH LIMIT
    python reliability_child.py full-disk DIR        (DIR: a small file system, e.g. a tmpfs)

Each prints what the parent checks as lines "REPORT <json>" on stdout.  The arrays are
`new_array(shape)`, which the parent computes alike.
"""
from __future__ import annotations

import atexit
import json
import os
import pickle
import sys
import threading
import time

import jax
import numpy as np

import pencilfft
from pencilfft._processes import io as _io
from pencilfft._processes import callback_watch, exits
from pencilfft._processes.agree import DifferentPlansError

_SYSTEM_EXIT_CODE = SystemExit.__dict__["code"]  # before anything replaces it

# `spawn` calls initialize() at the top of the module, as the docs show: a spawn or forkserver
# child of this process imports the module again, and so runs it again (issue 68).
# `spawn coordinator`: a job of one process, set up by hand (a coordinator, no launcher).
if sys.argv[1:2] == ["spawn"]:
    if sys.argv[2:3] == ["coordinator"]:
        pencilfft.initialize(coordinator_address=os.environ["PENCILFFT_TEST_COORDINATOR"],
                             num_processes=1, process_id=0)
    else:
        pencilfft.initialize()


def new_array(shape) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) + 1.0


def old_array(shape) -> np.ndarray:
    return np.full(shape, -7.0)


def _global(data: np.ndarray) -> jax.Array:
    n = len(jax.devices())
    mesh = jax.make_mesh((n // 2, 2) if n > 1 else (1, 1), ("x", "y"))
    sharding = pencilfft.real_space_sharding(mesh, data.ndim)
    return jax.make_array_from_callback(data.shape, sharding, lambda i: data[i])


def _report(**values) -> None:
    print("REPORT " + json.dumps(values), flush=True)


def abort() -> None:
    """Rank 1 dies of an uncaught exception while rank 0 waits for it in a collective."""
    pencilfft.initialize()
    rank = jax.process_index()
    hook = sys.excepthook
    installed = bool(getattr(hook, "_pencilfft_abort", False))
    pencilfft.initialize()  # idempotent: the same hook, not a second one around it
    once = sys.excepthook is hook and hook._pencilfft_previous is sys.__excepthook__
    pencilfft.initialize(abort_on_error=False)
    removed = (sys.excepthook is sys.__excepthook__
               and SystemExit.__dict__["code"] is _SYSTEM_EXIT_CODE)  # SystemExit as it was
    pencilfft.initialize()
    _report(rank=rank, installed=installed, once=once, removed=removed,
            reinstalled=bool(getattr(sys.excepthook, "_pencilfft_abort", False)))
    x = _global(new_array((4, 4, 2)))
    from mpi4py import MPI

    # Both reports written before rank 1 fails: the abort kills mpirun's forwarder, and rank
    # 0's line must not be the one still in its pipe.
    MPI.COMM_WORLD.Barrier()
    if rank == 1:
        _report(raising_at=time.time())
        raise RuntimeError("boom on rank 1")
    pencilfft.gather(x)  # rank 1 never comes: only the abort ends this process
    _report(unreachable=True)


def stop() -> None:
    """Both ranks wait in a collective that never completes, until a signal ends the job:
    rank 0 in a jax (gloo) collective, rank 1 in an MPI barrier, both in C with the GIL
    released, where a Python-level signal handler alone would never run."""
    pencilfft.initialize()
    rank = jax.process_index()
    x = _global(new_array((4, 4, 2)))
    total = jax.jit(lambda a: a.sum())
    jax.block_until_ready(total(x))  # the collectives work (and gloo has connected)
    _report(rank=rank, pid=os.getpid(), waiting_since=time.time())
    if rank == 0:
        jax.block_until_ready(total(x))  # rank 1 never joins
    else:
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()  # rank 0 never joins
    _report(unreachable=rank)


def end(how: str) -> None:
    """Rank 1 ends while rank 0 waits for it in a jax collective: by sys.exit(3) ("exit-3"), a
    bare `raise SystemExit(3)` ("raise-3") or an uncaught exception ("raise"); with "exit-0"
    every rank calls sys.exit(0) at the end, with "all-4" every rank raises SystemExit(4).

    Also under srun (tests/slurm): rank 0 waits in jax's collective, not MPI's, so that the
    job ends the same whichever way jax was started (MPI ranks, or Slurm's variables)."""
    pencilfft.initialize()
    rank = jax.process_index()
    x = _global(new_array((4, 4, 2)))
    total = jax.jit(lambda a: a.sum())
    jax.block_until_ready(total(x))  # every process is connected
    try:
        sys.exit(5)
    except SystemExit as e:
        caught = e.code  # a sys.exit that is caught (and its code read) ends nothing
    try:
        raise SystemExit(6)
    except SystemExit as e:
        caught = (caught, e.code)
    _report(rank=rank, pid=os.getpid(), caught=caught,
            wrapped=sys.exit is exits.exit,
            watched=SystemExit.__dict__["code"] is not _SYSTEM_EXIT_CODE)
    jax.block_until_ready(total(x))  # both reports are out before anything ends
    if how == "exit-0":
        _report(rank=rank, ending_at=time.time())
        sys.exit(0)
    if how == "all-4":  # as pytest ends every rank of a run that failed: all at once
        _report(rank=rank, ending_at=time.time())
        raise SystemExit(4)
    if rank == 1:
        _report(ending_at=time.time())
        if how == "exit-3":
            sys.exit(3)
        if how == "raise-3":
            raise SystemExit(3)
        raise RuntimeError("boom on rank 1")
    jax.block_until_ready(total(x))  # rank 1 never joins: only the job's end ends this
    _report(unreachable=True)


def callback(grace: str) -> None:
    """Rank 0's jax.debug.callback (not partitioned, so run on one device of rank 0 only)
    raises inside a computation with all-to-alls, on several devices per process: rank 0's
    other devices wait for the failed one, and every process in the collectives, forever
    (upstream); pencilfft's watch ends the job once rank 0 has not moved for `grace` s."""
    pencilfft.initialize()
    callback_watch.GRACE_S = float(grace)
    rank = jax.process_index()
    x = _global(new_array((8, 8, 8)).astype(np.complex64))
    plain = jax.jit(pencilfft.pfft3d)
    jax.block_until_ready(plain(x))  # every process is connected, and compiled

    def fail(total):
        if rank == 0:
            raise RuntimeError("boom in the callback")

    @jax.jit
    def failing(x):
        jax.debug.callback(fail, x.real.sum())
        return pencilfft.pfft3d(x)

    _report(rank=rank, waiting_since=time.time())
    jax.block_until_ready(failing(x))
    _report(unreachable=rank)


def top() -> None:
    """One process with the exit hooks of `initialize` (which installs them only under a
    launcher), as in a job of several processes: sys.exit(7) in a thread ends that thread
    only, then builtin exit(4) ends the process (and the job, which is this process)."""
    exits.install_exit_watch()
    exits._job_size = lambda: 2  # the others, as the key-value store would tell, are not ending
    try:
        exit(5)
    except SystemExit as e:
        _report(caught=e.code)
    thread = threading.Thread(target=sys.exit, args=(7,))
    thread.start()
    thread.join()
    _report(main_continues=True)
    exit(4)


def statuses(folder: str, *texts: str) -> None:
    """Each status of `texts` (Python expressions) in a child of its own, once for each way a
    program ends with it (`WAYS`: sys.exit(status), `raise SystemExit(status)`), with the exit
    hooks of `initialize` installed: alone ("one"), where Python's own exit must happen, and as
    process 0 of a job of 2 whose other process is not ending ("several"), where the job must
    be ended with the status Python would give.  Each child's standard error goes to
    FOLDER/<i>-<way>-<job>; reports each one's exit status."""
    import types

    exits.install_exit_watch()
    _report(exit_pickles=pickle.loads(pickle.dumps(sys.exit)) is sys.exit,
            wrapped=sys.exit is exits.exit)
    for i, text in enumerate(texts):
        for way in WAYS:
            for job in ("one", "several"):
                pid = os.fork()  # after jax's import, before any backend: no thread runs yet
                if pid:
                    _, wait_status = os.waitpid(pid, 0)
                    _report(i=i, way=way, job=job, status=os.waitstatus_to_exitcode(wait_status))
                    continue
                err = os.open(os.path.join(folder, f"{i}-{way}-{job}"),
                              os.O_WRONLY | os.O_CREAT, 0o600)
                os.dup2(err, 2)
                if job == "several":
                    exits._job_size = lambda: 2
                    exits.jax = types.SimpleNamespace(process_index=lambda: 0,
                                                      process_count=lambda: 2)
                status = eval(text, {})  # the test's own literals (2**40 among them)
                # Raised up to the top of this child, where the interpreter reads it.
                if way == "sys.exit":
                    sys.exit(status)
                raise SystemExit(status)


# How a program ends with a status, as `statuses` tries each (and test_reliability.py in plain
# Python): the statement, with STATUS for the status.  sys.exit is pencilfft's stand-in; a
# SystemExit raised in Python (builtin exit(n) too) is read through the watched `code`.
WAYS = {"sys.exit": "import sys; sys.exit(STATUS)", "raise": "raise SystemExit(STATUS)"}


def _in_child() -> list:
    """What a worker that multiprocessing started sees: [jax.distributed started, MPI started,
    a sum on its own devices]."""
    import jax.numpy as jnp

    return [jax.distributed.is_initialized(), "mpi4py.MPI" in sys.modules,
            float(jnp.arange(4.0).sum())]


def spawn(how: str = "mpirun") -> None:
    """initialize() ran at the top of this module, and runs again in each child that
    multiprocessing starts.  Under mpirun, a spawned `Process(target=sys.exit, args=(5,))` ends
    with status 5 (sys.exit pickles); with a coordinator, a forkserver pool's worker computes
    and returns `sys.exit(6)`'s SystemExit.  The job goes on (a collective across its
    processes); then, in a job of one process ("coordinator"), sys.exit(3) leaves through
    Python's own exit: the atexit handler runs."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    rank = jax.process_index()
    report = dict(rank=rank, count=jax.process_count())
    if how == "mpirun":
        child = multiprocessing.get_context("spawn").Process(target=sys.exit, args=(5,))
        child.start()
        child.join(120)
        report.update(spawned=child.exitcode)
    else:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool:
            report.update(work=pool.submit(_in_child).result(timeout=120))
            exited = pool.submit(sys.exit, 6).exception(timeout=120)
            report.update(pool_exit=[type(exited).__name__, exited.code])
    x = _global(new_array((4, 4, 2)))
    _report(**report, total=float(jax.jit(lambda a: a.sum())(x)))  # the job still works
    if how == "coordinator":
        atexit.register(_report, atexit_ran=True)
        sys.exit(3)


def differ() -> None:
    """Rank 1 plans another grid than rank 0 (caught: each reports its error), then, started
    with JAX_ENABLE_X64=1 where rank 0 was not, another dtype for the same float64 data
    (uncaught: the job must end)."""
    pencilfft.initialize()
    rank = jax.process_index()
    n = len(jax.devices())
    mesh = jax.make_mesh((n // 2, 2), ("x", "y"))
    try:
        pencilfft.pfft3d(np.zeros((16, 16, 8 if rank else 16), np.complex64), mesh=mesh)
        _report(rank=rank, shape_error=None)
    except DifferentPlansError as e:
        _report(rank=rank, shape_error=str(e))
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()  # both reports out before the abort below
    _report(rank=rank, x64=bool(jax.config.jax_enable_x64), raising_at=time.time())
    pencilfft.pfft3d(np.zeros((16, 16, 16)), mesh=mesh)
    _report(unreachable=True)


def kill_save(path: str, marker: str) -> None:
    """Save, and stop for good once the first block is in the file (the parent kills us)."""
    real = _io._local_shards
    reads = []

    class Stalling:
        def __init__(self, shard):
            self.shard = shard

        @property
        def data(self):
            reads.append(1)
            if len(reads) == 2:  # one block written, the next one never comes
                with open(marker, "w"):
                    pass
                time.sleep(600)
            return self.shard.data

    def stalling_shards(x):
        return {k: Stalling(v) for k, v in real(x).items()}

    _io._local_shards = stalling_shards
    pencilfft.save(path, _global(new_array((8, 8, 4))))
    _report(finished=True)


def size_limit(path: str, limit: str) -> None:
    """A file size limit (ulimit -f) smaller than the new file: EFBIG."""
    import resource

    x = _global(new_array((16, 16, 16)))
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), hard))
    try:
        pencilfft.save(path, x)
        _report(error=None)
    except OSError as e:
        _report(error=type(e).__name__, errno=e.errno, message=str(e))


def full_disk(directory: str) -> None:
    """A file system too small for the new array, with and without posix_fallocate."""
    path = os.path.join(directory, "field.npy")
    old = old_array((8, 8, 4))
    np.save(path, old)
    x = _global(new_array((64, 64, 64)))  # 2 MiB
    for preallocate in (True, False):
        if not preallocate:
            # As on a file system without fallocate: the blocks' pwrite meets the full disk.
            del os.posix_fallocate
        try:
            pencilfft.save(path, x)
            error = None
        except OSError as e:
            error = (type(e).__name__, e.errno, str(e))
        _report(preallocate=preallocate, error=error,
                old_intact=bool(np.array_equal(np.load(path), old)),
                files=sorted(os.listdir(directory)))


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    {"abort": abort, "stop": stop, "end": end, "top": top, "statuses": statuses, "spawn": spawn,
     "differ": differ, "callback": callback, "kill-save": kill_save, "size-limit": size_limit,
     "full-disk": full_disk}[what](*args)
