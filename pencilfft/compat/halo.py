"""`jaxdecomp.halo`: `halo_exchange` with jaxdecomp's signature and values.

Beyond a non-periodic edge the halos become 0 and along a mesh axis of size 1 they are left
alone, as jaxdecomp's (pencilfft.halo_exchange keeps the former and wraps the latter).  The
gradient is the exchange's adjoint (jaxdecomp's applies the exchange again).
"""
from __future__ import annotations

from .._pm.halo import exchange_halos
from .fft import check_backend

__all__ = ["halo_exchange"]


def halo_exchange(x, halo_extents, halo_periods=None, backend: str = "jax"):
    """jaxdecomp.halo_exchange: fill the halos of every padded device block (see
    `pencilfft.halo_exchange`).

    Takes and returns the global array `x` (..., X, Y, Z), split P(a, b), whose every device
    block is already padded by `halo_extents` = (hx, hy) cells on both sides of X and Y; beyond
    jaxdecomp, a brick split P(a, b, c) over a 3-axis mesh (any order of its axes) takes
    (hx, hy, hz) and 3 periods, with the same rules on every axis.  `halo_periods`: one bool
    per extent (jaxdecomp requires it; None here: periodic along every axis).  Raises
    ValueError/TypeError naming the argument (extents too large for the blocks, a bad spec).

    Example:
      >>> import pencilfft.compat as jaxdecomp
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> spec = jax.sharding.PartitionSpec("x", "y")
      >>> pad = jax.shard_map(lambda b: jnp.pad(b, ((1, 1), (1, 1), (0, 0))), mesh=mesh,
      ...                     in_specs=spec, out_specs=spec)
      >>> x = jax.device_put(np.ones((32, 32, 16), np.float32), pencilfft.real_space_sharding(mesh))
      >>> y = jaxdecomp.halo_exchange(pad(x), halo_extents=(1, 1), halo_periods=(True, True))
      >>> y.shape, float(y.min())
      ((40, 36, 16), 1.0)
    """
    check_backend(backend)
    return exchange_halos(x, halo_extents, halo_periods, None, like_jaxdecomp=True)
