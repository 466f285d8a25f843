"""`jaxdecomp.transpose`: the pencil transposes, on pencilfft's exchange.

jaxdecomp names array axes from the last: its "X pencil" is a global array (d0, d1, d2) split
P(a, b, -) over the mesh's pencil axes (a, b) (its last two; axes before them split a leading
batch axis), whole along d2.  Each transpose is one exchange over one mesh axis.  With
`config.transpose_axis_contiguous` True (the default) the whole axis also moves last:

=========  ==========  ===========  ==========================
transpose  input spec  output spec  global result (contiguous)
=========  ==========  ===========  ==========================
XtoY       (a, b, -)   (b, a, -)    x.transpose(2, 0, 1)
YtoZ       (b, a, -)   (a, b, -)    x.transpose(2, 0, 1)
ZtoY       (a, b, -)   (b, a, -)    x.transpose(1, 2, 0)
YtoX       (b, a, -)   (a, b, -)    x.transpose(1, 2, 0)
XtoZ       (a, b, -)   (b, a, -)    x.transpose(1, 2, 0)
ZtoX       (b, a, -)   (a, b, -)    x.transpose(2, 0, 1)
=========  ==========  ===========  ==========================

With it False the global array keeps its order and only its split moves: XtoY (a, b, -) ->
(a, -, b), YtoZ -> (-, a, b), ZtoY -> (a, -, b), YtoX -> (a, b, -), XtoZ (a, b, -) -> (-, b, a),
ZtoX back.  An input in another sharding is resharded to the table's input spec first.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from .._decomposition.mesh import batch_mesh, find_mesh
from .._decomposition.rules import check_batch, mesh_axes
from .._decomposition.sharding import real_space_spec
from .._transforms.partitioned import LinearOp, run
from .._transforms.plan import check_array
from .._transforms.transpose import transpose_blocks
from ._config import config
from .fft import check_backend

__all__ = ["transposeXtoY", "transposeXtoZ", "transposeYtoX", "transposeYtoZ", "transposeZtoX",
           "transposeZtoY"]

# kind -> (exchange over the axis splitting input dim `over`, local axis split, local axis
# gathered), contiguous and not.  Dims are numbered in the (d0, d1, d2) block.
_FORWARD = (2, 0, 1)
_BACKWARD = (1, 2, 0)
_CONTIGUOUS = {  # (over, split, gather, order): order moves the gathered axis last
    "x_y": (1, 2, 1, _FORWARD), "y_z": (1, 2, 1, _FORWARD), "z_x": (1, 2, 1, _FORWARD),
    "z_y": (0, 2, 0, _BACKWARD), "y_x": (0, 2, 0, _BACKWARD), "x_z": (0, 2, 0, _BACKWARD),
}
_IN_PLACE = {  # (over: the input dim whose split moves, split, gather); order (0, 1, 2)
    "x_y": (1, 2, 1), "y_z": (0, 1, 0), "z_y": (1, 0, 1), "y_x": (2, 1, 2),
    "x_z": (0, 2, 0), "z_x": (2, 0, 2),
}
# The input spec of each kind, in terms of the pencil axes: "ab" = (a, b, -), "ba" = (b, a, -).
_IN_SPEC = {
    True: {"x_y": "ab-", "y_z": "ba-", "z_y": "ab-", "y_x": "ba-", "x_z": "ab-", "z_x": "ba-"},
    False: {"x_y": "ab-", "y_z": "a-b", "z_y": "-ab", "y_x": "a-b", "x_z": "ab-", "z_x": "-ba"},
}
# Shardy factors: which input dim's sharding each output dim takes.
_RULE = {
    True: {k: "j i k" for k in _CONTIGUOUS},
    False: {"x_y": "i k j", "y_z": "j i k", "z_y": "j i k", "y_x": "i k j", "x_z": "k j i",
            "z_x": "k j i"},
}


@dataclasses.dataclass(frozen=True)
class Transpose(LinearOp):
    """One of jaxdecomp's transposes of a global array of `in_shape` (its mesh may be left open)."""

    in_shape: tuple[int, ...]
    dtype: Any
    kind: str
    contiguous: bool
    deferred: Any = None  # see _decomposition.mesh.batch_mesh
    transposed: bool = False

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self._permute(self.in_shape)

    def _permute(self, shape):
        if not self.contiguous:
            return tuple(shape)
        lead, last3 = tuple(shape[:-3]), tuple(shape[-3:])
        return lead + tuple(last3[i] for i in _CONTIGUOUS[self.kind][3])

    def batched(self, n: int) -> Transpose:
        return dataclasses.replace(self, in_shape=(n,) + self.in_shape)

    def primal_local(self, x: jax.Array) -> jax.Array:
        if not self.contiguous:
            return x
        lead = tuple(range(x.ndim - 3))
        return jnp.transpose(x, lead + tuple(len(lead) + i for i in _CONTIGUOUS[self.kind][3]))

    def primal_on_mesh(self, mesh):
        check_batch(self.in_shape, mesh, "x")
        (a, b), (pa, pb) = mesh_axes(mesh)
        names = {"a": (a, pa), "b": (b, pb), "-": (None, 1)}
        pattern = _IN_SPEC[self.contiguous][self.kind]
        in_split = [names[c] for c in pattern]
        if self.contiguous:
            over, split, gather, order = _CONTIGUOUS[self.kind]
        else:
            (over, split, gather), order = _IN_PLACE[self.kind], (0, 1, 2)
        axis, n = in_split[over]
        out_split = list(in_split)
        out_split[split], out_split[gather] = (axis, n), (None, 1)
        out_split = [out_split[i] for i in order]
        n_lead = len(self.in_shape) - 3
        for d, (name, size) in enumerate(in_split):
            if self.in_shape[n_lead + d] % size:
                raise ValueError(
                    f"`x.shape[{n_lead + d}]` (={self.in_shape[n_lead + d]}) must be divisible by "
                    f"mesh axis {name!r} (={size}), which splits it before the transpose"
                )
        if self.in_shape[n_lead + split] % n:
            raise ValueError(
                f"`x.shape[{n_lead + split}]` (={self.in_shape[n_lead + split]}) must be divisible "
                f"by mesh axis {axis!r} (={n}), which splits it in the transpose"
            )
        lead = list(real_space_spec(mesh, len(self.in_shape)))[:-3]  # the batch axes' entries
        in_spec = P(*lead, *(name for name, _ in in_split))
        out_spec = P(*lead, *(name for name, _ in out_split))

        def body(x):
            k = x.reshape((-1,) + x.shape[-3:])
            k = transpose_blocks(k, axis, n, split + 1, gather + 1, (0,) + tuple(i + 1 for i in order))
            return k.reshape(x.shape[:-3] + k.shape[1:])

        return body, in_spec, out_spec

    def primal_rule(self) -> tuple[str, str]:
        return "i j k", _RULE[self.contiguous][self.kind]


def _transpose(x, kind: str, backend: str) -> jax.Array:
    check_backend(backend)
    shape = check_array(x, "x")
    mesh, deferred = batch_mesh(x, shape, find_mesh(x, None), "x")
    op = Transpose(shape, np.dtype(x.dtype), kind, config.transpose_axis_contiguous, deferred)
    if mesh is None and not isinstance(x, jax.core.Tracer):
        sharding = getattr(x, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1:
            raise ValueError(f"`x` is spread over {len(sharding.device_set)} devices by a "
                             f"{type(sharding).__name__} that names no mesh; place it with a "
                             f"NamedSharding")
    return run(op, x, mesh)


def _public(name: str, kind: str, doc: str):
    """jaxdecomp's `name`(x, backend="jax"): the exchange `kind` (one body for the six)."""
    def transpose(x, backend: str = "jax") -> jax.Array:
        return _transpose(x, kind, backend)

    transpose.__name__ = transpose.__qualname__ = name
    shape = (4, 16, 8) if "(2, 0, 1)" in doc else (8, 4, 16)
    transpose.__doc__ = doc + _EXAMPLE.format(name=name, shape=shape)
    return transpose


# Each transpose's docstring ends with this (the global shapes of a (16, 8, 4) input on 4x2).
_EXAMPLE = """

Takes the global array `x` (d0, d1, d2) in any sharding (resharded to the table's input spec
first) and returns the transposed global array in the output spec; a ValueError names the
axis the mesh does not divide.

Example:
  >>> import pencilfft.compat as jaxdecomp
  >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
  >>> x = jax.device_put(np.ones((16, 8, 4), np.float32), pencilfft.real_space_sharding(mesh))
  >>> jaxdecomp.{name}(x).shape
  {shape}
"""


# name: (exchange, what it does).  X pencil: (a, b, -); Y pencil: (b, a, -); Z pencil: (a, b, -).
_PUBLIC = {
    "transposeXtoY": ("x_y", "X pencil -> Y pencil: global x.transpose(2, 0, 1) (see the table)."),
    "transposeYtoZ": ("y_z", "Y pencil -> Z pencil: global x.transpose(2, 0, 1)."),
    "transposeZtoY": ("z_y", "Z pencil -> Y pencil: global x.transpose(1, 2, 0)."),
    "transposeYtoX": ("y_x", "Y pencil -> X pencil: global x.transpose(1, 2, 0)."),
    "transposeXtoZ": ("x_z", "X pencil -> (b, a, -) in one exchange over a: x.transpose(1, 2, 0)."),
    "transposeZtoX": ("z_x", "(b, a, -) -> X pencil in one exchange over a: x.transpose(2, 0, 1)."),
}
transposeXtoY, transposeYtoZ, transposeZtoY, transposeYtoX, transposeXtoZ, transposeZtoX = (
    _public(name, kind, doc) for name, (kind, doc) in _PUBLIC.items())
