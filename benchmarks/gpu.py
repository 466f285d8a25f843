"""One GPU: pencilfft beside jnp.fft and jaxdecomp, timed after tests/test_gpu.py checked it.

    python -m benchmarks.gpu --shapes 512 1024 2048 --out gpu.jsonl     (on a GPU machine)
    python -m benchmarks.gpu table benchmarks/data/gpu-h100.jsonl

Checked first by tests/test_gpu.py (JAX_PLATFORMS=cuda python -m pytest tests/test_gpu.py: the
transforms, a gradient, paint and readout against numpy in float64; the device script runs it).
Per N^3, complex64 (up to `--c2c-max`) and float32:
forward, inverse and both in one jit of each implementation in the harness's loop, XLA's memory
of each program and the device's peak.  A grid that does not fit is recorded as an error.
Without a GPU it measures nothing unless `--cpu`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from benchmarks import harness, private

IMPLS = ("jnp.fft", "pencilfft", "jaxdecomp")
PROGRAMS = ("forward", "inverse", "both")


def _sharding() -> NamedSharding:
    """A 1x1 Auto mesh's: how jaxdecomp's users (and pencilfft's jit path) hold an array."""
    return NamedSharding(harness.make_mesh((1, 1), "auto"), P("x", "y"))


def implementations(real: bool, names: Sequence[str]) -> dict[str, tuple[Any, Any]]:
    """name -> (forward, inverse); jaxdecomp has no real transform."""
    impls = {"jnp.fft": (jnp.fft.rfftn, jnp.fft.irfftn) if real else (jnp.fft.fftn, jnp.fft.ifftn),
             "pencilfft": (pencilfft.prfft3d, lambda k: pencilfft.pirfft3d(k, s=(k.shape[2],) * 3))
             if real else (pencilfft.pfft3d, pencilfft.pifft3d)}
    try:
        from jaxdecomp import fft as jd

        if not real:
            impls["jaxdecomp"] = (lambda x: jd.pfft3d(x, backend="jax"),
                                  lambda k: jd.pifft3d(k, backend="jax"))
    except ImportError:
        pass
    return {k: v for k, v in impls.items() if k in names}


class _Timed:
    """An implementation in the harness's loop: forward, inverse of its output, both in one jit."""

    ok = True

    def __init__(self, name: str, compiled: dict[str, Any], x: Any):
        self.name, self.compiled, self.x = name, compiled, x
        self.times: dict[str, list[float]] = {p: [] for p in PROGRAMS}

    def run(self, record: bool) -> None:
        t_fwd, k = private.time_once(self.compiled["forward"], self.x)
        t_inv, back = private.time_once(self.compiled["inverse"], k)
        del k, back
        t_both, back = private.time_once(self.compiled["both"], self.x)
        del back
        if record:
            for p, t in zip(PROGRAMS, (t_fwd, t_inv, t_both)):
                self.times[p].append(t)


def time_case(n: int, real: bool, args: argparse.Namespace, info: dict,
              ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Every implementation's forward, inverse and both-in-one-jit of one N^3, interleaved."""
    dtype = np.dtype(np.float32 if real else np.complex64)
    sharding = _sharding()
    spec = jax.ShapeDtypeStruct((n,) * 3, dtype, sharding=sharding)
    compiled = {}
    for name, (fwd, inv) in implementations(real, args.impls).items():
        k = jax.eval_shape(fwd, spec)
        compiled[name] = {
            "forward": jax.jit(fwd).lower(spec).compile(),
            "inverse": jax.jit(inv).lower(jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=k.sharding)).compile(),
            "both": jax.jit(lambda x, f=fwd, i=inv: i(f(x))).lower(spec).compile()}
    base = {"n": n, "dtype": dtype.name, "block_bytes": n**3 * dtype.itemsize, "info": info,
            "checks": None, **harness.stamp(ctx)}
    try:
        key = jax.random.key(n)
        x = jax.random.normal(key, (n,) * 3, np.float32)
        if not real:
            x = jax.lax.complex(x, jax.random.normal(jax.random.fold_in(key, 1), (n,) * 3, np.float32))
        x = jax.device_put(x, sharding)
        timed = [_Timed(name, c, x) for name, c in compiled.items()]
        harness.time_programs(timed, args.repeats, args.warmup)
    except Exception as e:  # noqa: BLE001 - a grid that does not fit (2048^3) is a result too
        return [{**base, "impl": name, "status": "error", "note": harness.failure(e)} for name in compiled]
    records = []
    for t in timed:
        ms = {p: statistics.median(v) * 1e3 for p, v in t.times.items()}
        records.append({
            **base, "impl": t.name, "status": "ok", "forward_ms": round(ms["forward"], 3),
            "inverse_ms": round(ms["inverse"], 3), "fwd_inv_one_jit_ms": round(ms["both"], 3),
            "fwd_inv_min_ms": round(min(t.times["both"]) * 1e3, 3),
            "roundtrip_rel_err": (private.max_rel_err(t.compiled["both"](x), x)
                                  if n <= args.check_max else float("nan")),
            **{f"memory_{p}": _memory(t.compiled[p]) for p in ("forward", "inverse")},
            "memory_fwd_inv": _memory(t.compiled["both"]),
            "peak_bytes": (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")})
    return records


def _memory(compiled) -> dict[str, int]:
    m = harness.memory_stats(compiled)
    return {} if m["total"] is None else {
        "temp_bytes": m["temp"], "output_bytes": m["output"], "argument_bytes": m["argument"]}


def gpu_table(records: list[dict]) -> str:
    """Each implementation's times and temporaries (the device's peak too, where recorded)."""
    peak = any(r.get("peak_bytes") for r in records)
    rows = []
    for r in records:
        lead = [r["n"], r["dtype"], r["impl"]]
        if r.get("status", "ok") != "ok":
            rows.append(lead + [f"{r['status']}: {r['note']}"] + ["—"] * (4 if peak else 3))
            continue
        temp = r["memory_fwd_inv"].get("temp_bytes", float("nan")) / r["block_bytes"]
        rows.append(lead + [f"{r['forward_ms']:.2f}", f"{r['inverse_ms']:.2f}",
                            f"{r['fwd_inv_one_jit_ms']:.2f}", f"{temp:.2f}"]
                    + ([f"{(r.get('peak_bytes') or float('nan')) / 2**30:.1f}"] if peak else []))
    info, checks = records[0]["info"], records[0]["checks"]
    head = ["N^3", "dtype", "implementation", "forward ms", "inverse ms", "fwd+inv in one jit, ms",
            "XLA temp per device (fwd+inv), blocks"] + (["device peak so far, GiB"] if peak else [])
    return harness.md_table(head, rows, "rllrrrrr", (
        f"{info.get('device_kind', '?')}, jax {info.get('jax', '?')}, jaxdecomp "
        f"{info.get('jaxdecomp') or 'not installed'}; " + (
            f"{checks} correctness checks passed before timing." if checks is not None else
            "checked before timing by tests/test_gpu.py (against numpy in float64).")))


OPTIONS = dict(shapes=["512", "1024", "2048"], repeats=20, warmup=3, out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--c2c-max", type=int, default=1024,
                   help="complex64 up to this N (larger N: the real transform only)")
    p.add_argument("--check-max", type=int, default=1024, help="round-trip errors up to this N")
    p.add_argument("--cpu", action="store_true", help="run on a CPU (to try the script)")


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    if jax.default_backend() == "cpu" and not args.cpu:
        print("no GPU: nothing measured (--cpu runs it on the CPU)")
        return
    info = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
            "device_kind": jax.devices()[0].device_kind, "pencilfft": ctx["versions"]["pencilfft"],
            "jaxdecomp": ctx["versions"]["jaxdecomp"]}
    for (n, *_) in args.shapes:
        for real in (False, True):
            if real or n <= args.c2c_max:
                yield time_case(n, real, args, info, ctx)


TABLES = {"gpu": gpu_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
