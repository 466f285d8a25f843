"""Every name the benchmarks take from pencilfft's private modules, in one place.

The benchmarks measure pencilfft's pieces (its timing rule, plan, stages, kernels, exchanges),
which are private and move as the package is reorganised: a move is then a change to
`_WHERE` alone.  Names resolve on first use (`private.time_once(...)`), so that importing a
benchmark module never starts jax before the harness has set the device count.
"""
from __future__ import annotations

import importlib
from typing import Any

# name -> (module, attribute; None: the module itself)
_WHERE: dict[str, tuple[str, str | None]] = {
    "time_once": ("pencilfft._measure", "time_once"),
    "max_rel_err": ("pencilfft._measure", "max_rel_err"),
    "split_problem": ("pencilfft._decomposition.rules", "split_problem"),
    "plan_forward": ("pencilfft._transforms.plan", "plan_forward"),
    "fit_chunks": ("pencilfft._transforms.budget", "fit_chunks"),
    "with_mesh": ("pencilfft._transforms.partitioned", "with_mesh"),
    "Exchange": ("pencilfft._transforms.stages", "Exchange"),
    "Fft": ("pencilfft._transforms.stages", "Fft"),
    "stages_of": ("pencilfft._transforms.chunks", "stages_of"),
    "ALGORITHMS": ("pencilfft._exchange", "ALGORITHMS"),
    "chunk_major": ("pencilfft._transforms.transpose", "_chunk_major"),
    "interleave": ("pencilfft._transforms.transpose", "_interleave"),
    "in_mesh": ("pencilfft._exchange", "in_mesh"),
    "mpi_exchange": ("pencilfft._exchange.mpi", "exchange"),
    "srun_mpi_hint": ("pencilfft._processes.launch", "srun_mpi_hint"),
    "plan_bins": ("pencilfft._pm.power", "plan_bins"),
    "WINDOWS": ("pencilfft._pm.window", "WINDOWS"),
    "weights": ("pencilfft._pm.window", "weights"),
    "nd_call": ("pencilfft._transforms.numpy_fft", "_call"),
    "nd_planned": ("pencilfft._transforms.numpy_fft", "_planned"),
    "nd_all_axes": ("pencilfft._transforms.numpy_fft", "_all_axes"),
    "route_text": ("pencilfft._transforms.routes", "route_text"),
    "partition_spec": ("pencilfft._transforms.numpy_fft", "partition_spec"),
    "nd_Inverse": ("pencilfft._transforms.stages", "Inverse"),
    "nd_Swap": ("pencilfft._transforms.stages", "Swap"),
    "nd_Reshard": ("pencilfft._transforms.stages", "Reshard"),
    "platform_of": ("pencilfft._transforms.plan", "platform_of"),
    "kernel": ("pencilfft._transforms.kernel", None),
    "malloc": ("pencilfft._native.malloc", None),
    "threads": ("pencilfft._native.threads", None),
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"benchmarks.private has no {name!r}; add it to _WHERE")
    module, attr = _WHERE[name]
    mod = importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)
