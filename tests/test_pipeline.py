"""Pipelined stages (issue 66): a piece's exchange in flight while the next piece's FFT and
pack run (`_transforms/pipeline.py`).

* the values are the unpipelined ones (to float32 rounding) and numpy's, for the exchanges that
  cross processes (under mpirun: "mpi", and "mixed", local inside processes) and XLA's
  collectives (one process: "alltoall", the GPUs' path), even and uneven pieces, both layouts,
  real-to-complex, under jit, grad and vmap;
* the program holds the two-part MPI exchange (posted, awaited) for each pipelined stage, and
  the memory it keeps, measured by XLA, is bounded;
* lowered for cuda, each piece's all_to_all depends on nothing of the next piece's FFT, so that
  XLA's asynchronous collectives can overlap them (the default GPU program, unpipelined, is
  the StableHLO fixture's: tests/test_hlo.py);
* "auto" pipelines only across nodes on CPUs with large blocks; bad values and
  `pipeline=True` with one piece are refused, naming the arguments.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import MPIRUN, make_mesh, put_global, random_field, to_numpy, tol
from pencilfft._transforms import kernel as _kernel, plan as _plan

SHAPE = (16, 16, 16)


def _exchange(asked: str) -> str:
    """The exchange a test runs: `asked` across processes; in one process XLA's collectives
    (the path of GPUs and of pipeline=True elsewhere), since nothing else crosses devices."""
    return asked if jax.process_count() > 1 else "alltoall"


@MPIRUN  # the MPI exchange in two parts runs only across processes
@pytest.mark.parametrize("asked", ["mpi", "mixed"])
@pytest.mark.parametrize("layout,chunks,real", [("transposed", 4, False), ("natural", 3, False),
                                                ("transposed", 4, True)],
                         ids=["transposed-even", "natural-uneven", "r2c"])
def test_pipelined_gives_the_unpipelined_values(asked, layout, chunks, real):
    exchange = _exchange(asked)
    if asked == "mixed" and jax.process_count() == 1:
        pytest.skip("one process: 'alltoall' is the case above")
    mesh = make_mesh((4, 2))
    data = random_field(SHAPE, np.float32 if real else np.complex64)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    fwd, inv = ((pencilfft.prfft3d, lambda k, **kw: pencilfft.pirfft3d(k, SHAPE, **kw)) if real
                else (pencilfft.pfft3d, pencilfft.pifft3d))

    def run(pipeline):
        kw = dict(exchange=exchange, layout=layout, chunks=chunks, pipeline=pipeline)
        f = jax.jit(lambda v: fwd(v, **kw))
        k = f(x)
        return f, to_numpy(k), to_numpy(jax.jit(lambda v: inv(v, **kw))(k))

    f, k1, back1 = run(True)
    _, k0, back0 = run(False)
    assert np.abs(k1 - k0).max() <= 1e-5 * np.abs(k0).max()
    assert np.abs(back1 - back0).max() <= 1e-5 * np.abs(data).max()
    spectrum = (np.fft.rfftn if real else np.fft.fftn)(data.astype(np.float64 if real else
                                                                   np.complex128))
    want = spectrum.transpose(1, 2, 0) if layout == "transposed" else spectrum
    got = k1[tuple(slice(0, n) for n in want.shape)]
    assert np.abs(got - want).max() / np.abs(want).max() < tol(np.complex64)
    assert np.abs(back1 - data).max() < 1e-4
    text = f.lower(x).as_text()
    if exchange == "alltoall":
        assert "all_to_all" in text and "pencilfft_mpi_exchange_start" not in text
    else:  # posted and awaited around the next piece's work (the loop holds one of each)
        assert "pencilfft_mpi_exchange_start" in text and "pencilfft_mpi_exchange_wait" in text
        if exchange == "mpi" and (layout, chunks, real) == ("transposed", 4, False):
            # with the FFTW kernel the pieces are read and written in the block (`_Windows`)
            windows = _kernel.WINDOW_TARGET in f.lower(x).compile().as_text()
            assert windows == (_kernel.kernel() == "fftw")


@MPIRUN  # grad and vmap through the MPI exchange in two parts
def test_pipelined_under_grad_and_vmap():
    exchange = _exchange("mixed")
    mesh = make_mesh((4, 2))
    data = random_field((2,) + SHAPE, np.complex64)
    x = put_global(data, NamedSharding(mesh, P(None, "x", "y")))

    def loss(pipeline):
        return jax.jit(jax.grad(lambda v: jnp.sum(jnp.abs(pencilfft.pfft3d(
            v, exchange=exchange, chunks=4, pipeline=pipeline)) ** 2)))

    with jax.set_mesh(mesh):
        g1, g0 = to_numpy(loss(True)(x)), to_numpy(loss(False)(x))
    assert np.abs(g1 - g0).max() <= 1e-5 * np.abs(g0).max()
    kb = to_numpy(jax.jit(jax.vmap(lambda v: pencilfft.pfft3d(
        v, exchange=exchange, chunks=4, pipeline=True)))(x))
    want = np.fft.fftn(data.astype(np.complex128), axes=(1, 2, 3)).transpose(0, 2, 3, 1)
    assert np.abs(kb - want).max() / np.abs(want).max() < tol(np.complex64)


@MPIRUN  # the memory of the MPI exchange in two parts, across processes
@pytest.mark.parametrize("kernel", ["fftw", "xla"])
def test_pipelined_memory_is_bounded(kernel, monkeypatch):
    """XLA's memory analysis of a 64^3 round trip in 8 pieces: what the pipelined program keeps
    beside its input and output is one piece more than the chunked plan's (the three slots
    where the chunked exchange holds two: the FFTW kernel reads and writes the pieces in the
    block itself; measured +1.01 with 4 devices a process, +1.00 with one).  With XLA's FFT the
    FFTs around the exchange take pieces of their own (+4: docs/howto/pipelining.md)."""
    if jax.process_count() == 1:
        pytest.skip("the MPI exchange in two parts runs across processes (mpirun steps)")
    if kernel == "fftw" and _kernel.kernel() != "fftw":
        pytest.skip("the FFTW kernel is not installed")
    monkeypatch.setenv("PENCILFFT_FFT_KERNEL", kernel)
    jax.clear_caches()  # (the kernel is chosen as the transform is traced)
    mesh = make_mesh((8, 1))
    x = jax.ShapeDtypeStruct((64, 64, 64), np.complex64,
                             sharding=pencilfft.real_space_sharding(mesh))

    def temp(pipeline):
        def f(v):
            k = pencilfft.pfft3d(v, exchange="mpi", chunks=8, pipeline=pipeline)
            return pencilfft.pifft3d(k, exchange="mpi", chunks=8, pipeline=pipeline)
        compiled = jax.jit(f).lower(x).compile()
        block = compiled.memory_analysis().output_size_in_bytes
        return compiled.memory_analysis().temp_size_in_bytes / (block / 8)  # in pieces

    plain, piped = temp(False), temp(True)
    assert piped <= plain + (1.1 if kernel == "fftw" else 4.1), (plain, piped)


def test_each_alltoall_is_independent_of_the_next_pieces_fft():
    """The GPUs' path (XLA's collectives): in the pipelined program each piece's all_to_all and
    the next piece's FFT share no data, so XLA can overlap them; and it lowers for cuda."""
    mesh = make_mesh((4, 2))
    x = jax.ShapeDtypeStruct(SHAPE, np.complex64, sharding=pencilfft.real_space_sharding(mesh))
    f = jax.jit(lambda v: pencilfft.pfft3d(v, exchange="alltoall", chunks=4, pipeline=True))
    stages = list(_pipelined_stages(jax.make_jaxpr(f)(x).jaxpr))
    assert len(stages) == 2  # the two exchanges of a pencil, each a pipelined stage
    for stage in stages:
        ancestors = _ancestors(stage)
        names = [e.primitive.name for e in stage.eqns]
        alltoalls = [i for i, name in enumerate(names) if name == "all_to_all"]
        ffts = [i for i, name in enumerate(names) if "fft" in name]
        assert len(alltoalls) == 4 and ffts, names  # 4 pieces
        # Each all_to_all but the last has an FFT after it that does not need it.
        overlapped = [a for a in alltoalls if any(f > a and a not in ancestors[f] for f in ffts)]
        assert set(alltoalls[:-1]) <= set(overlapped), (overlapped, alltoalls)
    cuda = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert cuda.count("all_to_all") >= 8


def _pipelined_stages(jaxpr):
    """The jaxprs of the pipelined stages (the primal of each `custom_jvp_call` inside the
    shard_map body), in program order."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "custom_jvp_call":
            yield eqn.params["call_jaxpr"].jaxpr
            continue
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                yield from _pipelined_stages(inner)


def _ancestors(jaxpr) -> list[set[int]]:
    """For each equation, the equations whose outputs it needs (transitively)."""
    made_by = {}
    out = []
    for i, eqn in enumerate(jaxpr.eqns):
        need = set()
        for v in eqn.invars:
            j = made_by.get(id(v))
            if j is not None:
                need |= {j} | out[j]
        out.append(need)
        for v in eqn.outvars:
            made_by[id(v)] = i
    return out


@pytest.mark.parametrize("value,error,message", [
    ("yes", ValueError, r"`pipeline` must be True, False or 'auto'; got 'yes'"),
    (1, TypeError, r"`pipeline` must be True, False or 'auto'; got 1"),
])
def test_a_bad_pipeline_is_refused(value, error, message):
    x = np.zeros((8, 8, 8), np.complex64)
    with pytest.raises(error, match=message):
        pencilfft.pfft3d(x, pipeline=value)


def test_pipeline_needs_pieces():
    x = np.zeros((8, 8, 8), np.complex64)
    with pytest.raises(ValueError, match=r"`pipeline`=True .* `chunks`=1 makes one piece"):
        pencilfft.pfft3d(x, pipeline=True, chunks=1)


@pytest.mark.parametrize("processes,platform,exchanges,block,hosts,want", [
    (2, "cpu", ("mpi", "mpi"), 8 << 20, ("node1", "node2"), True),
    (2, "cpu", ("mixed", "mixed"), 8 << 20, ("node1", "node2"), True),
    (2, "cpu", ("mpi", "mpi"), 8 << 20, ("node1", "node1"), False),  # one node: shared memory
    (2, "cpu", ("mpi", "mpi"), 8 << 20, None, False),  # hosts unknown (no MPI)
    (2, "cpu", ("mpi", "mpi"), (8 << 20) - 1, ("node1", "node2"), False),  # too small to pay
    (1, "cpu", ("local", "local"), 64 << 20, ("node1",), False),  # one process
    (2, "gpu", ("alltoall", "alltoall"), 64 << 20, ("node1", "node2"), False),  # GPUs
    (2, "cpu", ("alltoall", "alltoall"), 64 << 20, ("node1", "node2"), False),  # gloo
])
def test_auto_pipelines_across_nodes_on_cpus_with_large_blocks(monkeypatch, processes, platform,
                                                                exchanges, block, hosts, want):
    monkeypatch.setattr(_plan.jax, "process_count", lambda: processes)
    monkeypatch.setattr(_plan, "platform_of", lambda mesh: platform)
    monkeypatch.setattr(_plan, "process_hosts", lambda: hosts)
    # Each group along either axis: process 0's device and process 1's.
    monkeypatch.setattr(_plan._exchange, "process_groups", lambda mesh, name: ((0, 1),))
    mesh = make_mesh((4, 2))
    assert _plan.pipelined("auto", mesh, ("x", "y"), exchanges, block) is want
    assert _plan.pipelined(True, mesh, ("x", "y"), exchanges, 0) is True
    assert _plan.pipelined(False, mesh, ("x", "y"), ("mpi", "mpi"), 1 << 30) is False


@pytest.mark.parametrize("block,peers,pieces", [
    (8 << 20, 2, 16), (16 << 20, 2, 32), (32 << 20, 2, 64), (64 << 20, 2, 128),
    (1 << 30, 2, 128),
    (32 << 20, 4, 32), (64 << 20, 8, 32), (8 << 20, 8, 16),  # messages of 256 KiB or more
])
def test_auto_cuts_pieces_of_half_a_mebibyte(block, peers, pieces):
    """A piece whose buffers stay in the cache through its FFT, pack and unpack costs less:
    "auto" takes pieces of about 512 KiB, 16 to 128 of them, with no message under 256 KiB
    while more than 16 (benchmarks/RESULTS.md)."""
    assert _plan.pipeline_pieces(block, peers) == pieces


@MPIRUN  # the MPI library is loaded only where MPI runs
def test_the_progress_threads_interval_is_set_and_read_back():
    if jax.process_count() == 1:
        pytest.skip("the MPI exchange runs across processes (mpirun steps)")
    from pencilfft._exchange import mpi
    before = mpi.poll_interval_us(50)
    try:
        assert mpi.poll_interval_us() == 50
    finally:
        assert mpi.poll_interval_us(before) == 50
    assert mpi.poll_interval_us() == before


@pytest.mark.parametrize("name,value", [("PENCILFFT_MPI_POLL_US", "fast"),
                                        ("PENCILFFT_MPI_POLL_US", "-5"),
                                        ("PENCILFFT_LOCAL_TIMEOUT", "ten")])
def test_a_bad_exchange_setting_is_refused_naming_it(monkeypatch, name, value):
    """The exchanges' C++ reads these when its library loads and would take its default for a
    value it cannot read; the program is refused where it is lowered instead, naming the
    variable and the value."""
    from pencilfft._exchange import _common
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"{name} must be .*got '{value}'"):
        _common.check_number_setting(name, whole=name.endswith("_US"), meaning="a test's")
    if name == "PENCILFFT_LOCAL_TIMEOUT":  # through the exchange's own lowering
        mesh = make_mesh((8, 1))
        x = jax.ShapeDtypeStruct(SHAPE, np.complex64, sharding=pencilfft.real_space_sharding(mesh))
        with pytest.raises(ValueError, match=name):
            jax.jit(lambda v: pencilfft.pfft3d(v, exchange="local")).lower(x).compile()
    monkeypatch.setenv(name, "7")
    _common.check_number_setting(name, whole=True, meaning="a test's")  # (accepted)
