"""Bad input fails at the call, with a ValueError/TypeError naming the argument and the sizes.

Every case is checked eagerly and, where the bad input survives tracing (array arguments), under
jit too: the check must run at trace time, never as an XLA error, a wrong result or a hang.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft as pf
from conftest import MPIRUN, make_mesh, put_global

# long double is wider than float64 on x86-64 and aarch64 Linux; on macOS arm64 and Windows it
# is float64 itself, which jax supports, so there is no wrong dtype to test.
LONG_DOUBLE_IS_WIDER = np.finfo(np.longdouble).bits > 64


@pytest.fixture(scope="module")
def env():
    mesh = make_mesh((4, 2))
    amesh = make_mesh((4, 2), "auto")
    mesh24 = make_mesh((2, 4))
    mesh3 = jax.make_mesh((2, 2, 2), ("a", "b", "c"), axis_types=(AxisType.Explicit,) * 3)
    x = np.random.default_rng(60).standard_normal((16, 16, 16))
    return SimpleNamespace(
        mesh=mesh,
        amesh=amesh,
        mesh24=mesh24,
        mesh3=mesh3,
        x=x,
        xs=put_global(x, pf.real_space_sharding(mesh)),
        # k-space arrays as pfft3d / prfft3d return them for (16, 16, 16) on (4, 2):
        k=put_global(np.zeros((16, 16, 16), complex), pf.k_space_sharding(mesh)),
        kr=put_global(np.zeros((16, 10, 16), complex), pf.k_space_sharding(mesh)),  # 9 -> 10
    )


def case(id, make, exc, *fragments, jit=True):
    """make(env) -> (fn, args); fn(*args) must raise `exc` with every fragment in its message,
    eagerly and (with jit=True: array arguments only) under jax.jit."""
    return [pytest.param(make, exc, fragments, mode, id=f"{id}-{mode}")
            for mode in (("eager", "jit") if jit else ("eager",))]


CASES = [
    # -- fewer than 3 dimensions
    case("ndim-pfft3d", lambda e: (lambda a: pf.pfft3d(a, mesh=e.mesh), (np.zeros((8, 8)),)),
         ValueError, "`x`", "at least 3 dimensions", "(8, 8)"),
    case("ndim-prfft3d", lambda e: (lambda a: pf.prfft3d(a, mesh=e.mesh), (np.zeros(8),)),
         ValueError, "`x`", "at least 3 dimensions", "(8,)"),
    case("ndim-pifft3d", lambda e: (lambda a: pf.pifft3d(a, mesh=e.mesh), (np.zeros((8, 8), complex),)),
         ValueError, "`k`", "at least 3 dimensions", "(8, 8)"),
    case("ndim-pirfft3d",
         lambda e: (lambda a: pf.pirfft3d(a, (8, 8, 8), mesh=e.mesh), (np.zeros((8, 5), complex),)),
         ValueError, "`k`", "at least 3 dimensions", "(8, 5)"),
    case("ndim-fftfreq3d",
         lambda e: (lambda a: pf.fftfreq3d(a, mesh=e.mesh), (np.zeros((8, 8), complex),)),
         ValueError, "`k`", "at least 3 dimensions", "(8, 8)"),
    # -- a mesh with a batch axis ('a' of (a, b, c)) and an array without a leading axis for it
    case("batch-missing-pfft3d", lambda e: (lambda a: pf.pfft3d(a, mesh=e.mesh3), (e.x,)),
         ValueError, "`x`", "(16, 16, 16)", "0 leading (batch) axes", "('a',)", "(2,)"),
    case("batch-missing-pirfft3d",
         lambda e: (lambda a: pf.pirfft3d(a, (16, 16, 16), mesh=e.mesh3), (np.zeros((16, 9, 16), complex),)),
         ValueError, "`k`", "0 leading (batch) axes", "('a',)"),
    case("batch-missing-in-sharding",  # under jit XLA's partitioner reports it (test_batch.py)
         lambda e: (pf.pfft3d, (put_global(e.x, NamedSharding(e.mesh3, P("a", "b", "c"))),)),
         ValueError, "`x`", "0 leading (batch) axes", "('a',)", jit=False),
    case("batch-missing-fftfreq3d",  # under jit the vectors are constants: nothing to refuse
         lambda e: (lambda a: pf.fftfreq3d(a, mesh=e.mesh3), (np.zeros((8, 8, 8), complex),)),
         ValueError, "`k`", "batch", jit=False),
    case("batch-indivisible", lambda e: (lambda a: pf.pfft3d(a, mesh=e.mesh3), (np.zeros((3, 8, 8, 8)),)),
         ValueError, "`x.shape[0]` (=3)", "mesh batch axis 'a' (=2)"),
    case("batch-indivisible-halo",
         lambda e: (lambda a: pf.halo_exchange(a, (1, 1), mesh=e.mesh3), (np.zeros((3, 8, 8, 8)),)),
         ValueError, "`x.shape[0]` (=3)", "mesh batch axis 'a' (=2)"),
    # -- X (Y) not divisible by the mesh axis splitting it in real space
    case("x-indivisible",
         lambda e: (pf.pfft3d, (put_global(np.zeros((30, 16, 16)), NamedSharding(e.mesh, P())),)),
         ValueError, "`x.shape[0]`", "X=30", "'x'", "=4"),
    case("x-indivisible-auto",
         lambda e: (lambda a: pf.prfft3d(a, mesh=e.amesh), (np.zeros((30, 16, 16)),)),
         ValueError, "`x.shape[0]`", "X=30", "'x'", "=4"),
    case("y-indivisible",
         lambda e: (pf.pfft3d, (put_global(np.zeros((16, 30, 16)), NamedSharding(e.mesh24, P())),)),
         ValueError, "`x.shape[1]`", "Y=30", "'y'", "=4"),
    case("y-indivisible-batch",
         lambda e: (lambda a: pf.prfft3d(a, mesh=e.mesh24), (np.zeros((2, 16, 30, 16)),)),
         ValueError, "`x.shape[2]`", "Y=30", "'y'", "=4"),
    case("x-indivisible-inverse",
         lambda e: (lambda a: pf.pirfft3d(a, (30, 16, 16), mesh=e.mesh), (np.zeros((16, 9, 30), complex),)),
         ValueError, "`s[0]`", "X=30", "'x'", "(=4)", "(30, 16, 16)"),
    # -- norm and layout
    *[case(f"norm-{name}", lambda e, f=f: (lambda a: f(a, "bogus"), (e.xs if real_in else e.kr,)),
           ValueError, "`norm`", "'bogus'", "'backward'", "'ortho'", "'forward'")
      for name, f, real_in in [("pfft3d", pf.pfft3d, True), ("prfft3d", pf.prfft3d, True),
                               ("pifft3d", pf.pifft3d, False),
                               ("pirfft3d", lambda a, n: pf.pirfft3d(a, (16, 16, 16), n), False)]],
    *[case(f"layout-{name}", lambda e, f=f: (lambda a: f(a, layout="xyz"), (e.xs if real_in else e.kr,)),
           ValueError, "`layout`", "'xyz'", "'transposed'", "'natural'")
      for name, f, real_in in [("pfft3d", pf.pfft3d, True), ("prfft3d", pf.prfft3d, True),
                               ("pifft3d", pf.pifft3d, False),
                               ("pirfft3d", lambda a, **kw: pf.pirfft3d(a, (16, 16, 16), **kw), False),
                               ("fftfreq3d", pf.fftfreq3d, False),
                               ("rfftfreq3d", lambda a, **kw: pf.rfftfreq3d(a, s=(16, 16, 16), **kw), False)]],
    # -- dtypes
    case("shape-dtype-struct",  # jax.eval_shape(pf.pfft3d, s) is the way (test_fft.py)
         lambda e: (lambda a: pf.pfft3d(a), (jax.ShapeDtypeStruct((8, 8, 8), np.float32),)),
         TypeError, "`x` is a jax.ShapeDtypeStruct", "jax.eval_shape(pencilfft.pfft3d, x)",
         jit=False),
    case("str-pfft3d", lambda e: (lambda a: pf.pfft3d(a, mesh=e.mesh), (np.full((8, 8, 8), "a"),)),
         TypeError, "`x`", "numeric", "<U1", jit=False),
    case("str-pirfft3d",
         lambda e: (lambda a: pf.pirfft3d(a, (8, 8, 8), mesh=e.mesh), (np.full((8, 5, 8), "a"),)),
         TypeError, "`k`", "numeric", "<U1", jit=False),
    case("object-prfft3d",
         lambda e: (lambda a: pf.prfft3d(a, mesh=e.mesh), (np.full((8, 8, 8), None, dtype=object),)),
         TypeError, "`x`", "numeric", "object", jit=False),
    case("complex-prfft3d", lambda e: (pf.prfft3d, (put_global(e.x.astype(complex), pf.real_space_sharding(e.mesh)),)),
         TypeError, "`x`", "real", "complex128", "pfft3d"),
    # -- s
    case("pirfft3d-no-s", lambda e: (pf.pirfft3d, (e.kr,)), TypeError, "'s'"),
    case("pirfft3d-s-None", lambda e: (lambda a: pf.pirfft3d(a, None), (e.kr,)),
         ValueError, "`s`", "required"),
    case("rfftfreq3d-s-None", lambda e: (lambda a: pf.rfftfreq3d(a, s=None), (e.kr,)),
         ValueError, "`s`", "required"),
    *[case(f"pirfft3d-s-wrong-{axis}", lambda e, s=s: (lambda a: pf.pirfft3d(a, s), (e.kr,)),
           ValueError, "`s` = " + str(s), "(16, 10, 16)", want)
      for axis, s, want in [("X", (8, 16, 16), "(16, 9, 8)"), ("Y", (16, 8, 16), "(8, 9, 16)"),
                            ("Z", (16, 16, 32), "(16, 17, 16)")]],
    *[case(f"pifft3d-s-wrong-{axis}", lambda e, s=s: (lambda a: pf.pifft3d(a, s=s), (e.k,)),
           ValueError, "`s` = " + str(s), "(16, 16, 16)", want)
      for axis, s, want in [("X", (8, 16, 16), "(16, 16, 8)"), ("Y", (16, 32, 16), "(32, 16, 16)"),
                            ("Z", (16, 16, 12), "(16, 12, 16)")]],
    *[case(f"s-{name}", lambda e, s=s: (lambda a: pf.pirfft3d(a, s), (e.kr,)),
           ValueError, "`s`", "3 positive ints", str(tuple(s)))
      for name, s in [("length-2", (16, 16)), ("length-4", (1, 16, 16, 16)),
                      ("negative", (16, -16, 16)), ("zero", (0, 16, 16))]],
    case("s-not-a-sequence", lambda e: (lambda a: pf.pifft3d(a, s=16), (e.k,)),
         TypeError, "`s`", "16"),
    case("s-None-entry", lambda e: (lambda a: pf.pirfft3d(a, (16, 16, None)), (e.kr,)),
         TypeError, "`s`", "None"),
    # numpy and jnp raise TypeError for a non-integral s; 16.5 must not silently become 16.
    case("s-non-integer", lambda e: (lambda a: pf.pirfft3d(a, (16, 16, 16.5)), (e.kr,)),
         (TypeError, ValueError), "`s`", "16.5"),
    case("s-string-entry", lambda e: (lambda a: pf.pirfft3d(a, (16, 16, "a")), (e.kr,)),
         (TypeError, ValueError), "`s`", "'a'"),
    # -- fftfreq3d / rfftfreq3d: s and d must fit k
    case("fftfreq3d-s-wrong-X", lambda e: (lambda a: pf.fftfreq3d(a, s=(8, 16, 16)), (e.k,)),
         ValueError, "`s` = (8, 16, 16)", "(16, 16, 16)"),
    case("fftfreq3d-s-wrong-Y", lambda e: (lambda a: pf.fftfreq3d(a, s=(16, 32, 16)), (e.k,)),
         ValueError, "`s` = (16, 32, 16)", "(16, 16, 16)"),
    # k's Y (16) is neither Y = 8 nor 8 padded on this mesh (8): the vectors would be wrong.
    case("fftfreq3d-s-too-small-Y", lambda e: (lambda a: pf.fftfreq3d(a, s=(16, 8, 16)), (e.k,)),
         ValueError, "`s`", "(16, 8, 16)", "(16, 16, 16)"),
    # k's Z (10) is neither 4//2+1 = 3 nor 3 padded to 4.
    case("rfftfreq3d-s-too-small-Z", lambda e: (lambda a: pf.rfftfreq3d(a, s=(16, 16, 4)), (e.kr,)),
         ValueError, "`s`", "(16, 16, 4)", "(16, 10, 16)"),
    case("fftfreq3d-d-length", lambda e: (lambda a: pf.fftfreq3d(a, (1.0, 2.0)), (e.k,)),
         ValueError, "`d`", "(1.0, 2.0)"),
    case("fftfreq3d-d-string", lambda e: (lambda a: pf.fftfreq3d(a, "a"), (e.k,)),
         (TypeError, ValueError), "`d`", "'a'"),
    case("fftfreq3d-d-zero", lambda e: (lambda a: pf.fftfreq3d(a, 0.0), (e.k,)),
         ValueError, "`d`", "0"),
    case("fftfreq3d-d-numeric-string", lambda e: (lambda a: pf.fftfreq3d(a, "1"), (e.k,)),
         TypeError, "`d`", "'1'"),
    case("fftfreq3d-d-bool", lambda e: (lambda a: pf.fftfreq3d(a, True), (e.k,)),
         TypeError, "`d`", "True"),
    # -- inputs jnp.fft.fftn refuses or handles differently
    *[case(f"list-{f.__name__}", lambda e, f=f: (lambda: f([[[1.0, 2.0]]], mesh=e.mesh), ()),
           TypeError, "must be an array", "list", jit=False)
      for f in (pf.pfft3d, pf.prfft3d, pf.pifft3d, pf.fftfreq3d)],
    *[case(f"dtype-{name}-{f.__name__}", lambda e, f=f, dt=dt: (
              lambda: f(np.zeros((8, 8, 8), dt), mesh=e.mesh), ()),
           TypeError, "`k`" if f is pf.pifft3d else "`x`", "numeric dtype", str(np.dtype(dt)),
           jit=False)
      for name, dt, fs in [("timedelta", "m8[s]", (pf.pfft3d, pf.prfft3d, pf.pifft3d)),
                           *([("longdouble", np.longdouble, (pf.pfft3d, pf.prfft3d, pf.pifft3d)),
                              ("clongdouble", np.clongdouble, (pf.pfft3d, pf.pifft3d))]
                             if LONG_DOUBLE_IS_WIDER else [])]
      for f in fs],
    *[case(f"zero-length-{f.__name__}-{shape}", lambda e, f=f, shape=shape: (
              lambda a: f(a, mesh=e.mesh), (np.zeros(shape, complex),)),
           ValueError, "zero-length axis", str(shape))
      for f in (pf.pfft3d, pf.pifft3d)
      for shape in [(0, 8, 8), (8, 8, 0), (2, 0, 8, 8)]],
    # -- mesh= that is not a Mesh
    *[case(f"mesh-is-{name}", lambda e, m=m: (lambda a: f(a, mesh=m(e)), (e.xs if real_in else e.k,)),
           TypeError, "`mesh`", "Mesh", got)
      for name, f, real_in, m, got in [
          ("str", pf.pfft3d, True, lambda e: "x", "str"),
          ("device-list", pf.prfft3d, True, lambda e: jax.devices(), "list"),
          ("sharding", pf.pifft3d, False, lambda e: pf.k_space_sharding(e.mesh), "NamedSharding"),
          ("str-fftfreq3d", pf.fftfreq3d, False, lambda e: "x", "str")]],
]


@pytest.mark.parametrize("make, exc, fragments, mode", [p for c in CASES for p in c])
def test_bad_input(env, make, exc, fragments, mode):
    fn, args = make(env)
    call = jax.jit(fn) if mode == "jit" else fn
    with pytest.raises(exc) as info:
        call(*args)
    message = str(info.value)
    missing = [f for f in fragments if not re.search(re.escape(f), message)]
    assert not missing, f"message {message!r} lacks {missing}"


@MPIRUN  # a deleted multi-process array is refused on every rank
@pytest.mark.parametrize("f", [pf.pfft3d, pf.prfft3d, pf.pifft3d])
def test_deleted_input(env, f):
    """A donated (deleted) array is refused with a message, not a crash inside XLA."""
    x = put_global(env.x.astype(complex if f is pf.pifft3d else float),
                   pf.k_space_sharding(env.mesh) if f is pf.pifft3d else pf.real_space_sharding(env.mesh))
    x.delete()
    name = "`k`" if f is pf.pifft3d else "`x`"
    with pytest.raises(ValueError, match=re.escape(name) + " has been deleted.*donate"):
        f(x)


@MPIRUN  # a refused call leaves no rank waiting in a collective
def test_validation_error_leaves_no_partial_state(env):
    """After a rejected call the same process still transforms correctly (nothing half-done)."""
    with pytest.raises(ValueError):
        pf.pfft3d(put_global(np.zeros((30, 16, 16)), NamedSharding(env.mesh, P())))
    k = pf.prfft3d(env.xs)
    back = pf.pirfft3d(k, (16, 16, 16))
    np.testing.assert_allclose(np.asarray(jax.device_get(back.addressable_shards[0].data)),
                               env.x[back.addressable_shards[0].index], atol=1e-12)
