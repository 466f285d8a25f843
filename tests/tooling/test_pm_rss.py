"""benchmarks.pm_rss (issue 57), in process on a small grid through the harness's command line:
each program runs its steps, samples VmRSS and glibc's counts, and its table renders."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/tooling/../..)
if str(ROOT) not in sys.path:  # `benchmarks` is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import harness, pm_rss


@pytest.mark.parametrize("program", ["step"])
def test_pm_rss_samples_a_run(tmp_path, program):
    out = tmp_path / "rss.jsonl"
    assert harness.main(pm_rss, ["--shape", "16", "--meshes", "4x2", "--program", program,
                                 "--steps", "4", "--every", "2", "--quiet", "--out", str(out)]) == 0
    (r,) = harness.load_records([out])
    assert r["status"] == "ok" and r["program"] == program and r["steps"] == 4
    assert [s["step"] for s in r["samples"]] == [1, 2, 4]
    assert all(s["rss_mib"] > 0 for s in r["samples"])
    table = pm_rss.table([r])
    assert f"| 16x16x16 | 4x2 | {program} | " in table
