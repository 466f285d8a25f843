"""Many ranks (issue 65): what grows with the number of processes.

    python -m benchmarks.ranks --ranks 2 4 8 16 --shapes 64 --out benchmarks/data/ranks.jsonl
    python -m benchmarks.ranks table benchmarks/data/ranks.jsonl

For each rank count N, `mpirun -np N` (one CPU device per process; oversubscribed where N
exceeds the cores, as on this project's 2-core machine) runs this module's `child` part, which
times, in every process:

* start-up: from the process's start (the kernel's clock) to the end of the imports (python,
  jax, pencilfft);
* `pencilfft.initialize()`: MPI, jax.distributed and its coordinator (rank 0's);
* the agreement of one plan alone (`agree.same` on a plan-sized text, about 1 KB: what every
  transform's first trace, and every eager call, does; under MPI one allreduce of its digest),
  and beside it every process's text gathered to every process (`agree.gather`: the agreement
  as it was before, and still where the texts differ), the median of 5 each;
* the first call of a jitted forward + inverse round trip on an N x 1 slab mesh (the plan and
  its agreement, compiling, running), then the median of --repeats calls, jitted and eager
  (an eager call plans and agrees again every time).

The slowest process sets each time (the max over processes); the table has a column per N.
Nothing here is asserted: it shows what grows with N (tests/tooling/test_bench_tools.py runs
it at N = 2 on tiny sizes).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[1]
METRICS = (("startup_s", "start-up (python, imports)"),
           ("initialize_s", "pencilfft.initialize()"),
           ("agree_s", "agreement of one plan (a digest's allreduce)"),
           ("gather_s", "every plan text to every process (the agreement before)"),
           ("first_call_s", "first call (plan, compile, run)"),
           ("jit_roundtrip_s", "round trip, jitted (median)"),
           ("eager_roundtrip_s", "round trip, eager (median)"))
USES_JAX = False  # the parent starts mpirun; each child starts its own jax


def _process_age() -> float:
    """Seconds since this process started, by the kernel's clock (/proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/stat") as f:
        start = int(f.read().rpartition(")")[2].split()[19]) / ticks
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - start


def child(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """One process of the `mpirun -np N` run: its times, the max over processes on rank 0."""
    startup = _process_age()
    import jax
    import numpy as np

    import pencilfft
    from pencilfft._processes import agree

    t = time.perf_counter()
    pencilfft.initialize()
    initialize = time.perf_counter() - t
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ctx = harness.context("benchmarks.ranks", sys.argv[1:])
    n = jax.process_count()
    agreements, gathers = [], []
    for i in range(5):
        comm.Barrier()
        t = time.perf_counter()
        agree.same({"plan": f"probe {i} " + "x" * 1000}, "a benchmark's plan")
        agreements.append(time.perf_counter() - t)
        comm.Barrier()
        t = time.perf_counter()
        agree.gather(f"probe {i} " + "x" * 1000, "a benchmark's plan")
        gathers.append(time.perf_counter() - t)
    records = []
    for shape in args.shapes:
        mesh = harness.make_mesh((n, 1))
        x = harness.make_input(shape, pencilfft.real_space_sharding(mesh), "complex64", 0)
        f = jax.jit(lambda v: pencilfft.pifft3d(pencilfft.pfft3d(v)))
        comm.Barrier()
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        first = time.perf_counter() - t

        def eager():
            return pencilfft.pifft3d(pencilfft.pfft3d(x))

        times = {}
        for name, call in (("jit_roundtrip_s", lambda: f(x)), ("eager_roundtrip_s", eager)):
            jax.block_until_ready(call())
            runs = []
            for _ in range(args.repeats):
                comm.Barrier()
                t = time.perf_counter()
                jax.block_until_ready(call())
                runs.append(time.perf_counter() - t)
            times[name] = statistics.median(runs)
        mine = dict(startup_s=startup, initialize_s=initialize,
                    agree_s=statistics.median(agreements), gather_s=statistics.median(gathers),
                    first_call_s=first, **times)
        slowest = {k: max(comm.allgather(v)) for k, v in mine.items()}
        records.append({"processes": n, "shape": list(shape), "pdims": [n, 1],
                        "repeats": args.repeats, **slowest, **harness.stamp(ctx)})
    if comm.rank == 0:
        print("RECORDS " + json.dumps(records), flush=True)
    return iter(())  # the parent writes them


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """For each --ranks N: mpirun -np N this module's child part; its records."""
    mpirun = Path(sys.executable).parent / "mpirun"
    for n in args.ranks:
        cmd = [str(mpirun), "-np", str(n), sys.executable, "-m", "benchmarks.ranks", "child",
               "--shapes", *(harness.fmt_dims(s) for s in args.shapes),
               "--repeats", str(args.repeats)]
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
                   XLA_FLAGS="--xla_force_host_platform_device_count=1")
        harness.say(args, f"mpirun -np {n} ...")
        start = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=args.timeout)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RECORDS ")]
        if done.returncode or not lines:
            raise SystemExit(f"mpirun -np {n} failed (exit {done.returncode}):\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        records = json.loads(lines[-1][len("RECORDS "):])
        for r in records:
            r.update(command=f"python -m benchmarks.ranks {' '.join(sys.argv[1:])}",
                     wall_s=time.monotonic() - start)
        yield records


def table(records: Sequence[dict]) -> str:
    """Markdown: a row per measured time, a column per process count (ms)."""
    latest = harness.latest(records, lambda r: (r["processes"], tuple(r["shape"])))
    cases = sorted(latest)
    rows = [[label] + [harness.fmt_ms(latest[c].get(key)) for c in cases]
            for key, label in METRICS]
    return harness.md_table(
        ["ms (slowest process)", *(f"np {c[0]}, {c[1][0]}^3" for c in cases)], rows,
        "l" + "r" * len(cases),
        note=f"One CPU device per process (mpirun -np N on the machine's cores), a slab mesh "
             f"Nx1, complex64; load {harness.load_range(records)}.")


OPTIONS = dict(shapes=["64"], repeats=10, out=None, quiet=False)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8, 16],
                   help="process counts, each a run of its own (default: 2 4 8 16)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per mpirun (default 900)")


PARTS = {"run": (run, "ranks"), "child": (child, "ranks")}
TABLES = {"ranks": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
