"""`jaxdecomp.halo`: `halo_exchange` with jaxdecomp's signature and values.

Beyond a non-periodic edge the halos become 0 and along a mesh axis of size 1 they are left
alone, as jaxdecomp's (pencilfft.halo_exchange keeps the former and wraps the latter).  The
gradient is the exchange's adjoint (jaxdecomp's applies the exchange again).
"""
from __future__ import annotations

from .._halo import exchange_halos
from .fft import check_backend

__all__ = ["halo_exchange"]


def halo_exchange(x, halo_extents, halo_periods=(True, True), backend: str = "jax"):
    """jaxdecomp.halo_exchange: fill the halos of every padded device block (see
    `pencilfft.halo_exchange`)."""
    check_backend(backend)
    return exchange_halos(x, halo_extents, halo_periods, None, like_jaxdecomp=True)
