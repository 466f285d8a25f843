"""Painting, readout and a PM force computation: pencilfft against JaxPM on jaxdecomp.

    python -m benchmarks.paint --devices 8 --shapes 128 256 --pdims 4x2 --jaxpm /path/to/JaxPM

One particle per cell, displacements dx (X, Y, Z, 3) Gaussian with `--rms` cells (0.3) per
component, float32, split P('x', 'y') over an Auto mesh, everything in `jax.jit`, as JaxPM runs:

* paint + readout: JaxPM's `cic_paint_dx(dx, halo_size, sharding)` then `cic_read_dx(field, dx,
  halo_size, sharding)` (jaxdecomp's halo_exchange), against `pencilfft.paint(dx)` then
  `pencilfft.readout(field, dx)` (halo chosen by pencilfft from max_displacement);
* forces: JaxPM's `pm_forces(dx, mesh_shape, paint_absolute_pos=False, halo_size, sharding)`
  (jaxdecomp's pfft3d / pifft3d / fftfreq3d), against the same computation from pencilfft alone
  (`pm_forces` below: paint, prfft3d, -1/k^2 and the 4th-order gradient kernels, 3 pirfft3d,
  one readout of the 3 components);
* the gradient of a scalar loss sum(readout(paint(dx)^2, dx) * cos(dx_x)) in dx, both ways.

Each timed program runs `--repeats` times after a warm-up, the implementations interleaved
(round-robin), and the median is reported; memory per device is XLA's memory analysis of the
compiled program.  Equality: max |a - b| / max |b|, pencilfft against JaxPM, in float32.

JaxPM is imported from `--jaxpm` (or $JAXPM_PATH): a checkout of
github.com/DifferentiableUniverseInitiative/JaxPM; its `jax_cosmo` import (used by jaxpm.pm for
growth functions, not by pm_forces) is stubbed when jax_cosmo is not installed.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

from benchmarks import harness


def load_jaxpm(path: str | None):
    """jaxpm.painting and jaxpm.pm from a checkout (jax_cosmo stubbed if missing)."""
    if path:
        sys.path.insert(0, str(path))
    try:
        import jax_cosmo  # noqa: F401
    except ImportError:
        stub = types.ModuleType("jax_cosmo")
        bg = types.ModuleType("jax_cosmo.background")
        for name in ("Esqr", "Omega_de_a", "Omega_m_a", "_compute_growth_tables", "f_de",
                     "growth_factor", "growth_factor_second", "growth_rate",
                     "growth_rate_second", "w"):
            setattr(bg, name, None)
        stub.background = bg
        sys.modules["jax_cosmo"], sys.modules["jax_cosmo.background"] = stub, bg
    import jaxpm.painting as painting
    import jaxpm.pm as pm

    return painting, pm


def pm_forces(dx, *, max_displacement=None):
    """-grad(phi) at the particles, lap(phi) = delta (JaxPM's pm_forces with r_split=0 and
    displacement painting): pencilfft only.  (X, Y, Z, 3)."""
    import jax.numpy as jnp

    import pencilfft

    shape = dx.shape[:3]
    rho = pencilfft.paint(dx, max_displacement=max_displacement)
    k = pencilfft.prfft3d(rho)
    kx, ky, kz = pencilfft.rfftfreq3d(k, s=shape)
    k2 = kx**2 + ky**2 + kz**2
    pot = k * jnp.where(k2 == 0, 0, 1 / jnp.where(k2 == 0, 1, k2))  # -(-1/k^2)
    f = jnp.stack([pencilfft.pirfft3d(1j * (8 * jnp.sin(w) - jnp.sin(2 * w)) / 6 * pot, shape)
                   for w in (kx, ky, kz)])
    return jnp.moveaxis(pencilfft.readout(f, dx, max_displacement=max_displacement), 0, -1)


def jaxpm_loss(painting, dx, halo=0, sharding=None):
    """The scalar whose gradient in dx is compared: through paint and readout."""
    import jax.numpy as jnp

    rho = painting.cic_paint_dx(dx, halo_size=(halo, halo), sharding=sharding)
    r = painting.cic_read_dx(rho ** 2, dx, halo_size=(halo, halo), sharding=sharding)
    return jnp.sum(r * jnp.cos(dx[..., 0]))


def programs(painting, pm, shape, sharding, halo: int, max_disp):
    import jax
    import jax.numpy as jnp

    import pencilfft

    def jx_paint_read(dx):
        rho = painting.cic_paint_dx(dx, halo_size=(halo, halo), sharding=sharding)
        return rho, painting.cic_read_dx(rho, dx, halo_size=(halo, halo), sharding=sharding)

    def pf_paint_read(dx):
        rho = pencilfft.paint(dx, max_displacement=max_disp)
        return rho, pencilfft.readout(rho, dx, max_displacement=max_disp)

    jx_loss = functools.partial(jaxpm_loss, painting, halo=halo, sharding=sharding)

    def pf_loss(dx):
        rho = pencilfft.paint(dx, max_displacement=max_disp)
        r = pencilfft.readout(rho ** 2, dx, max_displacement=max_disp)
        return jnp.sum(r * jnp.cos(dx[..., 0]))

    return {
        "paint+readout": {"jaxpm": jax.jit(jx_paint_read), "pencilfft": jax.jit(pf_paint_read)},
        "forces": {
            "jaxpm": jax.jit(lambda dx: pm.pm_forces(dx, mesh_shape=shape,
                                                     paint_absolute_pos=False,
                                                     halo_size=(halo, halo), sharding=sharding)),
            "pencilfft": jax.jit(functools.partial(pm_forces, max_displacement=max_disp))},
        "grad": {"jaxpm": jax.jit(jax.grad(jx_loss)), "pencilfft": jax.jit(jax.grad(pf_loss))},
    }


def _err(a, b) -> dict:
    """max |a - b| / max |b|, and how many entries differ by more than 1e-4 max |b| (float32
    rounding is ~1e-6: these are particles or cells computed differently, not rounding)."""
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.abs(a - b) / np.max(np.abs(b))
    return {"max": float(d.max()), "n_over_1e-4": int((d > 1e-4).sum()), "n": int(d.size)}


def run_case(shape, pdims, args, painting, pm) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import pencilfft

    mesh = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    sharding = NamedSharding(mesh, P("x", "y"))
    rng = np.random.default_rng(args.seed)
    dx_np = (rng.standard_normal(tuple(shape) + (3,)) * args.rms).astype(np.float32)
    dx = jax.device_put(dx_np, sharding)
    halo = args.halo or (16 if shape[0] <= 128 else 32)
    progs = programs(painting, pm, tuple(shape), sharding, halo, args.max_displacement)
    records = []
    for what in args.what:
        compiled, mem = {}, {}
        for impl, f in progs[what].items():
            t0 = time.perf_counter()
            compiled[impl] = f.lower(dx).compile()
            mem[impl] = harness.memory_stats(compiled[impl])
            print(f"{harness.fmt_dims(shape)} {what} {impl}: compiled in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        outs = {impl: jax.block_until_ready(c(dx)) for impl, c in compiled.items()}
        times = {impl: [] for impl in compiled}
        load0 = harness.loadavg()
        impls = list(compiled)
        for rep in range(args.repeats):
            order = impls[rep % 2:] + impls[:rep % 2]  # round-robin
            for impl in order:
                t0 = time.perf_counter()
                jax.block_until_ready(compiled[impl](dx))
                times[impl].append(time.perf_counter() - t0)
        a, b = outs["pencilfft"], outs["jaxpm"]
        if what == "paint+readout":
            err = {"density": _err(a[0], b[0]), "readout": _err(a[1], b[1])}
            err["mass"] = {"jaxpm": float(np.asarray(b[0], np.float64).sum()),
                           "pencilfft": float(np.asarray(a[0], np.float64).sum()),
                           "particles": int(np.prod(shape))}
        else:
            err = {what: _err(a, b)}
        if what == "forces":  # JaxPM's pm_forces given pencilfft's density: FFTs and readout
            rho = jax.jit(lambda d: pencilfft.paint(d, max_displacement=args.max_displacement))(dx)
            same = jax.jit(lambda d, r: pm.pm_forces(d, mesh_shape=tuple(shape), delta=r,
                                                     paint_absolute_pos=False,
                                                     halo_size=(halo, halo),
                                                     sharding=sharding))(dx, rho)
            err["forces, JaxPM given pencilfft's density"] = _err(a, same)
        if what == "grad":  # JaxPM's own gradient on one device (no halos): the reference
            one = jax.jit(jax.grad(lambda d: jaxpm_loss(painting, d)))(jnp.asarray(dx_np))
            err = {"vs JaxPM 8 dev": err["grad"], "vs JaxPM 1 dev": _err(a, one),
                   "JaxPM 8 dev vs 1 dev": _err(b, one)}
        med = {impl: statistics.median(t) for impl, t in times.items()}
        rec = {"shape": list(shape), "pdims": list(pdims), "what": what, "halo_jaxpm": halo,
               "max_displacement": args.max_displacement, "rms": args.rms,
               "max_abs_dx": float(np.abs(dx_np).max()),
               "median_s": med, "times_s": times, "speedup": med["jaxpm"] / med["pencilfft"],
               "rel_err": err, "mem_bytes": {k: v.get("total") for k, v in mem.items()},
               "mem_temp_bytes": {k: v.get("temp") for k, v in mem.items()},
               "loadavg_start_end": [load0, harness.loadavg()],
               "versions": harness.versions(), "machine": harness.machine_info(),
               "command": "python -m benchmarks.paint " + " ".join(sys.argv[1:])}
        print(json.dumps({k: rec[k] for k in ("shape", "what", "median_s", "speedup", "rel_err",
                                              "mem_bytes")}), flush=True)
        records.append(rec)
    return records


def _fmt_err(k, v) -> str:
    if k == "mass":
        return (f"mass JaxPM {v['jaxpm']:.0f}, pencilfft {v['pencilfft']:.0f} "
                f"(particles {v['particles']})")
    return f"{k} {v['max']:.1e} ({v['n_over_1e-4']} of {v['n']} > 1e-4)"


def table(records) -> str:
    lines = ["| grid | mesh | what | JaxPM ms | pencilfft ms | speed-up | max rel. diff. | "
             "MiB/device JaxPM | MiB/device pencilfft |", "|" + "---|" * 9]
    for r in records:
        m = r["median_s"]
        mem = r["mem_bytes"]
        lines.append("| " + " | ".join([
            harness.fmt_dims(r["shape"]), harness.fmt_dims(r["pdims"]), r["what"],
            f"{m['jaxpm'] * 1e3:.0f}", f"{m['pencilfft'] * 1e3:.0f}", f"{r['speedup']:.1f}x",
            "; ".join(_fmt_err(k, v) for k, v in r["rel_err"].items()),
            f"{(mem['jaxpm'] or 0) / 2**20:.0f}", f"{(mem['pencilfft'] or 0) / 2**20:.0f}"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.paint", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", type=harness.parse_shape,
                   default=[harness.parse_shape("128")])
    p.add_argument("--pdims", type=harness.parse_pxq, default=(4, 2))
    p.add_argument("--what", nargs="+", choices=["paint+readout", "forces", "grad"],
                   default=["paint+readout", "forces", "grad"])
    p.add_argument("--rms", type=float, default=0.3, help="displacement rms per component")
    p.add_argument("--halo", type=int, default=0,
                   help="JaxPM's halo_size (default: 16 up to 128^3, else 32, as measured in "
                        "issue 44)")
    p.add_argument("--max-displacement", type=float, default=None,
                   help="pencilfft's bound (default: pencilfft's default)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--jaxpm", default=os.environ.get("JAXPM_PATH"),
                   help="path of a JaxPM checkout (default: $JAXPM_PATH, else installed jaxpm)")
    p.add_argument("--out", type=Path, default=Path("results/paint.jsonl"))
    args = p.parse_args(argv)
    harness.configure_devices(args.devices)
    import jax

    painting, pm = load_jaxpm(args.jaxpm)
    records = []
    for shape in args.shapes:
        records += run_case(shape, args.pdims, args, painting, pm)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    print(table(records))
    del jax
    return 0


if __name__ == "__main__":
    sys.exit(main())
