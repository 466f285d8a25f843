"""power_spectrum of a *brick*: a field split over X, Y and Z by three mesh axes (issue 54).

Against the float64 numpy reference of tests/power_references.py (JaxPM's definition; counts on
the whole grid, the options' windows and shot noise) and against the pencil path's result: the
auto and the cross spectrum, multipoles, counts, compensation and shot noise; eagerly and under
jit, on Explicit and Auto meshes (nothing in scope, and `jax.set_mesh`), with the mesh's axis
order other than the spec's and a mesh axis of size 1; a gradient; the compiled programs sum
once and gather nothing, every collective names its axes in the mesh's order; the errors name
what is wrong.
And the memory of a brick's transforms at 64^3 (the issue's "at most 3 blocks").
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
from conftest import mpirun_for, put_global, random_field, rel_err, to_numpy, tol
from jaxpr_collectives import collectives
from power_references import assert_close, reference

SHAPE = (16, 16, 16)
# Every option in one call: poles along an oblique line of sight, a CIC compensation, the
# Poisson shot noise of 4096 particles, the counts.
OPTIONS = dict(multipoles=(0, 2), los=(0, 1, 1), kedges=6, compensation="cic", n_particles=4096,
               return_counts=True)
OPTIONS_REF = dict(multipoles=(0, 2), los=(0, 1, 1), kedges=6, windows=("cic", "cic"),
                   shot=np.prod(SHAPE) / 4096)
CROSS = dict(multipoles=(0, 1, 2), los=(1, 0, 1), kedges=0.4, return_counts=True)


def _spectrum(x):
    return pencilfft.power_spectrum(x, **OPTIONS)


def _cross(x, y):
    return pencilfft.power_spectrum(x, y, **CROSS)


def brick_mesh(names=("a", "b", "c"), sizes=(2, 2, 2), kind="explicit"):
    axis = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[kind]
    return jax.make_mesh(sizes, names, axis_types=(axis,) * len(sizes))


def check(result, data, data2=None, dtype=np.float64, **kw):
    """(k, pk, nmodes) against the float64 reference, counts on the whole grid."""
    k, pk, nmodes = (to_numpy(r) for r in result)
    ref_k, ref_pk, ref_n = reference(data, data2, counts=True, **kw)
    assert_close(k, ref_k, dtype, "k")
    assert_close(pk, ref_pk, dtype, "pk")
    assert nmodes.dtype == np.int32 and np.array_equal(nmodes, ref_n), (nmodes, ref_n)


def compiled_text(fn, *args):
    """fn compiled for args, and its HLO text, checked: one sum over the devices, no gather."""
    compiled = jax.jit(fn).lower(*args).compile()
    text = compiled.as_text()
    assert "all-gather" not in text, "the compiled brick spectrum gathers"
    from pencilfft._exchange import mpi

    assert "all-reduce" in text or mpi.ALLREDUCE_TARGET in text
    return compiled


# ---------------------------------------------------------------------------------------------
# Against the numpy reference, in every calling form


FORMS = {
    "eager-explicit": dict(),
    # the mesh's axis order is not the spec's: (X, Y, Z) split by ("a", "b", "c") on ("c", "a", "b")
    "eager-auto-mesh-order": dict(names=("c", "a", "b"), kind="auto"),
    "jit-explicit-mesh-order": dict(names=("z", "x", "y"), spec=("x", "y", "z")),
    "jit-auto-no-mesh": dict(kind="auto"),
    "jit-set-mesh": dict(kind="auto"),
    # a mesh axis of size 1 splits Z: as if Z were whole
    "eager-size-1-axis": dict(sizes=(2, 4, 1)),
    # a numpy field under jax.set_mesh: placed as a brick over the mesh's axes in their order
    "jit-numpy-set-mesh": dict(kind="auto"),
}


# Under mpirun (the mesh spanning the processes: the sum across them, the route's exchanges),
# the representative forms: eagerly on an Explicit mesh, and the partitioner's.
ACROSS_PROCESSES = ("eager-explicit", "jit-auto-no-mesh")


@pytest.mark.parametrize("form", mpirun_for(*ACROSS_PROCESSES)
                         + [f for f in FORMS if f not in ACROSS_PROCESSES])
def test_auto_spectrum(form):
    c = FORMS[form]
    mesh = brick_mesh(c.get("names", ("a", "b", "c")), c.get("sizes", (2, 2, 2)),
                      c.get("kind", "explicit"))
    spec = P(*c.get("spec", ("a", "b", "c")))
    data = random_field(SHAPE, np.float64, 31)
    x = put_global(data, NamedSharding(mesh, spec))
    if form.startswith("eager"):
        return check(_spectrum(x), data, **OPTIONS_REF)
    if form.endswith("set-mesh"):
        arg = data if form == "jit-numpy-set-mesh" else x
        with jax.set_mesh(mesh):
            return check(compiled_text(_spectrum, arg)(arg), data, **OPTIONS_REF)
    check(compiled_text(_spectrum, x)(x), data, **OPTIONS_REF)


@pytest.mark.parametrize("form", ["eager-explicit", "jit-auto-no-mesh"])
def test_cross_spectrum(form):
    """The real part of the binned cross power, odd multipoles included."""
    mesh = brick_mesh(kind="explicit" if form == "eager-explicit" else "auto")
    sharding = NamedSharding(mesh, P("a", "b", "c"))
    a, b = random_field(SHAPE, np.float64, 32), random_field(SHAPE, np.float64, 33)
    b = 0.5 * a + b  # correlated
    x, y = put_global(a, sharding), put_global(b, sharding)
    ref = {k: v for k, v in CROSS.items() if k != "return_counts"}
    if form == "eager-explicit":
        return check(_cross(x, y), a, b, **ref)
    check(compiled_text(_cross, x, y)(x, y), a, b, **ref)


def test_brick_is_the_pencils_result():
    """float32 at 32^3: the brick's spectrum is the pencil path's (4x2) to float32 rounding."""
    data = random_field((32, 32, 32), np.float32, 34)
    brick = put_global(data, NamedSharding(brick_mesh(), P("a", "b", "c")))
    pencil = put_global(data, pencilfft.real_space_sharding(
        jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)))
    got, want = _spectrum(brick), _spectrum(pencil)
    assert got[1].dtype == np.float32 and got[1].shape == want[1].shape == (2, 5)
    for g, w in zip(got, want):
        assert rel_err(to_numpy(g), to_numpy(w)) <= tol(np.float32)
    assert np.array_equal(to_numpy(got[2]), to_numpy(want[2]))


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_gradient(kind):
    """jax.grad through the brick's binning (its transpose, with the compensation's weights) and
    rfftn, under jit: the one-device gradient, split as the field is on an Explicit mesh; on an
    Auto one with nothing in scope (XLA's partitioner) in the spectrum's layout, and gathered
    nowhere."""
    data = random_field(SHAPE, np.float64, 36)
    w = random_field((2, 5), np.float64, 37)
    loss = lambda a: (w * pencilfft.power_spectrum(  # noqa: E731
        a, multipoles=(0, 2), kedges=6, compensation="tsc")[1]).sum()
    x = put_global(data, NamedSharding(brick_mesh(kind=kind), P("a", "b", "c")))
    f = jax.jit(jax.grad(loss))
    got = f(x)
    assert got.sharding.spec == (P("a", "b", "c") if kind == "explicit" else P(("a", "c", "b")))
    assert "all-gather" not in f.lower(x).compile().as_text()
    assert rel_err(to_numpy(got), np.asarray(jax.jit(jax.grad(loss))(data))) <= tol(np.float64)


def test_collectives_name_axes_in_the_mesh_order():
    """jax's next releases refuse a tuple of axis names out of the mesh's order: the spectrum's
    sum names the mesh axes in its order ("c", "a", "b"), not the spec's."""
    mesh = brick_mesh(("c", "a", "b"))
    x = put_global(random_field(SHAPE, np.float64, 35), NamedSharding(mesh, P("a", "b", "c")))
    found = collectives(jax.make_jaxpr(_spectrum)(x))
    tuples = [tuple(a) for _, a in found if isinstance(a, (tuple, list)) and len(a) > 1]
    assert ("c", "a", "b") in [tuple(a) for p, a in found if p.startswith("psum")], found
    order = list(mesh.axis_names)
    assert all([order.index(n) for n in t] == sorted(order.index(n) for n in t)
               for t in tuples), tuples


# ---------------------------------------------------------------------------------------------
# Wrong inputs


def test_bad_bricks():
    mesh = brick_mesh()
    x = put_global(np.zeros(SHAPE), NamedSharding(mesh, P("a", "b", "c")))
    y = put_global(np.zeros(SHAPE), NamedSharding(mesh, P("b", "a", "c")))
    with pytest.raises(ValueError, match=r"`field2` must be sharded as `field` \(P\('a', 'b', "
                                         r"'c'\) on mesh \{'a': 2, 'b': 2, 'c': 2\}\); got "
                                         r"P\('b', 'a', 'c'\)"):
        pencilfft.power_spectrum(x, y)
    # Z//2+1 = 9 is odd and X, Y = 2 take no more than their own mesh axis: no even layout
    tiny = put_global(np.zeros((2, 2, 16)), NamedSharding(mesh, P("a", "b", "c")))
    message = (r"`field` of shape \(2, 2, 16\) split P\('a', 'b', 'c'\) over mesh axes "
               r"\{'a': 2, 'b': 2, 'c': 2\}: no route of exchanges takes it to a half spectrum "
               r"of shape \(2, 2, 9\)")
    spectrum = lambda f: pencilfft.power_spectrum(f, kedges=[0.5, 1.0, 2.0])  # noqa: E731
    for fn in (spectrum, jax.jit(spectrum)):
        with pytest.raises(ValueError, match=message):
            fn(tiny)
    # leading axes on a brick's mesh (here 4 axes: one more than the brick's three)
    mesh4 = brick_mesh(("d", "a", "b", "c"), (2, 2, 2, 1))
    batch = put_global(np.zeros((2,) + SHAPE), NamedSharding(mesh4, P(None, "a", "b", "c")))
    with pytest.raises(ValueError, match=r"`field` has shape \(2, 16, 16, 16\) on a mesh of 4 "
                                         r"axes .*a brick\) must be 3-D \(X, Y, Z\)"):
        pencilfft.power_spectrum(batch)


# ---------------------------------------------------------------------------------------------
# Memory: the "on a brick at 64^3 the temporaries are at most 3 blocks"


@pytest.mark.parametrize("real", [False, True], ids=["fftn", "rfftn"])
def test_brick_transform_temporaries_are_at_most_three_blocks(real):
    """XLA's memory analysis of the compiled transform of a 64^3 brick on (2, 2, 2): complex64
    fftn to P(a, b, c); float32 rfftn to the layout the power spectrum takes (Z//2+1 = 33 is
    odd: P(a, b, c) cannot hold it).  A block is one device's share of the complex result."""
    from pencilfft._pm.power import brick_layout

    mesh = brick_mesh()
    dtype = np.float32 if real else np.complex64
    x = jax.ShapeDtypeStruct((64, 64, 64), dtype, sharding=NamedSharding(mesh, P("a", "b", "c")))
    if real:
        sizes = tuple(mesh.shape.items())
        layout = brick_layout((64, 64, 64), "float32", sizes, (("a",), ("b",), ("c",)))
        out = P(*(names[0] if len(names) == 1 else names or None for names in layout))
        fn, result = pencilfft.rfftn, (64, 64, 33)
    else:
        out, fn, result = P("a", "b", "c"), pencilfft.fftn, (64, 64, 64)
    block = np.prod(result) * np.dtype(np.complex64).itemsize // 8
    compiled = jax.jit(lambda v: fn(v, out_sharding=out)).lower(x).compile()
    ma = compiled.memory_analysis()
    assert ma.output_size_in_bytes == block
    assert ma.temp_size_in_bytes <= 3 * block, (ma.temp_size_in_bytes, block)
