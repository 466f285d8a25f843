"""One prepared run for a lent GPU machine (issue 49): the suite on its jax, its GPU, its cores.

Here, once: `bash benchmarks/device_prep.sh` (the py3.12 wheels into .whl/, JaxPM's source into
.carry/JaxPM, both git-ignored).  Then the one device command (the `run` tool; carry
[".whl", ".carry"], timeout_s 540), from the repository root:

    PYTHONUNBUFFERED=1 python3 -m benchmarks.device --wheels .whl --jaxpm .carry/JaxPM --out $OUT
    python -m benchmarks.device table threads.jsonl          # the `threads16` table

Under 8 minutes (`--deadline` 450 s), each part stopped at its budget, into the folder --out (5
files): suite.log (the single-process suite but the docs and benchmarks' tests, JAX_PLATFORMS=cpu,
pytest-xdist on its cores); the GPU checks (tests/test_gpu.py, into device.log), then gpu.jsonl
(`benchmarks.gpu`: 512^3, 1024^3, 2048^3 r2c if it fits) and gpu-paint.jsonl (`benchmarks.paint`
at 256^3 beside JaxPM), or "no GPU"; threads.jsonl; device.log (every command, its time, the end
of its output).  `python -m benchmarks.<gpu|paint|device> table FILE` makes their tables.

threads: layouts PxDxT (P processes of D devices, T threads per device), each a
`benchmarks.fft` run (c2c, transposed layout) in processes of its own (thread pools and
pencilfft's thread rule are fixed when one starts), pinned to its cores, PENCILFFT_THREADS =
D * T: 1x1xT with `jnp.fft` and pyFFTW (FFTW's own threaded 3-D plan) beside pencilfft; 1xDxT
on the most square and the slab mesh; PxDxT with P > 1 under mpirun (2x8x1: the mixed exchange,
local inside each process and MPI between, beside 1x16x1).  The cheapest first; the machine's
core count leaves out what needs more.  `--quick`: every part at tiny sizes, under a minute on a
CPU-only machine.  Every part is a process of its own (the parent starts no jax).
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[1]
PREFIX = Path("/tmp/pencilfft-device")  # where the carried wheels are installed
LAYOUTS = ("1x1x16", "1x16x1", "2x8x1", "1x4x4", "4x1x4", "1x1x8", "1x1x4", "1x1x2", "1x1x1")
QUICK_LAYOUTS = ("1x1x2", "1x2x1", "2x1x1", "1x1x1")


class Run:
    """The run's clock, its log and its environment for the parts."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.start, self.out = args, time.monotonic(), Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "device.log", "a", encoding="utf-8")
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.start)

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:6.1f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def call(self, cmd: Sequence[str], budget: float, env: dict | None = None,
             log: Path | None = None) -> int | None:
        """`cmd` for at most `budget` s (and the deadline's rest): its exit status, None if stopped."""
        limit = min(budget, self.left())
        if limit < 5:
            self.say(f"not run (no time left): {' '.join(cmd)}")
            return None
        self.say(f"run (at most {limit:.0f} s): {' '.join(cmd)}")
        t0 = time.monotonic()
        with open(log or os.devnull, "w", encoding="utf-8") as sink:
            proc = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **(env or {})}, text=True,
                                    stdout=sink if log else subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                output, rc = proc.communicate(timeout=limit)[0], proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # the whole group: mpirun's ranks, pytest's workers
                output, rc = proc.communicate()[0], None
        self.say(f"{'stopped at its budget' if rc is None else f'exit {rc}'} after "
                 f"{time.monotonic() - t0:.0f} s" + (f"\n{output[-4000:]}" if output else ""))
        return rc


def install(run: Run, wheels: str | None) -> None:
    """The wheels into PREFIX (--target would drop mpich's lib/) and PATH, LD_LIBRARY_PATH to it."""
    found = sorted(glob.glob(os.path.join(wheels, "*.whl"))) if wheels else []
    if not found:
        run.say(f"no wheels in {wheels!r}: the machine's packages only")
        return
    run.call([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
              "--no-compile", "--no-cache-dir", "--ignore-installed", "--prefix", str(PREFIX),
              *found], 120)
    site = sorted(glob.glob(str(PREFIX / "lib" / "python3*" / "site-packages")))
    run.env["PYTHONPATH"] = os.pathsep.join(site + [run.env["PYTHONPATH"]])
    run.env["PATH"] = f"{PREFIX / 'bin'}{os.pathsep}{run.env.get('PATH', '')}"
    run.env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(PREFIX / "lib")] + [p for p in run.env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])


def gpu_present() -> str | None:
    """nvidia-smi's list of GPUs, or None."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and "GPU" in out.stdout else None


def suite(run: Run, gpus: str | None) -> None:
    a = run.args
    workers = max(1, min(len(os.sched_getaffinity(0)) - 2, 14))
    tests = ["tests/test_errors.py"] if a.quick else [
        "tests", "--ignore=tests/test_docs.py", "--ignore=tests/tooling"]
    xdist = [] if a.quick else ["-n", str(workers), "--dist", "loadfile"]
    # -v: a line per test as it ends, so a run stopped at its budget still names its failures
    run.call([sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider",
              "-p", "pencilfft_mpi_plugin", "--durations=10", *xdist, *tests], a.budget_suite,
             env={"JAX_PLATFORMS": "cpu", "PENCILFFT_TEST_DEVICES": "8",
                  "PENCILFFT_TEST_TIMEOUT": "120",
                  "PYTHONPATH": f"{ROOT / 'tests' / 'mp'}{os.pathsep}{run.env['PYTHONPATH']}"},
             log=run.out / "suite.log")


def gpu(run: Run, gpus: str | None) -> None:
    a = run.args
    if gpus is None:
        run.say("no GPU: the GPU part skipped")
        return
    t0 = time.monotonic()
    run.call([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
              "tests/test_gpu.py"], 60, {"JAX_PLATFORMS": "cuda"})  # (the checks, before timing)
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"}  # jax takes 75% by default: 2048^3 needs more
    run.call([sys.executable, "-m", "benchmarks.gpu", "--shapes",
              *(["64"] if a.quick else ["512", "1024", "2048"]), "--repeats", "3" if a.quick else "10",
              "--out", str(run.out / "gpu.jsonl")], a.budget_gpu * 0.7, env)
    if not (a.jaxpm and Path(a.jaxpm).is_dir()):
        run.say(f"JaxPM's source not carried ({a.jaxpm!r}): no paint comparison")
        return
    run.call([sys.executable, "-m", "benchmarks.paint", "--devices", "1", "--pdims", "1x1",
              "--shapes", "32" if a.quick else "256", "--what", "paint+readout", "forces",
              "--repeats", "3" if a.quick else "10", "--jaxpm", a.jaxpm,
              "--out", str(run.out / "gpu-paint.jsonl")], a.budget_gpu - (time.monotonic() - t0), env)


def layout_command(layout: tuple[int, int, int], args: argparse.Namespace, out: Path,
                   path: str | None = None) -> list[str]:
    """The `benchmarks.fft` run of one layout PxDxT (under mpirun for several processes).

    `path`: the PATH the command runs with, where `mpirun` is looked up: the carried mpich's
    first (a lent machine's own /usr/bin/mpirun is Open MPI's, which refuses root)."""
    p, d, t = layout
    n = p * d
    pdims = ["1x1"] if n == 1 else list(dict.fromkeys([harness.fmt_dims(harness.square_pdims(n)),
                                                       f"{n}x1"]))
    cmd = [sys.executable, "-m", "benchmarks.fft", "--devices", str(d), "--cores", str(d * t),
           "--shapes", *(harness.fmt_dims(s) for s in args.shapes), "--pdims", *pdims,
           "--impls", *(["pencilfft", "fftn-1dev", "pyfftw"] if n == 1 else ["pencilfft"]),
           "--layouts", "transposed", "--repeats", str(args.repeats), "--warmup", str(args.warmup),
           "--check-max", "256", "--out", str(out), "--tag", f"threads {harness.fmt_dims(layout)}",
           "--quiet"]  # (numpy's reference is single-threaded: minutes at 512^3)
    mpirun = shutil.which("mpirun", path=path) or str(Path(sys.executable).parent / "mpirun")
    return [mpirun, "-np", str(p), *cmd] if p > 1 else cmd


def threads(run: Run, gpus: str | None) -> None:
    """Each layout the cores allow, its budget what is left less 15 s per layout to come."""
    a, cores = run.args, len(os.sched_getaffinity(0))
    layouts = [harness.parse_dims(n, "layout", "PxDxT", (3,))
               for n in (a.layouts or (QUICK_LAYOUTS if a.quick else LAYOUTS))]
    runnable = [lay for lay in layouts if math.prod(lay) <= cores]
    run.say(f"layouts that need more than {cores} cores, left out: "
            f"{[harness.fmt_dims(lay) for lay in layouts if lay not in runnable]}")
    stop = time.monotonic() + min(a.budget_threads, run.left())
    for i, lay in enumerate(runnable):
        env = {"PENCILFFT_THREADS": str(lay[1] * lay[2]), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
        run.call(layout_command(lay, a, run.out / "threads.jsonl", run.env.get("PATH")),
                 stop - time.monotonic() - 15 * (len(runnable) - i - 1), env)


def _seconds(records: list[dict], impl: str) -> float | None:
    """Forward + inverse: the sum of the two medians of `impl`'s records (None if missing)."""
    meds = {r["direction"]: r["median_s"] for r in records if r["impl"] == impl and r["status"] == "ok"}
    return sum(meds.values()) if len(meds) == 2 else None


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "—"


def threads_table(records: list[dict]) -> str:
    """One row per (grid, layout, mesh): pencilfft beside jnp.fft and pyFFTW."""
    cases: dict[tuple, list[dict]] = {}
    for r in records:
        if r.get("tag", "").startswith("threads "):
            lay = harness.parse_dims(r["tag"].split()[1], "layout", "PxDxT", (3,))
            cases.setdefault((tuple(r["shape"]), lay, tuple(r["pdims"])), []).append(r)
    one = {shape: (_seconds(rs, "pencilfft"), lay) for (shape, lay, _), rs in
           sorted(cases.items(), key=lambda kv: kv[0][1][2]) if lay[:2] == (1, 1) and _seconds(rs, "pencilfft")}
    rows = []
    for (shape, lay, pdims), rs in sorted(cases.items(), key=lambda kv: (
            kv[0][0], math.prod(kv[0][1][:2]), -kv[0][1][2], kv[0][1:])):
        pf, jn, fw = (_seconds(rs, i) for i in ("pencilfft", "fftn-1dev", "pyfftw"))
        ref = one.get(shape)
        rows.append([harness.fmt_dims(shape), harness.fmt_dims(lay), harness.fmt_dims(pdims),
                     *(harness.fmt_ms(v) or "—" for v in (pf, jn, fw)), _ratio(pf, fw), _ratio(pf, jn),
                     f"{_ratio(pf, ref[0])} ({harness.fmt_dims(ref[1])})" if ref else "—"])
    r0 = records[0]
    return harness.md_table(
        ["grid", "processes x devices x threads", "mesh", "pencilfft ms", "jnp.fft ms",
         "pyFFTW ms", "pencilfft / pyFFTW", "pencilfft / jnp.fft", "vs one device, most threads"],
        rows, "lll" + "r" * 6, (
            f"complex64 forward + inverse (the sum of each direction's median of "
            f"{r0['repeats']} interleaved rounds), transposed layout, `python -m benchmarks.fft` "
            f"per layout pinned to its cores; {r0['machine']['cpu_count']} cores "
            f"({r0['machine']['platform']}), jax {r0['versions']['jax']}; load average when a "
            f"grid ended: {harness.load_range(records)}."))


OPTIONS = dict(shapes=["256"], repeats=3, warmup=1,
               out=dict(default=None, required=True, help="the folder everything goes to ($OUT)"))
PART_NAMES = ("suite", "gpu", "threads")
USES_JAX = False  # every part is a process of its own


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wheels", default=None, help="folder of wheels to install first (.whl)")
    p.add_argument("--jaxpm", default=None, help="JaxPM's source folder (.carry/JaxPM)")
    p.add_argument("--quick", action="store_true", help="every part at tiny sizes")
    p.add_argument("--parts", nargs="+", choices=PART_NAMES, default=list(PART_NAMES))
    p.add_argument("--layouts", nargs="+", default=None, metavar="PxDxT",
                   help=f"the thread part's layouts (default {' '.join(LAYOUTS)})")
    p.add_argument("--deadline", type=float, default=450, help="seconds for the whole run")
    for part, budget in zip(PART_NAMES, (200, 100, 140)):
        p.add_argument(f"--budget-{part}", type=float, default=budget, help="seconds at most")


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    if args.quick:
        args.shapes, args.repeats = [(16, 16, 16)], 1
    session = Run(args)
    session.say(f"benchmarks.device {' '.join(sys.argv[1:])}")
    install(session, args.wheels)
    gpus = gpu_present()
    session.say(f"{len(os.sched_getaffinity(0))} cores, {platform.platform()}, Python "
                f"{platform.python_version()}; GPUs: {gpus}")
    for part in args.parts:
        {"suite": suite, "gpu": gpu, "threads": threads}[part](session, gpus)
    session.say(f"done, {session.left():.0f} s of the deadline left")
    yield []


TABLES = {"threads16": threads_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
