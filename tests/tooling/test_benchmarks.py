"""The FFT benchmark (benchmarks/fft.py: cases, variants, implementations, records, tables) on the
harness's command line (benchmarks/harness.py), and the plots (benchmarks/plot.py).

The end-to-end smoke test runs the CLI in a subprocess at 16^3 (single process only); one
in-process run also goes through the multi-process path when the suite runs under mpirun.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import pencilfft
from conftest import make_mesh, to_numpy

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/tooling/../..)
if str(ROOT) not in sys.path:  # `benchmarks` is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import fft as cli  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks import plot as bplot  # noqa: E402
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m benchmarks.<args>` from the repository root; fails the test on a non-zero exit."""
    env = dict(os.environ)
    # A child of an mpirun rank must not think it is a rank itself.
    for k in list(env):
        if k.startswith(("OMPI_", "PMI_", "PMIX_", "MPI_LOCAL", "HYDRA_")):
            del env[k]
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def check_record(r: dict) -> None:
    """Every field present; the numbers of a successful measurement positive and consistent."""
    missing = [k for k in cli.RECORD_FIELDS if k not in r]
    assert not missing, f"missing fields {missing}"
    assert r["status"] in ("ok", "skipped", "error", "wrong"), r["status"]
    assert r["schema"] == cli.SCHEMA
    assert r["direction"] in harness.DIRECTIONS and r["impl"] in cli.IMPLS
    assert r["n_points"] == math.prod(r["shape"])
    assert r["mesh_devices"] == math.prod(r["pdims"])
    for key in ("backend", "device_kind", "device_count", "process_count", "hostname", "cores"):
        assert key in r["machine"], key
    assert r["versions"]["jax"] == jax.__version__
    if r["status"] != "ok":
        assert r["note"], f"a {r['status']} record must say why"
        return
    for key in cli.POSITIVE_FIELDS:
        assert isinstance(r[key], (int, float)) and r[key] > 0, (key, r[key])
    assert r["min_s"] <= r["median_s"] <= r["max_s"]
    if r["machine"]["process_count"] == 1:  # the one-device baseline exists
        assert r["speedup_vs_fftn_1dev"] > 0
    else:
        assert r["speedup_vs_fftn_1dev"] is None
    assert len(r["times_s"]) == r["repeats"]
    assert r["lower_s"] is not None and 0 < r["lower_s"] <= r["compile_s"]
    assert r["gflops"] == pytest.approx(r["flops"] / r["median_s"] / 1e9)
    expected = cli.fft_flops(r["shape"], r["impl"] == "pencilfft-r2c")
    assert r["flops"] == pytest.approx(expected)
    if r["mem_bytes"] is not None:
        assert r["mem_bytes"] == r["mem_argument_bytes"] + r["mem_output_bytes"] + r["mem_temp_bytes"]
        assert r["mem_argument_bytes"] > 0 and r["mem_output_bytes"] > 0
    if r["max_rel_err"] is not None:
        assert r["max_rel_err"] < cli.CHECK_TOL[r["dtype"]]


# ---------------------------------------------------------------------------------------------
# Parsing and planning (no jax)
# ---------------------------------------------------------------------------------------------

def test_parse_shape_and_pdims():
    assert harness.parse_shape("16") == (16, 16, 16)
    assert harness.parse_shape("32x16x8") == (32, 16, 8)
    assert harness.parse_pdims("4x2") == (4, 2)
    assert harness.parse_pdims("8") == (8,)
    assert harness.parse_pdims("auto") == "auto"
    for bad in ("16x16", "0", "ax2", "-4"):
        with pytest.raises(Exception):
            harness.parse_shape(bad)
    for bad in ("2x2x2", "0x4", "x"):
        with pytest.raises(Exception):
            harness.parse_pdims(bad)


def test_square_pdims_is_most_square():
    for n in range(1, 300):
        p, q = harness.square_pdims(n)
        assert p * q == n and p <= q
        best = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        assert p == best, n


def test_flops_and_validation():
    assert cli.fft_flops((16, 16, 16), real=False) == pytest.approx(5 * 4096 * 12)
    assert cli.fft_flops((16, 16, 16), real=True) == pytest.approx(2.5 * 4096 * 12)
    assert harness.validate_case((16, 16, 16), (4, 2)) is None
    assert "X=10" in harness.validate_case((10, 16, 16), (4, 2))
    assert "Y=6" in harness.validate_case((16, 6, 16), (4, 4))
    assert harness.validate_case((16, 6, 16), (8,)) is None  # slabs: only X is split


def test_variant_ok_only_when_status_ok():
    """A variant the check marked "wrong" keeps its timings (`ran`) but is not `ok`."""
    states = {s: cli.Variant("pencilfft", "natural", status=s) for s in ("ok", "wrong", "error", "skipped")}
    assert [s for s, v in states.items() if v.ok] == ["ok"]
    assert [s for s, v in states.items() if v.ran] == ["ok", "wrong"]


def test_variant_plan_layouts():
    plan = cli.variant_plan(list(cli.IMPLS), ["transposed", "natural"])
    assert ("jaxdecomp", "transposed") in plan and ("jaxdecomp", "natural") not in plan
    assert ("pencilfft", "natural") in plan and ("pencilfft", "transposed") in plan
    assert plan.count(("fftn-1dev", "natural")) == 1  # layout-free: once per case
    only_nat = cli.variant_plan(["pencilfft", "jaxdecomp", "fftn-1dev"], ["natural"])
    assert only_nat == [("pencilfft", "natural"), ("fftn-1dev", "natural")]
    assert ("naive-pencil", "natural") in plan and ("naive-pencil", "transposed") not in plan


def test_every_implementation_has_a_builder():
    """The CLI offers IMPLS (table column order); IMPLEMENTATIONS builds each of them, and
    runs all but the opt-in pyFFTW baseline by default."""
    assert list(cli.IMPLEMENTATIONS) == list(cli.IMPLS)
    assert all(callable(b) for b in cli.IMPLEMENTATIONS.values())
    assert cli.DEFAULT_IMPLS == [i for i in cli.IMPLS if i != "pyfftw"]


def test_dry_run_prints_plan_and_rejects_bad_cases(capsys):
    assert cli.main(["--shapes", "16", "32x16x16", "--pdims", "4x2", "8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 case(s)" in out and "variant pencilfft [natural]" in out
    with pytest.raises(SystemExit, match="divisible"):
        cli.main(["--shapes", "12", "--pdims", "8", "--dry-run"])
    with pytest.raises(SystemExit, match="needs 16 devices"):
        cli.main(["--shapes", "16", "--pdims", "4x4", "--devices", "8", "--dry-run"])
    with pytest.raises(SystemExit, match="every implementation is skipped"):
        cli.main(["--impls", "pencilfft", "--skip", "pencilfft", "--dry-run"])
    with pytest.raises(SystemExit):
        cli.main(["--impls", "nonsense", "--dry-run"])


def test_help_lists_implementations():
    proc = run_cli("benchmarks.fft", "--help", timeout=60)
    for impl in cli.IMPLS:
        assert impl in proc.stdout
    assert "--repeats" in proc.stdout and "--devices" in proc.stdout
    assert "--outdir" in run_cli("benchmarks.plot", "--help", timeout=60).stdout


# ---------------------------------------------------------------------------------------------
# Tables and plots from synthetic records (no jax)
# ---------------------------------------------------------------------------------------------

def fake_record(impl, layout, direction, shape, pdims, n_devices, median, status="ok", note=""):
    r = {k: None for k in cli.RECORD_FIELDS}
    r.update(impl=impl, layout=layout, direction=direction, shape=list(shape), pdims=list(pdims),
             n_points=math.prod(shape), dtype="complex64", n_devices=n_devices,
             mesh_devices=math.prod(pdims), status=status, note=note)
    if status == "ok":
        r.update(median_s=median, min_s=median * 0.9, max_s=median * 1.1, compile_s=0.5, gflops=1.0)
    return r


def synthetic_records():
    recs = []
    for n, pd in ((1, (1, 1)), (2, (1, 2)), (4, (2, 2)), (8, (2, 4)), (8, (4, 2))):
        weak_shape = {1: (16, 16, 16), 2: (32, 16, 16), 4: (32, 32, 16), 8: (32, 32, 32)}[n]
        for d in harness.DIRECTIONS:
            for shape in {(32, 32, 32), weak_shape}:
                t = 1e-3 * math.prod(shape) / 4096 / n * (1 + 0.1 * n)
                recs.append(fake_record("pencilfft", "transposed", d, shape, pd, n, t))
                recs.append(fake_record("pencilfft", "natural", d, shape, pd, n, 1.1 * t))
                recs.append(fake_record("jaxdecomp", "transposed", d, shape, pd, n, 1.2 * t))
                recs.append(fake_record("fftn-1dev", "natural", d, shape, pd, 1, 2e-3))
                recs.append(fake_record("jaxdecomp-cudecomp", "transposed", d, shape, pd, n, None,
                                        "skipped", "needs a GPU"))
    return recs


def test_markdown_pivot_table():
    recs = [
        fake_record("pencilfft", "transposed", "forward", (16,) * 3, (4, 2), 8, 0.002),
        fake_record("pencilfft", "natural", "forward", (16,) * 3, (4, 2), 8, 0.003),
        fake_record("jaxdecomp", "transposed", "forward", (16,) * 3, (4, 2), 8, None, "error", "boom"),
        fake_record("fftn-1dev", "natural", "forward", (16,) * 3, (4, 2), 1, 0.004),
        fake_record("jaxdecomp-cudecomp", "transposed", "forward", (16,) * 3, (4, 2), 8, None,
                    "skipped", "needs a GPU"),
    ]
    recs[0]["speedup_vs_fftn_1dev"] = 2.0
    text = cli.markdown_table(recs)
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert lines[0] == "| grid | dtype | pdims | layout | dir | pencilfft | jaxdecomp | fftn-1dev |"
    rows = {ln.split(" | ")[3]: ln for ln in lines[2:]}
    assert set(rows) == {"transposed", "natural"}
    assert "| 2 (2.00x) | error | 4 |" in rows["transposed"]
    assert "| 3 | — | 4 |" in rows["natural"]  # baseline shown in both layout rows
    assert "Not available here: `jaxdecomp-cudecomp` (needs a GPU)" in text
    long = cli.markdown_table(recs, "long").splitlines()
    assert len(long) == 2 + len(recs) and long[0].startswith("| grid | dtype | pdims | impl |")


def test_table_cli(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in synthetic_records()) + "\n\n")
    assert cli.main(["table", str(path), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "| grid | dtype | pdims | layout | dir | pencilfft | jaxdecomp | fftn-1dev |" in out
    assert cli.main(["table", str(path), "--status", "ok"]) == 0
    assert "pencilfft" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(SystemExit, match="bad.jsonl:1"):
        cli.main(["table", str(bad)])


def test_plots_from_synthetic_records(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in synthetic_records()) + "\n")
    outdir = tmp_path / "plots"
    assert bplot.main([str(path), "--outdir", str(outdir)]) == 0
    written = {Path(p).name for p in capsys.readouterr().out.split()}
    expected = {
        "strong_32x32x32_complex64.png", "efficiency_32x32x32_complex64.png",
        "bars_32x32x32_complex64.png", f"weak_{16**3}ppd_complex64.png",
    }
    assert expected <= written, written
    for name in written:
        assert (outdir / name).read_bytes()[:8] == PNG_MAGIC
    # the fastest of the two 8-device meshes stands for 8 devices
    best = bplot.best_by_devices([r for r in synthetic_records() if r["direction"] == "forward"
                                  and r["status"] == "ok" and r["shape"] == [32, 32, 32]])
    assert best["pencilfft [transposed]"][8]["pdims"] in ([2, 4], [4, 2])
    assert set(best["jaxdecomp"]) == {1, 2, 4, 8} and set(best["fftn-1dev"]) == {1}


def test_every_series_has_a_colour_of_its_own():
    """Matplotlib's cycle has 10 colours: with 13 series two pairs shared one (issue 21)."""
    pytest.importorskip("matplotlib")
    labels = bplot.all_series()
    assert len(labels) >= 13
    assert len({bplot.series_color(label) for label in labels}) == len(labels)
    assert bplot.series_color("something-new") not in {bplot.series_color(x) for x in labels}


def _strong_figure(monkeypatch, records):
    """The strong-scaling time figure plot_strong makes of `records` (not saved)."""
    import matplotlib

    matplotlib.use("Agg")
    figs = {}
    monkeypatch.setattr(bplot, "_save", lambda fig, path: figs.setdefault(path.name, fig) and path)
    bplot.plot_strong(records, Path("."))
    (name,) = [n for n in figs if n.startswith("strong_")]
    return figs[name]


@pytest.mark.parametrize("counts", [(1, 2, 4, 8), (8,)], ids=["scaling", "one-count"])
def test_strong_plot_draws_the_ideal_it_announces(monkeypatch, counts):
    """The title said "(dashed: ideal)" where no dashed line could be drawn (issue 21)."""
    import matplotlib.pyplot as plt

    recs = [r for r in synthetic_records() if r["status"] == "ok" and r["shape"] == [32, 32, 32]
            and r["n_devices"] in counts]
    fig = _strong_figure(monkeypatch, recs)
    try:
        for ax in fig.axes:
            series = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
            dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--" and ln.get_xdata().size]
            colours = [ln.get_color() for ln in series]
            assert len(set(map(str, colours))) == len(series)  # no two series share a colour
            scaling = [ln for ln in series if ln.get_xdata().size > 1]
            if len(counts) > 1:
                assert "(dashed: ideal)" in ax.get_title()
                assert len(dashed) == len(scaling) > 0  # one ideal per series that scales
                assert {str(d.get_color()) for d in dashed} <= set(map(str, colours))
                legend = [t.get_text() for t in ax.get_legend().get_texts()] if ax.get_legend() else []
                assert not legend or "ideal t0·n0/n (dashed)" in legend
            else:
                assert "dashed" not in ax.get_title() and "no ideal" in ax.get_title()
                assert dashed == []
    finally:
        plt.close("all")


def test_plot_without_measurements_fails_clearly(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "r.jsonl"
    rec = fake_record("jaxdecomp-cudecomp", "transposed", "forward", (16,) * 3, (4, 2), 8, None,
                      "skipped", "needs a GPU")
    path.write_text(json.dumps(rec) + "\n")
    assert bplot.main([str(path), "--outdir", str(tmp_path / "p")]) == 1
    assert "no successful measurements" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Real runs
# ---------------------------------------------------------------------------------------------

def test_smoke_cli_run_then_table_and_plot(tmp_path):
    """The CLI end to end at 16^3: every variant on a pencil and a slab mesh, JSON, table, PNG."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("jaxdecomp")
    out = tmp_path / "results" / "smoke.jsonl"
    repeats = 2
    run_cli("benchmarks.fft", "--devices", "8", "--shapes", "16", "--pdims", "4x2", "8",
            "--repeats", str(repeats), "--warmup", "1", "--out", str(out), "--quiet", "--markdown")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for r in records:
        check_record(r)
    by = {(r["impl"], r["layout"], tuple(r["pdims"]), r["direction"]): r for r in records}
    plan = cli.variant_plan(cli.DEFAULT_IMPLS, list(harness.LAYOUTS))
    assert len(records) == len(by) == 2 * len(plan) * 2  # meshes x variants x directions
    assert all(r["repeats"] == repeats and r["machine"]["device_count"] == 8 for r in records)

    def status(impl, layout, pdims, d="forward"):
        r = by[(impl, layout, pdims, d)]
        return r["status"], r["note"]

    for pd in ((4, 2), (8,)):
        for d in harness.DIRECTIONS:
            assert status("fftn-1dev", "natural", pd, d)[0] == "ok"
            assert by[("fftn-1dev", "natural", pd, d)]["speedup_vs_fftn_1dev"] == pytest.approx(1.0)
            assert by[("fftn-1dev", "natural", pd, d)]["n_devices"] == 1
            assert status("fftn-sharded", "natural", pd, d)[0] == "ok"
            for lay in harness.LAYOUTS:
                assert status("pencilfft", lay, pd, d) == ("ok", "")
                if hasattr(pencilfft, "prfft3d"):
                    assert status("pencilfft-r2c", lay, pd, d) == ("ok", "")
            assert by[("pencilfft", "natural", pd, d)]["max_rel_err"] is not None
    assert status("jaxdecomp", "transposed", (4, 2)) == ("ok", "")
    assert status("jaxdecomp", "transposed", (8,))[0] == "skipped"
    assert status("naive-pencil", "natural", (4, 2)) == ("ok", "")
    assert status("naive-pencil", "natural", (8,))[0] == "skipped"  # needs a 2-axis mesh
    assert status("jaxdecomp-cudecomp", "transposed", (4, 2))[0] == "skipped"  # CPU machine
    assert by[("pencilfft-r2c", "transposed", (4, 2), "forward")]["input_dtype"] == "float32"

    plots = tmp_path / "plots"
    printed = run_cli("benchmarks.plot", str(out), "--outdir", str(plots), timeout=300).stdout.split()
    pngs = sorted(plots.glob("*.png"))
    assert {p.name for p in pngs} >= {"bars_16x16x16_complex64.png", "strong_16x16x16_complex64.png"}
    assert sorted(Path(p) for p in printed) == pngs
    for p in pngs:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 10_000

    table = run_cli("benchmarks.fft", "table", str(out), "--format", "markdown", timeout=60).stdout
    assert "| 16x16x16 | complex64 | 4x2 | transposed | forward |" in table


def test_in_process_run_complex128_inverse_only(tmp_path, capsys):
    """main() inside the test process: complex128, inverse only, a subset of implementations.

    Runs in every process under mpirun (collectively): then the one-device baseline is skipped,
    the per-repeat times are agreed over processes and only process 0 writes the file.
    """
    pytest.importorskip("jaxdecomp")
    out = tmp_path / "r.jsonl"
    argv = ["--shapes", "8x16x16", "--pdims", "2x4", "--dtypes", "complex128", "--directions",
            "inverse", "--repeats", "2", "--warmup", "0", "--out", str(out), "--quiet",
            "--impls", "pencilfft", "jaxdecomp", "fftn-1dev", "--layouts", "natural", "transposed"]
    assert cli.main(argv) == 0
    if jax.process_index() != 0:
        assert not out.exists()
        return
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["impl"], r["layout"]) for r in records} == {
        ("pencilfft", "natural"), ("pencilfft", "transposed"), ("jaxdecomp", "transposed"),
        ("fftn-1dev", "natural")}
    for r in records:
        check_record(r)
        assert r["direction"] == "inverse" and r["dtype"] == "complex128"
        assert r["machine"]["process_count"] == jax.process_count()
        assert r["command"].startswith("python -m benchmarks.fft --shapes 8x16x16")
    base = [r for r in records if r["impl"] == "fftn-1dev"][0]
    if jax.process_count() == 1:
        assert base["status"] == "ok"
        for r in records:
            assert r["status"] == "ok", r["note"]
            assert r["max_rel_err"] < 1e-10
    else:
        assert base["status"] == "skipped"
        assert all(r["status"] == "ok" for r in records if r["impl"] != "fftn-1dev")


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_in_process_naive_pencil_natural(tmp_path, axis_type):
    """The 'before' baseline next to pencilfft: right answer (forward vs numpy, round trip) on
    pencils both ways, both axis types, a non-default norm.  Collective under mpirun."""
    out = tmp_path / "r.jsonl"
    argv = ["--shapes", "16", "--pdims", "4x2", "2x4", "--dtypes", "complex128", "--norm", "ortho",
            "--axis-type", axis_type, "--repeats", "1", "--warmup", "0", "--out", str(out), "--quiet",
            "--impls", "naive-pencil", "pencilfft", "fftn-1dev", "--layouts", "natural"]
    assert cli.main(argv) == 0
    if jax.process_index() != 0:
        assert not out.exists()
        return
    records = [json.loads(line) for line in out.read_text().splitlines()]
    for r in records:
        check_record(r)  # needs the one-device baseline's speedups in one process
    records = [r for r in records if r["impl"] != "fftn-1dev"]
    assert {(r["impl"], r["layout"], tuple(r["pdims"]), r["direction"]) for r in records} == {
        (impl, "natural", pd, d) for impl in ("naive-pencil", "pencilfft") for pd in ((4, 2), (2, 4))
        for d in harness.DIRECTIONS}
    for r in records:
        assert r["status"] == "ok", (r["impl"], r["pdims"], r["note"])
        assert r["norm"] == "ortho" and r["axis_type"] == axis_type
        assert r["max_rel_err"] is not None and r["max_rel_err"] < 1e-10


def test_pyfftw_baseline(tmp_path):
    """FFTW's own 3-D plan beside the one-device fftn: the same answer, its MEASURE planning
    recorded as its compile time, one host "device", no XLA memory analysis; skipped under
    several processes (it needs the whole array in one)."""
    pytest.importorskip("pyfftw")
    out = tmp_path / "r.jsonl"
    argv = ["--shapes", "16", "--pdims", "4x2", "--dtypes", "complex128", "--repeats", "2",
            "--warmup", "1", "--out", str(out), "--quiet", "--impls", "pyfftw", "fftn-1dev"]
    assert cli.main(argv) == 0
    if jax.process_index() != 0:
        return
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["impl"], r["direction"]) for r in records) == [
        (i, d) for i in ("fftn-1dev", "pyfftw") for d in harness.DIRECTIONS]
    for r in records:
        check_record(r)
        if r["impl"] == "pyfftw" and jax.process_count() > 1:
            assert r["status"] == "skipped" and "one" in r["note"]
        elif r["impl"] == "pyfftw":
            assert r["status"] == "ok" and r["n_devices"] == 1 and r["max_rel_err"] < 1e-10
            assert r["mem_bytes"] is None and r["compile_s"] > 0


def test_naive_pencil_only_natural_and_skips_clearly():
    """Like jaxdecomp in the natural layout: not planned in the transposed one; meshes it cannot
    run on are recorded as skipped with the reason (no jax computation here)."""
    assert cli.variant_plan(["naive-pencil", "pencilfft"], ["transposed"]) == [("pencilfft", "transposed")]
    assert cli.variant_plan(["naive-pencil"], ["transposed"]) == []
    assert cli.variant_plan(["naive-pencil"], ["natural", "transposed"]) == [("naive-pencil", "natural")]
    assert list(cli.IMPLS).index("naive-pencil") == list(cli.IMPLS).index("pencilfft-r2c") + 1
    args = harness.parser(cli).parse_args(["--impls", "naive-pencil"])

    def build(shape, pdims, layout="natural"):
        runner = cli.CaseRunner(harness.Case(shape, "complex64", pdims), args, cli.IMPLEMENTATIONS)
        v = runner.build("naive-pencil", layout)
        return v.status, v.note

    assert build((16, 16, 16), (4, 2), "transposed") == ("skipped", "naive-pencil has only the natural layout")
    status, note = build((16, 16, 16), (8,))
    assert status == "skipped" and "2-axis mesh" in note
    status, note = build((16, 16, 6), (2, 4))  # Z split by y (4)
    assert status == "skipped" and "Z=6 by y (4)" in note
    status, note = build((16, 4, 16), (8, 1))  # Y split by x (8) after the first exchange
    assert status == "skipped" and "Y=4 by x (8)" in note


def test_make_input_is_blockwise_and_reproducible():
    """The same numbers whatever the process count; complex parts both random."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = make_mesh((4, 2))
    sh = NamedSharding(mesh, P("x", "y"))
    a = to_numpy(harness.make_input((8, 8, 4), sh, "complex64", seed=3))
    b = to_numpy(harness.make_input((8, 8, 4), sh, "complex64", seed=3))
    c = to_numpy(harness.make_input((8, 8, 4), sh, "complex64", seed=4))
    assert a.dtype == np.complex64 and a.shape == (8, 8, 4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.std(a.real) > 0.5 and np.std(a.imag) > 0.5
    r = to_numpy(harness.make_input((8, 8, 4), sh, "float64", seed=3))
    assert r.dtype == np.float64
