"""Ready for the next jax (docs/development.md, "A new jax release"): what jax's main branch
changes that could break pencilfft, checked on today's jax.

* `with mesh:` is deprecated and `jax_disallow_mesh_context_manager` makes it an error: the
  whole suite runs with it set (tests/conftest.py), and the read-only lookup of a user's
  legacy mesh (`_jax_private.legacy_mesh`) still finds it;
* `ppermute` raises when a tuple of axis names is not in the mesh's order
  (`jax_raise_on_ppermute_sort_diff`): every collective of the transforms, halo exchange,
  power spectrum, painting and readout, traced on a 2-axis and a 3-axis mesh (the halos of a
  brick too), names its axes in the mesh's order (or one name);
* `AbstractMesh` defaults to Explicit axes and `make_mesh`'s `axis_shapes` is renamed
  `axis_sizes`: the package passes axis types explicitly and sizes positionally.
"""
from __future__ import annotations

import ast
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft

from conftest import DISALLOW_MESH_CONTEXT, make_mesh, put_global, random_field
from jaxpr_collectives import collectives

ROOT = Path(__file__).resolve().parents[1]
# Collectives and the parameter that holds their mesh axis names.
def test_the_suite_refuses_with_mesh():
    """tests/conftest.py sets JAX_DISALLOW_MESH_CONTEXT_MANAGER=1 for every run: a `with mesh:`
    left in pencilfft or a test fails the suite (CI runs all of it so)."""
    if not DISALLOW_MESH_CONTEXT:
        pytest.skip("JAX_DISALLOW_MESH_CONTEXT_MANAGER=0 was set for this run")
    assert jax.config.jax_disallow_mesh_context_manager
    mesh = make_mesh((4, 2), "auto")
    with pytest.raises(RuntimeError, match="Mesh context manager is disabled"):
        mesh.__enter__()


def test_a_users_legacy_mesh_is_still_found(monkeypatch):
    """A user's `with mesh:` block (read-only: pencilfft never enters one) is still the mesh a
    transform runs on, as long as jax keeps it.  The block is made as `Mesh.__enter__` makes it,
    without entering the deprecated context manager."""
    try:
        from jax._src.mesh import thread_resources
    except ImportError:
        pytest.skip("this jax has no legacy mesh context")
    from pencilfft._jax_private import legacy_mesh

    mesh = make_mesh((4, 2), "auto")
    assert legacy_mesh() is None
    monkeypatch.setattr(thread_resources, "env", thread_resources.env.with_mesh(mesh))
    assert legacy_mesh() is mesh
    x = random_field((16, 16, 8), np.complex64, seed=4)
    xs = put_global(x, pencilfft.real_space_sharding(mesh))
    hlo = jax.jit(pencilfft.pfft3d).lower(xs).compile().as_text()
    moves = ("all-to-all", "collective-permute", "pencilfft_local_exchange")
    assert any(op in hlo for op in moves), "the legacy mesh was not found"


def _out_of_order(names, mesh_names):
    """None when `names` (a name, or a tuple) is one name or names mesh axes in the mesh's order;
    else what is wrong."""
    names = tuple(names) if isinstance(names, (tuple, list)) else (names,)
    names = tuple(n for n in names if isinstance(n, str))  # positional (pmap) axes aside
    if len(names) <= 1:
        return None
    if any(n not in mesh_names for n in names):
        return f"{names} names axes not in the mesh {mesh_names}"
    order = [mesh_names.index(n) for n in names]
    return None if order == sorted(order) else f"{names} not in the mesh's order {mesh_names}"


def _cases(mesh):
    """(name, function, argument) for every public op that moves data between devices, on
    `mesh` (2 axes: pencils; 3: a batch axis first, and bricks for the halo exchange)."""
    batch = (2,) if len(mesh.axis_names) == 3 else ()
    real = put_global(random_field(batch + (16, 16, 8), np.float64, seed=1),
                      pencilfft.real_space_sharding(mesh))
    cplx = put_global(random_field(batch + (16, 16, 8), np.complex128, seed=2),
                      pencilfft.real_space_sharding(mesh))
    cases = []
    for exchange in ("alltoall", "pairwise", "auto"):
        for layout in ("transposed", "natural"):
            kw = dict(mesh=mesh, exchange=exchange, layout=layout)
            cases += [
                (f"pfft3d {exchange} {layout}", lambda x, kw=kw: pencilfft.pifft3d(
                    pencilfft.pfft3d(x, **kw), **kw), cplx),
                (f"prfft3d {exchange} {layout}", lambda x, kw=kw: pencilfft.pirfft3d(
                    pencilfft.prfft3d(x, **kw), real.shape[-3:], **kw), real),
            ]
    cases += [
        ("halo_exchange", lambda x: pencilfft.halo_exchange(x, (2, 2), (True, True),
                                                              mesh=mesh), real),
        ("power_spectrum", lambda x: pencilfft.power_spectrum(x, kedges=4), real),
    ]
    if batch:  # a brick: (X, Y, Z) split by the three mesh axes, in the mesh's order and not
        names = tuple(mesh.axis_names)
        for axes in (names, names[2:] + names[:2]):
            brick = put_global(random_field((16, 16, 8), np.float64, seed=5),
                               NamedSharding(mesh, P(*axes)))
            cases.append((f"halo_exchange brick P{axes}", lambda x: pencilfft.halo_exchange(
                x, (2, 2, 1), (True, False, True)), brick))
            cases.append((f"power_spectrum brick P{axes}",
                          lambda x: pencilfft.power_spectrum(x, kedges=4), brick))
    if not batch:
        dx = put_global(np.random.default_rng(3).normal(size=(16, 16, 8, 3)) * 0.3,
                        NamedSharding(mesh, P(*mesh.axis_names[-2:])))
        pos = put_global(np.random.default_rng(4).uniform(0, 8, size=(64, 3)),
                         NamedSharding(mesh, P(tuple(mesh.axis_names), None)))
        cases += [
            ("paint and readout", lambda d: pencilfft.readout(
                pencilfft.paint(d, mesh=mesh), d, mesh=mesh), dx),
            ("paint a catalog", lambda p: pencilfft.paint(p, mesh=mesh, shape=(16, 16, 8)), pos),
            ("readout a catalog", lambda p: pencilfft.readout(
                jnp.zeros((16, 16, 8)), p, mesh=mesh), pos),
        ]
    return cases


@pytest.mark.parametrize("pdims, names", [((4, 2), ("x", "y")), ((2, 4), ("y", "x")),
                                          ((2, 2, 2), ("c", "x", "y")),
                                          ((2, 2, 2), ("c", "y", "x"))],
                         ids=["4x2", "2x4-yx", "2x2x2", "2x2x2-cyx"])
def test_every_collective_names_its_axes_in_the_mesh_order(pdims, names):
    """jax's next release refuses a ppermute whose tuple of axis names is out of the mesh's
    order: every collective of every distributed op, traced, names them in order (meshes whose
    names are not in alphabetical order included, so that sorting by name is not enough)."""
    from jax.sharding import AxisType

    mesh = jax.make_mesh(pdims, names, axis_types=(AxisType.Explicit,) * len(pdims))
    problems, seen, found_all = [], 0, []
    for name, fn, arg in _cases(mesh):
        found = collectives(jax.make_jaxpr(fn)(arg))
        seen += len(found)
        found_all += found
        problems += [f"{name}: {prim} {why}" for prim, axes in found
                     if (why := _out_of_order(axes, tuple(mesh.axis_names)))]
    assert seen > 0, "no collective traced: the walk missed them"
    assert any(isinstance(axes, tuple) and len(axes) > 1 for _, axes in found_all), \
        "no collective over several axes traced: the check would be empty"
    assert not problems, problems


def _mesh_constructions(path: Path):
    """The calls of `jax.make_mesh`, and of `Mesh`/`AbstractMesh` however imported (a function
    of pencilfft's own named make_mesh, like the CLI's, is not jax's)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr in ("Mesh", "AbstractMesh") or (
                    func.attr == "make_mesh" and getattr(func.value, "id", "") == "jax"):
                yield node
        elif getattr(func, "id", "") in ("Mesh", "AbstractMesh"):
            yield node


def test_the_package_makes_meshes_with_explicit_axis_types():
    """jax's next release makes AbstractMesh default to Explicit axes and renames make_mesh's
    `axis_shapes` to `axis_sizes`: every mesh pencilfft builds names its axis types, and passes
    the sizes positionally (the keyword is spelled differently in the two releases)."""
    problems = []
    for path in sorted((ROOT / "pencilfft").rglob("*.py")):
        for call in _mesh_constructions(path):
            where = f"{path.relative_to(ROOT)}:{call.lineno}"
            keywords = {k.arg for k in call.keywords}
            if keywords & {"axis_shapes", "axis_sizes"}:
                problems.append(f"{where} passes the sizes by keyword")
            if "axis_types" not in keywords and len(call.args) < 3:
                problems.append(f"{where} leaves the axis types to jax's default")
    assert not problems, problems
