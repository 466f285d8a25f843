"""Resident memory of a long particle-mesh run: does a process's RSS stay flat step after step?

    python -m benchmarks.pm_rss --shapes 128 --pdims 4x2 --steps 1500 \\
        --out benchmarks/data/pm-rss-128.jsonl
    python -m benchmarks.pm_rss --program paint+readout --steps 600 --out ...
    MALLOC_ARENA_MAX=1 python -m benchmarks.pm_rss ...          (glibc's own setting: a row)

One jitted program called `--steps` times in a Python loop, on an Explicit mesh of 8 simulated
CPU devices, one particle per cell (float32): `step` a PM step as examples/pm_step.py's
(`pencilfft.paint`, `prfft3d`, the Poisson and gradient kernels, three `pirfft3d`,
`pencilfft.readout` of the 3 force components, a kick and a drift), `paint+readout` its
particle half alone, `fft` its FFT half alone (no painting).  Every `--every` steps the
process's VmRSS (/proc/self/status) and glibc's own count (`mallinfo2`: bytes in use by live
blocks, and bytes free but kept by the allocator) are sampled.  Issue 57 saw the 128^3 step
creep (+49 MB over 1,500 steps): what matters is which of the two grows.  One program per
process (RSS is the process's): run the command once per program; each run appends a record.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from benchmarks import harness, private

PROGRAMS = ("step", "paint+readout", "fft")


# ----------------------------------------------------------------------------------------------
# What the process holds


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    """glibc's mallinfo2 (2.33+), or None (another C library, an older glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        f = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = _MallInfo2
    return f


def sample() -> dict[str, float | None]:
    """VmRSS, and glibc's bytes in use / free but kept (all arenas and mmaps), in MiB."""
    rss = None
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    info = _mallinfo2()
    if info is None:
        return {"rss_mib": rss, "in_use_mib": None, "kept_mib": None}
    m = info()
    return {"rss_mib": rss, "in_use_mib": (m.uordblks + m.hblkhd) / 2**20,
            "kept_mib": m.fordblks / 2**20}


# ----------------------------------------------------------------------------------------------
# The programs


def _kernels(k, shape):
    kx, ky, kz = pencilfft.rfftfreq3d(k, s=shape)
    k2 = kx**2 + ky**2 + kz**2
    inv_k2 = jnp.where(k2 == 0, 0, 1 / jnp.where(k2 == 0, 1, k2))
    return inv_k2, [1j * (8 * jnp.sin(w) - jnp.sin(2 * w)) / 6 for w in (kx, ky, kz)]


def programs(shape: Sequence[int], dt: float = 1e-3) -> dict[str, Any]:
    """name -> the jitted function of (dx, v) -> (dx, v) that one call runs."""
    shape = tuple(shape)

    def forces(rho):
        k = pencilfft.prfft3d(rho)
        inv_k2, grads = _kernels(k, shape)
        return jnp.stack([pencilfft.pirfft3d(g * k * inv_k2, shape) for g in grads])

    def step(dx, v):  # kick-drift: the state stays within the halo for thousands of steps
        f = forces(pencilfft.paint(dx))
        v = v + dt * jnp.moveaxis(pencilfft.readout(f, dx), 0, -1)
        return dx + dt * v, v

    def paint_readout(dx, v):
        rho = pencilfft.paint(dx)
        f = jnp.stack([rho, 2 * rho, 3 * rho])
        return dx, v + dt * jnp.moveaxis(pencilfft.readout(f, dx), 0, -1)

    def fft(dx, v):
        f = forces(dx[..., 0] + 1)
        return dx, v + dt * jnp.moveaxis(f, 0, -1)

    return {"step": jax.jit(step), "paint+readout": jax.jit(paint_readout), "fft": jax.jit(fft)}


def run_case(shape, pdims, args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict]:
    mesh = harness.make_mesh(pdims)
    sharding = NamedSharding(mesh, P("x", "y"))
    rng = np.random.default_rng(args.seed)
    dx = jax.device_put((0.3 * rng.standard_normal(tuple(shape) + (3,))).astype(np.float32),
                        sharding)
    v = jax.device_put(np.zeros(tuple(shape) + (3,), np.float32), sharding)
    f = programs(shape)[args.program]
    state = jax.block_until_ready(f(dx, v))  # compiled, and run once
    samples = [{"step": 1, **sample()}]
    harness.say(args, f"{harness.fmt_dims(shape)} on {harness.fmt_dims(pdims)}, {args.program}: "
                      f"RSS {samples[0]['rss_mib']:.0f} MiB after the first call")
    start = time.perf_counter()
    for i in range(2, args.steps + 1):
        state = jax.block_until_ready(f(*state))
        if i % args.every == 0 or i == args.steps:
            samples.append({"step": i, **sample()})
            harness.say(args, f"  step {i}: " + ", ".join(
                f"{k} {v:.1f}" for k, v in samples[-1].items() if k != "step" and v is not None))
    seconds = time.perf_counter() - start
    finite = bool(np.isfinite(np.asarray(state[0])).all())
    env = {k: os.environ[k] for k in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_",
                                      "MALLOC_TRIM_THRESHOLD_", "PENCILFFT_MALLOC",
                                      "PENCILFFT_PAINT_KERNEL", "GLIBC_TUNABLES")
           if k in os.environ}
    return [{"tool": "pm_rss", "program": args.program, "shape": list(shape),
             "pdims": list(pdims), "dtype": "float32", "steps": args.steps,
             "every": args.every, "status": "ok" if finite else "wrong",
             "seconds_per_step": seconds / max(args.steps - 1, 1), "malloc_env": env,
             "allocator": private.malloc.describe(), "samples": samples, **harness.stamp(ctx)}]


# ----------------------------------------------------------------------------------------------
# The table


def _at(samples: list[dict], step: int) -> dict:
    """The last sample at or before `step`."""
    return [s for s in samples if s["step"] <= step][-1]


def _mib(value) -> str:
    return "" if value is None else f"{value:.0f}"


def table(records: Sequence[dict[str, Any]]) -> str:
    """One row per run: RSS after the first call, at 1/3, 2/3 and the end of the run; the
    growth over its last third; glibc's in-use and kept bytes at the end."""
    rows = []
    for r in records:
        s, n = r["samples"], r["steps"]
        first, third, two, last = s[0], _at(s, n // 3), _at(s, 2 * n // 3), s[-1]
        in_use = [x["in_use_mib"] for x in s if x["in_use_mib"] is not None]
        malloc = ", ".join(f"{k}={v}" for k, v in r["malloc_env"].items()) or "pencilfft's"
        rows.append([harness.fmt_dims(r["shape"]), harness.fmt_dims(r["pdims"]), r["program"],
                     malloc, n, f"{r['seconds_per_step'] * 1e3:.0f}", _mib(first["rss_mib"]),
                     _mib(third["rss_mib"]), _mib(two["rss_mib"]), _mib(last["rss_mib"]),
                     f"{last['rss_mib'] - two['rss_mib']:+.0f}",
                     f"{min(in_use):.0f}-{max(in_use):.0f}" if in_use else "",
                     _mib(last["kept_mib"])])
    return harness.md_table(
        ["grid", "mesh", "program", "malloc", "steps", "ms / step", "RSS after call 1",
         "at 1/3", "at 2/3", "at end", "last third", "glibc in use", "glibc kept at end"], rows,
        "llll" + "r" * 9, (
            "float32, one particle per cell, 8 simulated CPU devices in one process, one jitted "
            "call per step in a Python loop; MiB. RSS: VmRSS; glibc in use: bytes of live blocks "
            "(least-most over the samples), kept: freed bytes glibc holds for reuse (mallinfo2); "
            "malloc: the environment (nothing set: pencilfft's own settings, `_native/malloc.py`). "
            f"Times shared the machine (load average {harness.load_range(records)})."))


OPTIONS = dict(devices=8, shapes=["128"], pdims=dict(default=["4x2"], type=harness.parse_pxq),
               seed=0, out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--program", choices=PROGRAMS, default="step",
                   help="step (default), paint+readout or fft: one per process")
    p.add_argument("--steps", type=int, default=1500, help="calls (default 1500)")
    p.add_argument("--every", type=int, default=50, help="sample every N steps (default 50)")


TABLES = {"pm-rss": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
