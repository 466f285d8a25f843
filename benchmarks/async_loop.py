"""Long asynchronous loops (issue 68): does a loop of transforms that never waits for its
results end, and how?

    python -m benchmarks.async_loop --calls 1000 --runs 5 --out benchmarks/data/async-loop.jsonl
    python -m benchmarks.async_loop --modes jit --every 16 ...     (wait for a result every 16)
    python -m benchmarks.async_loop --modes jit --pjrt-nproc 16 ...  (XLA's pool: 16 threads)
    python -m benchmarks.async_loop --exchange alltoall ...         (XLA's collectives)
    python -m benchmarks.async_loop table benchmarks/data/async-loop.jsonl

Each run is a process of its own with 8 simulated CPU devices: a brick -> brick round trip
(`pencilfft.ifftn(pencilfft.fftn(a))`, complex64) on a (2, 2, 2) mesh, called --calls times in
a Python loop, jitted or eager, each call on the result of the one before, without waiting for
a result (or waiting for one every --every calls), then the result against numpy's.  A run
completes (its error against numpy's round trip), fails (the error raised, how long the loop
took, and whether the error says why: the devices that never started and the way out), or
hangs (killed after --limit seconds; XLA's own collectives abort the process after 40 s).

Why a loop can hang: XLA's CPU client runs each device's part of a call on one of max(cores,
devices) threads, and a call dispatched while 32 before it are unfinished waits on one of those
same threads; where there are fewer than twice as many cores as devices, the waiting calls can
hold every thread while some devices of an earlier call have not started, and the devices that
did start wait for them in the exchange.  PJRT_NPROC sets the pool's size (XLA's variable).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[1]
MODES = ("jit", "eager")
USES_JAX = False  # the parent starts a process per run; each starts its own jax
# What the error of a loop that failed must say: who waited for whom, and the way out.
CAUSE = ("waited", "never started", "PJRT_NPROC")


def _loop(shape: Sequence[int], mode: str, calls: int, every: int, exchange: str) -> dict:
    """One run, in this process: the loop, timed from its first call to its result."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import pencilfft

    mesh = harness.make_mesh((2, 2, 2), names=("x", "y", "z"))
    x = harness.make_input(shape, NamedSharding(mesh, P("x", "y", "z")), "complex64", 0)
    x0 = np.asarray(x)

    def round_trip(a):
        return pencilfft.ifftn(pencilfft.fftn(a, exchange=exchange), exchange=exchange)

    f = jax.jit(round_trip) if mode == "jit" else round_trip
    y = jax.block_until_ready(f(x))  # compiled (eager: its programs too), and run once
    start = time.monotonic()
    done = 0
    try:
        for done in range(1, calls + 1):
            y = f(y)
            if every and done % every == 0:
                y.block_until_ready()
        got = np.asarray(y)
    except Exception as e:  # (XLA prefixes the error of every call that took a failed input)
        message = re.sub(r"(Error dispatching computation: )+", "", str(e))
        return {"outcome": "failed", "seconds": time.monotonic() - start, "dispatched": done,
                "error": message[:4000], "cause_named": all(w in message for w in CAUSE)}
    ref = np.fft.ifftn(np.fft.fftn(x0.astype(np.complex128)))  # numpy's round trip
    return {"outcome": "completed", "seconds": time.monotonic() - start, "dispatched": calls,
            "rel_err": float(np.abs(got - ref).max() / np.abs(ref).max())}


def child(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """One run (a process of the parent's): its context first (a run that hangs is killed),
    then its record."""
    import pencilfft

    pencilfft.initialize()
    ctx = harness.context("benchmarks.async_loop", sys.argv[1:])
    print("CONTEXT " + json.dumps(harness.stamp(ctx)), flush=True)
    (shape,) = args.shapes
    (mode,) = args.modes
    out = _loop(shape, mode, args.calls, args.every, args.exchange)
    print("RECORD " + json.dumps(out), flush=True)
    return iter(())  # the parent writes it


def _status(r: dict[str, Any], calls: int) -> str:
    """ok: completed right, or failed within a minute saying why; wrong: completed wrong;
    error: hung, aborted, or failed without saying why (or after a minute)."""
    if r["outcome"] == "completed":
        return "ok" if r["rel_err"] < 1e-5 * max(calls, 1) else "wrong"  # 1e-5 per round trip
    return ("ok" if r["outcome"] == "failed" and r["cause_named"] and r["seconds"] < 60
            else "error")


def _last_words(stderr: str) -> str:
    """The fatal line of a process that died (XLA's "Termination timeout ..."), else its end."""
    fatal = [line for line in stderr.splitlines() if line.startswith("F")]
    return (fatal[-1] if fatal else stderr[-300:])[:1000]


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """--runs processes per mode, one after the other; a record per run."""
    for mode in args.modes:
        for shape in args.shapes:
            for k in range(args.runs):
                cmd = [sys.executable, "-m", "benchmarks.async_loop", "child", "--modes", mode,
                       "--shapes", harness.fmt_dims(shape), "--calls", str(args.calls),
                       "--every", str(args.every), "--exchange", args.exchange]
                env = {name: v for name, v in os.environ.items() if name != "XLA_FLAGS"}
                env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
                           XLA_FLAGS="--xla_force_host_platform_device_count=8")
                if args.pjrt_nproc:
                    env["PJRT_NPROC"] = str(args.pjrt_nproc)
                harness.say(args, f"{mode}, {harness.fmt_dims(shape)}, run {k + 1} of {args.runs}")
                start, exit_status = time.monotonic(), None
                try:
                    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                          timeout=args.limit)
                    lines, tail = done.stdout.splitlines(), done.stderr[-3000:]
                    exit_status = done.returncode
                except subprocess.TimeoutExpired as e:  # (the child is killed)
                    out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                    lines, tail = out.splitlines(), "killed"
                found = {w: json.loads(line[len(w) + 1:]) for line in lines
                         for w in ("CONTEXT", "RECORD") if line.startswith(w + " ")}
                if "CONTEXT" not in found:
                    raise SystemExit(f"run {k + 1} ({mode}) did not start:\n{tail}")
                # No record: killed at the limit (hung), or the process died (XLA aborts a
                # collective that waited 40 s), its last words kept.
                r = found.get("RECORD") or {
                    "outcome": "hung" if exit_status is None else "aborted", "seconds": None,
                    "wall_s": time.monotonic() - start, "exit_status": exit_status,
                    "error": "" if exit_status is None else _last_words(tail)}
                r.update(tool="async_loop", mode=mode, shape=list(shape), mesh=[2, 2, 2],
                         dtype="complex64", calls=args.calls, every=args.every,
                         exchange=args.exchange, pjrt_nproc=args.pjrt_nproc, run=k + 1,
                         limit_s=args.limit, **found["CONTEXT"])
                r["command"] = f"python -m benchmarks.async_loop {' '.join(sys.argv[1:])}"
                r["status"] = _status(r, args.calls)
                if r["status"] != "ok":
                    r["note"] = r.get("error", "")[:300] or (
                        f"{r['outcome']}" + (f", rel. error {r['rel_err']:.1e}" if "rel_err" in r
                                             else f" after {args.limit:.0f} s"))
                yield [r]


def table(records: Sequence[dict[str, Any]]) -> str:
    """One row per setting: runs, how they ended, the slowest loop, the largest error."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        key = (r["mode"], r["exchange"], harness.fmt_dims(r["shape"]), r["calls"],
               r["every"] or "never", r["pjrt_nproc"] or "")
        groups.setdefault(key, []).append(r)
    rows = []
    for key, rs in groups.items():
        ends = [r["outcome"] for r in rs]
        secs = [r["seconds"] if r["seconds"] is not None else r["wall_s"] for r in rs]
        errs = [r["rel_err"] for r in rs if r["outcome"] == "completed"]
        named = sum(r["outcome"] == "failed" and r["cause_named"] for r in rs)
        rows.append([*key, len(rs), ends.count("completed"), ends.count("failed"), named,
                     ends.count("aborted"), ends.count("hung"), f"{max(secs):.1f}",
                     f"{max(errs):.1e}" if errs else ""])
    cores = sorted({r["machine"]["cores"] for r in records})
    return harness.md_table(
        ["mode", "exchange", "grid", "calls", "wait every", "PJRT_NPROC", "runs", "completed",
         "failed", "saying why", "aborted", "hung", "slowest (s)", "max rel. error"], rows,
        "l" * 6 + "r" * 8, note=(
            f"8 simulated CPU devices on {'/'.join(map(str, cores))} cores, a (2, 2, 2) "
            "mesh, complex64 brick -> brick round trips, each call on the result of the one "
            "before. Slowest: a loop's time from its first call to its result or error; for "
            "a process that died (aborted: XLA ends a collective that waited 40 s) or was "
            "killed (hung), the process's whole life. Load "
            f"{harness.load_range(records)}."))


OPTIONS = dict(shapes=["64"], exchange="auto", out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="jit and/or eager (default both)")
    p.add_argument("--calls", type=int, default=1000, help="round trips per run (default 1000)")
    p.add_argument("--runs", type=int, default=5, help="processes per mode (default 5)")
    p.add_argument("--every", type=int, default=0,
                   help="wait for a result every N calls (default 0: never)")
    p.add_argument("--pjrt-nproc", type=int, default=None,
                   help="PJRT_NPROC for the runs: the size of XLA's CPU thread pool")
    p.add_argument("--limit", type=float, default=300,
                   help="seconds a run may take before it counts as hung (default 300)")


PARTS = {"run": (run, "async-loop"), "child": (child, "async-loop")}
TABLES = {"async-loop": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
