"""pencilfft.compat and get_fft_output_sharding: jaxdecomp's five names on pencilfft.

The issue's acceptance: with jaxdecomp not installed, a particle-mesh code written against
jaxdecomp's names runs on pencilfft through `pencilfft.compat.install()` and gives the same fields
as with jaxdecomp.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
import pencilfft.compat as compat
from conftest import MPIRUN, PDIMS, make_mesh, put_global, random_field, rel_err, to_numpy

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import pm  # noqa: E402

NAMES = ("pfft3d", "pifft3d", "fftfreq3d", "get_fft_output_sharding", "halo_exchange")
IDS = ["x".join(map(str, p)) for p in PDIMS]
SHAPE, STEPS = (16, 16, 16), 2


def test_signatures_take_jaxdecomps_arguments():
    jaxdecomp = pytest.importorskip("jaxdecomp")
    for name in NAMES:
        theirs = list(inspect.signature(getattr(jaxdecomp, name)).parameters.values())
        ours = list(inspect.signature(getattr(compat, name)).parameters.values())
        assert [p.name for p in ours[: len(theirs)]] == [p.name for p in theirs], name
        for a, b in zip(ours, theirs):
            if b.default is not inspect.Parameter.empty:
                assert str(a.default).lower() == str(b.default).lower(), (name, a, b)
        assert all(p.kind == p.KEYWORD_ONLY for p in ours[len(theirs):]), name


def test_backend_argument_positional_as_jaxpm_passes_it():
    data = random_field(SHAPE, np.complex128, seed=50)
    x = put_global(data, pencilfft.real_space_sharding(make_mesh((4, 2), "auto")))
    want = np.moveaxis(np.fft.fftn(data), 0, -1)
    for backend in ("jax", "JAX", "cudecomp"):
        k = compat.pfft3d(x, "backward", backend)
        assert rel_err(to_numpy(k), want) <= 1e-12
        assert rel_err(to_numpy(compat.pifft3d(k, "backward", backend)), data) <= 1e-12
    k = compat.pfft3d(x, "ortho", "jax")
    assert rel_err(to_numpy(k), want / np.sqrt(data.size)) <= 1e-12
    k = jax.jit(lambda v: compat.pfft3d(v, "backward", "jax"))(x)
    assert rel_err(to_numpy(k), want) <= 1e-12
    kx, ky, kz = compat.fftfreq3d(k, 0.5)
    assert (kx.shape, ky.shape, kz.shape) == ((1, 1, 16), (16, 1, 1), (1, 16, 1))
    np.testing.assert_allclose(to_numpy(kx).ravel(), 2 * np.pi * np.fft.fftfreq(16, 0.5))
    for bad in ("mpi", None):
        with pytest.raises(ValueError, match="`backend` must be one of"):
            compat.pfft3d(x, "backward", bad)
        with pytest.raises(ValueError, match="`backend` must be one of"):
            compat.halo_exchange(x, (1, 1), (True, True), bad)


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
@pytest.mark.parametrize("pdims", PDIMS, ids=IDS)
def test_get_fft_output_sharding_is_the_spectrum_sharding(pdims, axis_type):
    """Eagerly for (X, Y, Z), under jit for a batch (B, X, Y, Z)."""
    mesh = make_mesh(pdims, axis_type)
    for ndim, fft in ((3, pencilfft.pfft3d), (4, jax.jit(pencilfft.pfft3d))):
        data = random_field((2,) * (ndim - 3) + (8, 8, 8), np.complex64, seed=51)
        x = put_global(data, pencilfft.real_space_sharding(mesh, ndim))
        want = pencilfft.get_fft_output_sharding(x.sharding)
        assert fft(x).sharding.is_equivalent_to(want, ndim), (fft(x).sharding, want)
        assert want == pencilfft.k_space_sharding(mesh, ndim=ndim)


@MPIRUN  # compat beside jaxdecomp under multi-controller, every mesh
@pytest.mark.parametrize("pdims", [(1, 8), (8, 1), (4, 2), (2, 4)], ids=IDS[:4])
def test_get_fft_output_sharding_against_jaxdecomps(pdims):
    """The same as jaxdecomp's except on (P, 1) meshes, where jaxdecomp splits k-space Z and
    pencilfft Y (the README's migration table says so)."""
    jaxdecomp = pytest.importorskip("jaxdecomp")
    sharding = pencilfft.real_space_sharding(make_mesh(pdims, "auto"))
    same = pencilfft.get_fft_output_sharding(sharding).is_equivalent_to(
        jaxdecomp.get_fft_output_sharding(sharding), 3)
    assert same == (pdims[1] > 1)


def test_get_fft_output_sharding_errors():
    with pytest.raises(TypeError, match="`fft_sharding` must be a jax.sharding.NamedSharding"):
        pencilfft.get_fft_output_sharding(P("x", "y"))
    mesh3 = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Explicit,) * 3)
    with pytest.raises(ValueError, match=r"`ndim` \(=3\) is too small for the mesh's batch axes \('a',\)"):
        pencilfft.get_fft_output_sharding(NamedSharding(mesh3, P("a")), ndim=3)
    sharding = pencilfft.real_space_sharding(make_mesh((4, 2)))
    with pytest.raises(ValueError, match="`ndim` must be at least 3 .*; got 2"):
        pencilfft.get_fft_output_sharding(sharding, ndim=2)
    with pytest.raises(ValueError, match="`layout` must be one of"):
        pencilfft.get_fft_output_sharding(sharding, layout="zyx")


def test_docs_document_the_migration():
    """docs/howto/particle-mesh.md's migration section (once the README's) names every function."""
    text = (ROOT / "docs" / "howto" / "particle-mesh.md").read_text()
    section = text[text.index("## Migrating from jaxdecomp"):]
    end = section.find("\n## ", 1)
    section = section[: end if end > 0 else len(section)]
    assert "import pencilfft.compat as jaxdecomp" in section
    assert "import pencilfft.compat; pencilfft.compat.install()" in section
    table = [line for line in section.splitlines() if line.startswith("| `")]
    for name in NAMES:
        assert any(line.startswith(f"| `{name}(") for line in table), name
    assert "(P, 1)" in section  # the one difference in the FFTs' output


@pytest.fixture
def no_jaxdecomp():
    """As if jaxdecomp had never been imported; afterwards sys.modules' jaxdecomp entries are
    what they were (install() registers several: none of them may leak into other tests)."""
    def ours():
        return {k: v for k, v in sys.modules.items() if k.split(".")[0] == "jaxdecomp"}

    saved = ours()
    for name in saved:
        del sys.modules[name]
    yield
    for name in ours():
        del sys.modules[name]
    sys.modules.update(saved)


def test_install(no_jaxdecomp):
    sys.modules["jaxdecomp"] = types.ModuleType("jaxdecomp")
    with pytest.raises(RuntimeError, match="jaxdecomp is already imported"):
        compat.install()
    del sys.modules["jaxdecomp"]
    assert compat.install() is compat
    import jaxdecomp

    assert jaxdecomp is compat and all(callable(getattr(jaxdecomp, n)) for n in NAMES)
    assert compat.install() is compat  # twice: nothing changes


def test_install_provides_the_names_clients_import_from_jaxdecomp_src(no_jaxdecomp):
    """jaxdecomp's own tests import these from its internals (issue 31); nothing else is there."""
    compat.install()
    import jaxdecomp._src.spmd_ops
    from jaxdecomp._src import NO_DECOMP, PENCILS, SLAB_XY, SLAB_YZ
    from jaxdecomp._src.spmd_ops import ALLOW_SHARDY_PARTITIONER

    assert (SLAB_XY, SLAB_YZ, PENCILS, NO_DECOMP) == (0, 1, 2, 3)  # jaxdecomp's values
    assert (NO_DECOMP, SLAB_XY, SLAB_YZ, PENCILS) == (compat.NO_DECOMP, compat.SLAB_XY,
                                                      compat.SLAB_YZ, compat.PENCILS)
    assert PENCILS is compat.PENCILS is compat.PencilType.PENCILS
    assert ALLOW_SHARDY_PARTITIONER is True  # jaxdecomp: jax > 0.7.0; pencilfft needs >= 0.9
    src = sys.modules["jaxdecomp._src"]
    assert jaxdecomp._src is src and src.spmd_ops is sys.modules["jaxdecomp._src.spmd_ops"]
    assert sorted(n for n in vars(src) if not n.startswith("_")) == [
        "NO_DECOMP", "PENCILS", "SLAB_XY", "SLAB_YZ", "spmd_ops"]
    assert [n for n in vars(src.spmd_ops) if not n.startswith("_")] == ["ALLOW_SHARDY_PARTITIONER"]
    with pytest.raises(ImportError):
        from jaxdecomp._src import get_pencil_info  # noqa: F401  cuDecomp's: not provided
    with pytest.raises(ModuleNotFoundError):
        import jaxdecomp._src.pencil_utils  # noqa: F401


def test_constants_are_jaxdecomps():
    """jaxdecomp._src's names and the public constants have jaxdecomp's values."""
    spmd_ops = pytest.importorskip("jaxdecomp._src.spmd_ops")
    src, jaxdecomp = sys.modules["jaxdecomp._src"], sys.modules["jaxdecomp"]
    assert src is not compat._src and jaxdecomp is not compat
    assert spmd_ops.ALLOW_SHARDY_PARTITIONER == compat._src.spmd_ops.ALLOW_SHARDY_PARTITIONER
    for name in ("NO_DECOMP", "PENCILS", "SLAB_XY", "SLAB_YZ"):
        theirs = getattr(src, name)  # jaxdecomp's C++ enum: its name and value
        assert (theirs.name, theirs.value) == (name, getattr(compat._src, name)), name
    for name in [*compat.HaloCommBackend.__members__, *compat.TransposeCommBackend.__members__]:
        theirs = getattr(jaxdecomp, name)
        assert (theirs.name, theirs.value) == (name, getattr(compat, name)), name


# (spec, mesh shape, mesh axis names): every branch of jaxdecomp's check, and specs that pass.
SPEC_CASES = [
    (P("z", "y"), (2, 4), ("z", "y")),
    (P("z", None), (8, 1), ("z", "y")),
    (P(None, "y"), (1, 8), ("z", "y")),
    (P(), (1, 1), ("z", "y")),
    (("z", "y", None), (2, 4), ("z", "y")),
    (P("c", "z", "y"), (2, 2, 2), ("c", "z", "y")),
    (P(None, "y"), (2, 4), ("z", "y")),  # None where the mesh axis is split
    (P("x", "y"), (2, 4), ("z", "y")),  # a name the mesh does not have there
    (P("y", "z"), (2, 4), ("z", "y")),  # the mesh's names in another order
    (P("z"), (2, 4), ("z", "y")),  # the trailing split axis left out
    (("z", None), (2, 4), ("z", "y")),  # a tuple, shown as a tuple
    (P("z", "y", "x"), (2, 4), ("z", "y")),  # beyond the mesh's axes: 'nothing (trailing)'
    (P(("z", "y")), (2, 4), ("z", "y")),  # two mesh axes on one dimension
    (P("c", "z"), (2, 2, 2), ("c", "z", "y")),
]


def _outcome(validate, spec, shape, names):
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(names))
    try:
        validate(spec, mesh)
    except Exception as e:  # noqa: BLE001  the exception is what is compared
        return type(e), str(e)
    return None


def test_validate_spec_matches_mesh_words_as_jaxdecomp():
    """The messages of jaxdecomp 0.3.1, which its test_sharding_validation matches on."""
    with pytest.raises(ValueError) as e:
        compat.validate_spec_matches_mesh(P(None, "y"), jax.make_mesh((2, 4), ("z", "y")))
    assert str(e.value) == (
        "Spec P(None, 'y', None) does not match mesh axis names ('z', 'y'). At position 0: spec "
        "has None but mesh axis 'z' has size 2 (> 1). An unsharded dimension cannot correspond "
        "to a distributed mesh axis.")
    with pytest.raises(ValueError) as e:
        compat.validate_spec_matches_mesh(P("x", "y"), jax.make_mesh((2, 4), ("z", "y")))
    assert str(e.value) == (
        "Spec P('x', 'y', None) does not match mesh axis names ('z', 'y'). At position 0: spec "
        "has 'x' but mesh expects 'z'. Ensure the array is sharded with a spec matching the mesh "
        "axis order.")
    with pytest.raises(ValueError, match="At position 2: spec has 'x' but mesh expects "
                                         r"'nothing \(trailing\)'"):
        compat.validate_spec_matches_mesh(P("z", "y", "x"), jax.make_mesh((2, 4), ("z", "y")))
    outcomes = [_outcome(compat.validate_spec_matches_mesh, *case) for case in SPEC_CASES]
    assert [o is None for o in outcomes] == [True] * 6 + [False] * 8
    jaxdecomp = pytest.importorskip("jaxdecomp")
    assert jaxdecomp is not compat
    assert outcomes == [_outcome(jaxdecomp.validate_spec_matches_mesh, *c) for c in SPEC_CASES]


# ----------------------------------------------------------------------------------------------
# The acceptance: a PM code written against jaxdecomp, on jaxdecomp and on pencilfft.compat

# What a user's script does (benchmarks.pm's pipeline is written against the five names: it
# only calls lib.pfft3d, lib.pifft3d(...).real, lib.fftfreq3d, lib.halo_exchange and
# lib.get_fft_output_sharding).
SCRIPT = """
import sys
sys.modules["jaxdecomp"] = None            # jaxdecomp not installed: `import jaxdecomp` fails
import pencilfft.compat; pencilfft.compat.install()   # the README's line
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
import jaxdecomp
import jaxdecomp.fft                       # jax-power's and jaxdecomp's tests' path
from jaxdecomp import fftfreq3d, get_fft_output_sharding, halo_exchange, pfft3d, pifft3d
from jaxdecomp.fft import pfft3d as pfft3d_from_fft
assert jaxdecomp.fft.pfft3d is pfft3d_from_fft is pfft3d
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from benchmarks import pm

mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
noise = np.load(sys.argv[1])
x = jax.device_put(noise, NamedSharding(mesh, P("x", "y")))
dx, rho = pm.simulate(x, pm.Grid(noise.shape, mesh), pm.ops_from_module(jaxdecomp), steps={steps})
np.savez(sys.argv[2], dx=np.asarray(dx), rho=np.asarray(rho), lib=jaxdecomp.__name__)
"""


@pytest.fixture(scope="module")
def noise():
    return random_field(SHAPE, np.float64, seed=52)


@pytest.fixture(scope="module")
def reference_fields(noise):
    """The fields with the real jaxdecomp; with the one-device pipeline when it is not installed."""
    try:
        import jaxdecomp
    except ImportError:
        dx, rho = pm.simulate(jnp.asarray(noise), pm.Grid(SHAPE), pm.one_device_ops(SHAPE),
                              steps=STEPS)
        return np.asarray(dx), np.asarray(rho)
    assert jaxdecomp is not compat
    mesh = make_mesh((4, 2), "auto")
    dx, rho = pm.simulate(put_global(noise, pencilfft.real_space_sharding(mesh)),
                          pm.Grid(SHAPE, mesh), pm.ops_from_module(jaxdecomp), steps=STEPS)
    return to_numpy(dx), to_numpy(rho)


def test_pm_code_for_jaxdecomp_runs_without_it(tmp_path, noise, reference_fields):
    """(tests/tooling/test_pm.py runs the same pipeline through pencilfft.compat in-process, also under
    mpirun, against the one-device run.)"""
    np.save(tmp_path / "noise.npy", noise)
    script = tmp_path / "pm_script.py"
    script.write_text(SCRIPT.format(steps=STEPS))
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "noise.npy"),
                           str(tmp_path / "out.npz")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    assert str(out["lib"]) == "pencilfft.compat"
    assert rel_err(out["dx"], reference_fields[0]) <= 1e-12
    assert rel_err(out["rho"], reference_fields[1]) <= 1e-12
