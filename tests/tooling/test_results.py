"""Every measured table in benchmarks/RESULTS.md is what `benchmarks.results` makes from committed
data (a table pasted by hand, or data changed without its table, fails), and RESULTS.md has no
other tables than the descriptive ones listed here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import harness, mpi, results

ROOT = Path(__file__).resolve().parents[2]
RESULTS = (ROOT / "benchmarks" / "RESULTS.md").read_text()
BLOCKS = results.blocks(RESULTS)
# Tables that describe rather than measure (their header line).
DESCRIPTIVE = {
    "| name | what runs |",  # the implementations
    "| idea | result |",  # what was tried
}


def test_results_has_every_kind_of_table_from_committed_data():
    """Every kind has a table, but those awaiting a lent machine, which say so instead."""
    assert {kind for kind, _, _ in BLOCKS} | set(results.PENDING) == set(results.TABLES)
    for kind, command in results.PENDING.items():
        assert kind not in {k for k, _, _ in BLOCKS}, f"{kind} has data: drop it from PENDING"
        assert re.search(rf"not yet measured: run `{re.escape(command)}[^`]*`", RESULTS, re.I), kind
    assert {p for _, paths, _ in BLOCKS for p in paths} >= {
        "benchmarks/data/mpi-np2.jsonl", "benchmarks/data/ci-cpu8.jsonl",
        "benchmarks/data/ci-cpu8-mpi2.jsonl", "benchmarks/data/steps-256.jsonl",
        "benchmarks/data/memory-256.jsonl", "benchmarks/data/pm.jsonl"}


@pytest.mark.parametrize("kind,paths,body", BLOCKS, ids=[f"{k}:{p[0]}" for k, p, _ in BLOCKS])
def test_table_is_regenerated_from_its_data(kind, paths, body):
    for path in paths:
        assert (ROOT / path).is_file(), f"{path} is named in RESULTS.md but not committed"
    assert body.strip() == results.render(kind, paths), (
        f"the {kind} table of {paths} differs from its data: python -m benchmarks.results")


def test_no_table_outside_the_generated_blocks():
    """A pasted table (as the lost 8-device, steps, memory and PM ones were) fails here."""
    outside = results.BLOCK.sub("", RESULTS)
    headers = [lines[0] for lines in re.findall(r"((?:^\|.*\n)+)", outside, re.M)
               for lines in [lines.splitlines()]]
    assert headers and set(headers) <= DESCRIPTIVE, set(headers) - DESCRIPTIVE


def test_regenerate_replaces_a_stale_table(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"row": "mpi4py-fft", "shape": [8, 8, 8], "pdims": [2, 1], '
                    '"median_ms": 2.0}\n')
    text = f"x\n<!-- table: mpi {data} -->\n| pasted |\n<!-- end table -->\ny\n"
    new = results.regenerate(text, root=Path("/"))
    assert new == (f"x\n<!-- table: mpi {data} -->\n|  | 8^3, 2x1 |\n|---|---:|\n"
                   "| mpi4py-fft | 2 |\n<!-- end table -->\ny\n")
    assert results.regenerate(new, root=Path("/")) == new


def test_results_cli_check(tmp_path, capsys):
    path = tmp_path / "RESULTS.md"
    path.write_text(RESULTS)
    assert results.main(["--check", "--file", str(path)]) == 0
    path.write_text(RESULTS.replace("<!-- end table -->", "| stale |\n<!-- end table -->", 1))
    assert results.main(["--check", "--file", str(path)]) == 1
    assert "stale: " in capsys.readouterr().out
    assert results.main(["--file", str(path)]) == 0  # rewrites it
    assert path.read_text() == RESULTS


@pytest.mark.parametrize("kind,paths", [("nope", ["a"]), ("fft-processes", ["a"])])
def test_render_refuses_unknown_kinds_and_wrong_files(kind, paths):
    with pytest.raises(ValueError, match=r"unknown table kind|takes 2 data file"):
        results.render(kind, paths)


def test_table_marks_the_ratio_to_mpi4py_fft():
    rows = [dict(row=r, shape=[8, 8, 8], pdims=[2, 1], median_ms=ms)
            for r, ms in (("pencilfft/auto", 3.0), ("mpi4py-fft", 2.0), ("local FFTs", 1.0))]
    text = mpi.table(rows)
    assert "| pencilfft/auto | 3 (1.50x) |" in text
    assert "| local FFTs | 1 |" in text
    assert "pencilfft/pairwise" not in text  # rows without data are left out


def test_steady_table_splits_the_calls_right_after_jnp_fft():
    """The interleaved rows say what the calls right after jnp.fft took apart from the others
    (jnp.fft's unmapping runs into the next call): medians of 30 and 10 ms here."""
    from benchmarks import steady

    base = dict(tool="steady-calls", shape=[8, 8, 8], affinity=2, calls=4, loop="interleaved",
                machine={"loadavg_1m": 0.5}, faults=[0, 0, 0, 0])
    rows = [dict(base, variant="pencilfft", times_s=[0.03, 0.01, 0.03, 0.01],
                 after=["jnp.fft", "fftw", "jnp.fft", "fftw"]),
            dict(base, variant="fftw", times_s=[0.01] * 4)]  # before the split: no column
    lines = steady.steady_table(rows).splitlines()
    assert "| interleaved | pencilfft | 20 | 30 / 10 | 30 (1.50x) |" in lines[2]
    assert "| interleaved | fftw | 10 |  | 10 (1.00x) |" in lines[3]


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
