"""benchmarks.ranks (many ranks) and benchmarks.overlap (pipelining across namespace nodes):
the first run for real at N = 2 on a tiny grid, the second's table from records of its shape
(a run needs root, namespaces and a Slurm: `python -m benchmarks.overlap`, as RESULTS.md says).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import overlap, ranks  # noqa: E402

MPIRUN = Path(sys.executable).parent / "mpirun"


@pytest.mark.skipif(not MPIRUN.exists(), reason=f"no mpirun beside {sys.executable}")
def test_ranks_measures_every_time_of_a_two_process_run(tmp_path):
    out = tmp_path / "ranks.jsonl"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "MPI_", "PENCILFFT_TEST", "HYDRA_"))}
    done = subprocess.run([sys.executable, "-m", "benchmarks.ranks", "--ranks", "2", "--shapes",
                           "16", "--repeats", "1", "--out", str(out), "--quiet"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["processes"] == 2 and record["pdims"] == [2, 1]
    for key, _ in ranks.METRICS:
        assert 0 < record[key] < 120, (key, record[key])
    table = ranks.table([record])
    assert "np 2, 16^3" in table and "agreement of one plan" in table


def test_overlap_table_compares_the_rows_against_the_link_and_t0():
    base = dict(nodes=2, pdims=[2, 1], shape=[256, 256, 256], bytes_per_roundtrip=67_108_864,
                bytes_per_exchange=33_554_432, machine={"cpu": None}, versions={})
    rows = {"unlimited": dict(today=0.3, chunked=0.33, pipelined=0.4, **{"mpi4py-fft": 0.4}),
            "1790mbit": dict(today=0.56, chunked=0.55, pipelined=0.45, **{"mpi4py-fft": 0.64})}
    records = [dict(base, rate=rate, row=row, median_s=t) for rate, by in rows.items()
               for row, t in by.items()]
    records += [dict(base, rate="1790mbit", row="exchange alone", median_s=0.16)]
    table = overlap.table(records)
    lines = [line for line in table.splitlines() if line.startswith("| 2 nodes")]
    assert len(lines) == 2
    limited = lines[1].split(" | ")
    assert "1790mbit" in limited[1]
    assert "300" in lines[1]  # the link floor: 64 MiB at 1790 Mbit/s = 0.3 s, also T0
    assert "1.50x" in lines[1]  # pipelined / max(floor, T0): 0.45 / 0.3
    assert "0.80x" in lines[1] and "0.70x" in lines[1]  # over today's and mpi4py-fft's
    assert "94%" in lines[1]  # the exchange alone: 32 MiB in 0.16 s against 1790 Mbit/s
