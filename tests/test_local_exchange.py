"""exchange="local": the pencil transpose between the CPU devices of one process, one pass.

The primitive against the exchange it replaces (XLA's all_to_all and a transpose), bit for bit,
for every (split, gather, order) the stages use and a few more, dtypes of 4 to 16 bytes, under
jit, vmap and grad (its transpose is the inverse exchange); "auto" picks it in one process on
CPUs, and then the programs hold our call and no XLA collective; the rendezvous survives
independent exchanges in one program and runs queued back to back; the program lowered for GPUs
is XLA's all_to_all; a device that never comes fails the exchange instead of hanging it (early
where nothing in the process runs), one that comes after its call failed fails at once, and a
loop of 1,000 calls that never waits for its results ends (issue 68).  The transforms themselves
are tested with it everywhere else (it is what "auto" runs in the single-process step).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import (MULTI_PROCESS, clean_env, make_mesh, put_global, random_field, reference,
                      tol)
from pencilfft import _exchange
from pencilfft._transforms import transpose as _transpose
from pencilfft._exchange import local as _local_exchange
from pencilfft._transforms.partitioned import with_mesh

pytestmark = pytest.mark.skipif(MULTI_PROCESS, reason="one process holds every device")

# (split, gather, order) on a (B, a, b, c) block: the stages' and some that they do not use.
CASES = [(3, 2, (0, 3, 1, 2)), (3, 2, (0, 2, 3, 1)), (3, 2, (0, 1, 2, 3)), (2, 1, (0, 2, 3, 1)),
         (3, 1, (0, 3, 2, 1)), (3, 2, (0, 1, 3, 2)), (1, 3, (3, 0, 2, 1)), (2, 2, (0, 1, 2, 3))]


def _mapped(mesh, f, spec=P(None, "x", "y")):
    return jax.jit(jax.shard_map(with_mesh(f, mesh), mesh=mesh, in_specs=spec, out_specs=spec))


@pytest.fixture(scope="module")
def mesh():
    return make_mesh((4, 2))


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [np.complex64, np.float32, np.complex128])
def test_equals_the_exchange_it_replaces(mesh, case, dtype):
    split, gather, order = case
    x = put_global(random_field((2, 16, 8, 8), dtype), NamedSharding(mesh, P(None, "x", "y")))
    ref = _mapped(mesh, lambda v: _transpose.transpose_blocks(v, "x", 4, split, gather, order,
                                                                   algorithm="alltoall"))
    got = _mapped(mesh, lambda v: _transpose.transpose_blocks(v, "x", 4, split, gather, order,
                                                                   algorithm="local"))
    np.testing.assert_array_equal(np.asarray(got(x)), np.asarray(ref(x)))
    if case == CASES[0] and dtype == np.complex64:
        text = got.lower(x).compile().as_text()
        assert _local_exchange.TARGET in text and "all-to-all" not in text


@pytest.mark.parametrize("case", [CASES[0], CASES[6]],
                         ids=["batch joins axis 0", "batch axis added"])
def test_linear_under_vmap_and_grad(mesh, case):
    """vmap joins the batch to axis 0 where that axis stays (the stages' blocks) and adds a
    leading axis otherwise; the vjp is the inverse exchange (checked against the all_to_all's,
    whose transpose jax knows)."""
    split, gather, order = case
    x = put_global(random_field((3, 2, 16, 8, 8), np.float32),
                   NamedSharding(mesh, P(None, None, "x", "y")))
    w = random_field((3, 2, 8, 8, 16) if case == CASES[0] else (3, 32, 8, 8, 1), np.float32)

    def loss(alg):
        def f(v):
            return _transpose.transpose_blocks(v, "x", 4, split, gather, order, algorithm=alg)
        g = _mapped(mesh, jax.vmap(f), P(None, None, "x", "y"))
        return jax.jit(jax.value_and_grad(lambda v: jnp.sum(jnp.sin(g(v)) * w)))

    (v_ref, g_ref), (v_got, g_got) = loss("alltoall")(x), loss("local")(x)
    np.testing.assert_array_equal(np.asarray(v_got), np.asarray(v_ref))
    np.testing.assert_array_equal(np.asarray(g_got), np.asarray(g_ref))


@pytest.mark.parametrize("pdims", [(1, 8), (4, 2)], ids=str)
def test_auto_takes_it_and_leaves_no_collective(pdims):
    mesh = make_mesh(pdims)
    x = put_global(random_field((16, 16, 16), np.complex64), pencilfft.real_space_sharding(mesh))
    f = jax.jit(pencilfft.pfft3d)
    text = f.lower(x).compile().as_text()
    assert _local_exchange.TARGET in text
    assert not any(op in text for op in ("all-to-all", "collective-permute", "all-gather"))
    np.testing.assert_allclose(np.asarray(f(x)), reference(x, "transposed"), rtol=0,
                               atol=tol(np.complex64) * float(np.abs(x).sum()))


def test_independent_exchanges_and_queued_calls():
    """Two transforms that do not depend on each other in one program (XLA may run their
    exchanges in different orders on different devices), called 20 times without waiting:
    nothing waits for anything else and every result is right."""
    mesh = make_mesh((2, 4))
    sharding = pencilfft.real_space_sharding(mesh)
    a, b = (put_global(random_field((16, 16, 8), np.complex64, seed=s), sharding) for s in (1, 2))
    f = jax.jit(lambda u, v: (pencilfft.pfft3d(u), pencilfft.pfft3d(v, layout="natural")))
    outs = [f(a, b) for _ in range(20)]
    ref_a, ref_b = reference(a, "transposed"), reference(b, "natural")
    for ka, kb in outs:
        np.testing.assert_allclose(np.asarray(ka), ref_a, rtol=0, atol=1e-3)
        np.testing.assert_allclose(np.asarray(kb), ref_b, rtol=0, atol=1e-3)


def _skip_at_x0(v):
    """The devices at x == 0 skip the exchange (a cond on the coordinate); the others wait."""
    exchanged = lambda u: _local_exchange.exchange(u, "x", 4, 1, 1, (0, 1, 2, 3))  # noqa: E731
    return jax.lax.cond(jax.lax.axis_index("x") == 0, lambda u: u, exchanged, v)


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_a_device_that_never_comes_fails_instead_of_hanging(mesh, monkeypatch, busy):
    """The others' round fails, naming who waited for whom and the likely cause: after half of
    PENCILFFT_LOCAL_TIMEOUT while no thread of the process runs (nothing is on its way: what a
    loop that runs too far ahead on a small machine does, see the next test), after all of it
    while something runs (here a Python thread that spins)."""
    monkeypatch.setenv("PENCILFFT_LOCAL_TIMEOUT", "6")  # read by the watchdog at every scan
    x = put_global(random_field((2, 16, 8, 8), np.float32), NamedSharding(mesh, P(None, "x", "y")))
    call = _mapped(mesh, _skip_at_x0).lower(x).compile()
    done = threading.Event()

    def spin():
        while not done.is_set():
            pass

    spinner = threading.Thread(target=spin)
    if busy:
        spinner.start()
    start = time.monotonic()
    try:
        with pytest.raises(Exception) as failure:
            np.asarray(call(x))
    finally:
        done.set()
    waited = time.monotonic() - start
    cause = (r"which never reached this exchange within PENCILFFT_LOCAL_TIMEOUT \(6 s\)" if busy
             else "while no thread of this process ran: those devices never started")
    assert re.search(r"DEADLINE_EXCEEDED: pencilfft local exchange: in call -?\d+ of this "
                     r"program \(XLA's run id\), devices \d+, \d+, \d+ \(coordinate\(s\) 1, 2, 3 "
                     r"along the exchange's mesh axes\) waited \d+ s for the devices at "
                     r"coordinate\(s\) 0, " + cause, str(failure.value)), str(failure.value)
    assert "PJRT_NPROC" in str(failure.value)  # the way out of XLA's thread pool
    assert (6 <= waited < 12) if busy else (3 <= waited < 6), waited


# A child process: 1,000 asynchronous round trips, or a device that comes late.
_CHILD = r"""
import json, re, sys, time
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import pencilfft

def result(start, fn):
    try:
        out = fn()
    except Exception as e:  # XLA prefixes the error of every call that took a failed input
        return {"seconds": time.monotonic() - start,
                "error": re.sub(r"(Error dispatching computation: )+", "", str(e))}
    return {"seconds": time.monotonic() - start, **out}

def loop(calls):
    # A brick -> brick round trip at 64^3 on a (2, 2, 2) mesh, jitted, called `calls` times
    # without waiting for a result (as a time-stepping loop does), then the result.
    mesh = jax.make_mesh((2, 2, 2), ("x", "y", "z"))
    rng = np.random.default_rng(0)
    x0 = (rng.standard_normal((64,) * 3) + 1j * rng.standard_normal((64,) * 3)).astype(np.complex64)
    f = jax.jit(lambda a: pencilfft.ifftn(pencilfft.fftn(a)))
    y = jax.block_until_ready(f(jax.device_put(x0, NamedSharding(mesh, P("x", "y", "z")))))
    def run():
        nonlocal y
        for _ in range(calls):
            y = f(y)
        ref = np.fft.ifftn(np.fft.fftn(x0.astype(np.complex128)))  # numpy's round trip
        return {"rel_err": float(np.abs(np.asarray(y) - ref).max() / np.abs(ref).max())}
    return result(time.monotonic(), run)

def late(delay):
    # The devices at x == 0 sleep `delay` s (a host callback) before the exchange.
    from pencilfft._exchange import local
    from pencilfft._transforms.partitioned import with_mesh
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    def nap(u, i):
        if i == 0:
            time.sleep(delay)
        return u
    def body(v):
        v = jax.pure_callback(nap, jax.typeof(v), v, jax.lax.axis_index("x"))
        return local.exchange(v, "x", 4, 1, 1, (0, 1, 2, 3))
    spec = P(None, "x", "y")
    f = jax.jit(jax.shard_map(with_mesh(body, mesh), mesh=mesh, in_specs=spec, out_specs=spec))
    x = jax.device_put(np.ones((2, 16, 8, 8), np.float32), NamedSharding(mesh, spec))
    call = f.lower(x).compile()
    return result(time.monotonic(), lambda: {"sum": float(np.asarray(call(x)).sum())})

what, arg = sys.argv[1], float(sys.argv[2])
print("RESULT " + json.dumps(loop(int(arg)) if what == "loop" else late(arg)), flush=True)
"""


def _child(what: str, arg: float, timeout: float, **env: str) -> dict:
    """`_CHILD` in a process of its own with 8 devices: its result (a hang fails the test)."""
    done = subprocess.run([sys.executable, "-c", _CHILD, what, str(arg)], env=clean_env(8, **env),
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_a_device_that_comes_after_its_call_failed_fails_at_once():
    """Devices at x == 0 come 4 s late, after the others gave up on them (2 s while nothing ran):
    they fail as they come, instead of waiting in a round of their own for devices that already
    failed (2 s more)."""
    out = _child("late", 4, timeout=300, PENCILFFT_LOCAL_TIMEOUT="4")
    assert re.search(r"waited \d+ s for the devices at coordinate\(s\) 0, while no thread",
                     out.get("error", "")), out
    assert 4 <= out["seconds"] < 5.5, out


def test_a_thousand_asynchronous_round_trips_end_within_40_s():
    """Issue 68: 1,000 brick round trips dispatched without waiting.  XLA's CPU client runs
    each device's part of a call on one of max(cores, devices) threads, and a call dispatched
    32 calls ahead of the results waits on one of them: where there are fewer than twice as
    many cores as devices (this project's 2-core machine) the devices still to start find none.
    XLA's own all_to_all then aborts the process after 40 s; the local exchange failed after
    PENCILFFT_LOCAL_TIMEOUT (600 s), twice.  Now the loop completes, right (many cores, or
    jaxlib 0.12, whose client no longer hangs), or fails after 20 s in which nothing ran,
    saying why and the way out, within XLA's 40 s.  (Its idle limit, 20 s, is 5 s here:
    PENCILFFT_LOCAL_TIMEOUT=10 halves to it; the suite's time.)"""
    out = _child("loop", 1000, timeout=600, PENCILFFT_LOCAL_TIMEOUT="10")
    assert out["seconds"] < 40, out
    if "error" in out:
        assert "while no thread of this process ran: those devices never started" in out["error"]
        assert "set PJRT_NPROC to at least twice the number of devices" in out["error"], out
    else:
        assert out["rel_err"] < 1000 * tol(np.complex64), out  # a round trip's error, 1000 times


def test_other_platforms_lower_to_all_to_all(mesh):
    """Never chosen off CPUs, and a program lowered for GPUs does not name it."""
    f = _mapped(mesh, lambda v: _local_exchange.exchange(v, "x", 4, 3, 2, (0, 3, 1, 2)))
    x = jax.ShapeDtypeStruct((2, 16, 8, 8), np.complex64,
                             sharding=NamedSharding(mesh, P(None, "x", "y")))
    cuda = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert _local_exchange.TARGET not in cuda and "all_to_all" in cuda
    assert _exchange.choose("auto", 8, "gpu", (4, 2), 1 << 30) == ("alltoall", "alltoall")
    with pytest.raises(ValueError, match=r"`exchange`='local' cannot run here: it runs on CPU "
                                         r"devices only \(the devices are gpu\)"):
        _exchange.choose("local", 8, "gpu", (4, 2), 0)


def test_failed_build_warns_once_and_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("PENCILFFT_CXX", "false")  # a compiler that fails
    monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(tmp_path))
    _local_exchange._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="use XLA's collectives instead") as record:
            why = _local_exchange.unavailable_reason(None, "cpu")
            assert _local_exchange.unavailable_reason(None, "cpu") == why  # decided once
        assert len(record) == 1 and why.startswith("its handler could not be built")
        assert _exchange.choose("auto", 8, "cpu", (1, 8), 1 << 30) == ("alltoall", "alltoall")
        monkeypatch.setenv("PENCILFFT_CXX", str(tmp_path / "no-such-compiler"))
        _local_exchange._library.cache_clear()
        assert "no C++ compiler" in _local_exchange.unavailable_reason(None, "cpu")
    finally:
        monkeypatch.undo()
        _local_exchange._library.cache_clear()
    assert _local_exchange.unavailable_reason(None, "cpu") is None  # registered once, found again
