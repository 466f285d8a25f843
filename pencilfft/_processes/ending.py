"""Ending every process of a job at once, from the one process that knows it must end.

A process of a multi-process job that leaves normally runs jax's atexit shutdown, which waits
for the other processes, themselves waiting for this one in a collective: minutes (jax's
time-outs) or until the batch system's walltime.  So what must end the job (an uncaught
exception or a non-zero exit on one process, `exits`; a signal, `signals`; a process stuck
after a failed callback, `callback_watch`) says why on standard error, waits (at most a
moment) until the launcher has read what this process wrote, and ends the job through MPI
(`MPI.COMM_WORLD.Abort`), or this process alone (`os._exit`) without MPI, when the launcher
or jax's heartbeat ends the others.
"""
from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Sequence

from .gloo_chatter import stop_stdout_filter
from .launchers import running_mpi

__all__ = ["abort_job", "end_job", "wait_until_read"]


def end_job(message: str, status: int, wait_s: float = 2.0) -> None:
    """Write `message` (one line) to standard error, forward what standard output still holds,
    wait at most `wait_s` s until the launcher has read it, then end this process with
    `status` and, through MPI when it runs, every other process of the job.  Never returns."""
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        sys.stdout.flush()
        stop_stdout_filter()
        wait_until_read(timeout=wait_s)
    finally:
        abort_job(status)


def wait_until_read(fds: Sequence[int] = (1, 2), timeout: float = 2.0) -> None:
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


def abort_job(status: int = 1) -> None:
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
