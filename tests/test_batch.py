"""Meshes with batch axes: (c, a, b) splits a leading batch axis by c, X by a and Y by b.

An ensemble of fields (B, X, Y, Z) sharded P(c, a, b): every transform keeps the batch split,
exchanges only over a and b, and is called every way users call it: eagerly, under jit with the
mesh known (Explicit type, ambient, `mesh=`) or left to XLA (Auto, nothing in scope), with
vmap over the sharded batch axis (jaxdecomp's users write it so) and on the 4-D array, under
Shardy and GSPMD, with grad, jvp and scan.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
from hlo_text import replica_groups
from conftest import (MPIRUN, RANK, halo_reference, mpirun_for, put_global, random_field, reference,
                      rel_err, root_only, to_numpy, tol)

NAMES = ("c", "x", "y")
# (mesh shape, batch): the batch axis split 2 or 8 ways, with pencils, slabs both ways.
MESHES = [((2, 2, 2), 4), ((2, 4, 1), 2), ((2, 1, 4), 2), ((8, 1, 1), 8)]
MESH_IDS = ["x".join(map(str, m)) for m, _ in MESHES]
SHAPE = (8, 16, 12)  # Y=16 on 4: exact; Z=12 on 4 exact, Z//2+1=7 padded; on (2,2,2) all exact


def make_mesh3(shape, axis_type="explicit"):
    kind = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[axis_type]
    return jax.make_mesh(shape, NAMES, axis_types=(kind,) * 3)


def setup(mesh_shape, batch, axis_type="explicit", dtype=np.complex128, seed=0, shape=SHAPE):
    mesh = make_mesh3(mesh_shape, axis_type)
    data = random_field((batch,) + shape, dtype, seed=seed)
    return mesh, data, put_global(data, NamedSharding(mesh, P("c", "x", "y")))


def same_split(arr, spec):
    return arr.sharding.is_equivalent_to(NamedSharding(arr.sharding.mesh, spec), arr.ndim)


# Each calling form maps (mesh, f) -> a function of the array.
def _ambient(mesh, f):
    def g(v):
        with jax.set_mesh(mesh):
            return jax.jit(f)(v)
    return g


FORMS = {
    "eager": lambda mesh, f: f,
    "jit": lambda mesh, f: jax.jit(f),  # Explicit: the type names the mesh; Auto: XLA decides
    "jit-ambient": _ambient,
    "vmap": lambda mesh, f: jax.vmap(f),
    "jit-vmap": lambda mesh, f: jax.jit(jax.vmap(f)),
}


# Under mpirun: batch meshes across processes, eager and under jit (Auto: the partitioner).
@pytest.mark.parametrize("form", mpirun_for("eager", "jit") + ["jit-ambient", "vmap", "jit-vmap"])
@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
@pytest.mark.parametrize("mesh_shape,batch", MESHES, ids=MESH_IDS)
def test_forward_and_inverse(mesh_shape, batch, axis_type, form):
    mesh, data, x = setup(mesh_shape, batch, axis_type)
    k = FORMS[form](mesh, pencilfft.pfft3d)(x)
    assert k.shape == (batch, 16, 12, 8)
    assert rel_err(to_numpy(k), reference(data, "transposed")) <= tol(k.dtype)
    assert same_split(k, P("c", "x", "y", None)), k.sharding.spec
    back = FORMS[form](mesh, pencilfft.pifft3d)(k)
    assert same_split(back, P("c", "x", "y", None)), back.sharding.spec
    assert rel_err(to_numpy(back), data) <= tol(back.dtype)


@pytest.mark.parametrize("layout", mpirun_for("transposed") + ["natural"])
@pytest.mark.parametrize("mesh_shape,batch", MESHES, ids=MESH_IDS)
def test_real_and_natural(mesh_shape, batch, layout):
    """r2c (Z//2+1 = 7 padded on the meshes that split Z) and the natural layout."""
    mesh, data, x = setup(mesh_shape, batch, dtype=np.float64, seed=1)
    k = jax.jit(lambda v: pencilfft.prfft3d(v, layout=layout))(x)
    ref = np.fft.rfftn(data, axes=(-3, -2, -1))
    if layout == "transposed":
        ref = np.moveaxis(ref, -3, -1)
    exact = tuple(slice(0, n) for n in ref.shape)
    assert rel_err(to_numpy(k)[exact], ref) <= tol(np.float64)
    spec = P("c", "x", "y", None) if layout == "transposed" else P("c", None, "x", "y")
    assert same_split(k, spec), k.sharding.spec
    back = jax.jit(lambda v: pencilfft.pirfft3d(v, SHAPE, layout=layout))(k)
    assert same_split(back, P("c", "x", "y", None))
    assert rel_err(to_numpy(back), data) <= tol(np.float64)


@pytest.mark.parametrize("form", mpirun_for("jit") + ["jit-vmap"])
@pytest.mark.parametrize("mesh_shape,batch", MESHES[:3], ids=MESH_IDS[:3])
def test_gspmd_partitioner(mesh_shape, batch, form):
    """jaxdecomp's tests also run with the GSPMD partitioner; with no mesh in scope the
    transforms and the halo exchange go through XLA's partitioner there too."""
    mesh, data, x = setup(mesh_shape, batch, "auto", seed=2)
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        k = FORMS[form](mesh, pencilfft.pfft3d)(x)
        halo = FORMS[form](mesh, lambda v: pencilfft.halo_exchange(v, (1, 0)))(x)
    finally:
        jax.config.update("jax_use_shardy_partitioner", True)
    assert rel_err(to_numpy(k), reference(data, "transposed")) <= tol(k.dtype)
    assert same_split(k, P("c", "x", "y", None))
    assert same_split(halo, P("c", "x", "y", None))


@pytest.mark.parametrize("mesh_shape,batch", MESHES[:3], ids=MESH_IDS[:3])
def test_no_gather_and_nothing_crosses_the_batch_axis(mesh_shape, batch):
    """The compiled program has no all-gather, and every collective's device groups lie within
    one batch slice (devices of the same coordinate along c).  With XLA's collectives, whose
    groups the program states (the local exchange groups its devices the same way, by their
    coordinates on the other mesh axes: the values of the tests above check it)."""
    mesh, _, x = setup(mesh_shape, batch, "auto")
    f = jax.jit(jax.vmap(lambda v: pencilfft.pifft3d(pencilfft.pfft3d(v, exchange="alltoall") * 2,
                                                      exchange="alltoall")))
    text = f.lower(x).compile().as_text()
    assert "all-gather" not in text
    c_of = {int(d.id): i for i, plane in enumerate(mesh.devices) for d in plane.flat}
    groups = _collective_groups(text, mesh)
    assert groups, "expected all-to-alls"
    for group in groups:
        assert len({c_of[d] for d in group}) == 1, group


def _collective_groups(text, mesh):
    """The device groups of every all-to-all and collective permute in the compiled program."""
    ids = [int(d.id) for d in mesh.devices.flat]
    groups = []
    for line in text.splitlines():
        if " all-to-all(" in line:
            found = replica_groups(line)  # explicit, iota or jax 0.11's mesh form
            assert found, line
            groups += [[ids[i] for i in g] for g in found]
        elif " collective-permute(" in line:
            pairs = re.search(r"source_target_pairs=\{(.*?)\}\}?", line).group(1)
            groups += [[ids[int(a)], ids[int(b)]] for a, b in re.findall(r"\{(\d+),(\d+)\}", pairs)]
    return groups


@pytest.mark.parametrize("axis_type", ["explicit"] + mpirun_for("auto"))
def test_halo_exchange_on_batches(axis_type):
    """Each field's halos as on a (2, 2) mesh of its own; vmap over the batch axis too."""
    mesh, data, x = setup((2, 2, 2), 4, axis_type, dtype=np.float64, seed=3, shape=(8, 8, 3))
    y = jax.jit(lambda v: pencilfft.halo_exchange(v, (1, 1)))(x)
    yv = jax.jit(jax.vmap(lambda v: pencilfft.halo_exchange(v, (1, 1))))(x)
    want = np.stack([halo_reference(field, (2, 2), (1, 1), (True, True)) for field in data])
    np.testing.assert_array_equal(to_numpy(y), want)
    np.testing.assert_array_equal(to_numpy(yv), want)
    assert same_split(y, P("c", "x", "y", None)) and same_split(yv, P("c", "x", "y", None))


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_vmap_composed_with_other_ops(axis_type, layout):
    """Inside jit(vmap(...)) the spectrum is used by other ops (a kernel, the inverse): on an
    Explicit mesh its type must name the batch axis's mesh axis (it named no mesh before, and
    `* 2` failed: "Resource axis: c ... not found in mesh")."""
    mesh, data, x = setup((2, 2, 2), 2, axis_type, seed=12)

    def f(v):
        k = pencilfft.pfft3d(v, layout=layout) * 2
        return k, pencilfft.pifft3d(k + 1, layout=layout)

    k, back = jax.jit(jax.vmap(f))(x)
    assert rel_err(to_numpy(k), 2 * reference(data, layout)) <= tol(np.complex128)
    ones = np.zeros(data.shape)
    ones[..., 0, 0, 0] = 1  # the inverse of a constant 1 spectrum
    assert rel_err(to_numpy(back), 2 * data + ones) <= tol(np.complex128)
    assert same_split(k, P("c", "x", "y") if layout == "transposed" else P("c", None, "x", "y"))
    assert same_split(back, P("c", "x", "y"))


def test_fftfreq_on_a_batched_spectrum():
    mesh, data, x = setup((2, 2, 2), 4, seed=4)

    @jax.jit
    def gradient_x(v):
        k = pencilfft.pfft3d(v)
        kx, _, _ = pencilfft.fftfreq3d(k)
        return pencilfft.pifft3d(1j * kx * k)

    got = to_numpy(gradient_x(x))
    kx = 2 * np.pi * np.fft.fftfreq(8)
    want = np.fft.ifftn(1j * kx[:, None, None] * np.fft.fftn(data, axes=(1, 2, 3)), axes=(1, 2, 3))
    assert rel_err(got, want) <= tol(np.complex128)


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_grad_jvp_scan(axis_type):
    mesh, data, x = setup((2, 2, 2), 4, axis_type, dtype=np.float64, seed=5)
    w = random_field((4, 16, 12, 8), np.float64, seed=6)
    ws = put_global(w, NamedSharding(mesh, P("c", "x", "y")))  # an argument: see README, grad

    def loss(v, c):
        return jnp.sum(jnp.real(pencilfft.pfft3d(v)) * c)

    g = jax.jit(jax.grad(loss))(x, ws)
    # d/dx sum(Re(F x) * w) = Re(F^T w): F is symmetric, so the real part of fftn(w) transposed.
    want = np.real(np.fft.fftn(np.moveaxis(w, -1, -3), axes=(1, 2, 3)))
    assert rel_err(to_numpy(g), want) <= 1e-12
    assert same_split(g, P("c", "x", "y", None))
    _, tangent = jax.jit(lambda v, t: jax.jvp(pencilfft.pfft3d, (v,), (t,)))(x, x)
    assert rel_err(to_numpy(tangent), reference(data, "transposed")) <= 1e-12

    def step(carry, _):
        return pencilfft.pifft3d(pencilfft.pfft3d(carry)).real, None

    out, _ = jax.jit(lambda v: jax.lax.scan(step, v, None, length=3))(x)
    assert rel_err(to_numpy(out), data) <= 1e-12


def test_shardings_and_output_sharding():
    mesh = make_mesh3((2, 2, 2))
    assert pencilfft.real_space_sharding(mesh).spec == P("c", "x", "y", None)
    assert pencilfft.k_space_sharding(mesh, "natural", 5).spec == P("c", None, None, "x", "y")
    s = pencilfft.get_fft_output_sharding(NamedSharding(mesh, P("c", "x", "y")))
    assert s.spec == P("c", "x", "y", None)  # what jaxdecomp 0.3.1 gives on this mesh
    with pytest.raises(ValueError, match=r"`ndim` \(=3\) is too small for the mesh's batch axes"):
        pencilfft.real_space_sharding(mesh, 3)


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_errors_name_the_batch_axis(axis_type):
    mesh, _, x = setup((2, 2, 2), 4, axis_type)
    odd = put_global(np.zeros((3,) + SHAPE, complex), NamedSharding(mesh, P(None, "x", "y")))
    with pytest.raises(ValueError, match=r"`x.shape\[0\]` \(=3\) must be divisible by mesh batch axis 'c' \(=2\)"):
        pencilfft.pfft3d(odd)
    with pytest.raises(ValueError, match=r"`x.shape\[0\]` \(=3\) must be divisible by mesh batch axis 'c'"):
        jax.jit(pencilfft.pfft3d)(odd) if axis_type == "explicit" else pencilfft.pfft3d(odd, mesh=mesh)
    if axis_type == "auto":  # no mesh in scope: only XLA's partitioner sees it; our message
        with pytest.raises(Exception, match=r"pencilfft .*`x.shape\[0\]` \(=3\) must be divisible by mesh batch axis 'c'"):
            jax.jit(pencilfft.pfft3d)(odd)
        with pytest.raises(Exception, match=r"pencilfft .*0 leading \(batch\) axes .*\('c',\)"):
            jax.jit(pencilfft.pfft3d)(x[0])


@MPIRUN  # the loaders give each process its blocks of an ensemble
def test_scatter_gather_save_load_on_batches(shared_dir):
    """The loaders give every process its blocks of the ensemble (under mpirun: the batch axis
    spread over processes)."""
    mesh = make_mesh3((2, 2, 2))
    data = random_field((4,) + SHAPE, np.float64, seed=7)
    x = pencilfft.scatter(root_only(data), mesh)
    assert same_split(x, P("c", "x", "y", None))
    back = pencilfft.gather(x)
    if RANK == 0:
        np.testing.assert_array_equal(back, data)
    else:
        assert back is None
    path = f"{shared_dir}/ensemble.npy"
    pencilfft.save(path, x)
    y = pencilfft.load(path, mesh)
    assert same_split(y, P("c", "x", "y", None))
    np.testing.assert_array_equal(to_numpy(y), data)


@MPIRUN  # the refusal reaches every rank
def test_loaders_refuse_a_batch_the_mesh_cannot_split():
    mesh = make_mesh3((2, 2, 2))
    with pytest.raises(ValueError, match=r"`data` has shape \(3, 8, 16, 12\), which the mesh's batch axes cannot split: .*'c' \(=2\)"):
        pencilfft.scatter(root_only(np.zeros((3,) + SHAPE)), mesh)
