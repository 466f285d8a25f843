"""pencilfft across nodes (issue 65): run by tests/multinode/run.sh once its cluster of
namespace "nodes" is up (tests/multinode/cluster.sh), as
`python -m pytest --noconftest tests/multinode/checks.py`.

Every job starts on node1, as a user's would on a login node, with the user's environment (the
virtualenv's bin first on PATH, nothing of pencilfft's or the launchers'), and with only what
the docs tell a user to use: `srun --mpi=pmi2 --kill-on-bad-exit=1` (slurm/common.sh's options),
MPICH's `mpiexec -hosts`, `pencilfft.initialize()`.  Each job's tasks (tests/multinode/task.py)
print one `REPORT <json>` line each; the tests read them:

* `srun -N 2 -n 2`, `-N 4 -n 4`, `-N 2 -n 4` (two tasks a node) and hydra across 2 nodes (two
  devices a process): initialize detects the launcher and every task, the coordinator is rank
  0's node; pfft3d/pifft3d (each exchange in some job: auto, mpi, alltoall, mixed), the N-D names
  on a 2-D brick and a 4-D batch, scatter/gather/save/load agree with numpy; the MPI exchange's
  bytes come in over each node's link (measured inside the task, on its eth0), and every node of
  the job received data over its veth (read here, on the bridge side);
* two nodes that plan different shapes: DifferentPlansError on every task, naming both shapes,
  and the job ends with a failure;
* a task on the job's second node that raises: the whole job ends within 30 s, failed;
* slurm/cpu.slurm and slurm/pm.slurm, unedited, with `--nodes=2`.

The mpich wheel's default network layer (UCX) with `srun --mpi=pmi2` failed in 1-2 runs of 3
across nodes (Slurm reads a PMI-1 request in one read of 1024 bytes; MPICH's run-length-coded
UCX address segments reach 1050-1100): `pencilfft.initialize()` now selects MPICH's OFI layer
there (docs/troubleshooting.md).  Every srun job here goes through it, and
test_pmi1_requests_fit_slurms_buffer checks the requests Slurm read.

UCX and libfabric see the namespaces as one host and would use shared memory between them:
FI_PROVIDER=tcp (and UCX_TLS=self,tcp for hydra, which keeps UCX) make MPI cross the bridge, as
it must between real nodes; the link checks above would fail otherwise.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    "MN_DIR" not in os.environ,
    reason="needs the cluster that tests/multinode/run.sh starts (run that script)")

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "tests" / "multinode" / "task.py"
W = Path(os.environ.get("MN_DIR", "/nonexistent"))
USER = W / "user"
EXEC = os.environ.get("MN_EXEC", "/nonexistent")
PREFIX = os.environ.get("MN_PREFIX", "")
ENDED_WITHIN = 30  # seconds from a task's failure to the job's end
SRUN = "srun --mpi=pmi2 --kill-on-bad-exit=1"  # slurm/common.sh's options


def _timing(line: str) -> None:
    with open(W / "timings.txt", "a") as f:
        f.write(line + "\n")


def user_env(devices: int = 1, **extra: str) -> dict[str, str]:
    """A user's environment on the login node: this one less launcher and pencilfft settings,
    the virtualenv first on PATH, one (or `devices`) CPU devices a process."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "PENCILFFT_", "PMI_", "OMPI_", "MPICH_", "UCX_",
                                "FI_", "JAX_", "MN_"))
           and k not in ("XLA_FLAGS",)}
    env.update(SLURM_CONF=os.environ["SLURM_CONF"], JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               FI_PROVIDER="tcp")  # see the module's docstring
    if sys.prefix != sys.base_prefix:
        env["PENCILFFT_VENV"] = sys.prefix
    env.update(extra)
    return env


def on_node1(command: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`command` (one shell line) run on node1 from the user's folder."""
    return subprocess.run([EXEC, "node1", f"cd {shlex.quote(str(USER))} && {command}"],
                          env=env, capture_output=True, text=True, timeout=timeout)


def node_bytes() -> dict[str, int]:
    """Bytes each node has received so far (the bridge side of its veth sends them)."""
    out = {}
    for net in Path("/sys/class/net").glob(f"{PREFIX}h*"):
        out["node" + net.name[len(PREFIX) + 1:]] = int((net / "statistics" / "tx_bytes").read_text())
    return out


def reports(text: str) -> list[dict]:
    """Every task's `REPORT <json>`, wherever it starts (hydra may put two tasks' lines on one
    line of its output); one cut by another task's output is left out (that rank is missing)."""
    found, decoder = [], json.JSONDecoder()
    for match in re.finditer(r"REPORT (?=\{)", text):
        try:
            found.append(decoder.raw_decode(text, match.end())[0])
        except json.JSONDecodeError:
            pass
    return sorted(found, key=lambda r: r["rank"])


def job(launch: str, args: str, env: dict[str, str], timeout: float = 240):
    """Run one job (`launch python task.py args`); its output, reports and bytes per node."""
    before = node_bytes()
    start = time.monotonic()
    done = on_node1(f"{launch} python {TASK} {args}", env, timeout)
    took = time.monotonic() - start
    after = node_bytes()
    log = done.stdout + done.stderr
    _timing(f"{launch} task.py {args.split()[0]}: {took:.0f} s (exit status {done.returncode})")
    return done, log, reports(done.stdout), {n: after[n] - before[n] for n in after}


def check_job(launch: str, tasks: int, nodes: int, devices: int, exchanges: str):
    done, log, got, received = job(launch, f"checks {USER} {exchanges}", user_env(devices))
    assert done.returncode == 0, log[-6000:]
    assert [r["rank"] for r in got] == list(range(tasks)), log[-6000:]
    hosts = [r["host"] for r in got]
    assert len(set(hosts)) == nodes, hosts  # (Slurm chooses which of the 4)
    for r in got:
        assert r["processes"] == tasks and r["mpi"] == tasks, r
        assert r["devices"] == tasks * devices and r["local"] == devices, r
        assert r["failed"] == {}, r
    # initialize's own line: the MPI launcher detected, rank 0's node as the coordinator.
    # (each task's line on its own, or two run together: hydra does not keep lines whole)
    said = re.findall(r"pencilfft\.initialize: launcher MPI; jax\.distributed\.initialize\("
                      r"\{[^}]*'coordinator_address': '([^':]+):\d+'", log)
    assert said == [hosts[0]] * tasks, log[-4000:]
    for host in set(hosts):  # every node of the job received the exchanges' data over its link
        assert received[host] > 100_000, received
    return got, log


def test_srun_2_nodes_2_tasks():
    got, log = check_job(f"{SRUN} -N 2 -n 2", tasks=2, nodes=2, devices=1, exchanges="auto,mpi")
    assert all(r["netmod"] == "ofi" for r in got), got  # initialize chose it (srun + pmi2)
    assert "MPICH_CH4_NETMOD=ofi" in log  # and said so (initialize(verbose=True))


def test_srun_4_nodes_4_tasks():
    check_job(f"{SRUN} -N 4 -n 4", tasks=4, nodes=4, devices=1, exchanges="auto,alltoall")


def test_srun_2_nodes_4_tasks():
    got, _ = check_job(f"{SRUN} -N 2 -n 4", tasks=4, nodes=2, devices=1, exchanges="mpi")
    hosts = [r["host"] for r in got]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], got  # two tasks a node, in block order


def test_hydra_across_2_nodes():
    """MPICH's mpiexec across nodes, through the launcher it would use ssh for; two devices a
    process, so the mixed exchange (local and MPI at once) runs between nodes.  Hydra serves
    PMI itself: the UCX layer is kept, forced to TCP (see the module's docstring)."""
    launch = (f"mpiexec -launcher ssh -launcher-exec {EXEC} -hosts node1,node2 -n 2 -ppn 1"
              f" -genv UCX_TLS self,tcp")
    got, _ = check_job(launch, tasks=2, nodes=2, devices=2, exchanges="mixed,auto")
    assert all(r["netmod"] is None for r in got), got  # not srun: MPICH's default kept


def test_pmi1_requests_fit_slurms_buffer():
    """The cause of the UCX failure, checked where it arises: every PMI-1 request that a
    task's MPICH sent to Slurm's pmi2 plug-in in this session fitted its 1024-byte read
    (slurmstepd logs each cut one as `value not properly terminated` or `request not begin
    with 'cmd='`)."""
    logs = "".join(p.read_text(errors="replace") for p in (W / "log").glob("slurmd-*.log"))
    assert logs, "no slurmd logs"
    assert "not properly terminated" not in logs and "request not begin" not in logs, \
        logs[-3000:]


def test_nodes_that_plan_different_shapes_end_the_job_naming_them():
    done, log, got, _ = job(f"{SRUN} -N 2 -n 2", "differ", user_env())
    assert done.returncode != 0, log[-4000:]
    assert sorted(r["planning"][2] for r in got if "planning" in r) == [8, 16], log[-4000:]
    assert not any("unreachable" in r for r in got), log[-4000:]
    assert "DifferentPlansError" in log, log[-4000:]
    assert "(16, 16, 16)" in log and "(16, 16, 8)" in log, log[-4000:]


def test_a_task_that_raises_on_the_second_node_ends_the_job():
    done, log, got, _ = job(f"{SRUN} -N 2 -n 2", f"raise {USER}", user_env())
    ended = time.time()
    assert (USER / "raising.json").exists(), log[-6000:]
    failing = json.loads((USER / "raising.json").read_text())
    assert failing["rank"] == 1, failing  # (-N 2 -n 2: rank 1 is on the second node)
    took = ended - failing["raising_at"]
    _timing(f"a task on the second node raises: the job ended {took:.1f} s later "
            f"(exit {done.returncode})")
    assert took < ENDED_WITHIN, f"the job took {took:.0f} s to end after the failure"
    assert done.returncode != 0
    assert f"RuntimeError: boom on {failing['host']}" in log, log[-4000:]
    assert not any("unreachable" in r for r in got)


# ------------------------------------------------------------------ the slurm/ scripts, unedited


def _sbatch_and_wait(*argv: str, timeout: float = 400) -> tuple[dict[str, str], str]:
    env = user_env(PENCILFFT_ACCOUNT="abc", PENCILFFT_QOS="dev")
    env.pop("XLA_FLAGS")
    env.pop("FI_PROVIDER")
    env["FI_PROVIDER"] = "tcp"  # the namespaces' artefact (see the module's docstring)
    done = on_node1("sbatch --parsable " + " ".join(map(shlex.quote, argv)), env, 60)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        line = on_node1(f"scontrol show job -o {job_id}", env, 30).stdout
        info = dict(re.findall(r"(\w+)=(\S*)", line))
        if info.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"job {job_id} still {info.get('JobState')} after {timeout} s")
    return info, Path(info["StdOut"]).read_text()


def test_cpu_slurm_on_2_nodes():
    out = USER / "cpu-2nodes.jsonl"
    start = time.monotonic()
    info, log = _sbatch_and_wait("-A", "abc@cpu", "--qos=qos_cpu-dev", "--nodes=2",
                                 "--ntasks-per-node=1", str(ROOT / "slurm" / "cpu.slurm"),
                                 "--shapes", "32", "--out", str(out))
    _timing(f"slurm/cpu.slurm --nodes=2: {time.monotonic() - start:.0f} s ({info['JobState']})")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert "nodes=2" in log and "--mpi=pmi2" in log, log
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert {"pencilfft/auto", "pencilfft/mpi"} <= {r["row"] for r in records}, records
    assert all(r["processes"] == 2 for r in records), records


def test_pm_slurm_on_2_nodes():
    out = USER / "pm-2nodes.jsonl"
    start = time.monotonic()
    info, log = _sbatch_and_wait("--nodes=2", "--ntasks-per-node=1",
                                 "--export=ALL,PENCILFFT_GPU_MODULES=none",
                                 str(ROOT / "slurm" / "pm.slurm"), "--shapes", "32",
                                 "--impls", "pencilfft", "--steps", "1", "--repeats", "1",
                                 "--out", str(out))
    _timing(f"slurm/pm.slurm --nodes=2: {time.monotonic() - start:.0f} s ({info['JobState']})")
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and all(r["machine"]["process_count"] == 2 and r["status"] == "ok"
                           for r in records), records
