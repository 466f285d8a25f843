"""The slurm/ scripts on a real Slurm (issue 48): run by tests/slurm/run.sh once its one-node
cluster is up, as `python -m pytest --noconftest tests/slurm/jobs.py`.

Every job is submitted with sbatch from a folder outside the checkout, as slurm/README.md tells
a user, with only what a user sets changed: the account and QoS, the virtualenv
(PENCILFFT_VENV, this python's), the harness's arguments.  There is no `module` command here,
and nothing says where the checkout is: the scripts find both out.

* cpu.slurm with 2 tasks runs to the end: its JSON lines are written, with sane times, and
  the MPI exchange (pencilfft's custom call) ran;
* a 2-task step (tests/slurm/step.slurm, srun as cpu.slurm runs it) does a round trip that
  matches numpy, with the MPI exchange in its compiled program, and ends with sys.exit(0) on
  every task: a clean job;
* one task failing by an exception or by sys.exit(3) ends the job within 30 s;
* the GPU scripts' sbatch options are accepted: submit.sh with `sbatch --test-only` (a node
  that declares GPUs takes the job), sweep.sh for real, held, every job and the plot job's
  dependency on all of them, then cancelled.

Each wait has a time-out; the measured times go to $PENCILFFT_SLURM_DIR/timings.txt, which
run.sh prints.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    "PENCILFFT_SLURM_DIR" not in os.environ,
    reason="needs the Slurm cluster that tests/slurm/run.sh starts (run that script)")

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "slurm"
CLUSTER = Path(os.environ.get("PENCILFFT_SLURM_DIR", "/nonexistent"))
USER = Path(os.environ.get("PENCILFFT_SLURM_USER_DIR", "/nonexistent"))
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING"}
ENDED_WITHIN = 30  # seconds from a task's failure to the job's end (issue 48)


def _timing(line: str) -> None:
    with open(CLUSTER / "timings.txt", "a") as f:
        f.write(line + "\n")


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user on a login node: this one without launcher, pencilfft or
    module settings (the jobs inherit it: sbatch --export=ALL), plus what a user sets."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PENCILFFT_", "BASH_FUNC_module", "PMI_", "OMPI_"))
           and k not in ("XLA_FLAGS", "MODULEPATH", "LOADEDMODULES")}
    env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env.update(PENCILFFT_ACCOUNT="abc", PENCILFFT_QOS="dev")
    if sys.prefix != sys.base_prefix:  # the README's set-up: a virtualenv
        env["PENCILFFT_VENV"] = sys.prefix
    env.update(extra)
    return env


def run(*argv: str | Path, env: dict | None = None, timeout: float = 120,
        ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], cwd=USER, env=env or user_env(),
                          capture_output=True, text=True, timeout=timeout)
    if ok:
        assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def job_info(job: str) -> dict[str, str]:
    line = run("scontrol", "show", "job", "-o", job).stdout
    return dict(re.findall(r"(\w+)=(\S*)", line))


def wait_for_end(job: str, timeout: float) -> tuple[dict[str, str], float]:
    """The job's record once it has left the running states, and when that was seen
    (time.time()); fails after `timeout` s (the job is cancelled by run.sh's clean-up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = job_info(job)
        if info.get("JobState") not in ACTIVE:
            ended = time.time()
            while info.get("JobState") == "COMPLETING" and time.monotonic() < deadline:
                time.sleep(0.2)  # the node is free for the next job once this is done
                info = job_info(job)
            return info, ended
        time.sleep(0.2)
    pytest.fail(f"job {job} still {job_info(job).get('JobState')} after {timeout} s")


def submit(*argv: str | Path, env: dict | None = None) -> str:
    return run("sbatch", "--parsable", *argv, env=env).stdout.strip().split(";")[0]


def reports(text: str) -> list[dict]:
    """Every task's `REPORT <json>` line; a line cut by another task's output is left out (the
    tests then miss that task's rank and show the log)."""
    found = []
    for line in re.findall(r"^REPORT (\{.*\})$", text, re.M):
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return found


def _log(info: dict[str, str]) -> str:
    return Path(info["StdOut"]).read_text()


# ------------------------------------------------------------------------------------ CPU jobs


def test_cpu_slurm_runs_to_the_end():
    """Before: `slurm/common.sh: No such file or directory` from outside the checkout, then
    `module: command not found` (exit 127), and without an MPI plug-in each task alone."""
    out = USER / "cpu.jsonl"
    start = time.monotonic()
    job = submit("-A", "abc@cpu", "--qos=qos_cpu-dev", "--nodes=1", "--ntasks-per-node=2",
                 SLURM / "cpu.slurm", "--shapes", "32", "--out", out)
    info, _ = wait_for_end(job, timeout=600)
    _timing(f"cpu.slurm, 2 tasks, --shapes 32: {time.monotonic() - start:.0f} s from sbatch to "
            f"its end ({info.get('JobState')})")
    log = _log(info)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert Path(info["StdOut"]).parent == USER  # the log where the user submitted
    assert log.count("# modules: no `module` command") == 1, log
    assert "srun: --kill-on-bad-exit=1 --mpi=pmi2" in log
    assert "could not be built" not in log and "Traceback" not in log, log
    records = [json.loads(line) for line in out.read_text().splitlines()]
    rows = {r["row"] for r in records}
    # pencilfft/mpi asks for the MPI exchange: an error, not a row, where it cannot run.
    assert {"pencilfft/auto", "pencilfft/alltoall", "pencilfft/pairwise", "pencilfft/mpi",
            "exchange: pencilfft mpi", "exchange: MPI Alltoall", "local FFTs"} <= rows, rows
    for r in records:
        assert r["processes"] == 2 and r["pdims"] == [1, 2] and r["shape"] == [32, 32, 32], r
        assert math.isfinite(r["median_ms"]) and 0 < r["median_ms"] < 60_000, r
    # mpi4py-fft: its row, or a line in the log saying why it is missing.
    assert ("mpi4py-fft" in rows) != ("mpi4py-fft is not installed" in log), (rows, log)


def _step(*argv: str) -> tuple[str, dict[str, str], float]:
    """Submit tests/slurm/step.slurm (2 tasks, srun as cpu.slurm runs it) with ARGS; (log,
    record, when its end was seen)."""
    job = submit("-A", "abc@cpu", "--qos=qos_cpu-dev", "--ntasks=2",
                 f"--export=ALL,PENCILFFT_ROOT={ROOT}", ROOT / "tests" / "slurm" / "step.slurm",
                 *argv)
    info, ended = wait_for_end(job, timeout=300)
    return _log(info), info, ended


def test_round_trip_with_the_mpi_exchange_and_a_clean_exit():
    log, info, _ = _step("tests/slurm/roundtrip.py")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    got = sorted(reports(log), key=lambda r: r["rank"])
    assert [r["rank"] for r in got] == [0, 1], log
    for r in got:
        assert r["processes"] == 2 and r["mpi_exchange_in_program"], r
        assert r["exchange_status"].startswith("MPI inside XLA"), r
    assert got[0]["roundtrip_error"] < 1e-4 and got[0]["forward_error"] < 1e-5, got[0]
    assert "exits with status" not in log and "MPI_Abort" not in log, log  # sys.exit(0): clean


_CAUSE = "srun started 2 tasks in this job step (SLURM_STEP_NUM_TASKS=2) without an MPI plug-in"
_FIX = "start the step with `srun --mpi=pmi2` (or export SLURM_MPI_TYPE=pmi2 before srun)"
# Each task checks its own messages and reports only what lacks the cause or the fix: srun
# forwards a long line in pieces that can interleave with the other task's (a 2.6 KiB report
# of both messages was once cut in two, and its rank lost).
_NO_PLUGIN = """
import json, jax, numpy as np, pencilfft
from pencilfft._exchange import mpi as mpi_exchange
pencilfft.initialize(verbose=True)
texts = dict(status=mpi_exchange.status())
try:
    pencilfft.scatter(np.zeros((4, 4, 2)) if jax.process_index() == 0 else None,
                      jax.make_mesh((1, 2), ("x", "y")))
except ValueError as e:
    texts["scatter"] = str(e)
report = dict(rank=jax.process_index(), processes=jax.process_count(), said=sorted(texts),
              missing={k: v for k, v in texts.items() if not (CAUSE in v and FIX in v)})
print("REPORT " + json.dumps(report), flush=True)
""".replace("CAUSE", repr(_CAUSE)).replace("FIX", repr(_FIX))


def test_without_an_mpi_plugin_every_message_names_the_fix():
    """srun with the cluster's MpiDefault=none (PENCILFFT_SRUN_MPI=default): jax starts across
    the tasks from Slurm's variables, MPI cannot; the exchange's status (what `pencilfft check`
    prints), scatter and initialize(verbose=True) say so and name `srun --mpi=pmi2`."""
    job = submit("-A", "abc@cpu", "--ntasks=2",
                 f"--export=ALL,PENCILFFT_ROOT={ROOT},PENCILFFT_SRUN_MPI=default",
                 ROOT / "tests" / "slurm" / "step.slurm", "-c", _NO_PLUGIN)
    info, _ = wait_for_end(job, timeout=300)
    log = _log(info)
    assert info["JobState"] == "COMPLETED", log
    assert "srun: --kill-on-bad-exit=1\n" in log, log  # no --mpi: the cluster's MpiDefault
    got = sorted(reports(log), key=lambda r: r["rank"])
    assert [r["rank"] for r in got] == [0, 1], log
    for r in got:
        assert r["processes"] == 2, r
        assert r["said"] == ["scatter", "status"], r  # scatter refused
        assert r["missing"] == {}, r  # both messages name the cause and the fix
    assert log.count("pencilfft.initialize: " + _CAUSE) == 2, log


@pytest.mark.parametrize("how", ["exit-3", "raise"])
def test_a_failing_task_ends_the_job(how):
    """Before: sys.exit(3) on one task held the job for 300 s (jax's shutdown) even with
    --kill-on-bad-exit=1; an exception ended it in seconds."""
    log, info, ended = _step("tests/mp/reliability_child.py", "end", how)
    got = reports(log)
    assert sorted(r["rank"] for r in got if "caught" in r) == [0, 1], log
    (failing_at,) = [r["ending_at"] for r in got if "ending_at" in r]
    took = ended - failing_at
    _timing(f"one task of 2 fails by {how}: the job ended {took:.1f} s later "
            f"({info['JobState']}, exit code {info['ExitCode']})")
    assert took < ENDED_WITHIN, f"the job took {took:.0f} s to end after the failure"
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", info
    assert not any("unreachable" in r for r in got)
    if how == "exit-3":
        assert "pencilfft: process 1 of 2 exits with status 3 (sys.exit)" in log, log
        # The job's status is srun's, the highest of its tasks': 3, or 137 when rank 0 was
        # killed first (--kill-on-bad-exit); the failing task's own status is in the log.
        assert "task 1: Exited with exit code 3" in log, log
    else:
        assert "RuntimeError: boom on rank 1" in log
        assert "pencilfft: uncaught RuntimeError in process 1 of 2; aborting" in log, log


# ----------------------------------------------------------------------------------- GPU jobs


def _sbatch_wrapper(tmp_path: Path, option: str) -> dict[str, str]:
    """The user's environment with an `sbatch` first on PATH that adds `option` (--test-only,
    --hold): the scripts themselves are unchanged."""
    real = shutil.which("sbatch")
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} {option} "$@"\n')
    wrapper.chmod(0o755)
    return user_env(PATH=f"{wrapper.parent}:{os.environ['PATH']}")


PARTITIONS = {"v100": ("gpu_p13", "jzv001"), "a100": ("gpu_p5", "jza001"),
              "h100": ("gpu_p6", "jzh001")}


@pytest.mark.parametrize("arch", PARTITIONS)
def test_submit_sh_is_accepted_by_sbatch_test_only(arch, tmp_path):
    """One node of each GPU partition, as `slurm/<arch>.sh -- --shapes 512` submits it."""
    env = _sbatch_wrapper(tmp_path, "--test-only")
    proc = run(SLURM / f"{arch}.sh", "--results", USER / "results", "--", "--shapes", "64",
               env=env)
    partition, node = PARTITIONS[arch]
    assert re.search(rf"Job \d+ to start at \S+ using \d+ processors on nodes {node} in "
                     rf"partition {partition}", proc.stderr), proc.stderr
    # The check has teeth: a request no node can take is refused.
    bad = run("sbatch", "--test-only", "-C", arch, "--nodes=1", "--ntasks-per-node=9",
              "--gres=gpu:9", SLURM / "bench.slurm", ok=False)
    assert bad.returncode != 0, bad.stderr


@pytest.mark.parametrize("arch,max_gpus", [("a100", 256), ("v100", 8), ("h100", 8)])
def test_sweep_sh_is_accepted(arch, max_gpus, tmp_path):
    """Every job of the sweep (up to 32 A100 nodes: they wait on nodes that stay down) and the
    plot job, submitted for real and held, then cancelled."""
    env = _sbatch_wrapper(tmp_path, "--hold")
    results = USER / f"sweep-{arch}"
    proc = run(SLURM / "sweep.sh", arch, "--max-gpus", str(max_gpus), "--results", results,
               env=env)
    ids = re.findall(r"# submitted (?:strong|weak) n=\d+ \(\S+\): job (\d+)", proc.stderr)
    plot = proc.stdout.strip().splitlines()[-1].split(";")[0]
    try:
        counts = int(math.log2(max_gpus)) + 1
        assert len(ids) == 2 * counts, proc.stderr
        jobs = [job_info(j) for j in ids]
        assert all(j["JobState"] == "PENDING" and j["Reason"] == "JobHeldUser" for j in jobs)
        assert {j["JobName"] for j in jobs} == {
            f"pencilfft-{s}-{arch}-{2**k}gpu" for s in ("strong", "weak") for k in range(counts)}
        plot_job = job_info(plot)
        assert plot_job["JobName"] == f"pencilfft-plot-{arch}"
        assert sorted(re.findall(r"afterany:(\d+)", plot_job["Dependency"])) == sorted(ids)
    finally:
        run("scancel", *ids, plot, ok=False)
