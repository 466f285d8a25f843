"""Multi-controller start-up: one call that works under mpirun/mpiexec, srun and plain python.

`initialize()` looks at the environment the launcher left behind (`launchers`: MPI, SLURM, a
coordinator given by hand, or a `multiprocessing` child, which is no process of the job) and
starts `jax.distributed` with the right process count, process id, coordinator and local
devices (`placement`: which CPUs and accelerators each process of a node takes); in anything
else nothing happens (one process sees all its devices).

Once jax.distributed runs, `initialize()` also installs what ends the whole job when one
process fails while the others go on: an uncaught exception or a non-zero exit (`exits`), a
process stuck after a failed jax callback (`callback_watch`), SIGTERM and SIGINT (`signals`),
all through `ending`; and it keeps gloo's connection messages off standard output
(`gloo_chatter`).  Under `srun --mpi=pmi2` with the mpich wheel it first picks that MPI's
network layer (`mpich`).  This module holds only the call that puts them together, in order.
"""
from __future__ import annotations

import functools
import inspect
import os

import jax

from . import callback_watch, exits, mpich, signals
from .gloo_chatter import hide_gloo_chatter
from .launchers import (launched_by_mpi, mpi_arguments, multiprocessing_child, process_hosts,
                        running_mpi, slurm_arguments, slurm_step, srun_mpi_hint)
from .placement import BIND_ENV, bind_cpus as bind_to_cpus

# `running_mpi`, `srun_mpi_hint` and `process_hosts` are launchers' (imported here by modules
# that ask them).
__all__ = ["initialize", "process_hosts", "running_mpi", "srun_mpi_hint"]


def initialize(*, verbose: bool = False, abort_on_error: bool | None = None,
               bind_cpus: bool | None = None, stop_on_signal: bool | None = None,
               **overrides) -> None:
    """Start `jax.distributed` if this process was started by mpirun/mpiexec or srun.

    Call it once at the top of the program, before anything that touches jax devices (jax
    refuses to start the distributed runtime after its backend exists).  In a plain
    `python` process, under `mpirun -np 1` or in a 1-task SLURM step it does nothing; called
    again after a successful start it returns at once.  In a process that `multiprocessing`
    started (a spawn or forkserver child, which runs the main module again, this call at its
    top included; a `ProcessPoolExecutor` worker; a fork child) it does nothing either: such a
    process inherited its parent's launcher variables but is no process of the job (it would
    fail to start MPI, or make jax's coordinator abort its parent); it uses its own local
    devices, and `jax.distributed.initialize` called by hand makes it a member of a job.

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
        before.  Not installed in an interactive interpreter.  In a job of one process
        (a coordinator given by hand, one process) nothing is ended: exits and uncaught
        exceptions keep Python's own exit, `atexit` handlers included.
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
    abort_on_error = _switch(abort_on_error, "abort_on_error", exits.ABORT_ENV)
    bind_cpus = _switch(bind_cpus, "bind_cpus", BIND_ENV)
    stop_on_signal = _switch(stop_on_signal, "stop_on_signal", signals.SIGNAL_ENV)
    say = functools.partial(_say, verbose)
    if not abort_on_error:
        _remove_abort_hooks()
    if not stop_on_signal:
        signals.remove()
    if (child := multiprocessing_child()) is not None:
        say(f"{child} was started by multiprocessing: it is no process of its parent's job; "
            "jax.distributed not started")
        return
    if jax.distributed.is_initialized():
        say("jax.distributed is already initialized; nothing to do")
        if abort_on_error:
            _install_abort_hooks(say)
        if stop_on_signal:
            signals.install(say)
        return
    env = os.environ
    started = False
    if "cluster_detection_method" not in overrides and launched_by_mpi(env):
        # Before MPI starts (below, in `mpi_arguments`): the mpich wheel's network layer under
        # srun's pmi2 plug-in (`mpich`: its UCX addresses can overflow Slurm's PMI-1 read).
        if (chosen := mpich.prepare(env)) is not None:
            say(chosen)
    if "cluster_detection_method" in overrides:
        # The caller chose jax's own detection explicitly: do not second-guess it.
        started = _start(say, "explicit cluster_detection_method", overrides)
    # MPI starts in `mpi_arguments` (its import of mpi4py): whatever the MPI library reads from
    # the environment when it starts must be set before it, here (a job of one rank starts no
    # MPI, and a multiprocessing child never gets here).
    elif launched_by_mpi(env) and (kwargs := mpi_arguments(env, overrides)) is not None:
        if bind_cpus and (bound := bind_to_cpus(env)) is not None:
            say(bound)  # before jax starts its backend, which sizes its thread pools
        process_hosts()  # (one allgather, here where every process is: asked later, cached)
        started = _start(say, "MPI", kwargs)
    elif slurm_step(env):
        started = _start(say, "SLURM", slurm_arguments(env, overrides))
        if (hint := srun_mpi_hint(env=env)) is not None:
            say(hint)  # jax runs; what needs MPI (scatter, the MPI exchange) will not
    elif "coordinator_address" in overrides or "JAX_COORDINATOR_ADDRESS" in env:
        # No launcher, but a coordinator: each process was set up by hand.
        started = _start(say, "manual (coordinator given)", overrides)
    else:
        say("single process (no mpirun/srun detected); jax.distributed not started")
    if started and abort_on_error:
        _install_abort_hooks(say)
    if started and stop_on_signal:
        # Only now: jax.distributed.initialize installs its own SIGTERM handler (its
        # preemption notice), which would replace ours had we installed it before.
        signals.install(say)
    if started and not verbose:
        hide_gloo_chatter()


def _install_abort_hooks(say) -> None:
    """What ends the job when this process fails: the exception and exit hooks, then the
    watch of failed callbacks (once each)."""
    if exits.install(say):
        callback_watch.install()


def _remove_abort_hooks() -> None:
    exits.remove()
    callback_watch.remove()


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


def _say(verbose: bool, message: str) -> None:
    if verbose:
        print(f"pencilfft.initialize: {message}", flush=True)


def _start(say, launcher: str, kwargs: dict) -> bool:
    """Call jax.distributed.initialize, making sure CPU devices get cross-process collectives."""
    _use_gloo_on_cpu()
    shown = {k: v for k, v in kwargs.items() if k != "cluster_detection_method" or v}
    say(f"launcher {launcher}; jax.distributed.initialize({shown})")
    jax.distributed.initialize(**kwargs)
    say(f"process {jax.process_index()} of {jax.process_count()}")
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
