"""The lowered StableHLO of pfft3d & co. on a fixed set of cases, for the test that their
programs stay unchanged (tests/test_hlo.py, `test_pfft3d_programs_are_unchanged`).

`programs()` lowers each case for CPU and for CUDA and returns {case name: text}.  The CUDA
programs need no GPU: the CPU devices' jit lowers for another platform when asked
(`lowering_platforms=("cuda",)`), which jaxlib does without its CUDA plugin.

The reference texts, one file per jax release they were lowered on
(tests/data/pfft3d_stablehlo-jax<version>.json.gz, `recorded()`): a different jax lowers the same
code differently, so each tested release (`pencilfft._jax_private.TESTED_JAX`; the jax of each
constraints file, tests/test_dependencies.py checks it) has its own, and the test compares with
the one of the running jax (it skips, saying so, on a jax none was recorded on).  Record one with
`python tests/stablehlo_programs.py` on the new jax from a commit known to be right: one whose
programs are identical to a recorded release's on that release.

* jax 0.10.2: written from the code before the N-D planner (issue 54).  Rewritten twice since,
  on purpose, each time for the same two CPU programs alone, `pifft3d/one/transposed/cpu` and
  `pirfft3d/one/transposed/cpu` (every CUDA program and every other CPU program identical), both
  for issue 55: the one-device inverse's two FFTW calls scaled once, in the second call (`scale`
  attributes 1/8 and 1/64 -> 1 and 1/512); then the inverse became the forward's mirror, the
  1-D call over X writing the computed order and scaling for both (`out_order` and `scale` move
  from the second call to the first).
* jax 0.12.0.1 (issue 67): from commit fbced6c, whose 96 programs are identical to the jax
  0.10.2 file's on jax 0.10.2.  jax 0.12 lowers every one differently: a sharding constraint on
  the result, integer constants converted in the program; the CPU programs have the same ops
  otherwise, in the same order.  In the CUDA ones jax's own ops change: collectives name their
  mesh axes, and `jnp.fft.irfftn` over three axes is one 3-D inverse FFT after slices that make
  its input Hermitian (jax 0.10: a transpose, a 2-D inverse FFT, a transpose and a 1-D one).
"""
from __future__ import annotations

import gzip
import json
import os
import re

import jax
import numpy as np
from jax.sharding import AxisType

import pencilfft

DATA = os.path.join(os.path.dirname(__file__), "data")
_NAME = re.compile(r"pfft3d_stablehlo-jax(?P<version>[\w.]+)\.json\.gz")

# (case name, mesh shape, mesh names, global shape, layout): pencils both ways, slabs, one
# device (a 1x1 mesh), a grid the mesh does not divide in k space, a batch axis of the mesh.
MESHES = [
    ("one", (1, 1), ("x", "y"), (8, 8, 8)),
    ("slab8", (8,), ("x",), (16, 8, 8)),
    ("pencil4x2", (4, 2), ("x", "y"), (8, 8, 8)),
    ("pencil2x4", (2, 4), ("x", "y"), (8, 8, 8)),
    ("padded4x2", (4, 2), ("x", "y"), (8, 6, 10)),
    ("batch2x2x2", (2, 2, 2), ("c", "x", "y"), (2, 8, 8, 8)),
]
KINDS = ("dct2", "fft", "fft")


def _functions(shape, layout):
    s = shape[-3:]
    return {
        "pfft3d": (np.complex64, lambda a: pencilfft.pfft3d(a, layout=layout), True),
        "pifft3d": (np.complex64, lambda k: pencilfft.pifft3d(k, layout=layout), False),
        "prfft3d": (np.float32, lambda a: pencilfft.prfft3d(a, layout=layout), True),
        "pirfft3d": (np.float32, lambda k: pencilfft.pirfft3d(k, s, layout=layout), False),
        "ptransform3d": (np.float32, lambda a: pencilfft.ptransform3d(a, KINDS, layout=layout),
                         True),
        "pitransform3d": (np.float32, lambda k: pencilfft.pitransform3d(k, KINDS, s=s,
                                                                       layout=layout), False),
    }


def _normalized(text: str) -> str:
    return re.sub(r"\s*loc\([^\n]*", "", text)


def cases():
    """(name, function, argument) for every program compared."""
    out = []
    for mesh_name, dims, names, shape in MESHES:
        mesh = jax.make_mesh(dims, names, axis_types=(AxisType.Explicit,) * len(dims),
                             devices=jax.devices()[:int(np.prod(dims))])
        layouts = ("transposed", "natural") if mesh_name in ("pencil4x2", "padded4x2") else \
            ("transposed",)
        for layout in layouts:
            real = pencilfft.real_space_sharding(mesh, len(shape))
            for fname, (dtype, f, forward) in _functions(shape, layout).items():
                x = jax.ShapeDtypeStruct(shape, dtype, sharding=real)
                if not forward:
                    fwd = {"pifft3d": "pfft3d", "pirfft3d": "prfft3d",
                           "pitransform3d": "ptransform3d"}[fname]
                    dt, g, _ = _functions(shape, layout)[fwd]
                    k = jax.eval_shape(g, jax.ShapeDtypeStruct(shape, dt, sharding=real))
                    x = jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=pencilfft.k_space_sharding(
                        mesh, layout, len(shape)))
                out.append((f"{fname}/{mesh_name}/{layout}", f, x))
    return out


def programs() -> dict[str, str]:
    texts = {}
    for name, f, x in cases():
        traced = jax.jit(f).trace(x)
        for platform in ("cpu", "cuda"):
            texts[f"{name}/{platform}"] = _normalized(
                traced.lower(lowering_platforms=(platform,)).as_text())
    return texts


def path_for(version: str) -> str:
    """The reference file of the programs lowered on jax `version`."""
    return os.path.join(DATA, f"pfft3d_stablehlo-jax{version}.json.gz")


def recorded() -> list[str]:
    """The jax versions reference programs were recorded on, in release order."""
    names = (_NAME.fullmatch(name) for name in os.listdir(DATA))
    versions = [m.group("version") for m in names if m]
    return sorted(versions, key=lambda v: tuple(int(n) for n in re.findall(r"\d+", v)))


def load(version: str) -> dict[str, str]:
    """{case name: text} lowered on jax `version` (`recorded()` says which there are)."""
    with gzip.open(path_for(version), "rt") as f:
        data = json.load(f)
    assert data["jax"] == version, f"{path_for(version)} holds programs of jax {data['jax']}"
    return data["programs"]


if __name__ == "__main__":
    # As tests/conftest.py: 8 CPU devices, 64-bit types on.
    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() >= 8, ("run with JAX_PLATFORMS=cpu "
                                     "XLA_FLAGS=--xla_force_host_platform_device_count=8")
    path = path_for(jax.__version__)
    with gzip.open(path, "wt") as f:
        json.dump({"jax": jax.__version__, "programs": programs()}, f, sort_keys=True)
    print(f"wrote {path}")
