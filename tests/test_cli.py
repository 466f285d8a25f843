"""`pencilfft check`, the main job: its table, its exit status, its options and their errors."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import pytest

from pencilfft._check import default_meshes, run_check
from pencilfft._cli import build_parser, main


def test_check_in_process_prints_once_and_passes(capsys):
    """Runs on the suite's 8 devices (in one process or under mpirun): only process 0 prints."""
    args = build_parser().parse_args(
        ["check", "--shape", "16x16x8", "--mesh", "4x2", "8", "--repeats", "1"])
    assert run_check(args) == 0
    out = capsys.readouterr().out
    if jax.process_index() == 0:
        assert "all checks passed" in out
        for mesh in ("4x2", "8 "):
            assert f"│ {mesh}" in out
        assert out.count("transposed") == 2 and out.count("natural") == 2
        assert "FAIL" not in out
    else:
        assert out == ""


def test_check_without_jaxdecomp_says_how_to_install_it(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "jaxdecomp", None)  # import jaxdecomp raises ImportError
    args = build_parser().parse_args(
        ["check", "--shape", "8", "--mesh", "2x4", "--layout", "transposed", "--repeats", "1"])
    assert run_check(args) == 0
    out = capsys.readouterr().out
    if jax.process_index() == 0:
        assert re.search(r"│ +n/a │", out) and "all checks passed" in out
        assert "pip install jaxdecomp packaging, or pip install -e '.[test]'" in out


@pytest.mark.single_process
def test_check_command_sets_up_devices_itself(tmp_path):
    """A fresh process with no XLA_FLAGS: `python -m pencilfft check` makes 8 CPU devices."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PENCILFFT_TEST_DEVICES")}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-m", "pencilfft", "check", "--shape", "16", "--repeats", "1",
         "--layout", "transposed"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 cpu devices" in proc.stdout
    for mesh in default_meshes(8):
        assert "x".join(map(str, mesh)) in proc.stdout
    assert "all checks passed" in proc.stdout


def test_default_meshes():
    assert default_meshes(8) == [(1, 8), (2, 4), (4, 2), (8, 1), (8,)]


def test_mesh_of_the_wrong_size_is_reported(capsys):
    args = build_parser().parse_args(["check", "--mesh", "3x2"])
    assert run_check(args) == 2
    if jax.process_index() == 0:
        assert "needs 6 devices" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["check", "--shape", "6x8"], "shape must be N or XxYxZ"),
    (["check", "--shape", "abc"], "shape must look like"),
    (["check", "--mesh", "2x2x2"], "mesh must have 1 or 2"),
    (["check", "--dtype", "float16"], "invalid choice"),
    ([], "required"),
])
def test_bad_options_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
