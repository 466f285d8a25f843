"""The forward transform as a list of stages, and each stage's inverse (per-device, no mesh)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_mesh
from pencilfft._transforms.plan import plan_forward
from pencilfft._transforms.chunks import stages_of
from pencilfft._transforms.stages import Exchange, Fft, Move, Pad, Truncate


@pytest.mark.parametrize("exchange,inverse", [
    (Exchange("y", 2, split=3, gather=2, order=(0, 1, 3, 2)), (3, 2, (0, 1, 3, 2))),  # pencil, b
    (Exchange("x", 4, split=3, gather=1, order=(0, 3, 2, 1)), (3, 1, (0, 3, 2, 1))),  # pencil, a
    (Exchange("x", 8, split=2, gather=1, order=(0, 2, 3, 1)), (3, 1, (0, 3, 1, 2))),  # slab
])
def test_inverse_exchange_splits_what_was_gathered(exchange, inverse):
    inv = exchange.inverse()
    assert (inv.split, inv.gather, inv.order) == inverse
    assert (inv.axis_name, inv.n, inv.algorithm) == (exchange.axis_name, exchange.n, exchange.algorithm)
    assert inv.inverse() == exchange


@pytest.mark.parametrize("pdims,layout,real,exchange,kinds", [
    ((4, 2), "transposed", False, "alltoall", "F E F E F"),  # a Pad only where the mesh needs
    ((4, 2), "natural", True, "alltoall", "F P E F E F M"),  # one: Z//2+1 = 9 padded to 10 (b=2)
    ((8, 1), "transposed", False, "alltoall", "F E F"),
    ((8,), "natural", True, "alltoall", "F E F M"),
    ((1, 8), "transposed", False, "alltoall", "F E F M"),  # a slab over Y: one exchange, one move
    ((1, 8), "natural", True, "alltoall", "F P E F M"),
    ((1, 8), "transposed", False, "local", "F E F"),  # the local exchange writes the layout
    ((1, 8), "natural", True, "local", "F P E F"),
])
def test_stage_lists(pdims, layout, real, exchange, kinds):
    x = np.zeros((16, 16, 16), np.float32 if real else np.complex64)
    try:
        plan = plan_forward(x, norm="backward", layout=layout, mesh=make_mesh(pdims), real=real,
                            exchange=exchange)
    except ValueError as e:  # "local" under mpirun
        assert exchange == "local" and "cannot run here" in str(e)
        pytest.skip(str(e))
    letter = {Fft: "F", Pad: "P", Exchange: "E", Move: "M"}
    assert " ".join(letter[type(s)] for s in stages_of(plan)) == kinds
    ffts = [s for s in stages_of(plan) if isinstance(s, Fft)]
    # only the first is r2c, and only along its last axis (Z)
    assert [s.kinds[-1] == "rfft" for s in ffts] == [real] + [False] * (len(ffts) - 1)
    assert all("rfft" not in s.kinds[:-1] for s in ffts)


@pytest.mark.parametrize("stage,shape", [
    (Fft((3,), ("fft",), (5,), "backward"), (2, 3, 4, 5)),
    (Fft((2, 3), ("fft", "rfft"), (4, 6), "ortho"), (2, 3, 4, 6)),
    (Fft((1, 2, 3), ("fft", "fft", "rfft"), (3, 4, 5), "forward"), (2, 3, 4, 5)),
    (Fft((2, 3), ("dct2", "fft"), (4, 5), "backward"), (2, 3, 4, 5)),
    (Fft((1, 2, 3), ("dst1", "dct4", "rfft"), (3, 4, 6), "ortho"), (2, 3, 4, 6)),
    (Fft((1, 3), ("dct1", "dst3"), (3, 5), "backward"), (2, 3, 4, 5)),
    # the one-device transform writing the transposed layout itself (issue 43)
    (Fft((1, 2, 3), ("fft", "fft", "fft"), (3, 4, 5), "forward", (0, 2, 3, 1)), (2, 3, 4, 5)),
    (Fft((1, 2, 3), ("fft", "fft", "rfft"), (3, 4, 6), "ortho", (0, 2, 3, 1)), (2, 3, 4, 6)),
    (Fft((2, 3), ("dct2", "fft"), (4, 5), "backward", (0, 3, 1, 2)), (2, 3, 4, 5)),
    (Pad(3, 5, 8), (2, 3, 4, 5)),
    (Move(3, 1), (2, 3, 4, 5)),
    (Truncate(3, 12, 8, False, 8 / 12), (2, 3, 4, 8)),  # even N: the Nyquist mode split
    (Truncate(2, 9, 5, False, 1.0), (2, 3, 5, 5)),  # odd N
    (Truncate(3, 12, 8, True, 0.5), (2, 3, 4, 5)),  # half spectrum: rfft of 12 -> of 8
    (Exchange(None, 1, split=3, gather=1, order=(0, 3, 2, 1)), (2, 3, 4, 5)),  # n = 1: a transpose
])
def test_backward_stage_undoes_forward_stage(stage, shape):
    rng = np.random.default_rng(0)
    real = isinstance(stage, Fft) and stage.kinds[-1] == "rfft"
    x = rng.standard_normal(shape)
    if not real:
        x = x + 1j * rng.standard_normal(shape)
    x = jnp.asarray(x)
    if isinstance(stage, Truncate):  # backward then forward: the spectrum comes back
        if stage.half:  # (with a real Nyquist on a half spectrum, as a real field has)
            x = x.at[..., -1].set(x[..., -1].real)
        np.testing.assert_allclose(np.asarray(stage.forward(stage.backward(x))), np.asarray(x),
                                   rtol=0, atol=1e-12)
        return
    y = stage.forward(x)
    assert y.shape != x.shape or isinstance(stage, Fft) and not real
    np.testing.assert_allclose(np.asarray(stage.backward(y)), np.asarray(x), rtol=0, atol=1e-12)
