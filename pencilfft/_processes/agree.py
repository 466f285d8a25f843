"""One decision on every process: what a plan depends on is the same on every process of the
job before anything runs that they must all run alike.

Every process of an SPMD job must compile the same programs: a chunk count chosen from one
process's free memory or its own `PENCILFFT_MEMORY_LIMIT`, or an exchange that one process could
build and another could not, would compile different programs, whose exchanges never match:
the job would wait forever.  Two tools:

* `least(value, what)`: the smallest of the values every process passed (the free memory each
  one reads for itself: every process then plans with the least);
* `same(decisions, what, settings, arguments)`: every process's decisions side by side; where
  they differ, the same error on every process, instead of a hang.  It leads with what the
  user gave that differs, in the user's words (`norm: 'backward' on process 0, 'ortho' on
  process 1`, then any setting that differs, such as `jax_enable_x64`), and follows with each
  process's values of the decisions that differ (a plan's fields, the N-D names' stages).
  `plan_decisions(plan, x)` is what a transform's program depends on: every field of its
  static plan (global shape with the batch, dtypes, kinds, norm, layout, padding, chunks,
  exchanges), its mesh by shape, axis names, axis types and devices, and the kind of input.

Both go through MPI where it runs (one collective), else through jax.distributed's key-value
store; a process that never gets there makes the others fail after `TIMEOUT_S` seconds with an
error that says so, never hang.  Every process must ask the same questions in the same order,
as SPMD code does: each `what` is numbered per process, and the n-th question of a kind on one
process is matched with the n-th on the others.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import os
from collections import defaultdict
from collections.abc import Mapping

import jax
import numpy as np

from .._jax_private import distributed_client  # noqa: F401 - the tests look it up here
from .launch import running_mpi

__all__ = ["least", "gather", "same", "plan_decisions", "spans_processes", "DifferentPlansError",
           "TIMEOUT_S", "shown"]

TIMEOUT_S = float(os.environ.get("PENCILFFT_AGREE_TIMEOUT", "300"))

# Per kind of question, how many this process asked so far (the key-value store's keys).
_asked: defaultdict[str, itertools.count] = defaultdict(itertools.count)


class DifferentPlansError(RuntimeError):
    """The processes of a job decided differently what every one of them must do alike (the
    same message on every process, naming each one's values)."""


def spans_processes(mesh) -> bool:
    """Whether `mesh` (a Mesh, an AbstractMesh or None) holds devices of several processes:
    only then must the processes decide alike (a process may run transforms of its own
    devices alone, as often as it likes)."""
    if mesh is None or jax.process_count() == 1:
        return False
    if isinstance(mesh, jax.sharding.Mesh):
        return len({d.process_index for d in mesh.devices.flat}) > 1
    return mesh.size > jax.local_device_count()  # an abstract mesh names no devices


def least(value: int, what: str) -> int:
    """The smallest `value` over the processes of the job (`value` itself in one process)."""
    if jax.process_count() == 1:
        return value
    mpi = running_mpi()
    if mpi is not None:
        return int(mpi.COMM_WORLD.allreduce(int(value), op=mpi.MIN))
    return min(int(v) for v in _store_gather(str(int(value)), what))


def gather(value: str, what: str) -> list[str]:
    """Every process's `value`, in process order (`[value]` in one process)."""
    if jax.process_count() == 1:
        return [value]
    mpi = running_mpi()
    if mpi is not None:
        return [str(v) for v in mpi.COMM_WORLD.allgather(str(value))]
    return _store_gather(str(value), what)


def _store_gather(value: str, what: str) -> list[str]:
    client = distributed_client()
    if client is None:
        raise RuntimeError(f"pencilfft: cannot agree on {what} across the {jax.process_count()} "
                           f"processes: neither MPI nor jax.distributed's key-value store runs")
    number = next(_asked[what])
    prefix = f"pencilfft/agree/{what}"
    me = jax.process_index()
    client.key_value_set(f"{prefix}/{number}/{me}", value)
    values = []
    for rank in range(jax.process_count()):
        try:
            values.append(client.blocking_key_value_get(f"{prefix}/{number}/{rank}",
                                                        int(TIMEOUT_S * 1000)))
        except Exception as e:  # noqa: BLE001 - the store's timeout error
            raise RuntimeError(
                f"pencilfft: process {rank} did not say its {what} within {TIMEOUT_S:g} s "
                f"(PENCILFFT_AGREE_TIMEOUT); every process must make the same calls in the same "
                f"order: {e}") from e
    if number:
        # Every process has written this round, so every one has read the last one: our key of
        # the last round is read by all and can go (the store would grow with every plan).
        try:
            client.key_value_delete(f"{prefix}/{number - 1}/{me}")
        except Exception:  # noqa: BLE001 - a store without deletion keeps it, harmlessly
            pass
    return values


def _same_digest(text: str) -> bool:
    """Under MPI, whether every process has the same `text`, by one allreduce of its digest (the
    least and the greatest over the job are equal): a few bytes and log(processes) messages a
    process, where gathering every process's text (about a kilobyte) to every process grows as
    processes squared.  False where they differ (the texts are then gathered for the message)
    and without MPI (the key-value store gathers them)."""
    mpi = running_mpi()
    if mpi is None:
        return False
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1
    bounds = np.array([digest, -digest], np.int64)
    mpi.COMM_WORLD.Allreduce(mpi.IN_PLACE, bounds, op=mpi.MIN)
    return int(bounds[0]) == -int(bounds[1])


def plan_decisions(plan, x=None) -> dict[str, object]:
    """What the program of a transform depends on, for `same`: every field of its static
    `plan` (a dataclass: a field added to it later is compared too), a mesh by its axis names,
    sizes and types and its devices, and the kind of input `x` (a jax.Array, a numpy array,
    a tracer), which decides the memory the chunk count is fitted to.

    The chunk count each process then resolves from "auto" is not sent: it follows from what
    is compared here, the memory limit its caller compares and the free memory every process
    agrees on (`least`), and comparing it would cost a second round per eager call."""
    decisions = dict(_plan_fields(plan))
    if x is not None:
        decisions["input"] = type(x).__name__
    return decisions


class _Shown(str):
    """A value already written as `same` shows it (its repr is itself)."""

    def __repr__(self) -> str:
        return str(self)


def shown(value) -> str:
    """`value` as `same` shows and compares it: its repr, but a mesh by `_mesh_text` (short at
    any size, its devices by a digest), a dtype by its name and a NamedSharding as its spec on
    such a mesh (all quoted, as strings)."""
    if isinstance(value, _Shown):
        return value
    if isinstance(value, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
        value = _mesh_text(value)
    elif isinstance(value, np.dtype):
        value = str(value)
    elif isinstance(value, jax.sharding.NamedSharding):
        value = f"{value.spec} on {_mesh_text(value.mesh)}"
    return repr(value)


@functools.lru_cache(maxsize=256)
def _plan_fields(plan) -> tuple[tuple[str, _Shown], ...]:
    """(name, value as shown) of every field of `plan` (`shown`): written once per plan, as an
    eager call must stay cheap."""
    return tuple((field.name, _Shown(shown(getattr(plan, field.name))))
                 for field in dataclasses.fields(plan))


@functools.lru_cache(maxsize=64)
def _mesh_text(mesh) -> str:
    """A mesh as every process can compare it (the same on each for one mesh), short at any
    size: its axes with their sizes and types, and a digest of its devices in mesh order."""
    types = getattr(mesh, "axis_types", None) or ()
    axes = ", ".join(f"{name}={size}" + (f" {t.name}" if hasattr(t, "name") else "")
                     for (name, size), t in zip(mesh.shape.items(),
                                                tuple(types) or (None,) * len(mesh.shape)))
    if isinstance(mesh, jax.sharding.Mesh):
        ids = np.asarray([d.id for d in mesh.devices.flat], np.int64)
        return f"({axes}) devices {hashlib.sha1(ids.tobytes()).hexdigest()[:12]}"
    return f"({axes}) abstract"


# Separators of `same`'s message (control characters that no repr writes).
_RECORD, _FIELD, _PAIR = "\x1d", "\x1e", "\x1f"
_PARTS = ("decisions", "settings", "arguments")


def _text(values: Mapping[str, object]) -> str:
    return _FIELD.join(f"{k}{_PAIR}{shown(v)}" for k, v in values.items())


def _parsed(text: str) -> dict[str, dict[str, str]]:
    parts = text.split(_RECORD) + [""] * len(_PARTS)
    return {kind: dict(field.split(_PAIR, 1) for field in part.split(_FIELD) if field)
            for kind, part in zip(_PARTS, parts)}


def _ranks(ranks: list[int]) -> str:
    """'process 3', 'processes 0, 2-5': a set of processes, short at any count."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}"
                     for a, b in runs)
    return f"process{'es' if len(ranks) > 1 else ''} {text}"


def _by_value(values: list[str]) -> str:
    """"'backward' on process 0, 'ortho' on process 1": each value once, with the processes
    that had it, in the order first seen."""
    holders: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        holders.setdefault(value, []).append(rank)
    return ", ".join(f"{value} on {_ranks(ranks)}" for value, ranks in holders.items())


def same(decisions: Mapping[str, object], what: str,
         settings: Mapping[str, object] | None = None,
         arguments: Mapping[str, object] | None = None) -> None:
    """Raise `DifferentPlansError` on every process unless every process made the same
    `decisions` (name -> value, compared as `shown`) for `what`.  `arguments` (what the user
    gave, by the names the user knows: `x.shape`, `norm`, `chunks`) and `settings` (this
    process's environment, with jax's 64-bit switch, which every dtype follows) are not
    compared, only reported: the message leads with those that differ, in the user's words,
    and follows with each process's value of every decision that differs (the plan, the
    stages) and of every setting.  One exchange (`gather`); nothing to do in one process."""
    if jax.process_count() == 1:
        return
    settings = {"jax_enable_x64": bool(jax.config.jax_enable_x64), **(settings or {})}
    decided = _text(decisions)
    if _same_digest(decided):
        return
    # Plain text, not JSON: parsed only when it differs.
    mine = _RECORD.join((decided, _text(settings), _text(arguments or {})))
    texts = gather(mine, "plan")
    if all(t.partition(_RECORD)[0] == texts[0].partition(_RECORD)[0] for t in texts):
        return
    every = [_parsed(text) for text in texts]
    if all(e["decisions"] == every[0]["decisions"] for e in every):
        return  # the same decisions, in another order

    def keys(kind: str) -> list[str]:  # every process's, in first-seen order
        return list(dict.fromkeys(k for e in every for k in e[kind]))

    def values(kind: str, key: str) -> list[str]:
        return [e[kind].get(key, "(not set)") for e in every]

    def table(kind: str, differing_only: bool) -> str:
        rows = []
        for key in keys(kind):
            shown_ = values(kind, key)
            if not differing_only or len(set(shown_)) > 1:
                rows.append(f"{key}: " + ", ".join(f"process {i}: {v}"
                                                   for i, v in enumerate(shown_)))
        return "; ".join(rows)

    lead = "; ".join(f"{key}: {_by_value(values(kind, key))}"
                     for kind in ("arguments", "settings") for key in keys(kind)
                     if len(set(values(kind, key))) > 1)
    differ = table("decisions", True)
    fed = table("settings", False)
    raise DifferentPlansError(
        f"pencilfft: the {len(every)} processes of this job decided {what} differently, and "
        f"would wait for each other forever in its exchanges: "
        + (f"{lead}. So their plans differ: {differ}" if lead else differ)
        + (f". What each process had: {fed}" if fed else "")
        + ". Give every process the same program, arguments and settings (the environment of "
        "`mpirun -x`, `srun --export`: JAX_ENABLE_X64 changes every dtype), and the same "
        "software (a handler that builds on one node and not on another); detected free "
        "memory is agreed by itself.")
