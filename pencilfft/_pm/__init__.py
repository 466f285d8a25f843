"""The particle-mesh tools: painting particles onto a sharded grid, reading fields at them,
halos, and power spectra.

Holds:

* `window`: the NGP/CIC/TSC/PCS weights, their derivatives, their Fourier compensation;
* `kernel` (+ `paint.cc`): paint and readout on one block of cells, as primitives (the CPU
  kernel, XLA's scatter and gather elsewhere);
* `grid`: the block of a split grid and its halos, folded and filled through the mesh, and
  the shard_map runner both forms share;
* `paint`: `paint`/`readout` on the lattice (JaxPM's form) and interlacing; `catalog`:
  particles routed to the devices that own their cells;
* `halo`: `halo_exchange`; `power`: `power_spectrum` (mode counts, window compensation, shot
  noise);
* `fields`: `gaussian_field` and `zeldovich_displacement` (initial conditions).

Data flow: positions -> the owning device (catalogs) -> its padded block (`kernel`) -> halos
folded to the neighbours (`grid`) -> the field, split like any real-space array; readout walks
it back.  Initial conditions: a Gaussian field (`fields`) -> its displacement -> `paint` ->
`power_spectrum`.  May import: jax, numpy, `_jax_private`, `_decomposition`, `_native`,
`_exchange`, `_transforms` (the FFTs of power spectra, fields and interlacing).  `compat` builds on it.
"""
