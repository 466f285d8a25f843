"""pytest plugin for running the suite once per MPI rank (`mpirun -np N python -m pytest ...`).

Loaded by tests/run.sh with `-p pencilfft_mpi_plugin` (tests/mp on PYTHONPATH).  It adds no
dependency (standard library only; mpi4py only when launched by mpirun) and does three things:

* a hard per-test time-out (PENCILFFT_TEST_TIMEOUT seconds, default 300; 0 disables): a test
  that waits forever in a collective because another rank failed before reaching it prints
  the stacks of this rank and ends the process.  mpirun then ends every other rank, so a
  run fails in minutes instead of hanging until the step's `timeout`;
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
import sys
import threading

import pytest

_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_RANK = next((int(os.environ[v]) for v in _RANK_VARS if v in os.environ), None)  # None: no mpirun
_LOG_DIR = os.environ.get("PENCILFFT_LOG_DIR")
_TIMEOUT = float(os.environ.get("PENCILFFT_TEST_TIMEOUT", "300"))

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


def _expire(nodeid: str) -> None:
    _STDERR.write(
        f"\n{_WHO}{nodeid} still running after {_TIMEOUT:g} s (PENCILFFT_TEST_TIMEOUT); "
        "probably waiting in a collective that another rank never entered. Stacks:\n"
    )
    faulthandler.dump_traceback(file=_STDERR, all_threads=True)
    _STDERR.flush()
    os._exit(3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _TIMEOUT <= 0:
        yield
        return
    timer = threading.Timer(_TIMEOUT, _expire, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
    # Back-stop in C, in case the main thread holds the GIL and the timer cannot run.
    faulthandler.dump_traceback_later(_TIMEOUT + 30, exit=True, file=_STDERR)
    try:
        yield
    finally:
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
