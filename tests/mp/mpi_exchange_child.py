"""Child for tests/test_mpi_exchange.py: the exchange through MPI inside XLA, one CPU device per
process.

    mpirun -np N python mpi_exchange_child.py PxQ
    mpirun -np 2 python mpi_exchange_child.py fail DIR


Runs transforms with exchange="mpi" on a PxQ mesh (P*Q = N) and prints, on rank 0, one line
"REPORT <json>": relative errors against float64 numpy references and against the same
transform with exchange="alltoall" (jax's gloo collectives), for the ways users call it (jit,
grad, jvp, vmap, scan, chunks, padding, the compiler-partitioned transform, two independent
transforms in one program, one user function used twice), halo_exchange's sends and
power_spectrum's reduction, what "auto" picks, what the compiled program holds, and its memory.
"""
from __future__ import annotations

import json
import sys

import pencilfft

pencilfft.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P  # noqa: E402

from pencilfft._transforms import plan as _plan  # noqa: E402
from pencilfft._exchange import mpi as _mpi_exchange  # noqa: E402


def _gather(x) -> np.ndarray:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _err(got, ref) -> float:
    """Relative error of the global array `got` (zero padding cut off) against `ref`."""
    got, ref = _gather(got), np.asarray(ref)
    got = got[tuple(slice(0, n) for n in ref.shape)]
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def _hlo_counts(compiled_text: str) -> dict[str, int]:
    return {
        "mpi calls": compiled_text.count(f'custom_call_target="{_mpi_exchange.TARGET}"'),
        "xla collectives": sum(compiled_text.count(op) for op in (
            "all-to-all(", "collective-permute(", "all-gather(", "all-reduce(",
            "reduce-scatter(")),
        "host callbacks": compiled_text.count("callback"),
    }


def transforms(mesh, report: dict) -> None:
    for shape in [(8, 12, 10), (6, 10, 7)]:  # even, and uneven for the padded exchange
        rng = np.random.default_rng(0)
        g = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
        x = jax.device_put(g, pencilfft.real_space_sharding(mesh))
        # both layouts on the even shape; the uneven one (the padded exchange) in one
        for layout in ("transposed", "natural") if shape == (8, 12, 10) else ("natural",):
            key = f"{shape}-{layout}"
            fwd = jax.jit(lambda v, e, lay=layout: pencilfft.pfft3d(v, layout=lay, exchange=e),
                          static_argnums=1)
            k = fwd(x, "mpi")
            ref = np.fft.fftn(g.astype(np.complex128))
            ref = ref.transpose(1, 2, 0) if layout == "transposed" else ref
            report[f"fft {key}"] = _err(k, ref)
            report[f"fft vs alltoall {key}"] = _err(k, _gather(fwd(x, "alltoall")))
            # eagerly, and in pieces (issue 27's chunks): the custom call inside the loop
            report[f"fft chunks=3 {key}"] = _err(pencilfft.pfft3d(
                x, layout=layout, exchange="mpi", chunks=3), ref)
            back = pencilfft.pifft3d(k, s=shape, layout=layout, exchange="mpi")
            report[f"roundtrip {key}"] = _err(back, g)
            r = jax.device_put(g.real.copy(), pencilfft.real_space_sharding(mesh))
            kr = pencilfft.prfft3d(r, layout=layout, exchange="mpi")
            rref = np.fft.rfftn(g.real.astype(np.float64))
            rref = rref.transpose(1, 2, 0) if layout == "transposed" else rref
            report[f"rfft {key}"] = _err(kr, rref)
            report[f"irfft {key}"] = _err(pencilfft.pirfft3d(kr, shape, layout=layout,
                                                             exchange="mpi"), g.real)
        weights = jnp.asarray(rng.standard_normal(shape), jnp.float32)

        def loss(v, e):
            k = pencilfft.pfft3d(v * weights, exchange=e)
            return jnp.sum(jnp.abs(pencilfft.pifft3d(k * 2.0, s=shape, exchange=e)) ** 2)

        grads = [jax.jit(jax.grad(loss), static_argnums=1)(x, e) for e in ("mpi", "alltoall")]
        report[f"grad {shape}"] = _err(grads[0], _gather(grads[1]))
        tangents = [jax.jit(lambda v, e: jax.jvp(lambda u: pencilfft.pfft3d(u, exchange=e),
                                                 (v,), (v * 3,))[1],
                            static_argnums=1)(x, e) for e in ("mpi", "alltoall")]
        report[f"jvp {shape}"] = _err(tangents[0], _gather(tangents[1]))


def programs(mesh, report: dict) -> None:
    """vmap, scan, two independent transforms in one program, the compiler-partitioned
    transform, "auto", and the compiled program."""
    shape = (8, 12, 10)
    rng = np.random.default_rng(1)
    gb = (rng.standard_normal((3,) + shape) + 1j * rng.standard_normal((3,) + shape)).astype(
        np.complex64)
    xb = jax.device_put(gb, pencilfft.real_space_sharding(mesh, 4))
    vm = jax.jit(jax.vmap(lambda v: pencilfft.pfft3d(v, exchange="mpi")))(xb)
    ref = lambda v: np.fft.fftn(v.astype(np.complex128), axes=(-3, -2, -1))  # noqa: E731
    report["vmap"] = _err(vm, np.moveaxis(ref(gb), -3, -1))

    def step(c, _):
        return pencilfft.pifft3d(pencilfft.pfft3d(c, exchange="mpi") * 0.5, exchange="mpi"), None

    x0 = jax.device_put(gb[0], pencilfft.real_space_sharding(mesh))
    out, _ = jax.jit(lambda c: jax.lax.scan(step, c, None, length=3))(x0)
    report["scan"] = _err(out, gb[0] / 8)

    # Two independent transforms (same shapes: one inner function for jax) and a third of
    # another shape: XLA may run their exchanges in any order, on any thread, per process.
    xs = jax.device_put(gb[2, :, :, :8], pencilfft.real_space_sharding(mesh))

    def three(a, b, c):
        return (pencilfft.pfft3d(a, exchange="mpi"), pencilfft.pfft3d(b * 2, exchange="mpi"),
                pencilfft.pfft3d(c, exchange="mpi"))

    worst = 0.0
    for _ in range(5):
        ka, kb, kc = jax.jit(three)(x0, jax.device_put(gb[1], x0.sharding), xs)
        worst = max(worst, _err(ka, np.moveaxis(ref(gb[0]), -3, -1)),
                    _err(kb, np.moveaxis(ref(2 * gb[1]), -3, -1)),
                    _err(kc, np.moveaxis(ref(gb[2, :, :, :8]), -3, -1)))
    report["independent transforms"] = worst
    shared_function(mesh, x0, jax.device_put(gb[1], x0.sharding), report)

    # The compiler-partitioned transform: jit on an Auto mesh, nothing in scope.
    auto_mesh = jax.make_mesh(mesh.axis_sizes, mesh.axis_names,
                              axis_types=(AxisType.Auto,) * 2)
    xa = jax.device_put(gb[0], NamedSharding(auto_mesh, P("x", "y")))
    part = jax.jit(lambda v: pencilfft.pfft3d(v, exchange="mpi"))
    report["partitioned"] = _err(part(xa), np.moveaxis(ref(gb[0]), -3, -1))
    grads = [jax.jit(jax.grad(lambda v, e=e: jnp.sum(jnp.abs(pencilfft.pfft3d(
        v, exchange=e)) ** 2)))(xa) for e in ("mpi", "alltoall")]
    report["partitioned grad"] = _err(grads[0], _gather(grads[1]))
    counts = _hlo_counts(part.lower(xa).compile().as_text())
    report["partitioned hlo"] = counts

    # What "auto" picks: this exchange, on both axes.
    plan = _plan.plan_forward(x0, norm="backward", layout="transposed", mesh=None)
    report["auto picks"] = list(plan.exchanges)
    k_auto = jax.jit(pencilfft.pfft3d)(x0)
    report["auto fft"] = _err(k_auto, np.moveaxis(ref(gb[0]), -3, -1))

    fwd = {e: jax.jit(lambda v, e=e: pencilfft.pfft3d(v, exchange=e))
           for e in ("auto", "mpi", "alltoall")}
    compiled = {e: f.lower(x0).compile() for e, f in fwd.items()}
    report["hlo"] = _hlo_counts(compiled["auto"].as_text())
    memory = {e: c.memory_analysis() for e, c in compiled.items()}
    report["temp bytes"] = {e: int(m.temp_size_in_bytes) for e, m in memory.items()}


def shared_function(mesh, a, b, report: dict) -> None:
    """A jitted function of the user's that holds a transform, used twice on independent data
    in one program: jax lowers it once, so both exchanges carry the same attributes (key).
    Each compiled call must still get its own MPI tag, the same on every process; and with a
    delay before the first use on rank 0 and before the second on rank 1 (so that, where XLA
    runs the two concurrently, the ranks reach them in opposite orders) the values are right."""
    import re

    inner = jax.jit(lambda v: pencilfft.pfft3d(v, exchange="mpi"))
    spec = a.sharding.spec

    def busy(v):  # ~20 ms of work whose result does not change v
        m = jnp.full((128, 128), 1e-3, jnp.float32) + jnp.real(v).sum() * 0
        m = jax.lax.fori_loop(0, 40, lambda i, m: jnp.tanh(m @ m), m)
        return v + (m[0, 0] * 0).astype(v.dtype)

    def slow_on(rank, v):
        body = lambda u: jax.lax.cond(jax.lax.axis_index("x") == rank, busy, lambda w: w, u)  # noqa: E731
        return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)(v)

    two = jax.jit(lambda u, v: (inner(slow_on(0, u)), inner(slow_on(1, v))))
    before = len(_mpi_exchange.instantiated())
    text = two.lower(a, b).compile().as_text()
    calls = re.findall(rf'custom_call_target="{_mpi_exchange.TARGET}".*?key = (\d+)', text)
    tags = np.asarray([t for _, _, t in _mpi_exchange.instantiated()[before:]], np.int64)
    everywhere = np.asarray(multihost_utils.process_allgather(tags))
    report["shared function"] = {
        "calls": len(calls), "keys": len(set(calls)), "tags": len(set(tags.tolist())),
        "same tags on every process": bool((everywhere == everywhere[0]).all())}
    ref = lambda v: np.moveaxis(np.fft.fftn(_gather(v).astype(np.complex128)), -3, -1)  # noqa: E731
    worst = 0.0
    for _ in range(3):
        ka, kb = two(a, b)
        worst = max(worst, _err(ka, ref(a)), _err(kb, ref(b)))
    report["shared function values"] = worst


def power(mesh, report: dict) -> None:
    """power_spectrum's reduction through MPI (what "auto" does here) against psum's (gloo):
    values, grad, and the compiled program (our sums, no XLA all-reduce)."""
    from pencilfft._pm import power as _power

    rng = np.random.default_rng(3)
    g = rng.standard_normal((8, 12, 10)).astype(np.float32)
    x = jax.device_put(g, pencilfft.real_space_sharding(mesh))
    spectrum = jax.jit(lambda v: pencilfft.power_spectrum(v, kedges=4, multipoles=(0, 2))[1])
    loss = jax.jit(jax.grad(lambda v: jnp.sum(pencilfft.power_spectrum(v, kedges=4)[1])))
    got, grad = spectrum(x), loss(x)
    text = spectrum.lower(x).compile().as_text()
    auto = _mpi_exchange.auto
    _power._mpi_exchange.auto = lambda platform, mesh=None: False  # the reference: psum (gloo)
    try:
        ref, ref_grad = jax.jit(lambda v: pencilfft.power_spectrum(v, kedges=4, multipoles=(0, 2))[1])(x), \
            jax.jit(jax.grad(lambda v: jnp.sum(pencilfft.power_spectrum(v, kedges=4)[1])))(x)
    finally:
        _power._mpi_exchange.auto = auto
    report["power"] = _err(got, _gather(ref))
    report["power grad"] = _err(grad, _gather(ref_grad))
    report["power hlo"] = {
        "mpi sums": text.count(f'custom_call_target="{_mpi_exchange.ALLREDUCE_TARGET}"'),
        "xla collectives": _hlo_counts(text)["xla collectives"]}


def halos(mesh, report: dict) -> None:
    """halo_exchange's sends through MPI (what "auto" does here) against ppermute's (gloo)."""
    from pencilfft._pm import halo as _halo

    rng = np.random.default_rng(2)
    g = rng.standard_normal((8, 12, 6)).astype(np.float32)
    x = jax.device_put(g, pencilfft.real_space_sharding(mesh))
    weights = jax.device_put(rng.standard_normal(g.shape).astype(np.float32), x.sharding)
    auto = _mpi_exchange.auto
    for periods in [(True, True), (False, True)]:
        def halo(v, periods=periods):
            return pencilfft.halo_exchange(v, (1, 2), periods)

        def loss(v, w, periods=periods):
            return jnp.sum(pencilfft.halo_exchange(v, (1, 2), periods) * w)

        # (the grad of halo_exchange under jit on an Explicit mesh wants the mesh in scope,
        # whatever the exchange: jax's rule, as README "Autodiff and vmap" says for eager use)
        with jax.set_mesh(mesh):
            got, grad = jax.jit(halo)(x), jax.jit(jax.grad(loss))(x, weights)
            text = jax.jit(halo).lower(x).compile().as_text()
            _halo._mpi_exchange.auto = lambda platform, mesh=None: False  # the reference: ppermute
            try:
                ref, ref_grad = jax.jit(halo)(x), jax.jit(jax.grad(loss))(x, weights)
            finally:
                _halo._mpi_exchange.auto = auto
        key = "periodic" if periods[0] else "open X"
        report[f"halo {key}"] = _err(got, _gather(ref))
        report[f"halo grad {key}"] = _err(grad, _gather(ref_grad))
        report[f"halo hlo {key}"] = {
            "mpi shifts": text.count(f'custom_call_target="{_mpi_exchange.SHIFT_TARGET}"'),
            "xla collectives": _hlo_counts(text)["xla collectives"]}


def main(pdims: tuple[int, int]) -> None:
    mesh = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    report: dict[str, object] = {"devices": jax.local_device_count(),
                                 "status": _mpi_exchange.status()}
    transforms(mesh, report)
    programs(mesh, report)
    halos(mesh, report)
    power(mesh, report)
    if jax.process_index() == 0:
        print("REPORT " + json.dumps(report), flush=True)


def fail(marks: str) -> None:
    """Rank 1 fails before its exchange while rank 0 waits in it: the job must end (the abort
    hook of `pencilfft.initialize`), not hang.

    Each rank leaves a file in `marks` once its first exchange ran, and they meet at a barrier
    before rank 1 fails: a line printed instead could still be in rank 0's pipe, unread, when
    the abort kills mpirun's forwarder (seen once in CI)."""
    from pathlib import Path

    from mpi4py import MPI

    mesh = jax.make_mesh((2, 1), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    x = jax.device_put(np.ones((4, 4, 4), np.complex64), pencilfft.real_space_sharding(mesh))
    f = jax.jit(lambda v: pencilfft.pfft3d(v, exchange="mpi"))
    f(x).block_until_ready()
    (Path(marks) / f"rank{jax.process_index()}").write_text("ran one exchange")
    MPI.COMM_WORLD.Barrier()
    if jax.process_index() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    f(x).block_until_ready()  # waits for rank 1's chunk, which never comes


if __name__ == "__main__":
    if sys.argv[1] == "fail":
        fail(sys.argv[2])
    else:
        p, q = (int(v) for v in sys.argv[1].split("x"))
        main((p, q))
