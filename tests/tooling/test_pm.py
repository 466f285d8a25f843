"""The particle-mesh pipeline of benchmarks/pm.py on 8 devices against the same pipeline on one
device (float64, 16^3, 2 steps: every particle moves, many cross block edges), its command line,
and its Jean Zay job script (slurm/pm.slurm, dry run).
"""
from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import make_mesh, put_global, random_field, rel_err, to_numpy

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/tooling/../..)
if str(ROOT) not in sys.path:  # `benchmarks` is not installed: import it from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import harness, pm  # noqa: E402

SHAPE = (16, 16, 16)
STEPS = 2
TOL = 1e-12  # float64; the distributed and one-device runs differ only in FFT summation order


@pytest.fixture(scope="module")
def noise():
    return random_field(SHAPE, np.float64, seed=40)


@pytest.fixture(scope="module")
def reference(noise):
    dx, rho = pm.simulate(jnp.asarray(noise), pm.Grid(SHAPE), pm.one_device_ops(SHAPE), steps=STEPS)
    return np.asarray(dx), np.asarray(rho)


def test_reference_moves_particles_across_cells(reference):
    dx, rho = reference
    assert 0.5 < np.abs(dx).max() < 2  # crosses cells, stays within the default halo (2)
    assert abs(rho.sum() - math.prod(SHAPE)) <= 1e-9 * math.prod(SHAPE)  # CIC conserves mass


# Pencils, and a mesh axis of size 1 on either side (the halo tests cover every mesh).
CASES = [((4, 2), "r2c"), ((1, 8), "r2c"), ((8, 1), "compat")]


@pytest.mark.parametrize("pdims,path", CASES,
                         ids=[f"{'x'.join(map(str, p))}-{k}" for p, k in CASES])
def test_matches_one_device(pdims, path, noise, reference):
    """jit on an Auto mesh with no mesh in scope (JaxPM's call): prfft3d/pirfft3d, or jaxdecomp's
    names from pencilfft.compat (pfft3d/pifft3d/fftfreq3d/halo_exchange)."""
    mesh = make_mesh(pdims, "auto")
    ops = pm.pencilfft_r2c_ops(SHAPE) if path == "r2c" else pm.ops_from_module(pencilfft.compat)
    x = put_global(noise, pencilfft.real_space_sharding(mesh))
    dx, rho = pm.simulate(x, pm.Grid(SHAPE, mesh), ops, steps=STEPS)
    assert dx.sharding.is_equivalent_to(NamedSharding(mesh, P(*mesh.axis_names)), 4)
    assert rel_err(to_numpy(dx), reference[0]) <= TOL
    assert rel_err(to_numpy(rho), reference[1]) <= TOL


@pytest.mark.parametrize("halo", [True, False], ids=["exchange", "no-exchange"])
def test_painting_needs_the_halo_exchange(halo, reference):
    """CIC painting of the reference's final particles: exact with the exchanges, and the
    comparisons above can fail: without them the cells on block edges lose mass."""
    import dataclasses

    dx, rho = reference
    mesh = make_mesh((4, 2), "auto")
    ops = pm.pencilfft_r2c_ops(SHAPE)
    if not halo:
        ops = dataclasses.replace(ops, halo=lambda x, extents, periods: x)
    got = jax.jit(lambda d: pm.paint(d, pm.Grid(SHAPE, mesh), ops))(
        put_global(dx, NamedSharding(mesh, P("x", "y"))))
    err = rel_err(to_numpy(got), rho)
    assert err <= TOL if halo else err > 0.1


def test_command_line(tmp_path, capsys):
    """In-process (so it also runs under mpirun): one mesh, two implementations, float32."""
    out = tmp_path / "pm.jsonl"
    args = ["--shapes", "16", "--pdims", "4x2", "--impls", "pencilfft", "1dev", "--steps", "2",
            "--repeats", "2", "--warmup", "0", "--out", str(out), "--quiet"]
    assert harness.main(pm, args) == 0
    if jax.process_index() != 0:
        return  # process 0 writes the records
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["impl"] for r in records] == ["pencilfft", "1dev"]
    for r in records:
        assert r["status"] == "ok", r["note"]
        assert r["step_median_s"] > 0 and r["lpt_median_s"] > 0 and r["mem_bytes"] > 0
        assert len(r["steps_times_s"]) == 2 and r["steps"] == 2 and r["dtype"] == "float32"
        assert r["command"].startswith("python -m benchmarks.pm --shapes 16")
        assert 0.5 < r["max_displacement"] < 2
    assert records[0]["max_rel_err_dx"] <= pm.CHECK_TOL["float32"]
    assert records[0]["max_rel_err_density"] <= pm.CHECK_TOL["float32"]
    assert records[0]["pdims"] == [4, 2] and records[1]["pdims"] == [1]
    capsys.readouterr()
    assert harness.main(pm, ["table", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| 16x16x16 | float32 | 4x2 | pencilfft |" in table and "| 1dev |" in table


def test_dry_run_and_bad_arguments(capsys):
    assert harness.main(pm, ["--shapes", "64", "128", "--pdims", "4x2", "8", "--devices", "8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 case(s)" in out and "64x64x64 float32 pdims 8" in out
    for bad in (["--steps", "0"], ["--halo", "0"], ["--skip", *pm.IMPLS]):
        with pytest.raises(SystemExit):
            harness.main(pm, bad + ["--dry-run"])
    with pytest.raises(SystemExit, match="divisible"):
        harness.main(pm, ["--shapes", "30", "--pdims", "4x2", "--dry-run"])


@pytest.mark.skipif(not Path("/bin/bash").exists(), reason="needs bash")
def test_slurm_job_script_dry_run():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PENCILFFT_"))}
    env.update(PENCILFFT_DRY_RUN="1", SLURM_NTASKS="16", SLURM_JOB_NUM_NODES="2",
               SLURM_JOB_CONSTRAINTS="h100", PENCILFFT_ROOT=str(ROOT))
    proc = subprocess.run(["bash", str(ROOT / "slurm" / "pm.slurm"), "--steps", "10"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["module purge", "module load arch/h100"]
    srun = shlex.split(lines[-1])
    args = srun[srun.index("benchmarks.pm") + 1:]
    assert srun[0] == "srun" and srun[srun.index("python"):srun.index("benchmarks.pm") + 1] == [
        "python", "-m", "benchmarks.pm"]
    assert args[:2] == ["--steps", "10"] and args[args.index("--pdims") + 1] == "4x4"
    assert args[args.index("--out") + 1].endswith("results/jeanzay/pm-h100-16gpu.jsonl")
    assert harness.main(pm, [*args, "--devices", "16", "--dry-run"]) == 0
    warn = subprocess.run(["bash", str(ROOT / "slurm" / "pm.slurm"), "--pdims", "2x2"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "uses 4 GPUs but the job has 16 tasks" in warn.stderr
