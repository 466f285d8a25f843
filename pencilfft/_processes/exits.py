"""One process of a multi-process job that fails or exits with a non-zero status ends the job.

Without this, the failing process waits in jax's atexit shutdown (`shutdown_timeout_seconds`,
300 s) for the others, which wait for it in their next collective; then all abort and the
status is lost (issues 48, 51 and 57).  `install` (from `initialize`, once jax.distributed
runs) covers the two ways a Python program ends with a failure:

* an uncaught exception: a `sys.excepthook` (the documented hook) that prints the traceback as
  before, then ends the job (`ending`) with status 1;
* a non-zero exit (`sys.exit(n)`, builtin `exit(n)`, `raise SystemExit(n)`): see below.

In a job of one process there is no one to end and no one to wait for: both leave through
Python's own exit, `atexit` handlers and all.  Everything keeps Python's semantics exactly:
what is printed and the exit status are what plain Python gives for every status (None, an
int, a string, a tuple: Python 3.11 and 3.12 differ for tuples, and each is kept), and only
where the job must be ended is the process left through `ending` instead.

Exits.  No documented hook sees the status of a SystemExit before `atexit`: the interpreter
reads it from the exception's `code` at the very top, once every Python frame is gone, keeps
it in C and only then runs `atexit` (jax's shutdown among them).  mpi4py's runner (`python -m
mpi4py`, its documented way to abort an MPI job on failure) sees it in Python but aborts only
at MPI's finalization, after jax's shutdown has waited for the others (measured: still waiting
after 90 s).  So that reading is where the job ends: `code` read with no Python caller on the
main thread ends every process with that status; read from Python (`except SystemExit as e:
e.code`, pytest.raises, mpi4py's runner) it is the plain code and nothing happens, and a status
of 0 (or None) is a clean exit through jax's shutdown as before.  Two places read it that way:

* SystemExit's own `code` descriptor, replaced by a property that reads the original member:
  `raise SystemExit(n)` and builtin exit(n) (site's, which raises it in Python).  SystemExit is
  a built-in type whose attributes Python code cannot set: its namespace is changed in place
  and its attribute cache reset through the C API, as no pure-Python way exists.  Where that
  fails (another interpreter) `install` says so.
* `exit`, which stands for sys.exit while installed and raises a SystemExit object: CPython
  3.11's sys.exit, written in C, sets the bare status as the pending exception, which the
  interpreter reads without making a SystemExit object, so no descriptor is asked (3.12 and
  later always make the object).  Where SystemExit cannot be watched, it raises `_JobExit`,
  whose own `code` does the same.  A module-level function, it pickles by name (a spawned
  `Process(target=sys.exit)`, `ProcessPoolExecutor.submit(sys.exit, n)`) and, in a process
  where nothing is installed, calls Python's sys.exit.

A SystemExit raised in another thread ends that thread only (Python's rule; the threading
module drops it without reading `code`): the process goes on, and so does the job.  A process
leaving with a non-zero status first waits (at most `_ENDING_WAIT_S`) for the others to be
leaving too (each says so in jax.distributed's key-value store as it exits): when all are
(every rank of a test run that failed), each leaves through jax's shutdown with its status.
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import sys
import threading
import time
from collections.abc import Callable

import jax

from .._jax_private import distributed_client
from . import ending

__all__ = ["ABORT_ENV", "exit", "install", "install_exit_watch", "remove"]

# Set to 0 (or false/no/off) to keep the default exception handling under a launcher.
ABORT_ENV = "PENCILFFT_ABORT_ON_ERROR"
# Python 3.11's sys.exit hands the interpreter its bare argument (a tuple, say), which it reads
# as the status without making the SystemExit that Python code would catch; 3.12 and later
# always make the object, and read its `code` (tuples then differ: `sys.exit((3,))` is status
# 1 on 3.11, 3 on 3.12).
_BARE_STATUS = sys.version_info < (3, 12)
# Where each ending process says so (jax.distributed's key-value store): a process leaving with
# a non-zero status ends the job only if some other is not ending within _ENDING_WAIT_S seconds
# (one that waits in a collective for it); processes that all end, as the ranks of a test run
# that failed, leave through jax's shutdown with their own statuses.
_ENDING = "pencilfft/ending"
_ENDING_WAIT_S = 3.0
_SYSTEM_EXIT_CODE = SystemExit.__dict__["code"]  # the C member the interpreter reads
_PYTHON_EXIT = sys.exit  # as this module is imported: Python's own


def _quiet(message: str) -> None:
    pass


class _Installed:
    """What `install` replaced, for `remove` (sys.exit None: not installed)."""
    exit: Callable | None = None


def install(say: Callable[[str], None] = _quiet) -> bool:
    """Put the abort hook in front of the current sys.excepthook, make sys.exit `exit` and
    watch SystemExit (once each); True if installed.  `say` gets what was done, in words."""
    if not getattr(sys.excepthook, "_pencilfft_abort", False):
        if sys.flags.interactive or hasattr(sys, "ps1"):
            # The interactive interpreter reports every failed statement through the hook.
            say("interactive interpreter: no abort-on-error exception hook")
            return False
        sys.excepthook = _make_abort_hook(sys.excepthook, jax.process_index(),
                                          jax.process_count())
        say(f"an uncaught exception or SystemExit(n) with n != 0 aborts the whole job "
            f"({ABORT_ENV}=0 to keep going)")
    install_exit_watch(say)
    return True


def remove() -> None:
    """Undo `install` (nothing installed: nothing changes)."""
    hook = sys.excepthook
    if getattr(hook, "_pencilfft_abort", False):
        sys.excepthook = hook._pencilfft_previous
    if _Installed.exit is not None:
        if sys.exit is exit:
            sys.exit = _Installed.exit
        _Installed.exit = None
    _unwatch_system_exit()
    atexit.unregister(_say_ending)


def install_exit_watch(say: Callable[[str], None] = _quiet) -> None:
    """Make sys.exit `exit` and watch SystemExit (once each), so that a non-zero status ends
    every process of the job."""
    _watch_system_exit(say)
    # Registered after jax's atexit shutdown (at jax's import), so run before it; once.
    atexit.unregister(_say_ending)
    atexit.register(_say_ending)
    if _Installed.exit is None:
        _Installed.exit = sys.exit
        sys.exit = exit


# ------------------------------------------------------------------------- uncaught errors


def _make_abort_hook(previous, index: int, count: int):
    def hook(exc_type, exc, tb):
        try:
            previous(exc_type, exc, tb)  # the usual traceback first
        finally:
            if count > 1:  # one process: Python's own exit (status 1), atexit and all
                ending.end_job(
                    f"pencilfft: uncaught {exc_type.__name__} in process {index} of {count}; "
                    "aborting every process of the job so that none waits forever for this "
                    f"one (pencilfft.initialize(abort_on_error=False) or {ABORT_ENV}=0 turns "
                    "this off)", 1)

    hook._pencilfft_abort = True
    hook._pencilfft_previous = previous
    return hook


# ------------------------------------------------------------ SystemExit(n) on one process


def exit(status=None, /):  # noqa: A001 - it stands for sys.exit
    """Exit the interpreter by raising SystemExit(status), as Python's sys.exit: None is exit
    status 0, an integer is the status, anything else is printed to stderr and the status is
    1.  While pencilfft's exit watch is installed (`initialize` in a job of several processes)
    a non-zero status that reaches the top of the main thread ends every process of the job."""
    if _Installed.exit is None:
        _PYTHON_EXIT(status)  # nothing watched here (a copy pickled to another process)
    # As Python makes the exception (PyErr_SetObject): no status no args, a tuple the args,
    # anything else the one argument; what Python code that catches it sees.
    args = () if status is None else status if isinstance(status, tuple) else (status,)
    # A SystemExit object, which the interpreter reads through the watched `code`; where
    # SystemExit is not watched, a _JobExit (in the main thread only: the threading module
    # drops exactly SystemExit silently, and a thread's exit ends nothing).
    kind = (SystemExit if SystemExit.__dict__["code"] is _WATCHED_CODE
            or threading.current_thread() is not threading.main_thread() else _JobExit)
    exc = kind(*args)
    if _BARE_STATUS:
        exc._pencilfft_status = status  # what the interpreter reads on 3.11: the bare status
    exc._pencilfft_how = "sys.exit"  # for the message
    raise exc


def _exit_code_read(exc) -> object:
    """`exc.code` from the C member when Python code reads it; when the interpreter does, the
    status as it reads it, and the job ends here if that is a failure."""
    code = _SYSTEM_EXIT_CODE.__get__(exc)
    if (sys._getframe(1).f_back is None  # read by the interpreter, not by Python code
            and threading.current_thread() is threading.main_thread()):
        code = vars(exc).get("_pencilfft_status", code)
        if _Installed.exit is not None:
            _end_job_on_exit(code, getattr(exc, "_pencilfft_how", "SystemExit"))
    return code


class _JobExit(SystemExit):
    """What `exit` raises where SystemExit cannot be watched: a SystemExit in every way but
    `code`'s getter."""

    @property
    def code(self):
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
    try:
        (namespace,) = gc.get_referents(SystemExit.__dict__)  # behind the read-only view
        if not isinstance(namespace, dict) or "code" not in namespace:
            return False
        namespace["code"] = descriptor
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(SystemExit))  # its attribute cache
    except (AttributeError, TypeError, ValueError, OSError):
        return False
    return SystemExit.__dict__["code"] is descriptor


def _watch_system_exit(say: Callable[[str], None] = _quiet) -> None:
    """Make the interpreter's reading of any SystemExit's status end the job (once)."""
    if SystemExit.__dict__["code"] is _WATCHED_CODE:
        return
    if not _set_system_exit_code(_WATCHED_CODE):
        say("cannot watch SystemExit in this interpreter: a bare `raise SystemExit(n)` or "
            "exit(n) on one process leaves the others waiting")


def _unwatch_system_exit() -> None:
    if SystemExit.__dict__["code"] is _WATCHED_CODE:
        _set_system_exit_code(_SYSTEM_EXIT_CODE)


def _python_status(code) -> tuple[int, str]:
    """(the exit status, what is printed first: "" or a line) of a Python process whose
    SystemExit has `code`, as the interpreter makes them (pythonrun.c: None is 0, an int is
    C's `(int)PyLong_AsLong(code)` (-1 beyond a C long) as the system keeps it, modulo 256;
    anything else is printed, then status 1)."""
    if code is None:
        return 0, ""
    if isinstance(code, int):
        return (code & 0xFF if -2 ** 63 <= code < 2 ** 63 else 0xFF), ""
    return 1, f"{code}\n"


def _job_size() -> int:
    """The processes of this job: 1 where jax.distributed does not run."""
    return jax.process_count() if distributed_client() is not None else 1


def _end_job_on_exit(code, how: str = "sys.exit") -> None:
    """The interpreter is ending with SystemExit `code`: for a failure (what Python turns into
    a non-zero status) of one process of several, say so and end the whole job with that
    status; else return (the interpreter goes on as always)."""
    status, printed = _python_status(code)
    if status == 0 or _job_size() < 2:
        return  # a clean exit, or nobody else to end: Python's own exit, atexit and all
    if _say_ending(status) and _still_running(_ENDING_WAIT_S) == []:
        return  # every process is ending (a test run that failed on each): jax's shutdown
    ending.end_job(
        f"{printed}pencilfft: process {jax.process_index()} of {jax.process_count()} exits "
        f"with status {status} ({how}); ending every process of the job so that none waits "
        f"for this one (pencilfft.initialize(abort_on_error=False) or {ABORT_ENV}=0 turns "
        "this off)", status)


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
