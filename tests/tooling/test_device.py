"""benchmarks/device.py, the prepared run for a lent GPU machine, in its --quick form here: every
part at tiny sizes, the GPU part saying "no GPU" on a CPU-only machine; its records make the
tables RESULTS.md will show; and the one device command is the one RESULTS.md names."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import device, gpu, harness, results  # noqa: E402

COMMAND = "python3 -m benchmarks.device --wheels .whl --jaxpm .carry/JaxPM --out $OUT"


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> Path:
    if not (Path(sys.executable).parent / "mpirun").exists() and not shutil.which("mpirun"):
        pytest.skip("no mpirun: the threads part runs one layout under it")
    out = tmp_path_factory.mktemp("device")
    env = {**clean_env(1), "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)  # each layout sets its own device count
    proc = subprocess.run([sys.executable, "-m", "benchmarks.device", "--quick", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_quick_writes_every_part(quick):
    names = {p.name for p in quick.iterdir()}
    assert {"device.log", "suite.log", "threads.jsonl"} <= names
    assert len(names) <= 8  # what the device tool brings back
    log = (quick / "device.log").read_text()
    assert "exit 0" in log and "passed" in (quick / "suite.log").read_text()
    if device.gpu_present() is None:
        assert "no GPU: the GPU part skipped" in log and "gpu.jsonl" not in names
    assert f"{len(os.sched_getaffinity(0))} cores" in log


def test_quick_thread_layouts_are_measured_and_tabulated(quick):
    records = harness.load_records([quick / "threads.jsonl"])
    by = {(r["tag"], r["impl"], tuple(r["pdims"]), r["direction"]): r for r in records}
    layouts = {"threads 1x1x1", "threads 1x1x2", "threads 1x2x1", "threads 2x1x1"}
    assert {k[0] for k in by} == layouts
    for lay in ("threads 1x1x1", "threads 1x1x2"):  # one device: the two baselines beside it
        for impl in ("pencilfft", "fftn-1dev", "pyfftw"):
            r = by[(lay, impl, (1, 1), "forward")]
            assert r["status"] == "ok" and r["max_rel_err"] < 1e-4, r
            assert r["machine"]["cores"] == int(lay[-1])  # pinned to its cores
    mpi = [r for r in records if r["tag"] == "threads 2x1x1"]
    assert mpi and all(r["machine"]["process_count"] == 2 and r["status"] == "ok" for r in mpi)
    table = results.render("threads16", [str(quick / "threads.jsonl")], Path("/"))
    assert "| 16x16x16 | 1x1x2 | 1x1 |" in table and "| 16x16x16 | 2x1x1 | 2x1 |" in table


def test_gpu_comparison_runs_on_a_cpu_when_asked(tmp_path):
    """benchmarks.gpu's timing path at 8^3 on the CPU (`--cpu`; its checks: tests/test_gpu.py)."""
    out = tmp_path / "gpu.jsonl"
    assert harness.main(gpu, ["--cpu", "--shapes", "8", "--repeats", "1", "--warmup", "0",
                     "--impls", "jnp.fft", "pencilfft", "--out", str(out)]) == 0
    records = harness.load_records([out])
    assert {(r["dtype"], r["impl"]) for r in records} == {
        (d, i) for d in ("complex64", "float32") for i in ("jnp.fft", "pencilfft")}
    for r in records:
        assert r["status"] == "ok" and r["roundtrip_rel_err"] < 1e-5, r
        assert r["forward_ms"] > 0 and r["memory_fwd_inv"]["temp_bytes"] >= 0
    assert "| 8 | complex64 | pencilfft |" in gpu.gpu_table(records)


def test_the_device_command_is_documented():
    """RESULTS.md and the script name the same command, short enough for the device tool."""
    assert COMMAND in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert COMMAND in device.__doc__ and len(f"PYTHONUNBUFFERED=1 {COMMAND}") < 2000
