"""The margin over jaxdecomp, in the way its users call it, and the distance to the copy floor.

    python -m benchmarks.margin --devices 8 --shapes 128 256 --meshes 8x1 1x8 4x2 2x4 \\
        --repeats 7 --label after --out benchmarks/data/margin.jsonl

Per grid and mesh, one process times side by side (compiled ahead of time, interleaved rounds
as `benchmarks.steps` does, medians), forward + inverse of complex64 data:

* `fftn-1dev`: `jnp.fft.ifftn(jnp.fft.fftn(x))` on one device, the reference of every ratio;
* `pencilfft` and `jaxdecomp`: `jax.jit(lambda v: pifft3d(pfft3d(v)))` on an array split
  P("x", "y") over an Auto mesh, no mesh in scope (jaxdecomp's users' form; pencilfft then
  takes its compiler-partitioned path, transposed layout);
* the floor's parts on the same blocks: six FFTs along the contiguous axis (the lengths of the
  pipeline's steps, no data movement) and one plain pass over the block.

The floor of a transform is the six FFTs plus, per exchange and direction, three passes
(packing, the in-process collective, unpacking: RESULTS.md "Where the time goes"); a mesh
with one axis of size 1 exchanges once, as a slab.  `--label` tags the records (e.g. before /
after a change) and `python -m benchmarks.results` makes RESULTS.md's table from them.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, steps

IMPLS = ("pencilfft", "jaxdecomp")
PASSES_PER_EXCHANGE = 3


def _roundtrip(lib, **opts):
    return lambda v: lib.pifft3d(lib.pfft3d(v, **opts), **opts)


def _six_ffts_block(lengths: Sequence[int], x):
    """The forward transform's three FFTs and the inverse's three, all along the last axis."""
    import jax.numpy as jnp

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
          exchange: str = "auto"):
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P, SingleDeviceSharding

    mesh = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[: math.prod(pdims)])
    x = harness.make_input(shape, NamedSharding(mesh, P("x", "y")), "complex64", seed)
    one = jax.device_put(x, SingleDeviceSharding(jax.devices()[0]))
    programs = [steps.Program("fftn-1dev", "reference",
                              lambda v: jnp.fft.ifftn(jnp.fft.fftn(v)), one)]
    for impl in impls:
        opts = {}
        if impl == "pencilfft":
            import pencilfft as lib
            opts = {"exchange": exchange} if exchange != "auto" else {}
        else:
            try:
                from jaxdecomp import fft as lib
            except ImportError:
                continue
        programs.append(steps.Program(impl, "full", _roundtrip(lib, **opts), x))

    def per_device(block_fn):
        return jax.shard_map(block_fn, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"))

    lengths = (shape[2], shape[1], shape[0])
    programs.append(steps.Program("6 local FFTs", "floor",
                                  per_device(functools.partial(_six_ffts_block, lengths)), x))
    programs.append(steps.Program(steps.LOCAL_COPY, "floor", per_device(steps.local_copy_block), x))
    return programs


def run_case(shape, pdims, impls, repeats: int, warmup: int, label: str, seed: int = 0,
             exchange: str = "auto"):
    import jax

    from pencilfft._measure import max_rel_err

    programs = build(shape, pdims, impls, seed, exchange)
    records, by = [], {}
    for p in programs:
        try:
            p.compiled = jax.jit(p.fn).lower(p.arg).compile()
        except Exception as e:  # noqa: BLE001 - a library that cannot run a case is a result
            p.compiled = None
            by[p.name] = {"status": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    ok = [p for p in programs if p.compiled is not None]
    steps.time_programs(ok, repeats, warmup)
    for p in ok:
        r = {"status": "ok", "median_s": statistics.median(p.times), "mad_s": steps.mad(p.times)}
        if p.kind == "full":
            r["err"] = max_rel_err(p.compiled(p.arg), p.arg)
            r["all_gather"] = "all-gather" in p.compiled.as_text()
        by[p.name] = r
    base = {"shape": list(shape), "pdims": list(pdims), "dtype": "complex64", "label": label,
            "repeats": repeats, "exchanges": exchanges(pdims), "exchange": exchange,
            "machine": {**harness.machine_info(), "loadavg_1m": harness.loadavg()},
            "versions": harness.versions()}
    for name, r in by.items():
        records.append({**base, "program": name, **r})
    return records


def floor_seconds(by: dict[str, dict]) -> float:
    """Six local FFTs + 3 passes per exchange and direction (see the module docstring)."""
    n = by["fftn-1dev"]["exchanges"]
    return by["6 local FFTs"]["median_s"] + 2 * PASSES_PER_EXCHANGE * n * by[steps.LOCAL_COPY]["median_s"]


def table(records: list[dict[str, Any]]) -> str:
    """One row per (grid, mesh, label): times and ratios to one device, jaxdecomp / pencilfft,
    the floor and pencilfft / floor."""
    cases: dict[tuple, dict[str, dict]] = {}
    for r in records:
        cases.setdefault((tuple(r["shape"]), tuple(r["pdims"]), r["label"]), {})[r["program"]] = r
    head = ["grid", "mesh", "code", "one device ms", "pencilfft ms (vs one device)",
            "jaxdecomp ms (vs one device)", "jaxdecomp / pencilfft", "floor ms (vs one device)",
            "pencilfft / floor"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    order = sorted(cases, key=lambda c: (c[0], c[1], c[2] != "before", c[2]))
    for shape, pdims, label in order:
        by = cases[(shape, pdims, label)]
        one = by["fftn-1dev"]["median_s"]

        def cell(name):
            r = by.get(name)
            if r is None:
                return "—"
            if r["status"] != "ok":
                return r["status"].split(":")[0]
            return f"{r['median_s'] * 1e3:.0f} ({r['median_s'] / one:.2f})"

        t = {n: by[n]["median_s"] for n in IMPLS if by.get(n, {}).get("status") == "ok"}
        floor = floor_seconds(by)
        ratio = f"{t['jaxdecomp'] / t['pencilfft']:.2f}" if len(t) == 2 else "—"
        vs_floor = f"{t['pencilfft'] / floor:.2f}" if "pencilfft" in t else "—"
        lines.append(f"| {harness.fmt_dims(shape)} | {harness.fmt_dims(pdims)} | {label} | "
                     f"{one * 1e3:.0f} | {cell('pencilfft')} | {cell('jaxdecomp')} | {ratio} | "
                     f"{floor * 1e3:.0f} ({floor / one:.2f}) | {vs_floor} |")
    r0 = records[0]
    lines += ["", f"complex64, forward + inverse under jax.jit on an Auto mesh, medians of "
                  f"{r0['repeats']} interleaved rounds; load average when a case ended: "
                  f"{harness.load_range(records)}."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.margin", description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    p.add_argument("--shapes", nargs="+", type=int, default=[128, 256], help="N: grids of N^3")
    p.add_argument("--meshes", nargs="+", type=harness.parse_pxq, default=[(8, 1), (1, 8), (4, 2), (2, 4)])
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--exchange", default="auto", choices=("auto", "alltoall", "pairwise"),
                   help="pencilfft's `exchange` (default: auto, what users get)")
    p.add_argument("--label", default="after", help="tag of these records (default: after)")
    p.add_argument("--out", type=Path, help="append JSON records to this file")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    harness.configure_devices(args.devices)
    records = []
    for n in args.shapes:
        for pdims in args.meshes:
            case = run_case((n, n, n), pdims, args.impls, args.repeats, args.warmup, args.label,
                            exchange=args.exchange)
            records += case
            print(json.dumps({r["program"]: (r.get("median_s"), r["status"]) for r in case}
                             | {"shape": n, "pdims": pdims}), flush=True)
            steps.write_records(args.out, case)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
