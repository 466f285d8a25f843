"""A plain install needs jax and numpy only; the extras' modules are imported where used, and
their absence is an ImportError that names the extra to install."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pencilfft
from pencilfft._processes import launchers

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


# The exact tested sets: CI's Python 3.11 run (the whole suite) and its Python 3.12 run (the
# newest jax: .ci/newest-jax).
CONSTRAINTS = {"constraints.txt": "3.11", "constraints-py312.txt": "3.12"}


def _constraints(name: str = "constraints.txt") -> dict[str, tuple[str, str]]:
    """A constraints file as {name: (version, marker)} (names lower-case, `_` as `-`)."""
    pins = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, _, marker = line.partition(";")
        package, sep, version = spec.partition("==")
        assert sep, f"{name}: {line!r} is not an exact pin (name==version)"
        pins[package.strip().lower().replace("_", "-")] = (version.strip(), marker.strip())
    return pins


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_constraints_pin_the_tested_set(name):
    """Each constraints file pins every package the mpi, fftw, test and cli extras name,
    exactly; its jax and jaxlib are the same tested release (`TESTED_JAX`), one whose programs
    tests/test_hlo.py has a recording of (nothing skips on it for its jax)."""
    import stablehlo_programs

    from pencilfft._jax_private import jax_support

    pins = _constraints(name)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = _requirement_names(extras["mpi"] + extras["test"] + extras["fftw"] + extras["cli"])
    wanted |= {"jax", "jaxlib", "numpy"}
    missing = {n.replace("_", "-") for n in wanted} - set(pins)
    assert not missing, f"{name} does not pin {sorted(missing)}"
    assert pins["jax"][0] == pins["jaxlib"][0]
    assert jax_support(pins["jax"][0])[1], f"{name} pins an untested jax {pins['jax']}"
    assert pins["jax"][0] in stablehlo_programs.recorded(), (
        f"{name} pins jax {pins['jax'][0]}, on which no StableHLO was recorded "
        f"(python tests/stablehlo_programs.py)")
    assert f"Python {CONSTRAINTS[name]}" in (ROOT / name).read_text().split("\n", 1)[0]


def test_readme_shows_the_tested_sets():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[mpi,fftw,test]" -c constraints.txt' in readme
    for name, python in CONSTRAINTS.items():
        assert f"`{name}` (Python {python})" in readme, name


def test_the_tested_range():
    """`TESTED_JAX` as pip writes it, and read back the same by pip's own rules (packaging)."""
    from packaging.specifiers import SpecifierSet

    from pencilfft._jax_private import jax_support, tested_range

    assert tested_range() == "jax>=0.10.2,!=0.11.*,<0.13"
    spec = SpecifierSet(tested_range().removeprefix("jax"))
    for version in ("0.10.1", "0.10.2", "0.10.9", "0.11.0", "0.11.2", "0.12.0", "0.12.0.1",
                    "0.12.3", "0.13.0", "1.0.0"):
        assert jax_support(version)[1] == (version in spec), version


def test_fftw_is_installed_only_where_asked_for():
    """FFTW (pyFFTW, GPL) is the fftw extra's alone: no other extra pulls it in, so
    `pip install -e ".[test]"` does not switch the FFTW kernel on; the README's test command
    asks for it, so CI still runs the FFTW tests."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert _requirement_names(extras["fftw"]) == {"pyfftw"}
    for name, reqs in extras.items():
        if name != "fftw":
            assert "pyfftw" not in _requirement_names(reqs), name
            assert not any("[fftw" in r or ",fftw" in r for r in reqs), name
    assert '".[mpi,fftw,test]"' in (ROOT / ".ci" / "run").read_text()


def test_newest_jax_run_takes_the_jax_pinning_files():
    """.ci/newest-jax (CI's Python 3.12 run, the newest jax) runs the quick subset and every
    test file that pins a jax behaviour: lowers for another platform, reads a compiled
    program's memory, jax's version, or private names of jax or of pencilfft."""
    import re

    from conftest import QUICK_FILES

    text = (ROOT / ".ci" / "newest-jax").read_text()
    listed = set(re.findall(r"\b(test_\w+\.py)\b", text.split("FILES=(", 1)[1].split(")", 1)[0]))
    pins = re.compile(r"lowering_platforms|memory_analysis\(|jax\.__version__|jax\._src|"
                      r"pencilfft\._jax_private")
    pinning = {p.name for p in (ROOT / "tests").glob("test_*.py") if pins.search(p.read_text())}
    assert listed == QUICK_FILES | pinning


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
                                             ("0.12.0.1", False), ("0.13.0", True),
                                             ("0.9.2", True), ("0.10.3.dev20261101", False)])
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
        assert warn_if_untested("0.13.0") == warns
    assert len(caught) == warns


@pytest.mark.parametrize("silenced", [False, True])
def test_the_import_warns_on_an_untested_jax(silenced):
    """The warning comes with `import pencilfft` itself, once (a fresh process whose jax says
    0.13), naming the tested versions; PENCILFFT_NO_WARN_JAX_VERSION=1 silences it."""
    code = ("import jax, warnings; jax.__version__ = '0.13.0'; warnings.simplefilter('always'); "
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
        assert out.stderr.count("jax 0.13.0 is outside the releases") == 1
        assert "(jax>=0.10.2,!=0.11.*,<0.13)" in out.stderr


def test_the_import_warns_nothing_on_this_jax():
    """On a tested jax (CI runs this on both), `import pencilfft` in a fresh process warns
    nothing, with Python's warnings all shown."""
    from pencilfft._jax_private import jax_support

    if not jax_support()[1]:
        pytest.skip(f"jax {jax_support()[0]} is not a tested release: the import warns, "
                    f"as it should")
    code = "import warnings; warnings.simplefilter('always'); import pencilfft"
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True,
                         text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0 and out.stderr == "", out.stderr


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
    """tests/run.sh runs under mpirun: the README's (and CI's) command must install it, and
    the fftw extra, so that the FFTW kernel's tests run."""
    readme = (ROOT / "README.md").read_text()
    command = ('python3 -m venv .venv && . .venv/bin/activate && '
               'pip install -e ".[mpi,fftw,test]" && bash tests/run.sh')
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
        launchers.mpi_arguments(env, {})


def test_check_without_rich_names_the_extra(monkeypatch):
    from pencilfft._cli import check as _check, command as _cli

    for name in ("rich", "rich.console", "rich.table"):
        monkeypatch.setitem(sys.modules, name, None)
    args = _cli.build_parser().parse_args(["check"])
    with pytest.raises(ImportError, match=r"pencilfft\[cli\]"):
        _check.run_check(args)


def test_version():
    assert isinstance(pencilfft.__version__, str)
