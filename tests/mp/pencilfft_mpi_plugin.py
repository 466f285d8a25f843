"""pytest plugin for running the suite once per MPI rank (`mpirun -np N python -m pytest ...`).

Loaded by tests/run.sh with `-p pencilfft_mpi_plugin` (tests/mp on PYTHONPATH).  It adds no
dependency (standard library only; mpi4py only when launched by mpirun) and does three things:

* a per-test time-out (PENCILFFT_TEST_TIMEOUT seconds, default 300; 0 disables).  In one
  process (the single-process step, each pytest-xdist worker, a plain `pytest`) a test still
  running then fails alone, named, with its traceback (SIGALRM raises in the test, as
  pytest-timeout's signal method does), and the run goes on to print its summary; only if the
  test does not come back to Python within PENCILFFT_TEST_TIMEOUT_GRACE more seconds (default
  60: a C call that never returns) are the stacks printed and the process ended (pytest-xdist
  then reports that test as crashed, replaces the worker and goes on).  Under mpirun the
  time-out is hard at once: a test that waits forever in a collective because another rank
  failed before reaching it prints the stacks of this rank and ends the process, and mpirun
  ends every other rank, so a run fails in minutes instead of hanging until the step's
  `timeout` (a test failed on one rank only would pair the next test's collectives wrongly);
* under mpirun, a check right after collection that every rank collected the same tests,
  in the same order, with the same skip marks (a mismatch would pair different
  collectives across ranks and hang): all ranks stop with a usage error otherwise;
* under mpirun with PENCILFFT_LOG_DIR set, readable output: rank 0 writes the normal report
  to the terminal, every other rank writes its report to PENCILFFT_LOG_DIR/rank<R>.log and
  its exit status to rank<R>.rc (no .rc file: the rank was killed), which run.sh prints
  when that rank failed.

The single-process run uses it too, for the time-out.
"""
from __future__ import annotations

import faulthandler
import hashlib
import os
import signal
import sys
import threading

import pytest

_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_RANK = next((int(os.environ[v]) for v in _RANK_VARS if v in os.environ), None)  # None: no mpirun
_LOG_DIR = os.environ.get("PENCILFFT_LOG_DIR")
_TIMEOUT = float(os.environ.get("PENCILFFT_TEST_TIMEOUT", "300"))
_GRACE = float(os.environ.get("PENCILFFT_TEST_TIMEOUT_GRACE", "60"))

if _RANK and _LOG_DIR:
    # Redirect at the file-descriptor level before pytest sets up its capture and terminal:
    # the pytest report, warnings from C++ libraries (gloo) and crash dumps all go to the log.
    _fd = os.open(os.path.join(_LOG_DIR, f"rank{_RANK}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(_fd, 1)
    os.dup2(_fd, 2)
    os.close(_fd)

# A private copy of this rank's real stderr (terminal or log): while a test runs pytest points
# fd 2 at a capture file, which a process that is about to _exit would never show.
_STDERR = os.fdopen(os.dup(2), "w", buffering=1)
_WHO = "" if _RANK is None else f"rank {_RANK}: "


def _expire(nodeid: str, after: float) -> None:
    why = ("probably waiting in a collective that another rank never entered" if _RANK is not None
           else "it did not return to Python after its time-out")
    _STDERR.write(
        f"\n{_WHO}{nodeid} still running after {after:g} s (PENCILFFT_TEST_TIMEOUT); "
        f"{why}. Stacks:\n"
    )
    faulthandler.dump_traceback(file=_STDERR, all_threads=True)
    _STDERR.flush()
    os._exit(3)


class _TimedOut:
    """SIGALRM's handler while a test runs in one process: fail that test, here, by name."""

    def __init__(self, nodeid: str):
        self.nodeid = nodeid

    def __call__(self, signum, frame):
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # once: teardown must not fail again
        pytest.fail(f"{self.nodeid} ran past {_TIMEOUT:g} s (PENCILFFT_TEST_TIMEOUT) and was "
                    "stopped; the traceback shows where it was.", pytrace=True)


def _soft_timeout() -> bool:
    """Whether a test that runs too long can fail alone: one process (mpirun's ranks must all
    stop), a main thread to signal, a platform with SIGALRM."""
    return (_RANK is None and hasattr(signal, "SIGALRM")
            and threading.current_thread() is threading.main_thread())


_RUNNING: list[str] = []  # the test running now (for the message when the run is interrupted)


def pytest_keyboard_interrupt(excinfo):
    """The step's limit was reached (tests/run.sh sends SIGINT) or Ctrl-C: say which test was
    running, next to pytest's summary of those that ran."""
    if _RUNNING:
        _STDERR.write(f"\n{_WHO}interrupted while running {_RUNNING[-1]}\n")
        _STDERR.flush()


def pytest_runtest_logfinish(nodeid, location):
    _RUNNING.clear()  # done (an interrupted test never gets here)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING[:] = [item.nodeid]
    if _TIMEOUT <= 0:
        yield
        return
    soft = _soft_timeout()
    hard = _TIMEOUT + (_GRACE if soft else 0.0)
    if soft:
        previous = signal.signal(signal.SIGALRM, _TimedOut(item.nodeid))
        signal.setitimer(signal.ITIMER_REAL, _TIMEOUT)
    timer = threading.Timer(hard, _expire, args=(item.nodeid, hard))
    timer.daemon = True
    timer.start()
    # Back-stop in C, in case the main thread holds the GIL and the timer cannot run.
    faulthandler.dump_traceback_later(hard + 30, exit=True, file=_STDERR)
    try:
        yield
    finally:
        if soft:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()


def pytest_collection_finish(session):
    if _RANK is None:
        return
    from mpi4py import MPI

    lines = []
    for item in session.items:
        # Conditions of skipif/xfail are usually booleans computed at import: compare them too.
        marks = sorted(
            f"{m.name}{m.args!r}"
            for m in item.iter_markers()
            if m.name in ("skip", "skipif", "xfail")
        )
        lines.append(f"{item.nodeid} {';'.join(marks)}")
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    digests = MPI.COMM_WORLD.allgather((digest, len(lines)))
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        counts = ", ".join(f"rank {r}: {n}" for r, (_, n) in enumerate(digests))
        raise pytest.UsageError(
            f"ranks {differ} collected other tests or skip marks than rank 0 (tests per rank: "
            f"{counts}); they would run mismatched collectives. Make collection and skip "
            "decisions identical on every rank."
        )


def pytest_sessionfinish(session, exitstatus):
    if _RANK and _LOG_DIR:
        with open(os.path.join(_LOG_DIR, f"rank{_RANK}.rc"), "w") as f:
            f.write(f"{int(exitstatus)}\n")
    sys.stdout.flush()
