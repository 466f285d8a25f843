"""Distributed 3D FFTs side by side: pencilfft against jaxdecomp, jnp.fft.fftn and FFTW.

    python -m benchmarks.fft --devices 8 --shapes 64 --pdims 4x2 1x8 --repeats 10
    mpirun -np 2 python -m benchmarks.fft --devices 4 --shapes 64 --pdims 4x2
    srun python -m benchmarks.fft --shapes 1024 --pdims 4x8          (one task per GPU)
    python -m benchmarks.fft table results/*.jsonl --format markdown

A *case* is one (global shape, dtype, mesh).  Its implementations/layouts (*variants*) get the
same input, are compiled once per direction (compile time recorded apart), then timed in the
harness's loop: one forward, then one inverse of that forward's output, per variant and round.
Each (variant, direction) is one record (RECORD_FIELDS).  Under mpirun/srun each process builds
only its blocks of the input, a repeat counts as the slowest process, and the one-device
baselines are skipped.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from benchmarks import harness, private
from benchmarks.harness import DIRECTIONS, DTYPES, LAYOUTS, REAL_DTYPE, Case, Skip, fmt_dims

SCHEMA = 1

# Implementation name -> what it runs.  Order = column order in the tables.
IMPLS: dict[str, str] = {
    "pencilfft": "pencilfft.pfft3d / pifft3d (complex-to-complex), exchange='auto'",
    "pencilfft-jit": "pencilfft.pfft3d / pifft3d called as jaxdecomp's users do: jax.jit on an "
                     "array sharded over an Auto mesh, no mesh= and no mesh in scope (the "
                     "compiler-partitioned path)",
    "pencilfft-a2a": "the same with exchange='alltoall' on every mesh axis (the first version)",
    "pencilfft-r2c": "pencilfft.prfft3d / pirfft3d (real-to-complex, half spectrum)",
    "naive-pencil": "plain shard_map pencil: jnp.fft.fft along strided axes 0 and 1, all_to_all "
                    "without local reordering (natural layout; the 'before' of issue 6)",
    "jaxdecomp": "jaxdecomp.pfft3d / pifft3d, backend='jax' (XLA collectives)",
    "jaxdecomp-cudecomp": "jaxdecomp.pfft3d / pifft3d, backend='cudecomp' (GPU build only)",
    "fftn-sharded": "jnp.fft.fftn / ifftn on the sharded array (XLA gathers the whole array)",
    "fftn-1dev": "jnp.fft.fftn / ifftn on one device: the reference for speedups",
    "pyfftw": "FFTW's own threaded 3-D plan (pyFFTW, FFTW_MEASURE) on the host, executing on "
              "preallocated arrays, on pencilfft's cores (PENCILFFT_THREADS or the affinity); "
              "one process; not run unless asked for",
}
DEFAULT_IMPLS = [i for i in IMPLS if i != "pyfftw"]  # its MEASURE plans take minutes at 512^3
BASELINE = "fftn-1dev"
# Natural order out, whatever `--layouts` asks: they run once per case.
LAYOUT_FREE = ("fftn-sharded", "fftn-1dev", "pyfftw")
# Implementations of a single layout: run only when it is asked for.
ONE_LAYOUT = {"naive-pencil": "natural", "jaxdecomp": "transposed", "jaxdecomp-cudecomp": "transposed"}
# Acceptance of --check, max|err| / max|ref| (loose: 256^3 single precision accumulates ~log2(N)
# roundings).
CHECK_TOL = {"complex64": 1e-4, "complex128": 1e-10}

# Every record has these keys (values may be None for skipped/failed variants).
RECORD_FIELDS = (
    "schema", "timestamp", "tag", "status", "note",
    "impl", "layout", "direction", "shape", "n_points", "dtype", "input_dtype", "norm",
    "pdims", "axis_type", "mesh_devices", "n_devices",
    "repeats", "warmup", "lower_s", "compile_s", "median_s", "min_s", "max_s", "mean_s", "std_s",
    "times_s", "flops", "gflops", "gflops_per_device", "speedup_vs_fftn_1dev",
    "mem_argument_bytes", "mem_output_bytes", "mem_temp_bytes", "mem_alias_bytes", "mem_bytes",
    "max_rel_err", "machine", "versions", "command",
)
# Of these, those positive in an "ok" record (and speedup_vs_fftn_1dev, in one process).
POSITIVE_FIELDS = (
    "n_points", "mesh_devices", "n_devices", "repeats", "compile_s", "median_s", "min_s",
    "max_s", "flops", "gflops", "gflops_per_device",
)


def fft_flops(shape: Sequence[int], real: bool) -> float:
    """Nominal flops of one 3D transform, 5 N log2 N (2.5 for r2c): FFTW's benchFFT convention,
    a speed normalised by size, not a hardware count."""
    n = math.prod(shape)
    return (2.5 if real else 5.0) * n * math.log2(n) if n > 1 else 0.0


def variant_plan(impls: Sequence[str], layouts: Sequence[str]) -> list[tuple[str, str]]:
    """The (impl, layout) pairs of one case, before anything is known about the machine."""
    out = []
    for impl in impls:
        if impl in LAYOUT_FREE:
            out.append((impl, "natural"))
        else:
            out.extend((impl, lay) for lay in layouts if ONE_LAYOUT.get(impl, lay) == lay)
    return out


@dataclasses.dataclass
class Variant:
    """One implementation/layout inside a case, with its compiled programs and measurements."""

    impl: str
    layout: str
    real_input: bool = False
    n_devices: int = 0
    status: str = "ok"  # ok | skipped | error | wrong
    note: str = ""
    fns: dict[str, Callable] = dataclasses.field(default_factory=dict)  # direction -> python fn
    x: Any = None  # the forward's input; the inverse's input is each forward's output
    compiled: dict[str, Any] = dataclasses.field(default_factory=dict)
    lower_s: dict[str, float] = dataclasses.field(default_factory=dict)
    compile_s: dict[str, float] = dataclasses.field(default_factory=dict)
    mem: dict[str, dict[str, int | None]] = dataclasses.field(default_factory=dict)
    times: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    err: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def fail(self, status: str, exc: BaseException | str) -> None:
        self.status = status
        msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.note = " ".join(str(msg).split())[:400]
        self.compiled.clear()
        self.x = None

    @property
    def ok(self) -> bool:
        """Built, compiled and (so far) correct."""
        return self.status == "ok"

    @property
    def ran(self) -> bool:
        """Ran to the end: correct or not, its timings are real ("wrong" is set by the check)."""
        return self.status in ("ok", "wrong")

    def run(self, record: bool) -> None:
        """One forward, then one inverse of its output: only the inputs stay resident between
        calls, so memory does not grow with the number of variants (on GPUs, at scale)."""
        try:
            t_fwd, k = private.time_once(self.compiled["forward"], self.x)
            if "inverse" in self.compiled:
                t_inv, back = private.time_once(self.compiled["inverse"], k)
                del back
        except Exception as e:  # noqa: BLE001 - a broken implementation must not stop the others
            self.fail("error", e)
            return
        del k
        if record and "forward" in self.times:
            self.times["forward"].append(t_fwd)
        if record and "inverse" in self.times:  # (only when the inverse was compiled)
            self.times["inverse"].append(t_inv)


# An implementation: fills a Variant's `fns` (or `compiled`), `x` and `n_devices`, or raises Skip.
Builder = Callable[["CaseRunner", Variant], None]


class CaseRunner:
    """Builds, compiles and checks every variant of one case."""

    def __init__(self, case: Case, args: argparse.Namespace, builders: Mapping[str, Builder]):
        self.case, self.args, self.builders = case, args, builders
        self.single_process = jax.process_count() == 1
        self._inputs: dict[Any, Any] = {}

    def mesh(self, axis_type: str) -> Any:
        """The case's mesh, axes ("x", "y") (or ("x",) for slabs) of `axis_type`, first devices."""
        return harness.make_mesh(self.case.pdims, axis_type)

    def input(self, sharding: Any, real: bool) -> Any:
        """The case's input on `sharding` (cached: variants with equal shardings share it)."""
        dtype = REAL_DTYPE[self.case.dtype] if real else self.case.dtype
        key = (sharding, dtype)
        if key not in self._inputs:
            self._inputs[key] = harness.make_input(self.case.shape, sharding, dtype, self.args.seed)
        return self._inputs[key]

    def build(self, impl: str, layout: str) -> Variant:
        """A Variant with fns/args for both directions, or one marked skipped (or error)."""
        v = Variant(impl, layout)
        try:
            self.builders[impl](self, v)
        except Skip as e:
            v.fail("skipped", str(e))
        except Exception as e:  # noqa: BLE001 - a broken implementation must not stop the others
            v.fail("error", e)
        return v

    def compile(self, v: Variant) -> None:
        """Lower and compile, timed; the inverse for the forward's output."""
        try:
            arg = v.x
            for d in DIRECTIONS:
                if d == "inverse":
                    if "inverse" not in self.args.directions:
                        break
                    arg = jax.block_until_ready(v.compiled["forward"](v.x))
                if d not in v.compiled:  # (a builder may have compiled it: pyFFTW's plans)
                    t0 = time.perf_counter()
                    lowered = jax.jit(v.fns[d]).lower(arg)
                    t1 = time.perf_counter()
                    v.compiled[d] = lowered.compile()
                    v.lower_s[d], v.compile_s[d] = t1 - t0, time.perf_counter() - t0
                v.mem[d] = harness.memory_stats(v.compiled[d])
                if d in self.args.directions:
                    v.times[d] = []
            del arg
        except Exception as e:  # noqa: BLE001
            v.fail("error", e)

    def check(self, v: Variant) -> None:
        """Forward vs numpy (in natural order, padding cropped) and inverse(forward) vs input."""
        x = harness.to_numpy(v.x)
        ref_fn = np.fft.rfftn if v.real_input else np.fft.fftn
        ref = ref_fn(x.astype(np.complex128 if not v.real_input else np.float64), norm=self.args.norm)
        k_dev = v.compiled["forward"](v.x)
        k = harness.to_numpy(k_dev)
        if v.layout == "transposed" and v.impl not in LAYOUT_FREE:
            k = k.transpose(2, 0, 1)  # (Y, Z, X) -> (X, Y, Z)
        if any(a < b for a, b in zip(k.shape, ref.shape)):
            v.status = "wrong"
            v.note = f"forward output shape {k.shape} (natural order) smaller than {ref.shape}"
            return
        errs = [private.max_rel_err(k[tuple(slice(0, n) for n in ref.shape)], ref)]
        if "inverse" in v.compiled:  # (pencilfft may zero-pad Y/Z to the mesh: cropped)
            back = harness.to_numpy(v.compiled["inverse"](k_dev))
            errs.append(private.max_rel_err(back[tuple(slice(0, n) for n in x.shape)], x))
        v.err = {"forward": errs[0], "inverse": errs[-1]}
        if max(errs) > CHECK_TOL[self.case.dtype]:
            v.status, v.note = "wrong", f"max rel err {max(errs):.2e} > {CHECK_TOL[self.case.dtype]:.0e}"


def run_case(case: Case, args: argparse.Namespace, builders: Mapping[str, Builder],
             ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Every variant of one case, interleaved: a record per variant and direction."""
    runner = CaseRunner(case, args, builders)
    variants = []
    for impl, layout in variant_plan(list(builders), args.layouts):
        harness.say(args, f"{case.label}: compile {impl} [{layout}]")
        v = runner.build(impl, layout)
        if v.ok:
            runner.compile(v)
        variants.append(v)
    harness.say(args, f"{case.label}: {args.warmup} + {args.repeats} rounds")
    harness.time_programs(variants, args.repeats, args.warmup)

    # Agree across processes: slowest process per repeat, slowest compile.
    dirs = list(args.directions)
    t = np.full((len(variants), len(dirs), args.repeats), np.nan)
    c = np.full((len(variants), len(dirs), 2), np.nan)
    for i, v in enumerate(variants):
        for j, d in enumerate(dirs):
            ts = v.times.get(d, [])
            if v.ok and len(ts) == args.repeats:
                t[i, j] = ts
            if d in v.compile_s:
                c[i, j] = (v.lower_s[d], v.compile_s[d])
    t, c = harness.gather_max(t), harness.gather_max(c)

    # Correctness after timing (its gathers must not disturb the measurements).  Under several
    # processes every process gathers the whole array: only for moderate sizes; and numpy's
    # reference is single-threaded: --check-max spares it at sizes it would take minutes on.
    limit = min(harness.CHECK_MAX_POINTS_MP if not runner.single_process else math.inf,
                args.check_max**3 if args.check_max else math.inf)
    if args.check and math.prod(case.shape) <= limit:
        for v in variants:
            if v.ok:
                try:
                    runner.check(v)
                except Exception as e:  # noqa: BLE001
                    v.note = f"check failed to run: {type(e).__name__}: {e}"[:400]

    base = {d: float(np.median(t[i, j])) for i, v in enumerate(variants) if v.impl == BASELINE and v.ok
            for j, d in enumerate(dirs) if not np.isnan(t[i, j]).any()}
    records = []
    for i, v in enumerate(variants):
        for j, d in enumerate(dirs):
            times = None if np.isnan(t[i, j]).any() or not v.ran else [float(x) for x in t[i, j]]
            records.append(make_record(case, v, d, times, c[i, j], base.get(d), args, ctx))
    return records


def make_record(case: Case, v: Variant, direction: str, times: list[float] | None, comp: Any,
                base_median: float | None, args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    """One JSON line; every key of RECORD_FIELDS present."""
    flops = fft_flops(case.shape, v.real_input)
    mem = v.mem.get(direction, {})
    status, note = v.status, v.note
    if times is None and v.ran:  # e.g. failed on another process, or direction not compiled
        status, note = "error", note or "no timings"
    med = statistics.median(times) if times else None
    stats = ({"median_s": med, "min_s": min(times), "max_s": max(times), "mean_s": statistics.fmean(times),
              "std_s": statistics.pstdev(times)} if times else
             dict.fromkeys(("median_s", "min_s", "max_s", "mean_s", "std_s")))
    return {
        "schema": SCHEMA, "timestamp": ctx["timestamp"], "tag": args.tag, "status": status,
        "note": note, "impl": v.impl, "layout": v.layout, "direction": direction,
        "shape": list(case.shape), "n_points": math.prod(case.shape), "dtype": case.dtype,
        "input_dtype": REAL_DTYPE[case.dtype] if v.real_input and direction == "forward" else case.dtype,
        "norm": args.norm, "pdims": list(case.pdims),
        "axis_type": args.axis_type if v.impl.startswith(("pencilfft", "naive-pencil")) else "auto",
        "mesh_devices": math.prod(case.pdims), "n_devices": v.n_devices or None,
        "repeats": args.repeats, "warmup": args.warmup,
        "lower_s": None if np.isnan(comp[0]) else float(comp[0]),
        "compile_s": None if np.isnan(comp[1]) else float(comp[1]),
        **stats, "times_s": times, "flops": flops,
        "gflops": flops / med / 1e9 if med else None,
        "gflops_per_device": flops / med / 1e9 / v.n_devices if med and v.n_devices else None,
        "speedup_vs_fftn_1dev": base_median / med if med and base_median else None,
        "mem_argument_bytes": mem.get("argument"), "mem_output_bytes": mem.get("output"),
        "mem_temp_bytes": mem.get("temp"), "mem_alias_bytes": mem.get("alias"),
        "mem_bytes": mem.get("total"), "max_rel_err": v.err.get(direction),
        **{k: val for k, val in harness.stamp(ctx).items() if k != "timestamp"},
    }


def _pencilfft(runner: CaseRunner, v: Variant, real: bool = False, exchange: str = "auto") -> None:
    """pencilfft's c2c (or r2c) pair on the `--axis-type` mesh, mesh= passed explicitly."""
    mesh = runner.mesh(runner.args.axis_type)
    norm, shape = runner.args.norm, runner.case.shape
    opts = dict(layout=v.layout, mesh=mesh, exchange=exchange)
    v.real_input, v.n_devices = real, mesh.size
    v.x = runner.input(pencilfft.real_space_sharding(mesh), real)
    if real:  # (s crops a padded spectrum back)
        v.fns = {"forward": lambda a: pencilfft.prfft3d(a, norm, **opts),
                 "inverse": lambda k: pencilfft.pirfft3d(k, shape, norm, **opts)}
    else:
        v.fns = {"forward": lambda a: pencilfft.pfft3d(a, norm, **opts),
                 "inverse": lambda k: pencilfft.pifft3d(k, norm, s=shape, **opts)}


def build_pencilfft_jit(runner: CaseRunner, v: Variant) -> None:
    """No mesh= and no mesh in scope: the mesh comes from the input's sharding (Auto axes)."""
    norm, lay = runner.args.norm, v.layout
    v.fns = {"forward": lambda a: pencilfft.pfft3d(a, norm, layout=lay),
             "inverse": lambda k: pencilfft.pifft3d(k, norm, layout=lay)}
    v.x = _auto_input(runner, v)


def _import(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - an implementation that is not there is skipped
        raise Skip(f"{module} not importable ({type(e).__name__}: {e})")


def _require(runner: CaseRunner, v: Variant, module: str) -> ModuleType:
    """`module` for a one-layout, 2-axis-mesh implementation, or Skip with the reason."""
    mod = _import(module)
    if v.layout != ONE_LAYOUT[v.impl]:
        raise Skip(f"{v.impl} has only the {ONE_LAYOUT[v.impl]} layout")
    if len(runner.case.pdims) != 2:
        n = runner.case.pdims[0]
        raise Skip(f"{v.impl} needs a 2-axis mesh (e.g. pdims {n}x1 instead of {n})")
    return mod


def build_naive_pencil(runner: CaseRunner, v: Variant) -> None:
    """The pencil FFT users write first: per device FFT over Z, all_to_all over "y", FFT over Y
    (strided), all_to_all over "x", FFT over X (strided), no local reordering; natural order out,
    split like pencilfft's natural layout; the inverse the exact reverse.  Each 1-D transform
    applies its own norm factor: the three compose to numpy's 3D `norm`."""
    pencilfft = _require(runner, v, "pencilfft")
    (x_, y_, z_), (pa, pb) = runner.case.shape, runner.case.pdims
    bad = [f"{name}={n} by {axis} ({p})" for name, n, axis, p in
           (("X", x_, "x", pa), ("Y", y_, "y", pb), ("Z", z_, "y", pb), ("Y", y_, "x", pa)) if n % p]
    if bad:
        raise Skip("naive-pencil needs X, Y split by x and Y, Z split by y exactly; not divisible: "
                   + ", ".join(bad))
    mesh = runner.mesh(runner.args.axis_type)
    norm = runner.args.norm

    def pencil(b, fft, axes, exchanges):
        """FFT along axes[0]; then per exchange (mesh axis, split, concat) the next axis."""
        b = fft(b, axis=axes[0], norm=norm)
        for axis, (name, split, concat) in zip(axes[1:], exchanges):
            b = jax.lax.all_to_all(b, name, split_axis=split, concat_axis=concat, tiled=True)
            b = fft(b, axis=axis, norm=norm)
        return b

    fwd = functools.partial(pencil, fft=jnp.fft.fft, axes=(2, 1, 0), exchanges=(("y", 2, 1), ("x", 1, 0)))
    inv = functools.partial(pencil, fft=jnp.fft.ifft, axes=(0, 1, 2), exchanges=(("x", 0, 1), ("y", 1, 2)))
    real_spec, k_spec = P("x", "y", None), P(None, "x", "y")
    v.n_devices = mesh.size
    v.fns = {"forward": jax.shard_map(fwd, mesh=mesh, in_specs=real_spec, out_specs=k_spec),
             "inverse": jax.shard_map(inv, mesh=mesh, in_specs=k_spec, out_specs=real_spec)}
    v.x = runner.input(pencilfft.real_space_sharding(mesh), False)


def _jaxdecomp(runner: CaseRunner, v: Variant, backend: str) -> None:
    jaxdecomp = _require(runner, v, "jaxdecomp")
    if backend == "cudecomp":  # a cuDecomp build registers its custom calls; the wheel none
        try:
            from jaxdecomplib import _jaxdecomp

            ready = jax.default_backend() == "gpu" and bool(_jaxdecomp.registrations())
        except Exception:  # noqa: BLE001
            ready = False
        if not ready:
            raise Skip("needs a GPU and jaxdecomp built with cuDecomp")
    norm = runner.args.norm
    v.fns = {"forward": lambda a: jaxdecomp.pfft3d(a, norm, backend=backend),
             "inverse": lambda k: jaxdecomp.pifft3d(k, norm, backend=backend)}
    v.x = _auto_input(runner, v)  # jaxdecomp 0.3.1 fails on Explicit axes


def _auto_input(runner: CaseRunner, v: Variant) -> Any:
    """The case's input split over the Auto mesh: what jaxdecomp and the fftn baselines get."""
    mesh = runner.mesh("auto")
    v.n_devices = mesh.size
    return runner.input(NamedSharding(mesh, P(*mesh.axis_names)), False)


def fits_on_one_device(nbytes: int, copies: int, n_sharing_host: int = 1) -> bool:
    """Would `copies` arrays fit a GPU, or half the free host memory per CPU device?"""
    limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")  # (None on CPUs)
    if limit:
        return copies * nbytes <= 0.9 * limit
    return copies * nbytes * n_sharing_host <= 0.5 * os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _fftn(runner: CaseRunner, v: Variant, copies: int, n_sharing_host: int = 1) -> None:
    """jnp.fft.fftn / ifftn of the Auto mesh's input, if `copies` of the grid fit one device."""
    nbytes = math.prod(runner.case.shape) * np.dtype(runner.case.dtype).itemsize
    if not fits_on_one_device(nbytes, copies, n_sharing_host):
        raise Skip("the global array does not fit on one device"
                   + (" (fftn gathers it)" if n_sharing_host > 1 else ""))
    norm = runner.args.norm
    v.fns = {"forward": lambda a: jnp.fft.fftn(a, norm=norm),
             "inverse": lambda k: jnp.fft.ifftn(k, norm=norm)}
    v.x = _auto_input(runner, v)


def build_fftn_1dev(runner: CaseRunner, v: Variant) -> None:
    """The same data as the sharded variants (same blocks), moved whole to one device."""
    if not runner.single_process:
        raise Skip("one-device baseline skipped with several processes")
    _fftn(runner, v, 4)
    v.n_devices, v.x = 1, jax.device_put(v.x, jax.devices()[0])


def build_pyfftw(runner: CaseRunner, v: Variant) -> None:
    """FFTW's 3-D plans (MEASURE: the compile time) on aligned arrays, pencilfft's thread count."""
    if not runner.single_process:
        raise Skip("pyFFTW runs in one process")
    pyfftw = _import("pyfftw")
    if runner.args.norm == "forward":
        raise Skip("pyFFTW scales the inverse or both (norm backward or ortho), not the forward")
    host = harness.to_numpy(_auto_input(runner, v))
    a, b = (pyfftw.empty_aligned(host.shape, host.dtype) for _ in range(2))
    opts = dict(axes=(0, 1, 2), flags=("FFTW_MEASURE",), threads=private.threads.available_cores(),
                ortho=runner.args.norm == "ortho", normalise_idft=runner.args.norm == "backward")
    t0 = time.perf_counter()
    fwd = pyfftw.FFTW(a, b, direction="FFTW_FORWARD", **opts)
    inv = pyfftw.FFTW(b, a, direction="FFTW_BACKWARD", **opts)
    v.lower_s = v.compile_s = dict.fromkeys(DIRECTIONS, time.perf_counter() - t0)
    a[...] = host  # (MEASURE planning overwrites the arrays)
    v.n_devices, v.x = 1, host  # (the plans read `a`: calls ignore their argument)
    v.compiled = {"forward": lambda _: fwd(), "inverse": lambda _: inv()}


# Keys: IMPLS's names, in its order (a test holds them equal).
IMPLEMENTATIONS: dict[str, Builder] = {
    "pencilfft": _pencilfft,
    "pencilfft-jit": build_pencilfft_jit,
    "pencilfft-a2a": functools.partial(_pencilfft, exchange="alltoall"),
    "pencilfft-r2c": functools.partial(_pencilfft, real=True),
    "naive-pencil": build_naive_pencil,
    "jaxdecomp": functools.partial(_jaxdecomp, backend="jax"),
    "jaxdecomp-cudecomp": functools.partial(_jaxdecomp, backend="cudecomp"),
    # (the sharded one gathers the whole array on every device: input, output, temp)
    "fftn-sharded": lambda r, v: _fftn(r, v, 3, jax.local_device_count()),
    "fftn-1dev": build_fftn_1dev,
    "pyfftw": build_pyfftw,
}


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


LONG_COLUMNS = ("grid", "dtype", "pdims", "impl", "layout", "dir", "compile s", "median ms",
                "min ms", "max ms", "GFlop/s", "MiB/dev", "speedup", "rel err", "status")


def long_row(r: dict[str, Any]) -> list[str]:
    status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['note']}"
    return [fmt_dims(r["shape"]), r["dtype"], fmt_dims(r["pdims"]), r["impl"], r["layout"],
            r["direction"][:3], _num(r["compile_s"], ".2f"), harness.fmt_ms(r["median_s"]),
            harness.fmt_ms(r["min_s"]), harness.fmt_ms(r["max_s"]), _num(r["gflops"], ".3g"),
            "" if r["mem_bytes"] is None else f"{r['mem_bytes'] / 2**20:.1f}",
            _num(r["speedup_vs_fftn_1dev"], ".2f"), _num(r["max_rel_err"], ".1e"), status]


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "—"
    if r["status"] == "skipped":
        return "n/a"
    if r["status"] == "error" or r["median_s"] is None:
        return "error"
    s = harness.fmt_ms(r["median_s"])
    if r.get("speedup_vs_fftn_1dev"):
        s += f" ({r['speedup_vs_fftn_1dev']:.2f}x)"
    return s + (" WRONG" if r["status"] == "wrong" else "")


PIVOT_LEGEND = ("Median time in ms over the timed runs (speedup: the same case's `jnp.fft.fftn` on one "
                "device divided by this time); n/a: not available here; —: not run.")


def markdown_table(records: Sequence[dict[str, Any]], style: str = "pivot") -> str:
    """pivot: a row per (grid, dtype, pdims, layout, direction), a column per implementation
    ("median ms (speedup)"; the baselines in every layout row); long: a row per record."""
    if style == "long":
        return harness.md_table(LONG_COLUMNS, ([c.replace("|", "/") for c in long_row(r)]
                                               for r in records))
    latest = harness.latest(records, lambda r: (tuple(r["shape"]), r["dtype"], tuple(r["pdims"]),
                                                r["impl"], r["layout"], r["direction"]))
    impls = [i for i in IMPLS if any(k[3] == i for k in latest)]
    impls += sorted({k[3] for k in latest} - set(impls))
    # An implementation skipped everywhere (e.g. cuDecomp on a CPU machine) gets a footnote,
    # not a column of n/a.
    absent = {k[3]: r["note"] for k, r in latest.items()}
    absent = {i: note for i, note in absent.items()
              if all(r["status"] == "skipped" for k, r in latest.items() if k[3] == i)}
    impls = [i for i in impls if i not in absent]
    rows = list(dict.fromkeys((k[0], k[1], k[2], k[4], k[5]) for k in latest if k[3] not in LAYOUT_FREE))
    if not rows:  # only baselines were run
        rows = list(dict.fromkeys((k[0], k[1], k[2], k[4], k[5]) for k in latest))
    order = {d: i for i, d in enumerate(DIRECTIONS)}
    rows.sort(key=lambda k: (math.prod(k[0]), k[0], k[1], k[2], LAYOUTS.index(k[3]) if k[3] in LAYOUTS else 9,
                             order.get(k[4], 9)))
    body = [[fmt_dims(shape), dtype, fmt_dims(pdims), layout, direction] + [
        _cell(latest.get((shape, dtype, pdims, i, "natural" if i in LAYOUT_FREE else layout, direction)))
        for i in impls] for shape, dtype, pdims, layout, direction in rows]
    text = PIVOT_LEGEND + "\n\n" + harness.md_table(["grid", "dtype", "pdims", "layout", "dir"] + impls, body)
    if absent:
        text += "\n\n" + "\n".join(f"Not available here: `{i}` ({note})." for i, note in absent.items())
    return text


def processes_table(several: list[dict], one: list[dict]) -> str:
    """pencilfft (transposed) under several processes beside one process, per grid and mesh."""
    def key(r):
        return (tuple(r["shape"]), tuple(r["pdims"]), r["direction"])

    def pick(records):
        return [r for r in records if r["impl"] == "pencilfft" and r["layout"] == "transposed"
                and r["status"] == "ok"]

    multi, base = harness.latest(pick(several), key), harness.latest(pick(one), key)
    rows = []
    for shape, pdims in sorted(dict.fromkeys((k[0], k[1]) for k in multi)):
        cells = []
        for d in DIRECTIONS:
            r, b = multi.get((shape, pdims, d)), base.get((shape, pdims, d))
            ratio = f" ({r['median_s'] / b['median_s']:.2f}x)" if r and b else ""
            cells.append("—" if r is None else harness.fmt_ms(r["median_s"]) + ratio)
        rows.append([fmt_dims(shape), fmt_dims(pdims)] + cells)
    procs = sorted({r["machine"]["process_count"] for r in pick(several)})
    return harness.md_table(
        ["grid", "pdims"] + [f"{d} ms (vs 1 process)" for d in DIRECTIONS], rows, "llrr",
        f"Processes: {', '.join(map(str, procs))}; load average when each case ended: "
        + harness.load_range(pick(several)) + ".")


TABLES = {"markdown": markdown_table,
          "markdown-long": lambda records: markdown_table(records, "long")}


OPTIONS = dict(devices=None, cores=None, shapes=["64"], pdims=["auto"],
               dtypes=dict(default=["complex64"], choices=DTYPES), repeats=10, warmup=2, seed=0,
               check=True, out="results/fft.jsonl", tag="")


def add_options(p: argparse.ArgumentParser) -> None:
    p.epilog = "implementations:\n" + "\n".join(f"  {k:<20} {v}" for k, v in IMPLS.items())
    p.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
                   help="k-space layouts (default: both); jaxdecomp runs only 'transposed', "
                        "naive-pencil only 'natural', the baselines are layout-free")
    p.add_argument("--impls", nargs="+", choices=list(IMPLS), default=DEFAULT_IMPLS,
                   help="implementations (default: all but pyfftw; unavailable ones are noted "
                        "as skipped)")
    p.add_argument("--skip", nargs="+", choices=list(IMPLS), default=[], metavar="IMPL",
                   help="implementations to leave out, e.g. --skip fftn-sharded (slow: it gathers)")
    p.add_argument("--directions", nargs="+", choices=DIRECTIONS, default=list(DIRECTIONS))
    p.add_argument("--norm", choices=["backward", "ortho", "forward"], default="backward")
    p.add_argument("--axis-type", choices=["explicit", "auto"], default="explicit",
                   help="axis type of pencilfft's and naive-pencil's mesh (jaxdecomp and fftn "
                        "always get an Auto mesh: jaxdecomp 0.3 fails on Explicit axes)")
    p.add_argument("--check-max", type=int, default=None, metavar="N",
                   help="check only grids of at most N^3 points (default: every grid)")
    p.add_argument("--markdown", action="store_true", help="print the pivot table (default: long)")


def selected_impls(args: argparse.Namespace) -> list[str]:
    """--impls less --skip, in --impls order."""
    return [i for i in args.impls if i not in set(args.skip)]


def validate(args: argparse.Namespace) -> None:
    if not selected_impls(args):
        raise SystemExit("error: every implementation is skipped")


def report(args: argparse.Namespace, records: list[dict[str, Any]]) -> str:
    return markdown_table(records, "pivot" if args.markdown else "long")


def plan(args: argparse.Namespace) -> list[str]:
    """What --dry-run prints: the cases and variants, nothing measured."""
    cases = harness.make_cases(args, args.devices)
    variants = variant_plan(selected_impls(args), args.layouts)
    return ([f"{len(cases)} case(s) x {len(variants)} variant(s) x {len(args.directions)} "
             f"direction(s); {args.warmup} warm-up + {args.repeats} timed runs each; results -> "
             f"{args.out}"] + [f"  case {c.label}" for c in cases]
            + [f"  variant {impl} [{lay}]" for impl, lay in variants])


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """A forward, then an inverse of its output; only the inputs stay resident between calls."""
    builders = {impl: IMPLEMENTATIONS[impl] for impl in selected_impls(args)}
    for case in harness.make_cases(args, jax.device_count(), exact=jax.process_count() > 1):
        yield run_case(case, args, builders, ctx)


def main(argv: Sequence[str] | None = None) -> int:
    return harness.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
