"""The forward transform as a list of stages, and each stage's inverse (per-device, no mesh)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_mesh
from pencilfft._fft import backward_stage, forward_stage
from pencilfft._plan import plan_forward
from pencilfft._stages import Exchange, Fft, Move, Pad


@pytest.mark.parametrize("exchange,inverse", [
    (Exchange(1, 2, split=3, gather=2, order=(0, 1, 3, 2)), (3, 2, (0, 1, 3, 2))),  # pencil, b
    (Exchange(0, 4, split=3, gather=1, order=(0, 3, 2, 1)), (3, 1, (0, 3, 2, 1))),  # pencil, a
    (Exchange(0, 8, split=2, gather=1, order=(0, 2, 3, 1)), (3, 1, (0, 3, 1, 2))),  # slab
])
def test_inverse_exchange_splits_what_was_gathered(exchange, inverse):
    inv = exchange.inverse()
    assert (inv.split, inv.gather, inv.order) == inverse
    assert (inv.mesh_axis, inv.n) == (exchange.mesh_axis, exchange.n)
    assert inv.inverse() == exchange


@pytest.mark.parametrize("pdims,layout,real,kinds", [
    ((4, 2), "transposed", False, "F P E F P E F"),
    ((4, 2), "natural", True, "F P E F P E F M"),
    ((8, 1), "transposed", False, "F P E F"),
    ((8,), "natural", True, "F P E F M"),
    ((1, 8), "transposed", False, "F P E F M"),  # a slab over Y: one exchange, one move
    ((1, 8), "natural", True, "F P E F M"),
])
def test_stage_lists(pdims, layout, real, kinds):
    x = np.zeros((16, 16, 16), np.float32 if real else np.complex64)
    plan = plan_forward(x, norm="backward", layout=layout, mesh=make_mesh(pdims), real=real)
    letter = {Fft: "F", Pad: "P", Exchange: "E", Move: "M"}
    assert " ".join(letter[type(s)] for s in plan.stages) == kinds
    ffts = [s for s in plan.stages if isinstance(s, Fft)]
    assert [s.real for s in ffts] == [real] + [False] * (len(ffts) - 1)  # only the first is r2c


@pytest.mark.parametrize("stage,shape", [
    (Fft((3,)), (2, 3, 4, 5)),
    (Fft((2, 3), real=True, sizes=(4, 6)), (2, 3, 4, 6)),
    (Fft((1, 2, 3), real=True, sizes=(3, 4, 5)), (2, 3, 4, 5)),
    (Pad(3, 5, 8), (2, 3, 4, 5)),
    (Move(3, 1), (2, 3, 4, 5)),
    (Exchange(0, 1, split=3, gather=1, order=(0, 3, 2, 1)), (2, 3, 4, 5)),  # n = 1: a transpose
])
def test_backward_stage_undoes_forward_stage(stage, shape):
    plan = plan_forward(np.zeros((4, 4, 4), np.complex64), norm="backward", layout="transposed",
                        mesh=None, real=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    if not (isinstance(stage, Fft) and stage.real):
        x = x + 1j * rng.standard_normal(shape)
    x = jnp.asarray(x)
    y = forward_stage(plan, stage, x)
    assert y.shape != x.shape or isinstance(stage, Fft) and not stage.real
    np.testing.assert_allclose(np.asarray(backward_stage(plan, stage, y)), np.asarray(x),
                               rtol=0, atol=1e-12)
