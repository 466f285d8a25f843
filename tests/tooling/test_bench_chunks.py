"""benchmarks/chunks.py (issue 27): its records on a tiny grid, its tables, and the grid-that-fits
arithmetic on hand-computed cases.  Single process (the tool refuses several)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/tooling/../..)
if str(ROOT) not in sys.path:  # `benchmarks` is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import chunks, harness


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """One mesh, the transposed layout, chunks 1, 2 and auto, memory and time, at 16^3."""
    out = tmp_path_factory.mktemp("chunks") / "chunks.jsonl"
    mp = pytest.MonkeyPatch()
    mp.delenv("PENCILFFT_MEMORY_LIMIT", raising=False)
    try:
        assert harness.main(chunks, ["--shape", "16", "--pdims", "4x2", "--layouts", "transposed",
                            "--chunks", "1", "2", "auto", "--repeats", "1", "--warmup", "0",
                            "--out", str(out)]) == 0
    finally:
        mp.undo()
    return harness.load_records([out])


def test_records_have_every_field(records):
    jaxdecomp = importlib.util.find_spec("jaxdecomp") is not None
    keys = sorted((r["part"], r["impl"], str(r["chunks"])) for r in records)
    want = [(part, "pencilfft", c) for part in ("memory", "time") for c in ("1", "2", "auto")]
    if jaxdecomp:
        want += [("memory", "jaxdecomp", "None"), ("time", "jaxdecomp", "None")]
    assert keys == sorted(want)
    block = 16**3 * 8 // 8
    for r in records:
        assert r["shape"] == [16, 16, 16] and r["pdims"] == [4, 2] and r["layout"] == "transposed"
        assert "loadavg_1m" in r["machine"] and r["command"].startswith("python -m benchmarks.chunks")
        if r["impl"] == "pencilfft":
            # No limit set: "auto" is the unchunked transform.
            assert r["chunks_resolved"] == (1 if r["chunks"] == "auto" else r["chunks"])
            assert r["exchange"] == "alltoall"
        if r["part"] == "memory":
            assert r["block_bytes"] == block
            measures = set(chunks.MEASURES) - ({"r2c_forward"} if r["impl"] == "jaxdecomp" else set())
            assert set(r["blocks"]) == measures
            for m in measures:
                sizes = r["bytes"][m]
                assert sizes["peak"] == sizes["arg"] + sizes["out"] + sizes["temp"] - sizes["alias"]
                assert r["blocks"][m] == sizes["peak"] / block
            assert r["bytes"]["forward"]["arg"] == block  # the argument is one complex block
            assert r["bytes"]["forward_donated"]["peak"] <= r["bytes"]["forward"]["peak"]
        else:
            assert r["repeats"] == len(r["times_s"]) == 1 and r["median_s"] > 0
            assert r["max_rel_diff_vs_chunks1"] < 1e-5, r
    mem = {r["chunks"]: r["blocks"] for r in records
           if r["part"] == "memory" and r["impl"] == "pencilfft"}
    assert mem[2]["forward_donated"] < mem[1]["forward_donated"]  # chunking saves memory
    assert mem["auto"] == mem[1]


def test_tables_render(records):
    mem = chunks.memory_table(records)
    assert "| forward, donated | chunks=2 |" in mem and "4x2 T" in mem
    assert "chunks=auto resolved to 1 (PENCILFFT_MEMORY_LIMIT unset)" in mem
    time = chunks.time_table(records)
    assert "| chunks=1 | " in time and "(1.00)" in time and "load average" in time
    fits = chunks.fits_table(records)
    assert "| pencilfft chunks=8" not in fits  # chunks=8 was not measured here: no row
    assert "| pencilfft default (chunks=1), c2c kept |" in fits


def test_auto_resolves_to_more_pieces_under_a_limit(records, monkeypatch):
    """With PENCILFFT_MEMORY_LIMIT below the unchunked working set, "auto" takes pieces."""
    mesh = harness.make_mesh((4, 2))
    # 3 blocks of 4 KiB: unchunked needs 4 (input, output, 2 exchange buffers), 2 pieces 3.
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", str(3 * 4096))
    assert chunks.resolved_chunks((16, 16, 16), mesh, "transposed", "alltoall", "auto",
                                  "complex64") == 2


def test_largest_cube_hand_computed():
    gib = 1 << 30
    # 4 blocks on 8 devices of 40 GiB: 4 N^3 <= 40 GiB, N^3 <= 10 * 2^30: 2048 (4096^3 = 64 * 2^30).
    assert chunks.largest_cube(4.0, 8, 40 * gib) == 2048
    assert chunks.max_side(4.0, 8, 40 * gib) == 2206  # (10 * 2^30)^(1/3) = 2206.4
    # Exactly full: 1.25 * N^3 * 8 / 512 = 80 GiB at N = 2^14.
    assert chunks.largest_cube(1.25, 512, 80 * gib) == 16384
    assert chunks.max_side(1.25, 512, 80 * gib) == 16384
    assert chunks.largest_cube(1.25 * 1.0001, 512, 80 * gib) == 8192
    assert chunks.largest_cube(2.0, 1, 15) == 0 and chunks.largest_cube(2.0, 1, 16) == 1


def test_fits_table_from_records():
    base = {"tool": "chunks", "part": "memory", "shape": [256] * 3, "dtype": "complex64",
            "pdims": [4, 2], "layout": "transposed", "exchange": "alltoall",
            "block_bytes": 16 << 20, "machine": {}}
    recs = [dict(base, impl="pencilfft", chunks=1, blocks={"forward": 4.0, "forward_donated": 3.0,
                                                           "roundtrip": 4.0, "r2c_forward": 2.0}),
            dict(base, impl="pencilfft", chunks=8, pdims=[8, 1],
                 blocks={"forward": 2.25, "forward_donated": 1.25, "roundtrip": 2.25,
                         "r2c_forward": 1.25}),
            dict(base, impl="pencilfft", chunks=8,
                 blocks={"forward": 2.0, "forward_donated": 1.25, "roundtrip": 2.0,
                         "r2c_forward": 1.0}),
            dict(base, impl="jaxdecomp", chunks=None,
                 blocks={"forward": 4.0, "forward_donated": 3.0, "roundtrip": 4.0})]
    rows = {label: (worst, spread) for label, worst, spread in chunks.fit_blocks(recs)}
    assert rows["pencilfft chunks=8, c2c kept"] == (2.25, "2.00-2.25")
    assert rows["pencilfft chunks=8, c2c donated"] == (1.25, "1.25")
    table = chunks.fits_table(recs)
    # 1.25 blocks, 512 x 80 GiB: exactly 16384^3 (see above).
    line = next(s for s in table.splitlines() if s.startswith("| pencilfft chunks=8, c2c donated"))
    assert line.endswith("| 16384^3 (16384) |")
    line = next(s for s in table.splitlines() if s.startswith("| jaxdecomp, c2c kept"))
    assert "| 2048^3 (2206) |" in line  # 4 blocks, 8 x 40 GiB
