"""Consecutive local exchanges in one pass (`_exchange.reshard`, the `Reshard` stage).

The primitive moves a block between any two even layouts of the same global array (the global
array comes back bit for bit, in any block axis order), under vmap, and its transpose is its
adjoint; on other platforms it lowers to the exchanges it replaces.  Through the transforms: the
N-D routes with runs of local exchanges (a brick's) give the same bits as the same routes
exchange by exchange, and the program holds the reshard where the route had the run.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
from conftest import MULTI_PROCESS, put_global, random_field
from pencilfft._exchange import reshard as _reshard
from pencilfft._transforms import stages as _stages
from pencilfft._transforms.partitioned import with_mesh

pytestmark = pytest.mark.skipif(MULTI_PROCESS, reason="one process holds every device")

SIZES = (("a", 2), ("b", 2), ("c", 2))
BRICK = (("a",), ("b",), ("c",))
# (out spec, out block order): a slab with Y and Z last, a pencil, the brick in another order,
# a batch-like split of two axes over one array axis
CASES = [((("a", "b", "c"), (), ()), (1, 2, 0)), (((), ("b", "a"), ("c",)), (0, 1, 2)),
         ((("c",), ("a",), ("b",)), (2, 0, 1)), ((("b",), (), ("c", "a")), (1, 0, 2))]


def _pspec(spec) -> P:
    return P(*(None if not s else s[0] if len(s) == 1 else s for s in spec))


def _body(out_spec, out_perm):
    """The global array, resharded from the brick to (out_spec, out_perm) and put back in its
    global axis order: the identity of global arrays."""
    moved = tuple(m for m, _ in SIZES if any(m in s for s in out_spec) and
                  [m in s for s in out_spec] != [m in s for s in BRICK])

    def f(block):
        y = _reshard.reshard(block, moved, BRICK, (0, 1, 2), out_spec, out_perm, ())
        return jnp.transpose(y, tuple(np.argsort(out_perm)))
    return f


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Explicit,) * 3)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_any_layout_to_any_other_keeps_the_array(mesh, case):
    out_spec, out_perm = case
    data = random_field((8, 12, 16), np.complex64, 3)
    x = put_global(data, NamedSharding(mesh, _pspec(BRICK)))
    f = jax.jit(jax.shard_map(with_mesh(_body(out_spec, out_perm), mesh), mesh=mesh,
                              in_specs=_pspec(BRICK), out_specs=_pspec(out_spec)))
    y = f(x)
    np.testing.assert_array_equal(np.asarray(y), data)
    assert _reshard.RESHARD_TARGET in f.lower(x).compile().as_text()


def test_vmap_and_its_transpose_is_its_adjoint(mesh):
    out_spec, out_perm = CASES[0]
    body = _body(out_spec, out_perm)
    data = random_field((3, 8, 12, 16), np.float32, 4)
    x = put_global(data, NamedSharding(mesh, P(None, *_pspec(BRICK))))
    f = jax.jit(jax.shard_map(with_mesh(jax.vmap(body), mesh), mesh=mesh,
                              in_specs=P(None, *_pspec(BRICK)),
                              out_specs=P(None, *_pspec(out_spec))))
    np.testing.assert_array_equal(np.asarray(f(x)), data)
    w = put_global(random_field((3, 8, 12, 16), np.float32, 5),
                   NamedSharding(mesh, P(None, *_pspec(out_spec))))
    (back,) = jax.linear_transpose(f, x)(w)
    lhs = float(np.vdot(np.asarray(f(x), np.float64), np.asarray(w, np.float64)))
    rhs = float(np.vdot(np.asarray(x, np.float64), np.asarray(back, np.float64)))
    assert abs(lhs - rhs) <= 1e-5 * abs(lhs)
    assert back.sharding.spec == x.sharding.spec


@pytest.mark.parametrize("target", [P("a", "b", "c"), P(None, "a", ("b", "c")), None],
                         ids=["brick", "natural pencil", "default"])
def test_routes_in_one_pass_give_the_same_bits(mesh, target):
    """Against the same route through XLA's all_to_all, one exchange at a time (the local
    exchange alone equals it bit for bit: tests/test_local_exchange.py)."""
    data = random_field((8, 12, 16), np.complex64, 6)
    x = put_global(data, NamedSharding(mesh, P("a", "b", "c")))

    def round_trip(exchange):
        return jax.jit(lambda v: pencilfft.ifftn(
            pencilfft.fftn(v, out_sharding=target, exchange=exchange),
            out_sharding=P("a", "b", "c"), exchange=exchange))

    f, g = round_trip("auto"), round_trip("alltoall")
    text = f.lower(x).compile().as_text()
    assert _reshard.RESHARD_TARGET not in g.lower(x).compile().as_text()
    fused = np.asarray(f(x))
    np.testing.assert_array_equal(fused, np.asarray(g(x)))
    if target == P("a", "b", "c"):  # (a: 0->1, then three and two exchanges in one) each way
        assert text.count(f'custom_call_target="{_reshard.RESHARD_TARGET}"') == 4
    np.testing.assert_allclose(fused, data, rtol=0, atol=1e-5 * np.abs(data).max())


def test_other_platforms_lower_to_the_exchanges(mesh):
    """Lowered for GPUs the route runs XLA's all_to_alls (the N-D routes take XLA's collectives
    there, so no reshard is planned at all), and the primitive itself lowers to them too."""
    spec = P("a", "b", "c")
    x = jax.ShapeDtypeStruct((8, 12, 16), np.complex64, sharding=NamedSharding(mesh, spec))
    f = jax.jit(lambda v: pencilfft.fftn(v, out_sharding=spec))
    text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert "all_to_all" in text and _reshard.RESHARD_TARGET not in text
    stage = _stages.Reshard(
        (_stages.Exchange("b", 2, 0, 1, (0, 1, 2), "local"),
         _stages.Exchange("c", 2, 0, 2, (0, 1, 2), "local")),
        BRICK, (0, 1, 2), (("a", "b", "c"), (), ()), (0, 1, 2))
    g = jax.jit(jax.shard_map(with_mesh(stage.forward, mesh), mesh=mesh, in_specs=spec,
                              out_specs=P(("a", "b", "c"))))
    text = g.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("all_to_all") >= 2 and _reshard.RESHARD_TARGET not in text
