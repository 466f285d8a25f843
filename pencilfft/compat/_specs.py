"""jaxdecomp's sharding helpers: which spec a transform's output has, and whether a spec fits a
mesh.  They answer with pencilfft's shardings (what `compat`'s transforms return): the same as
jaxdecomp's except on a (P, 1) mesh, where pencilfft splits Y of the spectrum and jaxdecomp Z.
"""
from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from ._config import PencilType, layout

__all__ = ["FftType", "get_output_specs", "pencil_type", "validate_spec_matches_mesh"]

FftType = jax.lax.FftType
_FORWARD = (FftType.FFT, FftType.RFFT)


def pencil_type(mesh) -> PencilType:
    """The kind of decomposition of a mesh's pencil axes (its last two), as jaxdecomp names it."""
    sizes = tuple(mesh.axis_sizes)[-2:] if not mesh.empty else (1, 1)
    sizes = (1,) * (2 - len(sizes)) + sizes
    if sizes == (1, 1):
        return PencilType.NO_DECOMP
    if sizes[0] == 1:
        return PencilType.SLAB_YZ
    return PencilType.SLAB_XY if sizes[1] == 1 else PencilType.PENCILS


def get_output_specs(fft_type, *args, mesh=None, backend: str = "JAX") -> tuple:
    """The output spec (3 entries) of a transform of `fft_type` whose input has `spec`.

    Both of jaxdecomp's signatures: `get_output_specs(fft_type, pencil_type, spec, backend)`
    (jaxdecomp 0.3) and `get_output_specs(fft_type, spec, mesh, backend)` (earlier releases, also
    called with `mesh=`).  Forward (FFT, RFFT): real space -> k space; inverse: k -> real.

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> from jax.sharding import PartitionSpec as P
      >>> jaxdecomp.get_output_specs(jaxdecomp.FftType.FFT, jaxdecomp.PENCILS, P("x", "y"), "jax")
      ('x', 'y', None)
    """
    del backend  # pencilfft has one
    if fft_type not in set(FftType):
        raise TypeError(f"`fft_type` must be a jax.lax.FftType (FFT, IFFT, RFFT, IRFFT); got "
                        f"{fft_type!r}")
    if args and isinstance(args[0], (int, PencilType)) and not isinstance(args[0], bool):
        spec = args[1] if len(args) > 1 else None  # (pencil_type, spec[, backend])
    else:
        spec = args[0] if args else None  # (spec[, mesh][, backend])
        if mesh is None and len(args) > 1:
            mesh = args[1]
    if not isinstance(spec, (tuple, list, P)):
        raise TypeError(f"`spec` must be a PartitionSpec or a tuple; got {type(spec).__name__}")
    s0, s1, s2 = tuple(spec)[:3] + (None,) * (3 - min(len(spec), 3))
    if layout() == "transposed":  # (X, Y, Z) split (a, b, -) <-> (Y, Z, X) split (a, b, -)
        return (s0, s1, s2)
    if fft_type in _FORWARD:  # (X, Y, Z): (a, b, -) -> (-, a, b)
        return (s2, s0, s1)
    return (s1, s2, s0)  # (-, a, b) -> (a, b, -)


def validate_spec_matches_mesh(spec: Any, mesh) -> None:
    """ValueError unless `spec` splits the leading axes by the mesh's axes in their order
    (jaxdecomp's check): entry i names mesh axis i, or is None where that axis has size 1 or
    the mesh has no axis i.

    The messages are jaxdecomp 0.3.1's, word for word (code and tests match on them).

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> from jax.sharding import PartitionSpec as P
      >>> jaxdecomp.validate_spec_matches_mesh(P("x", "y"), jax.make_mesh((4, 2), ("x", "y")))
      >>> jaxdecomp.validate_spec_matches_mesh(P("y", "x"), jax.make_mesh((4, 2), ("x", "y")))
      Traceback (most recent call last):
      ...
      ValueError: ...
    """
    if isinstance(spec, list):  # jaxdecomp takes a PartitionSpec or a tuple; a list as a tuple
        spec = tuple(spec)
    spec = spec + (None,) * (3 - len(spec))  # padded as jaxdecomp pads it: shown padded
    names = mesh.axis_names
    for i in range(3):
        if spec[i] is not None:
            if i >= len(names) or spec[i] != names[i]:
                expects = names[i] if i < len(names) else "nothing (trailing)"
                raise ValueError(
                    f"Spec {spec} does not match mesh axis names {names}. At position {i}: "
                    f"spec has '{spec[i]}' but mesh expects '{expects}'. Ensure the array is "
                    "sharded with a spec matching the mesh axis order."
                )
        elif i < len(names) and mesh.shape[names[i]] > 1:
            raise ValueError(
                f"Spec {spec} does not match mesh axis names {names}. At position {i}: spec has "
                f"None but mesh axis '{names[i]}' has size {mesh.shape[names[i]]} (> 1). An "
                "unsharded dimension cannot correspond to a distributed mesh axis."
            )
