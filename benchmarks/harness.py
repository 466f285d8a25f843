"""Benchmark harness: cases, variants, input data, the round-robin timing loop, JSON records.

A *case* is one (global shape, dtype, mesh).  Within a case every implementation/layout (a
*variant*) gets the same input data, is compiled once per direction (compile time measured
separately), warmed up, then timed `--repeats` times with `block_until_ready`.  The variants run
round-robin (repeat r of every variant before repeat r+1 of any, the starting variant rotating
each round) so that drift of the machine (thermal, other users, the OS) spreads over all of them
instead of favouring whichever ran first.  Each (variant, direction) becomes one record (a JSON
line, every key of RECORD_FIELDS).

Under mpirun/srun each process builds only its own blocks of the input (a seeded generator per
block, `jax.make_array_from_callback`), the per-repeat times are the maximum over processes, and
the single-device baseline is skipped.

The implementations themselves are builders in `benchmarks.impls`, handed to `run_case` /
`CaseRunner`; this module knows them only by name (IMPLS, the layout rules).  Also here: the
parsing helpers the other benchmark tools share (shapes, meshes, `square_pdims`, `fmt_dims`), the
machine description stored in every record, and `load_records` to read results back.

Only the standard library is imported at module level: `--devices` must take effect before jax
creates its backend.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

SCHEMA = 1

# Implementation name -> what it runs.  Order = column order in the tables.
IMPLS: dict[str, str] = {
    "pencilfft": "pencilfft.pfft3d / pifft3d (complex-to-complex), exchange='auto'",
    "pencilfft-jit": "pencilfft.pfft3d / pifft3d called as jaxdecomp's users do: jax.jit on an "
                     "array sharded over an Auto mesh, no mesh= and no mesh in scope (the "
                     "compiler-partitioned path)",
    "pencilfft-a2a": "the same with exchange='alltoall' on every mesh axis (the first version)",
    "pencilfft-r2c": "pencilfft.prfft3d / pirfft3d (real-to-complex, half spectrum), if present",
    "naive-pencil": "plain shard_map pencil: jnp.fft.fft along strided axes 0 and 1, all_to_all "
                    "without local reordering (natural layout; the 'before' of issue 6)",
    "jaxdecomp": "jaxdecomp.pfft3d / pifft3d, backend='jax' (XLA collectives)",
    "jaxdecomp-cudecomp": "jaxdecomp.pfft3d / pifft3d, backend='cudecomp' (GPU build only)",
    "fftn-sharded": "jnp.fft.fftn / ifftn on the sharded array (XLA gathers the whole array)",
    "fftn-1dev": "jnp.fft.fftn / ifftn on one device: the reference for speedups",
}
BASELINE = "fftn-1dev"
# Implementations whose output order does not depend on `--layouts`: their results are in
# natural order and they run once per case whatever layouts were asked for.
LAYOUT_FREE = ("fftn-sharded", "fftn-1dev")
# Implementations that have a single layout: run only when that layout is asked for.
ONE_LAYOUT = {"naive-pencil": "natural", "jaxdecomp": "transposed", "jaxdecomp-cudecomp": "transposed"}
DIRECTIONS = ("forward", "inverse")
LAYOUTS = ("transposed", "natural")
DTYPES = ("complex64", "complex128")
REAL_DTYPE = {"complex64": "float32", "complex128": "float64"}
# Acceptance of --check, max|err| / max|ref|, per precision (loose: 256^3 single precision
# accumulates ~log2(N) roundings).
CHECK_TOL = {"complex64": 1e-4, "complex128": 1e-10}
# Largest global array (points) --check gathers onto every process under mpirun/srun.
CHECK_MAX_POINTS_MP = 256**3

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
# Of these, the ones that must be positive numbers in an "ok" record (speedup_vs_fftn_1dev
# too, except under several processes, where there is no one-device baseline: None).
POSITIVE_FIELDS = (
    "n_points", "mesh_devices", "n_devices", "repeats", "compile_s", "median_s", "min_s",
    "max_s", "flops", "gflops", "gflops_per_device",
)


class Skip(Exception):
    """A variant that cannot run here (not installed, wrong mesh, too big...): noted, not an error."""


# --------------------------------------------------------------------------------------------
# Parsing and planning (no jax needed: `--dry-run` and the slurm tests use only this part)
# --------------------------------------------------------------------------------------------

def parse_shape(text: str) -> tuple[int, int, int]:
    """'128' -> (128, 128, 128); '256x128x64' -> (256, 128, 64)."""
    parts = text.lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected N or XxYxZ, e.g. 128 or 256x128x64")
    if len(dims) == 1:
        dims = dims * 3
    if len(dims) != 3 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected N or XxYxZ with positive sizes")
    return dims  # type: ignore[return-value]


def parse_pdims(text: str) -> tuple[int, ...] | str:
    """'4x2' -> (4, 2) (pencils); '8' -> (8,) (slabs on a 1-axis mesh); 'auto' kept as is."""
    if text == "auto":
        return text
    try:
        dims = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"pdims {text!r}: expected PxQ (e.g. 4x2), P (e.g. 8) or auto")
    if len(dims) not in (1, 2) or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"pdims {text!r}: expected 1 or 2 positive sizes")
    return dims


def parse_pxq(text: str) -> tuple[int, int]:
    """`parse_pdims`, but only PxQ: for tools whose meshes always have two axes."""
    dims = parse_pdims(text)
    if not isinstance(dims, tuple) or len(dims) != 2:
        raise argparse.ArgumentTypeError(f"pdims {text!r}: expected PxQ, 2 positive sizes, e.g. 4x2")
    return dims


def square_pdims(n: int) -> tuple[int, int]:
    """The most square (P, Q) with P * Q = n and P <= Q (slurm/common.sh has the same rule)."""
    if n < 1:
        raise ValueError(f"need n >= 1 devices, got {n}")
    p = int(math.isqrt(n))
    while n % p:
        p -= 1
    return p, n // p


def fmt_dims(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


def fft_flops(shape: Sequence[int], real: bool) -> float:
    """Nominal flop count of one 3D transform: 5 N log2 N (complex), 2.5 N log2 N (real-to-complex).

    The usual convention (FFTW's benchFFT): it ignores the algorithm actually used, so GFlop/s
    is a speed normalised by problem size, comparable across sizes, not a hardware count.
    """
    n = math.prod(shape)
    return (2.5 if real else 5.0) * n * math.log2(n) if n > 1 else 0.0


def validate_case(shape: Sequence[int], pdims: Sequence[int]) -> str | None:
    """Why this (shape, mesh) cannot be benchmarked, or None.

    The library's own rule (`pencilfft._decomposition.rules.split_problem`): the real-space input is
    split X over the first mesh axis and Y over the second, and these must divide exactly.
    """
    from pencilfft._decomposition.rules import split_problem

    problem = split_problem(shape, pdims, ("x", "y"))
    return None if problem is None else problem[1]


def variant_plan(impls: Sequence[str], layouts: Sequence[str]) -> list[tuple[str, str]]:
    """The (impl, layout) pairs of one case, before anything is known about the machine."""
    out = []
    for impl in impls:
        if impl in LAYOUT_FREE:
            out.append((impl, "natural"))
        elif impl in ONE_LAYOUT:
            out.extend((impl, lay) for lay in layouts if lay == ONE_LAYOUT[impl])
        else:
            out.extend((impl, lay) for lay in layouts)
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    shape: tuple[int, int, int]
    dtype: str
    pdims: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{fmt_dims(self.shape)} {self.dtype} pdims {fmt_dims(self.pdims)}"


def resolve_pdims(pdims: Sequence[tuple[int, ...] | str], n_devices: int | None) -> list[tuple[int, ...]]:
    """Replace 'auto' by the most square mesh of `n_devices` (left as 'auto' if unknown yet)."""
    out: list[tuple[int, ...]] = []
    for pd in pdims:
        pd2 = square_pdims(n_devices) if pd == "auto" and n_devices else pd
        if pd2 not in out:
            out.append(pd2)  # type: ignore[arg-type]
    return out


def make_cases(args: argparse.Namespace, n_devices: int | None, exact: bool = False) -> list[Case]:
    """All cases in run order; raises SystemExit with a clear message on an impossible one.

    `exact`: every mesh must use all `n_devices` (several processes: a process left out of a
    mesh would have nothing to run).
    """
    cases = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            for pd in resolve_pdims(args.pdims, n_devices):
                if pd == "auto":
                    cases.append(Case(shape, dtype, ("auto",)))  # type: ignore[arg-type]
                    continue
                why = validate_case(shape, pd)
                if why:
                    raise SystemExit(f"error: shape {fmt_dims(shape)} on pdims {fmt_dims(pd)}: {why}")
                if n_devices is not None and math.prod(pd) > n_devices:
                    raise SystemExit(f"error: pdims {fmt_dims(pd)} needs {math.prod(pd)} devices; "
                                     f"there are {n_devices}")
                if exact and math.prod(pd) != n_devices:
                    raise SystemExit(f"error: pdims {fmt_dims(pd)} uses {math.prod(pd)} of the "
                                     f"{n_devices} devices; with several processes every mesh "
                                     "must use all of them")
                cases.append(Case(shape, dtype, pd))
    return cases


# --------------------------------------------------------------------------------------------
# The machine and the input data (jax imported in the functions, once devices are set)
# --------------------------------------------------------------------------------------------

def configure_devices(n: int | None) -> None:
    """Ask for `n` simulated CPU devices per process, if jax's backend does not exist yet.

    XLA_FLAGS wins when it already sets a count (the test suite and mpirun runners do); the
    option only affects the CPU backend, so it is harmless on GPU machines.
    """
    if n is None or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        pass  # backend already up (e.g. called in-process from the tests): the count is fixed


def machine_info() -> dict[str, Any]:
    """Where the numbers come from; stored in every record."""
    import jax

    dev = jax.devices()[0]
    env = {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_PARTITION", "SLURM_JOB_NUM_NODES",
                                      "SLURM_NTASKS", "SLURM_JOB_CONSTRAINTS", "XLA_FLAGS")
           if k in os.environ}
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "env": env,
    }


def loadavg() -> float | None:
    """The 1-minute load average of the machine (None where the OS does not say)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def load_range(records) -> str:
    """"a-b" (or "a"): the 1-minute load averages recorded with `records` (their
    machine.loadavg_1m), for a table's note; "not recorded" where none was."""
    loads = sorted(r["machine"].get("loadavg_1m") for r in records
                   if r.get("machine", {}).get("loadavg_1m") is not None)
    if not loads:
        return "not recorded"
    return f"{loads[0]:.1f}" if loads[0] == loads[-1] else f"{loads[0]:.1f}-{loads[-1]:.1f}"


def versions() -> dict[str, Any]:
    import jax
    import jaxlib

    out: dict[str, Any] = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    try:
        import pencilfft

        out["pencilfft"] = getattr(pencilfft, "__version__", None)
    except Exception:  # noqa: BLE001 - a broken pencilfft is reported by its variants
        out["pencilfft"] = None
    try:
        from importlib.metadata import version

        out["jaxdecomp"] = version("jaxdecomp")
    except Exception:  # noqa: BLE001
        out["jaxdecomp"] = None
    out["git_commit"] = _git_commit()
    return out


def _git_commit() -> str | None:
    """HEAD of the checkout the harness runs from, '+dirty' if tracked files changed.

    GIT_OPTIONAL_LOCKS=0: `git status` must not rewrite the index of a tree someone else uses.
    """
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               env=env, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def make_input(shape: Sequence[int], sharding: Any, dtype: str, seed: int) -> Any:
    """A global random array built block by block: no process ever holds more than its blocks.

    Each block's generator is seeded with (seed, block start): the data are reproducible for a
    given block structure whatever the number of processes.
    """
    import jax
    import numpy as np

    real = np.dtype(dtype).kind == "f"
    rdt = np.dtype(dtype) if real else np.dtype(REAL_DTYPE[dtype])

    def block(idx: tuple[slice, ...]) -> np.ndarray:
        starts = [s.indices(n)[0] for s, n in zip(idx, shape)]
        bshape = [len(range(*s.indices(n))) for s, n in zip(idx, shape)]
        rng = np.random.default_rng([seed, *starts])
        if real:
            return rng.standard_normal(bshape, dtype=rdt)
        out = np.empty(bshape, dtype)  # filled in place: no complex128 temporary
        out.real = rng.standard_normal(bshape, dtype=rdt)
        out.imag = rng.standard_normal(bshape, dtype=rdt)
        return out

    return jax.make_array_from_callback(tuple(shape), sharding, block)


# --------------------------------------------------------------------------------------------
# Variants and the timing loop
# --------------------------------------------------------------------------------------------

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


# What `benchmarks.impls` provides per implementation: fills the Variant's `fns`, `x` and
# `n_devices` using the runner's mesh and input, or raises Skip.
Builder = Callable[["CaseRunner", Variant], None]


class CaseRunner:
    """Builds, compiles, times and checks every variant of one case.

    `builders`: implementation name -> Builder, for every implementation `build` may be asked for.
    """

    def __init__(self, case: Case, args: argparse.Namespace, builders: Mapping[str, Builder]):
        import jax

        self.case = case
        self.args = args
        self.builders = builders
        self.single_process = jax.process_count() == 1
        self._inputs: dict[Any, Any] = {}

    # -- meshes and inputs -------------------------------------------------------------------
    def mesh(self, axis_type: str) -> Any:
        """The case's mesh, axes ("x", "y") (or ("x",) for slabs) of `axis_type`, first devices."""
        import jax
        from jax.sharding import AxisType

        pd = self.case.pdims
        kind = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[axis_type]
        devices = jax.devices()[: math.prod(pd)]
        return jax.make_mesh(pd, ("x", "y")[: len(pd)], axis_types=(kind,) * len(pd), devices=devices)

    def input(self, sharding: Any, real: bool) -> Any:
        """The case's input on `sharding` (cached: variants with equal shardings share it)."""
        dtype = REAL_DTYPE[self.case.dtype] if real else self.case.dtype
        key = (sharding, dtype)
        if key not in self._inputs:
            self._inputs[key] = make_input(self.case.shape, sharding, dtype, self.args.seed)
        return self._inputs[key]

    # -- building, compiling, timing, checking ------------------------------------------------
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
        """Lower+compile both directions, timed; the inverse is compiled for the forward's output.

        The forward is compiled even when only the inverse is timed: it makes the inverse's input.
        """
        import jax

        try:
            arg = v.x
            for d in DIRECTIONS:
                if d == "inverse":
                    if "inverse" not in self.args.directions:
                        break
                    arg = jax.block_until_ready(v.compiled["forward"](v.x))
                t0 = time.perf_counter()
                lowered = jax.jit(v.fns[d]).lower(arg)
                t1 = time.perf_counter()
                v.compiled[d] = lowered.compile()
                t2 = time.perf_counter()
                v.lower_s[d], v.compile_s[d] = t1 - t0, t2 - t0
                v.mem[d] = memory_stats(v.compiled[d])
                v.times[d] = []
            del arg
        except Exception as e:  # noqa: BLE001
            v.fail("error", e)

    def time_round(self, variants: Sequence[Variant], record: bool) -> None:
        """One forward then one inverse (of that forward's output) per variant; times kept if `record`.

        Only the inputs stay resident between calls: spectra are dropped after their inverse,
        so memory does not grow with the number of variants (matters at scale on GPUs).
        """
        from pencilfft._measure import time_once

        dirs = self.args.directions
        for v in variants:
            if not v.ok:
                continue
            try:
                t_fwd, k = time_once(v.compiled["forward"], v.x)
                if "inverse" in dirs:
                    t_inv, back = time_once(v.compiled["inverse"], k)
                    del back
            except Exception as e:  # noqa: BLE001
                v.fail("error", e)
                continue
            del k
            if record:
                if "forward" in dirs:
                    v.times["forward"].append(t_fwd)
                if "inverse" in dirs:
                    v.times["inverse"].append(t_inv)

    def check(self, v: Variant) -> None:
        """Forward vs numpy (in natural order, padding cropped) and inverse(forward) vs input."""
        import numpy as np

        from pencilfft._measure import max_rel_err

        x = to_numpy(v.x)
        ref_fn = np.fft.rfftn if v.real_input else np.fft.fftn
        ref = ref_fn(x.astype(np.complex128 if not v.real_input else np.float64), norm=self.args.norm)
        k_dev = v.compiled["forward"](v.x)
        k = to_numpy(k_dev)
        if v.layout == "transposed" and v.impl not in LAYOUT_FREE:
            k = k.transpose(2, 0, 1)  # (Y, Z, X) -> (X, Y, Z)
        if any(a < b for a, b in zip(k.shape, ref.shape)):
            v.status = "wrong"
            v.note = f"forward output shape {k.shape} (natural order) smaller than {ref.shape}"
            return
        k = k[tuple(slice(0, n) for n in ref.shape)]  # pencilfft may zero-pad Y/Z to the mesh
        errs = [max_rel_err(k, ref)]
        if "inverse" in v.compiled:
            back = to_numpy(v.compiled["inverse"](k_dev))
            errs.append(max_rel_err(back[tuple(slice(0, n) for n in x.shape)], x))
        v.err = {"forward": errs[0], "inverse": errs[-1]}
        if max(errs) > CHECK_TOL[self.case.dtype]:
            v.status, v.note = "wrong", f"max rel err {max(errs):.2e} > {CHECK_TOL[self.case.dtype]:.0e}"



def to_numpy(x: Any) -> Any:
    """The whole global array on every process (a collective call under mpirun/srun)."""
    import numpy as np

    if x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def memory_stats(compiled: Any) -> dict[str, int | None]:
    """Per-device bytes of the compiled program: arguments, outputs, temporaries (None if unknown)."""
    keys = ("argument", "output", "temp", "alias")
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not implemented on every backend
        ma = None
    if ma is None:
        return {k: None for k in keys} | {"total": None}
    out = {k: getattr(ma, f"{k}_size_in_bytes", None) for k in keys}
    parts = [out[k] for k in ("argument", "output", "temp")]
    out["total"] = sum(parts) if all(p is not None for p in parts) else None
    return out


def gather_max(values: Any) -> Any:
    """Elementwise max over processes (NaN-aware): the slowest process sets the time."""
    import jax
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    if jax.process_count() == 1:
        return arr
    from jax.experimental import multihost_utils

    allv = np.asarray(multihost_utils.process_allgather(arr))
    with warnings.catch_warnings():  # all-NaN entries (variants that did not run) stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(allv, axis=0)


def run_case(case: Case, args: argparse.Namespace, builders: Mapping[str, Builder],
             step: Callable[[str], None], context: dict[str, Any]) -> list[dict[str, Any]]:
    """Every variant of one case, interleaved; returns the records (one per variant and direction).

    `builders`: the implementations to run, in order (a selection of `benchmarks.impls`).
    """
    import numpy as np

    runner = CaseRunner(case, args, builders)
    variants = []
    for impl, layout in variant_plan(list(builders), args.layouts):
        step(f"{case.label}: compile {impl} [{layout}]")
        v = runner.build(impl, layout)
        if v.ok:
            runner.compile(v)
        variants.append(v)

    dirs = list(args.directions)
    for r in range(args.warmup + args.repeats):
        step(f"{case.label}: {'warm-up' if r < args.warmup else 'repeat'} {r - args.warmup + 1 if r >= args.warmup else r + 1}")
        live = [v for v in variants if v.ok]
        k = r % len(live) if live else 0
        runner.time_round(live[k:] + live[:k], record=r >= args.warmup)

    # Agree across processes: slowest process per repeat, slowest compile.
    shape = (len(variants), len(dirs), args.repeats)
    t = np.full(shape, np.nan)
    c = np.full(shape[:2] + (2,), np.nan)
    for i, v in enumerate(variants):
        for j, d in enumerate(dirs):
            ts = v.times.get(d, [])
            if v.ok and len(ts) == args.repeats:
                t[i, j] = ts
            if d in v.compile_s:
                c[i, j] = (v.lower_s[d], v.compile_s[d])
    t, c = gather_max(t), gather_max(c)

    # Correctness after timing (its gathers must not disturb the measurements).  Under several
    # processes every process gathers the whole array: only for moderate sizes.
    check = args.check and (runner.single_process or math.prod(case.shape) <= CHECK_MAX_POINTS_MP)
    if check:
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
            records.append(make_record(case, v, d, times, c[i, j], base.get(d), args, context))
    return records


# --------------------------------------------------------------------------------------------
# Records (RECORD_FIELDS): written one JSON line each, read back by `load_records`
# --------------------------------------------------------------------------------------------

def make_record(case: Case, v: Variant, direction: str, times: list[float] | None, comp: Any,
                base_median: float | None, args: argparse.Namespace, context: dict[str, Any]) -> dict[str, Any]:
    """One JSON line; every key of RECORD_FIELDS present."""
    import numpy as np

    flops = fft_flops(case.shape, v.real_input)
    mem = v.mem.get(direction, {})
    status, note = v.status, v.note
    if times is None and v.ran:  # e.g. failed on another process, or direction not compiled
        status, note = "error", note or "no timings"
    med = statistics.median(times) if times else None
    rec = {
        "schema": SCHEMA,
        "timestamp": context["timestamp"],
        "tag": args.tag,
        "status": status,
        "note": note,
        "impl": v.impl,
        "layout": v.layout,
        "direction": direction,
        "shape": list(case.shape),
        "n_points": math.prod(case.shape),
        "dtype": case.dtype,
        "input_dtype": REAL_DTYPE[case.dtype] if v.real_input and direction == "forward" else case.dtype,
        "norm": args.norm,
        "pdims": list(case.pdims),
        "axis_type": args.axis_type if v.impl.startswith(("pencilfft", "naive-pencil")) else "auto",
        "mesh_devices": math.prod(case.pdims),
        "n_devices": v.n_devices or None,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "lower_s": None if np.isnan(comp[0]) else float(comp[0]),
        "compile_s": None if np.isnan(comp[1]) else float(comp[1]),
        "median_s": med,
        "min_s": min(times) if times else None,
        "max_s": max(times) if times else None,
        "mean_s": statistics.fmean(times) if times else None,
        "std_s": statistics.pstdev(times) if times else None,
        "times_s": times,
        "flops": flops,
        "gflops": flops / med / 1e9 if med else None,
        "gflops_per_device": flops / med / 1e9 / v.n_devices if med and v.n_devices else None,
        "speedup_vs_fftn_1dev": base_median / med if med and base_median else None,
        "mem_argument_bytes": mem.get("argument"),
        "mem_output_bytes": mem.get("output"),
        "mem_temp_bytes": mem.get("temp"),
        "mem_alias_bytes": mem.get("alias"),
        "mem_bytes": mem.get("total"),
        "max_rel_err": v.err.get(direction),
        # The load when the case finished: the machine may be shared (other jobs add noise).
        "machine": {**context["machine"], "loadavg_1m": loadavg()},
        "versions": context["versions"],
        "command": context["command"],
    }
    return rec


def load_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """All records of JSON-lines files, in file order; a clear error names a bad line."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SystemExit(f"error: {path}:{n}: not a JSON record ({e})")
    return out

