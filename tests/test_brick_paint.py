"""paint / readout on bricks (issue 54): a field split over X, Y and Z by three mesh axes,
P(a, b, c) in any order of the mesh's axes, dx split P(a, b, c, None).

Checked on a (2, 2, 2) mesh of 8 devices, 16^3 grids: the lattice form and catalogs against the
float64 numpy references (tests/paint_references.py), eagerly and under jit, on an Explicit and
an Auto mesh, with the mesh's axes splitting (X, Y, Z) in order and permuted; a mesh axis of
size 1 (behaves as not split); the pure-JAX bodies (GPUs) as well as the CPU kernel;
interlacing, grad in dx and the field, and vmap of a complex readout against the same calls on
a pencil mesh; every collective names its axes in the mesh's order (jax's next release
requires it); wrong inputs (blocks too thin for the halo, a displacement beyond it along Z, a
dx of the wrong rank, a catalog's blocks thinner than its halo) with the messages.  Under
mpirun (tests/run.sh) `test_across_processes` runs the lattice and a catalog with the halo
sends and the all_to_all across processes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft

from conftest import MPIRUN, put_global, to_numpy
from jaxpr_collectives import collectives
from paint_references import numpy_paint, numpy_read

SHAPE = (16, 16, 16)


def _mesh(kind="explicit", names=("a", "b", "c"), sizes=(2, 2, 2)):
    t = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[kind]
    return jax.make_mesh(sizes, names, axis_types=(t,) * 3)


def _data(seed=0, rms=0.7):
    rng = np.random.default_rng(seed)
    dx = rng.normal(size=SHAPE + (3,)) * rms
    return dx, rng.normal(size=SHAPE)


def _catalog(dx):
    """The lattice's particles as a catalog of absolute positions (N, 3), wrapped, shuffled."""
    q = np.stack(np.meshgrid(*[np.arange(n) for n in SHAPE], indexing="ij"), -1)
    pos = ((q + dx) % np.asarray(SHAPE)).reshape(-1, 3)
    order = np.random.default_rng(7).permutation(len(pos))
    return pos[order], order


# Shared compiled functions.
@functools.cache
def _lattice(window):
    return jax.jit(lambda d, f: (pencilfft.paint(d, window=window),
                                 pencilfft.readout(f, d, window=window)))


@functools.cache
def _catalog_fn(window):
    return jax.jit(lambda p, f: (pencilfft.paint(p, 1.0, window, shape=SHAPE),
                                 pencilfft.readout(f, p, window)))


def _check_lattice(mesh, spec, window, form):
    dx, f = _data()
    sh = NamedSharding(mesh, P(*spec))
    d, ff = put_global(dx, sh), put_global(f, sh)
    if form == "eager":
        g, r = pencilfft.paint(d, window=window), pencilfft.readout(ff, d, window=window)
        assert g.sharding.spec == P(*spec) and r.sharding.spec == P(*spec)
    else:
        g, r = _lattice(window)(d, ff)
    np.testing.assert_allclose(to_numpy(g), numpy_paint(dx, window), atol=1e-12)
    np.testing.assert_allclose(to_numpy(r), numpy_read(f, dx, window), atol=1e-12)


# (kind, the mesh axes splitting X, Y, Z, window, form): both orders, both mesh kinds, an even
# and an odd support, eager and jit.
LATTICE = [("explicit", ("a", "b", "c"), "cic", "eager"),
           ("explicit", ("c", "a", "b"), "tsc", "jit"),
           ("auto", ("a", "b", "c"), "cic", "eager"),
           ("auto", ("c", "a", "b"), "cic", "jit")]


@pytest.mark.parametrize("kind,spec,window,form", LATTICE,
                         ids=["-".join((k, "".join(s), w, f)) for k, s, w, f in LATTICE])
def test_lattice_against_numpy(kind, spec, window, form):
    _check_lattice(_mesh(kind), spec, window, form)


# (explicit, jit) runs under mpirun (`test_across_processes`)
@pytest.mark.parametrize("kind,form", [("explicit", "eager"), ("auto", "jit")])
def test_catalog_against_numpy(kind, form):
    """Positions split over all 8 devices along N; the painted grid is the brick P(a, b, c)
    (a catalog on a 3-axis mesh paints onto the brick in the mesh's order)."""
    mesh = _mesh(kind)
    dx, f = _data(seed=1)
    pos, order = _catalog(dx)
    p = put_global(pos, NamedSharding(mesh, P(("a", "b", "c"), None)))
    # eagerly, the field read is split P(c, a, b): readout reads the brick its sharding says
    ff = put_global(f, NamedSharding(mesh, P(*(("c", "a", "b") if form == "eager" else
                                               ("a", "b", "c")))))
    if form == "eager":
        g, r = pencilfft.paint(p, 1.0, "tsc", shape=SHAPE), pencilfft.readout(ff, p, "tsc")
        assert g.sharding.spec == P("a", "b", "c")
    else:
        g, r = _catalog_fn("tsc")(p, ff)
    np.testing.assert_allclose(to_numpy(g), numpy_paint(dx, "tsc"), atol=1e-12)
    np.testing.assert_allclose(to_numpy(r), numpy_read(f, dx, "tsc").reshape(-1)[order],
                               atol=1e-12)


def test_size_one_axis_is_not_split():
    """A (2, 4, 1) mesh: Z split by an axis of size 1 has no halo and wraps."""
    mesh = _mesh(sizes=(2, 4, 1))
    dx, f = _data(seed=3)
    dx[..., 2] *= 8  # Z whole: any displacement along it wraps
    sh = NamedSharding(mesh, P("a", "b", "c"))
    g, r = _lattice("cic")(put_global(dx, sh), put_global(f, sh))
    np.testing.assert_allclose(to_numpy(g), numpy_paint(dx, "cic"), atol=1e-12)
    np.testing.assert_allclose(to_numpy(r), numpy_read(f, dx, "cic"), atol=1e-12)


def test_xla_path(monkeypatch):
    """The pure-JAX bodies (GPUs; PENCILFFT_PAINT_KERNEL=xla) wrap a brick's Z pads as the CPU
    kernel does."""
    monkeypatch.setenv("PENCILFFT_PAINT_KERNEL", "xla")
    dx, f = _data(seed=5)
    # an order no other test paints on: paint's inner jit, cached by plan, is traced afresh
    sh = NamedSharding(_mesh(), P("b", "c", "a"))
    g, r = jax.jit(lambda d, f: (pencilfft.paint(d, window="cic"),  # a fresh jit: traced now
                                 pencilfft.readout(f, d, window="cic")))(put_global(dx, sh),
                                                                         put_global(f, sh))
    np.testing.assert_allclose(to_numpy(g), numpy_paint(dx, "cic"), atol=1e-12)
    np.testing.assert_allclose(to_numpy(r), numpy_read(f, dx, "cic"), atol=1e-12)


@functools.cache
def _pencil_results():
    """Interlacing, grad, and vmap of a complex readout on a 4x2 pencil mesh: the
    references."""
    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    return _transformed(mesh, P("x", "y"))


def _loss(d, f):
    return jnp.sum(pencilfft.readout(f, d, "tsc") * pencilfft.paint(d, window="tsc") ** 2)


def _transformed(mesh, spec):
    dx, f = _data(seed=4, rms=0.5)
    sh = NamedSharding(mesh, spec)
    d, ff = put_global(dx, sh), put_global(f, sh)
    out = jax.jit(lambda d, ff: (
        pencilfft.paint(d, window="cic", interlace=True),
        jax.grad(_loss, argnums=(0, 1))(d, ff),
        jax.vmap(lambda x: pencilfft.readout(x, d))(jnp.stack([ff, 1j * ff]))))(d, ff)
    return jax.tree.map(to_numpy, out)


def test_transformations_match_pencils():
    """Interlacing (the any-layout transforms on the brick), grad in dx and the field, vmap
    of a complex readout: the same numbers as on a pencil mesh (an Explicit mesh: the Auto one
    runs the same bodies, `test_lattice_against_numpy`)."""
    got = _transformed(_mesh(), P("c", "a", "b"))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(_pencil_results())):
        np.testing.assert_allclose(a, b, atol=1e-11)


def test_interlace_eager_keeps_the_brick():
    mesh = _mesh()
    dx, _ = _data(seed=4, rms=0.5)
    g = pencilfft.paint(put_global(dx, NamedSharding(mesh, P("c", "a", "b"))), interlace=True)
    assert g.sharding.spec == P("c", "a", "b")
    np.testing.assert_allclose(to_numpy(g), _pencil_results()[0], atol=1e-11)


def test_collectives_name_axes_in_the_mesh_order():
    """jax's next release refuses a tuple of axis names out of the mesh's order: a mesh
    ("c", "y", "x") splitting the brick P(x, y, c), lattice and catalog."""
    mesh = jax.make_mesh((2, 2, 2), ("c", "y", "x"), axis_types=(AxisType.Explicit,) * 3)
    dx, f = _data()
    d = put_global(dx, NamedSharding(mesh, P("x", "y", "c")))
    pos = put_global(_catalog(dx)[0], NamedSharding(mesh, P(("c", "y", "x"), None)))
    found = []
    for fn, arg in [(lambda d: pencilfft.readout(pencilfft.paint(d), d), d),
                    (lambda p: pencilfft.readout(pencilfft.paint(p, shape=SHAPE), p), pos)]:
        found += [names for _, names in collectives(jax.make_jaxpr(fn)(arg))]
    tuples = [names for names in found if isinstance(names, tuple) and len(names) > 1]
    assert tuples, "no collective over several axes traced"
    names = mesh.axis_names
    bad = [t for t in tuples if [names.index(n) for n in t] != sorted(names.index(n) for n in t)]
    assert not bad, bad


def test_wrong_inputs():
    mesh = _mesh()
    sh = NamedSharding(mesh, P("a", "b", "c"))
    thin = put_global(np.zeros((16, 16, 4, 3)), NamedSharding(mesh, P("a", "b", "c", None)))
    # blocks of 2 cells along Z: no halo of 4 cells fits
    with pytest.raises(ValueError, match=r"`max_displacement` \(3 cells\) needs a halo of 4 "
                                         r"cells.*block along Z \(4 split 2 ways\)"):
        pencilfft.paint(thin, max_displacement=3)
    thinner = put_global(np.zeros((16, 16, 2, 3)), NamedSharding(mesh, P("a", "b", "c", None)))
    with pytest.raises(ValueError, match=r"blocks along Z \(1 cells: 2 split 2 ways\) are too "
                                         r"thin for window 'pcs'"):
        pencilfft.paint(thinner, window="pcs", max_displacement=0.1)
    # a displacement beyond the halo along Z (the default halo: the 2-cell block)
    dx = np.zeros((16, 16, 4, 3))
    dx[0, 0, 0, 2] = 2.6
    with pytest.raises(ValueError, match=r"`dx`: the largest displacement along a split axis "
                                         r"is 2\.6 cells.*fewer devices along Z"):
        pencilfft.paint(put_global(dx, NamedSharding(mesh, P("a", "b", "c", None))))
    # dx split like the field, without its component axis
    with pytest.raises(ValueError, match=r"`dx` must have shape \(X, Y, Z, 3\).*\(16, 16, 16\)"):
        pencilfft.paint(put_global(np.zeros(SHAPE), sh))
    # a catalog whose Z blocks (1 cell) are thinner than the halo of pcs (2 cells)
    pos = put_global(np.zeros((64, 3)), NamedSharding(mesh, P(("a", "b", "c"), None)))
    with pytest.raises(ValueError, match=r"`shape`: the blocks along Z \(2 cells split 2 ways: "
                                         r"1\) are thinner than the halo of window 'pcs'"):
        pencilfft.paint(pos, window="pcs", shape=(16, 16, 2))
    with pytest.raises(ValueError, match=r"grid's Z axis \(15 cells\) does not split evenly"):
        pencilfft.paint(pos, shape=(16, 16, 15))


@MPIRUN
def test_across_processes():
    """The halo sends (MPI inside XLA, or gloo) and the catalog's all_to_all across processes,
    on the brick: the lattice and a catalog against numpy, under jit on an Explicit mesh (in
    one process too: the cases `test_lattice_against_numpy` and `test_catalog_against_numpy`
    leave out)."""
    _check_lattice(_mesh(), ("a", "b", "c"), "cic", "jit")
    test_catalog_against_numpy("explicit", "jit")
