"""benchmarks.async_loop (issue 68) through the harness's command line: a run is a process of
its own whose loop ends one of four ways, each with its record and a row of the table."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/tooling/../..)
if str(ROOT) not in sys.path:  # `benchmarks` is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import async_loop, harness  # noqa: E402


def test_a_run_that_waits_every_few_calls_completes_right(tmp_path):
    """20 jitted round trips at 16^3, a result awaited every 4 calls (never 32 ahead: nothing
    can hang): the child's record comes back with its context, completed and right."""
    out = tmp_path / "loop.jsonl"
    assert harness.main(async_loop, ["--modes", "jit", "--shapes", "16", "--calls", "20",
                                     "--runs", "1", "--every", "4", "--quiet",
                                     "--out", str(out)]) == 0
    (r,) = harness.load_records([out])
    assert (r["outcome"], r["status"], r["dispatched"], r["every"]) == ("completed", "ok", 20, 4)
    assert r["rel_err"] < 1e-4 and r["seconds"] > 0 and r["machine"]["cores"] >= 1
    assert "| jit | auto | 16x16x16 | 20 | 4 |  | 1 | 1 | 0 | 0 | 0 | 0 |" in async_loop.table([r])


def test_how_a_run_ended_sets_its_status():
    """ok: right, or failed within a minute saying why; wrong; error: anything else."""
    done = {"outcome": "completed", "rel_err": 1e-6}
    assert async_loop._status(done, 10) == "ok"
    assert async_loop._status({**done, "rel_err": 0.5}, 10) == "wrong"
    failed = {"outcome": "failed", "cause_named": True, "seconds": 25.0}
    assert async_loop._status(failed, 1000) == "ok"
    assert async_loop._status({**failed, "cause_named": False}, 1000) == "error"
    assert async_loop._status({**failed, "seconds": 61.0}, 1000) == "error"
    assert async_loop._status({"outcome": "hung", "seconds": None}, 1000) == "error"
    assert async_loop._status({"outcome": "aborted", "seconds": None}, 1000) == "error"
    assert async_loop._last_words("I0 fine\nF1201 rendezvous.cc:161] Termination timeout\n") == \
        "F1201 rendezvous.cc:161] Termination timeout"
