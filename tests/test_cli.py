"""`pencilfft check`, the main job: its table, its exit status, its options and their errors.

Every option the README and `--help` offer is run with a good value and refused, with a message
and exit status 2, with bad ones; a grid the mesh does not divide is checked like any other.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from conftest import MPIRUN, clean_env

from pencilfft._cli import check as _check
from pencilfft._transforms import kernel as _kernel
from pencilfft._cli.check import default_meshes, run_check
from pencilfft._cli.command import build_parser, main

README = Path(__file__).resolve().parents[1] / "README.md"
LEAD = jax.process_index() == 0  # only process 0 prints


def _check_args(*argv: str):
    return build_parser().parse_args(["check", *argv])


@MPIRUN  # the report is printed by the lead process only
def test_check_in_process_prints_once_and_passes(capsys):
    """Runs on the suite's 8 devices (in one process or under mpirun): only process 0 prints."""
    assert run_check(_check_args("--shape", "16x16x8", "--mesh", "4x2", "8", "--repeats", "1")) == 0
    out = capsys.readouterr().out
    if LEAD:
        assert "all checks passed" in out
        for mesh in ("4x2", "8 "):
            assert f"│ {mesh}" in out
        assert out.count("transposed") == 2 and out.count("natural") == 2
        assert "FAIL" not in out and "padded" not in out
        # which transport the exchanges across processes use, and why (none in one process;
        # MPI inside XLA under mpirun, several devices per process included)
        assert re.search(r"cross-process exchanges: (one process|MPI inside XLA)", out)
        assert f"local FFT kernel: {_kernel.kernel()} (" in out
        # the threads per FFT call and the allocator (issue 43)
        assert re.search(r"CPU threads: \d+ cores \(.*\) for \d+ CPU device\(s\): \d+ "
                         r"thread\(s\) per FFT call", out)
        assert "allocator: " in out
        assert re.search(r"exchanges between a process's devices: the local exchange", out)
    else:
        assert out == ""


@pytest.mark.parametrize("version, ok, says", [
    (None, True, "jax {version} (tested: jax>=0.10.2,!=0.11.*,<0.13)"),
    ("0.13.0", False, "jax 0.13.0 (NOT in the tested range jax>=0.10.2,!=0.11.*,<0.13: it may "
                      "work, or fail where the suite would have caught it; please report what "
                      "you see in the project's issue tracker"),
], ids=["tested", "untested"])
def test_header_says_whether_jax_is_in_the_tested_range(capsys, monkeypatch, version, ok, says):
    """The first thing to know when a check fails: is this jax one the suite has passed on."""
    # The tested case stands in for a tested jax (the suite also runs on newer ones).
    monkeypatch.setattr(_check, "jax_support", lambda: (version or jax.__version__, ok))
    args = _check_args("--shape", "8", "--mesh", "8", "--layout", "transposed", "--repeats", "1")
    assert run_check(args) == 0
    if LEAD:
        header = " ".join(capsys.readouterr().out.split("\n┏")[0].split())
        assert "8 cpu devices in 1 process(es), " + says.format(version=jax.__version__) in header


BAD_SETTINGS = [
    ("PENCILFFT_THREADS", "0", ["local FFT kernel", "CPU threads"], "must be a positive integer"),
    ("PENCILFFT_MALLOC", "bogus", ["allocator"], "must be one of pencilfft, glibc"),
    ("PENCILFFT_MEMORY_LIMIT", "lots", ["memory limit"], "must be a size in bytes per device"),
    ("PENCILFFT_FFT_KERNEL", "cuda", ["local FFT kernel"], "must be one of auto, fftw, xla"),
]


@pytest.mark.parametrize("name, value, lines, expected", [
    pytest.param(*BAD_SETTINGS[0], marks=MPIRUN),  # every process stops: none waits for another
    *BAD_SETTINGS[1:]], ids=[b[0] for b in BAD_SETTINGS])
def test_a_bad_setting_is_reported_on_its_line(capsys, monkeypatch, name, value, lines,
                                               expected):
    """Was a ValueError traceback (issue 51): each header line that reads the setting says
    "error: " and the reader's message, the rest of the header is printed, and the check stops
    with status 2 and one line, running no case (the user's transforms would raise too)."""
    monkeypatch.setenv(name, value)
    assert run_check(_check_args("--shape", "8", "--repeats", "1")) == 2
    if LEAD:
        out = capsys.readouterr().out.splitlines()
        for label in lines:
            (line,) = [line for line in out if line.startswith(f"{label}: ")]
            assert line.startswith(f"{label}: error: environment variable {name} {expected}")
            assert line.endswith(f"got {value!r}")
        assert any(line.startswith("exchanges between a process's devices: ") for line in out)
        assert out[-1] == ("pencilfft check: error: the setting above cannot apply; pencilfft's "
                           "transforms would raise the same error: no case was run")
        assert not any("┏" in line or "all checks passed" in line for line in out)


def test_a_bad_setting_in_a_fresh_process_is_no_traceback(tmp_path):
    """`pencilfft check` itself, as the user runs it: one line and status 2."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PENCILFFT_TEST_DEVICES")}
    env.update(JAX_PLATFORMS="cpu", PENCILFFT_THREADS="0")
    proc = subprocess.run([sys.executable, "-m", "pencilfft", "check", "--shape", "8"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "CPU threads: error: environment variable PENCILFFT_THREADS" in proc.stdout


def test_check_without_jaxdecomp_says_how_to_install_it(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "jaxdecomp", None)  # import jaxdecomp raises ImportError
    args = _check_args("--shape", "8", "--mesh", "2x4", "--layout", "transposed", "--repeats", "1")
    assert run_check(args) == 0
    out = capsys.readouterr().out
    if LEAD:
        assert re.search(r"│ +n/a │", out) and "all checks passed" in out
        assert "pip install jaxdecomp packaging, or pip install -e '.[test]'" in out


def test_grid_the_mesh_does_not_divide_is_checked(capsys):
    """Was an IndivisibleError traceback (issue 21): 4x2 pads Z 17 -> 18, 8x1 pads Y 12 -> 16."""
    args = _check_args("--shape", "16x12x17", "--mesh", "4x2", "8x1", "--repeats", "1")
    assert run_check(args) == 0
    out = capsys.readouterr().out
    if LEAD:
        assert out.count("ok (padded)") == 4, out  # both meshes, both layouts
        assert "4x2: Z 17->18; 8x1: Y 12->16" in out
        assert "all checks passed" in out and "FAIL" not in out


def test_wrong_padding_fails_the_check(capsys, monkeypatch):
    """The padded entries are compared too: a spectrum with garbage there is a failure."""
    real = _check.pfft3d

    def padding_not_zero(x, **kw):
        k = real(x, **kw)
        return k + 1.0 * (jax.numpy.abs(k) == 0)  # only the (zero) padding changes

    monkeypatch.setattr(_check, "pfft3d", padding_not_zero)
    args = _check_args("--shape", "16x12x17", "--mesh", "4x2", "--repeats", "1",
                       "--layout", "transposed")
    assert run_check(args) == 1
    if LEAD:
        out = capsys.readouterr().out
        assert "FAIL (> 1e-05)" in out and "1 case(s) failed" in out


@MPIRUN  # the ensemble's table too
def test_meshes_with_batch_axes_check_an_ensemble(capsys):
    """--mesh 2x4x1: the leading mesh axis splits an ensemble of fields (issue 19)."""
    args = _check_args("--shape", "16x16x8", "--mesh", "2x4x1", "2x2x2", "--repeats", "1")
    assert run_check(args) == 0
    if LEAD:  # only the lead process prints the table
        out = capsys.readouterr().out
        assert out.count(" ok") >= 4 and "2x4x1" in out and "2x2x2" in out


def test_nothing_checked_is_a_failure(capsys):
    """Was "all checks passed" and exit status 0 with every mesh skipped (issue 21)."""
    assert run_check(_check_args("--shape", "30", "--repeats", "1")) == 1
    out = capsys.readouterr().out
    if LEAD:
        assert out.count("skipped:") == len(default_meshes(8))  # one row each
        assert "nothing was checked" in out and "all checks passed" not in out


@pytest.mark.parametrize("argv,message", [
    (["--mesh", "3x2"], "mesh 3x2 needs 6 devices; there are 8"),
    (["--mesh", "4x2", "2x2x4"], "mesh 2x2x4 needs 16 devices; there are 8"),
])
def test_mesh_that_cannot_be_used_is_reported(argv, message, capsys):
    assert run_check(_check_args(*argv)) == 2
    if LEAD:
        assert message in capsys.readouterr().out


def test_grid_too_big_for_the_reference_is_refused(capsys, monkeypatch):
    """The reference gathers the grid onto every device: refused before XLA would abort."""
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "1MiB")
    assert run_check(_check_args("--shape", "64", "--repeats", "1")) == 2
    if LEAD:
        out = " ".join(capsys.readouterr().out.split())
        assert ("--shape 64x64x64 is too large for the check: its reference (jnp.fft.fftn on the "
                "sharded array) gathers the 2 MiB grid onto every device and needs about 8 MiB "
                "per device, but a device has about 1 MiB (PENCILFFT_MEMORY_LIMIT=1MiB)") in out


def test_run_check_refuses_zero_repeats():
    args = _check_args("--shape", "8")
    args.repeats = 0  # as a caller building the namespace by hand could
    with pytest.raises(ValueError, match=r"`repeats` must be at least 1; got 0"):
        run_check(args)


@pytest.mark.parametrize("repeats", [0, -3])
def test_median_time_refuses_no_repeats(repeats):
    """Was statistics.StatisticsError ("no median for empty data") from deep inside."""
    from pencilfft._measure import median_time

    with pytest.raises(ValueError, match=rf"`repeats` must be at least 1; got {repeats}"):
        median_time(lambda: 0, repeats=repeats)


def test_default_meshes():
    assert default_meshes(8) == [(1, 8), (2, 4), (4, 2), (8, 1), (8,)]


@pytest.mark.parametrize("argv,message", [
    (["--shape", "6x8"], "shape must be N or XxYxZ (3 sizes); got '6x8'"),
    (["--shape", "abc"], "shape must look like 64 or 64x32x16"),
    (["--shape", "30x0x2"], "shape must look like 64 or 64x32x16 (positive sizes"),
    (["--mesh", "4xa"], "mesh must look like 4x2 or 8 (positive sizes joined by 'x'); got '4xa'"),
    (["--mesh", "0x8"], "mesh must look like 4x2 or 8"),
    (["--devices", "-1"], "--devices must be an integer >= 1; got '-1'"),
    (["--devices", "0"], "--devices must be an integer >= 1; got '0'"),
    (["--devices", "two"], "--devices must be an integer >= 1; got 'two'"),
    (["--repeats", "0"], "--repeats must be an integer >= 1; got '0'"),
    (["--dtype", "float16"], "invalid choice"),
    (["--layout", "diagonal"], "invalid choice"),
])
def test_bad_options_exit_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["check", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2 and "required" in capsys.readouterr().err


def test_devices_against_xla_flags_is_refused(capsys):
    """This process's devices come from XLA_FLAGS (conftest): another --devices cannot apply
    (it was silently ignored)."""
    count = int(re.search(r"device_count=(\d+)", os.environ["XLA_FLAGS"]).group(1))
    assert main(["check", "--devices", str(count + 1), "--shape", "8"]) == 2
    if LEAD:
        assert (f"--devices {count + 1} cannot apply: XLA_FLAGS already sets "
                f"--xla_force_host_platform_device_count={count} (drop one of the two)"
                ) in capsys.readouterr().err


def test_devices_without_cpu_platform_is_refused(capsys, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS")  # conftest's (jax has read it already)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert main(["check", "--devices", "2"]) == 2
    if LEAD:
        assert "JAX_PLATFORMS=cuda selects no CPU" in capsys.readouterr().err


def test_devices_on_gpus_is_refused(capsys, monkeypatch):
    """On GPUs (simulated: jax says so) --devices cannot apply."""
    count = re.search(r"device_count=(\d+)", os.environ["XLA_FLAGS"]).group(1)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert main(["check", "--devices", count, "--shape", "8"]) == 2
    if LEAD:
        assert "this run uses gpu devices; leave --devices out" in capsys.readouterr().err


# A line of XLA's (absl's) log: `W1201 23:42:47.044197    6910 fft_handler.cc:363] ...`.
XLA_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.\-]+:\d+\]", re.M)


def test_check_command_sets_up_devices_itself(tmp_path):
    """A fresh process with no XLA_FLAGS: `python -m pencilfft check` makes 8 CPU devices, and
    prints nothing a user must learn to ignore: no line of XLA's log (on jax 0.12 its
    `jnp.fft.fftn` reference on the sharded array made XLA log "[SPMD] Falling back to
    replicated execution for tiled FFT operation" once per mesh: the reference now gathers
    first), no warning (the environment's PENCILFFT_NO_WARN_JAX_VERSION aside)."""
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
    output = proc.stdout + proc.stderr
    assert not XLA_LOG_LINE.findall(output), output
    assert "Falling back" not in output and "Warning" not in output, output


def test_the_log_line_reader():
    line = ("W1201 23:42:47.044197    6910 fft_handler.cc:363] [SPMD] Falling back to replicated "
            "execution for tiled FFT operation fft.2")
    assert XLA_LOG_LINE.findall(f"pencilfft check: grid\n{line}\nall checks passed")
    assert not XLA_LOG_LINE.findall("│ 4x2  │ transposed │ 2.0e-07 │\nall checks passed")


def test_the_docs_sample_is_what_check_prints(capsys):
    """docs/getting-started.md's sample output has the lines `pencilfft check` prints: its
    first line's form, the table's title, the note under it, the last line; and no log line."""
    doc = (README.parent / "docs" / "getting-started.md").read_text()
    sample = doc.split("## What `pencilfft check` printed, and why", 1)[1]
    sample = sample.split("```text\n", 1)[1].split("```", 1)[0]
    from pencilfft._jax_private import tested_range

    args = _check_args("--shape", "8", "--mesh", "4x2", "--layout", "transposed", "--repeats", "1")
    assert run_check(args) == 0
    if not LEAD:
        return
    out = capsys.readouterr().out
    assert not XLA_LOG_LINE.findall(sample)
    assert f"(tested: {tested_range()})" in sample.splitlines()[0]
    head = [re.sub(r"grid \S+ ", "grid G ", text.splitlines()[0]).split(", jax ")[0]
            for text in (sample, out)]
    assert head[0] == head[1]
    for line in ("pfft3d / pifft3d vs jnp.fft.fftn", "all checks passed"):
        assert line in sample and line in out
    # the note, as one line (rich wraps it to the terminal's width), whatever --repeats
    note = [re.sub(r"median of \d+", "median of N", " ".join(text.split("errors: ", 1)[1].split(
        "all checks passed")[0].split())) for text in (sample, out)]
    assert note[0] == note[1]


def test_devices_option_in_a_fresh_process(tmp_path):
    """The issue's first line, an IndivisibleError traceback: --devices 6 and a grid the 3x2
    mesh pads in k space (Y 32 -> 33)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PENCILFFT_TEST_DEVICES")}
    env["JAX_PLATFORMS"] = "cpu"
    argv = [sys.executable, "-m", "pencilfft", "check", "--devices", "6", "--shape", "30x32x18",
            "--mesh", "3x2", "--repeats", "1", "--layout", "transposed"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 cpu devices" in proc.stdout and "3x2: Y 32->33" in proc.stdout


def test_check_under_mpirun_prints_once_without_gloo_chatter(tmp_path):
    """--devices is per process under mpirun (2 x 4 = 8 devices); the report is printed once,
    and gloo's "[Gloo] Rank r is connected to n peer ranks" lines are gone (issue 21: tens of
    them per run)."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    env = clean_env(4)
    del env["XLA_FLAGS"]  # --devices sets the count
    argv = [str(mpirun), "-np", "2", sys.executable, "-m", "pencilfft", "check", "--devices", "4",
            "--shape", "8", "--mesh", "4x2", "--repeats", "1", "--layout", "transposed"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("all checks passed") == 1
    assert "8 cpu devices in 2 process(es)" in proc.stdout
    assert "[Gloo]" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("how", ["XLA_FLAGS", "jax_num_cpu_devices"])
def test_readme_says_how_to_get_8_cpu_devices(how, tmp_path):
    """The README's examples need 8 devices; both ways it gives work with this jax."""
    text = " ".join(README.read_text().split())
    setting = {"XLA_FLAGS": "XLA_FLAGS=--xla_force_host_platform_device_count=8",
               "jax_num_cpu_devices": 'jax.config.update("jax_num_cpu_devices", 8)'}[how]
    assert setting in text
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PENCILFFT_TEST_DEVICES")}
    env["JAX_PLATFORMS"] = "cpu"
    code = "import jax\n"
    if how == "XLA_FLAGS":
        env["XLA_FLAGS"] = setting.split("=", 1)[1]
    else:
        code += setting + "\n"
    code += "print(len(jax.devices()), jax.make_mesh((4, 2), ('x', 'y')).size)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert proc.stdout.split() == ["8", "8"], proc.stdout + proc.stderr
