"""halo_exchange against a numpy reference: the interior cells of every block form the global
grid, `np.pad(mode="wrap")` pads it, and cutting the padded grid back into overlapping blocks gives
every block with its halos filled.  On every 8-device mesh, periodic or not, eagerly and under
jax.jit (Auto mesh with no mesh in scope, and Explicit), with grad/vjp/jvp/vmap/scan, and the
compiled programs must exchange with collective permutes only.  Bricks, (X, Y, Z) split over a
2x2x2 mesh in and out of the mesh's axis order, against a 3-axis form of the same reference.
"""
from __future__ import annotations

import contextlib
import functools
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
import pencilfft.compat
from conftest import MPIRUN, PDIMS, halo_reference, make_mesh, put_global, random_field, to_numpy

INTERIOR = (4, 5)  # interior cells of every block along X and Y (uneven on purpose)
Z = 3
IDS = ["x".join(map(str, p)) for p in PDIMS]
# (extents, periods): halos of 1 and 3 cells, uneven, none along X; periodic, not, mixed; and
# halos wider than the interior (JaxPM pads 4-cell blocks by 8: the neighbours then send part
# of their own halos), up to half the padded block.
CASES = [((1, 1), (True, True)), ((3, 3), (True, True)), ((3, 3), (False, False)),
         ((2, 1), (True, False)), ((1, 2), (False, True)), ((0, 2), (False, False)),
         ((8, 8), (True, True)), ((6, 5), (False, True))]


def case_id(c):
    (hx, hy), periods = c
    return f"h{hx}{hy}-" + "".join("P" if p else "N" for p in periods)


def full(pdims) -> tuple[int, int]:
    return tuple(pdims) + (1,) * (2 - len(pdims))


def padded_shape(pdims, extents, batch=()) -> tuple[int, ...]:
    """Global shape whose blocks are INTERIOR padded by `extents` on both sides."""
    return tuple(batch) + tuple(n * (i + 2 * h) for n, i, h in
                                zip(full(pdims), INTERIOR, extents)) + (Z,)


def reference(x: np.ndarray, pdims, extents, periods) -> np.ndarray:
    return halo_reference(x, pdims, extents, periods)


def adjoint(w: np.ndarray, pdims, extents, periods) -> np.ndarray:
    """The transpose of the exchange, from where every output cell takes its value."""
    source = reference(np.arange(w.size).reshape(w.shape), pdims, extents, periods)
    return np.bincount(source.ravel(), weights=w.ravel(), minlength=w.size).reshape(w.shape)


def setup(pdims, extents, axis_type="explicit", dtype=np.float64, batch=(), seed=0):
    mesh = make_mesh(pdims, axis_type)
    data = random_field(padded_shape(pdims, extents, batch), dtype, seed=seed)
    return data, put_global(data, pencilfft.real_space_sharding(mesh, data.ndim))


def exchange(extents, periods):
    return lambda v: pencilfft.halo_exchange(v, extents, periods)


# Under mpirun: halos across processes on every mesh: narrow periodic, non-periodic, and wider
# than the interior.
@pytest.mark.parametrize("extents,periods",
                         [pytest.param(*c, marks=MPIRUN) if i in (0, 2, 6) else c
                          for i, c in enumerate(CASES)], ids=[case_id(c) for c in CASES])
@pytest.mark.parametrize("pdims", PDIMS, ids=IDS)
def test_eager_matches_numpy(pdims, extents, periods):
    data, x = setup(pdims, extents, seed=1)
    y = pencilfft.halo_exchange(x, extents, periods)
    assert y.sharding.is_equivalent_to(x.sharding, x.ndim)
    np.testing.assert_array_equal(to_numpy(y), reference(data, pdims, extents, periods))


JIT_CASES = CASES[1:3] + CASES[6:8]


# Under mpirun: the partitioner's halo exchange on multi-process arrays.
@pytest.mark.parametrize("extents,periods",
                         [pytest.param(*c, marks=MPIRUN) if i == 0 else c
                          for i, c in enumerate(JIT_CASES)], ids=[case_id(c) for c in JIT_CASES])
@pytest.mark.parametrize("pdims", PDIMS, ids=IDS)
def test_jit_on_auto_mesh_with_no_mesh_in_scope(pdims, extents, periods):
    """JaxPM's call: the mesh is only known when XLA partitions the program."""
    data, x = setup(pdims, extents, "auto", seed=2)
    y = jax.jit(exchange(extents, periods))(x)
    np.testing.assert_array_equal(to_numpy(y), reference(data, pdims, extents, periods))


@pytest.mark.parametrize("dtype", [np.complex64, np.float32, np.float64])
@pytest.mark.parametrize("mode", ["eager-explicit", "jit-explicit", "jit-auto"])
def test_dtypes(mode, dtype):
    pdims = (4, 2)
    extents, periods = (2, 1), (True, False)
    data, x = setup(pdims, extents, mode.split("-")[1], dtype, seed=3)
    f = exchange(extents, periods)
    y = jax.jit(f)(x) if mode.startswith("jit") else f(x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(to_numpy(y), reference(data, pdims, extents, periods))


@pytest.mark.parametrize("pdims,axis_type", [((4, 2), "auto"), ((1, 8), "auto"), ((8,), "explicit")],
                         ids=["4x2-auto", "1x8-auto", "8-explicit"])
def test_batch_axes_vmap_and_scan(pdims, axis_type):
    extents, periods = (1, 2), (False, True)
    data, x = setup(pdims, extents, axis_type, batch=(2,), seed=4)
    f = exchange(extents, periods)
    want = reference(data, pdims, extents, periods)
    np.testing.assert_array_equal(to_numpy(jax.jit(f)(x)), want)
    np.testing.assert_array_equal(to_numpy(jax.jit(jax.vmap(f))(x)), want)

    def step(carry, _):
        return f(2.0 * carry), None

    scanned = jax.jit(lambda v: jax.lax.scan(step, v, None, length=3)[0])(x)
    want = data
    for _ in range(3):
        want = reference(2.0 * want, pdims, extents, periods)
    np.testing.assert_array_equal(to_numpy(scanned), want)


GRAD_CASES = ([(p, "auto", (2, 1)) for p in PDIMS] + [((2, 4), "explicit", (2, 1))]
              + [((4, 2), "auto", (8, 6)), ((2, 4), "explicit", (6, 8))])  # wider than interior


# Under mpirun: the adjoint across processes (4x2 and 8, Auto).
@pytest.mark.parametrize("pdims,axis_type,extents",
                         [pytest.param(*c, marks=MPIRUN) if c[0] in ((4, 2), (8,)) else c
                          for c in GRAD_CASES],
                         ids=[f"{'x'.join(map(str, p))}-{t}-h{e[0]}{e[1]}" for p, t, e in GRAD_CASES])
def test_grad_and_vjp_are_the_adjoint(pdims, axis_type, extents):
    """Halo cotangents go back to the cells they were copied from; halo cells beyond a
    non-periodic edge keep their own."""
    periods = (True, False)
    data, x = setup(pdims, extents, axis_type, seed=5)
    weights = random_field(data.shape, np.float64, seed=6)
    w = put_global(weights, x.sharding)
    f = exchange(extents, periods)
    want = adjoint(weights, pdims, extents, periods)
    g = jax.jit(jax.grad(lambda v, c: jnp.sum(c * f(v))))(x, w)
    np.testing.assert_allclose(to_numpy(g), want, rtol=1e-13, atol=1e-13)
    pullback = jax.jit(lambda v, c: jax.vjp(f, v)[1](c)[0])(x, w)
    np.testing.assert_allclose(to_numpy(pullback), want, rtol=1e-13, atol=1e-13)
    if pdims == (4, 2):  # eagerly too (the primitive's own jit)
        g = jax.grad(lambda v: jnp.sum(w * f(v)))(x)
        np.testing.assert_allclose(to_numpy(g), want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("pdims", [(2, 4), (8, 1)], ids=["2x4", "8x1"])
def test_jvp_and_finite_difference(pdims):
    extents, periods = (1, 1), (True, True)
    data, x = setup(pdims, extents, "auto", seed=7)
    tangent = random_field(data.shape, np.float64, seed=8)
    t = put_global(tangent, x.sharding)
    f = exchange(extents, periods)
    y, dy = jax.jit(lambda a, b: jax.jvp(f, (a,), (b,)))(x, t)
    np.testing.assert_array_equal(to_numpy(y), reference(data, pdims, extents, periods))
    np.testing.assert_array_equal(to_numpy(dy), reference(tangent, pdims, extents, periods))
    # the gradient of a non-linear loss against a central finite difference
    loss = jax.jit(lambda v: jnp.sum(jnp.sin(f(v)) * jnp.arange(v.size).reshape(v.shape) / v.size))
    g = to_numpy(jax.jit(jax.grad(loss))(x))
    eps = 1e-6
    fd = (float(loss(put_global(data + eps * tangent, x.sharding)))
          - float(loss(put_global(data - eps * tangent, x.sharding)))) / (2 * eps)
    assert abs(fd - float(np.sum(g * tangent))) <= 1e-7 * max(1.0, abs(fd))


def permutes(text: str) -> int:
    return text.count("collective-permute(") + text.count("collective-permute-start(")


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
@pytest.mark.parametrize("pdims", PDIMS, ids=IDS)
def test_compiled_program_sends_to_neighbours_only(pdims, axis_type):
    """Two collective permutes per split mesh axis (low and high halo), nothing else."""
    extents, periods = (1, 2), ((True, True) if axis_type == "auto" else (False, True))
    _, x = setup(pdims, extents, axis_type, seed=9)
    text = jax.jit(exchange(extents, periods)).lower(x).compile().as_text()
    for op in ("all-gather", "all-to-all", "all-reduce", "reduce-scatter"):
        assert text.count(op + "(") + text.count(op + "-start(") == 0, op
    assert permutes(text) == 2 * sum(n > 1 for n in full(pdims))


@pytest.mark.parametrize("how", ["mesh-argument", "set_mesh"])
def test_known_mesh_under_jit_on_auto_axes(how):
    """mesh= or jax.set_mesh: shard_map runs, whatever XLA would compile.  Here the gradient
    depends on the closed-over cotangent only, so with the mesh unknown jit would compile it for
    one device, where the whole array is one block (see the README)."""
    extents, periods = (1, 1), (True, True)
    data, x = setup((4, 2), extents, "auto", seed=15)
    weights = random_field(data.shape, np.float64, seed=16)
    w = put_global(weights, x.sharding)
    mesh = x.sharding.mesh
    kw = {"mesh": mesh} if how == "mesh-argument" else {}
    f = lambda v: pencilfft.halo_exchange(v, extents, periods, **kw)  # noqa: E731
    if jax.process_count() == 1:
        grad = jax.jit(jax.grad(lambda v: jnp.sum(w * f(v))))
    else:  # jax refuses to close over an array that spans several processes
        grad = functools.partial(jax.jit(jax.grad(lambda v, w: jnp.sum(w * f(v)))), w=w)
    with jax.set_mesh(mesh) if how == "set_mesh" else contextlib.nullcontext():
        y, g = jax.jit(f)(x), grad(x)
    np.testing.assert_array_equal(to_numpy(y), reference(data, (4, 2), extents, periods))
    np.testing.assert_allclose(to_numpy(g), adjoint(weights, (4, 2), extents, periods),
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_zero_extents_change_nothing(axis_type):
    data, x = setup((4, 2), (0, 0), axis_type, seed=10)
    np.testing.assert_array_equal(to_numpy(pencilfft.halo_exchange(x, (0, 0))), data)
    np.testing.assert_array_equal(to_numpy(jax.jit(exchange((0, 0), (True, True)))(x)), data)


JD_CASES = [((4, 2), (1, 1)), ((2, 4), (2, 1)), ((1, 8), (0, 2)), ((8, 1), (1, 0)),
            ((4, 2), (8, 8)), ((2, 4), (6, 5)), ((8, 1), (8, 3)), ((1, 8), (2, 8))]


@pytest.mark.parametrize("periods", [(True, True), (False, True), (False, False)],
                         ids=["PP", "NP", "NN"])
# Under mpirun: compat's halos against jaxdecomp's across processes (JaxPM's wide halos).
@pytest.mark.parametrize("pdims,extents",
                         [pytest.param(*c, marks=MPIRUN) if i == 4 else c
                          for i, c in enumerate(JD_CASES)],
                         ids=[f"{p[0]}x{p[1]}-h{e[0]}{e[1]}" for p, e in JD_CASES])
def test_matches_jaxdecomp(pdims, extents, periods):
    """jaxdecomp's values, halos wider than the interior included: pencilfft.compat's always;
    pencilfft's own where the two agree by definition (periodic edges of split mesh axes;
    pencilfft keeps the halos beyond a non-periodic edge and wraps a mesh axis of size 1)."""
    jaxdecomp = pytest.importorskip("jaxdecomp")
    data, x = setup(pdims, extents, "auto", seed=11)
    theirs = to_numpy(jax.jit(lambda v: jaxdecomp.halo_exchange(v, extents, periods))(x))
    np.testing.assert_array_equal(theirs, halo_reference(data, pdims, extents, periods,
                                                         like_jaxdecomp=True))
    compat = pencilfft.compat.halo_exchange
    np.testing.assert_array_equal(to_numpy(compat(x, extents, periods)), theirs)
    np.testing.assert_array_equal(
        to_numpy(jax.jit(lambda v: compat(v, extents, periods))(x)), theirs)
    if periods == (True, True) and 1 not in pdims:
        np.testing.assert_array_equal(to_numpy(pencilfft.halo_exchange(x, extents)), theirs)
        np.testing.assert_array_equal(to_numpy(jax.jit(exchange(extents, periods))(x)), theirs)


# ----------------------------------------------------------------------------------------------
# Errors name the argument, what was given and what was expected


@pytest.fixture(scope="module")
def x42():
    return setup((4, 2), (1, 1), seed=12)[1]


@pytest.mark.parametrize("extents,periods,exc,fragments", [
    ((1, 1, 0), (True, True, True), ValueError, ["`halo_extents` has 3 entries", "brick",
                                                 "the mesh has 2 axes"]),
    ((1, -1), (True, True), ValueError, ["`halo_extents`", "(1, -1)"]),
    ((1.0, 1), (True, True), TypeError, ["`halo_extents`", "2 ints", "(1.0, 1)"]),
    (1, (True, True), TypeError, ["`halo_extents`", "got 1"]),
    ((True, 1), (True, True), TypeError, ["`halo_extents`"]),
    ((1, 1), (True,), ValueError, ["`halo_periods`", "(True,)"]),
    ((1, 1), (1, 0), TypeError, ["`halo_periods`", "2 bools", "(1, 0)"]),
    ((4, 1), (True, True), ValueError, ["`halo_extents[0]` (4)", "X=24", "'x' (=4)",
                                        "padded blocks of 6 cells", "(2*4)"]),
    ((1, 4), (True, True), ValueError, ["`halo_extents[1]` (4)", "Y=14", "'y' (=2)"]),
], ids=["three", "negative", "float", "scalar", "bool", "periods-len", "periods-int",
        "too-large-x", "too-large-y"])
def test_bad_arguments(x42, extents, periods, exc, fragments):
    for f in (pencilfft.halo_exchange, jax.jit(pencilfft.halo_exchange, static_argnums=(1, 2))):
        with pytest.raises(exc) as info:
            f(x42, extents, periods)
        for fragment in fragments:
            assert fragment in str(info.value), (fragment, str(info.value))


def test_bad_arrays():
    mesh = make_mesh((4, 2))
    with pytest.raises(ValueError, match=r"`x` must have at least 3 dimensions .* \(24, 14\)"):
        pencilfft.halo_exchange(put_global(np.zeros((24, 14)), NamedSharding(mesh, P("x", "y"))), (1, 1))
    with pytest.raises(TypeError, match="`x` must be an array"):
        pencilfft.halo_exchange([[[1.0]]], (1, 1))
    replicated = put_global(np.zeros((24, 14, 3)), NamedSharding(mesh, P()))
    with pytest.raises(ValueError, match=r"`x` is sharded as P\(None, None, None\).*P\('x', 'y'"):
        pencilfft.halo_exchange(replicated, (1, 1))
    swapped = put_global(np.zeros((24, 24, 3)), NamedSharding(mesh, P("y", "x")))
    with pytest.raises(ValueError, match=r"`x` is sharded as P\('y', 'x'"):
        pencilfft.halo_exchange(swapped, (1, 1))
    with pytest.raises(ValueError, match=r"`x.shape\[1\]` \(Y=15\) must be divisible by mesh axis 'y'"):
        pencilfft.halo_exchange(put_global(np.zeros((24, 15, 3)), NamedSharding(mesh, P("x"))), (1, 1))
    with pytest.raises(ValueError, match="`x` is sharded as"):  # Explicit type under jit
        jax.jit(exchange((1, 1), (True, True)))(replicated)


def test_unsharded_input_is_refused_and_mesh_places_it():
    data = random_field(padded_shape((4, 2), (1, 1)), np.float64, seed=13)
    for unsharded in (data, jnp.asarray(data)):
        with pytest.raises(ValueError, match="`x` is not sharded over a device mesh"):
            pencilfft.halo_exchange(unsharded, (1, 1))
    y = pencilfft.halo_exchange(data, (1, 1), mesh=make_mesh((4, 2)))
    np.testing.assert_array_equal(np.asarray(y), reference(data, (4, 2), (1, 1), (True, True)))
    # Under jit a program on one device cannot be told from one on an unknown mesh: the whole
    # array is then one block (a (1, 1) mesh), as the README says.
    for periods in ((True, True), (False, True)):
        y = jax.jit(exchange((1, 1), periods))(data)
        np.testing.assert_array_equal(np.asarray(y), reference(data, (1, 1), (1, 1), periods))


def test_too_large_halo_under_jit_with_no_mesh_is_reported_when_compiled():
    """The block size is only known when XLA partitions: pencilfft's message in the XLA error."""
    _, x = setup((4, 2), (1, 1), "auto", seed=14)
    with pytest.raises(Exception, match=r"`halo_extents\[0\]` \(4\) is too large"):
        jax.jit(exchange((4, 1), (True, True)))(x)
    with pytest.raises(ValueError, match=r"`halo_extents\[0\]` \(13\) is too large"):  # at trace
        jax.jit(exchange((13, 1), (True, True)))(x)


def test_docs_laplacian_example():
    """The Laplacian example of docs/howto/particle-mesh.md (once the README's) runs as written."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "particle-mesh.md").read_text()
    code = re.search(r"## Halo exchange.*?```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(code.replace("(64, 64, 64)", "(16, 16, 8)"), "particle-mesh.md", "exec"), scope)
    phi = np.asarray(scope["phi"])
    want = sum(np.roll(phi, s, axis) for axis in range(3) for s in (1, -1)) - 6 * phi
    np.testing.assert_allclose(np.asarray(scope["lap"]), want, rtol=1e-12, atol=1e-12)
    assert scope["lap"].sharding.is_equivalent_to(scope["phi"].sharding, 3)


# ----------------------------------------------------------------------------------------------
# Bricks: (X, Y, Z) split over a 3-axis mesh, halos on all three axes

BRICK_INTERIOR = (3, 4, 2)  # interior cells of every block along X, Y, Z (uneven on purpose)
# (mesh axis names, the spec's mesh axes for (X, Y, Z)): the mesh's order, and another.
BRICK_ORDERS = {"abc": (("a", "b", "c"), ("a", "b", "c")),
                "cab": (("a", "b", "c"), ("c", "a", "b"))}
# Halos of 1 and 2 cells, none along X, periodic, not, mixed, and wider than the interior.
BRICK_CASES = [((1, 1, 1), (True, True, True)), ((2, 1, 2), (False, True, False)),
               ((2, 2, 2), (False, False, False)), ((0, 2, 1), (True, False, True)),
               ((4, 3, 2), (True, True, False))]


def brick_id(c):
    extents, periods = c
    return "h" + "".join(map(str, extents)) + "-" + "".join("P" if p else "N" for p in periods)


def brick_setup(order="abc", extents=(1, 1, 1), axis_type="explicit", batch=(), seed=20,
                pdims=(2, 2, 2)):
    """A brick of BRICK_INTERIOR blocks padded by `extents`, split over a mesh of `pdims`
    named (a, b, c), with (X, Y, Z) split by the mesh axes `order` names."""
    names, axes = BRICK_ORDERS[order]
    kind = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[axis_type]
    mesh = jax.make_mesh(pdims, names, axis_types=(kind,) * 3)
    per_axis = [mesh.shape[a] for a in axes]
    shape = tuple(batch) + tuple(n * (i + 2 * h)
                                 for n, i, h in zip(per_axis, BRICK_INTERIOR, extents))
    data = random_field(shape, np.float64, seed=seed)
    spec = P(*([None] * len(batch)), *axes)
    return data, put_global(data, NamedSharding(mesh, spec)), tuple(per_axis)


def test_brick_reference_is_np_pad_wrap():
    """The reference itself, where the halos are no wider than the interior and every edge is
    periodic: each block is its window of np.pad(G, wrap) of the grid G of interior cells."""
    extents, pdims = (1, 2, 1), (2, 2, 2)
    blocks = [i + 2 * h for i, h in zip(BRICK_INTERIOR, extents)]
    grid = random_field(tuple(n * i for n, i in zip(pdims, BRICK_INTERIOR)), np.float64, seed=21)
    padded = np.pad(grid, [(h, h) for h in extents], mode="wrap")
    want = np.zeros(tuple(n * b for n, b in zip(pdims, blocks)))
    for block in np.ndindex(*pdims):
        window = tuple(slice(k * i, k * i + b) for k, i, b in zip(block, BRICK_INTERIOR, blocks))
        want[tuple(slice(k * b, (k + 1) * b) for k, b in zip(block, blocks))] = padded[window]
    # the halos of the input are garbage; the interiors are the grid's cells
    x = random_field(want.shape, np.float64, seed=22)
    inner = tuple(np.concatenate([np.arange(k * b + h, (k + 1) * b - h) for k in range(n)])
                  for n, b, h in zip(pdims, blocks, extents))
    x[np.ix_(*inner)] = want[np.ix_(*inner)]
    np.testing.assert_array_equal(halo_reference(x, pdims, extents, (True,) * 3), want)


# Under mpirun: a brick's halos across processes (one or two of its mesh axes span them).
@pytest.mark.parametrize("extents,periods",
                         [pytest.param(*c, marks=MPIRUN) if i in (1, 4) else c
                          for i, c in enumerate(BRICK_CASES)],
                         ids=[brick_id(c) for c in BRICK_CASES])
@pytest.mark.parametrize("order", list(BRICK_ORDERS))
def test_brick_eager_matches_numpy(order, extents, periods):
    data, x, pdims = brick_setup(order, extents, seed=23)
    y = pencilfft.halo_exchange(x, extents, periods)
    assert y.sharding.is_equivalent_to(x.sharding, x.ndim)
    np.testing.assert_array_equal(to_numpy(y), halo_reference(data, pdims, extents, periods))


BRICK_JIT = [BRICK_CASES[1], BRICK_CASES[4]]


# Under mpirun: the partitioner's brick halos on multi-process arrays.
@pytest.mark.parametrize("extents,periods", [pytest.param(*BRICK_JIT[0], marks=MPIRUN),
                                             BRICK_JIT[1]], ids=[brick_id(c) for c in BRICK_JIT])
@pytest.mark.parametrize("order", list(BRICK_ORDERS))
def test_brick_jit_on_auto_mesh_with_no_mesh_in_scope(order, extents, periods):
    """The partitioner's spec says which mesh axis splits which of X, Y, Z."""
    data, x, pdims = brick_setup(order, extents, "auto", seed=24)
    y = jax.jit(exchange(extents, periods))(x)
    np.testing.assert_array_equal(to_numpy(y), halo_reference(data, pdims, extents, periods))


@pytest.mark.parametrize("order", list(BRICK_ORDERS))
def test_brick_jit_on_explicit_mesh_under_set_mesh(order):
    extents, periods = (2, 1, 2), (True, False, True)
    data, x, pdims = brick_setup(order, extents, seed=25)
    with jax.set_mesh(x.sharding.mesh):
        y = jax.jit(exchange(extents, periods))(x)
    assert y.sharding.is_equivalent_to(x.sharding, x.ndim)
    np.testing.assert_array_equal(to_numpy(y), halo_reference(data, pdims, extents, periods))


def test_brick_default_periods_and_compat():
    """halo_periods=None is periodic along every axis; compat's values are jaxdecomp's rules
    on all three axes (zeros beyond a non-periodic edge)."""
    extents = (1, 2, 1)
    data, x, pdims = brick_setup("cab", extents, seed=26)
    want = halo_reference(data, pdims, extents, (True,) * 3)
    np.testing.assert_array_equal(to_numpy(pencilfft.halo_exchange(x, extents)), want)
    periods = (False, True, False)
    got = jax.jit(lambda v: pencilfft.compat.halo_exchange(v, extents, periods))(x)
    np.testing.assert_array_equal(to_numpy(got), halo_reference(data, pdims, extents, periods,
                                                                  like_jaxdecomp=True))


def test_brick_size_one_mesh_axis_wraps_within_the_block():
    """On a (4, 2, 1) mesh Z is one block: its halos wrap within it (periodic) or stay."""
    extents = (1, 1, 2)
    for periods in ((True, False, True), (False, True, False)):
        data, x, pdims = brick_setup("abc", extents, seed=27, pdims=(4, 2, 1))
        y = pencilfft.halo_exchange(x, extents, periods)
        np.testing.assert_array_equal(to_numpy(y), halo_reference(data, pdims, extents, periods))


def test_brick_batch_vmap_and_grad():
    """A leading axis (a batch, whole), vmap over it, and the adjoint under jit (Auto mesh)."""
    extents, periods = (1, 2, 1), (True, False, True)
    data, x, pdims = brick_setup("cab", extents, "auto", batch=(2,), seed=28)
    f = exchange(extents, periods)
    want = halo_reference(data, pdims, extents, periods)
    np.testing.assert_array_equal(to_numpy(jax.jit(f)(x)), want)
    np.testing.assert_array_equal(to_numpy(jax.jit(jax.vmap(f))(x)), want)
    weights = random_field(data.shape, np.float64, seed=29)
    w = put_global(weights, x.sharding)
    source = halo_reference(np.arange(data.size).reshape(data.shape), pdims, extents, periods)
    adjoint_want = np.bincount(source.ravel(), weights=weights.ravel(),
                               minlength=data.size).reshape(data.shape)
    g = jax.jit(jax.grad(lambda v, c: jnp.sum(c * f(v))))(x, w)
    np.testing.assert_allclose(to_numpy(g), adjoint_want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_brick_compiled_program_sends_to_neighbours_only(axis_type):
    """Two collective permutes per mesh axis, six in all, nothing else."""
    extents, periods = (1, 1, 1), (True, False, True)
    _, x, _ = brick_setup("cab", extents, axis_type, seed=30)
    text = jax.jit(exchange(extents, periods)).lower(x).compile().as_text()
    for op in ("all-gather", "all-to-all", "all-reduce", "reduce-scatter"):
        assert text.count(op + "(") + text.count(op + "-start(") == 0, op
    assert permutes(text) == 6


@pytest.fixture(scope="module")
def brick222():
    return brick_setup("abc", (1, 1, 1), seed=31)[1]


@pytest.mark.parametrize("extents,periods,exc,fragments", [
    ((1, 1), (True, True), ValueError, ["`halo_extents`", "(a brick)", "length 3"]),
    ((1, 1, 1), (True, True), ValueError, ["`halo_periods` must be 3 bools", "(True, True)"]),
    ((1, 1, 1, 1), None, ValueError, ["`halo_extents`", "or 3", "(1, 1, 1, 1)"]),
    ((1, 1, 3), None, ValueError, ["`halo_extents[2]` (3)", "Z=8", "'c' (=2)",
                                   "padded blocks of 4 cells", "(2*3)"]),
    ((1, 4, 1), None, ValueError, ["`halo_extents[1]` (4)", "Y=12", "'b' (=2)"]),
], ids=["two-on-brick", "periods-len", "four", "too-large-z", "too-large-y"])
def test_brick_bad_arguments(brick222, extents, periods, exc, fragments):
    for f in (pencilfft.halo_exchange, jax.jit(pencilfft.halo_exchange, static_argnums=(1, 2))):
        with pytest.raises(exc) as info:
            f(brick222, extents, periods)
        for fragment in fragments:
            assert fragment in str(info.value), (fragment, str(info.value))


def test_brick_bad_arrays(brick222, x42):
    with pytest.raises(ValueError, match=r"`halo_extents` has 3 entries .* the mesh has 2 axes"):
        pencilfft.halo_exchange(x42, (1, 1, 1))
    mesh = brick222.sharding.mesh
    pencil = put_global(np.zeros((12, 12, 8)), NamedSharding(mesh, P(("a", "b"), "c")))
    with pytest.raises(ValueError, match=r"`x` is sharded as P\(\('a', 'b'\), 'c'.* brick"):
        pencilfft.halo_exchange(pencil, (1, 1, 1))
    with pytest.raises(ValueError, match=r"`x` has shape \(10, 12, 8\) on a mesh of 3 axes.*"
                                         r"length 3"):  # 2 extents, a 3-D array, no spec to read
        pencilfft.halo_exchange(np.zeros((10, 12, 8)), (1, 1), mesh=mesh)
