"""The margin over jaxdecomp, in the way its users call it, and the distance to the copy floor.

    python -m benchmarks.margin --devices 8 --shapes 128 256 --pdims 8x1 1x8 4x2 2x4 \\
        --repeats 7 --tag after --out benchmarks/data/margin.jsonl

Forward + inverse of complex64 data in the harness's loop: `fftn-1dev` (one device, every
ratio's reference); `pencilfft` and `jaxdecomp` as `jax.jit(lambda v: pifft3d(pfft3d(v)))` on
an Auto mesh, no mesh in scope; and the floor's parts on the same blocks, six FFTs along the
contiguous axis and one plain pass.  The floor is the six FFTs plus three passes per exchange
and direction (RESULTS.md "Where the time goes").  `--tag` is the records' "label".
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

from benchmarks import harness, private, steps

IMPLS = ("pencilfft", "jaxdecomp")
PASSES_PER_EXCHANGE = 3


def _six_ffts_block(lengths: Sequence[int], x):
    """The forward transform's three FFTs and the inverse's three, all along the last axis."""
    k = steps.three_ffts_block(lengths, x)
    shape = k.shape
    for n in reversed(lengths):
        rows = k.reshape(-1, n) if k.size % n == 0 else k
        k = jnp.fft.ifft(rows, axis=-1).reshape(shape)
    return k


def exchanges(pdims: Sequence[int]) -> int:
    """Exchanges of one direction: one per mesh axis of more than one device."""
    return sum(1 for n in pdims if n > 1)


def build(shape: tuple[int, int, int], pdims: tuple[int, int], impls: Sequence[str], seed: int,
          exchange: str = "auto") -> list[harness.Program]:
    import importlib

    mesh = harness.make_mesh(pdims, "auto")
    x = harness.make_input(shape, NamedSharding(mesh, P("x", "y")), "complex64", seed)
    one = jax.device_put(x, SingleDeviceSharding(jax.devices()[0]))
    programs = [harness.Program("fftn-1dev", "reference",
                                lambda v: jnp.fft.ifftn(jnp.fft.fftn(v)), one)]
    for impl in impls:
        try:
            lib = importlib.import_module("pencilfft" if impl == "pencilfft" else "jaxdecomp.fft")
        except ImportError:
            continue
        opts = {"exchange": exchange} if impl == "pencilfft" and exchange != "auto" else {}
        programs.append(harness.Program(impl, "full", lambda v, lib=lib, o=opts: lib.pifft3d(
            lib.pfft3d(v, **o), **o), x))

    def per_device(block_fn):
        return jax.shard_map(block_fn, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))

    lengths = (shape[2], shape[1], shape[0])
    programs.append(harness.Program("6 local FFTs", "floor",
                                    per_device(functools.partial(_six_ffts_block, lengths)), x))
    programs.append(harness.Program(steps.LOCAL_COPY, "floor", per_device(steps.local_copy_block), x))
    return programs


def run_case(shape, pdims, args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    programs = build(shape, pdims, args.impls, args.seed, args.exchange)
    by = {}
    for p in programs:
        try:
            p.compile()
        except Exception as e:  # noqa: BLE001 - a library that cannot run a case is a result
            p.ok = False
            by[p.name] = {"status": harness.failure(e)}
    harness.time_programs(programs, args.repeats, args.warmup)
    for p in programs:
        if not p.ok:
            continue
        by[p.name] = {"status": "ok", "median_s": statistics.median(p.times), "mad_s": harness.mad(p.times)}
        if p.kind == "full":
            by[p.name]["err"] = private.max_rel_err(p.compiled(p.arg), p.arg)
            by[p.name]["all_gather"] = "all-gather" in p.compiled.as_text()
    base = {"shape": list(shape), "pdims": list(pdims), "dtype": "complex64", "label": args.tag,
            "repeats": args.repeats, "exchanges": exchanges(pdims), "exchange": args.exchange,
            **harness.stamp(ctx)}
    return [{**base, "program": name, **r} for name, r in by.items()]


def floor_seconds(by: dict[str, dict]) -> float:
    """Six local FFTs + 3 passes per exchange and direction (see the module docstring)."""
    n = by["fftn-1dev"]["exchanges"]
    return by["6 local FFTs"]["median_s"] + 2 * PASSES_PER_EXCHANGE * n * by[steps.LOCAL_COPY]["median_s"]


def table(records: list[dict[str, Any]]) -> str:
    """One row per (grid, mesh, label): times, ratios, the floor."""
    cases: dict[tuple, dict[str, dict]] = {}
    for r in records:
        cases.setdefault((tuple(r["shape"]), tuple(r["pdims"]), r["label"]), {})[r["program"]] = r
    rows = []
    for shape, pdims, label in sorted(cases, key=lambda c: (c[0], c[1], c[2] != "before", c[2])):
        by = cases[(shape, pdims, label)]
        one = by["fftn-1dev"]["median_s"]

        def cell(name):
            r = by.get(name)
            if r is None or r["status"] != "ok":
                return "—" if r is None else r["status"].split(":")[0]
            return f"{r['median_s'] * 1e3:.0f} ({r['median_s'] / one:.2f})"

        t = {n: by[n]["median_s"] for n in IMPLS if by.get(n, {}).get("status") == "ok"}
        floor = floor_seconds(by)
        rows.append([harness.fmt_dims(shape), harness.fmt_dims(pdims), label, f"{one * 1e3:.0f}",
                     cell("pencilfft"), cell("jaxdecomp"),
                     f"{t['jaxdecomp'] / t['pencilfft']:.2f}" if len(t) == 2 else "—",
                     f"{floor * 1e3:.0f} ({floor / one:.2f})",
                     f"{t['pencilfft'] / floor:.2f}" if "pencilfft" in t else "—"])
    head = ["grid", "mesh", "code", "one device ms", "pencilfft ms (vs one device)",
            "jaxdecomp ms (vs one device)", "jaxdecomp / pencilfft", "floor ms (vs one device)",
            "pencilfft / floor"]
    return harness.md_table(head, rows, "lll" + "r" * 6, (
        f"complex64, forward + inverse under jax.jit on an Auto mesh, medians of "
        f"{records[0]['repeats']} interleaved rounds; load average when a case ended: "
        f"{harness.load_range(records)}."))


OPTIONS = dict(devices=8, shapes=["128", "256"],
               pdims=dict(default=["8x1", "1x8", "4x2", "2x4"], type=harness.parse_pxq),
               exchange=dict(default="auto", choices=("auto", "alltoall", "pairwise")),
               repeats=7, warmup=1, seed=0, tag="after", out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))


TABLES = {"margin": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
