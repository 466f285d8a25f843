"""Any array, any layout (issue 54): `pencilfft.fftn`'s routes beside pfft3d, jnp.fft, one device.

    python -m benchmarks.nd --devices 8 --out benchmarks/data/nd.jsonl
    python -m benchmarks.nd --devices 8 --quick            # 128^3 and 1024^2, under a minute
    python -m benchmarks.nd --dry-run                      # the programs, nothing run

8 simulated CPU devices in one process; every program of a case compiled ahead of time and
timed in the harness's interleaved rounds (the first program rotating), the median of
`--repeats` kept.  Two cases, complex64:

* 3-D, N^3 (`--shapes`): the round trip `fftn` then `ifftn` of a brick split P(a, b, c) over
  a (2, 2, 2) mesh back to P(a, b, c) both ways; the same through a natural-order pencil
  P(None, a, (b, c)); `pfft3d` + `pifft3d` on a 4x2 pencil (the reference); and `fftn` +
  `ifftn` on that pencil (the N-D planner on pfft3d's layout).
* 2-D, M^2 (`--grid2d`): the forward `fftn` of a slab P(a, None) over 8 devices (default
  output, and back to P(a, None)) and of a 4x2 block P(a, b); `jax.jit(jnp.fft.fftn)` on the
  slab (XLA's sharded FFT: it gathers); `jnp.fft.fftn` and `pencilfft.fftn` on one device (the
  array on `jax.devices()[0]`, a single CPU device of the same 8-device process: XLA's own CPU
  FFT on the threads XLA gives it, and one FFTW call on pencilfft's threads per device).

Each pencilfft program is also timed in two parts, made of its very stages (the route's, or
pfft3d's plan's) in shard_map: its exchanges alone (the FFTs left out), and its FFTs alone
(each exchange replaced by a reshape of the block to the shape it would leave: every FFT runs
on the same block shape and strides, and nothing moves).
Every record holds the program's collectives read from the compiled HLO (`all-to-all`,
`collective-permute`, `all-gather`, `all-reduce`, and pencilfft's local-exchange custom
calls: one per exchange between CPU devices of a process), the route's steps, the memory per
device (`memory_analysis()`), the CPU and the load.  Checks after the timings: each round trip
against its input, each 2-D forward against numpy's (complex128), each result's sharding.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

import pencilfft
from benchmarks import harness, private
from benchmarks.harness import fmt_dims, fmt_ms

SCHEMA = 1
DTYPE = "complex64"
CHECK_TOL = 1e-4  # max|err| / max|ref| in single precision (fft.py's)
# Collectives counted in each compiled program: HLO opcodes, then pencilfft's custom calls.
COLLECTIVES = ("all-to-all", "collective-permute", "all-gather", "all-reduce")
EXCHANGE_CALLS = ("pencilfft_local_exchange", "pencilfft_mpi_exchange")
RESHARD_CALL = "pencilfft_local_reshard"  # several exchanges in one pass (`_exchange.reshard`)
# The references of each case's ratios (program names).
PENCIL = "pencil 4x2: pfft3d + pifft3d"
ONE_DEVICE = "jnp.fft.fftn, one device"
SHARDED = "jnp.fft.fftn, sharded (jit)"
REFERENCES = {"3-D": (PENCIL,), "2-D": (ONE_DEVICE, SHARDED)}
# The parts of each pencilfft program also timed alone (`_run`).
PARTS_KEPT = ("exchanges", "ffts")
ONE_DEVICE_NOTE = (" One device: the whole array on jax.devices()[0], a single CPU device of the "
                   "same 8-device process (jnp: XLA's own CPU FFT; pencilfft: one FFTW call on "
                   "pencilfft's {} thread(s) per device).")
QUICK = dict(shapes=[(128,) * 3], grid2d=1024, repeats=5, warmup=1)


# ----------------------------------------------------------------------------------------------
# A program: one timed callable with what its compiled form says


class NdProgram(harness.Program):
    """A `harness.Program` with the case it belongs to, its layouts and its route."""

    def __init__(self, case: str, name: str, kind: str, fn: Callable, arg: Any, *, mesh: str,
                 layouts: str, route: str = "", route_exchanges: int | None = None,
                 direction: str = "round trip", parts_of: str | None = None,
                 check: Callable[[Any], float] | None = None):
        super().__init__(name, kind, fn, arg)
        self.case, self.mesh, self.layouts, self.route = case, mesh, layouts, route
        self.route_exchanges, self.direction, self.parts_of = route_exchanges, direction, parts_of
        self.check_fn = check
        self.status, self.note = "ok", ""
        self.compile_s: float | None = None
        self.mem: dict[str, int | None] = {}
        self.collectives: dict[str, int] = {}
        self.err: float | None = None

    @property
    def ok(self) -> bool:  # (the harness's loop skips programs that failed)
        return self.status == "ok"

    def fail(self, e: BaseException) -> None:
        self.status, self.note = "error", harness.failure(e)
        self.compiled = None

    def compile(self) -> None:
        try:
            t0 = time.perf_counter()
            self.compiled = jax.jit(self.fn).lower(self.arg).compile()
            self.compile_s = time.perf_counter() - t0
            self.mem = harness.memory_stats(self.compiled)
            self.collectives = count_collectives(self.compiled.as_text())
        except Exception as e:  # noqa: BLE001 - a broken program must not stop the others
            self.fail(e)

    def run(self, record: bool) -> None:
        try:
            super().run(record)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def check(self) -> None:
        if self.status != "ok" or self.check_fn is None:
            return
        try:
            self.err = self.check_fn(self.compiled(self.arg))
        except Exception as e:  # noqa: BLE001
            self.status, self.note = "wrong", harness.failure(e)
            return
        if self.err > CHECK_TOL:
            self.status, self.note = "wrong", f"max rel err {self.err:.2e} > {CHECK_TOL:.0e}"


def count_collectives(hlo: str) -> dict[str, int]:
    """How many of each collective (and of pencilfft's exchange custom calls) a compiled
    program's HLO text holds: one per instruction, async pairs counted once (their -start)."""
    out = {}
    for op in COLLECTIVES:
        n = len(re.findall(rf"\s{op}(?:-start)?\(", hlo))
        if n:
            out[op] = n
    for target in (*EXCHANGE_CALLS, RESHARD_CALL):
        n = hlo.count(f'custom_call_target="{target}"')
        if n:
            out[target] = n
    return out


def n_exchanges(collectives: dict[str, int]) -> int:
    """All-to-alls of any kind: XLA's and pencilfft's custom-call exchanges."""
    return collectives.get("all-to-all", 0) + sum(collectives.get(t, 0) for t in EXCHANGE_CALLS)


# ----------------------------------------------------------------------------------------------
# The N-D planner's routes, as `pencilfft.fftn` plans them (numpy_fft._planned)


def spec_tuple(spec: P, ndim: int) -> tuple[tuple[str, ...], ...]:
    entries = tuple(spec) + (None,) * (ndim - len(tuple(spec)))
    return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in entries)


def planned(shape: Sequence[int], mesh, in_spec: P, target: P | None, inverse: bool):
    """(route, stages) of `pencilfft.fftn` (`ifftn`) of a complex64 array of global `shape`
    split `in_spec` over `mesh` to `target` (None: its default)."""
    caller = "ifftn" if inverse else "fftn"
    call = private.nd_call(jax.ShapeDtypeStruct(tuple(shape), np.dtype(DTYPE)), None, None, None,
                           "c2c", inverse, caller, private.nd_all_axes, "auto")
    sizes = tuple((m, n) for m, n in mesh.shape.items())
    ndim = len(shape)
    tgt = None if target is None else spec_tuple(target, ndim)
    route, stages, _ = private.nd_planned(call, sizes, spec_tuple(in_spec, ndim), tgt,
                                          private.platform_of(mesh), True)
    return route, stages


def _is_fft(stage) -> bool:
    return isinstance(_fft_of(stage), private.Fft)


def _moves_data(stage) -> bool:
    """An exchange (or a swap): what "FFTs alone" replaces with a reshape of the block."""
    return isinstance(stage, (private.Exchange, private.nd_Swap, private.nd_Reshard))


def _run(stages, k, keep: str, backward: bool = False):
    """`stages` on a block (backward: reversed, each walked back): all of them (`keep`="all"),
    all but the FFTs ("exchanges"), or all but the data movement ("ffts": each exchange replaced
    by a reshape of the block to the shape it would leave, so that every FFT runs on the same
    block shape and strides, moving nothing)."""
    for s in reversed(stages) if backward else stages:
        step = s.backward if backward else s.forward
        if keep == "exchanges" and _is_fft(s):
            continue
        if keep == "ffts" and _moves_data(s):
            k = k.reshape(jax.eval_shape(step, k).shape)
            continue
        k = step(k)
    return k


def _fft_of(stage):
    return stage.stage if isinstance(stage, private.nd_Inverse) else stage


def route_parts(mesh, legs: Sequence[tuple[P, P, Sequence]], keep: str) -> Callable:
    """The stages of `legs` ((in spec, out spec, stages) of each transform, one after the other)
    in shard_map with only the `keep` part (`_run`)."""
    fns = []
    for in_spec, out_spec, stages in legs:
        body = functools.partial(_run, stages, keep=keep)
        fns.append(jax.shard_map(private.with_mesh(body, mesh), mesh=mesh, in_specs=in_spec,
                                 out_specs=out_spec))
    return lambda x: functools.reduce(lambda k, f: f(k), fns, x)


def pencil_parts(mesh, x, keep: str) -> Callable:
    """pfft3d's stages (its plan, `stages_of`) forward then backward with only the `keep` part."""
    plan = private.plan_forward(x, norm="backward", layout="transposed", mesh=mesh, real=False)
    stages = private.stages_of(plan)

    def block(b):
        k = _run(stages, b[None], keep)  # (the stages' batch axis)
        return _run(stages, k, keep, backward=True)[0]

    spec = P(*plan.axes, None)
    return jax.shard_map(private.with_mesh(block, mesh), mesh=mesh, in_specs=spec, out_specs=spec)


# ----------------------------------------------------------------------------------------------
# The cases


def _checker(ref: Callable[[], np.ndarray], spec: P | None) -> Callable[[Any], float]:
    """The max relative error of a result against `ref()` (numpy), once its split is
    `spec` (None: any)."""
    def check(y) -> float:
        if spec is not None and spec_tuple(y.sharding.spec, y.ndim) != spec_tuple(spec, y.ndim):
            raise AssertionError(f"result split {y.sharding.spec}, expected {spec}")
        return float(private.max_rel_err(harness.to_numpy(y), ref()))
    return check


def spec_str(spec: P) -> str:
    return str(spec).replace("PartitionSpec", "P")


def programs_3d(n: int, args: argparse.Namespace) -> list[NdProgram]:
    shape = (n, n, n)
    brick_mesh = harness.make_mesh((2, 2, 2), names=("a", "b", "c"))
    pencil_mesh = harness.make_mesh((4, 2), names=("x", "y"))
    brick = P("a", "b", "c")
    natural = P(None, "a", ("b", "c"))
    pencil = P("x", "y", None)
    xb = harness.make_input(shape, NamedSharding(brick_mesh, brick), DTYPE, args.seed)
    host = harness.to_numpy(xb)  # (every program gets the same numbers)
    xp = jax.device_put(host, NamedSharding(pencil_mesh, pencil))
    out = []

    def nd(name, mesh, x, in_spec, mid, mesh_text):
        """fftn from `in_spec` to `mid` (None: default), ifftn back to `in_spec`."""
        fwd_route, fwd_stages = planned(shape, mesh, in_spec, mid, False)
        mid_spec = private.partition_spec(fwd_route.spec)
        inv_route, inv_stages = planned(shape, mesh, mid_spec, in_spec, True)
        fn = (lambda v: pencilfft.ifftn(pencilfft.fftn(v, out_sharding=mid), out_sharding=in_spec))
        layouts = f"{spec_str(in_spec)} -> {spec_str(mid_spec)} -> {spec_str(in_spec)}"
        text = f"{private.route_text(fwd_route)} | {private.route_text(inv_route)}"
        count = fwd_route.exchanges + inv_route.exchanges
        out.append(NdProgram("3-D", name, "whole", fn, x, mesh=mesh_text, layouts=layouts,
                             route=text, route_exchanges=count,
                             check=_checker(lambda: host, in_spec) if args.check else None))
        legs = [(in_spec, mid_spec, fwd_stages), (mid_spec, in_spec, inv_stages)]
        for keep in PARTS_KEPT:
            out.append(NdProgram("3-D", f"{name}: {keep} alone", keep,
                                 route_parts(mesh, legs, keep), x, mesh=mesh_text,
                                 layouts=layouts, route=text, route_exchanges=count,
                                 parts_of=name))

    out.append(NdProgram("3-D", PENCIL, "whole",
                         lambda v: pencilfft.pifft3d(pencilfft.pfft3d(v)), xp, mesh="4x2 (x, y)",
                         layouts="P('x', 'y', None) -> transposed k (Y, Z, X) -> P('x', 'y', None)",
                         route="FFT Z; y; FFT Y; x; FFT X | back", route_exchanges=4,
                         check=_checker(lambda: host, pencil) if args.check else None))
    for keep in PARTS_KEPT:
        out.append(NdProgram("3-D", f"{PENCIL}: {keep} alone", keep,
                             pencil_parts(pencil_mesh, xp, keep), xp, mesh="4x2 (x, y)",
                             layouts="", route_exchanges=4, parts_of=PENCIL))
    nd("brick -> brick: fftn + ifftn", brick_mesh, xb, brick, brick, "2x2x2 (a, b, c)")
    nd("brick -> natural pencil: fftn + ifftn", brick_mesh, xb, brick, natural, "2x2x2 (a, b, c)")
    nd("pencil 4x2: fftn + ifftn", pencil_mesh, xp, pencil, None, "4x2 (x, y)")
    return out


def programs_2d(m: int, args: argparse.Namespace) -> list[NdProgram]:
    shape = (m, m)
    slab_mesh = harness.make_mesh((8,), names=("a",))
    block_mesh = harness.make_mesh((4, 2), names=("a", "b"))
    auto_mesh = harness.make_mesh((8,), "auto", names=("a",))
    slab, block = P("a", None), P("a", "b")
    xs = harness.make_input(shape, NamedSharding(slab_mesh, slab), DTYPE, args.seed)
    host = harness.to_numpy(xs)  # (every program gets the same numbers)
    xb = jax.device_put(host, NamedSharding(block_mesh, block))
    xa = jax.device_put(host, NamedSharding(auto_mesh, slab))
    x1 = jax.device_put(host, SingleDeviceSharding(jax.devices()[0]))
    ref = functools.cache(lambda: np.fft.fftn(host.astype(np.complex128)))
    chk = (lambda spec: _checker(ref, spec)) if args.check else (lambda spec: None)
    out = []

    def nd(name, mesh, x, in_spec, target, mesh_text):
        route, stages = planned(shape, mesh, in_spec, target, False)
        out_spec = private.partition_spec(route.spec)
        fn = lambda v: pencilfft.fftn(v, out_sharding=target)  # noqa: E731
        layouts = f"{spec_str(in_spec)} -> {spec_str(out_spec)}"
        out.append(NdProgram("2-D", name, "whole", fn, x, mesh=mesh_text, layouts=layouts,
                             route=private.route_text(route), route_exchanges=route.exchanges,
                             direction="forward", check=chk(out_spec)))
        for keep in PARTS_KEPT:
            out.append(NdProgram("2-D", f"{name}: {keep} alone", keep,
                                 route_parts(mesh, [(in_spec, out_spec, stages)], keep), x,
                                 mesh=mesh_text, layouts=layouts, route=private.route_text(route),
                                 route_exchanges=route.exchanges, direction="forward",
                                 parts_of=name))

    nd("slab: fftn", slab_mesh, xs, slab, None, "8 (a)")
    nd("slab: fftn back to P('a', None)", slab_mesh, xs, slab, slab, "8 (a)")
    nd("4x2 block: fftn", block_mesh, xb, block, None, "4x2 (a, b)")
    out.append(NdProgram("2-D", SHARDED, "whole", jnp.fft.fftn, xa, mesh="8 (a), Auto",
                         layouts="P('a', None) -> XLA's choice", direction="forward",
                         check=chk(None)))
    out.append(NdProgram("2-D", ONE_DEVICE, "whole", jnp.fft.fftn, x1, mesh="1 device",
                         layouts="whole array", direction="forward", check=chk(None)))
    out.append(NdProgram("2-D", "pencilfft.fftn, one device", "whole", pencilfft.fftn, x1,
                         mesh="1 device", layouts="whole array", direction="forward",
                         check=chk(None)))
    return out


# ----------------------------------------------------------------------------------------------
# Running a case, its records


def run_programs(case: str, size: int, programs: list[NdProgram], args: argparse.Namespace,
                 ctx: dict[str, Any]) -> list[dict[str, Any]]:
    for p in programs:
        harness.say(args, f"{case} {size}: compile {p.name}")
        p.compile()
    harness.say(args, f"{case} {size}: {args.warmup} + {args.repeats} interleaved rounds of "
                      f"{sum(p.ok for p in programs)} programs")
    harness.time_programs(programs, args.repeats, args.warmup)
    for p in programs:
        p.check()
    stamped = harness.stamp(ctx)
    return [record(case, size, p, args, stamped) for p in programs]


def record(case: str, size: int, p: NdProgram, args: argparse.Namespace,
           ctx: dict[str, Any]) -> dict[str, Any]:
    ndim = 3 if case == "3-D" else 2
    t = p.times if p.status in ("ok", "wrong") and len(p.times) == args.repeats else []
    keys = ("median_s", "min_s", "max_s", "mad_s")
    stats = (dict(zip(keys, (statistics.median(t), min(t), max(t), harness.mad(t)))) if t
             else dict.fromkeys(keys))
    return {"schema": SCHEMA, "tool": "nd", "tag": args.tag, "status": p.status, "note": p.note,
            "case": case, "shape": [size] * ndim, "dtype": DTYPE, "program": p.name,
            "kind": p.kind, "parts_of": p.parts_of, "direction": p.direction, "mesh": p.mesh,
            "layouts": p.layouts, "route": p.route, "route_exchanges": p.route_exchanges,
            "collectives": p.collectives, "exchanges_in_hlo": n_exchanges(p.collectives),
            "repeats": args.repeats, "warmup": args.warmup, "compile_s": p.compile_s,
            **stats, "times_s": t,
            **{f"mem_{k}_bytes": v for k, v in p.mem.items()}, "max_rel_err": p.err, **ctx}


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    if jax.device_count() < 8 or jax.process_count() > 1:
        raise SystemExit(f"error: benchmarks.nd needs 8 devices in one process (--devices 8); "
                         f"there are {jax.device_count()} in {jax.process_count()} process(es)")
    if "3d" in args.cases:
        for shape in args.shapes:
            yield run_programs("3-D", shape[0], programs_3d(shape[0], args), args, ctx)
    if "2d" in args.cases:
        yield run_programs("2-D", args.grid2d, programs_2d(args.grid2d, args), args, ctx)


# ----------------------------------------------------------------------------------------------
# The table


def _mib(r: dict[str, Any]) -> str:
    b = r.get("mem_total_bytes")
    return "" if b is None else f"{b / 2**20:.0f}"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None or r["median_s"] is None:
        return "—" if r is None else r["status"]
    return fmt_ms(r["median_s"]) + (" WRONG" if r["status"] == "wrong" else "")


def _hlo(r: dict[str, Any]) -> str:
    c = dict(r["collectives"])
    n = n_exchanges(c)
    r = c.get(RESHARD_CALL, 0)
    parts = [f"{n} exchange{'s' * (n != 1)}" if n else "",
             f"{r} reshard{'s' * (r != 1)}" if r else ""]
    parts += [f"{v} {k}" for k, v in c.items()
              if k not in ("all-to-all", *EXCHANGE_CALLS, RESHARD_CALL)]
    return ", ".join(p for p in parts if p) or "none"


def table(records: Sequence[dict[str, Any]]) -> str:
    """One table per (case, size): each whole program's median, its ratio to the case's
    references, its exchanges and its FFTs alone, the collectives XLA compiled and the memory
    per device."""
    latest = harness.latest(records, lambda r: (r["case"], r["shape"][0], r["program"]))
    texts = []
    for case, size in dict.fromkeys((k[0], k[1]) for k in latest):
        rs = [r for k, r in latest.items() if k[:2] == (case, size)]
        named = {r["program"]: r for r in rs}
        alone = {(r["parts_of"], r["kind"]): r for r in rs if r["kind"] in PARTS_KEPT}
        refs = [named.get(name) for name in REFERENCES[case]]
        head = ["program", "mesh", "layouts", "route exchanges", "in the HLO", "median ms"]
        if case == "3-D":
            head += ["/ pfft3d's"]
        else:
            head += ["/ one device's", "sharded jnp / this"]
        head += ["exchanges alone ms (share)", "FFTs alone ms (share)", "MiB/dev", "compile s"]
        rows = []
        for r in rs:
            if r["kind"] != "whole":
                continue
            med = r["median_s"]
            ratios = []
            for i, ref in enumerate(refs):
                ok = med and ref and ref["median_s"]
                if case == "2-D" and i == 1:  # how many times faster than XLA's sharded FFT
                    ratios.append(f"{ref['median_s'] / med:.1f}x" if ok else "")
                else:
                    ratios.append(f"{med / ref['median_s']:.2f}" if ok else "")
            shares = []
            for keep in PARTS_KEPT:
                a = alone.get((r["program"], keep))
                shares.append(f"{fmt_ms(a['median_s'])} ({a['median_s'] / med:.0%})"
                              if a and a["median_s"] and med else "")
            rows.append([r["program"], r["mesh"], r["layouts"].replace("|", "/"),
                         "" if r["route_exchanges"] is None else r["route_exchanges"], _hlo(r),
                         _cell(r), *ratios, *shares, _mib(r),
                         "" if r["compile_s"] is None else f"{r['compile_s']:.1f}"])
        what = ("round trip fftn + ifftn (one jit)" if case == "3-D" else "forward fftn")
        reps = "-".join(str(v) for v in sorted({r["repeats"] for r in rs}))
        note = (f"{case} {fmt_dims(rs[0]['shape'])} {rs[0]['dtype']}, {what}, 8 simulated CPU "
                f"devices in one process; medians of {reps} interleaved rounds; load average "
                f"{harness.load_range(rs)}."
                + (ONE_DEVICE_NOTE.format(rs[0]["machine"].get("threads_per_device", "?"))
                   if case == "2-D" else ""))
        texts.append(harness.md_table(head, rows, "lllrlr" + "r" * (len(head) - 6), note))
    return "\n\n".join(texts)


TABLES = {"nd": table}


# ----------------------------------------------------------------------------------------------
# The command line (benchmarks.harness.main)

OPTIONS = dict(devices=8, cores=None, shapes=["256"], repeats=15, warmup=2, seed=0, check=True,
               out=None, tag="")


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grid2d", type=int, default=2048, metavar="M",
                   help="the 2-D case's M x M grid (default 2048)")
    p.add_argument("--cases", nargs="+", choices=("3d", "2d"), default=["3d", "2d"])
    p.add_argument("--quick", action="store_true",
                   help="128^3 and 1024^2, 1 + 5 rounds (overrides --shapes, --grid2d, --repeats, "
                        "--warmup)")


def validate(args: argparse.Namespace) -> None:
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    bad = [fmt_dims(s) for s in args.shapes if len(set(s)) != 1 or s[0] % 8]
    if bad or args.grid2d % 8:
        raise SystemExit(f"error: the grids must be cubes (3-D) and squares (2-D) whose sides "
                         f"8 divides; got --shapes {' '.join(bad) or 'ok'}, --grid2d {args.grid2d}")


def plan(args: argparse.Namespace) -> list[str]:
    lines = [f"8 devices; {args.warmup} warm-up + {args.repeats} interleaved rounds per case; "
             f"results -> {args.out}"]
    for key, label, sizes in (("3d", "3-D round trips", [s[0] for s in args.shapes]),
                              ("2d", "2-D forward", [args.grid2d])):
        if key in args.cases:
            for s in sizes:
                lines.append(f"  {label} at {s}^{3 if key == '3d' else 2} complex64")
    lines += ["  3-D programs: " + ", ".join([PENCIL, "brick -> brick: fftn + ifftn",
                                              "brick -> natural pencil: fftn + ifftn",
                                              "pencil 4x2: fftn + ifftn"])
              + " (+ each one's exchanges alone and FFTs alone)",
              "  2-D programs: slab: fftn, slab: fftn back to P('a', None), 4x2 block: fftn, "
              f"{SHARDED}, {ONE_DEVICE}, pencilfft.fftn, one device (+ pencilfft's parts alone)"]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    return harness.main(sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
