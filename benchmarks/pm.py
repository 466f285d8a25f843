"""Particle-mesh benchmark: a small N-body code on a sharded grid, pure JAX + pencilfft.

    python -m benchmarks.pm --devices 8 --shapes 64 128 --pdims 4x2 --steps 5
    mpirun -np 2 python -m benchmarks.pm --devices 4 --shapes 64 --pdims 4x2
    srun python -m benchmarks.pm --shapes 512 --pdims 2x4            (one task per GPU)
    python -m benchmarks.pm table results/pm.jsonl

The workload is JaxPM's: one particle per grid cell (a displacement field (X, Y, Z, 3) split like
the grid), CIC painting with halos, real or complex 3D FFT, Poisson kernel -alpha/k^2 and the
4th-order finite-difference gradient, three inverse FFTs, CIC readout of the forces with halos;
Zel'dovich (1LPT) initial conditions, then `--steps` drift-kick-drift leapfrog steps in one
`lax.scan`.  The box is static and lap(phi) = alpha * delta, so the linear growing mode is
exp(sqrt(alpha) t): the initial velocities are sqrt(alpha) times the displacements.  Everything
runs inside `jax.jit` on an Auto mesh with no mesh in scope, the way JaxPM calls jaxdecomp: the
particle work is a `shard_map`, the FFTs and halo exchanges are library calls.  Painting follows
JaxPM: each block is padded by 2h cells on each split side, painted locally, the halo exchange
(extent h) brings the neighbours' inner pads, which are added to the block's edge cells;
readout pads by h and exchanges.  A particle that leaves its halo makes the run "wrong".

Timed, in the harness's interleaved rounds: the LPT program and the compiled `lax.scan` of
`--steps` steps (a step: its median / `--steps`); memory: XLA's analysis of the steps program.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from benchmarks import harness, private

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


@dataclasses.dataclass(frozen=True)
class Physics:
    """The toy cosmology; lengths in grid cells."""

    sigma: float = 0.15  # rms of each initial displacement component (cells)
    smoothing: float = 1.5  # Gaussian smoothing of the initial white noise (cells)
    alpha: float = 1.0  # lap(phi) = alpha * delta
    t_end: float = 0.5  # span of the leapfrog steps

    @property
    def amplitude(self) -> float:
        """Noise amplitude of rms displacement `sigma`: A^2 sqrt(pi) / (12 pi^2 R) = sigma^2."""
        return self.sigma / math.sqrt(math.sqrt(math.pi) / (12 * math.pi**2 * self.smoothing))


@dataclasses.dataclass(frozen=True)
class Ops:
    """The pipeline's library calls: fft, ifft, freqs, halo (None: one device), k_sharding."""

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
    shape = tuple(shape)
    return Ops(fft=pencilfft.prfft3d, ifft=lambda k: pencilfft.pirfft3d(k, shape),
               freqs=lambda k: pencilfft.rfftfreq3d(k, s=shape), halo=pencilfft.halo_exchange,
               k_sharding=None)


def one_device_ops(shape) -> Ops:
    """jnp.fft on one device, natural order: independent of the libraries under test."""
    X, Y, Z = shape

    def freqs(k):
        dtype = np.float64 if k.dtype == np.complex128 else np.float32
        vec = [np.fft.fftfreq(X), np.fft.fftfreq(Y), np.fft.rfftfreq(Z)]
        return tuple(jnp.asarray((2 * np.pi * v).astype(dtype).reshape(
            [-1 if i == j else 1 for j in range(3)])) for i, v in enumerate(vec))

    return Ops(fft=jnp.fft.rfftn, ifft=lambda k: jnp.fft.irfftn(k, s=shape), freqs=freqs,
               halo=None, k_sharding=None)


def _complex(dtype):
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
        return P(*([None] * lead), *self.axes, *([None] * trail))

    def local(self, f, in_specs, out_specs):
        """f on every device's blocks (f itself on one device)."""
        if self.mesh is None:
            return f
        return jax.shard_map(f, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs)


def _corners(dx, pads):
    """CIC of particles at cell + dx in a block padded by `pads`: flat indices and weights."""
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
    size, corners = _corners(dx, pads)
    flat, w = (jnp.stack(c).ravel() for c in zip(*corners))
    return jnp.zeros(math.prod(size), dx.dtype).at[flat].add(w).reshape(size)


def _fold_block(grid, pads):
    """Add the filled halo cells to the edge cells they stand for; cut the padding."""
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
    reads = tuple(p // 2 for p in grid.pads)
    if reads != (0, 0):
        widths = ((0, 0), (reads[0],) * 2, (reads[1],) * 2, (0, 0))
        fields = grid.local(lambda f: jnp.pad(f, widths), grid.spec(1, 1), grid.spec(1, 1))(fields)
        fields = ops.halo(fields, reads, (True, True))
    return grid.local(functools.partial(_read_block, pads=reads), (grid.spec(1, 1), grid.spec(trail=2)),
                      grid.spec(trail=2))(fields, dx)


def _spectrum(field, grid: Grid, ops: Ops):
    k = ops.fft(field)
    if ops.k_sharding is not None and grid.mesh is not None:  # as JaxPM does after its fft3d
        k = jax.lax.with_sharding_constraint(k, ops.k_sharding(NamedSharding(grid.mesh, grid.spec())))
    return k


def _gradients(k, ops: Ops):
    """(k^2, the 3 gradient kernels): 4th-order finite differences i (8 sin k - sin 2k) / 6."""
    ks = ops.freqs(k)
    k2 = sum(kk**2 for kk in ks)
    return k2, [1j * (8 * jnp.sin(kk) - jnp.sin(2 * kk)) / 6 for kk in ks]


def _inv_laplace(k2):
    return jnp.where(k2 > 0, 1 / jnp.where(k2 > 0, k2, 1), 0)


def forces(dx, grid: Grid, ops: Ops, phys: Physics):
    """-grad(phi) at the particles, lap(phi) = alpha * delta of their CIC density: (X, Y, Z, 3)."""
    k = _spectrum(paint(dx, grid, ops), grid, ops)
    k2, grads = _gradients(k, ops)
    minus_phi = k * (phys.alpha * _inv_laplace(k2))
    f = jnp.stack([ops.ifft(g * minus_phi) for g in grads])
    return readout(f, dx, grid, ops)


def lpt(noise, grid: Grid, ops: Ops, phys: Physics):
    """Zel'dovich initial state (dx, v), each (X, Y, Z, 3), from unit white noise (X, Y, Z)."""
    k = _spectrum(noise, grid, ops)
    k2, grads = _gradients(k, ops)
    delta = k * (phys.amplitude * jnp.exp(-0.5 * k2 * phys.smoothing**2))
    dx = jnp.stack([ops.ifft(g * delta * _inv_laplace(k2)) for g in grads], axis=-1)
    return dx, math.sqrt(phys.alpha) * dx


def leapfrog(state, grid: Grid, ops: Ops, phys: Physics, steps: int):
    """`steps` drift-kick-drift steps over phys.t_end in one lax.scan."""
    dt = phys.t_end / steps

    def dkd(carry, _):
        dx, v = carry
        dx = dx + 0.5 * dt * v
        v = v + dt * forces(dx, grid, ops, phys)
        return (dx + 0.5 * dt * v, v), None

    return jax.lax.scan(dkd, state, None, length=steps)[0]


def programs(grid: Grid, ops: Ops, phys: Physics, steps: int) -> dict[str, Callable]:
    """The jitted programs: 'lpt' (noise -> state), 'steps' (state -> state), 'density'."""
    return {"lpt": jax.jit(lambda n: lpt(n, grid, ops, phys)),
            "steps": jax.jit(lambda s: leapfrog(s, grid, ops, phys, steps)),
            "density": jax.jit(lambda dx: paint(dx, grid, ops))}


def simulate(noise, grid: Grid, ops: Ops, phys: Physics = Physics(), steps: int = 2):
    """LPT then `steps` leapfrog steps: (final displacements (X, Y, Z, 3), density (X, Y, Z))."""
    progs = programs(grid, ops, phys, steps)
    state = progs["steps"](progs["lpt"](noise))
    return state[0], progs["density"](state[0])


@dataclasses.dataclass
class Run:
    """One implementation's programs, state and measurements (the harness's loop runs it)."""

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
        self.status, self.progs, self.state = status, {}, None
        self.note = (e if isinstance(e, str) else f"{type(e).__name__}: {e}")[:400]

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def run(self, record: bool) -> None:
        """The LPT program, then the steps."""
        for prog, arg in (("lpt", self.noise), ("steps", self.state)):
            t, out = private.time_once(self.progs[prog], arg)
            del out
            if record:
                self.times[prog].append(t)


def _ops(impl: str, shape, pdims) -> Ops:
    if impl in (REFERENCE, "pencilfft"):
        return one_device_ops(shape) if impl == REFERENCE else pencilfft_r2c_ops(shape)
    if impl == "jaxdecomp" and len(pdims) != 2:
        raise harness.Skip("jaxdecomp needs a 2-axis mesh")
    try:
        return ops_from_module(importlib.import_module(
            "jaxdecomp" if impl == "jaxdecomp" else "pencilfft.compat"))
    except Exception as e:  # noqa: BLE001 - a library that cannot load is noted, not fatal
        raise harness.Skip(f"{impl} not importable ({type(e).__name__}: {e})")


def _build(impl: str, shape, pdims, args, phys: Physics, noise) -> Run:
    run = Run(impl)
    try:
        ops = _ops(impl, shape, pdims)
        if impl != REFERENCE:
            run.grid, run.noise = Grid(tuple(shape), noise.sharding.mesh, args.halo), noise
        elif jax.process_count() > 1 and math.prod(shape) > CHECK_MAX_POINTS_MP:
            raise harness.Skip("one-device run skipped under several processes above 256^3")
        else:
            run.grid = Grid(tuple(shape), None, args.halo)
            run.noise = jax.device_put(harness.to_numpy(noise), jax.local_devices()[0])
        run.progs = programs(run.grid, ops, phys, args.steps)
        for name in ("lpt", "steps"):
            t0 = time.perf_counter()
            run.progs[name] = run.progs[name].lower(run.state or run.noise).compile()
            run.compile_s[name] = time.perf_counter() - t0
            run.state = run.state or run.progs["lpt"](run.noise)
        run.mem = harness.memory_stats(run.progs["steps"])
    except harness.Skip as e:
        run.fail("skipped", str(e))
    except Exception as e:  # noqa: BLE001 - one broken implementation must not stop the others
        run.fail("error", e)
    return run


def _check(runs: list[Run], dtype: str) -> None:
    """Every run against the one-device run; a particle beyond its halo is wrong."""
    results = {}
    for r in runs:
        try:
            if r.ok:
                dx = r.progs["steps"](r.state)[0]
                results[r.impl] = harness.to_numpy(dx), harness.to_numpy(r.progs["density"](dx))
        except Exception as e:  # noqa: BLE001
            r.fail("error", e)
    ref = results.get(REFERENCE)
    for r in runs:
        if r.impl not in results:
            continue
        dx, rho = results[r.impl]
        r.max_disp = float(np.abs(dx).max())
        if r.max_disp >= r.grid.halo and r.grid.mesh is not None:
            r.status, r.note = "wrong", f"particles moved {r.max_disp:.2f} >= halo {r.grid.halo} cells"
        if ref is not None and r.impl != REFERENCE:
            r.err = {"dx": private.max_rel_err(dx, ref[0]), "density": private.max_rel_err(rho, ref[1])}
            if max(r.err.values()) > CHECK_TOL[dtype] and r.ok:
                r.status, r.note = "wrong", f"max rel err {max(r.err.values()):.2e} > {CHECK_TOL[dtype]:.0e}"


def run_case(shape, pdims, args, context) -> list[dict[str, Any]]:
    mesh = harness.make_mesh(pdims, "auto")
    grid = Grid(tuple(shape), mesh, args.halo)
    noise = harness.make_input(shape, NamedSharding(mesh, grid.spec()), args.dtype, args.seed)
    load_start = harness.loadavg()
    runs = []
    for impl in [i for i in args.impls if i not in args.skip]:
        harness.say(args, f"{harness.fmt_dims(shape)} pdims {harness.fmt_dims(pdims)}: compile {impl}")
        runs.append(_build(impl, shape, pdims, args, Physics(sigma=args.sigma, t_end=args.t_end), noise))
    harness.time_programs(runs, args.repeats, args.warmup)
    t = np.full((len(runs), 2, args.repeats), np.nan)  # the slowest process sets each time
    for i, r in enumerate(runs):
        for j, prog in enumerate(("lpt", "steps")):
            if r.ok and len(r.times[prog]) == args.repeats:
                t[i, j] = r.times[prog]
    t = harness.gather_max(t)
    if args.check and (jax.process_count() == 1 or math.prod(shape) <= CHECK_MAX_POINTS_MP):
        _check(runs, args.dtype)
    # Other jobs on the machine slow every implementation: the load averages tell a reader.
    context = dict(context, loadavg=[load_start, harness.loadavg()])
    return [make_record(r, t[i], shape, pdims, args, context) for i, r in enumerate(runs)]


def make_record(r: Run, t, shape, pdims, args, context) -> dict[str, Any]:
    ok = r.status in ("ok", "wrong") and not np.isnan(t).any()
    lpt, steps = ([float(v) for v in t[k]] if ok else None for k in (0, 1))
    med = statistics.median(steps) if steps else None
    mem, one = r.mem or {}, r.impl == REFERENCE
    return {
        "schema": SCHEMA, "timestamp": context["timestamp"], "tag": args.tag,
        "status": r.status if ok or r.status != "ok" else "error", "note": r.note,
        "impl": r.impl, "shape": list(shape), "n_particles": math.prod(shape), "dtype": args.dtype,
        "pdims": [1] if one else list(pdims), "n_devices": 1 if one else math.prod(pdims),
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


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (shape, mesh, implementation): the latest record of each."""
    latest = harness.latest(records, lambda r: (tuple(r["shape"]), r["dtype"], tuple(r["pdims"]),
                                                r["impl"], r["steps"]))
    order = list(IMPLS)
    rows = [[harness.fmt_dims(r["shape"]), r["dtype"], harness.fmt_dims(r["pdims"]), r["impl"],
             harness.fmt_ms(r["step_median_s"]) or "—", harness.fmt_ms(r["lpt_median_s"]) or "—",
             "—" if r["mem_bytes"] is None else f"{r['mem_bytes'] / 2**20:.1f}",
             "—" if r["max_rel_err_dx"] is None else
             f"{r['max_rel_err_dx']:.1e}, {r['max_rel_err_density']:.1e}",
             "—" if r["max_displacement"] is None else f"{r['max_displacement']:.2f}",
             r["status"] + (f" ({r['note']})" if r["status"] != "ok" and r["note"] else "")]
            for k, r in sorted(latest.items(), key=lambda kv: (
                math.prod(kv[0][0]), kv[0][1], kv[0][2] != (1,), kv[0][2],
                order.index(kv[0][3]) if kv[0][3] in order else 99))]
    return harness.md_table(["grid", "dtype", "mesh", "implementation", "ms / step", "LPT ms",
                             "MiB / device", "max rel err (dx, density)", "max disp. (cells)",
                             "status"], rows)


OPTIONS = dict(devices=None, shapes=["64"], pdims=["auto"],
               dtypes=dict(default=["float32"], choices=DTYPES), repeats=5, warmup=1, seed=0,
               check=True, out="results/pm.jsonl", tag="")


def add_options(p: argparse.ArgumentParser) -> None:
    p.epilog = "implementations:\n" + "\n".join(f"  {k:<14} {v}" for k, v in IMPLS.items())
    p.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(IMPLS))
    p.add_argument("--skip", nargs="+", choices=list(IMPLS), default=[], metavar="IMPL")
    p.add_argument("--steps", type=int, default=5, help="leapfrog steps per run (default: 5)")
    p.add_argument("--halo", type=int, default=2,
                   help="halo width h in cells: paint pads 2h, readout h (default: 2)")
    p.add_argument("--t-end", type=float, default=Physics.t_end,
                   help=f"time span of the steps (growth exp(t); default {Physics.t_end})")
    p.add_argument("--sigma", type=float, default=Physics.sigma,
                   help=f"initial rms displacement in cells (default {Physics.sigma})")


def validate(args: argparse.Namespace) -> None:
    if args.steps < 1 or args.halo < 1:
        raise SystemExit("error: --steps and --halo must be >= 1")
    if not [i for i in args.impls if i not in args.skip]:
        raise SystemExit("error: every implementation is skipped")
    args.dtype = args.dtypes[0]


def plan(args: argparse.Namespace) -> list[str]:
    cases = harness.make_cases(args, args.devices)
    impls = [i for i in args.impls if i not in args.skip]
    return [f"{len(cases)} case(s) x {len(impls)} implementation(s), {args.steps} steps, halo "
            f"{args.halo}; {args.warmup} warm-up + {args.repeats} timed runs; results -> {args.out}"
            ] + [f"  case {c.label}" for c in cases]


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    for case in harness.make_cases(args, jax.device_count(), exact=jax.process_count() > 1):
        yield run_case(case.shape, case.pdims, args, ctx)


TABLES = {"pm": markdown_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
