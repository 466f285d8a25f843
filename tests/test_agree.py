"""One decision on every process (`pencilfft._processes.agree`): what each process reads for itself (its
free memory) is agreed across the job before it decides a plan.

Marked `mpirun`: only there do processes differ (in one process the value is its own).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from conftest import MPIRUN, RANK, clean_env
from pencilfft._processes import agree as _agree, memory as _memory


@MPIRUN
@pytest.mark.parametrize("transport", ["mpi", "key-value store"])
def test_the_least_value_wins_on_every_process(transport, monkeypatch):
    if transport == "key-value store":  # as under srun without MPI: jax.distributed's store
        monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
        if jax.process_count() > 1 and _agree.distributed_client() is None:
            pytest.fail("a multi-process job without jax.distributed's client")
    assert _agree.least(100 + 7 * RANK, "a test value") == 100
    assert _agree.least(50 - RANK, "a test value") == 50 - (jax.process_count() - 1)


@MPIRUN
def test_detected_free_memory_is_the_least_over_processes(monkeypatch):
    """Each process sees another amount; every one plans with the smallest, so all pick the
    same chunk count (issue 43: different counts compiled different programs and hung)."""
    monkeypatch.delenv(_memory.ENV, raising=False)
    monkeypatch.setattr(_memory, "host_free", lambda: ((8 + RANK) << 30, "test"))
    devices = jax.local_devices()
    free = _memory.available(devices)
    assert free.per_device == (8 << 30) // len(devices)
    if jax.process_count() > 1:
        assert "the least over" in free.source


@MPIRUN
def test_a_process_that_cannot_tell_leaves_the_check_off(monkeypatch):
    monkeypatch.delenv(_memory.ENV, raising=False)
    monkeypatch.setattr(_memory, "host_free", lambda: None if RANK == 0 else (8 << 30, "test"))
    assert _memory.available(jax.local_devices()) is None


# ----------------------------------------------------------------------------------------------
# Plans that would differ between processes: one error on every process, never a hang


def _spanning_field(shape=(64, 64, 64)):
    """A complex field on a 4x2 mesh of every process's devices (8 in all)."""
    import numpy as np

    import pencilfft
    from conftest import make_mesh, put_global

    mesh = make_mesh((4, 2))
    data = np.zeros(shape, np.complex64)
    return put_global(data, pencilfft.real_space_sharding(mesh))


@MPIRUN
@pytest.mark.parametrize("how", ["eager", "jit"])
@pytest.mark.parametrize("limits", [(None, "3MiB"), ("off", "3MiB"), ("4MiB", "3MiB")],
                         ids=["unset-3MiB", "off-3MiB", "4MiB-3MiB"])
def test_different_memory_limits_fail_alike_on_every_process(how, limits, monkeypatch):
    """Issue 51: PENCILFFT_MEMORY_LIMIT set differently on two ranks made them choose different
    chunk counts and spin forever.  Now every process raises the same error, naming the chunk
    counts and each process's setting (in one process there is nothing to compare: it runs)."""
    import pencilfft

    limit = limits[min(RANK, 1)]
    if limit is None:
        monkeypatch.delenv(_memory.ENV, raising=False)
    else:
        monkeypatch.setenv(_memory.ENV, limit)
    x = _spanning_field()
    f = pencilfft.pfft3d if how == "eager" else jax.jit(pencilfft.pfft3d)
    if jax.process_count() == 1:
        f(x).block_until_ready()
        return
    with pytest.raises(_agree.DifferentPlansError) as info:
        f(x)
    text = str(info.value)
    assert "processes of this job decided pfft3d of a 64x64x64 complex64 grid differently" in text
    assert f"PENCILFFT_MEMORY_LIMIT: process 0: {limits[0] or '(not set)'!r}" in text
    assert "process 1: '3MiB'" in text


@MPIRUN
@pytest.mark.parametrize("op", ["pfft3d", "halo_exchange"])
def test_an_exchange_one_process_cannot_build_fails_alike(op, monkeypatch):
    """A handler that builds on one process and not on another (a node without the MPI
    compiler, say) would leave them in different exchanges: the same error on both, from the
    transforms' plan and from the neighbour sends of halos (and power spectra, painting)."""
    import pencilfft
    from pencilfft._exchange import local as _local, mpi as _mpi

    if jax.process_count() == 1 or _mpi.unavailable_reason(None, "cpu") is not None:
        pytest.skip("needs processes that can run the MPI exchange")  # (alike on every one)
    if RANK == 1:
        monkeypatch.setattr(_mpi, "_library", lambda: "its handler could not be built (test)")
        monkeypatch.setattr(_local, "_library", lambda: "its handler could not be built (test)")
    x = _spanning_field((16, 16, 16))
    if op == "pfft3d":
        with pytest.raises(_agree.DifferentPlansError,
                           match=r"exchanges: process 0: \('(mixed|mpi)'"):
            pencilfft.pfft3d(x)
    else:
        with pytest.raises(_agree.DifferentPlansError,
                           match=r"sends through MPI inside XLA: process 0: True, process 1: "
                                 r"False.*why not: process 0: None, process 1: 'its handler"):
            pencilfft.halo_exchange(x.real, (1, 1))


@MPIRUN
def test_each_process_may_transform_its_own_devices_alone():
    """A transform on one process's own device compares nothing with the others: processes may
    run as many of them as they like, in any order, without waiting for each other."""
    import numpy as np

    import pencilfft
    from conftest import barrier

    data = np.ones((8, 8, 8), np.complex64)
    for _ in range(1 + RANK):
        assert np.allclose(np.asarray(pencilfft.pfft3d(data))[0, 0, 0], 512)
    barrier()


@MPIRUN
@pytest.mark.parametrize("transport", ["mpi", "key-value store"])
def test_same_compares_every_process(transport, monkeypatch):
    if transport == "key-value store":
        monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    _agree.same({"chunks": 2}, "a test plan", settings={"X": RANK})
    if jax.process_count() == 1:
        return
    with pytest.raises(_agree.DifferentPlansError,
                       match=r"chunks: process 0: 0, process 1: 1.*X: process 0: 0, process 1: 1"):
        _agree.same({"chunks": RANK}, "a test plan", settings={"X": RANK})


# ----------------------------------------------------------------------------------------------
# Everything a transform's program depends on (issue 57): a process that differs in any of it
# would compile another program and wait forever in its exchanges.  The last processes differ.


def _transform_call(differ: str, mine: bool):
    """(function, argument, keywords) of the transform that processes 0 (`mine` False) and the
    others (`mine` True) call: alike but for `differ`."""
    import numpy as np

    import pencilfft
    from conftest import make_mesh

    shape, dtype, func = (16, 16, 16), np.complex64, pencilfft.pfft3d
    if differ == "dtype":  # complex128 data; JAX_ENABLE_X64 off on process 0 makes it complex64
        dtype = np.complex128
    kwargs = {"mesh": make_mesh((4, 2))}
    if mine:
        if differ == "shape":
            shape = (16, 16, 8)
        elif differ == "batch":
            shape = (2, 16, 16, 16)
        elif differ == "transform":
            func = pencilfft.pifft3d
        elif differ == "norm":
            kwargs["norm"] = "ortho"
        elif differ == "layout":
            kwargs["layout"] = "natural"
        elif differ == "chunks":
            kwargs["chunks"] = 2
        elif differ == "padding":
            shape, dtype, func = (24, 24, 24), np.float32, pencilfft.prfft3d
            kwargs["padding"] = 1.5
        elif differ == "mesh axis names":
            kwargs["mesh"] = jax.make_mesh((4, 2), ("a", "b"),
                                           axis_types=kwargs["mesh"].axis_types)
        elif differ == "mesh axis types":
            kwargs["mesh"] = make_mesh((4, 2), "auto")
        elif differ == "mesh devices":
            kwargs["mesh"] = jax.sharding.Mesh(kwargs["mesh"].devices[::-1], ("x", "y"),
                                               axis_types=kwargs["mesh"].axis_types)
    elif differ == "padding":
        shape, dtype, func = (16, 16, 16), np.float32, pencilfft.prfft3d
    return func, np.zeros(shape, dtype), kwargs


# What the message names for each difference (processes 0 and 1; the others as process 1).
_NAMED = {
    "shape": r"real_shape: process 0: \(16, 16, 16\), process 1: \(16, 16, 8\)",
    "batch": r"batch: process 0: \(\), process 1: \(2,\)",
    "dtype": r"real_dtype: process 0: 'complex64', process 1: 'complex128'",
    "transform": r"transform: process 0: 'pfft3d', process 1: 'pifft3d'",
    "norm": r"norm: process 0: 'backward', process 1: 'ortho'",
    "layout": r"layout: process 0: 'transposed', process 1: 'natural'",
    "chunks": r"chunks_asked: process 0: 'auto', process 1: 2",
    "padding": r"real_shape: process 0: \(16, 16, 16\), process 1: \(24, 24, 24\)",
    "mesh axis names": r"mesh: process 0: '\(x=4 Explicit, y=2 Explicit\) devices \w+', "
                       r"process 1: '\(a=4 Explicit, b=2 Explicit\) devices",
    "mesh axis types": r"mesh: process 0: '\(x=4 Explicit, y=2 Explicit\) devices \w+', "
                       r"process 1: '\(x=4 Auto, y=2 Auto\) devices",
    "mesh devices": r"mesh: process 0: '\(x=4 Explicit, y=2 Explicit\) devices (\w+)', "
                    r"process 1: '\(x=4 Explicit, y=2 Explicit\) devices (?!\1)",
}


# What the message leads with, in the user's words (issue 68): the argument that differs, or
# the setting (for the dtype: JAX_ENABLE_X64 on one process, the same numpy data on all).
_OTHERS = r"on process(es)? 1\b"
_LEADS = {
    "shape": rf"x\.shape: \(16, 16, 16\) on process 0, \(16, 16, 8\) {_OTHERS}",
    "batch": rf"x\.shape: \(16, 16, 16\) on process 0, \(2, 16, 16, 16\) {_OTHERS}",
    "dtype": rf"jax_enable_x64: False on process 0, True {_OTHERS}",
    "transform": rf"function: 'pencilfft\.pfft3d' on process 0, 'pencilfft\.pifft3d' {_OTHERS}",
    "norm": rf"norm: 'backward' on process 0, 'ortho' {_OTHERS}",
    "layout": rf"layout: 'transposed' on process 0, 'natural' {_OTHERS}",
    "chunks": rf"chunks: 'auto' on process 0, 2 {_OTHERS}",
    "padding": rf"padding: 1 on process 0, 1\.5 {_OTHERS}",
    "mesh axis names": rf"mesh: '\(x=4 Explicit, y=2 Explicit\) devices \w+' on process 0, "
                       rf"'\(a=4 Explicit, b=2 Explicit\) devices \w+' {_OTHERS}",
    "mesh axis types": rf"mesh: '\(x=4 Explicit, y=2 Explicit\) devices \w+' on process 0, "
                       rf"'\(x=4 Auto, y=2 Auto\) devices \w+' {_OTHERS}",
    "mesh devices": rf"mesh: '\(x=4 Explicit, y=2 Explicit\) devices (\w+)' on process 0, "
                    rf"'\(x=4 Explicit, y=2 Explicit\) devices (?!\1)\w+' {_OTHERS}",
}


def _leads_with(text: str, lead: str) -> None:
    """`text` names `lead` first (among what the user gave that differs), before the plans'
    fields that follow from it."""
    head, found, _ = text.partition(". So their plans differ: ")
    assert found, text
    lead_rows = head.partition("would wait for each other forever in its exchanges: ")[2]
    assert re.search(lead, lead_rows), (lead, head)


@MPIRUN
@pytest.mark.parametrize("differ", list(_NAMED))
def test_a_plan_that_differs_in_anything_fails_alike_on_every_process(differ):
    """Issue 57: one rank with another global shape, or with float64 data where the others
    had float32 (JAX_ENABLE_X64 on one rank), hung in silence until killed.  Now every process
    raises DifferentPlansError at the call, naming each process's value; issue 68: first the
    argument that differs in the user's words, then the plan's fields."""
    func, x, kwargs = _transform_call(differ, mine=RANK > 0)
    if jax.process_count() == 1:
        pytest.skip("one process: nothing to differ from")
    with jax.enable_x64(differ != "dtype" or RANK > 0), \
            pytest.raises(_agree.DifferentPlansError, match=_NAMED[differ]) as info:
        func(x, **kwargs)
    x64 = "False" if differ == "dtype" else "True"
    assert f"jax_enable_x64: process 0: {x64}, process 1: True" in str(info.value)
    _leads_with(str(info.value), _LEADS[differ])


# The N-D names (issue 68): every decision they make is compared, the dtype from jax's 64-bit
# switch included, and the message leads with the argument, then the stages.
_ND_LEADS = {
    "x64": rf"jax_enable_x64: False on process 0, True {_OTHERS}",
    "data dtype": rf"a\.dtype: 'complex64' on process 0, 'complex128' {_OTHERS}",
    "norm": rf"norm: None on process 0, 'ortho' {_OTHERS}",
    "axes": rf"axes: None on process 0, \(0, 1\) {_OTHERS}",
    "out_sharding": rf"out_sharding: None on process 0, P\('y', 'x'\) {_OTHERS}",
    "chunks": rf"chunks: 'auto' on process 0, 2 {_OTHERS}",
    "function": rf"function: 'pencilfft\.fftn' on process 0, 'pencilfft\.ifftn' {_OTHERS}",
}
# ... and the decisions that follow from it.
_ND_DECIDED = {"x64": r"in_dtype: process 0: 'complex64', process 1: 'complex128'",
               "data dtype": r"in_dtype: process 0: 'complex64', process 1: 'complex128'",
               "norm": r"norm: process 0: 'backward', process 1: 'ortho'.*stages: process 0: ",
               "axes": r"axes: process 0: \(0, 1, 2\), process 1: \(0, 1\)",
               "out_sharding": r"stages: process 0: ",
               "chunks": r"chunks: process 0: 'auto', process 1: 2",
               "function": r"inverse: process 0: False, process 1: True"}


@MPIRUN
@pytest.mark.parametrize("how", ["eager", "jit"])
@pytest.mark.parametrize("differ", list(_ND_LEADS))
def test_an_nd_call_that_differs_fails_alike_on_every_process(differ, how):
    """Issue 68: rank 1 with JAX_ENABLE_X64 and complex128 data, rank 0 complex64: fftn passed
    the agreement on both (it compared the stages and the chunk count only) and both hung in
    block_until_ready.  Now every decision of the N-D names is compared, before any exchange,
    and the message leads with what the user gave that differs."""
    import numpy as np

    import pencilfft
    from conftest import make_mesh, put_global

    if jax.process_count() == 1:
        pytest.skip("one process: nothing to differ from")
    mine = RANK > 0
    mesh = make_mesh((4, 2))
    dtype = np.complex128 if mine and differ == "data dtype" else np.complex64
    with jax.enable_x64(differ != "x64" or mine):
        data = np.zeros((8, 8, 16), np.complex128 if differ == "x64" else dtype)
        a = put_global(data, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", "y")))
        func, kwargs = pencilfft.fftn, {}
        if mine:
            func = pencilfft.ifftn if differ == "function" else func
            kwargs = {"norm": {"norm": "ortho"}, "axes": {"axes": (0, 1)},
                      "out_sharding": {"out_sharding": jax.sharding.PartitionSpec("y", "x")},
                      "chunks": {"chunks": 2}}.get(differ, {})
        f = func if how == "eager" else jax.jit(lambda v: func(v, **kwargs))
        with pytest.raises(_agree.DifferentPlansError, match=_ND_DECIDED[differ]) as info:
            f(a, **kwargs) if how == "eager" else f(a)
    text = str(info.value)
    assert "processes of this job decided fftn of a (8, 8, 16) array split " in text \
        or "processes of this job decided ifftn" in text or differ == "function", text
    _leads_with(text, _ND_LEADS[differ])


def test_a_rank_started_with_jax_enable_x64_fails_alike_in_the_nd_names():
    """Issue 68, as the probe ran it: under mpirun, rank 1 started with JAX_ENABLE_X64=1
    (complex128 data there, complex64 on rank 0); fftn passed the agreement on both ranks and
    both waited in block_until_ready until killed.  Now both raise DifferentPlansError at the
    call, eagerly and under jax.jit, leading with the dtype and the 64-bit switch."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    child = [sys.executable, str(Path(__file__).parent / "mp" / "agree_child.py")]
    # MPMD: rank 1 alone gets JAX_ENABLE_X64=1 (Hydra's per-program -env, as MPICH's mpirun).
    argv = [str(mpirun), "-np", "1", *child, ":", "-np", "1", "-env", "JAX_ENABLE_X64", "1",
            *child]
    try:
        done = subprocess.run(argv, env=clean_env(4), capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the ranks still ran after 120 s (waiting in an exchange?):\n{e.stdout}")
    reports = [json.loads(m) for m in re.findall(r"REPORT (\{[^{}]*\})", done.stdout)]
    assert sorted((r["rank"], r["call"]) for r in reports) == [
        (0, "fftn"), (0, "jit(ifftn)"), (1, "fftn"), (1, "jit(ifftn)")], done.stdout + done.stderr
    for r in reports:
        assert r["x64"] == (r["rank"] == 1) and r["error"], r
        _leads_with(r["error"], r"a\.dtype: 'complex64' on process 0, 'complex128' on process 1; "
                                r"jax_enable_x64: False on process 0, True on process 1")
        assert "in_dtype: process 0: 'complex64', process 1: 'complex128'" in r["error"], r


def test_plan_decisions_are_every_field_of_the_plan():
    """A field added to the plan is compared without touching the agreement."""
    import dataclasses

    import numpy as np

    from conftest import make_mesh
    from pencilfft._transforms.plan import plan_forward

    mesh = make_mesh((4, 2))
    x = np.zeros((2, 16, 16, 16), np.float32)
    plan = plan_forward(x, norm="ortho", layout="natural", mesh=mesh,
                        kinds=("fft", "fft", "rfft"), padding=1, exchange="auto", chunks="auto")
    decisions = _agree.plan_decisions(plan, x)
    assert list(decisions) == [f.name for f in dataclasses.fields(plan)] + ["input"]
    shown = {k: repr(v) for k, v in decisions.items()}
    assert shown["real_shape"] == "(16, 16, 16)" and shown["batch"] == "(2,)"
    assert shown["real_dtype"] == "'float32'" and shown["k_dtype"] == "'complex64'"
    assert shown["norm"] == "'ortho'" and shown["layout"] == "'natural'"
    assert shown["chunks_asked"] == "'auto'" and shown["input"] == "'ndarray'"
    assert re.fullmatch(r"'\(x=4 Explicit, y=2 Explicit\) devices [0-9a-f]{12}'", shown["mesh"])
    # The same mesh reads the same; its devices in another order do not.
    other = jax.sharding.Mesh(mesh.devices[::-1], mesh.axis_names, axis_types=mesh.axis_types)
    assert _agree._mesh_text(jax.make_mesh((4, 2), ("x", "y"), axis_types=mesh.axis_types)) \
        == _agree._mesh_text(mesh) != _agree._mesh_text(other)
    assert _agree._mesh_text(mesh.abstract_mesh) == "(x=4 Explicit, y=2 Explicit) abstract"


def test_same_reads_back_every_value():
    """The message each process sends is parsed back only when it differs."""
    text = _agree._RECORD.join(
        (_agree._FIELD.join(f"{k}{_agree._PAIR}{v!r}" for k, v in {"a": (1, 2), "b": "x"}.items()),
         f"S{_agree._PAIR}'y'", f"x.shape{_agree._PAIR}(4, 4)"))
    assert _agree._parsed(text) == {"decisions": {"a": "(1, 2)", "b": "'x'"},
                                    "settings": {"S": "'y'"}, "arguments": {"x.shape": "(4, 4)"}}


def test_each_value_is_named_with_the_processes_that_had_it():
    """The lead of the message: each value once, with its processes, short at any count."""
    assert _agree._by_value(["'a'", "'b'"]) == "'a' on process 0, 'b' on process 1"
    assert _agree._by_value(["1", "2", "2", "2", "1", "2"]) == \
        "1 on processes 0, 4, 2 on processes 1-3, 5"
    assert _agree._ranks([0, 1]) == "processes 0, 1"
    assert _agree.shown(np.dtype("complex64")) == "'complex64'"
