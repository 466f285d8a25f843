"""The harness of every comparison: one command line, the machine, input data, one timing loop,
records, and one markdown table writer.

    python -m benchmarks.<comparison> [PART] [options]     # measure; records appended to --out
    python -m benchmarks.<comparison> table FILE... [--format NAME] [--status STATUS...]

A comparison module holds only what is particular to it: `OPTIONS` (the common options of
`COMMON` it takes, with its defaults), `add_options(parser)` for its own, `run(args, ctx)` (or
`run_case(shape, pdims, args, ctx)`, or `PARTS`: part name -> (run, table name)) yielding lists
of records, `TABLES` (name -> markdown
table of records, the first the default), and optionally `plan(args)` (what --dry-run prints),
`validate(args)` and `report(args, records)` (what a run prints instead of its table).
`main(module)` does the rest: it parses, pins the cores, sets the device count and precision,
starts jax (jax.distributed under mpirun/srun), appends each list of records to --out as it is
measured (process 0 only) and prints the table.  Nothing may create jax's backend before
`start`: the cores, the device count and jax.distributed are set there.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType

from benchmarks import private

DIRECTIONS = ("forward", "inverse")
LAYOUTS = ("transposed", "natural")
DTYPES = ("complex64", "complex128")
REAL_DTYPE = {"complex64": "float32", "complex128": "float64"}
# Largest global array (points) a check gathers onto every process under mpirun/srun.
CHECK_MAX_POINTS_MP = 256**3


class Skip(Exception):
    """A variant that cannot run here (not installed, wrong mesh, too big...): noted, not an error."""


def parse_dims(text: str, what: str, example: str, counts: Sequence[int]) -> tuple[int, ...]:
    """'4x2' -> (4, 2), with as many sizes as `counts` allows (ArgumentTypeError otherwise)."""
    try:
        dims = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) not in counts or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{what} {text!r}: expected {example}")
    return dims


def parse_shape(text: str) -> tuple[int, int, int]:
    """'128' -> (128, 128, 128); '256x128x64' -> (256, 128, 64)."""
    dims = parse_dims(text, "shape", "N or XxYxZ with positive sizes, e.g. 128 or 256x128x64", (1, 3))
    return dims * 3 if len(dims) == 1 else dims  # type: ignore[return-value]


def parse_pdims(text: str) -> tuple[int, ...] | str:
    """'4x2' -> (4, 2) (pencils); '8' -> (8,) (slabs on a 1-axis mesh); 'auto' kept as is."""
    return text if text == "auto" else parse_dims(
        text, "pdims", "PxQ (e.g. 4x2), P (e.g. 8) or auto, positive sizes", (1, 2))


def parse_pxq(text: str) -> tuple[int, int]:
    """`parse_pdims`, but only PxQ: for comparisons whose meshes always have two axes."""
    return parse_dims(text, "pdims", "PxQ, 2 positive sizes, e.g. 4x2", (2,))  # type: ignore[return-value]


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


def validate_case(shape: Sequence[int], pdims: Sequence[int]) -> str | None:
    """Why this (shape, mesh) cannot be measured (pencilfft's own rule), or None."""
    problem = private.split_problem(shape, pdims, ("x", "y"))
    return None if problem is None else problem[1]


@dataclasses.dataclass(frozen=True)
class Case:
    shape: tuple[int, int, int]
    dtype: str
    pdims: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{fmt_dims(self.shape)} {self.dtype} pdims {fmt_dims(self.pdims)}"


def make_cases(args: argparse.Namespace, n_devices: int | None, exact: bool = False) -> list[Case]:
    """Every (shape, dtype, mesh) ('auto': most square); `exact`: all devices in every mesh."""
    pdims = list(dict.fromkeys(square_pdims(n_devices) if pd == "auto" and n_devices else pd
                               for pd in args.pdims))
    cases = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            for pd in pdims:
                if pd == "auto":
                    cases.append(Case(shape, dtype, ("auto",)))
                    continue
                why, n = validate_case(shape, pd), math.prod(pd)
                if why:
                    raise SystemExit(f"error: shape {fmt_dims(shape)} on pdims {fmt_dims(pd)}: {why}")
                if n_devices is not None and n > n_devices:
                    raise SystemExit(f"error: pdims {fmt_dims(pd)} needs {n} devices; there are {n_devices}")
                if exact and n != n_devices:
                    raise SystemExit(f"error: pdims {fmt_dims(pd)} uses {n} of the {n_devices} "
                                     "devices; with several processes every mesh must use all of them")
                cases.append(Case(shape, dtype, pd))
    return cases


def pin_cores(n: int | None) -> None:
    """This process on `n` of its cores, as taskset; under mpirun/srun each on its own `n`."""
    if not n:
        return
    rank = next((int(os.environ[k]) for k in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                                               "SLURM_LOCALID") if k in os.environ), 0)
    cores = sorted(os.sched_getaffinity(0))[rank * n:(rank + 1) * n]
    if len(cores) < n:
        raise SystemExit(f"error: --cores {n}: local rank {rank} has only {len(cores)} cores left")
    os.sched_setaffinity(0, cores)


def configure_devices(n: int | None) -> None:
    """`n` simulated CPU devices per process, unless XLA_FLAGS sets a count."""
    if n is None or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        pass  # backend already up (e.g. called in-process from the tests): the count is fixed


def start(args: argparse.Namespace) -> None:
    """Cores, device count and precision, then jax (jax.distributed under mpirun/srun)."""
    pin_cores(getattr(args, "cores", None))
    configure_devices(getattr(args, "devices", None))
    import pencilfft  # (here: an orchestrator that starts no jax must not fail on pencilfft)

    pencilfft.initialize()
    if {"complex128", "float64"} & set(getattr(args, "dtypes", None) or ()):
        jax.config.update("jax_enable_x64", True)


def is_main() -> bool:
    return jax.process_index() == 0


# The CPU flags that decide FFT speed (SIMD width, FMA), named in every table's header.
CPU_FLAGS = ("avx", "avx2", "fma", "avx512f")


def cpu_info() -> dict[str, Any]:
    """The CPU's model name and which of `CPU_FLAGS` it has (Linux's /proc/cpuinfo; else the
    platform's processor string and no flags)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not key.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    model = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:  # (a VM's name may hide the generation)
        model += f" (family {fields['cpu family']}, model {fields['model']})"
    flags = set(fields.get("flags", "").split())
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags]}


def cpu_line(records: Iterable[dict[str, Any]]) -> str | None:
    """"CPU: model (flags)" of the machines `records` were measured on, for a table's header
    (records from before the CPU was recorded say so; None for records without a machine)."""
    seen: list[str] = []
    for r in records:
        machine = r.get("machine")
        if machine is None:
            continue
        cpu = machine.get("cpu") if isinstance(machine, dict) else None
        text = (f"{cpu['model']} ({', '.join(cpu['flags']) or 'none of ' + '/'.join(CPU_FLAGS)})"
                if cpu else "not recorded (measured before the CPU was stored in each record)")
        if text not in seen:
            seen.append(text)
    return f"CPU: {'; '.join(seen)}." if seen else None


def machine_info() -> dict[str, Any]:
    """Where the numbers come from; stored in every record."""
    env = {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_PARTITION", "SLURM_JOB_NUM_NODES",
                                      "SLURM_NTASKS", "SLURM_JOB_CONSTRAINTS", "XLA_FLAGS",
                                      "PENCILFFT_THREADS", "PENCILFFT_MALLOC",
                                      "PENCILFFT_FFTW_DIR", "PENCILFFT_FFTW_HUGE_PAGES",
                                      "MALLOC_ARENA_MAX", "GLIBC_TUNABLES")
           if k in os.environ}
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version(), "cpu": cpu_info(), "cpu_count": os.cpu_count(),
            "cores": len(os.sched_getaffinity(0)),
            "threads_per_device": private.threads.threads_per_device(),
            "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
            "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
            "process_count": jax.process_count(), "libc": libc_version(), "env": env}


def libc_version() -> str:
    """The C library this process runs ("glibc 2.36"), not the one Python was built against."""
    version = private.malloc.glibc_version()
    return f"glibc {version}" if version else (platform.libc_ver()[0] or "not glibc")


def loadavg() -> float | None:
    """The 1-minute load average of the machine (None where the OS does not say)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def load_range(records: Iterable[dict[str, Any]]) -> str:
    """"a-b": the load averages recorded with `records`, for a table's note."""
    loads = sorted(r["machine"].get("loadavg_1m") for r in records
                   if r.get("machine", {}).get("loadavg_1m") is not None)
    if not loads:
        return "not recorded"
    return f"{loads[0]:.1f}" if loads[0] == loads[-1] else f"{loads[0]:.1f}-{loads[-1]:.1f}"


def versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {}
    for name in ("jax", "jaxlib", "pencilfft", "jaxdecomp"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:  # (pencilfft from a checkout on PYTHONPATH: not installed)
            out[name] = getattr(sys.modules.get(name), "__version__", None)
    return {**out, "git_commit": _git_commit()}


def _git_commit() -> str | None:
    """HEAD of this checkout, "+dirty" if tracked files changed (git status takes no lock)."""
    root, env = Path(__file__).resolve().parents[1], dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        head, changed = (subprocess.run(["git", *c], cwd=root, capture_output=True, text=True,
                                        timeout=10, env=env)
                         for c in (["rev-parse", "HEAD"], ["status", "--porcelain", "-uno"]))
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if changed.stdout.strip() else "")


def context(prog: str, argv: Sequence[str]) -> dict[str, Any]:
    """What every record of a run stores about it."""
    return {"timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine_info(), "versions": versions(),
            "command": f"python -m {prog} " + shlex.join(argv)}


def stamp(ctx: dict[str, Any]) -> dict[str, Any]:
    """`ctx` for one record, with the load when it was measured (the machine may be shared)."""
    return {**ctx, "machine": {**ctx["machine"], "loadavg_1m": loadavg()}}


def make_mesh(pdims: Sequence[int], axis_type: str = "explicit", names: Sequence[str] = ("x", "y")):
    """A mesh over the first devices, axes `names` (as many as pdims) Explicit or Auto."""
    kind = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[axis_type]
    return jax.make_mesh(tuple(pdims), tuple(names)[: len(pdims)], axis_types=(kind,) * len(pdims),
                         devices=jax.devices()[: math.prod(pdims)])


def make_input(shape: Sequence[int], sharding: Any, dtype: str, seed: int) -> Any:
    """A random global array built block by block, seeded by block: the same on any process count."""
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


def to_numpy(x: Any) -> Any:
    """The whole global array on every process (a collective call under mpirun/srun)."""
    if isinstance(x, np.ndarray) or x.is_fully_addressable:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def memory_stats(compiled: Any) -> dict[str, int | None]:
    """Per-device bytes of a compiled program (None where the backend does not say)."""
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not implemented on every backend
        ma = None
    out = {k: getattr(ma, f"{k}_size_in_bytes", None) for k in ("argument", "output", "temp", "alias")}
    parts = [out[k] for k in ("argument", "output", "temp")]
    return {**out, "total": sum(parts) if None not in parts else None}


def gather_max(values: Any) -> Any:
    """Elementwise max over processes (NaN-aware): the slowest process sets the time."""
    arr = np.asarray(values, dtype=np.float64)
    if jax.process_count() == 1:
        return arr
    allv = np.asarray(multihost_utils.process_allgather(arr))
    with warnings.catch_warnings():  # all-NaN entries (variants that did not run) stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(allv, axis=0)


def failure(e: BaseException) -> str:
    """A status for a program that could not run (a result too, not a crash of the run)."""
    return f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


@dataclasses.dataclass
class Program:
    """One timed program: `fn` on `arg`, compiled ahead of time into `compiled` (or any callable)."""

    name: str
    kind: str
    fn: Callable[[Any], Any]
    arg: Any
    compiled: Any = None
    times: list[float] = dataclasses.field(default_factory=list)
    ok = True

    def compile(self) -> None:
        self.compiled = jax.jit(self.fn).lower(self.arg).compile()

    def run(self, record: bool) -> None:
        t, out = private.time_once(self.compiled or self.fn, self.arg)
        del out  # free the result before the next program runs
        if record:
            self.times.append(t)


def time_programs(programs: Sequence[Any], repeats: int, warmup: int,
                  barrier: Callable[[], Any] | None = None) -> None:
    """The timing loop of every comparison: `warmup` + `repeats` rounds, each running every
    program that is still `ok` once (its `run(record)`), the first one rotating from round to
    round, so that drift of the machine (other jobs, thermal state, the OS) spreads over all of
    them instead of favouring whichever runs first.  `barrier` is called before every call
    (several processes: all start it together)."""
    for r in range(warmup + repeats):
        live = [p for p in programs if p.ok]
        k = r % len(live) if live else 0
        for p in live[k:] + live[:k]:
            if barrier is not None:
                barrier()
            p.run(r >= warmup)


def time_calls(calls: dict[str, Callable[[], Any]], repeats: int, warmup: int,
               barrier: Callable[[], Any] | None = None) -> dict[str, list[float]]:
    """`time_programs` of argument-less calls: name -> its timed seconds."""
    programs = [Program(name, "full", call, None, compiled=lambda _, c=call: c())
                for name, call in calls.items()]
    time_programs(programs, repeats, warmup, barrier)
    return {p.name: p.times for p in programs}


def median_times(calls: dict[str, Callable[[], Any]], repeats: int, warmup: int, comm: Any = None,
                 rounds: int = 1) -> dict[str, list[float]]:
    """name -> per round, the median of its `repeats` calls; with an MPI `comm`, every call
    started together (a barrier before it) and the slowest process's median counted."""
    out: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, times in time_calls(calls, repeats, warmup, comm and comm.Barrier).items():
            out[name].append(comm.allreduce(statistics.median(times), op=max) if comm else
                             statistics.median(times))
    return out


def compile_programs(programs: Sequence[Program]) -> None:
    for p in programs:
        p.compile()


def mad(times: Sequence[float]) -> float:
    """Median absolute deviation of repeated timings: their noise, robust to outliers."""
    med = statistics.median(times)
    return statistics.median(abs(t - med) for t in times)


def write_records(path: Path | None, records: Sequence[dict[str, Any]]) -> None:
    """Append `records` as JSON lines (process 0 only: the records of every process agree)."""
    if path is None or not records or not is_main():
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def load_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """All records of JSON-lines files, in file order; a clear error names a bad line."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                try:
                    out += [json.loads(line)] if line.strip() else []
                except json.JSONDecodeError as e:
                    raise SystemExit(f"error: {path}:{n}: not a JSON record ({e})")
    return out


def latest(records: Iterable[dict[str, Any]], key: Callable[[dict], Any]) -> dict[Any, dict]:
    """The last record of each key (re-running a case appends; the newest counts)."""
    return {key(r): r for r in records}


def fmt_ms(s: float | None) -> str:
    """Seconds as milliseconds, 3 significant digits (whole ms from 1 s up); '' for None."""
    return "" if s is None else f"{s * 1e3:.3g}" if s < 1 else f"{s * 1e3:.0f}"


def md_table(head: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "",
             note: str | None = None) -> str:
    """The markdown table of every benchmark: `align` 'r' per right column, `note` under it."""
    aligns = align[: len(head)].ljust(len(head), "l")
    lines = ["| " + " | ".join(head) + " |",
             "|" + "".join("---:|" if a == "r" else "---|" for a in aligns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines + (["", note] if note else []))


# The options a comparison may take (its OPTIONS give each one's default, or a dict of
# argparse overrides): the same flag means the same thing in every comparison.
COMMON: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "devices": (("--devices",), dict(type=int, metavar="N", help="simulated CPU devices per process")),
    "cores": (("--cores",), dict(type=int, metavar="N", help="run on N cores, as taskset (each rank its own)")),
    "shapes": (("--shapes", "--shape"), dict(nargs="+", type=parse_shape, metavar="N|XxYxZ")),
    "pdims": (("--pdims", "--meshes"), dict(nargs="+", type=parse_pdims, metavar="PxQ|P|auto",
                                            help="pencils PxQ (X split P, Y Q ways), slabs P, auto")),
    "dtypes": (("--dtypes", "--dtype"), dict(nargs="+", choices=DTYPES, help="64 bits turn on x64")),
    "exchange": (("--exchange",), dict(choices=("auto", "alltoall", "pairwise", "local"))),
    "repeats": (("--repeats",), dict(type=int, help="timed rounds")),
    "warmup": (("--warmup",), dict(type=int, help="untimed rounds first")),
    "seed": (("--seed",), dict(type=int, help="seed of the input data")),
    "check": (("--check",), dict(action=argparse.BooleanOptionalAction, help="check the results")),
    "out": (("--out",), dict(type=Path, help="JSON-lines file the records are appended to")),
    "tag": (("--tag", "--label"), dict(help="a free label stored in every record")),
    "quiet": (("--quiet",), dict(action="store_true", help="no progress lines")),
    "dry_run": (("--dry-run",), dict(action="store_true", help="print the plan, start nothing")),
}


def prog(mod: ModuleType) -> str:
    """'benchmarks.fft' also when the module runs as __main__ (python -m)."""
    spec = getattr(mod, "__spec__", None)
    return spec.name if spec is not None else mod.__name__


def parts(mod: ModuleType) -> dict[str, tuple[Callable, str]]:
    """part -> (run, its table); `run_case` alone runs for every grid and mesh."""
    run = getattr(mod, "run", None) or (lambda args, ctx: (
        mod.run_case(shape, pdims, args, ctx) for shape in args.shapes for pdims in args.pdims))
    return getattr(mod, "PARTS", None) or {"run": (run, next(iter(mod.TABLES)))}


def parser(mod: ModuleType, part: str | None = None) -> argparse.ArgumentParser:
    """The command line of comparison `mod` (of one of its PARTS)."""
    names = list(parts(mod))
    several = len(names) > 1
    p = argparse.ArgumentParser(
        prog=f"python -m {prog(mod)}" + (f" {part}" if part and several else ""),
        description=mod.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(f"parts (the first word): {', '.join(names)}; " if several else "")
        + "`table FILE...` prints saved records")
    for name, value in {"quiet": False, "dry_run": False, **mod.OPTIONS}.items():
        flags, spec = COMMON[name]
        spec = {**spec, **(value if isinstance(value, dict) else {"default": value})}
        p.add_argument(*flags, **{**spec, "default": _parsed(spec)})
    if hasattr(mod, "add_options"):
        mod.add_options(p)
    p.set_defaults(**getattr(mod, "PART_DEFAULTS", {}).get(part, {}))
    return p


def _parsed(spec: dict[str, Any]) -> Any:
    """A default given as the command line would give it, parsed as the option parses it."""
    value, kind = spec.get("default"), spec.get("type")
    if kind is None:
        return value
    if isinstance(value, list):
        return [kind(v) if isinstance(v, str) else v for v in value]
    return kind(value) if isinstance(value, str) else value


def say(args: argparse.Namespace, message: str) -> None:
    """A progress line on stderr (process 0, unless --quiet)."""
    if not getattr(args, "quiet", False) and is_main():
        print(message, file=sys.stderr, flush=True)


def table_command(mod: ModuleType, argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {prog(mod)} table",
                                description="Print saved records (JSON lines) as a markdown table.")
    p.add_argument("files", nargs="+", type=Path, help="results files written by --out")
    p.add_argument("--format", choices=list(mod.TABLES), default=next(iter(mod.TABLES)))
    p.add_argument("--status", nargs="+", metavar="STATUS", help="keep only these statuses")
    a = p.parse_args(argv)
    records = [r for r in load_records(a.files) if not a.status or r.get("status") in a.status]
    print(mod.TABLES[a.format](records))
    return 0


def main(mod: ModuleType, argv: Sequence[str] | None = None) -> int:
    """The command line of comparison `mod`; exit status 1 when a result was wrong."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["table"]:
        return table_command(mod, argv[1:])
    names = parts(mod)
    part = argv[0] if argv[:1] and argv[0] in names and len(names) > 1 else next(iter(names))
    args = parser(mod, part).parse_args(argv[1:] if argv[:1] == [part] else argv)
    args.part = part
    if getattr(args, "repeats", 1) < 1 or getattr(args, "warmup", 0) < 0:
        raise SystemExit("error: --repeats must be >= 1 and --warmup >= 0")
    if hasattr(mod, "validate"):
        mod.validate(args)
    if args.dry_run:
        print("\n".join(mod.plan(args)) if hasattr(mod, "plan") else "nothing to plan")
        return 0
    jax_here = getattr(mod, "USES_JAX", True)  # (an orchestrator leaves jax to its children)
    if jax_here:
        start(args)
    ctx = context(prog(mod), argv) if jax_here else {}
    records: list[dict[str, Any]] = []
    for batch in names[part][0](args, ctx):
        write_records(getattr(args, "out", None), batch)
        records += batch
    if not records or (jax_here and not is_main()):
        return 0
    print(mod.report(args, records) if hasattr(mod, "report") else mod.TABLES[names[part][1]](records))
    for r in records:
        if r.get("status") in ("error", "wrong"):
            print(f"{r['status']}: {r.get('impl', r.get('program', ''))}: {r.get('note', '')}")
    if getattr(args, "out", None):
        print(f"{len(records)} records appended to {args.out}")
    return 1 if any(r.get("status") == "wrong" for r in records) else 0
