"""The test suite's own rules: test files share references through helper modules only; a test
that runs too long fails alone, named, and the run goes on to its summary; the quick subset is
what conftest says; the Slurm step never installs anything on a machine that did not ask."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import QUICK_FILES, clean_env

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_test_file_imports_another():
    """Shared references live in helper modules (conftest.py, hlo_text.py,
    paint_references.py, ...), never in another test file: importing one runs its module-level
    code again and ties two files' tests together."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for module in _imported_modules(path):
            last = module.rsplit(".", 1)[-1]
            if last.startswith("test_") or module.startswith("tests.test_"):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offenders, offenders


SLOW_TESTS = '''
import signal, time

def test_before():
    pass

def test_sleeps():
    time.sleep(60)

def test_never_returns():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])  # as a C call that never returns
    time.sleep(60)

def test_after():
    pass
'''


def _pytest(tmp_path, *args, **env):
    (tmp_path / "test_timeouts.py").write_text(textwrap.dedent(SLOW_TESTS))
    environ = clean_env(1, PYTHONPATH=os.pathsep.join([str(TESTS / "mp"), str(ROOT)]), **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "pencilfft_mpi_plugin", "-p",
         "no:cacheprovider", "--noconftest", "-rf", *args, "test_timeouts.py"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=environ)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_test_past_its_timeout_fails_alone(tmp_path, workers):
    """PENCILFFT_TEST_TIMEOUT in one process and in pytest-xdist's workers: the slow test fails,
    named, the others pass and the summary is printed.  One that never comes back to Python is
    ended after the grace period: under xdist its worker is replaced and the run goes on."""
    if workers and not _has_xdist():
        pytest.skip("pytest-xdist is not installed")
    args = ["-n", str(workers)] if workers else ["-k", "not never_returns"]
    out = _pytest(tmp_path, *args, PENCILFFT_TEST_TIMEOUT="3", PENCILFFT_TEST_TIMEOUT_GRACE="2")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "test_timeouts.py::test_sleeps ran past 3 s (PENCILFFT_TEST_TIMEOUT)" in text
    assert "FAILED test_timeouts.py::test_sleeps" in text
    if workers:
        assert "FAILED test_timeouts.py::test_never_returns" in text
        assert "2 failed, 2 passed" in text, text
    else:
        assert "1 failed, 2 passed, 1 deselected" in text, text


def _has_xdist() -> bool:
    try:
        import xdist  # noqa: F401
    except ImportError:
        return False
    return True


def test_quick_subset_is_the_quick_files(tmp_path):
    """PENCILFFT_TEST_QUICK=1 (`bash tests/run.sh --quick`) collects the quick files and no
    other; README and docs/development.md say what it runs."""
    assert QUICK_FILES and all((TESTS / name).is_file() for name in QUICK_FILES)
    env = clean_env(8, PENCILFFT_TEST_QUICK="1", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--collect-only", str(TESTS)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    files = {line.split("::", 1)[0].rsplit("/", 1)[-1]
             for line in out.stdout.splitlines() if "::" in line}
    assert files == QUICK_FILES, files
    for doc in ("README.md", "docs/development.md"):
        assert "bash tests/run.sh --quick" in (ROOT / doc).read_text(), doc


def test_run_sh_stops_a_step_with_sigint_first():
    """A step past its limit gets SIGINT, so that pytest prints the summary of what ran, and a
    kill only later; every step's summary goes into the final table."""
    text = (TESTS / "run.sh").read_text()
    assert 'timeout -s INT -k "$GRACE"' in text
    assert "PENCILFFT_STEP_TIMEOUT" in (ROOT / "README.md").read_text()
    assert "PENCILFFT_STEP_TIMEOUT" in (ROOT / "docs" / "development.md").read_text()


# PATH: the multi-node step also needs /usr/sbin (ip, for the root check it makes first).
@pytest.mark.parametrize("step,asks,path", [
    ("slurm", "PENCILFFT_TEST_SLURM", "/usr/bin:/bin"),
    ("multinode", "PENCILFFT_TEST_MULTINODE", "/usr/sbin:/usr/bin:/sbin:/bin")])
def test_cluster_steps_never_install_unasked(tmp_path, step, asks, path):
    """Without CI or its own variable (PENCILFFT_TEST_SLURM=1, PENCILFFT_TEST_MULTINODE=1), the
    Slurm step and the multi-node step (issue 65) do not run apt-get: each says in one line why
    it skipped and how to run it (an apt-get stub first on PATH records any call)."""
    if shutil.which("slurmd"):
        pytest.skip("Slurm is installed here: the step would run for real")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "apt-get").write_text(f"#!/bin/sh\necho called >> {tmp_path}/apt-get.calls\nexit 1\n")
    (stub / "apt-get").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", asks)}
    env["PATH"] = f"{stub}:{path}"
    out = subprocess.run(["bash", str(TESTS / step / "run.sh")], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert not (tmp_path / "apt-get.calls").exists(), "apt-get ran unasked"
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"== {step}: skipped: "), out.stdout
    if os.geteuid() == 0:
        assert f"{asks}=1" in lines[0]
