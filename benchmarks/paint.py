"""Painting, readout and a PM force computation: pencilfft against JaxPM on jaxdecomp.

    python -m benchmarks.paint --devices 8 --shapes 128 256 --pdims 4x2 --jaxpm /path/to/JaxPM
    python -m benchmarks.paint --devices 1 --pdims 1x1 --shapes 256 --jaxpm ...      (one GPU)

One particle per cell, displacements Gaussian with `--rms` cells, float32, on an Auto mesh, in
`jax.jit` as JaxPM runs: `paint+readout` (JaxPM's `cic_paint_dx` / `cic_read_dx` against
`pencilfft.paint` / `readout`), `forces` (JaxPM's `pm_forces` against `pm_forces` below, from
pencilfft alone), `grad` (of a scalar through both).  Medians of the harness's loop, XLA's
memory per device, differences max|a - b| / max|b| and how many entries pass 1e-4.  JaxPM from
`--jaxpm` (or $JAXPM_PATH), its `jax_cosmo` import stubbed when missing.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from benchmarks import harness


@functools.cache
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
    """-grad(phi) at the particles, lap(phi) = delta (JaxPM's pm_forces): pencilfft alone."""
    shape = dx.shape[:3]
    rho = pencilfft.paint(dx, max_displacement=max_displacement)
    k = pencilfft.prfft3d(rho)
    kx, ky, kz = pencilfft.rfftfreq3d(k, s=shape)
    k2 = kx**2 + ky**2 + kz**2
    pot = k * jnp.where(k2 == 0, 0, 1 / jnp.where(k2 == 0, 1, k2))  # -(-1/k^2)
    f = jnp.stack([pencilfft.pirfft3d(1j * (8 * jnp.sin(w) - jnp.sin(2 * w)) / 6 * pot, shape)
                   for w in (kx, ky, kz)])
    return jnp.moveaxis(pencilfft.readout(f, dx, max_displacement=max_displacement), 0, -1)


def _jaxpm_pair(painting, halo=0, sharding=None):
    """JaxPM's (paint, readout) of displacements, with its halo on `sharding`."""
    opts = dict(halo_size=(halo, halo), sharding=sharding)
    return (lambda dx: painting.cic_paint_dx(dx, **opts),
            lambda f, dx: painting.cic_read_dx(f, dx, **opts))


def _paint_read(paint, read, loss: bool = False):
    """(density, readout) of displacements, or the scalar whose gradient in dx is compared."""
    def f(dx):
        rho = paint(dx)
        return jnp.sum(read(rho ** 2, dx) * jnp.cos(dx[..., 0])) if loss else (rho, read(rho, dx))
    return f


def programs(painting, pm, shape, sharding, halo: int, max_disp):
    jx = _jaxpm_pair(painting, halo, sharding)
    pf = (functools.partial(pencilfft.paint, max_displacement=max_disp),
          functools.partial(pencilfft.readout, max_displacement=max_disp))
    return {
        "paint+readout": {"jaxpm": jax.jit(_paint_read(*jx)), "pencilfft": jax.jit(_paint_read(*pf))},
        "forces": {
            "jaxpm": jax.jit(lambda dx: pm.pm_forces(dx, mesh_shape=shape, paint_absolute_pos=False,
                                                     halo_size=(halo, halo), sharding=sharding)),
            "pencilfft": jax.jit(functools.partial(pm_forces, max_displacement=max_disp))},
        "grad": {"jaxpm": jax.jit(jax.grad(_paint_read(*jx, loss=True))),
                 "pencilfft": jax.jit(jax.grad(_paint_read(*pf, loss=True)))},
    }


def _err(a, b) -> dict:
    """max|a - b| / max|b|, and how many entries differ by more than 1e-4 (not rounding)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = np.abs(a - b) / np.max(np.abs(b))
    return {"max": float(d.max()), "n_over_1e-4": int((d > 1e-4).sum()), "n": int(d.size)}


def run_case(shape, pdims, args, ctx: dict[str, Any]) -> list[dict]:
    painting, pm = load_jaxpm(args.jaxpm)
    mesh = harness.make_mesh(pdims, "auto")
    sharding = NamedSharding(mesh, P("x", "y"))
    rng = np.random.default_rng(args.seed)
    dx_np = (rng.standard_normal(tuple(shape) + (3,)) * args.rms).astype(np.float32)
    dx = jax.device_put(dx_np, sharding)
    halo = args.halo or (16 if shape[0] <= 128 else 32)
    progs = programs(painting, pm, tuple(shape), sharding, halo, args.max_displacement)
    records = []
    for what in args.what:
        harness.say(args, f"{harness.fmt_dims(shape)} {what}: compile")
        compiled = {impl: f.lower(dx).compile() for impl, f in progs[what].items()}
        mem = {impl: harness.memory_stats(c) for impl, c in compiled.items()}
        outs = {impl: jax.block_until_ready(c(dx)) for impl, c in compiled.items()}
        load0 = harness.loadavg()
        times = harness.time_calls({impl: functools.partial(c, dx) for impl, c in compiled.items()},
                                   args.repeats, 0)
        a, b = outs["pencilfft"], outs["jaxpm"]
        if what == "paint+readout":
            err = {"density": _err(a[0], b[0]), "readout": _err(a[1], b[1])}
            err["mass"] = {"jaxpm": float(np.sum(b[0], dtype=np.float64)), "particles": math.prod(shape),
                           "pencilfft": float(np.sum(a[0], dtype=np.float64))}
        else:
            err = {what: _err(a, b)}
        if what == "forces":  # JaxPM's pm_forces given pencilfft's density: FFTs and readout
            rho = jax.jit(lambda d: pencilfft.paint(d, max_displacement=args.max_displacement))(dx)
            same = jax.jit(lambda d, r: pm.pm_forces(d, mesh_shape=tuple(shape), delta=r, sharding=sharding,
                                                     paint_absolute_pos=False, halo_size=(halo, halo)))(dx, rho)
            err["forces, JaxPM given pencilfft's density"] = _err(a, same)
        if what == "grad":  # JaxPM's own gradient on one device (no halos): the reference
            one = jax.jit(jax.grad(_paint_read(*_jaxpm_pair(painting), loss=True)))(jnp.asarray(dx_np))
            n = mesh.size
            err = {f"vs JaxPM {n} dev": err["grad"], "vs JaxPM 1 dev": _err(a, one),
                   f"JaxPM {n} dev vs 1 dev": _err(b, one)}
        med = {impl: statistics.median(t) for impl, t in times.items()}
        rec = {"shape": list(shape), "pdims": list(pdims), "what": what, "halo_jaxpm": halo,
               "max_displacement": args.max_displacement, "rms": args.rms,
               "max_abs_dx": float(np.abs(dx_np).max()),
               "median_s": med, "times_s": times, "speedup": med["jaxpm"] / med["pencilfft"],
               "rel_err": err, "mem_bytes": {k: v.get("total") for k, v in mem.items()},
               "mem_temp_bytes": {k: v.get("temp") for k, v in mem.items()},
               "loadavg_start_end": [load0, harness.loadavg()], **harness.stamp(ctx)}
        harness.say(args, f"{harness.fmt_dims(shape)} {what}: speed-up {rec['speedup']:.2f}")
        records.append(rec)
    return records


def _fmt_err(k, v) -> str:
    if k == "mass":
        return (f"mass JaxPM {v['jaxpm']:.0f}, pencilfft {v['pencilfft']:.0f} "
                f"(particles {v['particles']})")
    return f"{k} {v['max']:.1e} ({v['n_over_1e-4']} of {v['n']} > 1e-4)"


def table(records) -> str:
    """One row per (grid, mesh, what): medians, speed-up, differences, memory."""
    rows = [[harness.fmt_dims(r["shape"]), harness.fmt_dims(r["pdims"]), r["what"],
             harness.fmt_ms(r["median_s"]["jaxpm"]), harness.fmt_ms(r["median_s"]["pencilfft"]),
             f"{r['speedup']:.1f}x", "; ".join(_fmt_err(k, v) for k, v in r["rel_err"].items()),
             f"{(r['mem_bytes']['jaxpm'] or 0) / 2**20:.0f}",
             f"{(r['mem_bytes']['pencilfft'] or 0) / 2**20:.0f}"] for r in records]
    return harness.md_table(["grid", "mesh", "what", "JaxPM ms", "pencilfft ms", "speed-up",
                             "max rel. diff.", "MiB/device JaxPM", "MiB/device pencilfft"], rows)


OPTIONS = dict(devices=8, shapes=["128"], pdims=dict(default=["4x2"], type=harness.parse_pxq),
               repeats=5, seed=0, out="results/paint.jsonl")


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--what", nargs="+", choices=["paint+readout", "forces", "grad"],
                   default=["paint+readout", "forces", "grad"])
    p.add_argument("--rms", type=float, default=0.3, help="displacement rms per component")
    p.add_argument("--halo", type=int, default=0,
                   help="JaxPM's halo_size (default: 16 up to 128^3, else 32, as measured in "
                        "issue 44)")
    p.add_argument("--max-displacement", type=float, default=None,
                   help="pencilfft's bound (default: pencilfft's default)")
    p.add_argument("--jaxpm", default=os.environ.get("JAXPM_PATH"),
                   help="path of a JaxPM checkout (default: $JAXPM_PATH, else installed jaxpm)")


TABLES = {"paint": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
