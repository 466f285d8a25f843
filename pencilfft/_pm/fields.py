"""Fields for initial conditions: `gaussian_field` (a Gaussian random field of a given power
spectrum) and `zeldovich_displacement` (its first-order LPT displacement).

    white = normal(key, shape)        real space, each device draws its own block
    W = prfft3d(white)                half spectrum, Hermitian by construction
    delta = pirfft3d(W * sqrt(P(|k|) * N / V))     N = X Y Z cells, V = the box's volume

This is JaxPM's `linear_field` normalisation: with pencilfft's (JaxPM's) `power_spectrum`,
delta's measured P(k) is P(k) in expectation.  pmesh's `generate_whitenoise` and nbodykit's
`LinearMesh` draw the noise in Fourier space (unit variance per mode under pmesh's 1/N forward
transform) and multiply by sqrt(P(k) / V): the same statistics, other random numbers.  Drawing in
real space makes the Hermitian symmetry exact (the kz = 0 and Nyquist planes too) and the field
independent of the mesh: jax's partitionable threefry gives each element the same number however
the array is split.  The k = 0 mode is zeroed (a field of mean 0, as nbodykit's).

    psi_k = i k / k^2 delta_k         div psi = -delta; each Nyquist component of k zeroed

The displacement is three inverse transforms of one forward one, stacked on a last axis of
size 3 (`displacement_sharding`).  Shapes here are global.
"""
from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AbstractMesh

from .._decomposition.mesh import find_mesh, is_tracer
from .._decomposition.rules import batch_axes
from .._decomposition.sharding import real_space_sharding
from .._jax_private import concrete_mesh
from .._transforms.fft import pirfft3d, prfft3d
from .._transforms.freq import rfftfreq3d
from .power import box_lengths

__all__ = ["gaussian_field", "zeldovich_displacement"]


def _check_key(key) -> None:
    """One PRNG key: a typed key (`jax.random.key`) or a raw uint32 pair (`PRNGKey`)."""
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if np.shape(key) == ():
            return
    elif dtype is not None and np.dtype(dtype) == np.uint32 and np.shape(key) == (2,):
        return
    got = (f"an array of shape {np.shape(key)} and dtype {dtype}" if dtype is not None
           else type(key).__name__)
    raise TypeError(f"`key` must be one PRNG key (jax.random.key(seed), or jax.random.PRNGKey"
                    f"(seed)); got {got}")


def _check_shape(shape, mesh) -> tuple[int, ...]:
    try:
        dims = tuple(operator.index(n) for n in shape)
    except TypeError:
        raise TypeError(f"`shape` must be a sequence of ints (..., X, Y, Z); got "
                        f"{shape!r}") from None
    n_batch = len(batch_axes(mesh)[0]) if mesh is not None else 0
    if len(dims) < 3 + n_batch or any(n < 1 for n in dims):
        raise ValueError(
            f"`shape` must be (..., X, Y, Z), positive, with at least {3 + n_batch} axes (one "
            f"leading axis per batch axis of the mesh); got {shape!r}")
    return dims


def _float_dtype(dtype):
    if dtype is None:
        return jnp.zeros((), float).dtype  # jax's default float: float64 under jax_enable_x64
    try:
        out = np.dtype(dtype)
    except TypeError:
        out = None
    if out is None or out.kind != "f" or out.itemsize < 4:
        raise TypeError(f"`dtype` must be float32 or float64; got {dtype!r}")
    return jnp.zeros((), out).dtype


def _real(value, argname: str, what: str):
    dtype = getattr(value, "dtype", None)
    if dtype is None or np.dtype(dtype).kind not in "iuf":
        got = f"dtype {dtype}" if dtype is not None else type(value).__name__
        raise TypeError(f"`{argname}` must be {what}; got {got}")
    return value


def gaussian_field(key, shape, power, *, box_shape=None, mesh=None, dtype=None):
    """A real Gaussian random field of power spectrum P(k) on the sharded grid (mean 0).

    JaxPM's `linear_field` convention: white noise of unit variance drawn in real space (each
    device draws its own block), `prfft3d`, times `sqrt(P(|k|) N / V)` (N = X Y Z cells, V the
    box's volume), `pirfft3d`; so `power_spectrum(field, box_shape=box_shape)` measures P(k)
    in expectation.  The k = 0 mode is zero.  The same key gives the same field on any mesh.

    Args:
      key: one PRNG key (`jax.random.key(seed)` or `jax.random.PRNGKey(seed)`).
      shape: the global shape (X, Y, Z), or (..., X, Y, Z) for independent fields, one per
        leading index (split by a mesh's batch axes).
      power: a callable P(k) of the wavenumber modulus `|k|` (an array, in radians per unit of
        `box_shape`; never called with k = 0's value used), returning a real array of k's
        shape or a scalar; or a real array that broadcasts against the k grid of `prfft3d`'s
        half spectrum of such a field (transposed layout (..., Y, Z', X), padded where the
        mesh pads it; e.g. made from `rfftfreq3d`'s vectors), P(-k) = P(k) on the kz = 0 and
        Nyquist planes.  Values must be >= 0 (a negative one gives NaN).
      box_shape: the box's size (Lx, Ly, Lz); None: the grid shape (unit cells).
      mesh: the mesh to draw on; by default the key's mesh (a key sharded on one), then the
        ambient mesh (`jax.set_mesh`), else one device.
      dtype: float32 or float64; None: jax's default float type.

    Returns:
      The field, global shape `shape`, in `real_space_sharding(mesh, len(shape))` (X split by
      the mesh's pencil axis a, Y by b, leading axes by its batch axes).

    Raises:
      TypeError: a bad `key`, `shape`, `power` or `dtype`.
      ValueError: a `shape` of fewer than 3 axes (or too few for the mesh's batch axes), a
        `power` array that does not broadcast against the k grid, a bad `box_shape`.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> delta = pencilfft.gaussian_field(jax.random.key(0), (32, 32, 32),
      ...                                  lambda k: 1e3 * k ** -2, box_shape=(100.0,) * 3,
      ...                                  mesh=mesh)
      >>> delta.shape, delta.sharding.spec
      ((32, 32, 32), P('x', 'y', None))
      >>> k, pk = pencilfft.power_spectrum(delta, box_shape=(100.0,) * 3)
      >>> bool(abs(float(jnp.median(pk * k ** 2 / 1e3)) - 1) < 0.2)
      True
    """
    _check_key(key)
    if not (callable(power) or hasattr(power, "dtype") or isinstance(power, (list, float, int))):
        raise TypeError(f"`power` must be a callable P(k) or a real array on the k grid; got "
                        f"{type(power).__name__}")
    mesh = find_mesh(key, mesh)
    if isinstance(mesh, AbstractMesh) and not is_tracer(key):
        # Eagerly under jax.set_mesh: the devices to draw on are the concrete mesh's
        mesh = concrete_mesh() or mesh
    shape = _check_shape(shape, mesh)
    dtype = _float_dtype(dtype)
    box = box_lengths(box_shape, shape[-3:])
    table = None
    if not callable(power):
        table = _real(power if hasattr(power, "dtype") else np.asarray(power), "power",
                      "a callable P(k) or a real array on the k grid")
        power = None
    settings = dict(shape=shape, dtype=dtype, box=box, mesh=mesh, power=power)
    if is_tracer(key) or is_tracer(table) or not _hashable(power):
        return _field(key, table, **settings)
    return _field_jit(key, table, **settings)  # eagerly: one program, kept for the next call


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _field(key, table, *, shape, dtype, box, mesh, power):
    """The field (traced): `power` the callable, or None and `table` the array."""
    sharding = real_space_sharding(mesh, len(shape)) if mesh is not None else None
    draw = jax.jit(lambda k: jax.random.normal(k, shape, dtype), out_shardings=sharding)
    wk = prfft3d(draw(key), mesh=mesh)
    spacing = tuple(b / n for b, n in zip(box, shape[-3:]))
    kvec = rfftfreq3d(wk, d=spacing, s=shape[-3:], mesh=mesh)
    k2 = kvec[0] ** 2 + kvec[1] ** 2 + kvec[2] ** 2
    nonzero = k2 > 0  # the k = 0 mode, and the mesh's padding (whose wavenumbers are 0)
    if power is not None:
        p = power(jnp.sqrt(jnp.where(nonzero, k2, 1)))
        p = _real(p if hasattr(p, "dtype") else jnp.asarray(p), "power",
                  "a callable returning a real array (P(k))")
        what = "the result of the callable `power`"
    else:
        p, what = table, "`power`"
    try:
        np.broadcast_shapes(np.shape(p), np.shape(k2))
    except ValueError:
        raise ValueError(f"{what} must broadcast against the k grid of the half spectrum "
                         f"{tuple(np.shape(wk))} (prfft3d's, (..., Y, Z', X)); got shape "
                         f"{np.shape(p)}") from None
    cells_per_volume = math.prod(shape[-3:]) / math.prod(box)
    amplitude = jnp.where(nonzero, jnp.sqrt(jnp.asarray(p, dtype) * cells_per_volume), 0)
    return pirfft3d(wk * amplitude.astype(dtype), shape[-3:], mesh=mesh)


_field_jit = jax.jit(_field, static_argnames=("shape", "dtype", "box", "mesh", "power"))


def zeldovich_displacement(delta, *, box_shape=None, mesh=None):
    """The Zel'dovich (first-order LPT) displacement of a density contrast: psi_k = i k / k^2
    delta_k, so that div psi = -delta.

    One `prfft3d` and three `pirfft3d`; each component of k that is a Nyquist frequency (an even
    axis' k = pi N / L) is zeroed, as numpy's gradient of the whole grid would need to keep psi
    real.  Multiply by the growth factor D(a) for the displacement at a; the particles of the
    lattice then sit at q + psi, and `paint` takes psi in cells: `psi * (shape / box_shape)`.

    Args:
      delta: real field, global shape (..., X, Y, Z), in pencilfft's real-space sharding (e.g.
        from `gaussian_field`).
      box_shape: the box's size (Lx, Ly, Lz), the unit of psi; None: the grid shape (psi in
        cells).
      mesh: the mesh; by default delta's (as `prfft3d`).

    Returns:
      psi, global shape (..., X, Y, Z, 3) (the components along X, Y, Z last), delta's dtype,
      in `displacement_sharding(mesh)`: split like delta, the last axis whole.

    Raises:
      TypeError: a complex or non-array `delta`.
      ValueError: fewer than 3 axes; a bad `box_shape`.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> delta = pencilfft.gaussian_field(jax.random.key(1), (32, 32, 32),
      ...                                  lambda k: 0.05 * k ** -2, mesh=mesh)
      >>> psi = pencilfft.zeldovich_displacement(delta)
      >>> psi.shape, psi.sharding.spec
      ((32, 32, 32, 3), P('x', 'y', None, None))
      >>> rho = pencilfft.paint(psi)                  # one particle per cell, moved by psi
      >>> rho.shape
      (32, 32, 32)
    """
    if not (hasattr(delta, "shape") and hasattr(delta, "dtype")):
        raise TypeError(f"`delta` must be an array (jax.Array or numpy.ndarray); got "
                        f"{type(delta).__name__}")
    if np.dtype(delta.dtype).kind != "f":
        raise TypeError(f"`delta` must be real (float32 or float64); got {delta.dtype}")
    if len(delta.shape) < 3:
        raise ValueError(f"`delta` must be a 3-D field (X, Y, Z), or (..., X, Y, Z); got shape "
                         f"{tuple(delta.shape)}")
    shape = tuple(delta.shape[-3:])
    box = box_lengths(box_shape, shape)
    if is_tracer(delta):
        return _displacement(delta, box=box, mesh=mesh)
    return _displacement_jit(delta, box=box, mesh=mesh)  # eagerly: one program


def _displacement(delta, *, box, mesh):
    shape = tuple(delta.shape[-3:])
    dk = prfft3d(delta, mesh=mesh)
    spacing = tuple(b / n for b, n in zip(box, shape))
    kvec = rfftfreq3d(dk, d=spacing, s=shape, mesh=mesh)
    k2 = kvec[0] ** 2 + kvec[1] ** 2 + kvec[2] ** 2
    inv_k2 = jnp.where(k2 > 0, 1 / jnp.where(k2 > 0, k2, 1), 0)
    psi = []
    for k, n, length in zip(kvec, shape, box):
        # Above the next-highest |k| of an n-point axis: its Nyquist frequency (n even only)
        k = jnp.where(jnp.abs(k) > np.pi * (n - 1) / length, 0, k)
        psi.append(pirfft3d(1j * k * inv_k2 * dk, shape, mesh=mesh))
    return jnp.stack(psi, axis=-1)


_displacement_jit = jax.jit(_displacement, static_argnames=("box", "mesh"))
