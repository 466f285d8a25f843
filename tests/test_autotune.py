"""autotune: times every mesh shape and exchange, returns the fastest, the same on every rank."""
from __future__ import annotations

import numpy as np
import pytest

import pencilfft
from conftest import put_global, rel_err, to_numpy, tol
from test_fft import random_field, reference


@pytest.mark.parametrize("dtype", [np.complex64, np.float32])
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


def test_autotune_skips_meshes_the_grid_does_not_fit():
    tuning = pencilfft.autotune((4, 16, 8), pdims=[(4, 2), (8, 1)], exchanges=("alltoall",),
                                repeats=1)
    assert set(tuning.timings) == {((4, 2), "alltoall")}  # X=4 cannot split 8 ways


@pytest.mark.parametrize("kwargs,message", [
    (dict(shape=(3, 3, 8)), r"fits no candidate mesh of 8 devices"),
    (dict(shape=(8, 8)), r"`shape` must have at least 3 dimensions"),
    (dict(shape=(8, 8, 8), repeats=0), r"`repeats` must be at least 1"),
])
def test_autotune_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pencilfft.autotune(**kwargs)
