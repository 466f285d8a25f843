"""Multi-controller start-up: one call that works under mpirun/mpiexec, srun and plain python.

`initialize()` looks at the environment the launcher left behind and starts `jax.distributed`
with the right process count, process id, coordinator and local devices:

* MPI (MPICH/Hydra, Open MPI, Intel MPI, srun with a PMI plug-in): the MPI ranks are the jax
  process ids, so that `pencilfft.scatter`/`gather` can map jax processes to MPI ranks; rank 0
  picks a free port for the coordinator and broadcasts it.
* SLURM without MPI (`srun python ...`): jax's own SLURM detection, with the local devices
  fixed for the case of one task driving several GPUs.
* anything else: nothing happens (one process sees all its devices).

Once jax.distributed runs, `initialize()` also installs an exception hook that ends the whole
job when one process dies of an uncaught exception or leaves with a non-zero SystemExit
(sys.exit, exit, raise) while the others go on, or hangs after a failed jax callback; makes
SIGTERM and SIGINT end it too, and keeps gloo's connection messages off standard output (see
`initialize`).
"""
from __future__ import annotations

import atexit
import inspect
import logging
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Mapping, Sequence

import jax

from .._jax_private import distributed_client

__all__ = ["initialize", "running_mpi", "srun_mpi_hint"]


def running_mpi():
    """mpi4py's MPI module if MPI is running in this process, else None.  Never imports
    mpi4py: MPI must already have been started (by `initialize`, jax's mpi4py cluster
    detection or the user), so that asking never starts MPI as a side effect."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi

# Variables that MPI launchers set in every rank's environment (MPICH/Hydra and Intel MPI: PMI_*,
# MPI_LOCALNRANKS; Open MPI: OMPI_COMM_WORLD_*; PMIx launchers incl. srun --mpi=pmix: PMIX_RANK).
_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_MPI_MARKER_VARS = _MPI_SIZE_VARS + (
    "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS"
)
# What jax's SLURM detection needs (jax/_src/clusters/slurm_cluster.py).
_SLURM_VARS = (
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"
)
# Set to 0 (or false/no/off) to keep the default exception handling under a launcher.
_ABORT_ENV = "PENCILFFT_ABORT_ON_ERROR"
# Set to 0 (or false/no/off) to leave the CPU affinity of processes alone under mpirun.
_BIND_ENV = "PENCILFFT_BIND_CPUS"
# Set to 0 (or false/no/off) to keep the default (jax's) handling of SIGTERM and SIGINT.
_SIGNAL_ENV = "PENCILFFT_STOP_ON_SIGNAL"
# The signals that end the job: a batch system's cancel or time limit, `timeout`, Ctrl-C.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# (local rank, processes on this node), as MPI launchers set them: MPICH/Hydra and Intel MPI,
# Open MPI.
_LOCAL_VARS = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
               ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))
# Which accelerators the launcher left visible to this process.
_VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def initialize(*, verbose: bool = False, abort_on_error: bool | None = None,
               bind_cpus: bool | None = None, stop_on_signal: bool | None = None,
               **overrides) -> None:
    """Start `jax.distributed` if this process was started by mpirun/mpiexec or srun.

    Call it once at the top of the program, before anything that touches jax devices (jax
    refuses to start the distributed runtime after its backend exists).  In a plain
    `python` process, under `mpirun -np 1` or in a 1-task SLURM step it does nothing; called
    again after a successful start it returns at once.

    Args:
      verbose: print one line per process saying what was detected and started, and keep
        gloo's "[Gloo] Rank r is connected to n peer ranks" lines (one per process and
        communicator, on CPUs): without it they are dropped from standard output (lines
        that report fewer connections than expected are kept).
      abort_on_error: when jax.distributed runs, install a `sys.excepthook` that prints the
        traceback of an uncaught exception, waits (at most 2 s) until the launcher has read
        it, and then ends every process of the job (`MPI.COMM_WORLD.Abort(1)`, or
        `os._exit(1)` without MPI).  Without it the failing process waits in jax's shutdown
        and the others in their next collective, for minutes.  The same for a process that
        leaves with a non-zero status (`sys.exit(n)`, `exit(n)`, `raise SystemExit(n)`) while
        the others are not leaving within 3 s (the job ends with status n), and for one that
        waits in jax for 30 s after a jax callback raised on one of its several devices.
        Default: on, unless the environment variable PENCILFFT_ABORT_ON_ERROR is
        0/false/no/off; `initialize(abort_on_error=False)` also removes a hook installed
        before.  Not installed in an interactive interpreter.
      bind_cpus: under mpirun/mpiexec with several processes on a node that the launcher did
        not bind (each may run on every core), give each process its own equal share of the
        node's cores (`os.sched_setaffinity`) before jax starts its backend, so that XLA sizes
        its thread pools to that share.  Unbound, every process starts pools as wide as the
        node and they fight over the cores: binding made the local FFTs of `mpirun -np 2` on
        2 cores 1.5x faster (benchmarks/RESULTS.md).  A process the launcher already bound
        (`mpirun -bind-to`, srun's --cpu-bind) is left as it is.  Default: on, unless the
        environment variable PENCILFFT_BIND_CPUS is 0/false/no/off.
      stop_on_signal: when jax.distributed runs, SIGTERM and SIGINT (a batch system's cancel or
        time limit, `timeout`, Ctrl-C) end this process at once with exit status 128 + the
        signal's number, and every other process of the job through `MPI.COMM_WORLD.Abort`,
        even while it waits in a collective.  jax.distributed's own SIGTERM handler (its
        preemption notice, which logs "SIGTERM caught" and keeps running) is replaced.
        Default: on, unless the environment variable PENCILFFT_STOP_ON_SIGNAL is
        0/false/no/off; `stop_on_signal=False` also restores the handlers found before.  Not
        installed in an interactive interpreter.
      **overrides: passed on to `jax.distributed.initialize` and taking precedence over what
        was detected (e.g. `coordinator_address`, `local_device_ids`,
        `initialization_timeout`).  Without a launcher, jax is started only when a
        coordinator is given (`coordinator_address=` or JAX_COORDINATOR_ADDRESS; set
        `num_processes` and `process_id` too): a hand-made multi-process set-up.

    Raises:
      TypeError: a keyword that `jax.distributed.initialize` does not take (also in a single
        process), or a switch that is not True, False or None.
      ValueError: an environment variable (PENCILFFT_BIND_CPUS and the others, or the
        launcher's node-local rank and size) that is not what it must be; the message names it.
      ImportError: started by an MPI launcher, but mpi4py cannot be imported.
      RuntimeError: `mpirun` and mpi4py belong to different MPI libraries (the launcher started
        several processes, MPI.COMM_WORLD has one); jax's own RuntimeError when its backend
        started before this call.

    Example:
      The first lines of a script run by ``mpirun -np 2 python script.py``:

      >>> import jax, pencilfft
      >>> pencilfft.initialize()            # a no-op in a plain process
      >>> mesh = jax.make_mesh((2, 4), ("x", "y"))   # the devices of every process
    """
    _check_overrides(overrides)
    abort_on_error = _switch(abort_on_error, "abort_on_error", _ABORT_ENV)
    bind_cpus = _switch(bind_cpus, "bind_cpus", _BIND_ENV)
    stop_on_signal = _switch(stop_on_signal, "stop_on_signal", _SIGNAL_ENV)
    if not abort_on_error:
        _remove_abort_hook()
    if not stop_on_signal:
        _remove_signal_handlers()
    if jax.distributed.is_initialized():
        _say(verbose, "jax.distributed is already initialized; nothing to do")
        if abort_on_error:
            _install_abort_hook(verbose)
        if stop_on_signal:
            _install_signal_handlers(verbose)
        return
    env = os.environ
    started = False
    if "cluster_detection_method" in overrides:
        # The caller chose jax's own detection explicitly: do not second-guess it.
        started = _start(verbose, "explicit cluster_detection_method", overrides)
    elif _launched_by_mpi(env) and (kwargs := _mpi_arguments(env, overrides)) is not None:
        if bind_cpus:
            _bind_cpus(env, verbose)
        started = _start(verbose, "MPI", kwargs)
    elif (all(v in env for v in _SLURM_VARS)
          and _launcher_int(env, "SLURM_NTASKS", 1, _SLURM_WAY_OUT) > 1):
        started = _start(verbose, "SLURM", _slurm_arguments(env, overrides))
        if (hint := srun_mpi_hint(env=env)) is not None:
            _say(verbose, hint)  # jax runs; what needs MPI (scatter, the MPI exchange) will not
    elif "coordinator_address" in overrides or "JAX_COORDINATOR_ADDRESS" in env:
        # No launcher, but a coordinator: each process was set up by hand.
        started = _start(verbose, "manual (coordinator given)", overrides)
    else:
        _say(verbose, "single process (no mpirun/srun detected); jax.distributed not started")
    if started and abort_on_error:
        _install_abort_hook(verbose)
    if started and stop_on_signal:
        # Only now: jax.distributed.initialize installs its own SIGTERM handler (its
        # preemption notice), which would replace ours had we installed it before.
        _install_signal_handlers(verbose)
    if started and not verbose:
        _hide_gloo_chatter()


def _check_overrides(overrides: dict) -> None:
    """Unknown keywords fail now, not only once a launcher makes jax use them."""
    accepted = [
        name for name, p in inspect.signature(jax.distributed.initialize).parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise TypeError(
            f"initialize() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"expected verbose, abort_on_error, bind_cpus, stop_on_signal or an argument of "
            f"jax.distributed.initialize: "
            f"{', '.join(accepted)}"
        )


def _switch(value, argname: str, env_name: str) -> bool:
    """An on/off argument; None reads `env_name` (default on)."""
    if value is None:
        text = os.environ.get(env_name, "1").strip().lower()
        if text in ("0", "false", "no", "off"):
            return False
        if text in ("", "1", "true", "yes", "on"):
            return True
        raise ValueError(
            f"environment variable {env_name} must be 1/true/yes/on or 0/false/no/off; "
            f"got {os.environ[env_name]!r}"
        )
    if not isinstance(value, bool):
        raise TypeError(
            f"`{argname}` must be True, False or None (from {env_name}); got "
            f"{value!r} ({type(value).__name__})"
        )
    return value


# ------------------------------------------------------------------------------ CPU binding


def cpu_share(local_rank: int, local_size: int, cpus: Sequence[int]) -> list[int]:
    """The CPUs of process `local_rank` of the `local_size` on a node that has `cpus`: the
    local_rank-th of equal contiguous shares, or one CPU, round-robin, when there are more
    processes than CPUs (leftover CPUs stay unused, as with srun's block distribution)."""
    cpus = sorted(cpus)
    share = len(cpus) // local_size
    if share == 0:
        return [cpus[local_rank % len(cpus)]]
    return cpus[local_rank * share:(local_rank + 1) * share]


def _bind_cpus(env: Mapping[str, str], verbose: bool) -> None:
    """Pin this process to its share of the node's CPUs if nobody has bound it yet."""
    if not hasattr(os, "sched_setaffinity"):
        return  # not Linux
    for rank_var, size_var in _LOCAL_VARS:
        if rank_var in env and size_var in env:
            local_rank, local_size = _local_rank_and_size(env, rank_var, size_var)
            break
    else:
        return
    cpus = os.sched_getaffinity(0)
    if local_size <= 1 or len(cpus) < (os.cpu_count() or 0):
        return  # alone on the node, or the launcher chose already
    share = cpu_share(local_rank, local_size, cpus)
    os.sched_setaffinity(0, share)
    _say(verbose, f"local process {local_rank} of {local_size}: bound to CPUs {share} "
                  f"({_BIND_ENV}=0 to leave them alone)")


_BIND_WAY_OUT = (f"these launcher variables say which share of the node's cores this process "
                 f"gets: fix the launcher's environment, or set {_BIND_ENV}=0 "
                 "(initialize(bind_cpus=False)) to leave the CPU binding alone")


_SLURM_WAY_OUT = ("SLURM sets it in every task of a job step: run under srun, or unset the "
                  "SLURM_* variables for a plain process, or pass coordinator_address, "
                  "num_processes and process_id to initialize()")


def _launcher_int(env: Mapping[str, str], name: str, minimum: int, way_out: str) -> int:
    """The integer in launcher variable `name`, at least `minimum`; a ValueError that names the
    variable, its value and the way out otherwise (not int()'s bare "invalid literal")."""
    text = env[name]
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"environment variable {name}={text!r} must be an integer >= {minimum}; {way_out}"
        )
    return value


def _local_rank_and_size(env: Mapping[str, str], rank_var: str, size_var: str) -> tuple[int, int]:
    """(this process's rank on its node, processes on the node), checked."""
    rank = _launcher_int(env, rank_var, 0, _BIND_WAY_OUT)
    size = _launcher_int(env, size_var, 1, _BIND_WAY_OUT)
    if rank >= size:
        raise ValueError(
            f"environment variables {rank_var}={env[rank_var]!r} and {size_var}="
            f"{env[size_var]!r}: the local rank must be below the number of processes on the "
            f"node; {_BIND_WAY_OUT}"
        )
    return rank, size


# ------------------------------------------------------------------------- uncaught errors


def _install_abort_hook(verbose: bool = False) -> bool:
    """Put the abort hook in front of the current sys.excepthook, wrap sys.exit, watch
    SystemExit and jax's callback failures (once each); True if installed."""
    if getattr(sys.excepthook, "_pencilfft_abort", False):
        _install_exit_hook(verbose)
        _install_callback_watch()
        return True
    if sys.flags.interactive or hasattr(sys, "ps1"):
        # The interactive interpreter reports every failed statement through the hook.
        _say(verbose, "interactive interpreter: no abort-on-error exception hook")
        return False
    sys.excepthook = _make_abort_hook(sys.excepthook, jax.process_index(), jax.process_count())
    _install_exit_hook(verbose)
    _install_callback_watch()
    _say(verbose, f"an uncaught exception or SystemExit(n) with n != 0 aborts the whole job "
                  f"({_ABORT_ENV}=0 to keep going)")
    return True


def _remove_abort_hook() -> None:
    hook = sys.excepthook
    if getattr(hook, "_pencilfft_abort", False):
        sys.excepthook = hook._pencilfft_previous
    if getattr(sys.exit, "_pencilfft_exit", False):
        sys.exit = sys.exit._pencilfft_previous
    _unwatch_system_exit()
    _remove_callback_watch()
    atexit.unregister(_say_ending)


# ------------------------------------------------------------ SystemExit(n) on one process
#
# sys.exit(n), builtin exit(n) and `raise SystemExit(n)` raise SystemExit, which never reaches
# sys.excepthook: the interpreter ends, and jax's atexit shutdown waits
# (shutdown_timeout_seconds, 300 s) for the other processes, which wait in their next
# collective for this one; then both abort and the status is lost (issues 48, 51 and 57).  No
# atexit handler can tell the status: the interpreter reads it from the exception's `code` at
# the very top, once every Python frame is gone, keeps it in C and only then runs atexit.  So
# that reading is where the job ends: `code` read with no Python caller on the main thread ends
# every process with that status, as an uncaught exception does.  Read from Python (`except
# SystemExit as e: e.code`, pytest.raises) it is the plain code and nothing happens: a
# SystemExit that is caught changes nothing, and a status of 0 (or None) is a clean exit
# through jax's shutdown as before.  Two places read it that way:
#
# * SystemExit's own `code` descriptor, replaced (`_watch_system_exit`) by a property that
#   reads the original member: `raise SystemExit(n)` and builtin exit(n) (site's, which raises
#   it in Python).  The type is a built-in one, whose attributes Python code cannot set: its
#   namespace is changed in place and its attribute cache reset through the C API, as no
#   pure-Python way exists.  Where that fails (another interpreter) it says so with verbose.
# * a wrapped `sys.exit`, which raises a SystemExit object: CPython 3.11's sys.exit, written
#   in C, sets the bare status as the pending exception, which the interpreter reads without
#   making a SystemExit object, so no descriptor is asked (3.12 and later always make the
#   object).  Where SystemExit cannot be watched, it raises `_JobExit`, whose own `code` does
#   the same.
#
# A SystemExit raised in another thread ends that thread only (Python's rule; the threading
# module drops it without reading `code`): the process goes on, and so does the job.

_SYSTEM_EXIT_CODE = SystemExit.__dict__["code"]  # the C member the interpreter reads


def _exit_code_read(exc) -> object:
    """`exc.code` from the C member; the job ends here when the interpreter is the reader."""
    code = _SYSTEM_EXIT_CODE.__get__(exc)
    if (sys._getframe(1).f_back is None  # read by the interpreter, not by Python code
            and threading.current_thread() is threading.main_thread()):
        _end_job_on_exit(code, getattr(exc, "_pencilfft_how", "SystemExit"))
    return code


class _JobExit(SystemExit):
    """What the wrapped sys.exit raises: a SystemExit in every way but `code`'s getter."""

    @property
    def code(self):
        if not getattr(sys.exit, "_pencilfft_exit", False):
            return _SYSTEM_EXIT_CODE.__get__(self)
        return _exit_code_read(self)

    @code.setter
    def code(self, value):
        _SYSTEM_EXIT_CODE.__set__(self, value)


def _watched_code(self):
    return _exit_code_read(self)


_WATCHED_CODE = property(_watched_code, _SYSTEM_EXIT_CODE.__set__, _SYSTEM_EXIT_CODE.__delete__,
                         _SYSTEM_EXIT_CODE.__doc__)


def _set_system_exit_code(descriptor) -> bool:
    """Put `descriptor` as SystemExit's `code`; False where this interpreter does not allow it."""
    import ctypes
    import gc

    try:
        (namespace,) = gc.get_referents(SystemExit.__dict__)  # behind the read-only view
        if not isinstance(namespace, dict) or "code" not in namespace:
            return False
        namespace["code"] = descriptor
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(SystemExit))  # its attribute cache
    except (AttributeError, TypeError, ValueError, OSError):
        return False
    return SystemExit.__dict__["code"] is descriptor


def _watch_system_exit(verbose: bool = False) -> None:
    """Make the interpreter's reading of any SystemExit's status end the job (once)."""
    if SystemExit.__dict__["code"] is _WATCHED_CODE:
        return
    if not _set_system_exit_code(_WATCHED_CODE):
        _say(verbose, "cannot watch SystemExit in this interpreter: a bare `raise "
                      "SystemExit(n)` or exit(n) on one process leaves the others waiting")


def _unwatch_system_exit() -> None:
    if SystemExit.__dict__["code"] is _WATCHED_CODE:
        _set_system_exit_code(_SYSTEM_EXIT_CODE)


def _install_exit_hook(verbose: bool = False) -> None:
    """Wrap sys.exit and watch SystemExit (once each) so that a non-zero status ends every
    process of the job."""
    _watch_system_exit(verbose)
    # Registered after jax's atexit shutdown (at jax's import), so run before it; once.
    atexit.unregister(_say_ending)
    atexit.register(_say_ending)
    if getattr(sys.exit, "_pencilfft_exit", False):
        return
    previous = sys.exit

    def exit(status=None):  # noqa: A001  (it is sys.exit)
        # A SystemExit object, which the interpreter reads through the watched `code`; where
        # SystemExit is not watched, a _JobExit (in the main thread only: the threading module
        # drops exactly SystemExit silently, and a thread's exit ends nothing).
        kind = (SystemExit if SystemExit.__dict__["code"] is _WATCHED_CODE
                or threading.current_thread() is not threading.main_thread() else _JobExit)
        # As the built-in: no argument is no args, a tuple becomes the args.
        args = () if status is None else status if isinstance(status, tuple) else (status,)
        exc = kind(*args)
        exc._pencilfft_how = "sys.exit"  # for the message
        raise exc

    exit.__doc__ = previous.__doc__
    exit._pencilfft_exit = True
    exit._pencilfft_previous = previous
    sys.exit = exit


def _end_job_on_exit(code, how: str = "sys.exit") -> None:
    """The interpreter is ending with SystemExit `code`: for a failure (what Python turns into
    a non-zero status), say so and end the whole job with that status; else return."""
    if code is None:
        return
    if isinstance(code, int):
        status = code & 0xFF  # what the operating system keeps of exit(code)
        if status == 0:
            return
        message = ""
    else:
        status, message = 1, f"{code}\n"  # Python prints a non-integer code, exit status 1
    if _say_ending(status) and _still_running(_ENDING_WAIT_S) == []:
        return  # every process is ending (a test run that failed on each): jax's shutdown
    try:
        sys.stderr.write(
            f"{message}pencilfft: process {jax.process_index()} of {jax.process_count()} exits "
            f"with status {status} ({how}); ending every process of the job so that none "
            "waits for this one "
            f"(pencilfft.initialize(abort_on_error=False) or {_ABORT_ENV}=0 turns this off)\n"
        )
        sys.stderr.flush()
        sys.stdout.flush()
        _stop_stdout_filter()
        _wait_until_read()
    finally:
        _abort_job(status)


# ------------------------------------------- a failed callback among several local devices
#
# An exception in a jax callback that is not partitioned (jax.debug.callback, pure_callback,
# io_callback) fails that callback's device only: with several devices per process the others
# wait for it in the computation's collectives (XLA's own all-to-all too), so the error never
# reaches Python and every process of the job hangs (upstream; with one device per process the
# error reaches the caller, and the abort hook).  jax logs the failure from the thread that ran
# the callback: seen there, in a job of several processes with several local devices, it says
# so at once, and ends the job if the main thread then waits in jax, at one place, for
# `_CALLBACK_GRACE_S` seconds (a program that goes on is left alone: the watch stops after ten
# times as long).

_CALLBACK_LOGGERS = ("jax._src.debugging", "jax._src.callback")
_CALLBACK_FAILED = ("jax.debug.callback failed", "jax.pure_callback failed",
                    "jax.io_callback failed")
_CALLBACK_GRACE_S = 30.0
_WAYS_OUT = ("pass partitioned=True to jax.debug.callback, or run one device per process, "
             "or catch the exception inside the callback")


class _CallbackWatch(logging.Filter):
    """Sees jax's own "jax.debug.callback failed" records (a filter that lets every record
    through: a handler would take the place of logging's last resort, which prints them when
    the program configured no logging), and watches the main thread."""

    def __init__(self):
        super().__init__()
        self.watching = threading.Lock()  # one watch at a time

    def filter(self, record: logging.LogRecord) -> bool:
        self._seen(record)
        return True

    def _seen(self, record: logging.LogRecord) -> None:
        if (record.msg not in _CALLBACK_FAILED or jax.process_count() < 2
                or jax.local_device_count() < 2 or not self.watching.acquire(blocking=False)):
            return
        grace, name = _CALLBACK_GRACE_S, record.msg.split()[0]
        sys.stderr.write(
            f"pencilfft: {name} raised in process {jax.process_index()} of "
            f"{jax.process_count()}, which has {jax.local_device_count()} devices: its other "
            "devices may wait for the failed one forever (jax ends only the callback's). If "
            f"this process stops for {grace:g} s, pencilfft ends the job; to avoid it, "
            f"{_WAYS_OUT}\n")
        sys.stderr.flush()
        threading.Thread(target=self._end_if_stuck, args=(name, grace), daemon=True,
                         name="pencilfft-callback-watch").start()

    def _end_if_stuck(self, name: str, grace: float) -> None:
        main = threading.main_thread()
        start = since = time.monotonic()
        place = None
        try:
            while time.monotonic() - start < 10 * grace:
                frame = sys._current_frames().get(main.ident)
                if frame is None:
                    return  # the main thread is gone: the process is ending
                now = (frame, frame.f_lasti)
                if (place is None or now[0] is not place[0] or now[1] != place[1]
                        or not _in_jax(frame)):
                    place, since = now, time.monotonic()
                elif time.monotonic() - since >= grace:
                    break
                del frame, now
                time.sleep(min(1.0, grace / 4))
            else:
                return  # the program went on
            place = None
            sys.stderr.write(
                f"pencilfft: process {jax.process_index()} of {jax.process_count()} has not "
                f"moved for {grace:g} s since its {name} raised; ending every process of the "
                f"job (to avoid it: {_WAYS_OUT}; PENCILFFT_ABORT_ON_ERROR=0 turns this off)\n")
            sys.stderr.flush()
            sys.stdout.flush()
            _stop_stdout_filter()
            _wait_until_read()
            _abort_job(1)
        finally:
            if self.watching.locked():
                self.watching.release()


def _in_jax(frame, depth: int = 3) -> bool:
    """Whether one of the `depth` innermost frames is jax's: where a process that waits for
    a computation's results waits (a program's own loop, sleeping or polling, is not)."""
    while frame is not None and depth > 0:
        if str(frame.f_globals.get("__name__", "")).startswith(("jax.", "jaxlib.")):
            return True
        frame, depth = frame.f_back, depth - 1
    return False


def _install_callback_watch() -> None:
    for name in _CALLBACK_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _CallbackWatch) for f in logger.filters):
            logger.addFilter(_CallbackWatch())


def _remove_callback_watch() -> None:
    for name in _CALLBACK_LOGGERS:
        logger = logging.getLogger(name)
        for watch in [f for f in logger.filters if isinstance(f, _CallbackWatch)]:
            logger.removeFilter(watch)


# Where each ending process says so (jax.distributed's key-value store): a process leaving
# with a non-zero status ends the job only if some other is not ending within _ENDING_WAIT_S
# seconds (one that waits in a collective for it); processes that all end, as the ranks of a
# test run that failed, leave through jax's shutdown with their own statuses.
_ENDING = "pencilfft/ending"
_ENDING_WAIT_S = 3.0


def _say_ending(status: int = 0) -> bool:
    """Tell the job that this process is ending with `status` (the atexit handler, for a clean
    end); False without the key-value store, or said already."""
    client = distributed_client()
    if client is None or jax.process_count() < 2:
        return False
    try:
        client.key_value_set(f"{_ENDING}/{jax.process_index()}", str(status))
    except Exception:  # noqa: BLE001 - said already, or the store is gone
        return False
    return True


def _still_running(timeout: float) -> list[int] | None:
    """The processes that have not said they end within `timeout` s ([] once all have; None
    when the store does not answer)."""
    client = distributed_client()
    deadline = time.monotonic() + timeout
    while True:
        try:
            ended = {key.rsplit("/", 1)[-1] for key, _ in client.key_value_dir_get(f"{_ENDING}/")}
        except Exception:  # noqa: BLE001 - the store is gone
            return None
        running = [r for r in range(jax.process_count()) if str(r) not in ended]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.02)


def _make_abort_hook(previous, index: int, count: int):
    def hook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)  # the usual traceback first
            sys.stderr.write(
                f"pencilfft: uncaught {exc_type.__name__} in process {index} of {count}; "
                "aborting every process of the job so that none waits forever for this one "
                f"(pencilfft.initialize(abort_on_error=False) or {_ABORT_ENV}=0 turns this "
                "off)\n"
            )
            sys.stderr.flush()
            sys.stdout.flush()
            _stop_stdout_filter()
            _wait_until_read()
        finally:
            _abort_job()

    hook._pencilfft_abort = True
    hook._pencilfft_previous = previous
    return hook


def _wait_until_read(fds: Sequence[int] = (1, 2), timeout: float = 2.0) -> None:
    """Wait (at most `timeout` s) until the launcher has read what this process wrote to the
    pipes of `fds`.

    MPI_Abort makes mpirun/srun kill every process of the job at once, its own output forwarder
    included: text still in the pipe, often the last lines of the traceback with the error
    itself, would be lost (seen in 3 of 20 runs under MPICH's mpirun).  Not a pipe (a terminal,
    a file): nothing to wait for.
    """
    try:
        import fcntl
        import termios
    except ImportError:  # not POSIX
        return
    deadline = time.monotonic() + timeout
    for fd in fds:
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
            while time.monotonic() < deadline:
                unread = bytearray(4)
                fcntl.ioctl(fd, termios.FIONREAD, unread)
                if int.from_bytes(unread, sys.byteorder) == 0:
                    break
                time.sleep(0.005)
        except OSError:
            continue


def _abort_job(status: int = 1) -> None:
    """End this process now with `status` and, through MPI when it runs, every other process
    of the job.

    Exiting normally would run jax's atexit shutdown, which waits for the other processes,
    themselves waiting for this one in a collective.
    """
    mpi = running_mpi()
    try:
        if mpi is not None:
            mpi.COMM_WORLD.Abort(status)
    finally:
        os._exit(status)


# --------------------------------------------------------------------------------- signals
#
# A Python signal handler runs in the main thread, between two bytecodes: never while that
# thread waits in a collective inside XLA or MPI, which is where a stopped job usually is.
# So the handler is installed through Python (which replaces jax's C handler) only to have
# Python's C-level trampoline write the signal's number to a "wakeup" pipe
# (`signal.set_wakeup_fd`), and a thread waiting on that pipe ends the job.


class _SignalState:
    installed = False
    previous: dict = {}  # signal -> the handler found before (None: one set outside Python)
    previous_wakeup_fd = -1
    pipe: tuple[int, int] | None = None
    stopping = threading.Lock()


def _install_signal_handlers(verbose: bool = False) -> bool:
    """SIGTERM and SIGINT end the whole job (once); True if installed."""
    st = _SignalState
    if st.installed:
        return True
    if sys.flags.interactive or hasattr(sys, "ps1"):
        _say(verbose, "interactive interpreter: SIGTERM/SIGINT keep their handlers")
        return False
    if threading.current_thread() is not threading.main_thread():
        _say(verbose, "not the main thread: SIGTERM/SIGINT keep their handlers")
        return False
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # set_wakeup_fd requires it
    # A signal the process was started with ignored (nohup, a background job of a script)
    # stays ignored, as Python itself leaves SIGINT then.
    st.previous = {s: signal.getsignal(s) for s in _STOP_SIGNALS
                   if signal.getsignal(s) != signal.SIG_IGN}
    for s in st.previous:
        signal.signal(s, _on_signal)
    st.previous_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    st.pipe = (read_fd, write_fd)
    threading.Thread(target=_watch_signals, args=(read_fd, st.previous_wakeup_fd),
                     name="pencilfft-signals", daemon=True).start()
    st.installed = True
    _say(verbose, f"SIGTERM and SIGINT end the whole job ({_SIGNAL_ENV}=0 to keep jax's "
                  "handling)")
    return True


def _remove_signal_handlers() -> None:
    st = _SignalState
    if not st.installed or threading.current_thread() is not threading.main_thread():
        return
    for s, handler in st.previous.items():
        # None: the handler was not set from Python (jax's C handler); it cannot be restored
        # from here, the default is the closest.
        signal.signal(s, handler if handler is not None else signal.SIG_DFL)
    signal.set_wakeup_fd(st.previous_wakeup_fd)
    read_fd, write_fd = st.pipe
    os.close(write_fd)  # the watcher reads EOF and ends
    st.installed, st.pipe = False, None


def _watch_signals(read_fd: int, forward_fd: int) -> None:
    """Wait on the wakeup pipe; end the job on SIGTERM/SIGINT.  Bytes also go on to a wakeup
    fd set before ours (asyncio's, say), so that its owner still sees its signals."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            break
        if not data:
            break
        if forward_fd >= 0:
            try:
                os.write(forward_fd, data)
            except OSError:
                pass
        for signum in data:
            if signum in _STOP_SIGNALS:
                _stop_job(signum)
    os.close(read_fd)


def _on_signal(signum: int, frame) -> None:
    """The Python-level handler: where the main thread gets to it first."""
    _stop_job(signum)


def _stop_job(signum: int) -> None:
    """Say why, then end this process with 128 + signum and the job with it (first caller
    only: the watcher thread and the main thread's handler may both get here)."""
    if not _SignalState.stopping.acquire(blocking=False):
        threading.Event().wait()  # the other caller is ending the process
    name = signal.Signals(signum).name
    status = 128 + signum
    try:
        sys.stderr.write(
            f"pencilfft: process {jax.process_index()} of {jax.process_count()} received {name}; "
            f"ending every process of the job (exit status {status}; {_SIGNAL_ENV}=0 turns "
            "this off)\n"
        )
        sys.stderr.flush()
        _stop_stdout_filter()
        _wait_until_read(timeout=1.0)
    finally:
        _abort_job(status)


# ------------------------------------------------------------------------ gloo's messages
#
# gloo (jax's CPU collectives across processes) writes "[Gloo] Rank 1 is connected to 3 peer
# ranks. Expected number of connected peer ranks is : 3" to standard output with std::cout,
# unconditionally (no log level), once per process and communicator: tens of lines per run.
# They can only be dropped below Python: standard output (fd 1) becomes a pipe that a thread
# copies to the real one, line by line, leaving these out.

# Each process writes one such line per communicator, from several threads (one per local
# device) at once, and std::cout does not write a line in one piece: lines of two threads
# interleave at the pieces of the message ("...is : 3[Gloo] Rank " then "1 is connected..."),
# across newlines too (one thread's newline lands inside another's message).  So lines made of
# nothing but those pieces and numbers are gathered into a run, and the run is decided once it
# holds whole messages (as many of each piece): dropped when every message reports its
# expected peers (a message with a missing peer is a real problem: the run is kept), and also
# when the pieces are so interleaved that no number can be told from the next (a peer that
# cannot connect also fails jax's collectives, loudly).  A line of anything else ends the run,
# which is then kept as it was.
_GLOO_TEXTS = (b"[Gloo] Rank ", b" is connected to ", b" peer ranks. ",
               b"Expected number of connected peer ranks is : ")
_GLOO_PIECES = re.compile(b"(?:" + b"|".join(map(re.escape, _GLOO_TEXTS)) + rb"|\d+)+")
_GLOO_MESSAGE = re.compile(rb"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. "
                           rb"Expected number of connected peer ranks is : (\d+)")


def _is_gloo_piece_line(line: bytes) -> bool:
    """Whether a line holds nothing but pieces of gloo's connection messages (and numbers)."""
    line = line.removesuffix(b"\r")
    return (_GLOO_PIECES.fullmatch(line) is not None
            and any(t in line for t in _GLOO_TEXTS))


def _gloo_run_verdict(run: bytes) -> bool | None:
    """For the lines of a run joined: None while it does not hold whole messages yet, True to
    drop it (chatter), False to keep it (a peer missing)."""
    counts = {run.count(t) for t in _GLOO_TEXTS}
    if len(counts) != 1 or counts == {0}:
        return None
    messages = _GLOO_MESSAGE.findall(run)
    if len(messages) < counts.pop():  # interleaved past telling the numbers apart
        return True
    return all(connected == expected for connected, expected in messages)


def _may_become_chatter(partial: bytes) -> bool:
    """Whether a line still without its newline may turn out to be gloo's chatter."""
    run = _GLOO_PIECES.match(partial)
    rest = partial[run.end():] if run else partial
    return any(t.startswith(rest) for t in _GLOO_TEXTS)


class _LineFilter:
    """Copy what is written to `fd` to where `fd` pointed before, without gloo's chatter."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.real = os.dup(fd)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, fd)
        os.close(write_fd)
        self.inode = os.fstat(fd).st_ino
        self.read_fd = read_fd
        self.thread = threading.Thread(target=self._pump, name="pencilfft-stdout", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        pending, run = b"", []  # a partial line; the lines of an undecided run of gloo's
        while True:
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            out = []
            for line in lines:
                if not _is_gloo_piece_line(line):
                    out += [r + b"\n" for r in run] + [line + b"\n"]  # an unfinished run: kept
                    run = []
                    continue
                run.append(line)
                verdict = _gloo_run_verdict(b"".join(run))
                if verdict is not None:
                    out += [] if verdict else [r + b"\n" for r in run]
                    run = []
            # A partial line goes out at once (a progress bar), unless it may become gloo's;
            # one that cannot also ends a run of gloo's lines, kept.
            if pending and not _may_become_chatter(pending):
                out += [r + b"\n" for r in run] + [pending]
                run, pending = [], b""
            self._write(b"".join(out))
        if run or pending:
            rest = b"".join(run) + pending
            if not (_is_gloo_piece_line(rest) and _gloo_run_verdict(rest)):
                self._write(b"".join(r + b"\n" for r in run) + pending)
        os.close(self.read_fd)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.real, view):]
            except OSError:
                return  # the reader is gone: nothing to do about it here

    def stop(self, timeout: float = 2.0) -> None:
        """Point `fd` back at the real output and forward what is still in the pipe."""
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        try:
            still_ours = os.fstat(self.fd).st_ino == self.inode
        except OSError:
            still_ours = False
        if still_ours:  # someone else (pytest's capture) may have replaced it meanwhile
            os.dup2(self.real, self.fd)  # closes the pipe's last write end: the pump ends
        self.thread.join(timeout)


_FILTER: list[_LineFilter] = []


def _hide_gloo_chatter() -> None:
    """Drop gloo's connection lines from fd 1 (once), if CPU collectives go through gloo."""
    try:
        gloo = jax.config.jax_cpu_collectives_implementation == "gloo"
    except AttributeError:
        gloo = False
    if _FILTER or not gloo:
        return
    try:
        _FILTER.append(_LineFilter(1))
    except OSError:
        return  # no standard output to filter
    atexit.register(_stop_stdout_filter)


def _stop_stdout_filter() -> None:
    while _FILTER:
        _FILTER.pop().stop()



def _say(verbose: bool, message: str) -> None:
    if verbose:
        print(f"pencilfft.initialize: {message}", flush=True)


def _start(verbose: bool, launcher: str, kwargs: dict) -> bool:
    """Call jax.distributed.initialize, making sure CPU devices get cross-process collectives."""
    _use_gloo_on_cpu()
    shown = {k: v for k, v in kwargs.items() if k != "cluster_detection_method" or v}
    _say(verbose, f"launcher {launcher}; jax.distributed.initialize({shown})")
    jax.distributed.initialize(**kwargs)
    _say(verbose, f"process {jax.process_index()} of {jax.process_count()}")
    return True


def _use_gloo_on_cpu() -> None:
    """Select gloo for cross-process collectives of CPU devices unless a choice was made.

    jax >= 0.4.36 defaults to gloo; older versions default to none, with which multi-process
    CPU computations fail.  An explicit user choice (e.g. "mpi") is kept.  The option only
    affects the CPU client, so setting it on GPU machines is harmless.
    """
    try:
        current = jax.config.jax_cpu_collectives_implementation
    except AttributeError:  # a jax without the option
        return
    if current in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


# --------------------------------------------------------------------------------------- MPI


def _launched_by_mpi(env: Mapping[str, str]) -> bool:
    return any(v in env for v in _MPI_MARKER_VARS)


def _mpi_arguments(env: Mapping[str, str], overrides: dict) -> dict | None:
    """Arguments for jax.distributed.initialize from MPI, or None for a 1-rank job.

    Explicit values instead of `cluster_detection_method="mpi4py"`: the same ranks, but
    the coordinator port is a free one chosen by rank 0 (mpi4py detection hashes the host
    name, so two jobs on one node can pick the same port), and local devices follow
    `_choose_local_device_ids`.
    """
    sizes = [env[v] for v in _MPI_SIZE_VARS if v in env]
    if sizes and all(s.strip() == "1" for s in sizes):
        return None  # mpirun -np 1: a plain single process; do not even start MPI
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(
            f"this process was started by an MPI launcher but mpi4py cannot be imported ({e}); "
            "pip install 'pencilfft[mpi]' (or mpi4py built for that MPI library), or pass "
            "coordinator_address, num_processes and process_id to pencilfft.initialize"
        ) from e

    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        # The MPI library did not join the launcher's job: srun with a PMI plug-in this MPI
        # does not speak (then SLURM detection takes over), or mpi4py built against another
        # MPI than the mpirun used (then every process would silently run alone).
        if sizes and not all(v in env for v in _SLURM_VARS):
            raise RuntimeError(
                f"the launcher started {sizes[0]} processes but MPI.COMM_WORLD has size 1 in "
                "this one: mpirun and mpi4py belong to different MPI libraries (mpi4py uses "
                f"{MPI.Get_library_version().splitlines()[0].strip()!r}); launch with the "
                "mpirun/mpiexec of that library"
            )
        return None
    kwargs = dict(overrides)
    kwargs.setdefault("num_processes", comm.Get_size())
    kwargs.setdefault("process_id", comm.Get_rank())
    if "coordinator_address" not in kwargs and "JAX_COORDINATOR_ADDRESS" not in env:
        address = None
        if comm.Get_rank() == 0:
            port = env.get("JAX_COORDINATOR_PORT") or str(_free_port())
            address = f"{socket.gethostname()}:{port}"
        kwargs["coordinator_address"] = comm.bcast(address, root=0)
    # Node-local rank and size; collective, so every rank computes it even if overridden.
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        visible = _visible_devices(env)
        shared = len({tuple(v) if v is not None else None for v in local.allgather(visible)}) == 1
        ids = _choose_local_device_ids(local.Get_rank(), local.Get_size(), visible, shared)
    finally:
        local.Free()
    if "local_device_ids" not in kwargs and "JAX_LOCAL_DEVICE_IDS" not in env:
        kwargs["local_device_ids"] = ids
    return kwargs


def _free_port() -> int:
    """A TCP port that is free now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------- SLURM

# The fix, wherever srun without an MPI plug-in shows.  PMI-2 is what the mpich wheel of
# pencilfft[mpi] speaks (its `srun --mpi=pmix` stops at start-up: "Runtime environment uses
# unsupported PMI version PMIx"), and Intel MPI; Open MPI 4/5 as sites build it speaks PMIx.
_SRUN_MPI_FIX = (
    "start the step with `srun --mpi=pmi2` (or export SLURM_MPI_TYPE=pmi2 before srun): PMI-2 "
    "is what the mpich of pencilfft[mpi] and Intel MPI speak; a site's Open MPI built with "
    "PMIx takes `--mpi=pmix`. `srun --mpi=list` shows the cluster's plug-ins; pencilfft's "
    "slurm/ scripts take PENCILFFT_SRUN_MPI"
)


def srun_mpi_hint(mpi_size: int | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """Why MPI cannot span the tasks of this Slurm job, and the fix; None when that is not so.

    srun gives the tasks of a step a way to find each other (a PMI plug-in) only when asked
    (`srun --mpi=...`, SLURM_MPI_TYPE, or the cluster's MpiDefault, often `none`).  Without
    one, MPI in each task finds no launcher and starts as its own one-rank world, although
    the step has N tasks (jax still starts across them, from Slurm's variables), and
    everything that needs MPI then sees one process.  Every place that can meet this calls
    this one function: the MPI exchange's reason (`pencilfft check`), `scatter`/`gather`/
    `save`/`load`, `initialize(verbose=True)`, the benchmarks.

    Args:
      mpi_size: the size of MPI.COMM_WORLD as the caller sees it; None: this process's if MPI
        runs (MPI is never started here), else unknown.
      env: the environment (default: os.environ).

    Returns:
      One sentence naming the cause (the step's task count, the plug-in or its absence) and
      the fix (`srun --mpi=pmi2`, SLURM_MPI_TYPE), or None outside Slurm, in a one-task step,
      or when MPI spans the tasks.
    """
    env = os.environ if env is None else env
    if mpi_size is None and (mpi := running_mpi()) is not None:
        mpi_size = mpi.COMM_WORLD.Get_size()
    if mpi_size not in (None, 1):
        return None  # MPI spans several processes: a plug-in works
    step_tasks = _int_or_none(env.get("SLURM_STEP_NUM_TASKS"))
    if "SLURM_STEP_NUM_TASKS" not in env and "SLURM_STEP_ID" not in env:
        # Not in a job step: python run from the batch script itself, without srun.
        job_tasks = _int_or_none(env.get("SLURM_NTASKS"))
        if (job_tasks is None or job_tasks <= 1 or "SLURM_JOB_ID" not in env
                or _launched_by_mpi(env)):
            return None
        return (f"Slurm job {env['SLURM_JOB_ID']} has {job_tasks} tasks (SLURM_NTASKS="
                f"{job_tasks}) but this process runs in its batch script, outside any job step, "
                f"so it is alone; run it with srun: {_SRUN_MPI_FIX}")
    if step_tasks is None or step_tasks <= 1:
        return None
    plugin = env.get("SLURM_MPI_TYPE", "")
    if mpi_size is None and _launched_by_mpi(env):
        return None  # a plug-in gave this task its PMI variables; MPI is not started yet
    if plugin and plugin != "none":
        cause = f"with the MPI plug-in {plugin} (SLURM_MPI_TYPE), which this MPI library does not speak"
    elif plugin:
        cause = "with SLURM_MPI_TYPE=none, i.e. without an MPI plug-in"
    else:
        cause = ("without an MPI plug-in (no PMI variables in the environment: no `srun --mpi=...`, "
                 "no SLURM_MPI_TYPE, and the cluster's MpiDefault is none)")
    seen = ("is its own one-rank MPI world (MPI.COMM_WORLD has 1 rank here)" if mpi_size == 1
            else "would be its own one-rank MPI world, so pencilfft.initialize() started jax from "
                 "Slurm's variables and left MPI alone")
    return (f"srun started {step_tasks} tasks in this job step (SLURM_STEP_NUM_TASKS={step_tasks}) "
            f"{cause}: each task {seen}; {_SRUN_MPI_FIX}")


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _slurm_arguments(env: Mapping[str, str], overrides: dict) -> dict:
    """Arguments for jax.distributed.initialize under srun (jax's SLURM detection + devices).

    jax's SLURM detection restricts every process to device [SLURM_LOCALID]: right for one
    task per GPU with all GPUs visible, wrong for one task per node driving several GPUs
    (it would use one) and for tasks bound to their own GPUs (--gpus-per-task: the index
    may not exist).  See `_choose_local_device_ids`.
    """
    kwargs = dict(overrides)
    kwargs["cluster_detection_method"] = "slurm"
    if "local_device_ids" not in kwargs and "JAX_LOCAL_DEVICE_IDS" not in env:
        local_size = _slurm_tasks_on_this_node(env)
        if local_size is not None:
            visible = _visible_devices(env)
            shared = None
            if visible is not None and env.get("SLURM_GPUS_ON_NODE", "").isdigit():
                # All GPUs of the node visible to each task -> shared; fewer -> bound per task.
                shared = len(visible) >= int(env["SLURM_GPUS_ON_NODE"])
            kwargs["local_device_ids"] = _choose_local_device_ids(
                _launcher_int(env, "SLURM_LOCALID", 0, _SLURM_WAY_OUT), local_size, visible,
                shared
            )
    return kwargs


def _slurm_tasks_on_this_node(env: Mapping[str, str]) -> int | None:
    """Number of tasks of this job step on this node, or None when SLURM does not say.

    SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE look like "4(x2),2": 4 tasks on each of
    the first two nodes, 2 on the third; SLURM_NODEID is this node's position in that list.
    """
    node = 0
    if "SLURM_NODEID" in env:
        node = _launcher_int(env, "SLURM_NODEID", 0, _SLURM_WAY_OUT)
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        counts = _expand_tasks_per_node(env.get(var, ""))
        if counts and node < len(counts):
            return counts[node]
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if per_node.isdigit() else None


def _expand_tasks_per_node(value: str) -> list[int]:
    """"4(x2),2" -> [4, 4, 2]; [] if the value is empty or not in that format."""
    counts: list[int] = []
    for item in filter(None, value.split(",")):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if m is None:
            return []
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


# ----------------------------------------------------------------------------------- devices


def _visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The accelerator ids the launcher made visible to this process, or None if unrestricted."""
    for var in _VISIBLE_VARS:
        if var in env:
            return [d for d in env[var].split(",") if d.strip()]
    return None


def _choose_local_device_ids(
    local_rank: int, local_size: int, visible: Sequence[str] | None, shared: bool | None
) -> list[int]:
    """Which of the visible accelerators this process drives (indices into the visible ones).

    Args:
      local_rank, local_size: this process's index among the processes on its node, and
        their number.
      visible: the accelerator ids the launcher made visible (CUDA_VISIBLE_DEVICES ...), or
        None when it did not restrict them.
      shared: True if all processes of the node see the same accelerators, False if each was
        given its own, None if unknown.

    Returns:
      A list for `jax.distributed.initialize(local_device_ids=...)`; the empty list means
      "all visible devices" (jax restricts visibility only for a non-empty list).  The result
      only matters on GPUs: CPU devices ignore it.
    """
    if local_size <= 1:
        return []  # one process per node: it drives every device of the node
    if visible is None:
        return [local_rank]  # nothing known: one device per process, jax's convention
    if shared is False:
        return []  # the launcher already gave this process its own devices
    n = len(visible)
    if n < local_size:
        # Fewer devices than processes: either bound per process (shared unknown) or
        # oversubscribed (several processes share a device).
        return [] if shared is None else [local_rank % n]
    per_process = n // local_size  # leftover devices, if any, stay unused
    return list(range(local_rank * per_process, (local_rank + 1) * per_process))
