"""Where the time of a forward pencil transform goes: per-step costs against their floors.

    python -m benchmarks.steps --shapes 256 --pdims 4x2 --repeats 9
    python -m benchmarks.steps --shapes 128 --pdims 4x2 2x4 8x1 --exchange pairwise --out steps.jsonl

On an Explicit mesh, in one process, in the harness's loop: `fftn-1dev` (one device, every
ratio's reference), `pfft3d`, the prefixes of its pipeline (shard_map programs of the first
stages of `stages_of(plan)`, run by the stages' own `forward`: "FFT Z", "+ exchange over y", ...;
a step's cost is its prefix's time less the one before), and the floors: the three FFTs with no
data movement, each axis's bare collective, and one plain pass over the block.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P, SingleDeviceSharding

import pencilfft
from benchmarks import harness, private
from benchmarks.harness import Program, fmt_dims, fmt_ms

REFERENCE = "fftn-1dev"
FLOOR_FFTS = "3 local FFTs"
LOCAL_COPY = "local copy"
# Name of each exchange algorithm in the floor rows: "bare all_to_all over x".
BARE_NAMES = {"alltoall": "all_to_all", "pairwise": "pairwise", "local": "local"}


# Per-device pieces (traced inside shard_map: every shape here is a local block)
def pipeline_steps(plan) -> list[tuple[str, Callable[[Any], Any]]]:
    """(label, step) of the forward's stages: each FFT (with its padding) or exchange."""
    if plan.pdims[0] * plan.pdims[1] == 1:
        raise ValueError("a one-device mesh has no exchange to measure: use pdims with >1 device")
    remaining = ["Z", "Y", "X"]  # the axes still to transform, in the order the stages take them
    groups: list[tuple[str, list]] = []
    for stage in private.stages_of(plan):
        if isinstance(stage, private.Fft):
            if len(stage.axes) == 2:  # a slab's: over (Y, Z) first (X split), or (X, Y) last
                label = "FFT Y,Z (2-D)" if len(remaining) == 3 else "FFT X,Y (2-D)"
                remaining = ["X"] if len(remaining) == 3 else []
            else:
                label = f"FFT {remaining.pop(0)}"
        elif isinstance(stage, private.Exchange):
            label = f"exchange over {stage.axis_name}"
        else:  # padding (or the natural layout's move) belongs to the step before it
            groups[-1][1].append(stage)
            continue
        groups.append((label if not groups else f"+ {label}", [stage]))

    def step(stages):
        return lambda k: functools.reduce(lambda a, stage: stage.forward(a), stages, k)

    return [(label, step(stages)) for label, stages in groups]


def prefix_block(steps: Sequence[Callable[[Any], Any]], x):
    """The composition of `steps` on a per-device real-space block (x, y, Z); 3-D block out."""
    return functools.reduce(lambda k, step: step(k), steps, x[None])[0]  # (the stages' batch axis)


def three_ffts_block(lengths: Sequence[int], x):
    """Three FFTs of lengths (Z, Y, X) along the last axis of the block, no data movement."""
    shape = x.shape
    for n in lengths:
        rows = x.reshape(-1, n) if x.size % n == 0 else x
        x = jnp.fft.fft(rows, axis=-1).reshape(shape)
    return x


def bare_exchange_block(algorithm: str, axis_name: str, n: int, x):
    """One exchange's collective over `axis_name`, no reordering: (n, size/n) chunks."""
    return private.ALGORITHMS[algorithm].send(x.reshape(n, -1), axis_name, n).reshape(x.shape)


def local_copy_block(x):
    """One pass over the per-device block: its last two axes swapped (a real transpose)."""
    return jnp.swapaxes(x, -1, -2)


def build_programs(shape: Sequence[int], pdims: Sequence[int], dtype: str, exchange: str,
                   seed: int = 0) -> tuple[list[Program], Any]:
    """Every program of one case (not compiled yet), and the plan of `pfft3d` on it."""
    mesh = harness.make_mesh(pdims)
    x = harness.make_input(tuple(shape), pencilfft.real_space_sharding(mesh), dtype, seed)
    plan = private.plan_forward(x, norm="backward", layout="transposed", mesh=mesh, real=False,
                                exchange=exchange)
    spec = P(*plan.axes, None)  # any 3-D block: global = blocks concatenated, nothing moves

    def per_device(block_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        # (our custom-call exchanges find their peers in the mesh)
        return jax.shard_map(private.with_mesh(block_fn, mesh), mesh=mesh, in_specs=spec,
                             out_specs=spec)

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
        for algorithm, bare in BARE_NAMES.items():
            if n == 1 or (algorithm == "local" and "local" not in plan.exchanges):
                continue  # (the local exchange may not run here)
            block = functools.partial(bare_exchange_block, algorithm, name, n)
            programs.append(Program(f"bare {bare} over {name}", "floor", per_device(block), x))
    programs.append(Program(LOCAL_COPY, "floor", per_device(local_copy_block), x))
    return programs, plan


# Records and tables
def exchange_algorithms(plan) -> dict[str, str]:
    """Mesh axis name -> the exchange algorithm pfft3d uses over it (axes of size > 1)."""
    return {name: alg for name, n, alg in zip(plan.axes, plan.pdims, plan.exchanges) if n > 1}


def case_records(programs: Sequence[Program], plan, shape: Sequence[int], pdims: Sequence[int],
                 dtype: str, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """A record per program; a step's cost below its noise (two MADs) is called noise."""
    ref = statistics.median(programs[0].times)
    records, previous, previous_noise = [], 0.0, 0.0
    for p in programs:
        med = statistics.median(p.times)
        step = noise = None
        if p.kind == "prefix":
            step, previous = med - previous, med
            noise, previous_noise = harness.mad(p.times) + previous_noise, harness.mad(p.times)
        records.append({
            "tool": "steps", "program": p.name, "kind": p.kind,
            "shape": list(shape), "dtype": dtype, "pdims": list(pdims),
            "exchanges": exchange_algorithms(plan), "median_s": med, "min_s": min(p.times),
            "max_s": max(p.times), "times_s": p.times, "ratio_to_fftn_1dev": med / ref,
            "step_s": step, "step_noise_s": noise, "repeats": len(p.times), **harness.stamp(ctx),
        })
    return records


def step_cell(r: dict[str, Any]) -> str:
    """A prefix's step cost in ms, or "noise (±n)" within the noise of its two medians."""
    noise = r.get("step_noise_s") or 0.0  # (records written before step_noise_s existed)
    return f"noise (±{fmt_ms(noise)})" if r["step_s"] <= noise else fmt_ms(r["step_s"])


def floor_seconds(records: Sequence[dict[str, Any]]) -> float:
    """The three FFTs plus one bare exchange per mesh axis, with the algorithm pfft3d uses."""
    by = {r["program"]: r["median_s"] for r in records}
    exchanges = records[0]["exchanges"]
    return by[FLOOR_FFTS] + sum(by[f"bare {BARE_NAMES[alg]} over {name}"] for name, alg in exchanges.items())


STEP_ROWS = (  # (row label, how to find its record: program names for pencils / slabs)
    ("one-device `fftn`", ("fftn-1dev",)),
    ("`pfft3d` (transposed)", ("pfft3d",)),
    ("FFT Z (slab: 2-D FFT over Y, Z)", ("FFT Z", "FFT Y,Z (2-D)")),
    ("+ exchange over y", ("+ exchange over y",)),
    ("+ FFT Y", ("+ FFT Y",)),
    ("+ exchange over x", ("+ exchange over x",)),
    ("+ FFT X", ("+ FFT X",)),
    ("+ FFT X,Y (2-D) and the move (slab over Y)", ("+ FFT X,Y (2-D)",)),
    ("3 local FFTs, no data movement", ("3 local FFTs",)),
    ("bare collective over x (no reordering)", ("bare over x",)),
    ("bare collective over y (no reordering)", ("bare over y",)),
    ("one local pass (copy) over the block", ("local copy",)),
)
_RATIO_ROWS = {"fftn-1dev", "pfft3d", "3 local FFTs"}


def _step_record(by: dict[str, dict], names: Sequence[str]) -> dict | None:
    for name in names:
        if name.startswith("bare over "):
            axis = name.rsplit(" ", 1)[1]
            algorithm = next(iter(by.values()))["exchanges"].get(axis)
            if algorithm is None:
                return None
            name = f"bare {BARE_NAMES[algorithm]} over {axis}"
        if name in by:
            return by[name]
    return None


def _step_table_cell(r: dict | None) -> str:
    if r is None:
        return "—"
    if r["program"] in _RATIO_ROWS:
        return f"{fmt_ms(r['median_s'])} ({r['ratio_to_fftn_1dev']:.2f})"
    if r["kind"] == "prefix" and r["program"] not in ("FFT Z", "FFT Y,Z (2-D)"):
        return f"{fmt_ms(r['median_s'])} (step {step_cell(r)})"
    return fmt_ms(r["median_s"])


def steps_table(records: list[dict]) -> str:
    """The cases side by side: prefixes with step costs, floors, the floor line."""
    cases: dict[tuple, dict[str, dict]] = {}
    for r in records:
        case = (tuple(r["pdims"]), tuple(sorted(set(r["exchanges"].values()))))
        cases.setdefault(case, {})[r["program"]] = r  # the latest run of a case wins
    rows = [[label] + [_step_table_cell(_step_record(by, names)) for by in cases.values()]
            for label, names in STEP_ROWS]
    floors = []
    for by in cases.values():
        floor = floor_seconds(list(by.values()))
        floors.append(f"{fmt_ms(floor)} ({floor / by['fftn-1dev']['median_s']:.2f})")
    rows.append(["floor: 3 local FFTs + bare exchanges"] + floors)
    r0 = next(iter(next(iter(cases.values())).values()))
    head = ["program"] + [f"{fmt_dims(p)} {'/'.join(BARE_NAMES[a] for a in algs)}" for p, algs in cases]
    return harness.md_table(head, rows, "l" + "r" * len(cases), (
        f"{fmt_dims(r0['shape'])} {r0['dtype']}, medians of {r0['repeats']} interleaved rounds, ms "
        f"(ratio to the one-device `fftn` of the same run); load average when each case ended: "
        + ", ".join(harness.load_range(list(by.values())) for by in cases.values()) + "."))


# ----------------------------------------------------------------------------------------------
# The command line (benchmarks.harness.main)

OPTIONS = dict(devices=8, shapes=["256"], pdims=["4x2"], dtypes=dict(default=["complex64"], choices=harness.DTYPES),
               exchange="auto", repeats=9, warmup=2, out=None)


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    if jax.process_count() > 1:
        raise SystemExit("error: run this tool in a single process")
    for case in harness.make_cases(args, jax.device_count()):
        programs, plan = build_programs(case.shape, case.pdims, case.dtype, args.exchange)
        harness.compile_programs(programs)
        harness.time_programs(programs, args.repeats, args.warmup)
        yield case_records(programs, plan, case.shape, case.pdims, case.dtype, ctx)
        harness.say(args, f"{case.label} done")


TABLES = {"steps": steps_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
