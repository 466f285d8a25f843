"""benchmarks.nd (issue 54), in process on tiny grids through the harness's command line: every
program runs and is checked, its collectives are read from the HLO, and the table renders."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/tooling/../..)
if str(ROOT) not in sys.path:  # `benchmarks` is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import harness, nd  # noqa: E402


def test_nd_runs_every_program_and_counts_its_exchanges(tmp_path):
    out = tmp_path / "nd.jsonl"
    assert harness.main(nd, ["--shapes", "16", "--grid2d", "32", "--repeats", "1", "--warmup",
                             "0", "--quiet", "--out", str(out)]) == 0
    records = harness.load_records([out])
    assert records and all(r["status"] == "ok" for r in records), [
        (r["program"], r["note"]) for r in records if r["status"] != "ok"]
    by_name = {r["program"]: r for r in records}
    brick = by_name["brick -> brick: fftn + ifftn"]
    # The planner's 6 + 6 exchanges are the program's (pencilfft's local exchange on CPUs),
    # each direction's runs of consecutive ones in one pass: a: 0->1, then (a, b, c) onto X and
    # (c, b) back, 1 exchange and 2 reshards each way.
    assert brick["route_exchanges"] == 12
    assert brick["exchanges_in_hlo"] == 2
    assert brick["collectives"][nd.RESHARD_CALL] == 4
    assert by_name[nd.PENCIL]["exchanges_in_hlo"] == 4
    assert by_name["brick -> brick: fftn + ifftn: ffts alone"]["exchanges_in_hlo"] == 0
    assert by_name[nd.SHARDED]["collectives"].get("all-gather")
    assert all(r["max_rel_err"] < nd.CHECK_TOL for r in records if r["kind"] == "whole")
    text = nd.table(records)
    assert "| brick -> brick: fftn + ifftn | 2x2x2 (a, b, c) |" in text
    assert "3-D 16x16x16 complex64" in text and "2-D 32x32 complex64" in text
