"""Ensembles on meshes with batch axes: pencilfft beside jaxdecomp's vmapped transform.

    python -m benchmarks.batch --devices 8 --fields 8 --shape 128 --meshes 2x2x2 1x4x2 \\
        --repeats 5 --out benchmarks/data/batch-128.jsonl

`fields` grids of `shape`^3 complex64, stacked on a leading axis split by the mesh's first axis
(an Auto mesh (c, x, y): jaxdecomp needs Auto axes), forward then inverse transform under
`jax.jit`, the way jaxdecomp's users call it: `jax.vmap(pfft3d)` over the sharded axis, and
pencilfft also on the 4-D array.  Per case: the median seconds, the per-device peak memory of
the compiled program (XLA's memory analysis: arguments + outputs + temporaries), and the
round trip's error.  `python -m benchmarks.results` makes RESULTS.md's table from the records.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import harness

IMPLS = ("pencilfft-vmap", "pencilfft-4d", "jaxdecomp-vmap")


def _programs(impl: str):
    """The jitted forward + inverse pair of `impl` on the (fields, X, Y, Z) array."""
    import jax

    if impl.startswith("pencilfft"):
        import pencilfft as lib
    else:
        from jaxdecomp import fft as lib  # where its users call it
    pair = lambda v: lib.pifft3d(lib.pfft3d(v))  # noqa: E731
    return jax.jit(pair if impl.endswith("4d") else jax.vmap(pair))


def run_case(impl: str, mesh_shape: tuple[int, ...], fields: int, n: int, repeats: int,
             seed: int = 0) -> dict[str, Any]:
    import jax
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    from pencilfft._measure import max_rel_err, median_time

    mesh = jax.make_mesh(mesh_shape, ("c", "x", "y"), axis_types=(AxisType.Auto,) * 3)
    shape = (fields, n, n, n)
    x = harness.make_input(shape, NamedSharding(mesh, P("c", "x", "y")), "complex64", seed)
    record = {"impl": impl, "mesh": list(mesh_shape), "fields": fields, "shape": [n] * 3,
              "dtype": "complex64", "repeats": repeats, "loadavg": harness.loadavg(),
              "machine": harness.machine_info(), "versions": harness.versions()}
    try:
        f = _programs(impl)
        compiled = f.lower(x).compile()
        err = max_rel_err(f(x), x)
        record.update(status="ok", median_s=median_time(f, x, repeats=repeats), err=err,
                      memory=harness.memory_stats(compiled),
                      all_gather="all-gather" in compiled.as_text())
    except Exception as e:  # noqa: BLE001 - a library that cannot run a case is a result too
        record.update(status=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    return record


def table(records: list[dict[str, Any]]) -> str:
    """One row per mesh: each implementation's median ms and per-device peak MiB."""
    latest = {(r["impl"], tuple(r["mesh"])): r for r in records}
    meshes = list(dict.fromkeys(tuple(r["mesh"]) for r in records))
    head = ["mesh (c, x, y)"] + [f"{i} ms / MiB" for i in IMPLS] + ["jaxdecomp / pencilfft-vmap"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for m in meshes:
        cells, times = [], {}
        for impl in IMPLS:
            r = latest.get((impl, m))
            if r is None or r["status"] != "ok":
                cells.append("-" if r is None else r["status"].split(":")[0])
                continue
            times[impl] = r["median_s"]
            mem = r["memory"]["total"]
            cells.append(f"{r['median_s'] * 1e3:.0f} / "
                         f"{mem / 2**20:.0f}" + (" (all-gather)" if r["all_gather"] else ""))
        ratio = (f"{times['jaxdecomp-vmap'] / times['pencilfft-vmap']:.2f}"
                 if {"jaxdecomp-vmap", "pencilfft-vmap"} <= set(times) else "-")
        lines.append("| " + " | ".join([harness.fmt_dims(m)] + cells + [ratio]) + " |")
    r0 = records[0]
    lines += ["", f"{r0['fields']} fields of {harness.fmt_dims(r0['shape'])} {r0['dtype']}, "
                  f"forward + inverse under jax.jit, median of {r0['repeats']}; MiB: per-device "
                  f"arguments + outputs + temporaries (XLA's memory analysis)."]
    return "\n".join(lines)


def _mesh(text: str) -> tuple[int, int, int]:
    try:
        dims = tuple(int(n) for n in text.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"a mesh is 3 positive sizes (c, x, y), e.g. 2x2x2; "
                                         f"got {text!r}")
    return dims


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batch", description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--shape", type=int, default=128, help="N: each field is N^3")
    p.add_argument("--meshes", nargs="+", type=_mesh, default=[(2, 2, 2), (1, 4, 2)])
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", help="append JSON records to this file")
    args = p.parse_args(argv)
    harness.configure_devices(args.devices)
    records = []
    for mesh in args.meshes:
        for impl in args.impls:
            r = run_case(impl, mesh, args.fields, args.shape, args.repeats)
            records.append(r)
            print(json.dumps({k: r.get(k) for k in ("impl", "mesh", "status", "median_s", "err")}),
                  flush=True)
            if args.out:
                with open(args.out, "a", encoding="utf-8") as f:
                    f.write(json.dumps(r) + "\n")
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
