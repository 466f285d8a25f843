"""A plain install needs jax and numpy only; the extras' modules are imported where used, and
their absence is an ImportError that names the extra to install."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pencilfft
from pencilfft import _distributed

ROOT = Path(__file__).resolve().parent.parent


def _requirement_names(reqs):
    import re

    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower() for r in reqs}


def test_plain_install_pulls_only_jax_and_numpy():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _requirement_names(project["dependencies"]) == {"jax", "jaxlib", "numpy"}
    extras = project["optional-dependencies"]
    assert _requirement_names(extras["mpi"]) == {"mpi4py", "mpich"}
    assert "rich" in _requirement_names(extras["cli"])


def test_mpi4py_fft_has_an_extra_that_nothing_else_pulls():
    """mpi4py-fft (the CPU comparison's reference row) builds against FFTW's headers: it has
    its own extra, and neither `bench` (the GPU jobs) nor `test` (the README's install on a
    machine without FFTW's headers) pulls it in."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert _requirement_names(extras["bench-cpu"]) == {"pencilfft", "mpi4py-fft"}
    assert "pencilfft[bench]" in extras["bench-cpu"]
    for name in ("bench", "test", "mpi"):
        assert "mpi4py-fft" not in _requirement_names(extras[name]), name


def test_readme_test_command_installs_the_mpi_extra():
    """tests/run.sh runs under mpirun: the README's (and CI's) command must install it."""
    readme = (ROOT / "README.md").read_text()
    command = 'pip install -e ".[mpi,test]" && bash tests/run.sh'
    assert command in readme
    assert command in (ROOT / ".ci" / "run").read_text()


def test_transforms_run_without_the_extras():
    """mpi4py, mpich and rich blocked from import: pencilfft imports and transforms."""
    code = (
        "import sys\n"
        "for m in ('mpi4py', 'rich'): sys.modules[m] = None  # import raises ImportError\n"
        "import jax, numpy as np, pencilfft\n"
        "x = np.arange(64.0).reshape(4, 4, 4)\n"
        "k = pencilfft.pfft3d(x)\n"
        "assert np.allclose(np.asarray(k), np.moveaxis(np.fft.fftn(x), 0, -1), atol=1e-3)\n"
        "pencilfft.initialize()  # no launcher: nothing to start, nothing to import\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_initialize_under_mpirun_without_mpi4py_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    env = {"OMPI_COMM_WORLD_SIZE": "2", "PMI_SIZE": "2"}
    with pytest.raises(ImportError, match=r"mpi4py cannot be imported.*pencilfft\[mpi\]"):
        _distributed._mpi_arguments(env, {})


def test_check_without_rich_names_the_extra(monkeypatch):
    from pencilfft import _check, _cli

    for name in ("rich", "rich.console", "rich.table"):
        monkeypatch.setitem(sys.modules, name, None)
    args = _cli.build_parser().parse_args(["check"])
    with pytest.raises(ImportError, match=r"pencilfft\[cli\]"):
        _check.run_check(args)


def test_version():
    assert isinstance(pencilfft.__version__, str)
