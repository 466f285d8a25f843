"""The power spectrum of a sharded field: pencilfft beside JaxPM's function and one device.

    python -m benchmarks.power --devices 8 --shape 256 --meshes 4x2 1x8 --repeats 5 \\
        --jaxpm path/to/JaxPM/jaxpm/utils.py --out benchmarks/data/power.jsonl

Per mesh, one process times side by side (interleaved rounds as `benchmarks.steps` does,
medians) the auto power spectrum of one float32 field with JaxPM's default bins:

* `pencilfft`: `jax.jit(pencilfft.power_spectrum)` under `jax.set_mesh(mesh)` (the mesh known:
  shard_map), and `pencilfft-jit`: the same with no mesh in scope (the compiler-partitioned
  path, as jaxdecomp's users call things);
* `jaxpm`: JaxPM's own `jaxpm.utils.power_spectrum`, loaded from the file `--jaxpm` names (it
  needs only jax, numpy and scipy) and called as JaxPM's users do, eagerly on the sharded field
  (it cannot be traced: its bins are numpy arrays of the whole grid built on the host at every
  call, and its `jnp.fft.fftn` gathers the grid onto every device).  Its memory is that of its
  device part (fftn of the sharded field, |F|^2, bincount with the host's bin indices), jitted
  for XLA's analysis;
* `fftn-1dev`: one device, `jnp.fft.fftn` + `jnp.bincount` with bin indices computed once on
  the host and kept on the device (the floor of the gathering approach).

Memory per device is XLA's analysis of the compiled program (arguments + outputs +
temporaries).  Records go to `--out` (JSON lines); the table is printed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, steps

PROGRAMS = ("pencilfft", "pencilfft-jit", "jaxpm", "fftn-1dev")


def load_jaxpm(path: str | None):
    """JaxPM's utils module from a file (or `jaxpm.utils` if installed), or None."""
    if path:
        spec = importlib.util.spec_from_file_location("jaxpm_utils", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        from jaxpm import utils
        return utils
    except Exception:  # noqa: BLE001 - JaxPM's package imports many optional dependencies
        return None


def host_bins(shape: Sequence[int]):
    """(bin index of every mode, n_bins): JaxPM's default bins on a unit-cell box, with the
    upper bin for modes on an edge (pencilfft's rule), as int32 numpy of the whole grid."""
    import numpy as np

    from pencilfft._pm.power import plan_bins

    bins, _ = plan_bins(tuple(shape))
    kvec = [2 * np.pi * np.fft.fftfreq(n).reshape([-1 if i == d else 1 for i in range(3)])
            for d, n in enumerate(shape)]
    k2 = sum(k ** 2 for k in kvec)
    edges2 = np.asarray(bins.edges) ** 2 * (1 - 1e-9)
    dig = np.searchsorted(edges2, k2.ravel(), side="right").astype(np.int32)
    return dig, bins.n_bins


def build(shape, pdims, jaxpm, seed: int) -> tuple[list[steps.Program], dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P, SingleDeviceSharding

    import pencilfft

    mesh = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[: math.prod(pdims)])
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
    programs = [steps.Program("pencilfft", "full", spectrum, x, compiled=known),
                steps.Program("pencilfft-jit", "full", spectrum, x,
                              compiled=spectrum.lower(x).compile()),
                steps.Program("fftn-1dev", "reference", jax.jit(one_device), (one, dig_one))]
    programs[2].compiled = programs[2].fn.lower(one, dig_one).compile()
    memory_of = {p.name: p.compiled for p in programs}
    if jaxpm is not None:
        programs.append(steps.Program("jaxpm", "full", lambda v: jaxpm.power_spectrum(v)[1], x))
        # Its device part, for the memory analysis (bin indices replicated, as numpy becomes).
        dig_rep = jax.device_put(dig, NamedSharding(mesh, P()))

        def jaxpm_device(v, d):
            f = jnp.fft.fftn(v, norm="ortho")
            return jnp.bincount(d, weights=(f.real ** 2 + f.imag ** 2).reshape(-1),
                                length=n_bins)

        memory_of["jaxpm"] = jax.jit(jaxpm_device).lower(x, dig_rep).compile()
    return programs, memory_of


def run_case(shape, pdims, jaxpm, repeats: int, warmup: int, seed: int = 0) -> list[dict]:
    import numpy as np

    programs, memory_of = build(shape, pdims, jaxpm, seed)
    by: dict[str, dict[str, Any]] = {}
    for p in programs:  # call through the argument tuple: time_once takes one argument
        f = p.compiled or p.fn
        p.compiled = (lambda f: (lambda a: f(*a)))(f) if isinstance(p.arg, tuple) else f
    steps.time_programs(programs, repeats, warmup)
    results = {p.name: np.asarray(p.compiled(p.arg)) for p in programs}
    ref = results["fftn-1dev"]
    for p in programs:
        compiled = memory_of[p.name]
        mem = harness.memory_stats(compiled)
        got = results[p.name]
        by[p.name] = {
            "status": "ok", "median_s": statistics.median(p.times), "mad_s": steps.mad(p.times),
            "times_s": p.times, "mem_bytes": mem["total"], "mem_temp_bytes": mem["temp"],
            "all_gather": "all-gather" in compiled.as_text(),
            "max_rel_err_vs_1dev": float(np.nanmax(np.abs(got - ref)) / np.nanmax(np.abs(ref))),
        }
        if p.name == "jaxpm":
            by[p.name]["memory_of"] = "its device part: fftn + bincount, jitted"
    base = {"tool": "power", "shape": list(shape), "pdims": list(pdims), "dtype": "float32",
            "repeats": repeats, "field_bytes_per_device": 4 * math.prod(shape) // math.prod(pdims),
            "machine": {**harness.machine_info(), "loadavg_1m": harness.loadavg()},
            "versions": harness.versions(), "command": " ".join(["python -m benchmarks.power"]
                                                                + sys.argv[1:])}
    return [{**base, "program": name, **r} for name, r in by.items()]


def table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (grid, mesh, program): time, ratio to one device, memory per device."""
    head = ["grid", "mesh", "program", "median ms", "vs one device", "memory per device MiB",
            "in field blocks", "all-gather"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    cases: dict[tuple, dict[str, dict]] = {}
    for r in records:
        cases.setdefault((tuple(r["shape"]), tuple(r["pdims"])), {})[r["program"]] = r
    for (shape, pdims), by in cases.items():
        one = by["fftn-1dev"]["median_s"]
        for name in PROGRAMS:
            r = by.get(name)
            if r is None:
                continue
            mem = r["mem_bytes"]
            lines.append(
                f"| {harness.fmt_dims(shape)} | {harness.fmt_dims(pdims)} | {name} | "
                f"{r['median_s'] * 1e3:.0f} | {r['median_s'] / one:.2f} | "
                f"{mem / 2**20:.1f} | {mem / r['field_bytes_per_device']:.2f} | "
                f"{'yes' if r['all_gather'] else 'no'} |")
    lines += ["", f"float32, auto spectrum with JaxPM's default bins, medians of "
                  f"{records[0]['repeats']} interleaved rounds; memory: XLA's analysis "
                  f"(arguments + outputs + temporaries; fftn-1dev's is on its one device, "
                  f"jaxpm's of its device part); load average when a case ended: "
                  f"{harness.load_range(records)}."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.power",
                                description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    p.add_argument("--shape", type=int, default=256, help="N: a grid of N^3 (default 256)")
    p.add_argument("--meshes", nargs="+", type=harness.parse_pxq, default=[(4, 2), (1, 8)])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--jaxpm", help="path of JaxPM's jaxpm/utils.py (default: import jaxpm.utils "
                                   "if installed, else no jaxpm row)")
    p.add_argument("--out", type=Path, help="append JSON records to this file")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    harness.configure_devices(args.devices)
    jaxpm = load_jaxpm(args.jaxpm)
    if jaxpm is None:
        print("JaxPM not found: no jaxpm row (pass --jaxpm path/to/jaxpm/utils.py)",
              file=sys.stderr)
    records = []
    shape = (args.shape,) * 3
    for pdims in args.meshes:
        case = run_case(shape, pdims, jaxpm, args.repeats, args.warmup)
        records += case
        print(json.dumps({r["program"]: round(r["median_s"], 4) for r in case}
                         | {"pdims": pdims}), flush=True)
        steps.write_records(args.out, case)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
