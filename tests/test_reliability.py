"""Failures must end in an error on every process, never in a hang or a damaged file (issue 11).

* `save` is atomic: killed, out of space, over a size limit or failing on one rank, the target
  keeps its old content and no temporary file stays behind (but after a kill -9).
* A bad or different argument on one rank (`root`, `comm`, `mesh`, a deleted array, another
  dtype or path) raises the same exception on every rank of scatter/gather/save/load.
* One rank dying of an uncaught exception ends the whole mpirun job within seconds.

The tests that need a process to die, a size limit or a small file system run children
(tests/mp/reliability_child.py), each under a hard time-out.  In-process tests that would
hang if the bug came back fail after DEADLINE seconds (faulthandler ends the process, and
mpirun every other one) instead of the runner's 300.
"""
from __future__ import annotations

import errno
import faulthandler
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import (MPIRUN, MULTI_PROCESS, RANK, barrier, clean_env, make_mesh, put_global, root_only,
                      seeded_data)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pencilfft
from pencilfft import gather, load, save, scatter
from pencilfft._processes import io as _io
from pencilfft._decomposition.sharding import real_space_sharding

LAST = jax.process_count() - 1
N = jax.process_count()
DEADLINE = 60  # seconds an in-process test may take before it counts as hanging
CHILD = Path(__file__).parent / "mp" / "reliability_child.py"
sys.path.insert(0, str(CHILD.parent))
from reliability_child import new_array, old_array  # noqa: E402

several_ranks = pytest.mark.skipif(not MULTI_PROCESS, reason="needs several ranks")


@pytest.fixture(autouse=True)
def _deadline(request):
    if request.node.get_closest_marker("mpirun") is None:
        yield  # one process only (some run children, each under its own time-out)
        return
    # The runner's plugin keeps the real stderr: pytest's capture would swallow the stacks.
    plugin = sys.modules.get("pencilfft_mpi_plugin")
    faulthandler.dump_traceback_later(DEADLINE, exit=True,
                                      file=getattr(plugin, "_STDERR", sys.stderr))
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _mesh_x_y():
    return make_mesh((4, 2))


def _x(data=None, mesh=None):
    data = seeded_data((8, 8, 2), np.float64) if data is None else data
    return put_global(data, real_space_sharding(mesh or _mesh_x_y(), data.ndim))


def _listing(directory: str) -> list[str]:
    return sorted(os.listdir(directory))


# ------------------------------------------------------------------------ save is atomic


def _fail_reserve(monkeypatch):
    if RANK == 0:  # only rank 0 creates the temporary file
        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(os, "posix_fallocate", full)
    return OSError, errno.ENOSPC


def _fail_write(monkeypatch):
    if RANK == LAST:
        def full(*args):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(_io, "_pwrite_block", full)
    return OSError, errno.ENOSPC


def _fail_sync(monkeypatch):
    if RANK == LAST:
        def broken(fd):
            raise OSError(errno.EIO, "Input/output error")
        monkeypatch.setattr(os, "fsync", broken)
    return OSError, errno.EIO


def _fail_rename(monkeypatch):
    if RANK == 0:
        def refused(src, dst):
            raise PermissionError(errno.EACCES, "Permission denied", dst)
        monkeypatch.setattr(os, "replace", refused)
    return PermissionError, errno.EACCES


def _fail_memory(monkeypatch):
    if RANK == LAST:
        def no_memory(*args):
            raise MemoryError("cannot allocate the block")
        monkeypatch.setattr(_io, "_write_blocks", no_memory)
    return MemoryError, None


@pytest.mark.parametrize("failure", [_fail_reserve, _fail_write, _fail_sync, _fail_rename,
                                     _fail_memory], ids=lambda f: f.__name__[6:])
@MPIRUN
def test_failed_save_leaves_target_untouched(failure, shared_dir, monkeypatch):
    """A full disk, an I/O error, a refused rename, no memory: on one rank, an error on all."""
    path = os.path.join(shared_dir, "field.npy")
    old = seeded_data((8, 8, 2), np.float64, seed=1)
    save(path, _x(old))
    new = _x(seeded_data((8, 8, 2), np.float64, seed=2))
    kind, number = failure(monkeypatch)
    with pytest.raises(kind) as info:
        save(path, new)
    monkeypatch.undo()
    if number is not None:
        assert info.value.errno == number
        assert f"cannot save {path!r}" in str(info.value) and "is unchanged" in str(info.value)
    barrier()
    if RANK == 0:
        np.testing.assert_array_equal(np.load(path), old)
        assert _listing(shared_dir) == ["field.npy"]  # the temporary file is gone
    barrier()


@MPIRUN
def test_save_leaves_only_the_target(shared_dir):
    path = os.path.join(shared_dir, "field.npy")
    data = seeded_data((8, 8, 2), np.complex64)
    save(path, _x(data))
    save(path, _x(data * 2))  # over an existing file
    if RANK == 0:
        assert _listing(shared_dir) == ["field.npy"]
        np.testing.assert_array_equal(np.load(path), data * 2)


@MPIRUN
def test_save_keeps_permissions_and_symlinks(shared_dir):
    real = os.path.join(shared_dir, "real.npy")
    link = os.path.join(shared_dir, "link.npy")
    if RANK == 0:
        np.save(real, np.zeros(3))
        os.chmod(real, 0o640)
        os.symlink(real, link)
    barrier()
    data = seeded_data((8, 8, 2), np.float32)
    save(link, _x(data))
    if RANK == 0:
        assert os.path.islink(link) and os.readlink(link) == real
        assert os.stat(real).st_mode & 0o777 == 0o640
        np.testing.assert_array_equal(np.load(real), data)
        assert _listing(shared_dir) == ["link.npy", "real.npy"]


@MPIRUN
def test_save_new_file_follows_umask(shared_dir):
    path = os.path.join(shared_dir, "new.npy")
    save(path, _x())
    if RANK == 0:
        umask = os.umask(0)
        os.umask(umask)
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # as numpy.save


# ----------------------------------------------------------------- disagreement between ranks


@MPIRUN
@several_ranks
@pytest.mark.parametrize("func", ["scatter", "gather"])
def test_root_invalid_on_one_rank(func):
    mesh = _mesh_x_y()
    root = N if RANK == LAST else 0
    message = f"`root` must be a rank in [0, {N}); got {N} (on rank {LAST})"
    with pytest.raises(ValueError, match=re.escape(message)):
        if func == "scatter":
            scatter(root_only(np.zeros((8, 8, 2))), mesh, root=root)
        else:
            gather(_x(mesh=mesh), root=root)


@MPIRUN
@several_ranks
@pytest.mark.parametrize("func", ["scatter", "gather"])
def test_root_differs_between_ranks(func):
    mesh = _mesh_x_y()
    root = 1 if RANK == LAST else 0
    message = "`root` must be the same on every rank; got 0 on rank"
    with pytest.raises(ValueError, match=re.escape(message)):
        if func == "scatter":
            scatter(root_only(np.zeros((8, 8, 2))), mesh, root=root)
        else:
            gather(_x(mesh=mesh), root=root)


def _call(func: str, comm, shared_dir: str):
    """func with `comm` on this rank; the same valid arguments otherwise."""
    mesh = _mesh_x_y()
    path = os.path.join(shared_dir, "c.npy")
    if func == "scatter":
        return scatter(root_only(np.zeros((8, 8, 2))), mesh, comm=comm)
    if func == "gather":
        return gather(_x(mesh=mesh), comm=comm)
    if func == "save":
        return save(path, _x(mesh=mesh), comm=comm)
    return load(path, mesh, comm=comm)


@MPIRUN
@several_ranks
@pytest.mark.parametrize("func", ["scatter", "gather", "save", "load"])
@pytest.mark.parametrize("other", ["self", "duplicate", "string"])
def test_comm_differs_on_one_rank(func, other, shared_dir):
    from mpi4py import MPI

    if func == "load" and RANK == 0:
        np.save(os.path.join(shared_dir, "c.npy"), np.zeros((8, 8, 2)))
    barrier()
    world = MPI.COMM_WORLD
    # Dup is collective: every rank makes the duplicate, only the last one passes it.
    duplicate = world.Dup() if other == "duplicate" else None
    comm = world
    if RANK == LAST:
        comm = {"self": MPI.COMM_SELF, "duplicate": duplicate, "string": "world"}[other]
    expected = {
        "self": (ValueError, re.escape(f"`comm` must have one rank per jax process: it has 1 "
                                       f"ranks but jax runs {N} processes")),
        "duplicate": (ValueError, re.escape("`comm` must be the same on every rank; got "
                                            "MPI.COMM_WORLD on rank") + ".*"
                      + re.escape(f"a duplicate of MPI.COMM_WORLD on rank {LAST}")),
        "string": (TypeError, re.escape(f"`comm` must be an mpi4py communicator; got str "
                                        f"(on rank {LAST})")),
    }[other]
    try:
        with pytest.raises(expected[0], match=expected[1]):
            _call(func, comm, shared_dir)
    finally:
        if duplicate is not None:
            duplicate.Free()
    _call("gather", world, shared_dir)  # and everything still works afterwards


@MPIRUN
@several_ranks
def test_reordered_comm_names_root_in_its_order():
    """`root` is a rank of `comm`: with the ranks reversed, root 0 is the last process."""
    from mpi4py import MPI

    reversed_comm = MPI.COMM_WORLD.Split(0, N - 1 - RANK)
    try:
        data = seeded_data((8, 8, 2), np.float64)
        x = scatter(data if RANK == LAST else None, _mesh_x_y(), root=0, comm=reversed_comm)
        got = gather(x, root=0, comm=reversed_comm)
    finally:
        reversed_comm.Free()
    if RANK == LAST:
        np.testing.assert_array_equal(got, data)
    else:
        assert got is None


def _other_mesh(kind: str) -> Mesh:
    if kind == "shape":
        return make_mesh((2, 4))
    devices = np.array(jax.devices()[::-1]).reshape(4, 2)  # the same axes, devices reversed
    return Mesh(devices, ("x", "y"), axis_types=_mesh_x_y().axis_types)


@MPIRUN
@several_ranks
@pytest.mark.parametrize("func", ["scatter", "load"])
@pytest.mark.parametrize("kind", ["shape", "device-order"])
def test_mesh_differs_on_one_rank(func, kind, shared_dir):
    """Before, each rank built its blocks for its own mesh: a wrong array, no error."""
    mesh = _other_mesh(kind) if RANK == LAST else _mesh_x_y()
    data = seeded_data((8, 8, 2), np.float64)
    path = os.path.join(shared_dir, "m.npy")
    if RANK == 0:
        np.save(path, data)
    barrier()
    with pytest.raises(ValueError, match=r"`mesh` must be the same on every rank; got axes"):
        if func == "scatter":
            scatter(root_only(data), mesh)
        else:
            load(path, mesh)


@MPIRUN
@several_ranks
@pytest.mark.parametrize("func", ["gather", "save"])
def test_array_deleted_on_one_rank(func, shared_dir):
    """Before, gather hung the root (the rank with the deleted array never sent)."""
    x = _x()
    if RANK == LAST:
        x.delete()
    with pytest.raises(ValueError, match=re.escape("`x` has been deleted") + ".*"
                       + re.escape(f"(on rank {LAST})")):
        gather(x) if func == "gather" else save(os.path.join(shared_dir, "d.npy"), x)
    if RANK == 0:
        assert _listing(shared_dir) == []


@MPIRUN
@several_ranks
@pytest.mark.parametrize("func", ["gather", "save"])
@pytest.mark.parametrize("kind", ["dtype", "sharding"])
def test_array_differs_on_one_rank(func, kind, shared_dir):
    data = seeded_data((8, 8, 2), np.float64)
    x = _x(data)
    if RANK == LAST:
        x = (_x(data.astype(np.float32)) if kind == "dtype"
             else put_global(data, NamedSharding(_mesh_x_y(), P(None, "x"))))
    with pytest.raises(ValueError, match=r"`x` must be the same on every rank; got shape"):
        gather(x) if func == "gather" else save(os.path.join(shared_dir, "d.npy"), x)


@MPIRUN
@several_ranks
def test_save_path_differs_on_one_rank(shared_dir):
    name = "b.npy" if RANK == LAST else "a.npy"
    with pytest.raises(ValueError, match=r"`path` must be the same on every rank"):
        save(os.path.join(shared_dir, name), _x())
    if RANK == 0:
        assert _listing(shared_dir) == []


@MPIRUN
def test_load_failure_on_one_rank_reaches_all(shared_dir, monkeypatch):
    """An error while reading the blocks (after the checks) still reaches every rank."""
    path = os.path.join(shared_dir, "r.npy")
    if RANK == 0:
        np.save(path, np.zeros((8, 8, 2)))
    barrier()
    if RANK == LAST:
        def failing(*args):
            raise OSError(errno.EIO, "Input/output error")
        monkeypatch.setattr(_io, "_assemble", failing)
    with pytest.raises(OSError, match=r"Input/output error") as info:
        load(path, _mesh_x_y())
    assert info.value.errno == errno.EIO


# --------------------------------------------------------------- shardings: remaining input


@pytest.mark.parametrize("func", ["real_space_sharding", "k_space_sharding"])
def test_sharding_rejects_missing_mesh(func):
    with pytest.raises(TypeError, match=r"`mesh` must be a jax.sharding.Mesh .*; got None"):
        getattr(pencilfft, func)(None)


@pytest.mark.parametrize("ndim,error,message", [
    (0, ValueError, "`ndim` must be at least 3 (the global dimensions (..., X, Y, Z)); got 0"),
    (2, ValueError, "`ndim` must be at least 3 (the global dimensions (..., X, Y, Z)); got 2"),
    (3.0, TypeError, "`ndim` must be an integer >= 3 (the global dimensions (..., X, Y, Z)); "
                     "got 3.0 (float)"),
    (True, TypeError, "`ndim` must be an integer >= 3"),
])
@pytest.mark.parametrize("func", ["real_space_sharding", "k_space_sharding"])
def test_sharding_rejects_ndim(func, ndim, error, message):
    mesh = _mesh_x_y()
    args = (mesh, ndim) if func == "real_space_sharding" else (mesh, "transposed", ndim)
    with pytest.raises(error, match=re.escape(message)):
        getattr(pencilfft, func)(*args)
    assert getattr(pencilfft, func)(*args[:-1], np.int64(4)).spec == (
        P(None, "x", "y", None))  # numpy integers are integers


# ---------------------------------------------------------------------------- in children


def _reports(stdout: str) -> list[dict]:
    # Two ranks' lines can interleave on mpirun's stdout: find each report, not each line.
    return [json.loads(m) for m in re.findall(r"REPORT (\{[^{}]*\})", stdout)]


def _run(argv, env, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{argv[:3]} still running after {timeout} s:\n{e.stdout}\n{e.stderr}")
    return done, time.monotonic() - start


def test_uncaught_exception_ends_the_mpi_job():
    """Before, rank 1 sat in jax's shutdown and rank 0 in the collective: minutes, or forever."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    done, _ = _run([str(mpirun), "-np", "2", sys.executable, str(CHILD), "abort"],
                   clean_env(2), timeout=120)
    ended = time.time()
    reports = _reports(done.stdout)
    hooks = sorted((r for r in reports if "rank" in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in hooks] == [0, 1], done.stdout + done.stderr
    for r in hooks:  # installed once, removable, installed again
        assert r["installed"] and r["once"] and r["removed"] and r["reinstalled"], r
    (raised,) = [r["raising_at"] for r in reports if "raising_at" in r]
    assert ended - raised < 30, f"the job took {ended - raised:.0f} s to end after the error"
    assert not any("unreachable" in r for r in reports)
    assert done.returncode != 0
    assert "RuntimeError: boom on rank 1" in done.stderr  # the traceback is printed
    assert "pencilfft: uncaught RuntimeError in process 1 of 2; aborting" in done.stderr


@pytest.mark.parametrize("how", ["exit-3", "raise-3", "exit-0", "all-4"])
def test_sys_exit_on_one_rank_ends_the_mpi_job(how):
    """Before, sys.exit(3) on rank 1 left it in jax's shutdown (300 s) and rank 0 in its
    collective; then both aborted and the status was lost (issues 48 and 51), and a bare
    `raise SystemExit(3)` did so still (issue 57: 309-320 s, status 6).  Now the job ends
    within seconds with status 3, while sys.exit(0) on every rank stays a clean exit, and
    SystemExit(4) on every rank (as pytest's, on every rank of a run that failed) ends each
    rank as Python would, no rank cut short.  Four devices per process, as in issue 57."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    done, _ = _run([str(mpirun), "-np", "2", sys.executable, str(CHILD), "end", how],
                   clean_env(4), timeout=120)
    ended = time.time()
    reports = _reports(done.stdout)
    ranks = sorted((r for r in reports if "caught" in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1], done.stdout + done.stderr
    for r in ranks:  # sys.exit is wrapped, SystemExit watched; a caught exit ended nothing
        assert r["wrapped"] and r["watched"] and r["caught"] == [5, 6], r
    ending = [r["ending_at"] for r in reports if "ending_at" in r]
    assert ending and ended - max(ending) < 30, f"the job took {ended - max(ending):.0f} s to end"
    assert not any("unreachable" in r for r in reports)
    if how in ("exit-3", "raise-3"):
        way = "sys.exit" if how == "exit-3" else "SystemExit"
        assert done.returncode == 3, (done.returncode, done.stderr)
        assert (f"pencilfft: process 1 of 2 exits with status 3 ({way}); ending every process"
                in done.stderr), done.stderr
    else:  # every rank ends: through jax's shutdown, each with its status, nothing aborted
        assert done.returncode == (0 if how == "exit-0" else 4), done.stderr
        assert len(ending) == 2 and "exits with status" not in done.stderr, done.stderr
        assert "MPI_Abort" not in done.stderr


def test_builtin_exit_ends_the_job_and_a_threads_exit_does_not():
    """The builtin exit(n) (a SystemExit raised in Python, as `raise SystemExit(n)`) reaches
    the hook as sys.exit does (the interpreter reads its status); a caught one and sys.exit in
    a thread (which ends that thread only, as in plain Python) end nothing.  One process with
    the hooks installed by hand: the same path as under mpirun, where the end is MPI_Abort."""
    done, _ = _run([sys.executable, str(CHILD), "top"], clean_env(1), timeout=60)
    assert done.returncode == 4, done.stderr
    # exit(5) caught (read by Python), the thread's exit silent, the main thread went on
    assert _reports(done.stdout) == [{"caught": 5}, {"main_continues": True}], done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert ("pencilfft: process 0 of 1 exits with status 4 (SystemExit); ending every process"
            in done.stderr), done.stderr


@pytest.mark.parametrize("launcher", ["mpirun", "coordinator"])
def test_children_of_multiprocessing_do_not_join_the_job(launcher):
    """Issue 68: with initialize() at the top of the script, as the docs show, a spawned child
    (or a ProcessPoolExecutor worker) ran it again: under mpirun it died starting MPI
    (PMI_Init failed, status 15 instead of 5), and with a coordinator jax's coordination
    service aborted the parent ("a different incarnation").  Now a child of multiprocessing
    (spawn under mpirun, a forkserver pool with a coordinator) starts nothing; sys.exit
    pickles (spawn's target, a pool's task); the job goes on; and a job of one process exits
    as Python does, its atexit handlers run (it left through os._exit)."""
    argv = [sys.executable, str(CHILD), "spawn"]
    env = clean_env(4)
    if launcher == "mpirun":
        mpirun = Path(sys.executable).parent / "mpirun"
        if not mpirun.exists():
            pytest.skip(f"no mpirun next to {sys.executable}")
        argv = [str(mpirun), "-np", "2", *argv]
    else:
        argv.append("coordinator")
        env["PENCILFFT_TEST_COORDINATOR"] = f"127.0.0.1:{_free_port()}"
    # A session of its own: a child left behind (a forkserver that the aborted parent left,
    # before) holds the output open and is ended with the rest.
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        out, err = job.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        pytest.fail(f"still running after 240 s:\n{out}\n{err}")
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    done = subprocess.CompletedProcess(argv, job.returncode, out, err)
    reports = _reports(done.stdout)
    ranks = sorted((r for r in reports if "rank" in r), key=lambda r: r["rank"])
    size = 2 if launcher == "mpirun" else 1
    assert [r["rank"] for r in ranks] == list(range(size)), done.stdout + done.stderr
    for r in ranks:
        assert r["count"] == size and r["total"] == new_array((4, 4, 2)).sum(), r
    if launcher == "mpirun":  # a spawned Process(target=sys.exit, args=(5,)) on each rank
        assert [r["spawned"] for r in ranks] == [5, 5], done.stderr[-3000:]
        assert done.returncode == 0, done.stderr[-3000:]
    else:  # a forkserver pool's worker
        (r,) = ranks
        assert r["work"] == [False, False, 6.0], r  # jax.distributed, MPI, its own sum
        assert r["pool_exit"] == ["SystemExit", 6], r
        # sys.exit(3) in a job of one process: Python's own exit, atexit handlers and all
        assert done.returncode == 3, done.stderr[-3000:]
        assert {"atexit_ran": True} in reports, done.stdout
        assert "ending every process" not in done.stderr, done.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_that_differ_end_the_mpi_job_naming_the_difference():
    """Issue 57: under mpirun, a rank started with JAX_ENABLE_X64=1 (float64 data planned as
    complex128 where the other rank planned complex64), or planning another global shape, hung
    in silence until killed.  Now every rank raises DifferentPlansError naming each rank's
    value, and, uncaught, it ends the job within seconds with a non-zero status."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    child = [sys.executable, str(CHILD), "differ"]
    # MPMD: rank 1 alone gets JAX_ENABLE_X64=1 (Hydra's per-program -env, as MPICH's mpirun).
    done, took = _run([str(mpirun), "-np", "1", *child, ":", "-np", "1", "-env", "JAX_ENABLE_X64",
                       "1", *child], clean_env(4), timeout=90)
    ended = time.time()
    reports = _reports(done.stdout)
    shapes = sorted((r for r in reports if "shape_error" in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in shapes] == [0, 1], done.stdout + done.stderr
    for r in shapes:
        assert ("real_shape: process 0: (16, 16, 16), process 1: (16, 16, 8)"
                in r["shape_error"]), r
    raising = sorted((r for r in reports if "raising_at" in r), key=lambda r: r["rank"])
    assert [r["x64"] for r in raising] == [False, True], done.stdout
    assert ended - max(r["raising_at"] for r in raising) < 30, f"{took:.0f} s in all"
    assert not any("unreachable" in r for r in reports)
    assert done.returncode != 0
    assert ("real_dtype: process 0: 'complex64', process 1: 'complex128'" in done.stderr
            and "jax_enable_x64: process 0: False, process 1: True" in done.stderr), done.stderr
    assert "pencilfft: uncaught DifferentPlansError in process" in done.stderr


def test_a_failed_callback_among_several_local_devices_ends_the_mpi_job():
    """Issue 57 (upstream): an exception in a jax.debug.callback that is not partitioned, with
    4 devices per process, left the process's other devices in the collective and every rank
    waiting (420 s under mpirun, until killed).  pencilfft says so at once and ends the job
    once the process has not moved for the grace time (2 s here, 30 s by default)."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    done, _ = _run([str(mpirun), "-np", "2", sys.executable, str(CHILD), "callback", "2"],
                   clean_env(4), timeout=90)
    ended = time.time()
    reports = _reports(done.stdout)
    waiting = [r["waiting_since"] for r in reports if "waiting_since" in r]
    assert len(waiting) == 2, done.stdout + done.stderr
    assert ended - max(waiting) < 45, f"the job took {ended - max(waiting):.0f} s to end"
    assert not any("unreachable" in r for r in reports)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "RuntimeError: boom in the callback" in done.stderr  # jax's own log of it
    assert ("pencilfft: jax.debug.callback raised in process 0 of 2, which has 4 devices"
            in done.stderr), done.stderr
    assert ("pencilfft: process 0 of 2 has not moved for 2 s since its jax.debug.callback "
            "raised; ending every process of the job" in done.stderr), done.stderr
    assert "partitioned=True" in done.stderr


def test_callback_watch_ends_a_stuck_process_only(monkeypatch, capsys):
    """The watch is a filter (jax's record still reaches logging), once per logger, removed with
    the hook; it ends the job when the main thread stays in one place in jax, and leaves a
    program that goes on alone (or waits in its own code)."""
    import logging

    from pencilfft._processes import callback_watch, ending

    ended = _no_ending(monkeypatch)
    monkeypatch.setattr(callback_watch.jax, "process_count", lambda: 2)
    monkeypatch.setattr(callback_watch, "GRACE_S", 0.1)
    logger = logging.getLogger("jax._src.debugging")
    seen = []
    logger.addHandler(seen_handler := logging.Handler())
    seen_handler.emit = seen.append
    try:
        callback_watch.install()
        callback_watch.install()
        assert sum(isinstance(f, callback_watch._CallbackWatch) for f in logger.filters) == 1

        def fail():
            logger.error("jax.debug.callback failed")
            assert len(seen) == 1  # let through
            seen.clear()

        class Waiting:  # as an array whose computation never ends
            def block_until_ready(self):
                time.sleep(0.6)

        fail()
        jax.block_until_ready(Waiting())  # stuck in one place, in jax
        assert ended == [1]
        err = capsys.readouterr().err
        assert "pencilfft: jax.debug.callback raised in process" in err
        assert "has not moved for 0.1 s since its jax.debug.callback raised" in err
        fail()
        time.sleep(1.2)  # ten times the grace, in a place of its own (not jax's)
        assert ended == [1]
    finally:
        logger.removeHandler(seen_handler)
        callback_watch.remove()
    assert not any(isinstance(f, callback_watch._CallbackWatch) for f in logger.filters)


def _no_ending(monkeypatch) -> list[int]:
    """What `ending` would end the job with, recorded instead (nothing is ended)."""
    from pencilfft._processes import ending

    ended = []
    monkeypatch.setattr(ending, "stop_stdout_filter", lambda: None)
    monkeypatch.setattr(ending, "wait_until_read", lambda timeout: None)
    monkeypatch.setattr(ending, "abort_job", lambda status: ended.append(status))
    return ended


def test_sys_exit_hook_reads_the_status_only_at_the_top(monkeypatch, capsys):
    """sys.exit's stand-in raises a SystemExit that ends the job only when the interpreter reads
    its code (no Python caller), in a job of several processes; caught and read by Python
    code, it is a plain SystemExit, as the built-in's.  It pickles (issue 68: a spawned
    `Process(target=sys.exit)` raised AttributeError, and the abort hook ended the parent)."""
    from pencilfft._processes import exits

    ended = _no_ending(monkeypatch)
    monkeypatch.setattr(sys, "exit", sys.exit)  # both restored afterwards, whatever happens
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    member = SystemExit.__dict__["code"]
    try:
        for watched in (True, False):  # SystemExit watched, or (elsewhere) _JobExit instead
            exits.remove()
            previous = sys.exit
            if not watched:
                monkeypatch.setattr(exits, "_set_system_exit_code", lambda d: False)
            exits.install_exit_watch()
            exits.install_exit_watch()  # once
            assert sys.exit is exits.exit
            assert pickle.loads(pickle.dumps(sys.exit)) is sys.exit
            assert (SystemExit.__dict__["code"] is not member) == watched
            for status, code, args in ((3, 3, (3,)), (None, None, ()), ("bye", "bye", ("bye",)),
                                       ((1, 2), (1, 2), (1, 2)), ((), None, ()),
                                       ((3,), 3, (3,))):
                with pytest.raises(SystemExit) as info:
                    sys.exit(status)
                assert info.value.code == code and info.value.args == args  # as the built-in's
                assert (type(info.value) is SystemExit) == watched
                with pytest.raises(SystemExit) as info:
                    raise SystemExit(status)
                assert info.value.code == status
            assert ended == []  # read from Python: nothing ended
            exits.remove()
            assert sys.exit is previous
            assert SystemExit.__dict__["code"] is member
    finally:
        exits._unwatch_system_exit()
    # As the interpreter reads it at the very end, in a job of several processes: the job
    # ends with the status Python gives.
    monkeypatch.setattr(exits, "_job_size", lambda: 2)
    for code, status in ((3, 3), (256 + 7, 7), ("bye", 1), (-1, 255), ((3,), 1), (2 ** 70, 255)):
        exits._end_job_on_exit(code)
        assert ended[-1] == status
    for clean in (0, None, 256):
        exits._end_job_on_exit(clean)
    assert ended == [3, 7, 1, 255, 1, 255]
    err = capsys.readouterr().err
    assert f"pencilfft: process {RANK} of {N} exits with status 3 (sys.exit)" in err
    assert "bye\npencilfft: process" in err and "(3,)\npencilfft: process" in err  # as Python
    # A job of one process (issue 68: os._exit, atexit handlers skipped): nothing ended here,
    # Python's own exit goes on.
    monkeypatch.setattr(exits, "_job_size", lambda: 1)
    exits._end_job_on_exit(3)
    assert ended == [3, 7, 1, 255, 1, 255] and capsys.readouterr().err == ""


# Statuses a program may exit with: None, integers (beyond a byte, negative, a bool), text,
# tuples (Python 3.11 and 3.12 differ for (): status 1 and 0; for (3,): 1 and 3).  Each costs a
# child that leaves through Python's own exit (0.3 s of CPU with jax imported).
STATUSES = ["None", "3", "263", "-1", "True", "'bye'", "()", "(3,)", "(1, 2)"]


@pytest.fixture(scope="module")
def exits_with_hooks(tmp_path_factory) -> dict:
    """{(status, way, job): (exit status, standard error)} of a process with the exit hooks of
    `initialize`, for each of STATUSES, each way a program ends with it and each job (one
    child importing pencilfft, forked per case: tests/mp/reliability_child.py statuses)."""
    folder = tmp_path_factory.mktemp("statuses")
    done, _ = _run([sys.executable, str(CHILD), "statuses", str(folder), *STATUSES],
                   clean_env(1), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = _reports(done.stdout)
    assert reports[0] == {"exit_pickles": True, "wrapped": True}, reports[0]
    return {(STATUSES[r["i"]], r["way"], r["job"]):
            (r["status"], (folder / f"{r['i']}-{r['way']}-{r['job']}").read_text())
            for r in reports[1:]}


@pytest.mark.parametrize("status", STATUSES)
def test_exit_keeps_pythons_semantics(exits_with_hooks, status):
    """Issue 68: the wrapped sys.exit exited 0 for sys.exit(()) (Python: prints "()", status
    1 on 3.11) and 3 for sys.exit((3,)) (Python 3.11: 1), and a job of one process left every
    non-zero exit through os._exit.  Now each way to exit gives what plain Python gives, on
    this interpreter: alone, the same status and output; as one process of several, the same
    status and output, then the line saying the job ends."""
    from reliability_child import WAYS

    for way, statement in WAYS.items():
        plain = subprocess.run([sys.executable, "-c", statement.replace("STATUS", status)],
                               capture_output=True, text=True, timeout=60, env=clean_env(1))
        assert exits_with_hooks[status, way, "one"] == (plain.returncode, plain.stderr), way
        code, err = exits_with_hooks[status, way, "several"]
        assert code == plain.returncode, way
        if code == 0:
            assert err == plain.stderr == "", way
        else:
            assert err.startswith(plain.stderr + "pencilfft: process 0 of 2 exits with status "
                                  f"{code} ({'sys.exit' if way == 'sys.exit' else 'SystemExit'}); "
                                  "ending every process of the job"), (way, err)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone_within(pids, seconds: float) -> list[int]:
    """The pids still alive after `seconds` (a process being torn down takes a moment)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("how", ["timeout-TERM", "INT-one-rank"])
def test_signal_ends_the_mpi_job(how):
    """Before, jax.distributed's handler logged "SIGTERM caught" and the ranks kept waiting in
    their collective: `timeout`, scancel or Ctrl-C left them running until SIGKILL (and past
    mpirun's own end).  Now the job ends within seconds, no rank left behind."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists() or not shutil.which("timeout"):
        pytest.skip(f"no mpirun next to {sys.executable}, or no timeout(1)")
    # timeout(1) as in a batch script: its TERM (here sent by hand once both ranks wait,
    # as at its expiry) goes to mpirun and the ranks.
    argv = ["timeout", "-s", "TERM", "-k", "60", "600", str(mpirun), "-np", "2",
            sys.executable, str(CHILD), "stop"]
    job = subprocess.Popen(argv, env=clean_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    out, pids = "", []
    try:
        deadline = time.monotonic() + 120
        while len(pids) < 2 and time.monotonic() < deadline and job.poll() is None:
            line = job.stdout.readline()
            out += line
            pids += [r["pid"] for r in _reports(line) if "pid" in r]
        assert len(pids) == 2, f"the ranks never got to wait:\n{out}"
        time.sleep(1)  # both are inside their collective now
        sent = time.monotonic()
        if how == "timeout-TERM":
            job.send_signal(signal.SIGTERM)
        else:
            os.kill(pids[1], signal.SIGINT)  # Ctrl-C reaching one rank
        rest, err = job.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
        for pid in pids:  # never leave a rank behind, even when the test fails
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert took < 20, f"the job took {took:.0f} s to end after the signal"
    assert _gone_within(pids, 10) == [], "a rank outlived the job"
    assert job.returncode != 0
    name = "SIGTERM" if how == "timeout-TERM" else "SIGINT"
    assert re.search(rf"pencilfft: process \d of 2 received {name}; ending every process of the "
                     rf"job \(exit status {128 + getattr(signal, name)}", err), err
    assert "SIGTERM caught" not in err  # jax's preemption handler no longer takes it
    assert not any("unreachable" in r for r in _reports(out + rest))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_run_sh_stops_its_step_when_stopped(tmp_path, sig):
    """Before, a killed tests/run.sh left its pytest (and mpirun's ranks) running: bash runs a
    trap only after the foreground command.  A stand-in python records its pid and sleeps."""
    fake = tmp_path / "python"
    pidfile = tmp_path / "step.pid"
    fake.write_text(textwrap.dedent(f"""\
        #!/usr/bin/env bash
        if [ "$1" = -c ]; then echo "{tmp_path}/python"; exit 0; fi
        echo $$ > "{pidfile}"
        exec sleep 600
        """))
    fake.chmod(0o755)
    run_sh = Path(__file__).parent / "run.sh"
    env = dict(clean_env(8), PYTHON=str(fake), PENCILFFT_STEP_TIMEOUT="300")
    proc = subprocess.Popen(["bash", str(run_sh)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    step = None
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the pid is written
        step = int(pidfile.read_text())
        sent = time.monotonic()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        if step is not None and _alive(step):
            os.kill(step, signal.SIGKILL)
    assert took < 10, f"run.sh took {took:.0f} s to stop"
    assert proc.returncode == 128 + sig, out
    assert _gone_within([step], 5) == [], "the step outlived run.sh"
    assert "== tests/run.sh stopped: stopping the running step" in out
    assert "mpirun -np 2" not in out  # no further step started


def test_abort_hook_prints_then_waits_then_aborts(monkeypatch, capsys):
    from pencilfft._processes import ending, exits

    calls = []
    monkeypatch.setattr(ending, "wait_until_read", lambda timeout: calls.append("wait"))
    monkeypatch.setattr(ending, "abort_job", lambda status: calls.append(f"abort {status}"))
    # gloo's filter forwards what it holds before the launcher is waited for
    monkeypatch.setattr(ending, "stop_stdout_filter", lambda: calls.append("unfilter"))
    hook = exits._make_abort_hook(lambda *a: calls.append("traceback"), 1, 2)
    hook(RuntimeError, RuntimeError("boom"), None)
    assert calls == ["traceback", "unfilter", "wait", "abort 1"]
    assert "pencilfft: uncaught RuntimeError in process 1 of 2; aborting" in capsys.readouterr().err
    # A job of one process (issue 68): the traceback, then Python's own exit, atexit and all.
    calls.clear()
    exits._make_abort_hook(lambda *a: calls.append("traceback"), 0, 1)(
        RuntimeError, RuntimeError("boom"), None)
    assert calls == ["traceback"] and capsys.readouterr().err == ""


def test_stop_job_says_why_then_ends_with_128_plus_the_signal(monkeypatch, capsys):
    from pencilfft._processes import ending, signals

    calls = []
    monkeypatch.setattr(ending, "stop_stdout_filter", lambda: calls.append("unfilter"))
    monkeypatch.setattr(ending, "wait_until_read", lambda timeout: calls.append("wait"))
    monkeypatch.setattr(ending, "abort_job", lambda status: calls.append(status))
    try:
        signals.stop_job(signal.SIGTERM)
    finally:
        signals._SignalState.stopping.release()  # a real signal may still come
    assert calls == ["unfilter", "wait", 143]
    assert (f"pencilfft: process {RANK} of {N} received SIGTERM; ending every process of the job "
            "(exit status 143") in capsys.readouterr().err


def test_abort_waits_until_the_launcher_read_the_output():
    """The launcher kills its own forwarder with the job: the traceback's end was lost before."""
    import threading

    from pencilfft._processes.ending import wait_until_read

    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"RuntimeError: boom\n")
        got = []
        reader = threading.Timer(0.3, lambda: got.append(os.read(read_end, 100)))
        start = time.monotonic()
        reader.start()
        wait_until_read((write_end,), timeout=20)
        waited = time.monotonic() - start
        reader.join()
        assert got == [b"RuntimeError: boom\n"]
        assert 0.25 < waited < 10, waited  # returned once read, not at the timeout

        os.write(write_end, b"nobody reads this")  # a stuck reader: give up after the timeout
        start = time.monotonic()
        wait_until_read((write_end,), timeout=0.3)
        assert 0.25 < time.monotonic() - start < 10
    finally:
        os.close(read_end)
        os.close(write_end)
    with tempfile.TemporaryFile() as f:  # not a pipe: nothing to wait for
        start = time.monotonic()
        wait_until_read((f.fileno(),), timeout=20)
        assert time.monotonic() - start < 10


def test_kill_during_save_keeps_the_old_file(tmp_path):
    """kill -9 in the middle of writing the blocks: the target holds the old array."""
    path, marker = tmp_path / "field.npy", tmp_path / "marker"
    old = old_array((8, 8, 4))
    np.save(path, old)
    child = subprocess.Popen([sys.executable, str(CHILD), "kill-save", str(path), str(marker)],
                             env=clean_env(4), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), f"the child never got to write a block:\n{child.communicate()}"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, (out, err)
    np.testing.assert_array_equal(np.load(path), old)  # complete, and the old one
    leftovers = [n for n in os.listdir(tmp_path) if n not in ("field.npy", "marker")]
    assert len(leftovers) == 1 and re.fullmatch(r"\.field\.npy\.[0-9a-f]{12}\.pencilfft-tmp",
                                                leftovers[0]), leftovers
    # The next save completes: then the file holds the complete new array.
    new = new_array((8, 8, 4))
    save(str(path), _x(new))
    np.testing.assert_array_equal(np.load(path), new)


def test_size_limit_keeps_the_old_file(tmp_path):
    """Over `ulimit -f` (EFBIG): before, the old file was truncated first and lost."""
    path = tmp_path / "field.npy"
    old = old_array((8, 8, 4))
    np.save(path, old)
    limit = os.path.getsize(path) + 4096  # the new array is 32 KiB
    done, _ = _run([sys.executable, str(CHILD), "size-limit", str(path), str(limit)],
                   clean_env(4), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (report,) = _reports(done.stdout)
    assert report["error"] == "OSError" and report["errno"] == errno.EFBIG, report
    assert f"cannot save {str(path)!r}: File too large" in report["message"]
    np.testing.assert_array_equal(np.load(path), old)
    assert sorted(os.listdir(tmp_path)) == ["field.npy"]


def test_full_disk_is_an_error_not_a_crash():
    """On a full file system (a 1 MiB tmpfs): OSError, not SIGBUS, and the old file intact.

    The tmpfs is mounted in a private user and mount namespace (`unshare`), where that is
    allowed; elsewhere the test is skipped (the in-process ENOSPC tests still run).
    """
    unshare = shutil.which("unshare")
    probe = subprocess.run(
        [unshare or "unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
         "mount -t tmpfs -o size=1m none /tmp"], capture_output=True, timeout=30
    ) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot mount a tmpfs in a user namespace here (unshare)")
    directory = tempfile.mkdtemp(prefix="pencilfft-full-")
    try:
        script = 'mount -t tmpfs -o size=1m none "$1" && shift && exec "$@"'
        done, _ = _run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script,
                        "sh", directory, sys.executable, str(CHILD), "full-disk", directory],
                       clean_env(4), timeout=120)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert done.returncode == 0, f"child ended with {done.returncode}:\n{done.stderr}"
    reports = _reports(done.stdout)
    assert [r["preallocate"] for r in reports] == [True, False]
    for r in reports:
        assert r["error"] is not None and r["error"][:2] == ["OSError", errno.ENOSPC], r
        assert "No space left on device" in r["error"][2] and "is unchanged" in r["error"][2]
        assert r["old_intact"] and r["files"] == ["field.npy"], r
