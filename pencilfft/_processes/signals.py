"""SIGTERM and SIGINT end every process of the job, even while it waits in a collective.

`jax.distributed` installs a SIGTERM handler of its own (a preemption notice: it logs "SIGTERM
caught" and the process carries on), so `timeout`, `scancel`, a batch system's time limit or
Ctrl-C left every rank waiting in its collective until SIGKILL.  `install` (from `initialize`,
after jax.distributed has started, or its handler would replace ours) makes either signal end
this process with status 128 + the signal's number and the job with it (`ending`).

A Python signal handler runs in the main thread, between two bytecodes: never while that
thread waits in a collective inside XLA or MPI, which is where a stopped job usually is.  So
the handler is installed through Python (which replaces jax's C handler) only to have
Python's C-level trampoline write the signal's number to a "wakeup" pipe
(`signal.set_wakeup_fd`, the documented hook), and a thread waiting on that pipe ends the job.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

import jax

from . import ending

__all__ = ["SIGNAL_ENV", "install", "installed", "remove", "stop_job"]

# Set to 0 (or false/no/off) to keep the default (jax's) handling of SIGTERM and SIGINT.
SIGNAL_ENV = "PENCILFFT_STOP_ON_SIGNAL"
# The signals that end the job: a batch system's cancel or time limit, `timeout`, Ctrl-C.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _quiet(message: str) -> None:
    pass


class _SignalState:
    """What `install` set up in this process and what it replaced, for `remove`."""
    installed = False
    previous: dict = {}  # signal -> the handler found before (None: one set outside Python)
    previous_wakeup_fd = -1
    pipe: tuple[int, int] | None = None
    stopping = threading.Lock()


def installed() -> bool:
    """Whether SIGTERM and SIGINT end the job now."""
    return _SignalState.installed


def install(say: Callable[[str], None] = _quiet) -> bool:
    """SIGTERM and SIGINT end the whole job (once); True if installed.  `say` gets what was
    done, in words (`initialize(verbose=True)` prints it)."""
    st = _SignalState
    if st.installed:
        return True
    if sys.flags.interactive or hasattr(sys, "ps1"):
        say("interactive interpreter: SIGTERM/SIGINT keep their handlers")
        return False
    if threading.current_thread() is not threading.main_thread():
        say("not the main thread: SIGTERM/SIGINT keep their handlers")
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
    say(f"SIGTERM and SIGINT end the whole job ({SIGNAL_ENV}=0 to keep jax's handling)")
    return True


def remove() -> None:
    """The handlers found before `install` back (nothing installed: nothing happens)."""
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
                stop_job(signum)
    os.close(read_fd)


def _on_signal(signum: int, frame) -> None:
    """The Python-level handler: where the main thread gets to it first."""
    stop_job(signum)


def stop_job(signum: int) -> None:
    """Say why, then end this process with 128 + signum and the job with it (first caller
    only: the watcher thread and the main thread's handler may both get here)."""
    if not _SignalState.stopping.acquire(blocking=False):
        threading.Event().wait()  # the other caller is ending the process
    name = signal.Signals(signum).name
    status = 128 + signum
    ending.end_job(
        f"pencilfft: process {jax.process_index()} of {jax.process_count()} received {name}; "
        f"ending every process of the job (exit status {status}; {SIGNAL_ENV}=0 turns this "
        "off)", status, wait_s=1.0)

