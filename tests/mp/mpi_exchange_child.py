"""Child for tests/test_mpi_exchange.py: the exchange through MPI, one CPU device per process.

    mpirun -np N python mpi_exchange_child.py PxQ

Runs transforms with exchange="mpi" on a PxQ mesh (P*Q = N) and prints, on rank 0, one line
"REPORT <json>": relative errors against float64 numpy references and against the same
transform with exchange="alltoall", for the ways users call it (jit, grad, jvp, vmap, scan, two
independent transforms in one program), and what the compiled program holds.
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
from jax.sharding import AxisType  # noqa: E402


def _err(got, ref) -> float:
    """Relative error of the global array `got` (zero padding cut off) against `ref`."""
    got = np.asarray(multihost_utils.process_allgather(got, tiled=True))
    ref = np.asarray(ref)
    got = got[tuple(slice(0, n) for n in ref.shape)]
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def main(pdims: tuple[int, int]) -> None:
    mesh = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    report: dict[str, object] = {"devices": jax.local_device_count()}
    for shape in [(8, 12, 10), (6, 10, 7)]:  # even, and uneven for the padded exchange
        rng = np.random.default_rng(0)
        g = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
        x = jax.device_put(g, pencilfft.real_space_sharding(mesh))
        for layout in ("transposed", "natural"):
            key = f"{shape}-{layout}"
            fwd = jax.jit(lambda v, e, lay=layout: pencilfft.pfft3d(v, layout=lay, exchange=e),
                          static_argnums=1)
            k = fwd(x, "mpi")
            ref = np.fft.fftn(g.astype(np.complex128))
            ref = ref.transpose(1, 2, 0) if layout == "transposed" else ref
            report[f"fft {key}"] = _err(k, ref)
            report[f"fft vs alltoall {key}"] = _err(k, multihost_utils.process_allgather(
                fwd(x, "alltoall"), tiled=True))
            # in pieces (issue 27's chunks): the host callback inside the loop over pieces
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
        report[f"grad {shape}"] = _err(grads[0], multihost_utils.process_allgather(grads[1], tiled=True))
        tangents = [jax.jit(lambda v, e: jax.jvp(lambda u: pencilfft.pfft3d(u, exchange=e), (v,), (v * 3,))[1],
                            static_argnums=1)(x, e) for e in ("mpi", "alltoall")]
        report[f"jvp {shape}"] = _err(tangents[0], multihost_utils.process_allgather(tangents[1], tiled=True))

    # vmap over a batch, scan over steps, and two independent transforms in one program.
    shape = (8, 12, 10)
    rng = np.random.default_rng(1)
    gb = rng.standard_normal((3,) + shape).astype(np.complex64)
    xb = jax.device_put(gb, pencilfft.real_space_sharding(mesh, 4))
    vm = jax.jit(jax.vmap(lambda v: pencilfft.pfft3d(v, exchange="mpi")))(xb)
    report["vmap"] = _err(vm, np.fft.fftn(gb.astype(np.complex128), axes=(1, 2, 3)).transpose(0, 2, 3, 1))

    def step(c, _):
        return pencilfft.pifft3d(pencilfft.pfft3d(c, exchange="mpi") * 0.5, exchange="mpi"), None

    x0 = jax.device_put(gb[0], pencilfft.real_space_sharding(mesh))
    out, _ = jax.jit(lambda c: jax.lax.scan(step, c, None, length=3))(x0)
    report["scan"] = _err(out, gb[0] / 8)

    def two(a, b):
        return pencilfft.pfft3d(a, exchange="mpi"), pencilfft.pfft3d(b * 2, exchange="mpi")

    ka, kb = jax.jit(two)(x0, xb[1])
    ref = lambda v: np.fft.fftn(v.astype(np.complex128)).transpose(1, 2, 0)  # noqa: E731
    report["two programs"] = max(_err(ka, ref(gb[0])), _err(kb, ref(2 * gb[1])))
    hlo = jax.jit(lambda v: pencilfft.pfft3d(v, exchange="mpi")).lower(x0).compile().as_text()
    report["hlo all-to-all"] = hlo.count("all-to-all(")
    report["hlo collective-permute"] = hlo.count("collective-permute(")
    report["hlo callbacks"] = hlo.count("custom-call(")
    if jax.process_index() == 0:
        print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    p, q = (int(v) for v in sys.argv[1].split("x"))
    main((p, q))
