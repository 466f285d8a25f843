"""The comparisons steps, memory, batch, margin, power and kinds of benchmarks/, run in process on
small grids through the harness's command line.

Single process only: the one-device reference of steps.py needs the whole array on one device,
and both tools refuse to run under several processes.
"""
from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import rel_err, tol

import pencilfft

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/tooling/../..)
if str(ROOT) not in sys.path:  # `benchmarks` is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import batch, harness, margin, memory, power, steps

PENCIL_PREFIXES = ["FFT Z", "+ exchange over y", "+ FFT Y", "+ exchange over x", "+ FFT X"]
SLAB_PREFIXES = ["FFT Y,Z (2-D)", "+ exchange over x", "+ FFT X"]


def expected_programs(pdims: tuple[int, ...]) -> list[str]:
    """Every row steps.py prints for a mesh, in order."""
    names = ("x", "y")[: len(pdims)]
    slab = len(pdims) == 1 or pdims[1] == 1
    bare = [f"bare {alg} over {name}" for name, n in zip(names, pdims) if n > 1
            for alg in ("all_to_all", "pairwise")]
    return (["fftn-1dev", "pfft3d"] + (SLAB_PREFIXES if slab else PENCIL_PREFIXES)
            + ["3 local FFTs"] + bare + ["local copy"])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_steps_cli_rows_and_floor(tmp_path, capsys):
    out = tmp_path / "steps.jsonl"
    argv = ["--shape", "16", "--pdims", "4x2", "8x1", "--repeats", "2", "--warmup", "1",
            "--exchange", "alltoall", "--out", str(out)]
    assert harness.main(steps, argv) == 0
    printed = capsys.readouterr().out
    records = read_jsonl(out)
    for pdims in ((4, 2), (8, 1)):
        rows = [r for r in records if tuple(r["pdims"]) == pdims]
        assert [r["program"] for r in rows] == expected_programs(pdims)
        for r in rows:
            assert r["median_s"] > 0 and len(r["times_s"]) == 2, r
            assert r["ratio_to_fftn_1dev"] == pytest.approx(r["median_s"] / rows[0]["median_s"])
            assert r["exchanges"] == {n: "alltoall" for n, p in zip("xy", pdims) if p > 1}
            assert (r["step_s"] is not None) == (r["kind"] == "prefix")
        prefixes = [r for r in rows if r["kind"] == "prefix"]
        # The step costs add up to the last prefix, the whole pipeline.
        assert sum(r["step_s"] for r in prefixes) == pytest.approx(prefixes[-1]["median_s"])
    lines = printed.splitlines()
    assert "| program | 4x2 all_to_all | 8x1 all_to_all |" in lines
    for label, _ in steps.STEP_ROWS:  # one row per step, a cell per case
        assert sum(line.startswith(f"| {label} |") for line in lines) == 1, label
    floor = next(line for line in lines if line.startswith("| floor: 3 local FFTs + bare exchanges |"))
    assert floor.count(" (") == 2  # each case's floor, with its ratio to one-device fftn


def test_step_within_its_noise_is_reported_as_noise():
    """Two noisy medians can give a negative step cost (issue 21): it is printed as noise."""
    ms = 1e-3
    programs = [steps.Program("fftn-1dev", "reference", None, None, times=[10 * ms] * 3),
                steps.Program("FFT Z", "prefix", None, None, times=[4 * ms, 5 * ms, 6 * ms]),
                steps.Program("+ exchange over y", "prefix", None, None,
                              times=[4.5 * ms, 4.8 * ms, 5.2 * ms]),  # median 0.2 ms below
                steps.Program("+ FFT Y", "prefix", None, None, times=[9 * ms, 9 * ms, 9 * ms])]

    class Plan:
        axes, pdims, exchanges = ("x", "y"), (4, 2), ("alltoall", "alltoall")

    context = {"timestamp": "t", "machine": {}, "versions": {}, "command": "c"}
    records = steps.case_records(programs, Plan, (8, 8, 8), (4, 2), "complex64", context)
    by = {r["program"]: r for r in records}
    assert by["+ exchange over y"]["step_s"] == pytest.approx(-0.2 * ms)
    assert by["+ exchange over y"]["step_noise_s"] == pytest.approx(1.3 * ms)  # 1 + 0.3
    assert steps.step_cell(by["+ exchange over y"]) == "noise (±1.3)"
    assert steps.step_cell(by["+ FFT Y"]) == "4.2"  # 9 - 4.8, over its noise of 0.3
    assert steps.step_cell(by["FFT Z"]) == "5"
    floors = [dict(by["FFT Z"], program=name, kind="floor", step_s=None)
              for name in ("3 local FFTs", "bare all_to_all over x", "bare all_to_all over y")]
    table = steps.steps_table(records + floors)
    assert "| + exchange over y | 4.8 (step noise (±1.3)) |" in table
    assert "| + FFT Y | 9 (step 4.2) |" in table and "| FFT Z (slab: 2-D FFT over Y, Z) | 5 |" in table


@pytest.mark.parametrize("pdims,exchange,shape", [
    ((4, 2), "alltoall", (16, 8, 16)), ((2, 4), "pairwise", (16, 8, 16)),
    ((8, 1), "auto", (16, 8, 16)), ((8,), "pairwise", (16, 8, 16)),
    ((4, 2), "alltoall", (8, 6, 12)),  # Y padded to 8 in k-space
    ((1, 8), "auto", (16, 8, 16)),  # a slab over Y: its last step is the 2-D FFT and the move
], ids=["4x2-alltoall", "2x4-pairwise", "8x1-auto", "8-pairwise", "4x2-padded", "1x8-auto"])
def test_last_prefix_is_the_transform(pdims, exchange, shape):
    """The last prefix program computes pfft3d (transposed layout), and both bare exchanges of
    an axis move the same chunks."""
    programs, plan = steps.build_programs(shape, pdims, "complex128", exchange, seed=1)
    by = {p.name: p for p in programs}
    if exchange != "auto":
        assert plan.exchanges == (exchange, exchange)
    last = [p for p in programs if p.kind == "prefix"][-1]
    assert last.name == ("+ FFT X,Y (2-D)" if pdims[0] == 1 else "+ FFT X")
    x = last.arg
    got = np.asarray(jax.jit(last.fn)(x))
    want = np.asarray(pencilfft.pfft3d(x, exchange=exchange))
    assert got.shape == want.shape == plan.k_shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    ref = np.fft.fftn(np.asarray(x)).transpose(1, 2, 0)  # (Y, Z, X)
    assert rel_err(got[: shape[1]], ref) < tol(np.complex128)
    axis = "x" if pdims[0] > 1 else "y"
    a2a, pairwise = (np.asarray(jax.jit(by[f"bare {alg} over {axis}"].fn)(x))
                     for alg in ("all_to_all", "pairwise"))
    np.testing.assert_array_equal(a2a, pairwise)


def test_memory_cli_every_combination(tmp_path, capsys):
    """Every layout, transform, direction and donation on one mesh (the memory per mesh is
    tests/test_memory_floor.py's), with the mesh column of the table."""
    out = tmp_path / "memory.jsonl"
    argv = ["--shape", "16", "--pdims", "4x2", "--exchange", "alltoall", "--out", str(out)]
    assert harness.main(memory, argv) == 0
    printed = capsys.readouterr().out
    records = read_jsonl(out)
    keys = [(tuple(r["pdims"]), r["layout"], r["transform"], r["direction"], r["donate"])
            for r in records]
    combos = itertools.product([(4, 2)], ["transposed", "natural"], ["c2c", "r2c"],
                               ["forward", "inverse"], [False, True])
    assert sorted(keys) == sorted(combos)
    by = dict(zip(keys, records))
    for key, r in by.items():
        assert r["arg_blocks"] == 1.0, r  # the argument is exactly one local input block
        assert r["out_bytes"] > 0 and r["temp_bytes"] >= 0
        assert r["peak_bytes"] == r["arg_bytes"] + r["out_bytes"] + r["temp_bytes"] - r["alias_bytes"]
        if r["donate"]:
            plain = by[key[:-1] + (False,)]
            assert r["peak_bytes"] <= plain["peak_bytes"], (key, r["peak_bytes"], plain["peak_bytes"])
        else:
            assert r["alias_bytes"] == 0
    # The c2c forward's output has the input's size and sharding: donation lets XLA reuse it.
    assert by[((4, 2), "transposed", "c2c", "forward", True)]["alias_blocks"] == 1.0
    rows = [line for line in printed.splitlines() if "| 4x2 |" in line]
    assert len(rows) == 4 and all(row.count("|") == 8 for row in rows)  # (transform, layout) x 4


def test_batch_benchmark_runs_every_implementation(tmp_path, capsys):
    """benchmarks.batch: pencilfft (vmap and 4-D) beside jaxdecomp's vmap on a (c, x, y) mesh."""
    pytest.importorskip("jaxdecomp")
    out = tmp_path / "batch.jsonl"
    assert harness.main(batch, ["--fields", "2", "--shape", "8", "--meshes", "2x2x2", "--repeats", "1",
                       "--out", str(out)]) == 0
    records = harness.load_records([out])
    assert [r["impl"] for r in records] == list(batch.IMPLS)
    for r in records:
        if r["impl"] == "jaxdecomp-vmap" and "must implement `batch`" in r["status"]:
            continue  # jaxdecomp 0.3.2-0.3.4 (jax 0.11+) has no batching rule: the row says so
        assert r["status"] == "ok" and r["err"] < 1e-5 and not r["all_gather"], r
        assert r["memory"]["total"] > 0
    table = batch.table(records)
    assert table.splitlines()[2].startswith("| 2x2x2 |") and "2 fields of 8x8x8" in table
    with pytest.raises(SystemExit):
        harness.main(batch, ["--meshes", "4x2"])
    assert "3 positive sizes (c, x, y)" in capsys.readouterr().err


def test_margin_benchmark_times_the_users_form(tmp_path, capsys):
    """benchmarks.margin: the jit round trip on an Auto mesh beside one device (and jaxdecomp
    where installed), the floor counting one exchange for a mesh with a size-1 axis."""
    out = tmp_path / "margin.jsonl"
    assert harness.main(margin, ["--shapes", "8", "--meshes", "1x8", "4x2", "--repeats", "1",
                        "--label", "t", "--out", str(out)]) == 0
    records = harness.load_records([out])
    by = {(tuple(r["pdims"]), r["program"]): r for r in records}
    for pdims, n in (((1, 8), 1), ((4, 2), 2)):
        r = by[(pdims, "pencilfft")]
        assert r["status"] == "ok" and r["err"] < 1e-5 and not r["all_gather"], r
        assert r["exchanges"] == n and by[(pdims, "local copy")]["median_s"] > 0
        case = {p: x for (m, p), x in by.items() if m == pdims}
        want = case["6 local FFTs"]["median_s"] + 6 * n * case["local copy"]["median_s"]
        assert margin.floor_seconds(case) == pytest.approx(want)
    table = margin.table(records)
    assert "| 8x8x8 | 1x8 | t |" in table and "| 8x8x8 | 4x2 | t |" in table
    with pytest.raises(SystemExit):
        harness.main(margin, ["--meshes", "8"])
    assert "2 positive sizes" in capsys.readouterr().err


def test_power_benchmark_runs_beside_one_device(tmp_path):
    """benchmarks.power at 16^3: pencilfft's power spectrum (mesh known and left to the
    partitioner) beside one-device fftn + bincount, equal to it, with no all-gather (JaxPM's
    row needs its source: absent here)."""
    out = tmp_path / "power.jsonl"
    assert harness.main(power, ["--shape", "16", "--meshes", "4x2", "--repeats", "1", "--warmup", "0",
                       "--out", str(out)]) == 0
    records = harness.load_records([out])
    assert [r["program"] for r in records] == ["pencilfft", "pencilfft-jit", "fftn-1dev"]
    for r in records:
        assert r["status"] == "ok" and r["median_s"] > 0 and r["mem_bytes"] > 0, r
        assert r["max_rel_err_vs_1dev"] < 1e-5 and not r["all_gather"], r
    assert "| 16x16x16 | 4x2 | pencilfft | " in power.table(records)


def test_kinds_benchmark_times_every_kind_beside_scipy(tmp_path):
    """benchmarks.kinds (issue 20), one process: each kind forward and round trip on scipy (one
    core), one device and a mesh, checked against scipy; its tables render (the mpirun product
    is not run here: a synthetic record set checks its table)."""
    from benchmarks import kinds

    out = tmp_path / "kinds.jsonl"
    assert harness.main(kinds, ["--shape", "16", "--meshes", "4x2", "--repeats", "1", "--warmup", "0",
                       "--out", str(out)]) == 0
    records = read_jsonl(out)
    assert sorted((r["where"], r["kinds"], r["direction"]) for r in records) == sorted(
        (w, k, d) for w in (kinds.SCIPY, kinds.ONE_DEVICE, "4x2") for k in kinds.KINDS
        for d in kinds.DIRECTIONS)
    for r in records:
        assert r["status"] == "ok" and r["median_s"] > 0 and r["err"] < 1e-5, r
        assert "loadavg_1m" in r["machine"] and r["dtype"] == "float32"
    text = kinds.table(records)
    assert text.count("| 16x16x16 | float32 |") == 6  # 2 directions x 3 places
    assert "| 16x16x16 | float32 | forward | 4x2 |" in text
    product = [dict(row=row, shape=[8] * 3, dtype="float32", status="ok", median_s=s,
                    bytes_per_process=2**20, processes=2, pdims=[2, 1], rounds=1, repeats=1,
                    machine={"loadavg_1m": 1.0}, vs_mpi4py_fft=0.5, vs_mpi4py_fft_no_z_nyquist=1e-7,
                    vs_mpi4py_fft_no_nyquist=1e-7)
               for row, s in (("pencilfft 3/2", 0.002), ("mpi4py-fft 3/2", 0.003))]
    text = kinds.dealias_table(product)
    assert "| 8x8x8 | float32 | mpi4py-fft 3/2 | 3 (1.50) | 1 |" in text


def test_heapmap_walks_the_heap_after_round_trips():
    """benchmarks.heapmap: the round trips run and the walk reaches the heap's top chunk.  In a
    fresh process, as it is run: walking this worker's heap, grown by the suite, took 30 s."""
    import platform
    import subprocess

    from conftest import clean_env
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's chunk layout only")
    done = subprocess.run([sys.executable, "-m", "benchmarks.heapmap", "--shapes", "16",
                           "--calls", "2", "--interleaved"], cwd=ROOT, env=clean_env(1),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith("glibc 2.") and "heap grew in rounds:" in out
    assert re.search(r"\n +[0-9.]+ MiB  (in use|free|top) +\d+ B", out), out
    assert "\nwalk ended at " in out
