"""pencilfft: distributed slab and pencil 3D FFTs for JAX."""
from ._distributed import initialize
from ._sharding import k_space_sharding, real_space_sharding

__version__ = "0.1.0"

__all__ = [
    "initialize",
    "k_space_sharding",
    "real_space_sharding",
]
