"""Where the data lives: which mesh an array runs on and how that mesh splits it.

Holds:

* `rules`: the decomposition rules (the mesh's pencil axes a, b split X and Y in real space,
  its leading axes are batch axes; what must divide what; padding to a multiple);
* `mesh`: finding the mesh of a call (argument, sharding, traced type, ambient mesh);
* `sharding`: the real-space and k-space PartitionSpecs and NamedShardings (public
  `real_space_sharding`, `k_space_sharding`, `get_fft_output_sharding`).

Everything here is static (shapes and meshes, never traced values) and raises the
ValueError/TypeError that name the argument.  May import: jax, numpy, `_jax_private`.
Every other part asks here: the transforms, the exchanges' callers, the loaders, the painters.
"""
