"""Transform kinds (a DCT-II along X) against the complex FFT and scipy, and the dealiased product.

    python -m benchmarks.kinds --devices 8 --shape 256 --dtypes float32 \\
        --meshes 4x2 8x1 1x8 --repeats 5 --out benchmarks/data/kinds.jsonl
    python -m benchmarks.kinds --devices 8 --shape 128 --dtypes float64 \\
        --meshes 4x2 8x1 1x8 --repeats 5 --out benchmarks/data/kinds.jsonl
    timeout 900 mpirun -np 2 python -m benchmarks.kinds product --shapes 128 256 --repeats 3 \\
        --rounds 3 --out benchmarks/data/kinds-dealias-np2.jsonl
    python -m benchmarks.kinds table benchmarks/data/kinds.jsonl     # [--dealias]: the tables

Issue 20.  The first command (one process, `--devices` simulated CPU devices) times side by
side, compiled ahead of time, in interleaved rounds (`benchmarks.steps.time_programs`), medians,
a real N^3 field of `--dtypes` under three kinds (X, Y, Z):

* `fft,fft,fft`: the complex FFT `pfft3d` of the same field cast to complex (the reference of
  every ratio, on the same devices);
* `dct2,fft,fft`: `ptransform3d(x, ("dct2", "fft", "fft"))`, a channel with walls along X;
* `dct2,fft,rfft`: `ptransform3d(x, ("dct2", "fft", "rfft"))`, the same with a half spectrum;

each forward only and forward + inverse (`pitransform3d`), on

* `scipy 1 core`: numpy arrays, `scipy.fft.dct` along X then `fftn`/`rfftn` along Y, Z
  (`workers=1`), and `scipy.fft.fftn` for the complex one;
* `1 device`: the same pencilfft calls on an array on one device (the one-device transform);
* each mesh PxQ of `--meshes`: `jax.jit` of the same calls on an array split P("x", "y") over
  an Auto mesh, no mesh in scope (the compiler-partitioned path, as jaxdecomp's users call it).

Each result is checked once against scipy in float64 (`err`: max|got - ref| / max|ref|; the
round trip against the input).  `all_gather` says whether the compiled program gathers (a
spectrum whose Z//2+1 the mesh does not divide, returned from the jit, is replicated).

The second command (`product`, under mpirun, one CPU device per process after
`pencilfft.initialize()`) computes the product of two real band-limited fields given by their
N-mode spectra (Nyquist planes zero), on a slab 2x1 (X split over the processes):

* `pencilfft 3/2`: `prfft3d(pirfft3d(a, s, padding=1.5) * pirfft3d(b, s, padding=1.5),
  padding=1.5)` under `jax.jit`, norm="forward" (mpi4py-fft's convention: the spectra are
  Fourier coefficients, the same numbers in both libraries);
* `pencilfft`: the same with padding 1 (the aliased product);
* `mpi4py-fft 3/2` and `mpi4py-fft`: `PFFT(comm, (N, N, N), axes=(0, 1, 2), grid=(P,),
  dtype, padding=[1.5] * 3 or False, backend="fftw")`: `backward` of both spectra, multiply,
  `forward` (only if mpi4py_fft is installed; it needs FFTW).

Times: the median of `--repeats` calls after a barrier each, the largest over the processes,
the median of `--rounds` round-robin rounds (as `benchmarks.mpi`).  Memory per process: XLA's
memory analysis of the jitted product (arguments + outputs + temporaries) for pencilfft, the
bytes of every array mpi4py-fft's plan holds plus the caller's (both spectra, the padded fields
and their product, the output) for mpi4py-fft.  Errors: the two libraries' products against each
other (all modes, and without the product's Nyquist planes, where their conventions may differ),
and against a numpy float64 3/2-rule product for N <= `--reference-max`.  Rank 0 writes one
record per row.  Only the standard library is imported at module level: `--devices` must act
before jax starts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import harness
from benchmarks.report import fmt_ms

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


def _context() -> dict[str, Any]:
    return {"machine": {**harness.machine_info(), "loadavg_1m": harness.loadavg()},
            "versions": harness.versions(), "command": " ".join(sys.argv)}


# ----------------------------------------------------------------------------------------------
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
    import pencilfft

    k = KINDS[kinds]
    if kinds == "fft,fft,fft":
        fwd, inv = pencilfft.pfft3d, pencilfft.pifft3d
    else:
        fwd = lambda v: pencilfft.ptransform3d(v, k)  # noqa: E731
        inv = lambda s: pencilfft.pitransform3d(s, k, s=(n, n, n))  # noqa: E731
    return fwd if direction == "forward" else (lambda v: inv(fwd(v)))


def _references(x64, kinds: Sequence[str]) -> dict[str, Any]:
    """scipy's float64 forward transforms of the field (natural order (X, Y, Z))."""
    import numpy as np

    out = {}
    for name in kinds:
        out[name] = _scipy_calls(name, "forward", x64.shape[0])(
            x64.astype(np.complex128) if name == "fft,fft,fft" else x64)
    return out


def _error(got, name: str, direction: str, refs: dict[str, Any], x64, transposed: bool) -> float:
    import numpy as np

    from pencilfft._measure import max_rel_err

    got = np.asarray(got)
    if direction == "roundtrip":
        return max_rel_err(got, x64)
    if transposed:  # pencilfft's layout: global (Y, Z', X)
        got = np.transpose(got, (2, 0, 1))
    ref = refs[name]
    # A half spectrum is padded for the mesh (Z//2+1 to a multiple of Pb) in every calling form
    return max_rel_err(got[tuple(slice(0, n) for n in ref.shape)], ref)


def kinds_case(n: int, dtype: str, meshes: Sequence[tuple[int, int]], repeats: int, warmup: int,
               kinds: Sequence[str] = tuple(KINDS), seed: int = 0) -> list[dict[str, Any]]:
    """Every program of one (grid, dtype), timed in the same interleaved rounds."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P, SingleDeviceSharding

    from benchmarks import steps

    shape = (n, n, n)
    ctype = COMPLEX[dtype]
    x_np = np.asarray(harness.make_input(
        shape, SingleDeviceSharding(jax.devices()[0]), dtype, seed))
    x64 = x_np.astype(np.float64)
    refs = _references(x64, kinds)
    programs, where = [], {}

    def add(place: str, name: str, direction: str, fn, arg, compiled=None):
        p = steps.Program(f"{place}|{name}|{direction}", "full", fn, arg, compiled)
        where[p.name] = (place, name, direction)
        programs.append(p)

    for name in kinds:
        arg = x_np.astype(ctype) if name == "fft,fft,fft" else x_np
        for d in DIRECTIONS:
            f = _scipy_calls(name, d, n)
            add(SCIPY, name, d, f, arg, compiled=f)
    placements = [(ONE_DEVICE, SingleDeviceSharding(jax.devices()[0]))]
    for pdims in meshes:
        mesh = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Auto,) * 2,
                             devices=jax.devices()[: pdims[0] * pdims[1]])
        placements.append((harness.fmt_dims(pdims), NamedSharding(mesh, P("x", "y"))))
    failed: dict[str, str] = {}
    for place, sharding in placements:
        xr = jax.device_put(x_np, sharding)
        xc = jax.device_put(x_np.astype(ctype), sharding)
        for name in kinds:
            for d in DIRECTIONS:
                fn = jax.jit(_pencilfft_call(name, d, n))
                arg = xc if name == "fft,fft,fft" else xr
                try:
                    compiled = fn.lower(arg).compile()
                except Exception as e:  # noqa: BLE001 - a case that cannot run is a result
                    failed[f"{place}|{name}|{d}"] = (
                        f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    where[f"{place}|{name}|{d}"] = (place, name, d)
                    continue
                add(place, name, d, fn, arg, compiled)
    steps.time_programs(programs, repeats, warmup)
    ctx = _context()
    records = []
    for p in programs:
        place, name, d = where[p.name]
        out = p.compiled(p.arg)
        err = _error(out, name, d, refs, x64, transposed=place != SCIPY)
        del out
        records.append({
            "tool": "kinds", "where": place, "kinds": name, "direction": d, "shape": list(shape),
            "dtype": dtype, "status": "ok", "median_s": statistics.median(p.times),
            "mad_s": steps.mad(p.times), "times_s": p.times, "repeats": repeats, "err": err,
            "all_gather": (place != SCIPY and "all-gather" in p.compiled.as_text()),
            "memory": None if place == SCIPY else harness.memory_stats(p.compiled), **ctx})
    for key, status in failed.items():
        place, name, d = where[key]
        records.append({"tool": "kinds", "where": place, "kinds": name, "direction": d,
                        "shape": list(shape), "dtype": dtype, "status": status,
                        "repeats": repeats, **ctx})
    return records


def table(records: list[dict[str, Any]]) -> str:
    """One row per (grid, dtype, where, direction): ms of each kind, the DCT rows with their
    ratio to the complex FFT on the same devices, and pencilfft's DCT against scipy's."""
    latest: dict[tuple, dict] = {}
    for r in records:
        latest[(tuple(r["shape"]), r["dtype"], r["where"], r["direction"], r["kinds"])] = r
    places = list(dict.fromkeys(r["where"] for r in records))  # scipy, 1 device, meshes as run
    rows = sorted({k[:4] for k in latest},
                  key=lambda k: (k[0], k[1], DIRECTIONS.index(k[3]), places.index(k[2])))
    head = ["grid", "dtype", "direction", "where", "fft,fft,fft ms",
            "dct2,fft,fft ms (vs fft)", "dct2,fft,rfft ms (vs fft)",
            "dct2,fft,fft vs scipy 1 core", "max error"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---|" + "---:|" * (len(head) - 4)]
    for shape, dtype, place, d in rows:
        by = {name: latest.get((shape, dtype, place, d, name)) for name in KINDS}
        ref = by[REFERENCE_KINDS]
        ref_s = ref["median_s"] if ref and ref["status"] == "ok" else None

        def cell(name):
            r = by[name]
            if r is None:
                return "—"
            if r["status"] != "ok":
                return r["status"].split(":")[0]
            text = fmt_ms(r["median_s"])
            if name != REFERENCE_KINDS and ref_s:
                text += f" ({r['median_s'] / ref_s:.2f})"
            if r.get("all_gather"):
                text += " all-gather"
            return text

        dct = by["dct2,fft,fft"]
        sc = latest.get((shape, dtype, SCIPY, d, "dct2,fft,fft"))
        vs = (f"{dct['median_s'] / sc['median_s']:.2f}"
              if dct and sc and dct["status"] == sc["status"] == "ok" and place != SCIPY else "")
        errs = [r["err"] for r in by.values() if r and r["status"] == "ok"]
        err = f"{max(errs):.1e}" if errs else "—"
        lines.append(f"| {harness.fmt_dims(shape)} | {dtype} | {d} | {place} | "
                     f"{cell('fft,fft,fft')} | {cell('dct2,fft,fft')} | {cell('dct2,fft,rfft')} | "
                     f"{vs} | {err} |")
    cases: dict[tuple, list[dict]] = {}
    for r in latest.values():  # the records shown: a case run again replaces its old records
        cases.setdefault((tuple(r["shape"]), r["dtype"]), []).append(r)
    loads = "; ".join(f"{harness.fmt_dims(shape)} {dtype}: {harness.load_range(rs)}"
                      for (shape, dtype), rs in sorted(cases.items()))
    r0 = next(iter(latest.values()))
    lines += ["", f"Medians of {r0['repeats']} interleaved rounds, one process, "
                  f"{r0['machine']['device_count']} CPU devices on {r0['machine']['cpu_count']} "
                  f"cores; ratios to `pfft3d` (fft,fft,fft) on the same devices; the error is the "
                  f"largest of the row against scipy in float64; load average (1 min) when a case "
                  f"ended: {loads}."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The dealiased product, several processes


def _spectrum(n: int, seed: int):
    """A real field's N-mode rfftn spectrum (norm="forward": Fourier coefficients), float64, the
    Nyquist planes zeroed: a band-limited field that both libraries represent alike."""
    import numpy as np

    u = np.random.default_rng(seed).standard_normal((n, n, n))
    uh = np.fft.rfftn(u, norm="forward")
    del u
    h = n // 2
    uh[h], uh[:, h], uh[:, :, h] = 0, 0, 0
    return uh


def _padded_product_reference(ah, bh, n: int):
    """numpy float64 3/2-rule product: zero-pad both spectra to M = 3N/2, multiply the fields,
    truncate to N modes (inputs without Nyquist: no convention involved except the output's)."""
    import numpy as np

    m = 3 * n // 2
    h = n // 2

    def pad(k):
        p = np.zeros((m, m, m // 2 + 1), complex)
        for i in (slice(0, h), slice(-h, None)):
            for j in (slice(0, h), slice(-h, None)):
                p[i, j, : h + 1] = k[i, j, : h + 1]
        return p

    def field(k):
        return np.fft.irfftn(pad(k), s=(m,) * 3, axes=(0, 1, 2), norm="forward")

    w = field(ah) * field(bh)
    wh = np.fft.rfftn(w, norm="forward")
    del w
    out = np.zeros((n, n, h + 1), complex)
    for i, ii in ((slice(0, h), slice(0, h)), (slice(h, n), slice(m - h, m))):
        for j, jj in ((slice(0, h), slice(0, h)), (slice(h, n), slice(m - h, m))):
            out[i, j] = wh[ii, jj, : h + 1]
    return out


def _no_nyquist(k, n: int):
    """The spectrum (X, Y, N/2+1) without its Nyquist planes (index N/2 of each axis)."""
    import numpy as np

    keep = np.ones(n, bool)
    keep[n // 2] = False
    return k[keep][:, keep][:, :, : n // 2]


def _array_bytes(*objects) -> int:
    """Bytes of the distinct numpy buffers reachable from mpi4py-fft objects (one level of
    attributes and lists): what its plan and the caller's arrays hold."""
    import numpy as np

    seen: dict[int, int] = {}

    def visit(o, depth):
        if isinstance(o, np.ndarray):
            base = o
            while isinstance(base.base, np.ndarray):
                base = base.base
            seen[base.__array_interface__["data"][0]] = base.nbytes
            return
        if depth == 0:
            return
        if isinstance(o, (list, tuple)):
            for v in o:
                visit(v, depth - 1)
            return
        for v in getattr(o, "__dict__", {}).values():
            visit(v, depth - 1)

    for o in objects:
        visit(o, 4)
    return sum(seen.values())


def _gather_global(comm, block, index, shape, dtype):
    """The global array on rank 0 from every rank's (index, block); None elsewhere."""
    import numpy as np

    parts = comm.gather((index, np.asarray(block)), root=0)
    if comm.rank != 0:
        return None
    out = np.zeros(shape, dtype)
    for idx, b in parts:
        out[idx] = b
    return out


def _pencilfft_product(n: int, dtype: str, padding: float, ah, bh, comm):
    """The jitted product on a slab Px1 mesh, its compiled form, its inputs, and its result's
    (index, block) in natural (X, Y, N/2+1) order."""
    import jax
    import numpy as np
    from jax.sharding import AxisType

    import pencilfft

    mesh = jax.make_mesh((comm.size, 1), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    ks = pencilfft.k_space_sharding(mesh)  # transposed: (Y, Z//2+1, X), Y split over "x"
    kshape = (n, n // 2 + 1, n)
    ctype = COMPLEX[dtype]

    def put(k):
        return jax.make_array_from_callback(
            kshape, ks, lambda idx: np.ascontiguousarray(
                k.transpose(1, 2, 0)[idx]).astype(ctype))

    a, b = put(ah), put(bh)
    s = (n, n, n)

    def product(a, b):
        u = pencilfft.pirfft3d(a, s, norm="forward", padding=padding)
        v = pencilfft.pirfft3d(b, s, norm="forward", padding=padding)
        return pencilfft.prfft3d(u * v, norm="forward", padding=padding)

    f = jax.jit(product)
    compiled = f.lower(a, b).compile()
    out = compiled(a, b)
    shard = out.addressable_shards[0]
    iy, iz, ix = shard.index
    return compiled, (a, b), ((ix, iy, iz), np.asarray(shard.data).transpose(2, 0, 1)), out


def _mpi4py_fft_product(n: int, dtype: str, padding: float, ah, bh, comm):
    """mpi4py-fft's product: its call, the bytes it holds, and its result's (index, block)."""
    import numpy as np
    from mpi4py_fft import PFFT, newDistArray

    pad = [padding] * 3 if padding != 1 else False
    fft = PFFT(comm, (n, n, n), axes=(0, 1, 2), grid=(comm.size,), dtype=np.dtype(dtype),
               padding=pad, backend="fftw")
    a = newDistArray(fft, forward_output=True)
    b = newDistArray(fft, forward_output=True)
    a[:] = ah[a.local_slice()]
    b[:] = bh[b.local_slice()]
    u = newDistArray(fft, forward_output=False)
    v = newDistArray(fft, forward_output=False)
    w = newDistArray(fft, forward_output=False)
    out = newDistArray(fft, forward_output=True)

    def call():
        fft.backward(a, u)
        fft.backward(b, v)
        np.multiply(u, v, out=w)
        return fft.forward(w, out)

    call()
    held = _array_bytes(fft, a, b, u, v, w, out)
    return call, held, (out.local_slice(), np.array(out)), fft


def _rel(got, ref) -> float:
    import numpy as np

    return float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))


def product_case(n: int, dtype: str, repeats: int, warmup: int, rounds: int, reference_max: int,
                 seed: int = 0) -> list[dict[str, Any]]:
    import resource

    from mpi4py import MPI

    from benchmarks.mpi import _timer

    comm = MPI.COMM_WORLD
    ah, bh = _spectrum(n, seed), _spectrum(n, seed + 1)
    shape_k = (n, n, n // 2 + 1)
    ctype = COMPLEX[dtype]
    calls: dict[str, Callable[[], Any]] = {}
    info: dict[str, dict[str, Any]] = {}
    results: dict[str, Any] = {}
    keep = []
    for padding in (1.5, 1):
        suffix = " 3/2" if padding != 1 else ""
        try:
            compiled, args, (idx, block), out = _pencilfft_product(n, dtype, padding, ah, bh, comm)
            keep.append(args)
            calls["pencilfft" + suffix] = lambda c=compiled, args=args: c(*args)
            mem = harness.memory_stats(compiled)
            info["pencilfft" + suffix] = {"memory": mem, "bytes": mem.get("total"),
                                          "all_gather": "all-gather" in compiled.as_text()}
            results["pencilfft" + suffix] = _gather_global(comm, block, idx, shape_k, ctype)
            del out
        except Exception as e:  # noqa: BLE001 - a case that cannot run is a result
            info["pencilfft" + suffix] = {
                "status": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        try:
            import mpi4py_fft  # noqa: F401
        except ImportError:
            continue
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        call, held, (idx, block), plan = _mpi4py_fft_product(n, dtype, padding, ah, bh, comm)
        keep.append(plan)
        calls["mpi4py-fft" + suffix] = call
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        info["mpi4py-fft" + suffix] = {"bytes": held, "maxrss_delta_bytes": (rss - rss0) * 1024}
        results["mpi4py-fft" + suffix] = _gather_global(comm, block, idx, shape_k, ctype)
    timed = _timer(comm, repeats, warmup)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name].append(timed(call))
    # Errors (rank 0): each library against the other and against numpy's 3/2-rule product.
    errs: dict[str, dict[str, float]] = {name: {} for name in info}
    if comm.rank == 0:
        ref = _padded_product_reference(ah, bh, n) if n <= reference_max else None
        for suffix in (" 3/2", ""):
            p, m = results.get("pencilfft" + suffix), results.get("mpi4py-fft" + suffix)
            if p is not None and m is not None:
                errs["pencilfft" + suffix]["vs_mpi4py_fft"] = _rel(p, m)
                errs["pencilfft" + suffix]["vs_mpi4py_fft_no_nyquist"] = _rel(
                    _no_nyquist(p, n), _no_nyquist(m, n))
                errs["pencilfft" + suffix]["vs_mpi4py_fft_no_z_nyquist"] = _rel(
                    p[:, :, : n // 2], m[:, :, : n // 2])
            if ref is not None and suffix:
                for name in ("pencilfft" + suffix, "mpi4py-fft" + suffix):
                    if results.get(name) is not None:
                        errs[name]["vs_numpy_no_nyquist"] = _rel(
                            _no_nyquist(results[name], n), _no_nyquist(ref, n))
    max_bytes = {name: comm.allreduce(i.get("bytes") or 0, op=MPI.MAX) for name, i in info.items()}
    ctx = _context() if comm.rank == 0 else {}
    records = []
    for name in PRODUCT_ROWS:
        if name not in info:
            continue
        i = info[name]
        r = {"tool": "kinds-product", "row": name, "shape": [n] * 3, "dtype": dtype,
             "padding": 1.5 if name.endswith("3/2") else 1, "pdims": [comm.size, 1],
             "processes": comm.size, "norm": "forward", "status": i.get("status", "ok"),
             "repeats": repeats, "rounds": rounds, "bytes_per_process": max_bytes[name] or None,
             **{k: v for k, v in i.items() if k not in ("status", "bytes")}, **errs.get(name, {})}
        if name in times:
            r["median_s"] = statistics.median(times[name])
            r["times_s"] = times[name]
        if comm.rank == 0:
            r.update(ctx)
            r["versions"] = {**r["versions"], "mpi4py_fft": _mpi4py_fft_version()}
        records.append(r)
    del keep
    return records


def _mpi4py_fft_version():
    try:
        import mpi4py_fft
    except ImportError:
        return None
    return mpi4py_fft.__version__


def dealias_table(records: list[dict[str, Any]]) -> str:
    """One row per (grid, dtype, product): median ms (mpi4py-fft's with its ratio to pencilfft's
    at the same padding), the bytes per process, the errors (pencilfft against mpi4py-fft, both
    against numpy)."""
    latest = {(tuple(r["shape"]), r["dtype"], r["row"]): r for r in records}
    cases = sorted({k[:2] for k in latest})
    head = ["grid", "dtype", "product", "ms (vs pencilfft)", "MiB per process",
            "pencilfft vs mpi4py-fft: all modes / no Z Nyquist plane / no Nyquist plane",
            "vs numpy 3/2 (no Nyquist plane)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    for shape, dtype in cases:
        for row in PRODUCT_ROWS:
            r = latest.get((shape, dtype, row))
            if r is None:
                continue
            lead = f"| {harness.fmt_dims(shape)} | {dtype} | {row} | "
            if r["status"] != "ok":
                lines.append(lead + f"{r['status'].split(':')[0]} | | | |")
                continue
            ms = fmt_ms(r["median_s"])
            base = latest.get((shape, dtype, row.replace("mpi4py-fft", "pencilfft")))
            if row.startswith("mpi4py-fft") and base and base.get("median_s"):
                ms += f" ({r['median_s'] / base['median_s']:.2f})"
            mib = f"{r['bytes_per_process'] / 2**20:.3g}" if r.get("bytes_per_process") else "—"
            keys = ("vs_mpi4py_fft", "vs_mpi4py_fft_no_z_nyquist", "vs_mpi4py_fft_no_nyquist")
            errs = [r.get(k) for k in keys]
            vs = " / ".join(f"{e:.1e}" for e in errs) if None not in errs else ""
            ref = r.get("vs_numpy_no_nyquist")
            lines.append(lead + f"{ms} | {mib} | {vs} | {'—' if ref is None else f'{ref:.1e}'} |")
    loads = harness.load_range(list(latest.values()))
    r0 = records[0]
    lines += ["", f"{r0['processes']} processes (mpirun), one CPU device each, slab "
                  f"{harness.fmt_dims(r0['pdims'])}, norm=\"forward\" (mpi4py-fft's convention); "
                  f"medians of {r0['rounds']} rounds of the median of {r0['repeats']} calls (the "
                  f"slowest process); pencilfft's MiB: XLA's memory analysis of the jitted product, "
                  f"mpi4py-fft's: the arrays its plan and the caller hold; load average when a case "
                  f"ended: {loads}."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Command line


def _write(records: list[dict[str, Any]], out: str | None) -> None:
    for r in records:
        line = json.dumps(r)
        if out:
            with open(out, "a") as f:
                f.write(line + "\n")


def _summary(r: dict[str, Any]) -> str:
    keys = ("where", "row", "kinds", "direction", "shape", "dtype", "status", "median_s", "err",
            "vs_mpi4py_fft", "vs_numpy_no_nyquist", "bytes_per_process")
    return json.dumps({k: r[k] for k in keys if k in r})


def product_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kinds product",
                                description="the dealiased product under mpirun")
    p.add_argument("--shapes", type=int, nargs="+", default=[128], help="N: grids of N^3")
    p.add_argument("--dtypes", nargs="+", choices=tuple(COMPLEX), default=["float32"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds (median of them)")
    p.add_argument("--reference-max", type=int, default=128,
                   help="largest N checked against numpy's float64 product on rank 0 (default 128)")
    p.add_argument("--out", help="append JSON lines here (rank 0)")
    args = p.parse_args(argv)
    import pencilfft

    pencilfft.initialize()
    import jax
    from mpi4py import MPI

    if "float64" in args.dtypes:
        jax.config.update("jax_enable_x64", True)
    comm = MPI.COMM_WORLD
    if jax.local_device_count() != 1:
        raise SystemExit(f"benchmarks.kinds product wants one device per process; this one has "
                         f"{jax.local_device_count()} (unset XLA_FLAGS' device count)")
    for dtype in args.dtypes:
        for n in args.shapes:
            if n % 2 or (3 * n // 2) % comm.size or n % comm.size:
                raise SystemExit(f"N={n}: N and 3N/2 must be even and divisible by {comm.size}")
            records = product_case(n, dtype, args.repeats, args.warmup, args.rounds,
                                   args.reference_max)
            if comm.rank == 0:
                for r in records:
                    print(_summary(r), flush=True)
                _write(records, args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["product"]:
        return product_main(argv[1:])
    if argv[:1] == ["table"]:
        p = argparse.ArgumentParser(prog="python -m benchmarks.kinds table")
        p.add_argument("file")
        p.add_argument("--dealias", action="store_true", help="the product's records")
        a = p.parse_args(argv[1:])
        records = harness.load_records([a.file])
        print(dealias_table(records) if a.dealias else table(records))
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.kinds", description=__doc__.split("\n")[0])
    p.add_argument("--devices", type=int, default=8, help="simulated CPU devices (default 8)")
    p.add_argument("--shape", type=int, default=256, help="N: a grid of N^3 (default 256)")
    p.add_argument("--dtypes", nargs="+", choices=tuple(COMPLEX), default=["float32"])
    p.add_argument("--meshes", nargs="+", type=harness.parse_pxq, default=[(4, 2), (8, 1), (1, 8)])
    p.add_argument("--kinds", nargs="+", choices=tuple(KINDS), default=list(KINDS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", help="append JSON records to this file")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if REFERENCE_KINDS not in args.kinds:
        args.kinds.insert(0, REFERENCE_KINDS)
    harness.configure_devices(args.devices)
    import jax

    if "float64" in args.dtypes:
        jax.config.update("jax_enable_x64", True)
    records = []
    for dtype in args.dtypes:
        case = kinds_case(args.shape, dtype, args.meshes, args.repeats, args.warmup, args.kinds)
        records += case
        for r in case:
            print(_summary(r), flush=True)
        _write(case, args.out)
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
