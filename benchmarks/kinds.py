"""Transform kinds (a DCT-II along X) against the complex FFT and scipy, and the dealiased product.

    python -m benchmarks.kinds --devices 8 --shapes 256 --dtypes float32 \\
        --pdims 4x2 8x1 1x8 --repeats 5 --out benchmarks/data/kinds.jsonl
    python -m benchmarks.kinds --devices 8 --shapes 128 --dtypes float64 \\
        --pdims 4x2 8x1 1x8 --repeats 5 --out benchmarks/data/kinds.jsonl
    timeout 900 mpirun -np 2 python -m benchmarks.kinds product --shapes 128 256 --repeats 3 \\
        --rounds 3 --out benchmarks/data/kinds-dealias-np2.jsonl
    python -m benchmarks.kinds table benchmarks/data/kinds.jsonl     # [--format dealias]

Issue 20.  `kinds` (one process, `--devices` simulated CPU devices) times side by side in the
harness's interleaved rounds a real N^3 field under three kinds (X, Y, Z), forward and
forward + inverse: `fft,fft,fft` (`pfft3d` of the field cast to complex: every ratio's
reference, on the same devices), `dct2,fft,fft` and `dct2,fft,rfft` (`ptransform3d`, a channel
with walls along X); on `scipy 1 core` (scipy.fft, `workers=1`), `1 device`, and each mesh of
`--pdims` (`jax.jit` on an Auto mesh, no mesh in scope).  Each result is checked against scipy
in float64; `all_gather` says whether the compiled program gathers.

`product` (under mpirun, one CPU device per process, a slab Px1) multiplies two real
band-limited fields given by their N-mode spectra (Nyquist planes zero), norm="forward"
(mpi4py-fft's convention): `pencilfft 3/2` (`prfft3d(pirfft3d(a, padding=1.5) *
pirfft3d(b, padding=1.5), padding=1.5)` under jit), `pencilfft` (padding 1, aliased), and
`mpi4py-fft 3/2` / `mpi4py-fft` (`PFFT(..., padding=[1.5] * 3 or False, backend="fftw")`, if
installed).  Times as `harness.median_times` takes them; memory per process: XLA's analysis for
pencilfft, the arrays mpi4py-fft's plan and the caller hold for it; errors: each library
against the other (all modes, and without the Nyquist planes, where conventions may differ) and
against a numpy float64 3/2-rule product for N <= `--reference-max`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import pencilfft
from benchmarks import harness, mpi, private
from benchmarks.harness import fmt_ms

KINDS = {
    "fft,fft,fft": ("fft", "fft", "fft"),
    "dct2,fft,fft": ("dct2", "fft", "fft"),
    "dct2,fft,rfft": ("dct2", "fft", "rfft"),
}
REFERENCE_KINDS = "fft,fft,fft"  # the ratios' denominator, on the same devices
DIRECTIONS = ("forward", "roundtrip")
SCIPY = "scipy 1 core"
ONE_DEVICE = "1 device"
COMPLEX = {"float32": "complex64", "float64": "complex128"}
PRODUCT_ROWS = ("pencilfft 3/2", "mpi4py-fft 3/2", "pencilfft", "mpi4py-fft")


# Kinds, one process
def _scipy_calls(kinds: str, direction: str, n: int) -> Callable[[Any], Any]:
    """The numpy/scipy program of one kind and direction, one core (`workers=1`)."""
    import scipy.fft as sf

    w = {"workers": 1}
    if kinds == "fft,fft,fft":
        fwd = lambda v: sf.fftn(v, **w)  # noqa: E731
        inv = lambda k: sf.ifftn(k, **w)  # noqa: E731
    elif kinds == "dct2,fft,fft":
        fwd = lambda v: sf.fftn(sf.dct(v, type=2, axis=0, **w), axes=(1, 2), **w)  # noqa: E731
        inv = lambda k: sf.idct(sf.ifftn(k, axes=(1, 2), **w), type=2, axis=0, **w)  # noqa: E731
    else:
        fwd = lambda v: sf.rfftn(sf.dct(v, type=2, axis=0, **w), axes=(1, 2), **w)  # noqa: E731
        inv = lambda k: sf.idct(sf.irfftn(k, s=(n, n), axes=(1, 2), **w),  # noqa: E731
                                type=2, axis=0, **w)
    return fwd if direction == "forward" else (lambda v: inv(fwd(v)))


def _pencilfft_call(kinds: str, direction: str, n: int) -> Callable[[Any], Any]:
    k = KINDS[kinds]
    if kinds == "fft,fft,fft":
        fwd, inv = pencilfft.pfft3d, pencilfft.pifft3d
    else:
        fwd = lambda v: pencilfft.ptransform3d(v, k)  # noqa: E731
        inv = lambda s: pencilfft.pitransform3d(s, k, s=(n, n, n))  # noqa: E731
    return fwd if direction == "forward" else (lambda v: inv(fwd(v)))


def _error(got, name: str, direction: str, refs: dict[str, Any], x64, transposed: bool) -> float:
    """Against scipy's float64 forward of the field (natural order); a round trip against it."""
    got = np.asarray(got)
    if direction == "roundtrip":
        return private.max_rel_err(got, x64)
    ref = refs[name]
    if transposed:  # pencilfft's layout: global (Y, Z', X)
        got = np.transpose(got, (2, 0, 1))
    # A half spectrum is padded for the mesh (Z//2+1 to a multiple of Pb) in every calling form
    return private.max_rel_err(got[tuple(slice(0, n) for n in ref.shape)], ref)


def kinds_case(n: int, dtype: str, args: argparse.Namespace, ctx: dict[str, Any],
               kinds: Sequence[str]) -> list[dict[str, Any]]:
    """Every program of one (grid, dtype), timed in the same interleaved rounds."""
    one = SingleDeviceSharding(jax.devices()[0])
    x_np = np.asarray(harness.make_input((n,) * 3, one, dtype, args.seed))
    x64 = x_np.astype(np.float64)
    refs = {name: _scipy_calls(name, "forward", n)(x64.astype(np.complex128) if name == REFERENCE_KINDS
                                                   else x64) for name in kinds}
    base = {"tool": "kinds", "shape": [n] * 3, "dtype": dtype, "repeats": args.repeats}
    programs, records, failed = [], [], []
    for name in kinds:  # scipy's (numpy arrays, nothing to compile)
        arg = x_np.astype(COMPLEX[dtype]) if name == REFERENCE_KINDS else x_np
        programs += [harness.Program((SCIPY, name, d), "full", f, arg, compiled=f)
                     for d in DIRECTIONS for f in [_scipy_calls(name, d, n)]]
    placements = [(ONE_DEVICE, one)] + [(harness.fmt_dims(pd), NamedSharding(
        harness.make_mesh(pd, "auto"), P("x", "y"))) for pd in args.pdims]
    for place, sharding in placements:
        xr, xc = (jax.device_put(x_np.astype(t), sharding) for t in (dtype, COMPLEX[dtype]))
        for name in kinds:
            for d in DIRECTIONS:
                p = harness.Program((place, name, d), "full", jax.jit(_pencilfft_call(name, d, n)),
                                    xc if name == REFERENCE_KINDS else xr)
                try:
                    p.compile()
                    programs.append(p)
                except Exception as e:  # noqa: BLE001 - a case that cannot run is a result
                    failed.append({**base, "where": place, "kinds": name, "direction": d,
                                    "status": harness.failure(e), **ctx})
    harness.time_programs(programs, args.repeats, args.warmup)
    ctx = harness.stamp(ctx)
    for p in programs:
        place, name, d = p.name
        err = _error(p.compiled(p.arg), name, d, refs, x64, transposed=place != SCIPY)
        records.append({**base, "where": place, "kinds": name, "direction": d, "status": "ok",
                        "median_s": statistics.median(p.times), "mad_s": harness.mad(p.times),
                        "times_s": p.times, "err": err,
                        "all_gather": place != SCIPY and "all-gather" in p.compiled.as_text(),
                        "memory": None if place == SCIPY else harness.memory_stats(p.compiled), **ctx})
    return records + failed


def _kinds_cell(by: dict, name: str, ref_s: float | None) -> str:
    r = by[name]
    if r is None or r["status"] != "ok":
        return "—" if r is None else r["status"].split(":")[0]
    text = fmt_ms(r["median_s"])
    if name != REFERENCE_KINDS and ref_s:
        text += f" ({r['median_s'] / ref_s:.2f})"
    return text + (" all-gather" if r.get("all_gather") else "")


def table(records: list[dict[str, Any]]) -> str:
    """One row per (grid, dtype, where, direction): each kind's ms, ratios to fft and to scipy."""
    latest = harness.latest(records, lambda r: (tuple(r["shape"]), r["dtype"], r["where"],
                                                r["direction"], r["kinds"]))
    places = list(dict.fromkeys(r["where"] for r in records))  # scipy, 1 device, meshes as run
    rows = []
    for shape, dtype, place, d in sorted({k[:4] for k in latest}, key=lambda k: (
            k[0], k[1], DIRECTIONS.index(k[3]), places.index(k[2]))):
        by = {name: latest.get((shape, dtype, place, d, name)) for name in KINDS}
        ref = by[REFERENCE_KINDS]
        ref_s = ref["median_s"] if ref and ref["status"] == "ok" else None
        dct, sc = by["dct2,fft,fft"], latest.get((shape, dtype, SCIPY, d, "dct2,fft,fft"))
        errs = [r["err"] for r in by.values() if r and r["status"] == "ok"]
        rows.append([harness.fmt_dims(shape), dtype, d, place] + [
            _kinds_cell(by, name, ref_s) for name in KINDS] + [
            f"{dct['median_s'] / sc['median_s']:.2f}"
            if dct and sc and dct["status"] == sc["status"] == "ok" and place != SCIPY else "",
            f"{max(errs):.1e}" if errs else "—"])
    cases: dict[tuple, list[dict]] = {}
    for r in latest.values():  # the records shown: a case run again replaces its old records
        cases.setdefault((tuple(r["shape"]), r["dtype"]), []).append(r)
    loads = "; ".join(f"{harness.fmt_dims(shape)} {dtype}: {harness.load_range(rs)}"
                      for (shape, dtype), rs in sorted(cases.items()))
    r0 = next(iter(latest.values()))
    return harness.md_table(
        ["grid", "dtype", "direction", "where", "fft,fft,fft ms", "dct2,fft,fft ms (vs fft)",
         "dct2,fft,rfft ms (vs fft)", "dct2,fft,fft vs scipy 1 core", "max error"], rows,
        "llll" + "r" * 5, (
            f"Medians of {r0['repeats']} interleaved rounds, one process, "
            f"{r0['machine']['device_count']} CPU devices on {r0['machine']['cpu_count']} "
            f"cores; ratios to `pfft3d` (fft,fft,fft) on the same devices; the error is the "
            f"largest of the row against scipy in float64; load average (1 min) when a case "
            f"ended: {loads}."))


# The dealiased product, several processes
def _spectrum(n: int, seed: int):
    """A band-limited field's N-mode rfftn spectrum (norm "forward"), Nyquist planes zeroed."""
    u = np.random.default_rng(seed).standard_normal((n, n, n))
    uh = np.fft.rfftn(u, norm="forward")
    del u
    h = n // 2
    uh[h], uh[:, h], uh[:, :, h] = 0, 0, 0
    return uh


def _padded_product_reference(ah, bh, n: int):
    """numpy's float64 3/2-rule product of two spectra (pad to 3N/2, multiply, truncate)."""
    m = 3 * n // 2
    h = n // 2

    def pad(k):
        p = np.zeros((m, m, m // 2 + 1), complex)
        for i in (slice(0, h), slice(-h, None)):
            for j in (slice(0, h), slice(-h, None)):
                p[i, j, : h + 1] = k[i, j, : h + 1]
        return p

    w = np.multiply(*(np.fft.irfftn(pad(k), s=(m,) * 3, norm="forward") for k in (ah, bh)))
    wh = np.fft.rfftn(w, norm="forward")
    del w
    out = np.zeros((n, n, h + 1), complex)
    for i, ii in ((slice(0, h), slice(0, h)), (slice(h, n), slice(m - h, m))):
        for j, jj in ((slice(0, h), slice(0, h)), (slice(h, n), slice(m - h, m))):
            out[i, j] = wh[ii, jj, : h + 1]
    return out


def _no_nyquist(k, n: int):
    """The spectrum (X, Y, N/2+1) without its Nyquist planes (index N/2 of each axis)."""
    keep = np.ones(n, bool)
    keep[n // 2] = False
    return k[keep][:, keep][:, :, : n // 2]


def _array_bytes(*objects) -> int:
    """Bytes of the distinct numpy buffers mpi4py-fft's objects reach: what they hold."""
    seen: dict[int, int] = {}

    def visit(o, depth):
        if isinstance(o, np.ndarray):
            while isinstance(o.base, np.ndarray):  # (a view counts as the buffer it views)
                o = o.base
            seen[o.__array_interface__["data"][0]] = o.nbytes
        elif depth:
            for v in o if isinstance(o, (list, tuple)) else getattr(o, "__dict__", {}).values():
                visit(v, depth - 1)

    for o in objects:
        visit(o, 4)
    return sum(seen.values())


def _gather_global(comm, block, index, shape, dtype):
    """The global array on rank 0 from every rank's (index, block); None elsewhere."""
    parts = comm.gather((index, np.asarray(block)), root=0)
    if comm.rank != 0:
        return None
    out = np.zeros(shape, dtype)
    for idx, b in parts:
        out[idx] = b
    return out


def _pencilfft_product(n: int, dtype: str, padding: float, ah, bh, comm):
    """The compiled product on a slab, its inputs, its result's (index, block)."""
    mesh = jax.make_mesh((comm.size, 1), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    ks = pencilfft.k_space_sharding(mesh)  # transposed: (Y, Z//2+1, X), Y split over "x"
    kshape = (n, n // 2 + 1, n)
    a, b = (jax.make_array_from_callback(kshape, ks, lambda idx, k=k: np.ascontiguousarray(
        k.transpose(1, 2, 0)[idx]).astype(COMPLEX[dtype])) for k in (ah, bh))
    s = (n, n, n)

    def product(a, b):
        u = pencilfft.pirfft3d(a, s, norm="forward", padding=padding)
        v = pencilfft.pirfft3d(b, s, norm="forward", padding=padding)
        return pencilfft.prfft3d(u * v, norm="forward", padding=padding)

    compiled = jax.jit(product).lower(a, b).compile()
    out = compiled(a, b)
    shard = out.addressable_shards[0]
    iy, iz, ix = shard.index
    return compiled, (a, b), ((ix, iy, iz), np.asarray(shard.data).transpose(2, 0, 1)), out


def _mpi4py_fft_product(n: int, dtype: str, padding: float, ah, bh, comm):
    """mpi4py-fft's product: its call, the bytes it holds, and its result's (index, block)."""
    from mpi4py_fft import PFFT, newDistArray

    pad = [padding] * 3 if padding != 1 else False
    fft = PFFT(comm, (n, n, n), axes=(0, 1, 2), grid=(comm.size,), dtype=np.dtype(dtype),
               padding=pad, backend="fftw")
    a, b, out = (newDistArray(fft, forward_output=True) for _ in range(3))
    u, v, w = (newDistArray(fft, forward_output=False) for _ in range(3))
    a[:], b[:] = ah[a.local_slice()], bh[b.local_slice()]

    def call():
        fft.backward(a, u)
        fft.backward(b, v)
        np.multiply(u, v, out=w)
        return fft.forward(w, out)

    call()
    held = _array_bytes(fft, a, b, u, v, w, out)
    return call, held, (out.local_slice(), np.array(out)), fft


def _rel(got, ref) -> float:
    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def _errors(results: dict[str, Any], ah, bh, n: int, reference_max: int) -> dict[str, dict]:
    """Each library's product against the other's and against numpy's 3/2 rule."""
    errs: dict[str, dict[str, float]] = {name: {} for name in PRODUCT_ROWS}
    ref = _padded_product_reference(ah, bh, n) if n <= reference_max else None
    for suffix in (" 3/2", ""):
        p, m = results.get("pencilfft" + suffix), results.get("mpi4py-fft" + suffix)
        if p is not None and m is not None:
            errs["pencilfft" + suffix].update(
                vs_mpi4py_fft=_rel(p, m), vs_mpi4py_fft_no_nyquist=_rel(_no_nyquist(p, n), _no_nyquist(m, n)),
                vs_mpi4py_fft_no_z_nyquist=_rel(p[:, :, : n // 2], m[:, :, : n // 2]))
        for name in ("pencilfft" + suffix, "mpi4py-fft" + suffix):
            if ref is not None and suffix and results.get(name) is not None:
                errs[name]["vs_numpy_no_nyquist"] = _rel(_no_nyquist(results[name], n), _no_nyquist(ref, n))
    return errs


def product_case(n: int, dtype: str, args: argparse.Namespace, ctx: dict[str, Any],
                 seed: int = 0) -> list[dict[str, Any]]:
    import resource

    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ah, bh = _spectrum(n, seed), _spectrum(n, seed + 1)
    shape_k, ctype = (n, n, n // 2 + 1), COMPLEX[dtype]
    calls: dict[str, Callable[[], Any]] = {}
    info: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {}
    keep = []  # (what the calls need stays alive)
    for padding, suffix in ((1.5, " 3/2"), (1, "")):
        try:
            compiled, inputs, (idx, block), out = _pencilfft_product(n, dtype, padding, ah, bh, comm)
            keep.append(inputs)
            calls["pencilfft" + suffix] = lambda c=compiled, a=inputs: c(*a)
            mem = harness.memory_stats(compiled)
            info["pencilfft" + suffix] = {"memory": mem, "bytes": mem.get("total"),
                                          "all_gather": "all-gather" in compiled.as_text()}
            results["pencilfft" + suffix] = _gather_global(comm, block, idx, shape_k, ctype)
            del out
        except Exception as e:  # noqa: BLE001 - a case that cannot run is a result
            info["pencilfft" + suffix] = {"status": harness.failure(e)}
        if mpi.mpi4py_fft_version():
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            call, held, (idx, block), plan = _mpi4py_fft_product(n, dtype, padding, ah, bh, comm)
            keep.append(plan)
            calls["mpi4py-fft" + suffix] = call
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            info["mpi4py-fft" + suffix] = {"bytes": held, "maxrss_delta_bytes": (rss - rss0) * 1024}
            results["mpi4py-fft" + suffix] = _gather_global(comm, block, idx, shape_k, ctype)
    times = harness.median_times(calls, args.repeats, args.warmup, comm, args.rounds)
    errs = _errors(results, ah, bh, n, args.reference_max) if comm.rank == 0 else {}
    max_bytes = {name: comm.allreduce(i.get("bytes") or 0, op=MPI.MAX) for name, i in info.items()}
    stamp = harness.stamp(ctx)
    return [{"tool": "kinds-product", "row": name, "shape": [n] * 3, "dtype": dtype,
             "padding": 1.5 if name.endswith("3/2") else 1, "pdims": [comm.size, 1],
             "processes": comm.size, "norm": "forward", "status": info[name].get("status", "ok"),
             "repeats": args.repeats, "rounds": args.rounds, "bytes_per_process": max_bytes[name] or None,
             **{k: v for k, v in info[name].items() if k not in ("status", "bytes")},
             **errs.get(name, {}),
             **({"median_s": statistics.median(times[name]), "times_s": times[name]} if name in times else {}),
             **stamp, "versions": {**stamp["versions"], "mpi4py_fft": mpi.mpi4py_fft_version()}}
            for name in PRODUCT_ROWS if name in info]


def dealias_table(records: list[dict[str, Any]]) -> str:
    """One row per (grid, dtype, product): ms, MiB per process, the errors."""
    latest = {(tuple(r["shape"]), r["dtype"], r["row"]): r for r in records}
    rows = []
    for shape, dtype in sorted({k[:2] for k in latest}):
        for row in PRODUCT_ROWS:
            r = latest.get((shape, dtype, row))
            if r is None or r["status"] != "ok":
                rows += [] if r is None else [[harness.fmt_dims(shape), dtype, row,
                                               r["status"].split(":")[0], "", "", ""]]
                continue
            ms = fmt_ms(r["median_s"])
            base = latest.get((shape, dtype, row.replace("mpi4py-fft", "pencilfft")))
            if row.startswith("mpi4py-fft") and base and base.get("median_s"):
                ms += f" ({r['median_s'] / base['median_s']:.2f})"
            errs = [r.get(k) for k in ("vs_mpi4py_fft", "vs_mpi4py_fft_no_z_nyquist", "vs_mpi4py_fft_no_nyquist")]
            ref = r.get("vs_numpy_no_nyquist")
            rows.append([harness.fmt_dims(shape), dtype, row, ms,
                         f"{r['bytes_per_process'] / 2**20:.3g}" if r.get("bytes_per_process") else "—",
                         " / ".join(f"{e:.1e}" for e in errs) if None not in errs else "",
                         "—" if ref is None else f"{ref:.1e}"])
    r0 = records[0]
    return harness.md_table(
        ["grid", "dtype", "product", "ms (vs pencilfft)", "MiB per process",
         "pencilfft vs mpi4py-fft: all modes / no Z Nyquist plane / no Nyquist plane",
         "vs numpy 3/2 (no Nyquist plane)"], rows, "lll" + "r" * 4, (
            f"{r0['processes']} processes (mpirun), one CPU device each, slab "
            f"{harness.fmt_dims(r0['pdims'])}, norm=\"forward\" (mpi4py-fft's convention); "
            f"medians of {r0['rounds']} rounds of the median of {r0['repeats']} calls (the "
            f"slowest process); pencilfft's MiB: XLA's memory analysis of the jitted product, "
            f"mpi4py-fft's: the arrays its plan and the caller hold; load average when a case "
            f"ended: {harness.load_range(list(latest.values()))}."))


# ----------------------------------------------------------------------------------------------
# The command line (benchmarks.harness.main)

OPTIONS = dict(devices=8, shapes=["256"], pdims=dict(default=["4x2", "8x1", "1x8"], type=harness.parse_pxq),
               dtypes=dict(default=["float32"], choices=tuple(COMPLEX)), repeats=5, warmup=1, seed=0,
               out=None)
PART_DEFAULTS = {"product": dict(devices=None, shapes=[(128,) * 3], repeats=5)}


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kinds", nargs="+", choices=tuple(KINDS), default=list(KINDS))
    p.add_argument("--rounds", type=int, default=3, help="product: round-robin rounds (median of them)")
    p.add_argument("--reference-max", type=int, default=128,
                   help="product: largest N checked against numpy's float64 product on rank 0")


def run_kinds(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    kinds = list(dict.fromkeys([REFERENCE_KINDS, *args.kinds]))
    for dtype in args.dtypes:
        for shape in args.shapes:
            yield kinds_case(shape[0], dtype, args, ctx, kinds)


def run_product(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    from mpi4py import MPI

    size = MPI.COMM_WORLD.size
    if jax.local_device_count() != 1:
        raise SystemExit(f"benchmarks.kinds product wants one device per process; this one has "
                         f"{jax.local_device_count()} (unset XLA_FLAGS' device count)")
    for dtype in args.dtypes:
        for (n, *_) in args.shapes:
            if n % 2 or (3 * n // 2) % size or n % size:
                raise SystemExit(f"N={n}: N and 3N/2 must be even and divisible by {size}")
            yield product_case(n, dtype, args, ctx)


PARTS = {"kinds": (run_kinds, "kinds"), "product": (run_product, "dealias")}
TABLES = {"kinds": table, "dealias": dealias_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
