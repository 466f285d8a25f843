"""Where the time of a forward pencil transform goes: per-step costs against their floors.

    python -m benchmarks.steps --shape 256 --pdims 4x2 --repeats 9
    python -m benchmarks.steps --shape 128 --pdims 4x2 2x4 8x1 --exchange pairwise --out steps.jsonl

For a global complex (X, Y, Z) array split P("x", "y", None) over an Explicit ("x", "y") mesh,
one process times side by side (compiled ahead of time, timed call-to-`block_until_ready`,
interleaved round-robin as in benchmarks/harness.py, medians):

* `fftn-1dev`: `jnp.fft.fftn` of the same array on one device, the reference of every ratio;
* `pfft3d`: the full transform (transposed layout);
* the prefixes of the forward pipeline, each a shard_map program of the first stages of
  `stages_of(plan)` run by the stages' own `forward`: "FFT Z", "+ exchange over y", "+ FFT Y", "+ exchange over x", "+ FFT X" for
  pencils, "FFT Y,Z (2-D)", "+ exchange over x", "+ FFT X" for slabs over X, "FFT Z",
  "+ exchange over y", "+ FFT X,Y (2-D)" (with the move to the layout) for slabs over Y.  A step's cost is its
  prefix's time minus the previous prefix's: the last prefix is the transform itself;
* floors: the three FFTs with no data movement, each mesh axis's collective with no local
  reordering (`all_to_all` and the pairwise `ppermute`s), and one plain pass over the block.

Single process only (the one-device reference needs the whole array on one device).  Only the
standard library is imported at module level: `--devices` must act before jax starts.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import shlex
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.report import fmt_ms

REFERENCE = harness.BASELINE  # "fftn-1dev"
FLOOR_FFTS = "3 local FFTs"
LOCAL_COPY = "local copy"
FLOOR_LINE = "floor (3 local FFTs + bare exchanges)"
EXCHANGE_CHOICES = ("alltoall", "pairwise", "local", "auto")
# Name of each exchange algorithm in the floor rows: "bare all_to_all over x".
BARE_NAMES = {"alltoall": "all_to_all", "pairwise": "pairwise", "local": "local"}


@dataclasses.dataclass
class Program:
    """One timed program: `fn` (jit-compiled ahead of time) applied to `arg`.

    kind: "reference" (one-device fftn), "full" (pfft3d), "prefix" (a prefix of the pipeline,
    whose step cost is reported) or "floor".
    """

    name: str
    kind: str
    fn: Callable[[Any], Any]
    arg: Any
    compiled: Any = None
    times: list[float] = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------------------------
# Per-device pieces (traced inside shard_map: every shape here is a local block)


def pipeline_steps(plan) -> list[tuple[str, Callable[[Any], Any]]]:
    """(label, step) of the forward transform's stages (`stages_of(plan)`), in order.

    A step is one FFT (with the padding that follows it) or one exchange, run by the library's
    own `forward`, so the last prefix is the transform itself (transposed layout).  Each
    step maps a per-device block with a leading batch axis of 1, as `_transforms.stages.run_forward` flattens
    it: (1, x, y, Z) in, (1, y', z, X) out of the last step.
    """
    from pencilfft._transforms.chunks import stages_of
    from pencilfft._transforms.stages import Exchange, Fft

    if plan.pdims[0] * plan.pdims[1] == 1:
        raise ValueError("a one-device mesh has no exchange to measure: use pdims with >1 device")
    remaining = ["Z", "Y", "X"]  # the axes still to transform, in the order the stages take them
    groups: list[tuple[str, list]] = []
    for stage in stages_of(plan):
        if isinstance(stage, Fft):
            if len(stage.axes) == 2:  # a slab's: over (Y, Z) first (X split), or (X, Y) last
                label = "FFT Y,Z (2-D)" if len(remaining) == 3 else "FFT X,Y (2-D)"
                remaining = ["X"] if len(remaining) == 3 else []
            else:
                label = f"FFT {remaining.pop(0)}"
        elif isinstance(stage, Exchange):
            label = f"exchange over {stage.axis_name}"
        else:  # padding (or the natural layout's move) belongs to the step before it
            groups[-1][1].append(stage)
            continue
        groups.append((label if not groups else f"+ {label}", [stage]))

    def step(stages):
        def run(k):
            for stage in stages:
                k = stage.forward(k)
            return k
        return run

    return [(label, step(stages)) for label, stages in groups]


def prefix_block(steps: Sequence[Callable[[Any], Any]], x):
    """The composition of `steps` on a per-device real-space block (x, y, Z); 3-D block out."""
    k = x[None]  # the batch axis of 1 that `_transforms.stages.run_forward` works with
    for step in steps:
        k = step(k)
    return k[0]


def three_ffts_block(lengths: Sequence[int], x):
    """Three FFTs of lengths (Z, Y, X) over one per-device block, with no data movement.

    Each runs along the last axis of the block reshaped (a free bitcast in XLA) to rows of that
    length, so with X != Y != Z every FFT has the batch and length of its pipeline step; where
    the block does not split into such rows the FFT runs over Z instead.
    """
    import jax.numpy as jnp

    shape = x.shape
    for n in lengths:
        rows = x.reshape(-1, n) if x.size % n == 0 else x
        x = jnp.fft.fft(rows, axis=-1).reshape(shape)
    return x


def bare_exchange_block(algorithm: str, axis_name: str, n: int, x):
    """The collective of one exchange over `axis_name` (n devices), no local reordering.

    The per-device block is viewed (free reshape) as (n, size/n): the chunk axis is already
    leading and every chunk contiguous, which is what `_transpose._chunk_major` produces at
    the cost of one pass.
    """
    from pencilfft._exchange import ALGORITHMS

    return ALGORITHMS[algorithm].send(x.reshape(n, -1), axis_name, n).reshape(x.shape)


def local_copy_block(x):
    """One pass over the per-device block: its last two axes swapped (a real transpose)."""
    import jax.numpy as jnp

    return jnp.swapaxes(x, -1, -2)


# ----------------------------------------------------------------------------------------------
# Programs of one case


def make_mesh(pdims: Sequence[int], axis_type: str = "explicit"):
    """A mesh ("x", "y") (or ("x",) for pdims (P,)) over the first devices, its axes Explicit
    (or Auto for `axis_type` "auto")."""
    import jax
    from jax.sharding import AxisType

    names = ("x", "y")[: len(pdims)]
    devices = jax.devices()[: math.prod(pdims)]
    kind = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[axis_type]
    return jax.make_mesh(tuple(pdims), names, axis_types=(kind,) * len(pdims), devices=devices)


def build_programs(shape: Sequence[int], pdims: Sequence[int], dtype: str, exchange: str,
                   seed: int = 0) -> tuple[list[Program], Any]:
    """Every program of one case, not compiled yet, and the plan of `pfft3d` on it.

    `shape` is the global (X, Y, Z); the input is random complex data of `dtype`, split
    P("x", "y", None) (the real-space sharding of pencilfft).
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    from jax.sharding import SingleDeviceSharding

    import pencilfft
    from pencilfft._transforms.partitioned import with_mesh
    from pencilfft._transforms.plan import plan_forward

    mesh = make_mesh(pdims)
    x = harness.make_input(tuple(shape), pencilfft.real_space_sharding(mesh), dtype, seed)
    plan = plan_forward(x, norm="backward", layout="transposed", mesh=mesh, real=False,
                        exchange=exchange)
    spec = P(*plan.axes, None)  # any 3-D block: global = blocks concatenated, nothing moves

    def per_device(block_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        # (our custom-call exchanges find their peers in the mesh)
        return jax.shard_map(with_mesh(block_fn, mesh), mesh=mesh, in_specs=spec, out_specs=spec)

    programs = [
        # A SingleDeviceSharding: a plain device_put(x, device) would keep x's mesh type.
        Program(REFERENCE, "reference", jnp.fft.fftn,
                jax.device_put(x, SingleDeviceSharding(jax.devices()[0]))),
        Program("pfft3d", "full", functools.partial(pencilfft.pfft3d, exchange=exchange), x),
    ]
    steps = pipeline_steps(plan)
    for i, (label, _) in enumerate(steps):
        block = functools.partial(prefix_block, [s for _, s in steps[: i + 1]])
        programs.append(Program(label, "prefix", per_device(block), x))
    lengths = (shape[2], shape[1], shape[0])
    programs.append(Program(FLOOR_FFTS, "floor", per_device(functools.partial(three_ffts_block, lengths)), x))
    for name, n in zip(plan.axes, plan.pdims):
        if n == 1:
            continue
        for algorithm, bare in BARE_NAMES.items():
            if algorithm == "local" and "local" not in plan.exchanges:
                continue  # (it may not run here)
            block = functools.partial(bare_exchange_block, algorithm, name, n)
            programs.append(Program(f"bare {bare} over {name}", "floor", per_device(block), x))
    programs.append(Program(LOCAL_COPY, "floor", per_device(local_copy_block), x))
    return programs, plan


def compile_programs(programs: Sequence[Program]) -> None:
    """Lower and compile every program for its argument (compile time is not measured)."""
    import jax

    for p in programs:
        p.compiled = jax.jit(p.fn).lower(p.arg).compile()


def time_programs(programs: Sequence[Program], repeats: int, warmup: int) -> None:
    """`warmup` + `repeats` rounds; every round calls each program once, the first program of
    the round rotating, so that drift of the machine spreads over all of them."""
    from pencilfft._measure import time_once

    n = len(programs)
    for r in range(warmup + repeats):
        for p in programs[r % n:] + programs[: r % n]:
            t, out = time_once(p.compiled, p.arg)
            del out  # free the result before the next program runs
            if r >= warmup:
                p.times.append(t)


# ----------------------------------------------------------------------------------------------
# Results


def exchange_algorithms(plan) -> dict[str, str]:
    """Mesh axis name -> the exchange algorithm pfft3d uses over it (axes of size > 1)."""
    return {name: alg for name, n, alg in zip(plan.axes, plan.pdims, plan.exchanges) if n > 1}


def mad(times: Sequence[float]) -> float:
    """Median absolute deviation of repeated timings: their noise, robust to outliers."""
    med = statistics.median(times)
    return statistics.median(abs(t - med) for t in times)


def case_records(programs: Sequence[Program], plan, shape: Sequence[int], pdims: Sequence[int],
                 dtype: str, context: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per program: median, ratio to the reference, step cost of prefixes.

    A step's cost is the difference of two medians (its prefix and the one before), each with
    its own noise: `step_noise_s` is the sum of their median absolute deviations, and a step
    below it (possibly negative) is reported as noise, not as a cost.
    """
    ref = statistics.median(programs[0].times)
    records, previous, previous_noise = [], 0.0, 0.0
    for p in programs:
        med = statistics.median(p.times)
        step = noise = None
        if p.kind == "prefix":
            step, previous = med - previous, med
            noise, previous_noise = mad(p.times) + previous_noise, mad(p.times)
        records.append({
            "tool": "steps", "timestamp": context["timestamp"], "program": p.name, "kind": p.kind,
            "shape": list(shape), "dtype": dtype, "pdims": list(pdims),
            "exchanges": exchange_algorithms(plan), "median_s": med, "min_s": min(p.times),
            "max_s": max(p.times), "times_s": p.times, "ratio_to_fftn_1dev": med / ref,
            "step_s": step, "step_noise_s": noise, "repeats": len(p.times),
            "machine": {**context["machine"], "loadavg_1m": harness.loadavg()},
            "versions": context["versions"], "command": context["command"],
        })
    return records


def step_cell(r: dict[str, Any]) -> str:
    """A prefix's step cost in ms, or "noise (±n)" where it is within the noise of the two
    medians it is the difference of (a negative cost is always noise)."""
    noise = r.get("step_noise_s")
    if noise is None:  # a record written before step_noise_s existed
        noise = 0.0
    if r["step_s"] <= noise:
        return f"noise (±{fmt_ms(noise)})"
    return fmt_ms(r["step_s"])


def floor_seconds(records: Sequence[dict[str, Any]]) -> float:
    """The three FFTs plus one bare exchange per mesh axis, with the algorithm pfft3d uses."""
    by = {r["program"]: r["median_s"] for r in records}
    exchanges = records[0]["exchanges"]
    return by[FLOOR_FFTS] + sum(by[f"bare {BARE_NAMES[alg]} over {name}"] for name, alg in exchanges.items())


def markdown(records: Sequence[dict[str, Any]]) -> str:
    """The table of one case and the floor line under it."""
    lines = ["| program | ms | ratio to fftn-1dev | step cost ms |", "|---|---|---|---|"]
    for r in records:
        step = "" if r["step_s"] is None else step_cell(r)
        lines.append(f"| {r['program']} | {fmt_ms(r['median_s'])} | {r['ratio_to_fftn_1dev']:.2f} | {step} |")
    ref = records[0]["median_s"]
    floor = floor_seconds(records)
    lines += ["", f"{FLOOR_LINE} = {fmt_ms(floor)} ms = {floor / ref:.2f}x of one-device fftn"]
    return "\n".join(lines)


def case_title(records: Sequence[dict[str, Any]]) -> str:
    r = records[0]
    algs = ", ".join(f"{alg} over {name}" for name, alg in r["exchanges"].items())
    return (f"{harness.fmt_dims(r['shape'])} {r['dtype']}, pdims {harness.fmt_dims(r['pdims'])}, "
            f"exchange {algs}; median of {r['repeats']}, interleaved")


# ----------------------------------------------------------------------------------------------
# Command line


def add_common_options(p: argparse.ArgumentParser, pdims_default: Sequence[str]) -> None:
    """The options benchmarks/steps.py and benchmarks/memory.py share."""
    p.add_argument("--devices", type=int, default=8, metavar="N",
                   help="simulated CPU devices (sets jax_num_cpu_devices unless XLA_FLAGS already "
                        "has --xla_force_host_platform_device_count; default: 8)")
    p.add_argument("--shape", type=harness.parse_shape, default=harness.parse_shape("256"),
                   metavar="N|XxYxZ", help="global grid (default: 256)")
    p.add_argument("--pdims", nargs="+", type=harness.parse_pdims,
                   default=[harness.parse_pdims(s) for s in pdims_default], metavar="PxQ|P",
                   help=f"meshes: PxQ on a 2-axis mesh (Q = 1: slabs over X), P on a 1-axis mesh "
                        f"(default: {' '.join(pdims_default)})")
    p.add_argument("--dtype", choices=harness.DTYPES, default="complex64",
                   help="k-space precision (default: complex64)")
    p.add_argument("--exchange", choices=EXCHANGE_CHOICES, default="auto",
                   help="pencilfft's exchange algorithm (default: auto)")
    p.add_argument("--out", type=Path, default=None, help="also append JSON lines to this file")


def start_jax(args: argparse.Namespace) -> list[tuple[int, ...]]:
    """Configure the devices and precision, then the validated meshes of `args.pdims`."""
    harness.configure_devices(args.devices)
    import jax

    if args.dtype == "complex128":
        jax.config.update("jax_enable_x64", True)
    if jax.process_count() > 1:
        raise SystemExit("error: run this tool in a single process")
    cases = harness.make_cases(argparse.Namespace(shapes=[args.shape], dtypes=[args.dtype],
                                                  pdims=args.pdims), jax.device_count())
    return [c.pdims for c in cases]


def run_context(prog: str, argv: Sequence[str]) -> dict[str, Any]:
    """What every record stores about the run."""
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": harness.machine_info(),
        "versions": harness.versions(),
        "command": f"python -m {prog} " + shlex.join(argv),
    }


def write_records(path: Path | None, records: Sequence[dict[str, Any]]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.steps", description=(
        "Per-step cost of the forward pencil transform (prefixes of its pipeline) next to the "
        "floors (FFTs alone, bare collectives, one memory pass) and one-device fftn, in one "
        "process, interleaved, medians."))
    add_common_options(p, ["4x2"])
    p.add_argument("--repeats", type=int, default=9, help="timed rounds (default: 9)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default: 2)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit("error: --repeats must be >= 1 and --warmup >= 0")
    meshes = start_jax(args)
    context = run_context("benchmarks.steps", argv)
    for pdims in meshes:
        programs, plan = build_programs(args.shape, pdims, args.dtype, args.exchange)
        compile_programs(programs)
        time_programs(programs, args.repeats, args.warmup)
        records = case_records(programs, plan, args.shape, pdims, args.dtype, context)
        del programs  # inputs and executables of this case
        write_records(args.out, records)
        print(f"\n{case_title(records)}\n\n{markdown(records)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
