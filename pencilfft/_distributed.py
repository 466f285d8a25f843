"""Multi-controller start-up (placeholder: a no-op in a single process)."""
from __future__ import annotations


def initialize(**overrides) -> None:
    """Start jax.distributed when launched by mpirun/srun; do nothing in a plain process."""
    return None
