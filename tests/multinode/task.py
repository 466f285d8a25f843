"""One task of a multi-node job of tests/multinode/checks.py (srun or MPICH's hydra across the
namespace cluster of tests/multinode/cluster.sh).

    python tests/multinode/task.py checks DIR EX   every check below (EX: the exchanges to use,
                                                   comma-separated)
    python tests/multinode/task.py differ          the tasks of the job's second node plan
                                                   another shape
    python tests/multinode/task.py raise DIR       the first task of the job's second node
                                                   raises after a collective (when:
                                                   DIR/raising.json)

`checks`: what initialize saw (the process and device counts, MPI's size; its own verbose line
names the launcher and the coordinator); pfft3d/pifft3d against numpy for each exchange of EX
on a (2, D/2) and a (D, 1) mesh of the job's D devices, and for "mpi" and "mixed" pipelined
(`pipeline=True`, 4 pieces) against the unpipelined values, and for "mpi" one piece of memory
more than the chunked round trip (XLA's memory analysis); the N-D names on a 2-D brick (both axes
split over the (2, D/2) mesh, across the nodes) and a 4-D batch; scatter, gather, save and load
(DIR: a shared folder); the MPI exchange's bytes coming in over this node's link.  Each task prints one short line
`REPORT <json>` (srun cuts long lines of two tasks into each other): its rank, node, what
initialize saw, and the checks that failed with their first 150 characters (none: {}).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback

import pencilfft

pencilfft.initialize(verbose=True)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from pencilfft._processes.launch import running_mpi  # noqa: E402

RANK = jax.process_index()
HOST = socket.gethostname()
SHAPE = (16, 16, 16)


def report(**fields) -> None:
    print("REPORT " + json.dumps(dict(rank=RANK, host=HOST, **fields)), flush=True)


def mesh(shape):
    names = ("x", "y")[: len(shape)]
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Explicit,) * len(shape))


def data(shape, dtype=np.complex64, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def put(a: np.ndarray, sharding) -> jax.Array:
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


def close(got, want, what: str, tol: float = 2e-5) -> None:
    err = float(np.abs(np.asarray(got) - want).max() / max(np.abs(want).max(), 1e-30))
    if not err < tol:
        raise AssertionError(f"{what}: relative error {err:.2e} >= {tol:g}")


def checks(folder: str, exchanges: list[str]) -> dict[str, str]:
    failed: dict[str, str] = {}

    def check(name, fn, *args):
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - every failure is reported, by name
            failed[name] = f"{type(e).__name__}: {e}"[:150]
            traceback.print_exc()

    x = data(SHAPE)
    want_k = np.moveaxis(np.fft.fftn(x.astype(np.complex128)), 0, -1)  # (Y, Z, X)
    meshes = list(dict.fromkeys([(2, jax.device_count() // 2), (jax.device_count(), 1)]))

    def transforms(pdims, exchange):
        m = mesh(pdims)
        xs = pencilfft.scatter(x if RANK == 0 else None, m)
        fwd = jax.jit(lambda v: pencilfft.pfft3d(v, exchange=exchange))
        inv = jax.jit(lambda k: pencilfft.pifft3d(k, exchange=exchange))
        k = fwd(xs)
        back = pencilfft.gather(inv(k))
        k = pencilfft.gather(k)
        if RANK == 0:
            close(k, want_k, "pfft3d")
            close(back, x, "pifft3d(pfft3d)")
        if exchange in ("mpi", "mixed"):  # pipelined across the nodes: the same values
            kw = dict(exchange=exchange, chunks=4, pipeline=True)
            kp = jax.jit(lambda v: pencilfft.pfft3d(v, **kw))(xs)
            bp = pencilfft.gather(jax.jit(lambda q: pencilfft.pifft3d(q, **kw))(kp))
            kp = pencilfft.gather(kp)
            if RANK == 0:
                close(kp, k, "pipelined pfft3d against the unpipelined", tol=1e-5)
                close(bp, x, "pipelined pifft3d(pfft3d)")
            if exchange == "mpi":  # one piece of memory more than the chunked round trip
                big = jax.ShapeDtypeStruct((64, 64, 64), np.complex64,  # (pieces of 32 KiB)
                                           sharding=pencilfft.real_space_sharding(m))

                def pieces(pipeline):
                    c = jax.jit(lambda v: pencilfft.pifft3d(pencilfft.pfft3d(
                        v, exchange=exchange, chunks=4, pipeline=pipeline), exchange=exchange,
                        chunks=4, pipeline=pipeline)).lower(big).compile().memory_analysis()
                    return c.temp_size_in_bytes / (c.output_size_in_bytes / 4)
                plain, piped = pieces(False), pieces(True)
                if not piped <= plain + 1.1:
                    raise AssertionError(f"pipelined round trip holds {piped:.2f} pieces, the "
                                         f"chunked one {plain:.2f}: more than one piece more")

    for pdims in meshes:
        for exchange in exchanges:
            check(f"pfft3d {pdims} {exchange}", transforms, pdims, exchange)

    def nd_names():
        m = mesh(meshes[0])
        brick = data((32, 24), seed=1)  # a 2-D brick: both axes split, across the nodes
        b = put(brick, NamedSharding(m, P("x", "y")))
        replicated = jax.jit(lambda v: v, out_shardings=NamedSharding(m, P()))
        got = jax.jit(pencilfft.fftn)(b)
        close(np.asarray(replicated(got)), np.fft.fftn(brick.astype(np.complex128)),
              "fftn of a 2-D brick")
        back = jax.jit(pencilfft.ifftn)(got)
        close(np.asarray(replicated(back)), brick, "ifftn(fftn) of a 2-D brick")
        real = data((16, 12), np.float32, seed=2)
        rk = jax.jit(pencilfft.rfftn)(put(real, NamedSharding(m, P("x", "y"))))
        close(np.asarray(replicated(rk)), np.fft.rfftn(real.astype(np.float64)),
              "rfftn of a 2-D brick")
        batch = data((2, 8, 8, 8), seed=3)  # a 4-D batch, the transform over the last three
        v = put(batch, NamedSharding(m, P(None, "x", "y", None)))
        got4 = jax.jit(lambda a: pencilfft.fftn(a, axes=(1, 2, 3)))(v)
        close(np.asarray(replicated(got4)),
              np.fft.fftn(batch.astype(np.complex128), axes=(1, 2, 3)), "fftn of a 4-D batch")

    check("N-D names on a (2, 2) brick", nd_names)

    def io():
        m = mesh(meshes[0])
        xs = pencilfft.scatter(x if RANK == 0 else None, m)
        got = pencilfft.gather(xs)
        if RANK == 0 and not np.array_equal(got, x):
            raise AssertionError("gather(scatter(x)) != x")
        path = os.path.join(folder, "field.npy")
        pencilfft.save(path, xs)
        if RANK == 0 and not np.array_equal(np.load(path), x):
            raise AssertionError("the saved file != x")
        back = pencilfft.load(path, m)
        if not back.sharding.is_equivalent_to(xs.sharding, 3):
            raise AssertionError(f"load's sharding {back.sharding} != {xs.sharding}")
        got = pencilfft.gather(back)
        if RANK == 0 and not np.array_equal(got, x):
            raise AssertionError("gather(load(save(x))) != x")

    check("scatter, gather, save, load", io)

    def over_the_link():  # (`before` is read before the barrier: peers send right after it)
        # The MPI exchange's bytes come in over this node's eth0 (/proc/net/dev is this network
        # namespace's), not through shared memory: a forward transform on a (P, 1) mesh is one
        # exchange, in which this process receives from each process on another node its
        # 1/P of that process's block.
        m = mesh((jax.device_count(), 1))
        n = 64
        xs = put(data((n, n, n), seed=4), pencilfft.real_space_sharding(m))
        f = jax.jit(lambda v: pencilfft.pfft3d(v, exchange="mpi"))
        jax.block_until_ready(f(xs))
        hosts = mpi.COMM_WORLD.allgather(HOST)
        elsewhere = sum(h != HOST for h in hosts) / len(hosts)
        expected = n ** 3 * 8 / len(hosts) * elsewhere  # one slab exchange, this process
        before = link_bytes()
        mpi.COMM_WORLD.Barrier()
        jax.block_until_ready(f(xs))
        mpi.COMM_WORLD.Barrier()
        got = link_bytes() - before
        if not got >= 0.9 * expected:
            raise AssertionError(f"{got} bytes received over eth0 during the MPI exchange, "
                                 f"expected at least {0.9 * expected:.0f}")

    mpi = running_mpi()
    if mpi is not None:
        check("the MPI exchange crosses the link", over_the_link)
    else:
        failed["the MPI exchange crosses the link"] = "MPI is not running"
    return failed


def link_bytes() -> int:
    """Bytes received on this node's eth0 so far."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "eth0":
                return int(fields.split()[0])
    raise AssertionError("no eth0 in /proc/net/dev: not in a node of the test cluster")


def main(argv: list[str]) -> None:
    mode = argv[1]
    mpi = running_mpi()
    seen = dict(processes=jax.process_count(), devices=jax.device_count(),
                local=jax.local_device_count(),
                mpi=mpi.COMM_WORLD.Get_size() if mpi is not None else None,
                netmod=os.environ.get("MPICH_CH4_NETMOD"))
    if mode == "checks":
        start = time.monotonic()
        failed = checks(argv[2], argv[3].split(","))
        report(**seen, failed=failed, seconds=round(time.monotonic() - start, 1))
        return
    hosts = mpi.COMM_WORLD.allgather(HOST) if mpi is not None else [HOST]
    second = next((h for h in hosts if h != hosts[0]), None)  # the job's second node
    if mode == "differ":
        shape = (16, 16, 8) if HOST == second else SHAPE
        m = mesh((jax.device_count(), 1))
        x = put(np.zeros(shape, np.complex64), pencilfft.real_space_sharding(m))
        report(**seen, planning=list(shape), raising_at=time.time())
        jax.block_until_ready(jax.jit(pencilfft.pfft3d)(x))  # DifferentPlansError, uncaught
        report(unreachable=True)
        return
    if mode == "raise":
        m = mesh((jax.device_count(), 1))
        x = put(np.zeros(SHAPE, np.complex64), pencilfft.real_space_sharding(m))
        f = jax.jit(pencilfft.pfft3d)
        jax.block_until_ready(f(x))  # one collective together, then the second node fails
        if RANK == hosts.index(second):  # the first task of the second node fails
            # In a file: srun may drop the last lines of a step it is ending.
            with open(os.path.join(argv[2], "raising.json"), "w") as f:
                json.dump(dict(rank=RANK, host=HOST, raising_at=time.time()), f)
            raise RuntimeError(f"boom on {HOST}")
        for _ in range(600):  # the others wait in collectives until the job is ended
            jax.block_until_ready(f(x))
            time.sleep(0.1)
        report(unreachable=True)
        return
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
