"""A process stuck after a failed jax callback, among several local devices, ends the job.

An exception in a jax callback that is not partitioned (jax.debug.callback, pure_callback,
io_callback) fails that callback's device only: with several devices per process the others
wait for it in the computation's collectives (XLA's own all-to-all too), so the error never
reaches Python and every process of the job hangs (upstream; with one device per process the
error reaches the caller, and the abort hook of `exits`).  jax logs the failure from the thread
that ran the callback: seen there, in a job of several processes with several local devices,
it says so at once, and ends the job (`ending`) if the main thread then waits in jax, at one
place, for `GRACE_S` seconds (a program that goes on is left alone: the watch stops after ten
times as long).  Installed and removed with the abort hook (`initialize(abort_on_error=...)`).
"""
from __future__ import annotations

import logging
import sys
import threading
import time

import jax

from . import ending

__all__ = ["GRACE_S", "install", "remove"]

_CALLBACK_LOGGERS = ("jax._src.debugging", "jax._src.callback")
_CALLBACK_FAILED = ("jax.debug.callback failed", "jax.pure_callback failed",
                    "jax.io_callback failed")
# How long the main thread may stay at one place in jax after a failed callback.
GRACE_S = 30.0
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
        grace, name = GRACE_S, record.msg.split()[0]
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
            ending.end_job(
                f"pencilfft: process {jax.process_index()} of {jax.process_count()} has not "
                f"moved for {grace:g} s since its {name} raised; ending every process of the "
                f"job (to avoid it: {_WAYS_OUT}; PENCILFFT_ABORT_ON_ERROR=0 turns this off)", 1)
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


def install() -> None:
    """Watch jax's loggers of failed callbacks (once each)."""
    for name in _CALLBACK_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _CallbackWatch) for f in logger.filters):
            logger.addFilter(_CallbackWatch())


def remove() -> None:
    """Stop watching (nothing installed: nothing happens)."""
    for name in _CALLBACK_LOGGERS:
        logger = logging.getLogger(name)
        for watch in [f for f in logger.filters if isinstance(f, _CallbackWatch)]:
            logger.removeFilter(watch)
