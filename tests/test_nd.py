"""jnp.fft's n-dimensional transforms on any sharding (issue 54): fftn, ifftn, rfftn, irfftn and
the 2-D forms, against numpy in float64, on slabs, fully split 2-D arrays, pencils, bricks in
any mesh-axis order, 4-D arrays with a split batch axis, axis subsets and one split axis alone;
the output sharding asked for, and no all-gather in any compiled program."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
from conftest import MPIRUN, put_global, random_field, to_numpy
from pencilfft._transforms import numpy_fft
from pencilfft._transforms.routes import find_route, route_text, spec_text

TOL = 2e-5  # complex64 against float64 numpy, relative to the largest entry

_MESHES = {}


def mesh_of(shape, names, auto: bool = False):
    key = (shape, names, auto)
    if key not in _MESHES:
        kind = AxisType.Auto if auto else AxisType.Explicit
        _MESHES[key] = jax.make_mesh(shape, names, axis_types=(kind,) * len(shape))
    return _MESHES[key]


# (id, mesh shape, mesh axis names, global shape, input spec, axes)
CASES = [
    ("slab2d", (8,), ("x",), (8, 16), P("x"), None),
    ("slab2d-cols", (8,), ("x",), (8, 16), P(None, "x"), None),
    ("split2d", (4, 2), ("x", "y"), (8, 16), P("x", "y"), None),
    ("split2d-yx", (4, 2), ("x", "y"), (8, 16), P("y", "x"), None),
    ("tuple2d", (4, 2), ("x", "y"), (16, 8), P(("x", "y")), None),
    ("pencil", (4, 2), ("x", "y"), (8, 8, 16), P("x", "y"), None),
    ("pencil-natural", (2, 4), ("x", "y"), (8, 8, 16), P(None, "x", "y"), None),
    ("brick-abc", (2, 2, 2), ("a", "b", "c"), (8, 8, 16), P("a", "b", "c"), None),
    ("brick-cab", (2, 2, 2), ("a", "b", "c"), (8, 8, 16), P("c", "a", "b"), None),
    ("brick-bca", (2, 2, 2), ("a", "b", "c"), (8, 8, 16), P("b", "c", "a"), None),
    ("batch4d", (2, 2, 2), ("c", "x", "y"), (2, 8, 8, 16), P("c", "x", "y"), (1, 2, 3)),
    ("brick4d", (2, 2, 2), ("a", "b", "c"), (4, 8, 8, 8), P(None, "a", "b", "c"), (1, 2, 3)),
    ("brick4d-all", (2, 2, 2), ("a", "b", "c"), (4, 8, 8, 8), P("a", "b", "c"), None),
    ("subset", (4, 2), ("x", "y"), (8, 8, 16), P("x", "y"), (0, 2)),
    ("one-split-axis", (8,), ("x",), (16, 8), P("x"), (0,)),
    ("padded-inside", (4, 2), ("x", "y"), (8, 10, 6), P("x", "y"), None),
]
IDS = [c[0] for c in CASES]
# Under jit (an Explicit mesh: the traced type names the split) a representative subset; under
# mpirun (the exchanges across processes) the brick and the batch.
JIT = {"slab2d", "split2d", "pencil", "brick-cab", "batch4d", "padded-inside"}
MODES = [pytest.param(case, mode, id=f"{case[0]}-{mode}",
                      marks=[MPIRUN] if mode == "eager" and case[0] in ("brick-cab", "batch4d")
                      else [])
         for case in CASES for mode in ("eager", "jit") if mode == "eager" or case[0] in JIT]


def _input(case, real: bool, seed: int = 0):
    _, mshape, names, shape, spec, axes = case
    mesh = mesh_of(mshape, names)
    data = random_field(shape, np.float32 if real else np.complex64, seed)
    return mesh, data, put_global(data, NamedSharding(mesh, spec)), axes


def _close(got, ref):
    got = to_numpy(got)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err < TOL, err


def _jitted(f, **kw):
    return jax.jit(lambda v: f(v, **kw))


def _apply(mode, f, a, **kw):
    return _jitted(f, **kw)(a) if mode == "jit" else f(a, **kw)


@pytest.mark.parametrize("case,mode", MODES)
def test_c2c_round_trip(case, mode):
    mesh, data, a, axes = _input(case, real=False)
    k = _apply(mode, pencilfft.fftn, a, axes=axes)
    _close(k, np.fft.fftn(data.astype(np.complex128), axes=axes))
    assert k.dtype == jnp.fft.fftn(jnp.zeros(1, data.dtype)).dtype
    assert k.sharding.mesh.shape == mesh.shape
    back = _apply(mode, pencilfft.ifftn, k, axes=axes, out_sharding=a.sharding)
    _close(back, data.astype(np.complex128))
    assert back.sharding.is_equivalent_to(a.sharding, a.ndim)


@pytest.mark.parametrize("case,mode", MODES)
def test_r2c_round_trip(case, mode):
    mesh, data, a, axes = _input(case, real=True)
    k = _apply(mode, pencilfft.rfftn, a, axes=axes)
    ref = np.fft.rfftn(data.astype(np.float64), axes=axes)
    _close(k, ref)
    s = tuple(data.shape[i] for i in (axes if axes is not None else range(data.ndim)))
    back = _apply(mode, pencilfft.irfftn, k, s=s, axes=axes, out_sharding=P(*a.sharding.spec))
    _close(back, data.astype(np.float64))
    assert back.dtype == np.float32
    assert back.sharding.is_equivalent_to(a.sharding, a.ndim)


ODD_MESHES = [((8,), ("x",), P("x")), ((4, 2), ("x", "y"), P("x", "y")),
              ((2, 4), ("x", "y"), P("y", "x")), ((2, 2, 2), ("a", "b", "c"), P("a", "b", "c"))]


@pytest.mark.parametrize("mesh_shape,names,spec", ODD_MESHES, ids=["8", "4x2", "2x4", "2x2x2"])
def test_odd_half_axis_has_jnp_shape(mesh_shape, names, spec):
    """An odd half length (9 -> 5, and 7 -> 4 from an odd real length) is jnp's, on every mesh;
    irfftn with `s` gives the odd real length back."""
    mesh = mesh_of(mesh_shape, names)
    for shape in [(8, 8, 8), (8, 8, 16)]:
        for z in (9, 7) if len(shape) else ():
            data = random_field(shape[:-1] + (z,), np.float32, 1)
            a = put_global(data, NamedSharding(mesh, P(*tuple(spec)[:2])))
            k = pencilfft.rfftn(a)
            assert k.shape == jnp.fft.rfftn(jnp.asarray(data)).shape == shape[:-1] + (z // 2 + 1,)
            _close(k, np.fft.rfftn(data.astype(np.float64)))
            back = pencilfft.irfftn(k, s=data.shape)
            assert back.shape == data.shape
            _close(back, data.astype(np.float64))


OUTS = [P("b", None, ("a", "c")), P(None, ("c", "b"), "a"), P(("a", "b", "c"), None, None)]


@pytest.mark.parametrize("named", [True, False], ids=["NamedSharding", "PartitionSpec"])
@pytest.mark.parametrize("out", OUTS, ids=["b-ac", "cb-a", "abc"])
def test_out_sharding_is_honoured(out, named):
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"))
    data = random_field((8, 8, 16), np.complex64, 2)
    a = put_global(data, NamedSharding(mesh, P("a", "b", "c")))
    target = NamedSharding(mesh, out)
    k = pencilfft.fftn(a, out_sharding=target if named else out)
    assert k.sharding.is_equivalent_to(target, 3) and k.sharding.spec == out
    _close(k, np.fft.fftn(data.astype(np.complex128)))


@pytest.mark.parametrize("auto", [False, True], ids=["explicit", "auto"])
@pytest.mark.parametrize("where", ["devices 4-7", "reversed"])
def test_out_sharding_on_other_devices_is_moved_there(where, auto):
    """Issue 68: an `out_sharding` on a mesh of the same axis names and sizes but of other
    devices (4-7 for an input on 0-3, or the same devices reversed) was ignored: the result
    stayed on the input's devices.  Eagerly it is moved there (block by block); under jax.jit,
    where a program runs on one set of devices, jax refuses it when it compiles, as it refuses
    jax.device_put onto other devices there, naming pencilfft's step."""
    devices = np.array(jax.devices()[:8])
    kind = (AxisType.Auto if auto else AxisType.Explicit,) * 2
    here = jax.sharding.Mesh(devices[:4].reshape(2, 2), ("x", "y"), axis_types=kind)
    there = devices[4:] if where == "devices 4-7" else devices[:4][::-1]
    there = jax.sharding.Mesh(there.reshape(2, 2), ("x", "y"), axis_types=kind)
    data = random_field((8, 8, 8), np.complex64, 11)
    a = put_global(data, NamedSharding(here, P("x", "y")))
    target = NamedSharding(there, P(None, "x", "y"))
    k = pencilfft.fftn(a, out_sharding=target)
    assert k.sharding.is_equivalent_to(target, 3)
    assert [s.device.id for s in k.addressable_shards] == [d.id for d in there.devices.flat]
    _close(k, np.fft.fftn(data.astype(np.complex128)))
    with pytest.raises(ValueError, match=r"incompatible devices.* \(_to_out_sharding\)"):
        jax.jit(lambda v: pencilfft.fftn(v, out_sharding=target))(a)


# jnp.fft's results over no axes (issue 68: rfftn and irfftn raised an IndexError): its input
# cast (to complex; rfftn: to a real inexact dtype, half precision kept), and irfftn with
# `s` = () crops the last axis to n // 2 + 1 as jnp does.
NO_AXES = [("fftn", {"axes": ()}, np.float32), ("ifftn", {"axes": ()}, np.int32),
           ("rfftn", {"axes": ()}, np.float32), ("rfftn", {"axes": ()}, np.float16),
           ("irfftn", {"axes": ()}, np.float32), ("irfftn", {"s": ()}, np.complex64)]


@pytest.mark.parametrize("name,kw,dtype", NO_AXES,
                         ids=[f"{n}-{next(iter(k))}-{np.dtype(d).name}" for n, k, d in NO_AXES])
def test_no_axes_is_jnps_result(name, kw, dtype):
    mesh = mesh_of((4, 2), ("x", "y"))
    data = (np.arange(8 * 4 * 6).reshape(8, 4, 6) % 7).astype(dtype)
    want = getattr(jnp.fft, name)(data, **kw)
    for a in (data, put_global(data, NamedSharding(mesh, P("x", "y")))):
        got = getattr(pencilfft, name)(a, **kw)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(to_numpy(got), np.asarray(want))


@pytest.mark.parametrize("func", ["rfftn", "rfft2"])
@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16], ids=["float16", "bfloat16"])
def test_half_precision_rfftn_is_refused_as_jnp_refuses_it(func, dtype):
    """Issue 68: rfftn of float16 or bfloat16 returned complex64 where jnp raises."""
    data = np.ones((4, 4, 8), dtype)
    with pytest.raises(ValueError) as jnps:
        getattr(jnp.fft, func)(data)
    with pytest.raises(ValueError, match=re.escape(str(jnps.value)) + r": `a` of " + func):
        getattr(pencilfft, func)(data)


@pytest.mark.parametrize("axes", [(), (0,), (0, 1, 2)])
def test_the_2d_forms_take_two_axes_as_jnps(axes):
    with pytest.raises(ValueError, match="only supports 2 axes"):
        jnp.fft.fft2(np.ones((4, 4, 4), np.complex64), axes=axes)
    for func in ("fft2", "irfft2"):
        with pytest.raises(ValueError, match=rf"`axes` = {re.escape(str(axes))}: {func} "
                                             rf"transforms 2 axes"):
            getattr(pencilfft, func)(np.ones((4, 4, 4), np.complex64), axes=axes)


def test_default_layouts_and_their_exchanges():
    """The layouts docs/howto/any-layout.md lists: the cheapest fully distributed one."""
    rows = [
        (((8,), ("x",)), (16, 32), P("x"), P(None, "x"), 1),
        (((4, 2), ("x", "y")), (8, 8, 16), P("x", "y"), P(None, "x", "y"), 2),
        (((4, 2), ("x", "y")), (8, 16), P("x", "y"), P(None, ("y", "x")), 3),
        (((2, 2, 2), ("a", "b", "c")), (8, 8, 16), P("a", "b", "c"),
         P(("a", "b", "c"), None, None), 4),
    ]
    for (mshape, names), shape, spec, out, exchanges in rows:
        mesh = mesh_of(mshape, names)
        call = numpy_fft._call(np.zeros(shape, np.complex64), None, None, None, "c2c", False,
                               "fftn", numpy_fft._all_axes, "alltoall")
        in_spec = numpy_fft._spec_tuple(spec, len(shape), dict(mesh.shape), "a")
        route = find_route(call.problem(dict(mesh.shape), in_spec, None, True))
        assert numpy_fft.partition_spec(route.spec) == out and route.exchanges == exchanges
        a = put_global(np.zeros(shape, np.complex64), NamedSharding(mesh, spec))
        assert pencilfft.fftn(a).sharding.spec == out


_COLLECTIVES = r" (all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)[(-]"


SCOPE_CASES = [(CASES[2], P("y", "x")), (CASES[7], P("c", "b", "a")),
               (CASES[10], P("y", "c", "x", None)), (CASES[15], P(("x", "y"), None, None))]


@pytest.mark.parametrize("case,out_spec", [pytest.param(*c, marks=[MPIRUN] if i == 1 else [])
                                           for i, c in enumerate(SCOPE_CASES)],
                         ids=[c[0][0] for c in SCOPE_CASES])
def test_no_all_gather_with_nothing_in_scope(case, out_spec):
    """jit on an Auto mesh with no mesh in scope (XLA's partitioner tells the layout): the
    values, and no collective but all-to-alls (and the collective permute of a swap of two
    mesh axes), back to the input's sharding and to an asked one."""
    _, mshape, names, shape, spec, axes = case
    mesh = mesh_of(mshape, names, auto=True)
    data = random_field(shape, np.complex64, 3)
    a = put_global(data, NamedSharding(mesh, spec))
    ref = np.fft.fftn(data.astype(np.complex128), axes=axes)
    for out in (None, out_spec):
        f = jax.jit(lambda v: pencilfft.fftn(v, axes=axes, out_sharding=out, exchange="alltoall"))
        k = f(a)
        _close(k, ref)
        expected = NamedSharding(mesh, out if out is not None else spec)
        assert k.sharding.is_equivalent_to(expected, len(shape))
        ops = set(re.findall(_COLLECTIVES, f.lower(a).compile().as_text()))
        assert ops <= {"all-to-all", "collective-permute"}, ops


def test_uneven_half_axis_with_nothing_in_scope():
    """jit on an Auto brick with nothing in scope, where the half axis (Z // 2 + 1 = 9) keeps
    Z's split over a mesh axis of 2: XLA's tiling of that uneven split (blocks of 5, the last
    padded) between rfftn and irfftn, and in the gradient; no gather, the input's sharding."""
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"), auto=True)
    data = random_field((8, 8, 16), np.float32, 9)
    a = put_global(data, NamedSharding(mesh, P("a", "b", "c")))
    round_trip = jax.jit(lambda v: pencilfft.irfftn(pencilfft.rfftn(v) * 2, s=v.shape))
    grad = jax.jit(jax.grad(lambda v: jnp.sum(jnp.abs(pencilfft.rfftn(v)) ** 2)))
    want = jax.grad(lambda v: jnp.sum(jnp.abs(jnp.fft.rfftn(v)) ** 2))(data)
    for f, ref in ((round_trip, 2 * data.astype(np.float64)), (grad, np.asarray(want))):
        y = f(a)
        _close(y, ref)
        assert y.sharding.is_equivalent_to(NamedSharding(mesh, P("a", "b", "c")), 3)
        assert "all-gather" not in set(re.findall(_COLLECTIVES, f.lower(a).compile().as_text()))


def test_explicit_mesh_under_set_mesh():
    mesh = mesh_of((4, 2), ("x", "y"))
    data = random_field((8, 8, 16), np.float32, 4)
    a = put_global(data, NamedSharding(mesh, P("x", "y")))
    with jax.set_mesh(mesh):
        f = jax.jit(lambda v: pencilfft.rfftn(v, out_sharding=P("y", "x")))
        k = f(a)
        assert k.sharding.is_equivalent_to(NamedSharding(mesh, P("y", "x")), 3)
        assert not set(re.findall(_COLLECTIVES, f.lower(a).compile().as_text())) - {"all-to-all"}
        y = pencilfft.irfftn(k, s=data.shape, out_sharding=P("x", "y"))
    _close(k, np.fft.rfftn(data.astype(np.float64)))
    _close(y, data.astype(np.float64))


@pytest.mark.parametrize("auto", [False, True], ids=["explicit", "auto"])
def test_grad_vmap_jvp(auto):
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"), auto=auto)
    data = random_field((8, 8, 16), np.complex64, 5)
    a = put_global(data, NamedSharding(mesh, P("a", "b", "c")))
    ref = np.fft.fftn(data.astype(np.complex128))
    for chunks in (1, 2):  # in pieces too (a loop that jax transposes)
        loss = lambda v: jnp.sum(jnp.abs(pencilfft.fftn(v, chunks=chunks)) ** 2)  # noqa: E731
        g = jax.jit(jax.grad(loss))(a)  # of N |x|^2 (Parseval): 2 N conj(x) by jax's convention
        _close(g, 2 * data.size * np.conj(data.astype(np.complex128)))
    t = jax.jit(lambda v: jax.jvp(pencilfft.fftn, (v,), (2 * v,))[1])(a)
    _close(t, 2 * ref)
    stack = put_global(np.stack([data, 2 * data]), NamedSharding(mesh, P(None, "a", "b", "c")))
    v = jax.jit(jax.vmap(pencilfft.fftn))(stack)
    _close(v, np.stack([ref, 2 * ref]))


@pytest.mark.parametrize("auto", [False, True], ids=["explicit", "auto"])
def test_two_meshes_in_one_jit(auto):
    """Issue 68: a brick on a (2, 2, 2) mesh and a pencil on a (4, 2) mesh of the same devices
    in one jax.jit.  On Explicit meshes each transform runs in shard_map on its own mesh: both
    right.  On Auto meshes the transforms go through jax's custom_partitioning, which jax
    lowers on one mesh per program: refused at the call, naming both meshes and the ways out
    (before: jax's "mesh should be the same across the entire program", at lowering)."""
    brick, pencil = mesh_of((2, 2, 2), ("a", "b", "c"), auto), mesh_of((4, 2), ("x", "y"), auto)
    data = random_field((8, 8, 8), np.complex64, 12)
    a = put_global(data, NamedSharding(brick, P("a", "b", "c")))
    b = put_global(data, NamedSharding(pencil, P("x", "y")))
    both = jax.jit(lambda u, v: (pencilfft.fftn(u), pencilfft.fftn(v)))
    if auto:
        with pytest.raises(ValueError, match=r"the arguments of this jax.jit are on 2 meshes "
                           r"\(\{'a': 2, 'b': 2, 'c': 2\}, \{'x': 4, 'y': 2\}\).*Explicit axes.*"
                           r"one jax.jit per mesh"):
            both(a, b)
        return
    ref = np.fft.fftn(data.astype(np.complex128))
    for k, mesh in zip(both(a, b), (brick, pencil)):
        _close(k, ref)
        assert k.sharding.mesh.shape == mesh.shape


def test_one_device_and_numpy_inputs():
    data = random_field((6, 10), np.float32, 6)
    _close(pencilfft.fftn(data), np.fft.fftn(data.astype(np.float64)))
    _close(pencilfft.rfft2(data, s=(6, 9)), np.fft.rfft2(data.astype(np.float64), s=(6, 9)))
    _close(pencilfft.irfft2(np.fft.rfft2(data).astype(np.complex64), s=data.shape),
           data.astype(np.float64))
    _close(pencilfft.ifft2(data, norm="ortho"), np.fft.ifft2(data.astype(np.float64), norm="ortho"))
    mesh = mesh_of((4, 2), ("x", "y"))
    data = random_field((4, 16), np.complex64, 6)
    k = pencilfft.fftn(data, mesh=mesh)  # numpy on a mesh: split P('x', 'y') there
    _close(k, np.fft.fftn(data.astype(np.complex128)))


def test_s_crops_and_pads_as_jnp():
    mesh = mesh_of((4, 2), ("x", "y"))
    data = random_field((8, 10, 6), np.complex64, 7)
    a = put_global(data, NamedSharding(mesh, P("x", "y")))
    for s, axes in [((12, 4), (0, 2)), ((5, 8, 6), None)]:
        ref = np.fft.fftn(data.astype(np.complex128), s=s, axes=axes or (0, 1, 2))
        _close(pencilfft.fftn(a, s=s, axes=axes), ref)


def test_wrong_inputs_name_the_argument():
    mesh = mesh_of((4, 2), ("x", "y"))
    a = put_global(random_field((8, 10, 6), np.complex64), NamedSharding(mesh, P("x", "y")))
    r = put_global(random_field((8, 10, 6), np.float32), NamedSharding(mesh, P("x", "y")))
    bad = [
        (ValueError, r"`axes` = \(3,\) names axis 3, but `a` has 3 dimensions",
         lambda: pencilfft.fftn(a, axes=(3,))),
        (ValueError, r"`axes` = \(0, 0\) repeats an axis", lambda: pencilfft.fftn(a, axes=(0, -3))),
        (ValueError, r"`s` = \(4,\) and `axes` = \(0, 1\) must have the same length",
         lambda: pencilfft.fftn(a, s=(4,), axes=(0, 1))),
        (TypeError, r"`a` must be real for rfftn", lambda: pencilfft.rfftn(a)),
        (ValueError, r"`norm` must be None or one of", lambda: pencilfft.fftn(a, norm="none")),
        (ValueError, r"`out_sharding` P\('x',\) leaves the output replicated over "
                     r"mesh axes \('y',\)", lambda: pencilfft.fftn(a, out_sharding=P("x"))),
        (ValueError, r"`out_sharding` P\('x', 'z'\) names 'z', which is not an axis of the mesh",
         lambda: pencilfft.fftn(a, out_sharding=P("x", "z"))),
        (TypeError, r"`out_sharding` must be a NamedSharding or a PartitionSpec",
         lambda: pencilfft.fftn(a, out_sharding="x")),
        (ValueError, r"no route of exchanges takes `a` .* to `out_sharding` P\(None, 'x', 'y'\)",
         lambda: pencilfft.fftn(a, out_sharding=P(None, "x", "y"))),
        (ValueError, r"`chunks` must be an int >= 1 or 'auto'; got 0",
         lambda: pencilfft.fftn(a, chunks=0)),
        (TypeError, r"`chunks` must be an int >= 1 or 'auto'; got 1.5",
         lambda: pencilfft.rfftn(r, chunks=1.5)),
        (TypeError, r"`a` must be an array", lambda: pencilfft.fftn("abc")),
        (ValueError, r"`exchange` must be one of", lambda: pencilfft.ifftn(a, exchange="x")),
        (ValueError, r"the 2-D transforms need at least 2 dimensions",
         lambda: pencilfft.fft2(np.ones(4, np.complex64), axes=None)),
    ]
    for kind, message, call in bad:
        with pytest.raises(kind, match=message):
            call()
    assert pencilfft.irfftn(pencilfft.rfftn(r), s=r.shape).shape == r.shape


def test_memory_check_before_anything_runs(monkeypatch):
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "1MiB")
    mesh = mesh_of((4, 2), ("x", "y"))
    a = put_global(np.zeros((128, 128, 64), np.complex64), NamedSharding(mesh, P("x", "y")))
    for f in (pencilfft.fftn, jax.jit(pencilfft.ifftn)):
        with pytest.raises(pencilfft.MemoryLimitError, match=r"fftn of a 128x128x64 complex64 "
                                                             r"grid on 8 device\(s\) needs about"):
            f(a)


def test_brick_temporaries_are_at_most_three_blocks():
    """XLA's memory analysis of a brick's transform at 64^3: at most 3 blocks of temporaries
    (2 measured, 4 blocks in all with the input and the output)."""
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"))
    x = jax.ShapeDtypeStruct((64, 64, 64), np.complex64,
                             sharding=NamedSharding(mesh, P("a", "b", "c")))
    for out in (None, P("a", "b", "c")):
        ma = jax.jit(lambda v: pencilfft.fftn(v, out_sharding=out)).lower(x).compile() \
            .memory_analysis()
        assert ma.temp_size_in_bytes <= 3 * ma.argument_size_in_bytes, ma


def test_the_how_to_table_is_the_planner():
    """docs/howto/any-layout.md's table of layouts, exchanges and routes is what the planner
    gives (each row re-planned here)."""
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "howto" / "any-layout.md"
    rows = [line for line in page.read_text().splitlines() if line.startswith("| `")]
    assert len(rows) >= 10
    for row in rows:
        what, given, out, result, exchanges, route = [c.strip() for c in row.split("|")[1:-1]]
        m = re.fullmatch(r"`(\w+)` ([\dx]+) on ([\dx]+) \(([\w, ]+?),?\)", what)
        name, shape, sizes, names = m.groups()
        shape = tuple(int(n) for n in shape.split("x"))
        names = tuple(n.strip() for n in names.split(","))
        sizes = dict(zip(names, (int(n) for n in sizes.split("x"))))
        kind = {"fftn": "c2c", "rfftn": "r2c"}[name]
        axes = None if len(shape) < 4 else (1, 2, 3)
        dtype = np.float32 if kind == "r2c" else np.complex64
        call = numpy_fft._call(np.zeros(shape, dtype), None, axes, None, kind, False, name,
                               numpy_fft._all_axes, "alltoall")
        spec = numpy_fft._spec_tuple(eval(given.strip("`")), len(shape), sizes, "a")
        target = None if out == "(default)" else numpy_fft._spec_tuple(
            eval(out.strip("`")), len(shape), sizes, "out_sharding")
        r = find_route(call.problem(sizes, spec, target, True))
        assert (f"`{spec_text(r.spec)}`", str(r.exchanges), route_text(r)) == \
            (result, exchanges, route), row


@pytest.mark.parametrize("auto", [False, True], ids=["explicit", "auto"])
def test_vmap_over_a_split_axis_and_a_replicated_input(auto):
    """vmap over an axis a mesh axis splits (the partitioner sees it: no gather), and an input
    replicated over a mesh axis (each device keeps its share eagerly; under jit it may compute
    its replica's copy): the values, and only all-to-alls in the programs."""
    mesh = mesh_of((2, 2, 2), ("a", "b", "c"), auto=auto)
    data = random_field((4, 8, 8, 16), np.complex64, 8)
    a = put_global(data, NamedSharding(mesh, P("a", "b", "c")))
    f = jax.jit(jax.vmap(lambda v: pencilfft.fftn(v, exchange="alltoall")))
    _close(f(a), np.fft.fftn(data.astype(np.complex128), axes=(1, 2, 3)))
    assert set(re.findall(_COLLECTIVES, f.lower(a).compile().as_text())) <= {"all-to-all"}
    r = put_global(data[0], NamedSharding(mesh, P("a", "b")))
    ref = np.fft.fftn(data[0].astype(np.complex128))
    k = pencilfft.fftn(r)
    _close(k, ref)
    assert "c" in str(k.sharding.spec)  # split over the mesh axis the input was replicated on
    g = jax.jit(lambda v: pencilfft.fftn(v, exchange="alltoall"))
    _close(g(r), ref)
    assert set(re.findall(_COLLECTIVES, g.lower(r).compile().as_text())) <= {"all-to-all"}


# (id, mesh shape, names, global shape, input spec, axes, transform): a pencil (every step cut
# along an axis it leaves alone), a brick with odd lengths padded inside, a 4-D batch (its
# batch axis split down to one entry: cut along another) and a 2-D split whose exchanges touch
# every axis (those steps run whole, the last FFT in pieces)
CHUNKED = [
    ("pencil", (4, 2), ("x", "y"), (8, 8, 16), P("x", "y"), None, "c2c"),
    ("brick-r2c", (2, 2, 2), ("a", "b", "c"), (8, 6, 10), P("a", "b", "c"), None, "r2c"),
    ("batch4d", (2, 2, 2), ("c", "x", "y"), (2, 8, 8, 16), P("c", "x", "y"), (1, 2, 3), "c2c"),
    ("split2d", (4, 2), ("x", "y"), (8, 16), P("x", "y"), None, "c2c"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0], marks=[MPIRUN] if c[0] == "pencil"
                                               else []) for c in CHUNKED])
def test_chunks_as_pfft3d_has_them(case):
    """`chunks` > 1: each step of the route in pieces (a loop in the program; a step that touches
    every axis runs whole), the values numpy's, eagerly (3 pieces: an uneven count) and under
    jit (2), forward and back."""
    _, mshape, names, shape, spec, axes, kind = case
    mesh = mesh_of(mshape, names)
    real = kind == "r2c"
    data = random_field(shape, np.float32 if real else np.complex64, 11)
    a = put_global(data, NamedSharding(mesh, spec))
    ref = (np.fft.rfftn(data.astype(np.float64), axes=axes) if real
           else np.fft.fftn(data.astype(np.complex128), axes=axes))
    forward, back = (pencilfft.rfftn, pencilfft.irfftn) if real else (pencilfft.fftn,
                                                                       pencilfft.ifftn)
    s = tuple(shape[i] for i in (axes if axes is not None else range(len(shape))))
    k = forward(a, axes=axes, chunks=3)
    _close(k, ref)
    f = jax.jit(lambda v: forward(v, axes=axes, chunks=2))
    _close(f(a), ref)
    assert "while" in f.lower(a).as_text()
    again = jax.jit(lambda v: back(v, s=s, axes=axes, chunks=2, out_sharding=a.sharding))(k)
    _close(again, data.astype(np.float64 if real else np.complex128))


def test_chunks_auto_fits_the_memory(monkeypatch):
    """chunks="auto": 1 where the transform fits; the fewest pieces that fit where it does not
    (the same values), and MemoryLimitError where no count fits, as pfft3d's."""
    mesh = mesh_of((4, 2), ("x", "y"))
    data = random_field((16, 16, 32), np.complex64, 12)
    a = put_global(data, NamedSharding(mesh, P("x", "y")))
    ref = np.fft.fftn(data.astype(np.complex128))
    f = jax.jit(lambda v: pencilfft.fftn(v, chunks="auto"))
    assert "while" not in f.lower(a).as_text()
    # blocks of 8 KiB per device: unchunked 24 KiB more (the output and two exchange buffers),
    # in 2 pieces 16
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "20KiB")
    _close(pencilfft.fftn(a, chunks="auto"), ref)
    assert "while" in jax.jit(lambda v: pencilfft.fftn(v, chunks="auto")).lower(a).as_text()
    with pytest.raises(pencilfft.MemoryLimitError, match=r"`chunks`=2 .* or `chunks`='auto'"):
        pencilfft.fftn(a, chunks=1)
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "8KiB")
    with pytest.raises(pencilfft.MemoryLimitError, match=r"fftn of a 16x16x32 complex64 grid"):
        pencilfft.fftn(a, chunks="auto")


def test_norms_dtypes_and_size_one_mesh_axes():
    """norm as jnp's; an integer input promoted as jnp.fft promotes it; a mesh with a size-1
    axis, named in the input's and the output's specs or not."""
    mesh = mesh_of((8, 1), ("x", "y"))
    data = random_field((8, 16), np.complex64, 9)
    a = put_global(data, NamedSharding(mesh, P("x", "y")))
    for norm in ("ortho", "forward"):
        _close(pencilfft.ifftn(a, norm=norm), np.fft.ifftn(data.astype(np.complex128), norm=norm))
    k = pencilfft.fftn(a, out_sharding=P("y", "x"))
    assert k.sharding.spec == P("y", "x")
    _close(k, np.fft.fftn(data.astype(np.complex128)))
    ints = put_global(np.arange(128, dtype=np.int32).reshape(8, 16), NamedSharding(mesh, P("x")))
    for f, g in ((pencilfft.fftn, jnp.fft.fftn), (pencilfft.rfftn, jnp.fft.rfftn)):
        got = f(ints)
        assert got.dtype == g(jnp.zeros((8, 16), np.int32)).dtype
        _close(got, getattr(np.fft, g.__name__)(np.arange(128.0).reshape(8, 16)))


def test_the_2d_example_runs(tmp_path):
    """examples/field2d.py (shown in docs/howto/any-layout.md) checks itself against numpy."""
    import subprocess
    import sys
    from pathlib import Path

    from conftest import clean_env

    script = Path(__file__).resolve().parents[1] / "examples" / "field2d.py"
    proc = subprocess.run([sys.executable, str(script), "--n", "32"], capture_output=True,
                          text=True, timeout=300, env=clean_env(8), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for spec in ("P('x', None)", "P('x', 'y')"):
        assert f"phi (32, 32) sharded {spec}, error vs numpy" in proc.stdout, proc.stdout
