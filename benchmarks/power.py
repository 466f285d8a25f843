"""The power spectrum of a sharded field: pencilfft beside JaxPM's function and one device.

    python -m benchmarks.power --devices 8 --shapes 256 --pdims 4x2 1x8 --repeats 5 \\
        --jaxpm path/to/JaxPM/jaxpm/utils.py --out benchmarks/data/power.jsonl

A float32 field's auto spectrum with JaxPM's default bins, in the harness's loop: `pencilfft`
(jit under `jax.set_mesh`) and `pencilfft-jit` (no mesh in scope); `jaxpm`, JaxPM's own
`power_spectrum` loaded from `--jaxpm`, called eagerly as its users do (its bins are numpy
arrays built at every call; its memory is that of its device part, jitted); `fftn-1dev`, one
device's fftn + bincount with the bins on the device.  Memory: XLA's analysis per device.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import math
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

import pencilfft
from benchmarks import harness, private
from benchmarks.harness import Program

PROGRAMS = ("pencilfft", "pencilfft-jit", "jaxpm", "fftn-1dev")


@functools.cache
def load_jaxpm(path: str | None):
    """JaxPM's utils module from a file (or `jaxpm.utils` if installed), or None (no jaxpm row)."""
    if path:
        spec = importlib.util.spec_from_file_location("jaxpm_utils", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module("jaxpm.utils")
    except Exception:  # noqa: BLE001 - JaxPM's package imports many optional dependencies
        print("JaxPM not found: no jaxpm row (--jaxpm path/to/jaxpm/utils.py)", file=sys.stderr)
        return None


def host_bins(shape: Sequence[int]):
    """(bin of every mode, n_bins): JaxPM's default bins, upper bin on edges, on the host."""
    bins, _ = private.plan_bins(tuple(shape))
    kvec = [2 * np.pi * np.fft.fftfreq(n).reshape([-1 if i == d else 1 for i in range(3)])
            for d, n in enumerate(shape)]
    k2 = sum(k ** 2 for k in kvec)
    edges2 = np.asarray(bins.edges) ** 2 * (1 - 1e-9)
    dig = np.searchsorted(edges2, k2.ravel(), side="right").astype(np.int32)
    return dig, bins.n_bins


def build(shape, pdims, jaxpm, seed: int) -> tuple[list[Program], dict[str, Any]]:
    mesh = harness.make_mesh(pdims, "auto")
    x = harness.make_input(shape, NamedSharding(mesh, P("x", "y")), "float32", seed)
    one = jax.device_put(x, SingleDeviceSharding(jax.devices()[0]))
    dig, n_bins = host_bins(shape)
    dig_one = jax.device_put(dig, SingleDeviceSharding(jax.devices()[0]))
    count = np.bincount(dig, minlength=n_bins)
    scale = 1.0 / math.prod(shape)  # |F_ortho|^2 = |F|^2 / N, unit cells

    def one_device(v, d):
        f = jnp.fft.fftn(v)
        sums = jnp.bincount(d, weights=(f.real ** 2 + f.imag ** 2).reshape(-1) * scale,
                            length=n_bins)
        return (sums / count)[1:-1]

    spectrum = jax.jit(lambda v: pencilfft.power_spectrum(v)[1])
    with jax.set_mesh(mesh):  # the mesh known when traced: compiled here, called outside
        known = spectrum.lower(x).compile()
    programs = [Program("pencilfft", "full", spectrum, x, compiled=known),
                Program("pencilfft-jit", "full", spectrum, x, compiled=spectrum.lower(x).compile()),
                Program("fftn-1dev", "reference", jax.jit(one_device), (one, dig_one))]
    programs[2].compiled = programs[2].fn.lower(one, dig_one).compile()
    memory_of = {p.name: p.compiled for p in programs}
    if jaxpm is not None:
        programs.append(Program("jaxpm", "full", lambda v: jaxpm.power_spectrum(v)[1], x))
        # Its device part, for the memory analysis (bin indices replicated, as numpy becomes).
        dig_rep = jax.device_put(dig, NamedSharding(mesh, P()))

        def jaxpm_device(v, d):
            f = jnp.fft.fftn(v, norm="ortho")
            return jnp.bincount(d, weights=(f.real ** 2 + f.imag ** 2).reshape(-1),
                                length=n_bins)

        memory_of["jaxpm"] = jax.jit(jaxpm_device).lower(x, dig_rep).compile()
    return programs, memory_of


def run_case(shape, pdims, args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict]:
    jaxpm = load_jaxpm(args.jaxpm)
    programs, memory_of = build(shape, pdims, jaxpm, args.seed)
    by: dict[str, dict[str, Any]] = {}
    for p in programs:  # call through the argument tuple: time_once takes one argument
        f = p.compiled or p.fn
        p.compiled = (lambda f: (lambda a: f(*a)))(f) if isinstance(p.arg, tuple) else f
    harness.time_programs(programs, args.repeats, args.warmup)
    results = {p.name: np.asarray(p.compiled(p.arg)) for p in programs}
    ref = results["fftn-1dev"]
    for p in programs:
        compiled = memory_of[p.name]
        mem = harness.memory_stats(compiled)
        got = results[p.name]
        by[p.name] = {
            "status": "ok", "median_s": statistics.median(p.times), "mad_s": harness.mad(p.times),
            "times_s": p.times, "mem_bytes": mem["total"], "mem_temp_bytes": mem["temp"],
            "all_gather": "all-gather" in compiled.as_text(),
            "max_rel_err_vs_1dev": float(np.nanmax(np.abs(got - ref)) / np.nanmax(np.abs(ref))),
        }
        if p.name == "jaxpm":
            by[p.name]["memory_of"] = "its device part: fftn + bincount, jitted"
    base = {"tool": "power", "shape": list(shape), "pdims": list(pdims), "dtype": "float32",
            "repeats": args.repeats,
            "field_bytes_per_device": 4 * math.prod(shape) // math.prod(pdims), **harness.stamp(ctx)}
    return [{**base, "program": name, **r} for name, r in by.items()]


def table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (grid, mesh, program): time, ratio to one device, memory per device."""
    cases: dict[tuple, dict[str, dict]] = {}
    for r in records:
        cases.setdefault((tuple(r["shape"]), tuple(r["pdims"])), {})[r["program"]] = r
    rows = [[harness.fmt_dims(shape), harness.fmt_dims(pdims), name, f"{r['median_s'] * 1e3:.0f}",
             f"{r['median_s'] / by['fftn-1dev']['median_s']:.2f}", f"{r['mem_bytes'] / 2**20:.1f}",
             f"{r['mem_bytes'] / r['field_bytes_per_device']:.2f}", "yes" if r["all_gather"] else "no"]
            for (shape, pdims), by in cases.items() for name in PROGRAMS if (r := by.get(name))]
    return harness.md_table(["grid", "mesh", "program", "median ms", "vs one device",
                             "memory per device MiB", "in field blocks", "all-gather"], rows,
                            "lll" + "r" * 5, (
        f"float32, auto spectrum with JaxPM's default bins, medians of {records[0]['repeats']} "
        f"interleaved rounds; memory: XLA's analysis (arguments + outputs + temporaries; "
        f"fftn-1dev's is on its one device, jaxpm's of its device part); load average when a "
        f"case ended: {harness.load_range(records)}."))


OPTIONS = dict(devices=8, shapes=["256"], pdims=dict(default=["4x2", "1x8"], type=harness.parse_pxq),
               repeats=5, warmup=1, seed=0, out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jaxpm", help="path of JaxPM's jaxpm/utils.py (default: import jaxpm.utils "
                                   "if installed, else no jaxpm row)")


TABLES = {"power": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
