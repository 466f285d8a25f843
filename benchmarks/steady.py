"""Every call at FFTW's speed (issue 55): one CPU device, call by call, stage by stage, and memory.

    python -m benchmarks.steady calls --shapes 256 --out benchmarks/data/steady.jsonl
    python -m benchmarks.steady calls --shapes 256 --cores 1 --out benchmarks/data/steady.jsonl
    python -m benchmarks.steady rss --out benchmarks/data/steady.jsonl
    python -m benchmarks.steady stages --shapes 256 --out benchmarks/data/steady-stages.jsonl
    python -m benchmarks.steady heap --shapes 256 --out benchmarks/data/steady-heap.jsonl

`calls`: an N^3 complex64 forward + inverse under jit, `--calls` consecutive calls alone (and of
FFTW's own plan, the machine's noise floor), then
as many rounds of one loop where FFTW's own threaded in-place 3-D plan (the kernel's own FFTW
library, through ctypes) and jnp.fft run their forward + inverse too (other jax work allocating between our
calls); each call's time and page faults (getrusage: the kernel's memory work is in them).
`rss`: `--calls` round trips cycling through `--rss-shapes` (a new shape every call), the
process's resident memory after the first round of shapes and at the end.  `heap`: `--calls`
rounds of jnp.fft then pencilfft from the first call on, glibc's heap after each (where it grows,
the call faults its fresh pages in: the spikes).  `stages`: each
local FFT call of the one-device forward and inverse alone (the kernel with the stages' very
axes, order and norm), beside the whole transforms, FFTW's own 3-D plans and jnp.fft.
Every record holds the machine's CPU model and flags (`harness.cpu_info`) and the load.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import pencilfft
from benchmarks import harness, private
from benchmarks.harness import fmt_dims

CALL_VARIANTS = ("pencilfft", "fftw", "jnp.fft")
# The interleaved loop's rounds, in turn: each of pencilfft and FFTW runs right after jnp.fft in
# half of them (records before 2026-11-28 ran the first order only).
INTERLEAVED_ORDERS = (("pencilfft", "fftw", "jnp.fft"), ("fftw", "pencilfft", "jnp.fft"))


def _grid(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n,) * 3) + 1j * rng.standard_normal((n,) * 3)).astype(np.complex64)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _pencilfft_pair(x) -> Callable[[], Any]:
    fwd = jax.jit(pencilfft.pfft3d).lower(x).compile()
    k = jax.ShapeDtypeStruct(fwd.out_info.shape, fwd.out_info.dtype)
    inv = jax.jit(pencilfft.pifft3d).lower(k).compile()
    return lambda: inv(fwd(x)).block_until_ready()


def _fftw_pair(host: np.ndarray) -> Callable[[], Any]:
    """FFTW's own threaded in-place 3-D forward + inverse (planned with MEASURE), of the very
    FFTW library the kernel runs (pyFFTW's wheel's, or PENCILFFT_FFTW_DIR's), through ctypes."""
    _, libs = private.kernel.fftw_libraries()
    lib, omp = ctypes.CDLL(libs[1]), ctypes.CDLL(libs[3])
    lib.fftwf_malloc.restype = ctypes.c_void_p
    lib.fftwf_malloc.argtypes = [ctypes.c_size_t]
    lib.fftwf_plan_dft_3d.restype = ctypes.c_void_p
    lib.fftwf_plan_dft_3d.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2 + [
        ctypes.c_int, ctypes.c_uint]
    lib.fftwf_execute.argtypes = [ctypes.c_void_p]
    omp.fftwf_init_threads()
    omp.fftwf_plan_with_nthreads(private.threads.threads_per_device())
    buf = lib.fftwf_malloc(host.nbytes)
    a = np.ctypeslib.as_array((ctypes.c_char * host.nbytes).from_address(buf)).view(
        np.complex64).reshape(host.shape)
    f, b = (lib.fftwf_plan_dft_3d(*host.shape, buf, buf, sign, 0) for sign in (-1, 1))
    a[...] = host  # MEASURE planning wrote over the buffer
    keep = (a, lib, omp)  # the buffer and libraries live as long as the call
    return lambda: (lib.fftwf_execute(f), lib.fftwf_execute(b), keep)


def _measure(call: Callable[[], Any]) -> tuple[float, int]:
    """One call's seconds and minor page faults."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    call()
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return t1 - t0, r1 - r0


def _base(tool: str, ctx: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return {"tool": tool, "affinity": len(os.sched_getaffinity(0)),
            "threads": private.threads.threads_per_device(),
            "kernel": private.kernel.describe(), "allocator": private.malloc.describe(),
            **harness.stamp(ctx)}


def calls(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    n = args.shapes[0][0]
    host = _grid(n)
    x = jax.device_put(host)
    pair = {"pencilfft": _pencilfft_pair(x), "fftw": _fftw_pair(host)}
    fwd_j, inv_j = jax.jit(jnp.fft.fftn), jax.jit(jnp.fft.ifftn)
    pair["jnp.fft"] = lambda: inv_j(fwd_j(x)).block_until_ready()
    for f in pair.values():
        for _ in range(args.warmup):
            f()
    base = {**_base("steady-calls", ctx, args), "shape": [n] * 3, "calls": args.calls}
    harness.say(args, f"{n}^3 complex64 forward + inverse, {args.calls} calls alone, then "
                      f"interleaved; affinity {sorted(os.sched_getaffinity(0))}")
    # FFTW's own plan alone too: the noise floor of this machine's p90 and max.
    alone = {v: [_measure(pair[v]) for _ in range(args.calls)] for v in ("pencilfft", "fftw")}
    rounds: dict[str, list[tuple[float, int, str]]] = {v: [] for v in CALL_VARIANTS}
    prev = list(alone)[-1]
    for r in range(args.calls):
        # What jnp.fft leaves running (its blocks' munmap, on XLA's threads) lands in whichever
        # call comes next: pencilfft and FFTW take turns there, jnp.fft closes every round.
        for v in INTERLEAVED_ORDERS[r % len(INTERLEAVED_ORDERS)]:
            rounds[v].append((*_measure(pair[v]), prev))
            prev = v
    records = [{**base, "variant": v, "loop": "alone", "times_s": [t for t, _ in r],
                "faults": [f for _, f in r]} for v, r in alone.items()]
    records += [{**base, "variant": v, "loop": "interleaved", "times_s": [t for t, _, _ in r],
                 "faults": [f for _, f, _ in r], "after": [a for _, _, a in r]}
                for v, r in rounds.items()]
    yield records


def rss(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    shapes = [s[0] for s in args.rss_shapes]
    pairs = [_pencilfft_pair(jax.device_put(_grid(n))) for n in shapes]
    first = None
    t0 = time.perf_counter()
    for i in range(args.calls):
        pairs[i % len(pairs)]()
        if i == len(pairs) - 1:
            first = _rss_mib()
    yield [{**_base("steady-rss", ctx, args), "shapes": shapes, "calls": args.calls,
            "rss_first_round_mib": first, "rss_end_mib": _rss_mib(),
            "seconds": time.perf_counter() - t0}]


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _heap_mib() -> tuple[float, float]:
    """glibc's main heap (mallinfo2: `arena`, bytes got with brk) and what of it is free, MiB."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m = libc.mallinfo2()
    return m.arena / 2**20, m.fordblks / 2**20


def heap(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """`--calls` rounds of jnp.fft's forward + inverse, then pencilfft's, no warm-up: after each
    pencilfft call the heap's size (glibc's mallinfo2), resident memory, time and faults; the
    rounds where the heap grew are the spikes of the `calls` table (issue 55)."""
    n = args.shapes[0][0]
    x = jax.device_put(_grid(n))
    ours = _pencilfft_pair(x)
    fwd_j, inv_j = jax.jit(jnp.fft.fftn), jax.jit(jnp.fft.ifftn)
    rounds = []
    for _ in range(args.calls):
        inv_j(fwd_j(x)).block_until_ready()
        t, faults = _measure(ours)
        rounds.append((t, faults, *_heap_mib(), _rss_mib()))
    yield [{**_base("steady-heap", ctx, args), "shape": [n] * 3, "calls": args.calls,
            "times_s": [r[0] for r in rounds], "faults": [r[1] for r in rounds],
            "heap_mib": [r[2] for r in rounds], "heap_free_mib": [r[3] for r in rounds],
            "rss_mib": [r[4] for r in rounds]}]


def _stage_calls(n: int) -> dict[str, tuple[Callable, Any]]:
    """Each local FFT call of the one-device pfft3d/pifft3d, as the stages make it: name ->
    (compiled program, its input)."""
    kern = private.kernel
    x = jax.device_put(_grid(n)[None])  # (B, X, Y, Z): the one-device transform's block
    fwd = private.Fft(axes=(1, 2, 3), kinds=("fft",) * 3, sizes=(n,) * 3, norm="backward",
                      order=(0, 2, 3, 1))
    c = lambda f, a: jax.jit(f).lower(a).compile()  # noqa: E731
    out = {}
    if fwd._split():
        f1 = c(lambda a: kern.fft(a, "fft", fwd.axes[1:], "backward", fwd.sizes[1:]), x)
        y = f1(x)
        f2 = c(lambda a: kern.fft(a, "fft", fwd.axes[:1], "backward", fwd.sizes[:1], fwd.order), y)
        out |= {"forward 1: 2-D FFT over (Y, Z)": (f1, x),
                "forward 2: 1-D FFT over X, writing (B, Y, Z, X)": (f2, y)}
    k = jax.jit(fwd._forward_fftw)(x).block_until_ready()
    g = c(fwd._backward_fftw, k)
    out |= {"forward, whole": (c(fwd._forward_fftw, x), x), "inverse, whole": (g, k)}
    if fwd._split():
        a1 = c(lambda a: kern.fft(a, "ifft", (3,), "backward", (n,), fwd._undo, extra=n * n), k)
        z = a1(k).block_until_ready()
        a2 = c(lambda a: kern.fft(a, "ifft", (2, 3), "forward", (n, n)), z)
        out |= {"inverse 1: 1-D FFT over X, writing (B, X, Y, Z)": (a1, k),
                "inverse 2: 2-D FFT over (Y, Z)": (a2, z)}
    return out


def stages(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    import pyfftw

    n = args.shapes[0][0]
    progs = _stage_calls(n)
    calls_ = {name: (lambda f=f, a=a: f(a).block_until_ready()) for name, (f, a) in progs.items()}
    threads = private.threads.threads_per_device()
    a, b = (pyfftw.empty_aligned((n,) * 3, np.complex64) for _ in range(2))
    for name, arrays in (("FFTW 3-D, out of place", (a, b)), ("FFTW 3-D, in place", (a, a))):
        p = pyfftw.FFTW(*arrays, axes=(0, 1, 2), threads=threads)
        a[...] = 1
        calls_[name] = p.execute
    x = jax.device_put(_grid(n))
    jf = jax.jit(jnp.fft.fftn).lower(x).compile()
    calls_["jnp.fft.fftn"] = lambda: jf(x).block_until_ready()
    faults = {}
    for name, f in calls_.items():
        f()
        faults[name] = statistics.median(_measure(f)[1] for _ in range(3))
    timed = harness.time_calls(calls_, args.repeats, args.warmup)
    base = {**_base("steady-stages", ctx, args), "shape": [n] * 3, "repeats": args.repeats}
    yield [{**base, "stage": name, "median_s": statistics.median(t), "min_s": min(t),
            "faults": faults[name]} for name, t in timed.items()]


# ----------------------------------------------------------------------------------------------
# Tables


def _p90(times: Sequence[float]) -> float:
    s = sorted(times)
    return s[int(0.9 * (len(s) - 1))]


def _fftw_name(record: dict[str, Any]) -> str:
    """The FFTW the kernel ran (its version string names its codelets); records made before
    the kernel said so ran pyFFTW's wheel's."""
    m = re.search(r"\bfftw-[0-9][\w.-]*", record.get("kernel", ""))
    return m.group(0) if m else "fftw-3.3.5-sse2-avx"


def _malloc_name(record: dict[str, Any]) -> str:
    """The C library the run had ("glibc 2.36"), "+ tunables" where GLIBC_TUNABLES was set."""
    machine = record.get("machine", {})
    m = re.search(r"glibc \d+\.\d+", record.get("allocator", ""))
    name = machine.get("libc") or (m.group(0) if m else "glibc")
    return name + (" + tunables" if machine.get("env", {}).get("GLIBC_TUNABLES") else "")


def _after_jnp(record: dict[str, Any]) -> str:
    """Medians of the calls that ran right after jnp.fft and of the others, ms ("" where the
    record has no such split)."""
    after = record.get("after")
    if not after:
        return ""
    split = [[t for t, a in zip(record["times_s"], after) if (a == "jnp.fft") == right]
             for right in (True, False)]
    if not all(split):
        return ""
    return " / ".join(f"{statistics.median(part) * 1e3:.0f}" for part in split)


def steady_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per loop (alone, interleaved) and variant: median, p90, max (and their ratios to
    the median), page faults per call; then the resident memory over many shapes."""
    rows = []
    call_records = [r for r in records if r["tool"] == "steady-calls"]
    for r in call_records:
        t = r["times_s"]
        med = statistics.median(t)
        rows.append([fmt_dims(r["shape"]), r["affinity"], _fftw_name(r), _malloc_name(r),
                     r["loop"], r["variant"],
                     f"{med * 1e3:.0f}", _after_jnp(r),
                     f"{_p90(t) * 1e3:.0f} ({_p90(t) / med:.2f}x)",
                     f"{max(t) * 1e3:.0f} ({max(t) / med:.2f}x)",
                     f"{statistics.median(r['faults']):.0f}", f"{max(r['faults'])}",
                     f"{r['machine'].get('loadavg_1m') or 0:.1f}"])
    head = ["grid", "cores", "FFTW", "malloc", "loop", "variant", "median ms",
            "right after jnp.fft / otherwise ms", "p90 ms", "max ms", "faults/call (median)",
            "faults (max)", "load"]
    text = harness.md_table(head, rows, "lrllll" + "r" * 7, (
        f"complex64 forward + inverse on one CPU device, {call_records[0]['calls'] if call_records else 0} "
        "calls per row; alone: consecutive calls; interleaved: one loop of FFTW's own threaded "
        "in-place 3-D plan (the kernel's FFTW library: pyFFTW's wheel's unless the FFTW column "
        "names another), pencilfft and jnp.fft, each timed on its own, pencilfft and FFTW "
        "taking turns right after jnp.fft (runs before 2026-11-28: pencilfft always; no split "
        "then); cores: the process's affinity; load: the 1-minute load average when the run "
        "ended; malloc: the C library, and GLIBC_TUNABLES where the run set them (then "
        "pencilfft sets nothing)."
        if call_records else "")) if rows else ""
    rss_rows = [[", ".join(f"{n}^3" for n in r["shapes"]), r["calls"],
                 f"{r['rss_first_round_mib']:.0f}", f"{r['rss_end_mib']:.0f}",
                 f"{r['rss_end_mib'] / r['rss_first_round_mib']:.2f}"]
                for r in records if r["tool"] == "steady-rss"]
    if rss_rows:
        rss_text = harness.md_table(
            ["shapes (a new one every call)", "calls", "RSS after the first round MiB",
             "RSS at the end MiB", "end / first"], rss_rows, "lrrrr",
            "complex64 forward + inverse on one CPU device: the process's resident memory.")
        text = f"{text}\n\n{rss_text}" if text else rss_text
    return text


def heap_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per run: where glibc's heap grew, how big it ended, and what those rounds cost."""
    rows = []
    for r in records:
        h, t = r["heap_mib"], r["times_s"]
        grew = [i for i in range(1, len(h)) if h[i] > h[i - 1]]
        med = statistics.median(t[len(t) // 2:])
        rows.append([fmt_dims(r["shape"]), r["versions"].get("git_commit", "")[:7], r["calls"],
                     f"{h[0]:.0f}", f"{h[-1]:.0f}", f"{r['heap_free_mib'][-1]:.0f}",
                     f"{r['rss_mib'][-1]:.0f}", ", ".join(map(str, grew)) or "none",
                     f"{med * 1e3:.0f}",
                     f"{max(t[i] for i in grew) / med:.2f}" if grew else "",
                     ", ".join(f"{k}={v}" for k, v in r["machine"].get("env", {}).items()
                               if k.startswith(("MALLOC_", "GLIBC_", "PENCILFFT_MALLOC"))),
                     f"{r['machine'].get('loadavg_1m') or 0:.1f}"])
    head = ["grid", "commit", "rounds", "heap after round 0 MiB", "heap at the end MiB",
            "free in it MiB", "RSS at the end MiB", "rounds where the heap grew",
            "median ms (second half)", "slowest growing round / median", "allocator settings",
            "load"]
    return harness.md_table(head, rows, "ll" + "r" * 5 + "l" + "r" * 2 + "lr", (
        "complex64 forward + inverse on one CPU device, each round after jnp.fft's forward + "
        "inverse, no warm-up (round 0 compiles nothing: both were compiled before); heap: "
        "glibc's main heap (mallinfo2 `arena`), which grows when no free block of it can hold "
        "a new one, and whose fresh pages fault on first touch."))


def stages_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per stage call: median and min ms, share of its transform, faults per call."""
    runs: dict[Any, list[dict[str, Any]]] = {}
    for r in records:
        runs.setdefault((r["timestamp"], r["affinity"]), []).append(r)
    rows = []
    for (_, cores), rs in runs.items():
        whole = {r["stage"].split(",")[0]: r["median_s"] for r in rs if r["stage"].endswith("whole")}
        for r in rs:
            direction = r["stage"].split(" ")[0]
            share = (f"{r['median_s'] / whole[direction]:.2f}" if direction in whole
                     and not r["stage"].endswith("whole") else "")
            rows.append([fmt_dims(r["shape"]), cores, r["stage"], f"{r['median_s'] * 1e3:.1f}",
                         f"{r['min_s'] * 1e3:.1f}", share, f"{r['faults']:.0f}",
                         f"{r['machine'].get('loadavg_1m') or 0:.1f}"])
    head = ["grid", "cores", "call", "median ms", "min ms", "of its transform", "faults/call",
            "load"]
    reps = "-".join(str(v) for v in sorted({r["repeats"] for r in records}))
    return harness.md_table(head, rows, "lrl" + "r" * 5, (
        f"complex64, one CPU device: each local FFT call of pfft3d/pifft3d alone (the FFTW "
        f"kernel with the stages' axes, output order and norm), the whole transforms, FFTW's own "
        f"plans (pyFFTW, the same library and threads) and jnp.fft; medians of {reps} "
        f"interleaved rounds; load: the 1-minute load average when the run ended."))


# ----------------------------------------------------------------------------------------------
# The command line (benchmarks.harness.main)

OPTIONS = dict(cores=None, shapes=["256"], repeats=9, warmup=3, out=None)
PARTS = {"calls": (calls, "steady"), "rss": (rss, "steady"), "stages": (stages, "stages"),
         "heap": (heap, "heap")}
PART_DEFAULTS = {"rss": dict(calls=1000), "heap": dict(calls=100)}


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=30,
                   help="calls: calls per loop; rss: round trips in all (default 30; rss: 1000)")
    p.add_argument("--rss-shapes", nargs="+", type=harness.parse_shape,
                   default=[harness.parse_shape(s) for s in ("64", "96", "128", "80", "112")],
                   help="rss: the grids cycled through")


TABLES = {"steady": steady_table, "stages": stages_table, "heap": heap_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
