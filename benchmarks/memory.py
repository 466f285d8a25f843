"""Per-device memory of pencilfft's compiled transforms, from XLA's memory analysis (no timing).

    python -m benchmarks.memory --shapes 256
    python -m benchmarks.memory --shapes 256 --transforms r2c --axis-type auto

Every mesh, layout, transform (c2c, r2c), direction and donation is compiled for an abstract
argument (nothing allocated): per-device bytes of arguments, outputs, temporaries and aliased
outputs, peak = arg + out + temp - alias, in local input blocks (`arg` is 1) and MiB.
`--axis-type auto`: jit with nothing in scope (the compiler-partitioned path).
"""
from __future__ import annotations

import argparse
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

import pencilfft
from benchmarks import harness
from benchmarks.harness import DIRECTIONS, fmt_dims

TRANSFORMS = {"c2c": ("pfft3d", "pifft3d"), "r2c": ("prfft3d", "pirfft3d")}
SIZES = ("arg", "out", "temp", "alias", "peak")


def transform_fns(transform: str, layout: str, shape: Sequence[int],
                  exchange: str) -> dict[str, Callable[[Any], Any]]:
    """direction -> the pencilfft call (the inverse crops to the real-space `shape`)."""
    fwd, inv = (getattr(pencilfft, name) for name in TRANSFORMS[transform])
    opts = {"layout": layout, "exchange": exchange}  # (s: a keyword of both inverses)
    return {"forward": lambda x: fwd(x, **opts), "inverse": lambda k: inv(k, s=tuple(shape), **opts)}


def arguments(fns: dict[str, Callable[[Any], Any]], shape: Sequence[int], dtype: str,
              transform: str, layout: str, mesh) -> dict[str, Any]:
    """direction -> its abstract argument: real space, or the forward's k-space output."""
    in_dtype = harness.REAL_DTYPE[dtype] if transform == "r2c" else dtype
    x = jax.ShapeDtypeStruct(tuple(shape), in_dtype, sharding=pencilfft.real_space_sharding(mesh))
    k = jax.eval_shape(fns["forward"], x)
    k = jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=pencilfft.k_space_sharding(mesh, layout))
    return {"forward": x, "inverse": k}


def block_bytes(arg, n_devices: int) -> int:
    """Bytes of one device's block of the global argument `arg` (evenly split over the mesh)."""
    return math.prod(arg.shape) * np.dtype(arg.dtype).itemsize // n_devices


def analyse(fn: Callable[[Any], Any], arg, donate: bool) -> dict[str, int]:
    """Per-device bytes of `fn` compiled for `arg`: arg, out, temp, alias and peak."""
    with warnings.catch_warnings():
        # A donated input whose buffer no output can take is only a warning in jax: the alias
        # column shows whether the donation was used.
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable")
        compiled = jax.jit(fn, donate_argnums=(0,) if donate else ()).lower(arg).compile()
    stats = harness.memory_stats(compiled)
    if stats["total"] is None:
        raise SystemExit("error: this backend gives no memory analysis of compiled programs")
    out = {"arg": stats["argument"], "out": stats["output"], "temp": stats["temp"],
           "alias": stats["alias"] or 0}
    out["peak"] = out["arg"] + out["out"] + out["temp"] - out["alias"]
    return out


def case_records(case: harness.Case, args: argparse.Namespace,
                 ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (layout, transform, direction, donation) on one mesh."""
    mesh = harness.make_mesh(case.pdims, args.axis_type)
    records = []
    for layout in args.layouts:
        for transform in args.transforms:
            fns = transform_fns(transform, layout, case.shape, args.exchange)
            structs = arguments(fns, case.shape, case.dtype, transform, layout, mesh)
            for direction in DIRECTIONS:
                block = block_bytes(structs[direction], mesh.size)
                for donate in (False, True):
                    sizes = analyse(fns[direction], structs[direction], donate)
                    records.append({
                        "tool": "memory", "shape": list(case.shape), "dtype": case.dtype,
                        "pdims": list(case.pdims), "exchange": args.exchange, "layout": layout,
                        "transform": transform, "direction": direction, "donate": donate,
                        "block_bytes": block, "axis_type": args.axis_type,
                        **{f"{k}_bytes": v for k, v in sizes.items()},
                        **{f"{k}_blocks": v / block for k, v in sizes.items()}, **ctx})
    return records


def memory_table(records: list[dict]) -> str:
    """Peaks in local input blocks per (transform, mesh, layout), direction and donation."""
    latest = harness.latest(records, lambda r: (r["transform"], tuple(r["pdims"]), r["layout"],
                                                r["direction"], r["donate"]))
    keys = list(dict.fromkeys(k[:3] for k in latest))
    several = len({k[0] for k in keys}) > 1
    head = (["transform"] if several else []) + ["pdims", "layout"] + [
        f"{d}{', donated' if donate else ''}" for d in DIRECTIONS for donate in (False, True)]
    rows = [([transform] if several else []) + [fmt_dims(pdims), layout] + [
        f"{latest[(transform, pdims, layout, d, donate)]['peak_blocks']:.2f}"
        for d in DIRECTIONS for donate in (False, True)] for transform, pdims, layout in keys]
    r0 = records[0]
    return harness.md_table(head, rows, "ll" + "r" * (len(head) - 2), (
        f"{fmt_dims(r0['shape'])} {r0['dtype']}, exchange {r0['exchange']}; a local block is "
        f"{r0['block_bytes'] / 2**20:.3g} MiB."))


# ----------------------------------------------------------------------------------------------
# The command line (benchmarks.harness.main)

OPTIONS = dict(devices=8, shapes=["256"], pdims=["1x8", "2x4", "4x2", "8x1"],
               dtypes=dict(default=["complex64"], choices=harness.DTYPES), exchange="auto", out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layouts", nargs="+", choices=harness.LAYOUTS, default=list(harness.LAYOUTS))
    p.add_argument("--transforms", nargs="+", choices=list(TRANSFORMS), default=list(TRANSFORMS),
                   help="c2c (pfft3d/pifft3d), r2c (prfft3d/pirfft3d) (default: both)")
    p.add_argument("--axis-type", choices=("explicit", "auto"), default="explicit",
                   help="the mesh's axis types: explicit (the mesh in the traced type) or auto "
                        "(jit with nothing in scope: the compiler-partitioned path)")


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    for case in harness.make_cases(args, jax.device_count()):
        yield case_records(case, args, ctx)


TABLES = {"memory": memory_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
