"""The scripts of examples/ run, small, and check themselves against numpy (they exit 1 when a
result differs); the docs include them (tests/test_docs.py).  The mpirun script runs under
`mpirun -np 2` here, from the single-process step (these tests are not marked `mpirun`)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import clean_env

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=cwd)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{argv[:4]} still running after {timeout} s:\n{e.stdout}\n{e.stderr}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_poisson(tmp_path):
    out = _run([sys.executable, str(EXAMPLES / "poisson.py"), "--n", "16"], clean_env(8),
               tmp_path, 300)
    for name in ("c2c", "r2c", "dirichlet"):
        assert f"{name}: phi (16, 16, 16) sharded P('x', 'y', None), error vs numpy" in out, out


def test_lpt_power(tmp_path):
    out = _run([sys.executable, str(EXAMPLES / "lpt_power.py"), "--n", "16"], clean_env(8),
               tmp_path, 300)
    assert "psi against numpy:" in out and "measured / input" in out, out


def test_mpi_script_under_mpirun(tmp_path):
    """examples/mpi_fft.py as its docstring runs it: 2 processes of 4 simulated devices."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable} (the mpi extra)")
    out = _run([str(mpirun), "-np", "2", sys.executable, str(EXAMPLES / "mpi_fft.py"), "--n",
                "16", "--out", str(tmp_path)], clean_env(4), tmp_path, 180)
    assert out.count("2 processes, 8 devices, mesh (2, 4)") == 1, out
    assert (tmp_path / "spectrum.npy").exists()


def test_brick_pm(tmp_path):
    """examples/brick_pm.py: a PM force step on a (2, 2, 2) brick mesh, checked against the same
    step on pencils (issue 54)."""
    out = _run([sys.executable, str(EXAMPLES / "brick_pm.py"), "--n", "16"], clean_env(8),
               tmp_path, 300)
    assert "split P('a', 'b', 'c', None), forces (3, 16, 16, 16) split P(None, 'a', 'b', 'c')" \
        in out, out
    assert "on pencils" in out, out
