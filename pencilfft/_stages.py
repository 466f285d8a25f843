"""The forward transform as a list of stages; the backward transform walks it reversed.

Static: stages are built from a `Plan`'s shapes, pdims and layout alone (nothing is traced here).
`_fft.py` runs them on per-device blocks, forward in order and backward in reverse, each stage
undoing itself.  Axes are numbered in the per-device block with the batch flattened to one
leading axis: (B, x, y, Z) in real space.

Forward pencil (mesh (a, b) of sizes (Pa, Pb)):

    Fft((3,))  Pad(3, zp)  Exchange(b: split 3, gather 2)  Fft((3,))  Pad(3, yp)
    Exchange(a: split 3, gather 1)  Fft((3,))  [Move(3, 1) in the natural layout]

A slab (Pb == 1) replaces the first three stages with one 2-D `Fft((2, 3))` and its exchange over
a; one device runs one 3-D `Fft` (and `Move(1, 3)` in the transposed layout).  A slab over Y
(Pa == 1) is a slab in cost too: FFT Z, the exchange over b to (B, z, X, Y), one 2-D FFT over
(X, Y) and one move to the layout (the pencil path would add a reordering "exchange" over a and
an FFT call; measured in benchmarks/RESULTS.md "Margin").  Stages whose
inverse needs a length (the crop after a pad, the real inverse FFT) carry it.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Fft:
    """FFT over local `axes` (whole on every device).  `real`: r2c forward / c2r backward, the
    last axis of `axes` halved; `sizes` are the real-space lengths of `axes` (the c2r output)."""

    axes: tuple[int, ...]
    real: bool = False
    sizes: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Pad:
    """Zero-pad local `axis` at its end from `length` to `padded` (backward: crop to `length`)."""

    axis: int
    length: int
    padded: int


@dataclasses.dataclass(frozen=True)
class Exchange:
    """`_transpose.transpose_blocks` over mesh axis `mesh_axis` (0: a, 1: b) of size `n`.

    The inverse exchange splits what was gathered, gathers what was split and undoes `order`."""

    mesh_axis: int
    n: int
    split: int
    gather: int
    order: tuple[int, ...]

    def inverse(self) -> "Exchange":
        inv = tuple(self.order.index(i) for i in range(len(self.order)))
        return Exchange(self.mesh_axis, self.n, split=self.order.index(self.gather),
                        gather=self.order.index(self.split), order=inv)


@dataclasses.dataclass(frozen=True)
class Move:
    """jnp.moveaxis(k, source, destination) (backward: the other way)."""

    source: int
    destination: int


Stage = Fft | Pad | Exchange | Move


def forward_stages(real_shape: tuple[int, int, int], pdims: tuple[int, int], real: bool,
                   layout: str, zc: int, zp: int, yp: int) -> tuple[Stage, ...]:
    """The stages of the forward transform of one (B, x, y, Z) block (see the module docstring)."""
    X, Y, Z = real_shape
    pa, pb = pdims
    if pa == pb == 1:  # one device: nothing to exchange, one 3-D FFT
        stages: tuple[Stage, ...] = (Fft((1, 2, 3), real, (X, Y, Z)),)
        return stages + ((Move(1, 3),) if layout == "transposed" else ())
    if pa == 1:  # slab over Y: FFT Z, one exchange, then one 2-D FFT over the whole (X, Y)
        stages = (
            Fft((3,), real, (Z,)),
            Pad(3, zc, zp),
            Exchange(1, pb, split=3, gather=2, order=(0, 3, 1, 2)),  # (B, z, X, Y)
            Fft((2, 3)),
        )
        # One move to the layout: (B, Y, z, X) transposed, (B, X, Y, z) natural.
        return stages + ((Move(3, 1),) if layout == "transposed" else (Move(1, 3),))
    if pb == 1:  # slab over X: one 2-D FFT over the whole local (Y, Z) planes
        stages = (
            Fft((2, 3), real, (Y, Z)),
            Pad(2, Y, yp),
            Exchange(0, pa, split=2, gather=1, order=(0, 2, 3, 1)),  # (B, y', Zc, X)
        )
    else:
        stages = (
            Fft((3,), real, (Z,)),
            Pad(3, zc, zp),
            Exchange(1, pb, split=3, gather=2, order=(0, 1, 3, 2)),  # (B, x, z, Y)
            Fft((3,)),
            Pad(3, Y, yp),
            Exchange(0, pa, split=3, gather=1, order=(0, 3, 2, 1)),  # (B, y', z, X)
        )
    stages += (Fft((3,)),)
    return stages + ((Move(3, 1),) if layout == "natural" else ())  # natural: (B, X, y', z)
