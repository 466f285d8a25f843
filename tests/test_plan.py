"""Static planning: the exchange algorithm "auto" picks, and the padded k-space shapes."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from conftest import make_mesh
from pencilfft._exchange import local as _local_exchange
from pencilfft._transforms.plan import PAIRWISE_MIN_BYTES, _exchanges, plan_forward


@pytest.mark.parametrize("pdims,block,expected", [
    ((4, 2), PAIRWISE_MIN_BYTES, ("pairwise", "pairwise")),
    ((2, 4), PAIRWISE_MIN_BYTES * 4, ("pairwise", "pairwise")),
    ((4, 2), PAIRWISE_MIN_BYTES - 1, ("alltoall", "alltoall")),  # small blocks: one collective
    ((8, 1), PAIRWISE_MIN_BYTES, ("alltoall", "alltoall")),  # 8 peers: all_to_all measured faster
    ((1, 8), PAIRWISE_MIN_BYTES, ("alltoall", "alltoall")),
])
@pytest.mark.usefixtures("xla_collectives")  # where the local exchange does not run
def test_auto_exchange_on_cpu(pdims, block, expected):
    assert _exchanges("auto", make_mesh(pdims), pdims, block) == expected


@pytest.mark.parametrize("pdims", [(4, 2), (1, 8)])
def test_auto_takes_the_local_exchange_in_one_process(pdims):
    local = jax.process_count() == 1 and _local_exchange.unavailable_reason(8, "cpu") is None
    got = _exchanges("auto", make_mesh(pdims), pdims, PAIRWISE_MIN_BYTES)
    assert (got == ("local", "local")) == local


@pytest.mark.parametrize("choice", ["alltoall", "pairwise"])
def test_explicit_exchange_is_kept(choice):
    assert _exchanges(choice, make_mesh((4, 2)), (4, 2), 0) == (choice, choice)


@pytest.mark.parametrize("shape,pdims,real,k_shape", [
    ((16, 32, 64), (4, 2), False, (32, 64, 16)),  # divides everywhere: exact
    ((16, 30, 64), (4, 2), False, (32, 64, 16)),  # Y=30 padded to a multiple of 4
    ((16, 32, 64), (4, 2), True, (32, 34, 16)),  # Z//2+1 = 33 padded to a multiple of 2
    ((40, 12, 9), (8,), True, (16, 5, 40)),  # 1-axis mesh: Z whole, Y padded to 16
])
def test_padded_k_shapes(shape, pdims, real, k_shape):
    x = np.zeros(shape, np.float32 if real else np.complex64)
    plan = plan_forward(x, norm="backward", layout="transposed", mesh=make_mesh(pdims), real=real)
    assert plan.k_shape == k_shape
    assert plan.padded == (k_shape != plan.exact_k_shape)
