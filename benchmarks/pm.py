"""Particle-mesh benchmark: a small N-body code on a sharded grid, pure JAX + pencilfft.

    python -m benchmarks.pm --devices 8 --shapes 64 128 --pdims 4x2 --steps 5
    mpirun -np 2 python -m benchmarks.pm --devices 4 --shapes 64 --pdims 4x2
    srun python -m benchmarks.pm --shapes 512 --pdims 2x4            (one task per GPU)
    python -m benchmarks.pm table results/pm.jsonl

The workload is JaxPM's: one particle per grid cell (a displacement field (X, Y, Z, 3) split like
the grid), CIC painting with halos, real or complex 3D FFT, Poisson kernel -alpha/k^2 and the
4th-order finite-difference gradient, three inverse FFTs, CIC readout of the forces with halos;
Zel'dovich (1LPT) initial conditions, then `--steps` drift-kick-drift leapfrog steps in one
`lax.scan`.  The box is static and the forces x'' = -grad(phi), lap(phi) = alpha * delta, so the
linear growing mode is exp(sqrt(alpha) t): the initial velocities are sqrt(alpha) times the
displacements and the run spans `--t-end` in `--steps` steps.  Everything runs inside `jax.jit`
on an Auto mesh with no mesh in scope, the way JaxPM calls jaxdecomp: the local particle work
(painting, readout, padding) is a `shard_map` over the mesh, the FFTs and halo exchanges are
library calls.

Painting follows JaxPM: each block is padded by 2h cells on each split side, painted locally, the
halo exchange (extent h) brings the inner halves of the neighbours' pads, which are added to the
block's edge cells; readout pads by h and exchanges.  Particles must therefore stay within h
cells of their Lagrangian cell (`max_displacement` is recorded; a run that leaves the halo is
marked wrong).

Implementations (`--impls`): `pencilfft` (prfft3d / pirfft3d / rfftfreq3d / halo_exchange),
`pencilfft-c2c` (the same code as jaxdecomp's run, through `pencilfft.compat`: pfft3d / pifft3d /
fftfreq3d / halo_exchange / get_fft_output_sharding), `jaxdecomp` (jaxdecomp's five names, if
installed; 2-axis meshes), `1dev` (the same pipeline on one device with jnp.fft.rfftn: the
reference every other run is checked against).

Timed: the compiled `lax.scan` of `--steps` steps (state in, state out), `--repeats` times after
`--warmup` calls, round-robin over the implementations as in benchmarks.harness; a step is the
median divided by `--steps`.  The LPT program (noise to initial displacements and velocities) is timed
the same way.  Per-device memory is XLA's memory analysis of the compiled steps program.
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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

SCHEMA = 1
IMPLS: dict[str, str] = {
    "pencilfft": "pencilfft.prfft3d / pirfft3d / rfftfreq3d + pencilfft.halo_exchange "
                 "(real-to-complex)",
    "pencilfft-c2c": "jaxdecomp's five names from pencilfft.compat: pfft3d / pifft3d / "
                     "fftfreq3d / halo_exchange / get_fft_output_sharding (complex-to-complex)",
    "jaxdecomp": "jaxdecomp's pfft3d / pifft3d / fftfreq3d / halo_exchange / "
                 "get_fft_output_sharding (backend 'jax'; 2-axis meshes)",
    "1dev": "the same pipeline on one device, jnp.fft.rfftn / irfftn, no halos: the reference",
}
REFERENCE = "1dev"
DTYPES = ("float32", "float64")
# Acceptance of the check: max|dx - dx_ref| / max|dx_ref| after the run, per precision.
CHECK_TOL = {"float32": 1e-4, "float64": 1e-10}
CHECK_MAX_POINTS_MP = harness.CHECK_MAX_POINTS_MP


# --------------------------------------------------------------------------------------------
# The physics (jax imported lazily: the CLI must set the device count first)
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Physics:
    """The toy cosmology; lengths in grid cells."""

    sigma: float = 0.15  # rms of each initial displacement component (cells)
    smoothing: float = 1.5  # Gaussian smoothing of the initial white noise (cells)
    alpha: float = 1.0  # lap(phi) = alpha * delta
    t_end: float = 0.5  # span of the leapfrog steps

    @property
    def amplitude(self) -> float:
        """Noise amplitude giving rms displacement `sigma` (continuum limit of the sum over k):
        var(psi_i) = A^2 / (2 pi)^3 * int k_i^2 / k^4 exp(-k^2 R^2) d^3k = A^2 sqrt(pi) / (12 pi^2 R)."""
        return self.sigma / math.sqrt(math.sqrt(math.pi) / (12 * math.pi**2 * self.smoothing))


@dataclasses.dataclass(frozen=True)
class Ops:
    """The library calls of the pipeline (global arrays in and out).

    fft: real (X, Y, Z) -> spectrum; ifft: spectrum -> real (X, Y, Z); freqs: spectrum ->
    (kx, ky, kz) broadcasting against it; halo: jaxdecomp's halo_exchange(x, extents, periods)
    (None on one device); k_sharding: real-space sharding -> the spectrum's (None: no constraint).
    """

    fft: Callable
    ifft: Callable
    freqs: Callable
    halo: Callable | None
    k_sharding: Callable | None


def ops_from_module(lib) -> Ops:
    """Ops from a module with jaxdecomp's five names (jaxdecomp itself, or pencilfft.compat)."""
    return Ops(fft=lambda x: lib.pfft3d(x.astype(_complex(x.dtype))),
               ifft=lambda k: lib.pifft3d(k).real,
               freqs=lib.fftfreq3d, halo=lib.halo_exchange,
               k_sharding=lib.get_fft_output_sharding)


def pencilfft_r2c_ops(shape) -> Ops:
    import pencilfft

    shape = tuple(shape)
    return Ops(fft=pencilfft.prfft3d, ifft=lambda k: pencilfft.pirfft3d(k, shape),
               freqs=lambda k: pencilfft.rfftfreq3d(k, s=shape), halo=pencilfft.halo_exchange,
               k_sharding=None)


def one_device_ops(shape) -> Ops:
    """jnp.fft on one device, natural order: independent of the libraries under test."""
    import jax.numpy as jnp
    import numpy as np

    X, Y, Z = shape

    def freqs(k):
        dtype = np.float64 if k.dtype == np.complex128 else np.float32
        vec = [2 * np.pi * np.fft.fftfreq(X), 2 * np.pi * np.fft.fftfreq(Y),
               2 * np.pi * np.fft.rfftfreq(Z)]
        return tuple(jnp.asarray(v.astype(dtype).reshape([-1 if i == j else 1 for j in range(3)]))
                     for i, v in enumerate(vec))

    return Ops(fft=jnp.fft.rfftn, ifft=lambda k: jnp.fft.irfftn(k, s=shape), freqs=freqs,
               halo=None, k_sharding=None)


def _complex(dtype):
    import numpy as np

    return np.complex128 if np.dtype(dtype) == np.float64 else np.complex64


@dataclasses.dataclass(frozen=True)
class Grid:
    """Where the particles live: global grid shape, mesh (None: one device), halo width h."""

    shape: tuple[int, int, int]
    mesh: Any = None
    halo: int = 2

    @property
    def axes(self) -> tuple[str | None, str | None]:
        if self.mesh is None:
            return (None, None)
        names = tuple(self.mesh.axis_names)
        return names + (None,) * (2 - len(names))

    @property
    def split(self) -> tuple[bool, bool]:
        """Which of X, Y the mesh splits (a mesh axis of size 1 splits nothing)."""
        return tuple(a is not None and self.mesh.shape[a] > 1 for a in self.axes)

    @property
    def pads(self) -> tuple[int, int]:
        """Painting pads, per side of each split axis: 2h (JaxPM's scheme, see the module doc)."""
        return tuple(2 * self.halo if s else 0 for s in self.split)

    def spec(self, lead: int = 0, trail: int = 0):
        from jax.sharding import PartitionSpec as P

        return P(*([None] * lead), *self.axes, *([None] * trail))

    def local(self, f, in_specs, out_specs):
        """f on every device's blocks (f itself on one device)."""
        import jax

        if self.mesh is None:
            return f
        return jax.shard_map(f, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs)


def _corners(dx, pads):
    """CIC of particles at (local cell + dx) in a block padded by `pads`: the padded block's
    shape and, for each of the 8 neighbour cells, its flat index in that block and the weights.

    Only dx's floor and fraction enter, never an absolute position, so that the same particle
    gives bit-identical weights on any mesh.  Flat indices: XLA compiles a 1-D scatter/gather
    in half the time of a 3-D one.
    """
    import jax.numpy as jnp

    bx, by, Z = dx.shape[:3]
    size = (bx + 2 * pads[0], by + 2 * pads[1], Z)
    fl = jnp.floor(dx)
    frac = dx - fl
    cell = jnp.stack(jnp.meshgrid(jnp.arange(bx) + pads[0], jnp.arange(by) + pads[1],
                                  jnp.arange(Z), indexing="ij"), axis=-1)
    base = cell + fl.astype(jnp.int32)
    out = []
    for c in range(8):
        offset = [(c >> d) & 1 for d in range(3)]
        w, flat = 1, 0
        for d in range(3):
            w = w * (frac[..., d] if offset[d] else 1 - frac[..., d])
            flat = flat * size[d] + (base[..., d] + offset[d]) % size[d]
        out.append((flat, w))
    return size, out


def _paint_block(dx, pads):
    import jax.numpy as jnp

    size, corners = _corners(dx, pads)
    flat = jnp.stack([f for f, _ in corners]).ravel()
    w = jnp.stack([w for _, w in corners]).ravel()
    return jnp.zeros(math.prod(size), dx.dtype).at[flat].add(w).reshape(size)


def _fold_block(grid, pads):
    """Add the halo cells (filled by the exchange with the neighbours' inner pads) to the edge
    cells they stand for, then cut the padding."""
    for axis, p in enumerate(pads):
        if p == 0:
            continue
        h = p // 2
        n = grid.shape[axis]
        take = lambda lo, hi: tuple(slice(lo, hi) if a == axis else slice(None) for a in range(3))  # noqa: E731
        grid = grid.at[take(p, p + h)].add(grid[take(0, h)])
        grid = grid.at[take(n - p - h, n - p)].add(grid[take(n - h, n)])
        grid = grid[take(p, n - p)]
    return grid


def _read_block(fields, dx, pads):
    """fields (C, bx + 2 r, by + 2 r, Z) with filled halos -> values at the particles (bx, by, Z, C)."""
    import jax.numpy as jnp

    _, corners = _corners(dx, pads)
    flat = fields.reshape(fields.shape[0], -1)
    vals = sum(flat[:, f] * w for f, w in corners)
    return jnp.moveaxis(vals, 0, -1)


def paint(dx, grid: Grid, ops: Ops):
    """Density (mean 1) of the particles at (Lagrangian cell + dx); dx global (X, Y, Z, 3)."""
    pads = grid.pads
    field = grid.local(functools.partial(_paint_block, pads=pads), grid.spec(trail=2),
                       grid.spec(trail=1))(dx)
    if pads == (0, 0):
        return field
    field = ops.halo(field, tuple(p // 2 for p in pads), (True, True))
    return grid.local(functools.partial(_fold_block, pads=pads), grid.spec(trail=1),
                      grid.spec(trail=1))(field)


def readout(fields, dx, grid: Grid, ops: Ops):
    """Values of fields (C, X, Y, Z) at the particles: (X, Y, Z, C)."""
    import jax.numpy as jnp

    reads = tuple(p // 2 for p in grid.pads)
    if reads != (0, 0):
        widths = ((0, 0), (reads[0],) * 2, (reads[1],) * 2, (0, 0))
        fields = grid.local(lambda f: jnp.pad(f, widths), grid.spec(1, 1), grid.spec(1, 1))(fields)
        fields = ops.halo(fields, reads, (True, True))
    return grid.local(functools.partial(_read_block, pads=reads), (grid.spec(1, 1), grid.spec(trail=2)),
                      grid.spec(trail=2))(fields, dx)


def _spectrum(field, grid: Grid, ops: Ops):
    import jax
    from jax.sharding import NamedSharding

    k = ops.fft(field)
    if ops.k_sharding is not None and grid.mesh is not None:  # as JaxPM does after its fft3d
        k = jax.lax.with_sharding_constraint(k, ops.k_sharding(NamedSharding(grid.mesh, grid.spec())))
    return k


def _gradients(k, ops: Ops):
    """(k^2, the 3 gradient kernels): 4th-order finite differences i (8 sin k - sin 2k) / 6."""
    import jax.numpy as jnp

    ks = ops.freqs(k)
    k2 = sum(kk**2 for kk in ks)
    grads = [1j * (8 * jnp.sin(kk) - jnp.sin(2 * kk)) / 6 for kk in ks]
    return k2, grads


def _inv_laplace(k2):
    import jax.numpy as jnp

    return jnp.where(k2 > 0, 1 / jnp.where(k2 > 0, k2, 1), 0)


def forces(dx, grid: Grid, ops: Ops, phys: Physics):
    """-grad(phi) at the particles, lap(phi) = alpha * delta of their CIC density: (X, Y, Z, 3)."""
    import jax.numpy as jnp

    k = _spectrum(paint(dx, grid, ops), grid, ops)
    k2, grads = _gradients(k, ops)
    minus_phi = k * (phys.alpha * _inv_laplace(k2))
    f = jnp.stack([ops.ifft(g * minus_phi) for g in grads])
    return readout(f, dx, grid, ops)


def lpt(noise, grid: Grid, ops: Ops, phys: Physics):
    """Zel'dovich initial state (dx, v), each (X, Y, Z, 3), from unit white noise (X, Y, Z)."""
    import jax.numpy as jnp

    k = _spectrum(noise, grid, ops)
    k2, grads = _gradients(k, ops)
    delta = k * (phys.amplitude * jnp.exp(-0.5 * k2 * phys.smoothing**2))
    dx = jnp.stack([ops.ifft(g * delta * _inv_laplace(k2)) for g in grads], axis=-1)
    return dx, math.sqrt(phys.alpha) * dx


def leapfrog(state, grid: Grid, ops: Ops, phys: Physics, steps: int):
    """`steps` drift-kick-drift leapfrog steps over phys.t_end in one lax.scan: one force
    evaluation per step."""
    import jax

    dt = phys.t_end / steps

    def dkd(carry, _):
        dx, v = carry
        dx = dx + 0.5 * dt * v
        v = v + dt * forces(dx, grid, ops, phys)
        return (dx + 0.5 * dt * v, v), None

    return jax.lax.scan(dkd, state, None, length=steps)[0]


def programs(grid: Grid, ops: Ops, phys: Physics, steps: int) -> dict[str, Callable]:
    """The jitted programs: 'lpt' (noise -> state), 'steps' (state -> state), 'density'."""
    import jax

    return {
        "lpt": jax.jit(lambda n: lpt(n, grid, ops, phys)),
        "steps": jax.jit(lambda s: leapfrog(s, grid, ops, phys, steps)),
        "density": jax.jit(lambda dx: paint(dx, grid, ops)),
    }


def simulate(noise, grid: Grid, ops: Ops, phys: Physics = Physics(), steps: int = 2):
    """LPT then `steps` leapfrog steps: (final displacements (X, Y, Z, 3), density (X, Y, Z))."""
    progs = programs(grid, ops, phys, steps)
    state = progs["steps"](progs["lpt"](noise))
    return state[0], progs["density"](state[0])


# --------------------------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.pm",
        description="Time a particle-mesh N-body step (CIC paint with halos, FFT, gravity kernel, "
                    "inverse FFTs, CIC readout) on a sharded grid with pencilfft, jaxdecomp and "
                    "one device; check every run against the one-device run.  One JSON line per "
                    "(case, implementation) appended to --out; `python -m benchmarks.pm table "
                    "FILE...` prints saved results.",
        epilog="Implementations:\n" + "\n".join(f"  {k:<14} {v}" for k, v in IMPLS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--shapes", "--shape", nargs="+", type=harness.parse_shape,
                   default=[harness.parse_shape("64")], metavar="N|XxYxZ")
    p.add_argument("--pdims", nargs="+", type=harness.parse_pdims, default=["auto"],
                   metavar="PxQ|P|auto", help="meshes, as benchmarks.fft (default: auto)")
    p.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(IMPLS))
    p.add_argument("--skip", nargs="+", choices=list(IMPLS), default=[], metavar="IMPL")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--steps", type=int, default=5, help="leapfrog steps per run (default: 5)")
    p.add_argument("--halo", type=int, default=2,
                   help="halo width h in cells: paint pads 2h, readout h (default: 2)")
    p.add_argument("--t-end", type=float, default=Physics.t_end,
                   help=f"time span of the steps (growth exp(t); default {Physics.t_end})")
    p.add_argument("--sigma", type=float, default=Physics.sigma,
                   help=f"initial rms displacement in cells (default {Physics.sigma})")
    p.add_argument("--repeats", type=int, default=5, help="timed runs (default: 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="compare with the one-device run (default: on; under several processes up "
                        "to 256^3)")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="simulated CPU devices per process (as benchmarks.fft)")
    p.add_argument("--out", type=Path, default=Path("results/pm.jsonl"))
    p.add_argument("--tag", default="")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    return p


def check_args(args: argparse.Namespace) -> None:
    if args.repeats < 1 or args.warmup < 0 or args.steps < 1 or args.halo < 1:
        raise SystemExit("error: --repeats, --steps and --halo must be >= 1, --warmup >= 0")
    if not [i for i in args.impls if i not in args.skip]:
        raise SystemExit("error: every implementation is skipped")


def _log(args, msg: str) -> None:
    import jax

    if not args.quiet and jax.process_index() == 0:
        print(msg, flush=True)


def _time(fn, arg) -> float:
    from pencilfft._measure import time_once

    return time_once(fn, arg)[0]


@dataclasses.dataclass
class Run:
    impl: str
    status: str = "ok"
    note: str = ""
    grid: Any = None
    progs: dict = dataclasses.field(default_factory=dict)
    noise: Any = None
    state: Any = None
    compile_s: dict = dataclasses.field(default_factory=dict)
    mem: dict = dataclasses.field(default_factory=dict)
    times: dict = dataclasses.field(default_factory=lambda: {"lpt": [], "steps": []})
    err: dict = dataclasses.field(default_factory=dict)
    max_disp: float | None = None

    def fail(self, status: str, e) -> None:
        self.status = status
        self.note = (e if isinstance(e, str) else f"{type(e).__name__}: {e}")[:400]
        self.progs, self.state = {}, None


def _build(impl: str, shape, pdims, args, phys: Physics, noise) -> Run:
    import importlib

    import jax

    run = Run(impl)
    try:
        if impl == REFERENCE:
            if jax.process_count() > 1 and math.prod(shape) > CHECK_MAX_POINTS_MP:
                raise harness.Skip("one-device run skipped under several processes above 256^3")
            run.grid, ops = Grid(tuple(shape), None, args.halo), one_device_ops(shape)
            run.noise = jax.device_put(harness.to_numpy(noise), jax.local_devices()[0])
        else:
            if impl == "jaxdecomp":
                if len(pdims) != 2:
                    raise harness.Skip("jaxdecomp needs a 2-axis mesh")
                try:
                    lib = importlib.import_module("jaxdecomp")
                except Exception as e:  # noqa: BLE001
                    raise harness.Skip(f"jaxdecomp not importable ({type(e).__name__}: {e})")
                ops = ops_from_module(lib)
            elif impl == "pencilfft-c2c":
                ops = ops_from_module(importlib.import_module("pencilfft.compat"))
            else:
                ops = pencilfft_r2c_ops(shape)
            run.grid, run.noise = Grid(tuple(shape), noise.sharding.mesh, args.halo), noise
        run.progs = programs(run.grid, ops, phys, args.steps)
        t0 = time.perf_counter()
        lpt = run.progs["lpt"].lower(run.noise).compile()
        run.compile_s["lpt"] = time.perf_counter() - t0
        run.state = lpt(run.noise)
        t0 = time.perf_counter()
        steps = run.progs["steps"].lower(run.state).compile()
        run.compile_s["steps"] = time.perf_counter() - t0
        run.mem = harness.memory_stats(steps)
        run.progs.update(lpt=lpt, steps=steps)
    except harness.Skip as e:
        run.fail("skipped", str(e))
    except Exception as e:  # noqa: BLE001 - one broken implementation must not stop the others
        run.fail("error", e)
    return run


def _check(runs: list[Run], dtype: str) -> None:
    import numpy as np

    from pencilfft._measure import max_rel_err

    results = {}
    for r in runs:
        if r.status != "ok":
            continue
        try:
            dx = r.progs["steps"](r.state)[0]
            rho = r.progs["density"](dx)
            results[r.impl] = harness.to_numpy(dx), harness.to_numpy(rho)
        except Exception as e:  # noqa: BLE001
            r.fail("error", e)
    for r in runs:
        if r.impl not in results:
            continue
        dx, rho = results[r.impl]
        r.max_disp = float(np.abs(dx).max())
        if r.max_disp >= r.grid.halo and r.grid.mesh is not None:
            r.status, r.note = "wrong", f"particles moved {r.max_disp:.2f} >= halo {r.grid.halo} cells"
        if REFERENCE in results and r.impl != REFERENCE:
            ref_dx, ref_rho = results[REFERENCE]
            r.err = {"dx": max_rel_err(dx, ref_dx), "density": max_rel_err(rho, ref_rho)}
            if max(r.err.values()) > CHECK_TOL[dtype] and r.status == "ok":
                r.status, r.note = "wrong", f"max rel err {max(r.err.values()):.2e} > {CHECK_TOL[dtype]:.0e}"


def run_case(shape, pdims, args, context) -> list[dict[str, Any]]:
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding

    phys = Physics(sigma=args.sigma, t_end=args.t_end)
    devices = jax.devices()[: math.prod(pdims)]
    mesh = jax.make_mesh(pdims, ("x", "y")[: len(pdims)], axis_types=(AxisType.Auto,) * len(pdims),
                         devices=devices)
    grid = Grid(tuple(shape), mesh, args.halo)
    noise = harness.make_input(shape, NamedSharding(mesh, grid.spec()), args.dtype, args.seed)
    label = f"{harness.fmt_dims(shape)} {args.dtype} pdims {harness.fmt_dims(pdims)}"
    load_start = _loadavg()
    runs = []
    for impl in [i for i in args.impls if i not in args.skip]:
        _log(args, f"{label}: compile {impl}")
        runs.append(_build(impl, shape, pdims, args, phys, noise))
    for rep in range(args.warmup + args.repeats):
        live = [r for r in runs if r.status == "ok"]
        k = rep % len(live) if live else 0
        for r in live[k:] + live[:k]:  # round-robin, the first rotating
            for prog, arg in (("lpt", r.noise), ("steps", r.state)):
                t = _time(r.progs[prog], arg)
                if rep >= args.warmup:
                    r.times[prog].append(t)
        _log(args, f"{label}: " + (f"warm-up {rep + 1}" if rep < args.warmup else f"repeat {rep - args.warmup + 1}"))
    # the slowest process sets each time
    t = np.full((len(runs), 2, args.repeats), np.nan)
    for i, r in enumerate(runs):
        for j, prog in enumerate(("lpt", "steps")):
            if r.status == "ok" and len(r.times[prog]) == args.repeats:
                t[i, j] = r.times[prog]
    t = harness.gather_max(t)
    if args.check and (jax.process_count() == 1 or math.prod(shape) <= CHECK_MAX_POINTS_MP):
        _check(runs, args.dtype)
    # Other jobs on the machine slow every implementation: the load averages tell a reader.
    context = dict(context, loadavg=[load_start, _loadavg()])
    return [make_record(r, t[i], shape, pdims, args, context) for i, r in enumerate(runs)]


def _loadavg() -> float | None:
    """The host's 1-minute load average (None where the OS does not tell)."""
    import os

    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def make_record(r: Run, t, shape, pdims, args, context) -> dict[str, Any]:
    import numpy as np

    ok = r.status in ("ok", "wrong") and not np.isnan(t).any()
    lpt = [float(v) for v in t[0]] if ok else None
    steps = [float(v) for v in t[1]] if ok else None
    med = statistics.median(steps) if steps else None
    mem = r.mem or {}
    return {
        "schema": SCHEMA, "timestamp": context["timestamp"], "tag": args.tag,
        "status": r.status if ok or r.status != "ok" else "error", "note": r.note,
        "impl": r.impl, "shape": list(shape), "n_particles": math.prod(shape),
        "dtype": args.dtype, "pdims": list(pdims) if r.impl != REFERENCE else [1],
        "n_devices": math.prod(pdims) if r.impl != REFERENCE else 1,
        "steps": args.steps, "halo": args.halo, "t_end": args.t_end, "sigma": args.sigma,
        "repeats": args.repeats, "warmup": args.warmup,
        "compile_lpt_s": r.compile_s.get("lpt"), "compile_steps_s": r.compile_s.get("steps"),
        "lpt_median_s": statistics.median(lpt) if lpt else None,
        "steps_median_s": med, "step_median_s": med / args.steps if med else None,
        "step_min_s": min(steps) / args.steps if steps else None,
        "step_max_s": max(steps) / args.steps if steps else None,
        "steps_times_s": steps, "lpt_times_s": lpt,
        "mem_argument_bytes": mem.get("argument"), "mem_output_bytes": mem.get("output"),
        "mem_temp_bytes": mem.get("temp"), "mem_bytes": mem.get("total"),
        "max_rel_err_dx": r.err.get("dx"), "max_rel_err_density": r.err.get("density"),
        "max_displacement": r.max_disp, "loadavg_start_end": context.get("loadavg"),
        "machine": context["machine"], "versions": context["versions"], "command": context["command"],
    }


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:.3g}" if s < 1 else f"{s * 1e3:.0f}"


def _mib(b: int | None) -> str:
    return "—" if b is None else f"{b / 2**20:.1f}"


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (shape, mesh, implementation): the latest record of each."""
    latest: dict[tuple, dict[str, Any]] = {}
    for r in records:
        latest[(tuple(r["shape"]), r["dtype"], tuple(r["pdims"]), r["impl"], r["steps"])] = r
    head = ("| grid | dtype | mesh | implementation | ms / step | LPT ms | MiB / device | "
            "max rel err (dx, density) | max disp. (cells) | status |")
    lines = [head, "|" + "---|" * 10]
    order = list(IMPLS)
    for key in sorted(latest, key=lambda k: (math.prod(k[0]), k[1], k[2] != (1,), k[2],
                                              order.index(k[3]) if k[3] in order else 99)):
        r = latest[key]
        err = ("—" if r["max_rel_err_dx"] is None else
               f"{r['max_rel_err_dx']:.1e}, {r['max_rel_err_density']:.1e}")
        lines.append("| " + " | ".join([
            harness.fmt_dims(r["shape"]), r["dtype"], harness.fmt_dims(r["pdims"]), r["impl"],
            _ms(r["step_median_s"]), _ms(r["lpt_median_s"]), _mib(r["mem_bytes"]),
            err, "—" if r["max_displacement"] is None else f"{r['max_displacement']:.2f}",
            r["status"] + (f" ({r['note']})" if r["status"] not in ("ok",) and r["note"] else ""),
        ]) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    harness.configure_devices(args.devices)
    import jax

    import pencilfft

    pencilfft.initialize()
    if args.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    cases = harness.make_cases(argparse.Namespace(shapes=args.shapes, dtypes=[args.dtype], pdims=args.pdims),
                               jax.device_count(), exact=jax.process_count() > 1)
    context = {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": harness.machine_info(), "versions": harness.versions(),
        "command": "python -m benchmarks.pm " + shlex.join(argv),
    }
    is_main = jax.process_index() == 0
    if is_main:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    for case in cases:
        recs = run_case(case.shape, case.pdims, args, context)
        records.extend(recs)
        if is_main:
            with open(args.out, "a", encoding="utf-8") as f:
                for r in recs:
                    f.write(json.dumps(r) + "\n")
    if is_main:
        print(markdown_table(records))
        print(f"{len(records)} records appended to {args.out}")
    return 1 if any(r["status"] in ("error", "wrong") for r in records) else 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "table":
        if len(argv) < 2:
            raise SystemExit("usage: python -m benchmarks.pm table FILE...")
        print(markdown_table(harness.load_records(argv[1:])))
        return 0
    args = build_parser().parse_args(argv)
    check_args(args)
    if args.dry_run:
        cases = harness.make_cases(argparse.Namespace(shapes=args.shapes, dtypes=[args.dtype],
                                                      pdims=args.pdims), args.devices)
        impls = [i for i in args.impls if i not in args.skip]
        print(f"{len(cases)} case(s) x {len(impls)} implementation(s), {args.steps} steps, halo "
              f"{args.halo}; {args.warmup} warm-up + {args.repeats} timed runs; results -> {args.out}")
        for c in cases:
            print(f"  case {harness.fmt_dims(c.shape)} {args.dtype} pdims {harness.fmt_dims(c.pdims)}")
        return 0
    return run(args, argv)


if __name__ == "__main__":
    sys.exit(main())
