"""Per-device memory of pencilfft's compiled transforms, from XLA's memory analysis (no timing).

    python -m benchmarks.memory --shape 256
    python -m benchmarks.memory --shape 512 --pdims 4x2 --layouts transposed --transforms c2c
    python -m benchmarks.memory --shape 256 --transforms r2c --axis-type auto

For every mesh, layout, transform (c2c: pfft3d / pifft3d, r2c: prfft3d / pirfft3d), direction
and donation (off, or `jax.jit(f, donate_argnums=0)`), the program is lowered for an abstract
argument (`jax.ShapeDtypeStruct` with the input's sharding: nothing is allocated) and compiled,
and `compiled.memory_analysis()` gives per-device bytes of arguments, outputs, temporaries and
of the outputs aliased to (donated) arguments.  peak = arg + out + temp - alias.

`--axis-type auto` puts the argument on an Auto mesh: jit then traces it with nothing in scope
(how jaxdecomp's clients call it), and the compiler-partitioned path runs.

Sizes are reported in units of the local input block (the per-device real-space block of a
forward, the per-device k-space block of an inverse: `arg` is 1 block) and in MiB.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import harness
from benchmarks import steps

TRANSFORMS = {"c2c": ("pfft3d", "pifft3d"), "r2c": ("prfft3d", "pirfft3d")}
DIRECTIONS = ("forward", "inverse")
PARTS = ("arg", "out", "temp", "alias", "peak")


def transform_fns(transform: str, layout: str, shape: Sequence[int],
                  exchange: str) -> dict[str, Callable[[Any], Any]]:
    """direction -> the pencilfft call on a global array (the mesh comes from its sharding).

    `shape` is the global real-space (X, Y, Z): the inverse crops a padded spectrum with it.
    """
    import pencilfft

    fwd, inv = (getattr(pencilfft, name) for name in TRANSFORMS[transform])
    opts = {"layout": layout, "exchange": exchange}
    if transform == "r2c":
        return {"forward": lambda x: fwd(x, **opts), "inverse": lambda k: inv(k, tuple(shape), **opts)}
    return {"forward": lambda x: fwd(x, **opts), "inverse": lambda k: inv(k, s=tuple(shape), **opts)}


def arguments(fns: dict[str, Callable[[Any], Any]], shape: Sequence[int], dtype: str,
              transform: str, layout: str, mesh) -> dict[str, Any]:
    """direction -> abstract global argument with its sharding (ShapeDtypeStruct, no data).

    The forward takes the real-space array (real for r2c); the inverse the forward's k-space
    output, padded where the mesh does not divide it, on pencilfft's k-space sharding.
    """
    import jax

    import pencilfft

    in_dtype = harness.REAL_DTYPE[dtype] if transform == "r2c" else dtype
    x = jax.ShapeDtypeStruct(tuple(shape), in_dtype, sharding=pencilfft.real_space_sharding(mesh))
    k = jax.eval_shape(fns["forward"], x)
    k = jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=pencilfft.k_space_sharding(mesh, layout))
    return {"forward": x, "inverse": k}


def block_bytes(arg, n_devices: int) -> int:
    """Bytes of one device's block of the global argument `arg` (evenly split over the mesh)."""
    import math

    import numpy as np

    return math.prod(arg.shape) * np.dtype(arg.dtype).itemsize // n_devices


def analyse(fn: Callable[[Any], Any], arg, donate: bool) -> dict[str, int]:
    """Per-device bytes of `fn` compiled for `arg`: arg, out, temp, alias and peak."""
    import jax

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


def mesh_records(pdims: Sequence[int], args: argparse.Namespace,
                 context: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (layout, transform, direction, donation) on one mesh."""
    mesh = steps.make_mesh(pdims, args.axis_type)
    records = []
    for layout in args.layouts:
        for transform in args.transforms:
            fns = transform_fns(transform, layout, args.shape, args.exchange)
            structs = arguments(fns, args.shape, args.dtype, transform, layout, mesh)
            for direction in DIRECTIONS:
                block = block_bytes(structs[direction], mesh.size)
                for donate in (False, True):
                    sizes = analyse(fns[direction], structs[direction], donate)
                    records.append({
                        "tool": "memory", "timestamp": context["timestamp"],
                        "shape": list(args.shape), "dtype": args.dtype, "pdims": list(pdims),
                        "exchange": args.exchange, "layout": layout, "transform": transform,
                        "direction": direction, "donate": donate, "block_bytes": block,
                        "axis_type": args.axis_type,
                        **{f"{k}_bytes": v for k, v in sizes.items()},
                        **{f"{k}_blocks": v / block for k, v in sizes.items()},
                        "machine": context["machine"], "versions": context["versions"],
                        "command": context["command"],
                    })
    return records


def _mib(nbytes: int) -> str:
    """MiB to 3 significant digits (test grids have blocks of a few KiB)."""
    return f"{nbytes / 2**20:.3g}"


def markdown(records: Sequence[dict[str, Any]]) -> str:
    """One row per record: sizes in local input blocks, the block and the peak in MiB."""
    head = ["pdims", "layout", "transform", "direction", "donate", "block MiB", *PARTS, "peak MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in records:
        cells = [harness.fmt_dims(r["pdims"]), r["layout"], r["transform"], r["direction"],
                 "yes" if r["donate"] else "no", _mib(r["block_bytes"]),
                 *(f"{r[f'{k}_blocks']:.2f}" for k in PARTS), _mib(r["peak_bytes"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=(
        "Per-device memory (XLA memory analysis: arguments, outputs, temporaries, aliases) of "
        "pencilfft's compiled transforms, with and without donating the input; no timing."))
    steps.add_common_options(p, ["1x8", "2x4", "4x2", "8x1"])
    p.add_argument("--layouts", nargs="+", choices=harness.LAYOUTS, default=list(harness.LAYOUTS),
                   help="k-space layouts (default: both)")
    p.add_argument("--transforms", nargs="+", choices=list(TRANSFORMS), default=list(TRANSFORMS),
                   help="c2c (pfft3d/pifft3d), r2c (prfft3d/pirfft3d) (default: both)")
    p.add_argument("--axis-type", choices=("explicit", "auto"), default="explicit",
                   help="the mesh's axis types: explicit (the mesh in the traced type) or auto "
                        "(jit with nothing in scope: the compiler-partitioned path; default: "
                        "explicit)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    meshes = steps.start_jax(args)
    context = steps.run_context("benchmarks.memory", argv)
    records = [r for pdims in meshes for r in mesh_records(pdims, args, context)]
    steps.write_records(args.out, records)
    print(f"{harness.fmt_dims(args.shape)} {args.dtype}, exchange {args.exchange}, "
          f"{args.axis_type} mesh: per-device bytes "
          f"in local input blocks (arg = 1), peak = arg + out + temp - alias\n")
    print(markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
