"""A plain install needs jax and numpy only; the extras' modules are imported where used, and
their absence is an ImportError that names the extra to install."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pencilfft
from pencilfft._processes import launch as _distributed

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


def test_pyproject_declares_a_floor_and_no_cap_on_jax():
    """pip is told the first tested jax as a floor and no cap (a cap would downgrade a newer jax,
    and refuse its CUDA plugin, beside pencilfft); jaxlib follows jax."""
    from pencilfft._jax_private import required_floor

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert required_floor() == "jax>=0.10.2"
    assert required_floor() in deps
    assert required_floor().replace("jax", "jaxlib", 1) in deps
    for req in deps:
        if _requirement_names([req]) & {"jax", "jaxlib"}:
            assert "<" not in req and "!=" not in req and "~=" not in req and "==" not in req, req


def _constraints() -> dict[str, tuple[str, str]]:
    """constraints.txt as {name: (version, marker)} (names lower-case, `_` as `-`)."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, marker = line.partition(";")
        name, sep, version = spec.partition("==")
        assert sep, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        pins[name.strip().lower().replace("_", "-")] = (version.strip(), marker.strip())
    return pins


def test_constraints_pin_the_tested_set():
    """constraints.txt pins every package the mpi and test extras name, exactly; its jax and
    jaxlib are the same tested release (`TESTED_JAX`)."""
    from pencilfft._jax_private import jax_support

    pins = _constraints()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = _requirement_names(extras["mpi"] + extras["test"] + extras["fftw"] + extras["cli"])
    wanted |= {"jax", "jaxlib", "numpy"}
    missing = {n.replace("_", "-") for n in wanted} - set(pins)
    assert not missing, f"constraints.txt does not pin {sorted(missing)}"
    assert pins["jax"][0] == pins["jaxlib"][0]
    assert jax_support(pins["jax"][0])[1], f"constraints.txt pins an untested jax {pins['jax']}"


def test_readme_shows_the_tested_set():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[mpi,test]" -c constraints.txt' in readme


def test_test_extra_installs_from_wheels_on_every_python():
    """jaxdecomp's wheels for Python 3.13 need jax>=0.11.1 and its jax-0.10 release has none
    there: the test extra leaves it out on 3.13 instead of building its sdist."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (jaxdecomp,) = [r for r in extras["test"] if r.startswith("jaxdecomp")]
    assert "python_version < '3.13'" in jaxdecomp.replace('"', "'")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    tested = {c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
              if c.startswith("Programming Language :: Python :: 3.")}
    assert tested == {"3.11", "3.12", "3.13"}
    assert project["requires-python"] == ">=3.11"


@pytest.mark.parametrize("version, warns", [("0.10.2", False), ("0.11.2", True),
                                             ("0.12.0", True), ("0.9.2", True),
                                             ("0.10.3.dev20261101", False)])
def test_a_jax_outside_the_tested_range_warns_once(version, warns, monkeypatch):
    import warnings

    from pencilfft._jax_private import NO_WARN, tested_range, warn_if_untested

    monkeypatch.delenv(NO_WARN, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_if_untested(version) == warns
    assert len(caught) == warns
    if warns:
        text = str(caught[0].message)
        assert f"jax {version} is outside" in text and tested_range() in text
        assert "issue tracker" in text and "pencilfft check" in text
        assert "PENCILFFT_NO_WARN_JAX_VERSION=1 silences" in text


@pytest.mark.parametrize("value, warns", [("1", False), ("yes", False), ("0", True), ("", True)])
def test_the_environment_variable_silences_the_warning(value, warns, monkeypatch):
    import warnings

    from pencilfft._jax_private import NO_WARN, warn_if_untested

    monkeypatch.setenv(NO_WARN, value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_if_untested("0.12.0") == warns
    assert len(caught) == warns


@pytest.mark.parametrize("silenced", [False, True])
def test_the_import_warns_on_an_untested_jax(silenced):
    """The warning comes with `import pencilfft` itself, once (a fresh process whose jax says
    0.12), naming the tested versions; PENCILFFT_NO_WARN_JAX_VERSION=1 silences it."""
    code = ("import jax, warnings; jax.__version__ = '0.12.0'; warnings.simplefilter('always'); "
            "import pencilfft")
    env = {"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    if silenced:
        env["PENCILFFT_NO_WARN_JAX_VERSION"] = "1"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    if silenced:
        assert "outside the releases" not in out.stderr, out.stderr
    else:
        assert out.stderr.count("jax 0.12.0 is outside the releases") == 1
        assert "(jax>=0.10.2,<0.11)" in out.stderr


def test_the_licence_file_is_the_one_pyproject_declares():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "pencilfft developers" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text


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
    assert "CI=1" in (ROOT / ".ci" / "run").read_text()


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
    from pencilfft._cli import check as _check, command as _cli

    for name in ("rich", "rich.console", "rich.table"):
        monkeypatch.setitem(sys.modules, name, None)
    args = _cli.build_parser().parse_args(["check"])
    with pytest.raises(ImportError, match=r"pencilfft\[cli\]"):
        _check.run_check(args)


def test_version():
    assert isinstance(pencilfft.__version__, str)
