"""Ensembles on meshes with batch axes: pencilfft beside jaxdecomp's vmapped transform.

    python -m benchmarks.batch --devices 8 --fields 8 --shapes 128 --pdims 2x2x2 1x4x2 \\
        --repeats 5 --out benchmarks/data/batch-128.jsonl

`fields` grids stacked on an axis split by the Auto mesh's first axis (c, x, y), forward +
inverse under jit: `jax.vmap` of each library's pair, and pencilfft on the 4-D array; medians of
the harness's loop, XLA's memory per device, the round trip's error.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from benchmarks import harness, private

IMPLS = ("pencilfft-vmap", "pencilfft-4d", "jaxdecomp-vmap")


def _program(impl: str):
    """The jitted forward + inverse pair of `impl` on the (fields, X, Y, Z) array."""
    lib = pencilfft if impl.startswith("pencilfft") else importlib.import_module("jaxdecomp.fft")
    pair = lambda v: lib.pifft3d(lib.pfft3d(v))  # noqa: E731
    return jax.jit(pair if impl.endswith("4d") else jax.vmap(pair))


def run_case(shape, mesh_shape: tuple[int, ...], args: argparse.Namespace,
             ctx: dict[str, Any]) -> list[dict[str, Any]]:
    n = shape[0]
    mesh = harness.make_mesh(mesh_shape, "auto", ("c", "x", "y"))
    x = harness.make_input((args.fields, n, n, n), NamedSharding(mesh, P("c", "x", "y")),
                           "complex64", args.seed)
    base = {"mesh": list(mesh_shape), "fields": args.fields, "shape": [n] * 3, "dtype": "complex64",
            "repeats": args.repeats, "loadavg": harness.loadavg(), **harness.stamp(ctx)}
    records, programs = {}, []
    for impl in args.impls:
        try:
            p = harness.Program(impl, "full", _program(impl), x)
            p.compile()
            records[impl] = {"status": "ok", "err": private.max_rel_err(p.compiled(x), x),
                             "memory": harness.memory_stats(p.compiled),
                             "all_gather": "all-gather" in p.compiled.as_text()}
            programs.append(p)
        except Exception as e:  # noqa: BLE001 - a library that cannot run a case is a result too
            records[impl] = {"status": harness.failure(e)}
    harness.time_programs(programs, args.repeats, args.warmup)
    for p in programs:
        records[p.name]["median_s"] = statistics.median(p.times)
    return [{"impl": impl, **base, **r} for impl, r in records.items()]


def table(records: list[dict[str, Any]]) -> str:
    """One row per mesh: each implementation's median ms and per-device peak MiB."""
    latest = {(r["impl"], tuple(r["mesh"])): r for r in records}
    rows = []
    for m in dict.fromkeys(tuple(r["mesh"]) for r in records):
        cells, times = [], {}
        for impl in IMPLS:
            r = latest.get((impl, m))
            if r is None or r["status"] != "ok":
                cells.append("-" if r is None else r["status"].split(":")[0])
                continue
            times[impl] = r["median_s"]
            cells.append(f"{r['median_s'] * 1e3:.0f} / {r['memory']['total'] / 2**20:.0f}"
                         + (" (all-gather)" if r["all_gather"] else ""))
        ratio = (f"{times['jaxdecomp-vmap'] / times['pencilfft-vmap']:.2f}"
                 if {"jaxdecomp-vmap", "pencilfft-vmap"} <= set(times) else "-")
        rows.append([harness.fmt_dims(m)] + cells + [ratio])
    r0 = records[0]
    head = ["mesh (c, x, y)"] + [f"{i} ms / MiB" for i in IMPLS] + ["jaxdecomp / pencilfft-vmap"]
    return harness.md_table(head, rows, "l" + "r" * (len(head) - 1), (
        f"{r0['fields']} fields of {harness.fmt_dims(r0['shape'])} {r0['dtype']}, forward + "
        f"inverse under jax.jit, median of {r0['repeats']}; MiB: per-device arguments + outputs "
        f"+ temporaries (XLA's memory analysis)."))


def _mesh(text: str) -> tuple[int, ...]:
    return harness.parse_dims(text, "mesh", "3 positive sizes (c, x, y), e.g. 2x2x2", (3,))


OPTIONS = dict(devices=8, shapes=["128"], pdims=dict(default=["2x2x2", "1x4x2"], type=_mesh),
               repeats=5, warmup=1, seed=0, out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))


TABLES = {"batch": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
