"""autotune: times every mesh shape and exchange, returns the fastest, the same on every rank."""
from __future__ import annotations

import numpy as np
import pytest

import pencilfft
from conftest import MPIRUN, put_global, random_field, reference, rel_err, to_numpy, tol


# Under mpirun: autotune times and checks its candidates across processes.
@pytest.mark.parametrize("dtype", [pytest.param(np.complex64, marks=MPIRUN), np.float32])
def test_autotune_returns_a_working_choice(dtype):
    shape = (8, 8, 8)
    tuning = pencilfft.autotune(shape, dtype=dtype, repeats=1, exchanges=("alltoall", "pairwise"))
    # every factorisation of 8 that splits (8, 8), times both exchanges
    assert set(tuning.timings) == {(p, e) for p in [(1, 8), (2, 4), (4, 2), (8, 1)]
                                   for e in ("alltoall", "pairwise")}
    assert all(t > 0 for t in tuning.timings.values())
    assert tuning.seconds == min(tuning.timings.values())
    assert tuning.timings[(tuning.pdims, tuning.exchange)] == tuning.seconds
    assert tuple(tuning.mesh.axis_sizes) == tuning.pdims
    x = random_field(shape, np.complex64)
    k = pencilfft.pfft3d(put_global(x, pencilfft.real_space_sharding(tuning.mesh)),
                         exchange=tuning.exchange)
    assert rel_err(to_numpy(k), reference(x, "transposed")) <= tol(np.complex64)


@MPIRUN  # batch meshes across processes
def test_autotune_keeps_batch_axes_and_tunes_the_pencil_ones():
    shape = (4, 8, 8, 8)
    tuning = pencilfft.autotune(shape, batch=(2,), repeats=1, exchanges=("alltoall",))
    assert set(tuning.timings) == {(p, "alltoall") for p in [(1, 4), (2, 2), (4, 1)]}
    assert tuple(tuning.mesh.axis_names) == ("batch", "x", "y")
    assert tuple(tuning.mesh.axis_sizes) == (2,) + tuning.pdims
    x = random_field(shape, np.complex64, seed=3)
    k = pencilfft.pfft3d(put_global(x, pencilfft.real_space_sharding(tuning.mesh)))
    assert k.sharding.spec[0] == "batch"
    assert rel_err(to_numpy(k), reference(x, "transposed")) <= tol(np.complex64)
    with pytest.raises(ValueError, match=r"`shape\[0\]` \(=3\) must be divisible by `batch\[0\]` \(=2\)"):
        pencilfft.autotune((3, 8, 8, 8), batch=(2,), repeats=1)
    with pytest.raises(ValueError, match=r"`batch` \(2, 2\) splits 2 leading axes"):
        pencilfft.autotune(shape, batch=(2, 2), repeats=1)


def test_autotune_skips_meshes_the_grid_does_not_fit():
    tuning = pencilfft.autotune((4, 16, 8), pdims=[(4, 2), (8, 1)], exchanges=("alltoall",),
                                repeats=1)
    assert set(tuning.timings) == {((4, 2), "alltoall")}  # X=4 cannot split 8 ways


@pytest.mark.parametrize("kwargs,message", [
    (dict(shape=(3, 3, 8)), r"fits no candidate mesh of 8 devices"),
    (dict(shape=(8, 8)), r"`shape` must have at least 3 dimensions"),
    (dict(shape=(8, 8, 8), repeats=0), r"`repeats` must be at least 1"),
    (dict(shape=(0, 8, 8)), r"`shape` must hold positive sizes; got \(0, 8, 8\)"),
    (dict(shape=(-8, 8, 8)), r"`shape` must hold positive sizes; got \(-8, 8, 8\)"),
    (dict(shape=(8, 8, 8), exchanges=()),
     r"`exchanges` must name at least one of \('auto', 'alltoall', 'pairwise', 'mpi', 'local', "
     r"'mixed'\); got \(\)"),
    (dict(shape=(8, 8, 8), exchanges=("alltoall", "fast")),
     r"`exchanges` entries must be in .*; got 'fast'"),
    (dict(shape=(8, 8, 8), devices=[]), r"`devices` must hold at least one jax device; got an "
                                        r"empty sequence"),
    (dict(shape=(8, 8, 8), pdims=[(4, 4)]), r"`pdims` must be a sequence of \(P, Q\) pairs with "
                                            r"P \* Q = 8.*; got the entry \(4, 4\) \(P \* Q = 16\)"),
    (dict(shape=(8, 8, 8), layout="natrual"), r"`layout` must be one of"),
])
def test_autotune_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pencilfft.autotune(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    (dict(shape=(8, 8, 8), repeats="3"), r"`repeats` must be an integer >= 1; got '3'"),
    (dict(shape=(8, 8, 8), repeats=2.0), r"`repeats` must be an integer >= 1; got 2.0"),
    (dict(shape=(8.0, 8, 8)), r"`shape` must hold integers; got \(8.0, 8, 8\)"),
    (dict(shape="888"), r"`shape` must be a sequence of at least 3 positive integers"),
    (dict(shape=(8, 8, 8), dtype=np.int32), r"`dtype` must be one of complex64, complex128, "
                                            r"float32, float64 .*; got <class 'numpy.int32'>"),
    (dict(shape=(8, 8, 8), dtype="bogus"), r"`dtype` must be one of .*; got 'bogus'"),
    (dict(shape=(8, 8, 8), exchanges="alltoall"), r"`exchanges` must be a sequence of exchange "
                                                  r"names"),
    (dict(shape=(8, 8, 8), pdims=(4, 2)), r"`pdims` must be a sequence of \(P, Q\) pairs .*; got "
                                          r"the entry 4 in \(4, 2\)"),
    (dict(shape=(8, 8, 8), pdims=[(8,)]), r"`pdims` .*; got the entry \(8,\)"),
    (dict(shape=(8, 8, 8), devices=["cpu:0"]), r"`devices` must hold jax devices"),
])
def test_autotune_bad_types(kwargs, message):
    with pytest.raises(TypeError, match=message):
        pencilfft.autotune(**kwargs)


def test_autotune_float64_needs_x64():
    import jax

    with jax.enable_x64(False):
        with pytest.raises(ValueError, match=r"`dtype` float64 needs 64-bit types"):
            pencilfft.autotune((8, 8, 8), dtype=np.float64)


def test_autotune_refuses_a_grid_too_big_for_memory():
    """8 EiB: refused from the sizes, before XLA tries to allocate it (it used to SIGABRT)."""
    with pytest.raises(pencilfft.MemoryLimitError, match=r"autotune: pfft3d/pifft3d of a .* needs about"):
        pencilfft.autotune((1 << 21, 1 << 21, 1 << 21), repeats=1)
