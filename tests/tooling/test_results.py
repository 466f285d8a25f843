"""The tables in benchmarks/RESULTS.md that come from committed data are what the table command
prints from that data (a table pasted by hand, or data changed without the table, fails)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import harness, mpi

ROOT = Path(__file__).resolve().parents[2]
RESULTS = (ROOT / "benchmarks" / "RESULTS.md").read_text()
BLOCKS = re.findall(r"<!-- table: (\S+) -->\n(.*?)\n<!-- end table -->", RESULTS, re.S)


def test_results_has_tables_from_committed_data():
    assert {path for path, _ in BLOCKS} >= {"benchmarks/data/mpi-np2.jsonl"}


@pytest.mark.parametrize("path,block", BLOCKS, ids=[p for p, _ in BLOCKS])
def test_table_is_regenerated_from_its_data(path, block):
    assert (ROOT / path).is_file(), f"{path} is named in RESULTS.md but not committed"
    assert block.strip() == mpi.table(harness.load_records([ROOT / path])).strip()


def test_table_marks_the_ratio_to_mpi4py_fft():
    rows = [dict(row=r, shape=[8, 8, 8], pdims=[2, 1], median_ms=ms)
            for r, ms in (("pencilfft/auto", 3.0), ("mpi4py-fft", 2.0), ("local FFTs", 1.0))]
    text = mpi.table(rows)
    assert "| pencilfft/auto | 3 (1.50x) |" in text
    assert "| local FFTs | 1 |" in text
    assert "pencilfft/pairwise" not in text  # rows without data are left out


@pytest.mark.single_process  # starts its own mpirun of 2 processes with 1 device each
def test_mpi_benchmark_runs_under_mpirun(tmp_path):
    import subprocess
    import sys

    from conftest import clean_env

    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    out = tmp_path / "mpi.jsonl"
    cmd = [str(mpirun), "-np", "2", sys.executable, "-m", "benchmarks.mpi", "--shapes", "16",
           "--repeats", "1", "--rounds", "1", "--warmup", "1", "--out", str(out)]
    proc = subprocess.run(cmd, env=clean_env(1), cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = harness.load_records([out])
    rows = {r["row"] for r in records}
    assert {"pencilfft/auto", "exchange: jax all_to_all", "exchange: MPI Alltoall",
            "local FFTs"} <= rows
    assert all(r["processes"] == 2 and r["median_ms"] > 0 for r in records)
