"""The `pencilfft` command (`main`) and its main job, `pencilfft check` (`check`).

Above every other part: it imports the transforms, the exchanges, the kernels' runtime and the
processes' memory to run and report on them; nothing imports it.
"""
from .command import main

__all__ = ["main"]
