"""The Jean Zay scripts in slurm/: syntax, sbatch options, and the harness arguments they pass.

Nothing is submitted: the scripts' --dry-run prints the sbatch commands, which are parsed here
and checked against the partition facts below (written independently of slurm/common.sh), and
every harness argument list is fed to `python -m benchmarks.fft ... --dry-run`.
"""
from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the checkout (tests/tooling/../..)
SLURM = ROOT / "slurm"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import fft as cli  # noqa: E402
from benchmarks import harness  # noqa: E402

# IDRIS facts: GPUs per node, CPUs per task (cores / GPUs), constraint, arch module, QoS prefix.
PARTITIONS = {
    "v100": dict(gpus=4, cpus=10, constraint="v100-32g", module=None, qos="qos_gpu"),
    "a100": dict(gpus=8, cpus=8, constraint="a100", module="arch/a100", qos="qos_gpu_a100"),
    "h100": dict(gpus=4, cpus=24, constraint="h100", module="arch/h100", qos="qos_gpu_h100"),
}
SCRIPTS = sorted([*SLURM.glob("*.sh"), *SLURM.glob("*.slurm")])

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def sh(*args: str | Path, env: dict | None = None, ok: bool = True,
       cwd: Path = ROOT) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PENCILFFT_"))}
    full_env.update({"PENCILFFT_ACCOUNT": "abc", **(env or {})})
    full_env = {k: v for k, v in full_env.items() if v is not None}  # None: unset it
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=120)
    if ok:
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def sbatch_lines(text: str) -> list[list[str]]:
    return [shlex.split(line) for line in text.splitlines() if line.startswith("sbatch ")]


def parse_sbatch(words: list[str]) -> tuple[dict[str, str], str, list[str]]:
    """(options, job script, script arguments) of one `sbatch ...` command."""
    assert words[0] == "sbatch"
    opts: dict[str, str] = {}
    i = 1
    while words[i].startswith("-"):
        if words[i] == "-C":
            opts["constraint"] = words[i + 1]
            i += 2
            continue
        key, _, value = words[i].lstrip("-").partition("=")
        opts[key] = value
        i += 1
    return opts, words[i], words[i + 1:]


def pdims_products(args: list[str]) -> list[int]:
    """Products of the --pdims values of a harness argument list."""
    i = args.index("--pdims")
    out = []
    for a in args[i + 1:]:
        if a.startswith("--"):
            break
        out.append(math.prod(int(p) for p in a.split("x")))
    return out


def check_job(words: list[str], arch: str, gpus: int | None = None, qos: str = "t3") -> dict:
    """One benchmark job: partition options, one task per GPU, pdims matching the GPUs."""
    opts, script, args = parse_sbatch(words)
    part = PARTITIONS[arch]
    nodes, tpn = int(opts["nodes"]), int(opts["ntasks-per-node"])
    assert opts["gres"] == f"gpu:{tpn}"  # one task per GPU
    assert tpn <= part["gpus"]
    assert nodes == 1 or tpn == part["gpus"]  # several nodes: whole nodes only
    assert opts["cpus-per-task"] == str(part["cpus"])
    assert opts["hint"] == "nomultithread"
    assert opts["constraint"] == part["constraint"]
    assert opts["account"] == f"abc@{arch}"
    assert opts["qos"] == f"{part['qos']}-{qos}"
    assert "time" in opts and "job-name" in opts and "output" in opts
    assert f"PENCILFFT_ARCH={arch}" in opts["export"]
    total = nodes * tpn
    if gpus is not None:
        assert total == gpus
    assert Path(script) == SLURM / "bench.slurm"
    assert all(p == total for p in pdims_products(args)), (args, total)
    # The harness accepts the arguments (parsing and case validation, no jax).
    assert cli.main([*args, "--dry-run"]) == 0
    return {"nodes": nodes, "gpus": total, "args": args, "opts": opts}


def harness_arg(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script):
    sh("bash", "-n", script)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_hard_coded_account_or_qos(script):
    for line in script.read_text().splitlines():
        if line.startswith("#SBATCH"):
            assert "--account" not in line and "-A " not in line and "--qos" not in line, line
    if script.suffix == ".slurm":
        assert "#SBATCH --hint=nomultithread" in script.read_text()


def test_scripts_are_executable():
    for script in SCRIPTS:
        if script.name != "common.sh":
            assert os.access(script, os.X_OK), script


@pytest.mark.parametrize("arch", PARTITIONS)
def test_submit_single_and_multi_node(arch, capsys):
    gpn = PARTITIONS[arch]["gpus"]
    for extra, gpus in (([], gpn), (["--gpus", "1"], 1), (["--gpus", str(gpn // 2)], gpn // 2),
                        (["--nodes", "2"], 2 * gpn), (["--gpus", str(4 * gpn)], 4 * gpn)):
        out = sh(SLURM / "submit.sh", arch, *extra, "--dry-run").stdout
        (words,) = sbatch_lines(out)
        job = check_job(words, arch, gpus)
        assert job["nodes"] == max(1, gpus // gpn)
        assert harness_arg(job["args"], "--pdims") == "x".join(map(str, harness.square_pdims(gpus)))
    # harness arguments after --, the wrapper, QoS and account forms
    out = sh(SLURM / f"{arch}.sh", "--nodes", "2", "--qos", "dev", "--dry-run", "--",
             "--shapes", "256", "512", "--pdims", f"{gpn}x2", "--repeats", "3").stdout
    (words,) = sbatch_lines(out)
    job = check_job(words, arch, 2 * gpn, qos="dev")
    assert job["args"][:6] == ["--shapes", "256", "512", "--pdims", f"{gpn}x2", "--repeats"]
    out = sh(SLURM / "submit.sh", arch, "--qos", "qos_custom", "--dry-run",
             env={"PENCILFFT_ACCOUNT": "xyz@cpu"}).stdout
    opts, _, _ = parse_sbatch(sbatch_lines(out)[0])
    assert opts["qos"] == "qos_custom" and opts["account"] == "xyz@cpu"
    capsys.readouterr()


def test_submit_errors():
    cases = [
        (["a100", "--gpus", "12", "--dry-run"], {}, "not a whole number"),
        (["a300", "--dry-run"], {}, "unknown architecture"),
        (["v100", "--qos", "t9", "--dry-run"], {}, "QoS"),
        (["v100", "--bogus"], {}, "unknown option"),
        (["v100"], {"PENCILFFT_ACCOUNT": ""}, "PENCILFFT_ACCOUNT"),  # no account: nothing submitted
    ]
    for args, env, msg in cases:
        proc = sh(SLURM / "submit.sh", *args, env=env, ok=False)
        assert proc.returncode != 0 and msg in proc.stderr, (args, proc.stderr)
        assert "sbatch" not in proc.stdout


@pytest.mark.parametrize("script", ["submit.sh", "sweep.sh"])
@pytest.mark.parametrize("args", [[], ["-h"], ["--help"], ["h100", "--help"]])
def test_usage_is_the_script_header(script, args):
    """No argument or a help flag prints the script's own header comment, submits nothing."""
    proc = sh(SLURM / script, *args)
    header = (SLURM / script).read_text().split("set -euo", 1)[0].splitlines()[1]
    assert proc.stdout.splitlines()[0] == header.removeprefix("# ")
    assert f"slurm/{script} ARCH" in proc.stdout and not sbatch_lines(proc.stdout)


@pytest.mark.parametrize("arch", PARTITIONS)
def test_sweep_dry_run(arch, tmp_path, capsys):
    results = tmp_path / "sweep"
    out = sh(SLURM / "sweep.sh", arch, "--dry-run", "--results", results, "--", "--repeats", "5").stdout
    lines = sbatch_lines(out)
    counts = [2**k for k in range(9)]  # 1 .. 256 GPUs
    *jobs, plot = lines
    assert len(jobs) == 2 * len(counts)
    strong, weak = [], []
    for words in jobs:
        job = check_job(words, arch)
        args = job["args"]
        assert harness_arg(args, "--repeats") == "5"
        assert harness_arg(args, "--out").startswith(str(results))
        series = harness_arg(args, "--tag")
        (strong if series == "strong" else weak).append(job)
        assert harness_arg(args, "--out").endswith(f"/{series}/n{job['gpus']}.jsonl")
    assert [j["gpus"] for j in strong] == counts and [j["gpus"] for j in weak] == counts
    assert {harness_arg(j["args"], "--shapes") for j in strong} == {"1024"}
    for j in weak:  # fixed points per GPU
        shape = harness.parse_shape(harness_arg(j["args"], "--shapes"))
        assert math.prod(shape) == 512**3 * j["gpus"]
    # the plot job waits for every benchmark job, on one GPU with the dev QoS
    opts, script, args = parse_sbatch(plot)
    assert Path(script) == SLURM / "plot.slurm" and args == [str(results)]
    assert opts["dependency"].startswith("afterany:")
    assert len(opts["dependency"].split(":")[1:]) == len(jobs)
    assert opts["nodes"] == "1" and opts["ntasks-per-node"] == "1" and opts["gres"] == "gpu:1"
    assert opts["qos"] == f"{PARTITIONS[arch]['qos']}-dev"
    assert not results.exists()  # a dry run creates nothing
    capsys.readouterr()


def test_sweep_options():
    out = sh(SLURM / "sweep.sh", "v100", "--dry-run", "--min-gpus", "4", "--max-gpus", "16",
             "--no-weak", "--strong-grid", "512", "--time", "01:00:00", "--qos", "dev").stdout
    *jobs, _plot = sbatch_lines(out)
    got = [check_job(w, "v100", qos="dev") for w in jobs]
    assert [j["gpus"] for j in got] == [4, 8, 16]
    assert [j["nodes"] for j in got] == [1, 2, 4]
    assert all(j["opts"]["time"] == "01:00:00" for j in got)
    assert all(harness_arg(j["args"], "--shapes") == "512" for j in got)
    for args, msg in ((["--min-gpus", "5", "--max-gpus", "7"], "no power of two"),
                      (["--no-strong", "--no-weak"], "nothing to submit"),
                      (["--bogus"], "unknown option")):
        bad = sh(SLURM / "sweep.sh", "a100", "--dry-run", *args, ok=False)
        assert bad.returncode != 0 and msg in bad.stderr, (args, bad.stderr)
        assert sbatch_lines(bad.stdout) == []


@pytest.mark.parametrize("arch", PARTITIONS)
def test_bench_slurm_runs_the_harness(arch):
    """The job script itself (dry run, fake Slurm environment): modules, then srun python -m ..."""
    gpus = 2 * PARTITIONS[arch]["gpus"]
    env = {"PENCILFFT_DRY_RUN": "1", "SLURM_NTASKS": str(gpus), "SLURM_JOB_NUM_NODES": "2",
           "SLURM_JOB_CONSTRAINTS": PARTITIONS[arch]["constraint"], "PENCILFFT_ROOT": str(ROOT)}
    pd = "x".join(map(str, harness.square_pdims(gpus)))
    proc = sh("bash", SLURM / "bench.slurm", "--shapes", "64", "--pdims", pd, env=env)
    lines = proc.stdout.splitlines()
    assert lines[0] == "module purge"
    module = PARTITIONS[arch]["module"]
    if module:  # IDRIS: the arch/ module before any other
        assert lines[1] == f"module load {module}"
    assert any(ln.startswith("module load cuda") for ln in lines)
    srun = shlex.split(lines[-1])
    assert srun[0] == "srun" and srun[srun.index("python"):] == [
        "python", "-m", "benchmarks.fft", "--shapes", "64", "--pdims", pd]
    assert cli.main([*srun[srun.index("benchmarks.fft") + 1:], "--dry-run"]) == 0
    assert "warning" not in proc.stderr
    # a mesh that does not use every task is reported
    warn = sh("bash", SLURM / "bench.slurm", "--pdims", "1x2", env=env)
    assert "uses 2 GPUs but the job has" in warn.stderr
    # modules and virtualenv from the environment
    custom = sh("bash", SLURM / "bench.slurm", env={**env, "PENCILFFT_MODULES": "cuda/1 python/2",
                                                     "PENCILFFT_VENV": "/v"}).stdout
    assert "module load cuda/1 python/2" in custom and "source /v/bin/activate" in custom


def test_plot_slurm_dry_run(tmp_path):
    out = sh("bash", SLURM / "plot.slurm", tmp_path,
             env={"PENCILFFT_DRY_RUN": "1", "PENCILFFT_ROOT": str(ROOT)}).stdout
    assert f"python -m benchmarks.plot {tmp_path}/strong/n1.jsonl --outdir {tmp_path}/plots" in out
    assert "benchmarks.fft table" in out and f"> {tmp_path}/tables.md" in out


def test_shell_helpers_agree_with_python():
    script = f"""
        source {SLURM / 'common.sh'}
        for n in $(seq 1 130); do echo "p $n $(square_pdims $n)"; done
        for n in 1 2 4 8 16 32 64 128 256; do echo "w $n $(weak_shape 64 $n)"; done
    """
    out = sh("bash", "-c", script).stdout.split("\n")
    for line in filter(None, out):
        kind, n, value = line.split()
        n = int(n)
        if kind == "p":
            assert value == "x".join(map(str, harness.square_pdims(n))), (n, value)
        else:
            shape = harness.parse_shape(value)
            assert math.prod(shape) == n * 64**3 and max(shape) <= 2 * min(shape), (n, value)
    bad = sh("bash", "-c", f"source {SLURM / 'common.sh'}; weak_shape 64 6", ok=False)
    assert bad.returncode != 0 and "power-of-two" in bad.stderr


def test_readme_mentions_every_script():
    readme = (SLURM / "README.md").read_text()
    for script in SCRIPTS:
        assert script.name in readme, script.name
    for env in ("PENCILFFT_ACCOUNT", "PENCILFFT_QOS", "PENCILFFT_MODULES", "PENCILFFT_VENV", "--dry-run",
                "PENCILFFT_GPU_MODULES", "PENCILFFT_CPU_MODULES", "PENCILFFT_SRUN_MPI",
                "PENCILFFT_ROOT", "bench-cpu", "tests/slurm/run.sh"):
        assert env in readme


def test_cpu_slurm_runs_the_mpi_benchmark():
    """The CPU-partition job (dry run): one task per core, bound by srun, benchmarks.mpi with the
    most square grid of the job's tasks; arguments given win over the defaults."""
    env = {"PENCILFFT_DRY_RUN": "1", "SLURM_NTASKS": "32", "PENCILFFT_ROOT": str(ROOT),
           "PENCILFFT_CPU_MODULES": "python/3.11 openmpi/4 fftw/3"}
    lines = sh("bash", SLURM / "cpu.slurm", "--repeats", "5", env=env).stdout.splitlines()
    assert lines[:2] == ["module purge", "module load python/3.11 openmpi/4 fftw/3"]
    srun = shlex.split(lines[-1])
    assert srun[:4] == ["srun", "--kill-on-bad-exit=1", "--mpi=pmi2", "--cpu-bind=cores"]
    assert srun[srun.index("python"):] == [
        "python", "-m", "benchmarks.mpi", "--repeats", "5", "--shapes", "256", "512",
        "--pdims", "4x8", "--out", str(ROOT / "results/jeanzay/mpi-cpu-32tasks.jsonl")]
    given = sh("bash", SLURM / "cpu.slurm", "--shapes", "64", "--pdims", "2x16", env=env)
    srun = shlex.split(given.stdout.splitlines()[-1])
    assert srun.count("--pdims") == 1 and srun[srun.index("--pdims") + 1] == "2x16"
    assert srun.count("--shapes") == 1
    assert "#SBATCH --partition=cpu_p1" in (SLURM / "cpu.slurm").read_text()


# ------------------------------------------------- running with nothing edited (issue 48)
#
# The job scripts run for real here (not --dry-run), with stand-ins on PATH for what a cluster
# has: `srun` (records its arguments), `scontrol` (says which script was submitted), and
# `module` (a shell function, as Lmod defines it, recording its calls) where a test wants one.
# PENCILFFT_ROOT-less runs copy the script away from the checkout, as sbatch does (it runs a
# copy from its spool folder), and start it from another folder.

JOB_SCRIPTS = ("bench.slurm", "cpu.slurm", "plot.slurm", "pm.slurm")


def _stand_ins(tmp_path: Path, submitted: Path | None = None) -> tuple[dict, Path]:
    """A PATH with a recording `srun` (and a `scontrol` that names `submitted`), and the
    file the stand-ins append their calls to."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/bash\necho "srun $*" >> {calls}\n')
    # A python whose mpi4py-fft import fails unless MPI4PY_FFT=1.
    (bin_dir / "python").write_text('#!/bin/bash\n[[ $MPI4PY_FFT == 1 ]]\n')
    if submitted is not None:
        (bin_dir / "scontrol").write_text(
            f'#!/bin/bash\n[[ "$1 $2" == "show job" ]] || exit 1\n'
            f'echo "JobId=$3 JobName=x"\necho "   Command={submitted}"\n'
            f'echo "   WorkDir={tmp_path}"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}, calls


def _checkout(tmp_path: Path) -> Path:
    """A checkout whose slurm/ is ours: the jobs' results/ folder goes there, not in ours."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "slurm").symlink_to(SLURM)
    return checkout


def _module_function(calls: Path) -> dict:
    """`module` as Lmod exports it to batch jobs: a bash function in the environment."""
    return {"BASH_FUNC_module%%": f'() {{ echo "module $*" >> {calls}; }}'}


def _calls(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


def test_cpu_job_runs_without_module_command_from_any_folder(tmp_path):
    """Before: `common.sh: No such file or directory` from outside the checkout, then
    `module: command not found` (exit 127) on a machine without Lmod."""
    spool = tmp_path / "spool"
    spool.mkdir()
    copy = spool / "slurm_script"  # what sbatch runs: a copy, far from the checkout
    shutil.copy(SLURM / "cpu.slurm", copy)
    checkout = _checkout(tmp_path)
    env, calls = _stand_ins(tmp_path, submitted=checkout / "slurm" / "cpu.slurm")
    elsewhere = tmp_path / "submitted-from"
    elsewhere.mkdir()
    proc = sh("bash", copy, "--shapes", "32", cwd=elsewhere,
              env={**env, "SLURM_JOB_ID": "77", "SLURM_NTASKS": "2",
                   "SLURM_SUBMIT_DIR": str(elsewhere)})
    assert "no `module` command" in proc.stdout and "module purge/load skipped" in proc.stdout
    assert proc.stdout.count("# modules:") == 1  # said once
    (srun,) = _calls(calls)
    default_out = checkout / "results" / "jeanzay" / "mpi-cpu-2tasks.jsonl"
    assert srun.split() == ["srun", "--kill-on-bad-exit=1", "--mpi=pmi2", "--cpu-bind=cores",
                            "python", "-m", "benchmarks.mpi", "--shapes", "32", "--pdims", "1x2",
                            "--out", str(default_out)]
    assert "srun: --kill-on-bad-exit=1 --mpi=pmi2" in proc.stdout  # the log says how
    assert default_out.parent.is_dir()  # the checkout was found, its results folder made
    out = tmp_path / "given" / "out.jsonl"
    # mpi4py-fft missing: its row will be missing, and the log says why and how to add it
    assert "mpi4py-fft is not installed: its row (the reference) will be missing" in proc.stdout
    assert "bench-cpu" in proc.stdout and "libfftw3-dev" in proc.stdout
    with_it = sh("bash", copy, "--shapes", "32", "--out", out, cwd=elsewhere,
                 env={**env, "MPI4PY_FFT": "1", "SLURM_JOB_ID": "78", "SLURM_NTASKS": "2"})
    assert "mpi4py-fft" not in with_it.stdout
    assert out.parent.is_dir()  # the folder of a given --out is made too


@pytest.mark.parametrize("script", JOB_SCRIPTS)
def test_job_scripts_find_the_checkout(script, tmp_path):
    """Every job script finds the checkout from the submitted script's path (scontrol), and
    without it fails with an error that names PENCILFFT_ROOT, running nothing."""
    copy = tmp_path / "slurm_script"
    shutil.copy(SLURM / script, copy)
    env, calls = _stand_ins(tmp_path, submitted=SLURM / script)
    common = {"PENCILFFT_DRY_RUN": "1", "SLURM_JOB_ID": "5", "SLURM_NTASKS": "4",
              "SLURM_SUBMIT_DIR": str(tmp_path)}
    args = [tmp_path] if script == "plot.slurm" else []
    found = sh("bash", copy, *args, cwd=tmp_path, env={**env, **common})
    assert "python -m benchmarks." in found.stdout
    lost = sh("bash", copy, *args, cwd=tmp_path, ok=False,
              env={"PATH": "/usr/bin:/bin", **common})  # no scontrol: nothing says where
    assert lost.returncode == 2 and "set PENCILFFT_ROOT" in lost.stderr, lost.stderr
    assert "benchmarks" not in lost.stdout and not _calls(calls)
    given = sh("bash", copy, *args, cwd=tmp_path,
               env={"PATH": "/usr/bin:/bin", "PENCILFFT_ROOT": str(ROOT), **common})
    assert "python -m benchmarks." in given.stdout


def test_job_scripts_share_one_checkout_finder():
    """The finder cannot live in common.sh (it finds common.sh): the same lines in each."""
    blocks = set()
    for script in JOB_SCRIPTS:
        text = (SLURM / script).read_text()
        blocks.add(text[text.index("# The checkout (this script"):text.index("ROOT=$(cd")])
    assert len(blocks) == 1


def test_cpu_and_gpu_modules_are_separate(tmp_path):
    """PENCILFFT_MODULES, set to GPU modules as the README said, made cpu.slurm load CUDA and
    no FFTW.  Now: PENCILFFT_CPU_MODULES for cpu.slurm, PENCILFFT_GPU_MODULES (or the old
    PENCILFFT_MODULES) for the GPU scripts; `none` skips every module call."""
    env, calls = _stand_ins(tmp_path)
    checkout = _checkout(tmp_path)
    env.update(_module_function(calls), PENCILFFT_ROOT=str(checkout), SLURM_NTASKS="2",
               PENCILFFT_VENV="", SLURM_JOB_ID="3")
    out = ["--out", str(tmp_path / "o.jsonl")]

    def run(script, **extra):
        calls.unlink(missing_ok=True)
        args = [*out] if script == "cpu.slurm" else ["--pdims", "1x2"]
        proc = sh("bash", SLURM / script, *args, cwd=tmp_path,
                  env={**env, "SLURM_JOB_CONSTRAINTS": "a100", **extra})
        return proc.stdout, [c for c in _calls(calls) if c.startswith("module")]

    gpu = "cuda/12 nccl/2 openmpi/4-cuda python/3"
    log, cpu_modules = run("cpu.slurm", PENCILFFT_MODULES=gpu)
    assert cpu_modules == ["module purge", "module load python openmpi fftw"]  # not CUDA
    assert "PENCILFFT_MODULES is for the GPU scripts" in log
    _, gpu_modules = run("bench.slurm", PENCILFFT_MODULES=gpu)
    assert gpu_modules == ["module purge", "module load arch/a100", f"module load {gpu}"]
    _, gpu_modules = run("bench.slurm", PENCILFFT_MODULES=gpu, PENCILFFT_GPU_MODULES="cuda/13")
    assert gpu_modules[-1] == "module load cuda/13"
    _, cpu_modules = run("cpu.slurm", PENCILFFT_CPU_MODULES="python/3.11 fftw/3")
    assert cpu_modules == ["module purge", "module load python/3.11 fftw/3"]
    for script in JOB_SCRIPTS[:2]:  # none: no module call at all, said once
        for extra in ({"PENCILFFT_MODULES": "none"}, {"PENCILFFT_CPU_MODULES": "none",
                                                      "PENCILFFT_GPU_MODULES": "none"}):
            log, modules = run(script, **extra)
            assert modules == [] and log.count("# modules: none") == 1, (script, extra, log)


@pytest.mark.parametrize("setting,expected", [
    ({}, ["--mpi=pmi2"]),  # what the mpich of pencilfft[mpi] speaks
    ({"PENCILFFT_SRUN_MPI": "pmix"}, ["--mpi=pmix"]),  # a site's Open MPI
    ({"SLURM_MPI_TYPE": "pmix"}, ["--mpi=pmix"]),  # set by a site's module
    ({"SLURM_MPI_TYPE": "pmix", "PENCILFFT_SRUN_MPI": "pmi2"}, ["--mpi=pmi2"]),
    ({"PENCILFFT_SRUN_MPI": "default"}, []),  # the cluster's MpiDefault
])
@pytest.mark.parametrize("script", ["bench.slurm", "cpu.slurm", "pm.slurm"])
def test_srun_mpi_plugin_is_a_setting(script, setting, expected):
    env = {"PENCILFFT_DRY_RUN": "1", "SLURM_NTASKS": "4", "PENCILFFT_ROOT": str(ROOT), **setting}
    srun = shlex.split(sh("bash", SLURM / script, env=env).stdout.splitlines()[-1])
    assert srun[0] == "srun" and "--kill-on-bad-exit=1" in srun
    assert [a for a in srun if a.startswith("--mpi")] == expected


# ------------------------------------------------------------ the real-Slurm step (its edges)

SLURM_STEP = ROOT / "tests" / "slurm" / "run.sh"


@pytest.mark.parametrize("script", [SLURM_STEP, ROOT / "tests" / "slurm" / "step.slurm"],
                         ids=lambda p: p.name)
def test_slurm_step_syntax(script):
    sh("bash", "-n", script)


def test_suite_runs_the_slurm_step():
    text = (ROOT / "tests" / "run.sh").read_text()
    assert 'step "slurm" "$SLURM_TIMEOUT" bash tests/slurm/run.sh' in text


@pytest.mark.parametrize("case", ["not-root", "no-apt-get"])
@pytest.mark.parametrize("ci", ["", "1"])
def test_slurm_step_skips_only_where_it_cannot_run(case, ci, tmp_path):
    """Skipped, saying why, where it cannot run; with CI set the same is a failure.  PATH holds
    only stand-ins: `id` (the user), dirname, and no Slurm, no apt-get."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {1000 if case == 'not-root' else 0}\n")
    (bin_dir / "id").chmod(0o755)
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    env = {"PATH": str(bin_dir), "CI": ci or None}  # CI unset, whatever the outer one says
    proc = sh(shutil.which("bash"), SLURM_STEP, env=env, ok=False)
    why = "not root" if case == "not-root" else "no apt-get to install Debian's slurmctld"
    if ci:
        assert proc.returncode == 1 and "== slurm: cannot run:" in proc.stdout, proc.stdout
        assert "(CI is set: this step must run)" in proc.stdout
    else:
        assert proc.returncode == 0 and "== slurm: skipped:" in proc.stdout, proc.stdout
    assert why in proc.stdout, proc.stdout
