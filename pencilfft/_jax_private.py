"""The private jax names pencilfft relies on, in one place: what to check on a new jax release.

Each has a fallback or fails loudly, never silently.  Also here: the jax releases the suite has
passed on (`TESTED_JAX`; pyproject.toml declares its floor and no cap, constraints.txt and
constraints-py312.txt the exact sets), and the one warning a jax outside them gets
(`PENCILFFT_NO_WARN_JAX_VERSION=1` silences it).
"""
from __future__ import annotations

import os
import re
import warnings
from typing import Any

# The jax releases CI passes on, as [first, end) ranges of releases (.ci/run):
# * 0.10.2: the whole suite (tests/run.sh), Python 3.11, the set of constraints.txt;
# * 0.12: Python 3.12's run, the newest jax pip gives there (0.12.0.1, the set of
#   constraints-py312.txt): the quick subset and every file that pins a jax behaviour (what jax
#   lowers or compiles, the memory of its programs, its private names and its version).
# Not 0.11: on jax 0.11.2 (Python 3.12, the lent machine's 16 cores) the suite failed 4 tests,
# XLA not aliasing a donated input (benchmarks/RESULTS.md, "The test suite on jax 0.11.2"),
# and no jax 0.11 is run here since.  pyproject.toml declares the first release as its floor
# and no cap (a cap would make pip downgrade a newer jax, and its CUDA plugin, installed beside
# pencilfft); tests/test_dependencies.py checks that the constraints files pin releases inside.
# The gaps between ranges are whole minor releases (`tested_range` writes them as pip's `!=`).
TESTED_JAX = (((0, 10, 2), (0, 11)), ((0, 12), (0, 13)))
NO_WARN = "PENCILFFT_NO_WARN_JAX_VERSION"  # set to 1: no warning for an untested jax
WHERE_TO_REPORT = ("the project's issue tracker, with the output of `pencilfft check` "
                   "(docs: troubleshooting, \"A jax outside the tested range\")")


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "0.11.1.dev20260808" -> (0, 11, 1)."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def tested_range() -> str:
    """The tested releases as pip writes them, e.g. "jax>=0.10.2,!=0.11.*,<0.13"."""
    parts = [">=" + _dotted(TESTED_JAX[0][0])]
    for (_, end), (first, _) in zip(TESTED_JAX, TESTED_JAX[1:]):
        parts += [f"!={end[0]}.{minor}.*" for minor in range(end[1], first[1])]
    return "jax" + ",".join(parts + ["<" + _dotted(TESTED_JAX[-1][1])])


def required_floor() -> str:
    """What pyproject.toml asks pip for: the tested releases' floor and no cap, "jax>=0.10.2"."""
    return "jax>=" + _dotted(TESTED_JAX[0][0])


def jax_support(version: str | None = None) -> tuple[str, bool]:
    """(jax's version, whether it is one of the tested releases)."""
    if version is None:
        import jax

        version = jax.__version__
    release = _release(version)
    return version, any(first <= release < end for first, end in TESTED_JAX)


def warn_if_untested(version: str | None = None) -> bool:
    """One warning (per process, Python's default filter) when jax is outside `TESTED_JAX`,
    unless PENCILFFT_NO_WARN_JAX_VERSION=1; whether it warned."""
    version, ok = jax_support(version)
    if ok or os.environ.get(NO_WARN, "").strip() not in ("", "0"):
        return False
    warnings.warn(
        f"pencilfft: jax {version} is outside the releases pencilfft's test suite has passed "
        f"on ({tested_range()}); it may work, or fail where the suite would have caught it. "
        f"Please report what you see in {WHERE_TO_REPORT}. "
        f"{NO_WARN}=1 silences this warning.", UserWarning, stacklevel=3)
    return True


def needs_devices_when_lowered(prim: Any) -> None:
    """jit only hands the device assignment to lowering rules of primitives in this set, and
    custom_partitioning's and io_callback's lowerings need it (jaxdecomp relies on it too).
    Kept in jax 0.11 (jax/_src/dispatch.py); on a jax without it, an error that says so when
    pencilfft is imported rather than an AttributeError deep in a transform."""
    from jax._src import dispatch

    needing = getattr(dispatch, "prim_requires_devices_during_lowering", None)
    if needing is None:
        import jax

        raise ImportError(
            f"pencilfft: jax {jax.__version__} has no "
            f"jax._src.dispatch.prim_requires_devices_during_lowering, which the transforms "
            f"partitioned by XLA need ({tested_range()} has it); install a tested jax")
    needing.add(prim)


def legacy_mesh() -> Any:
    """The mesh of an enclosing `with mesh:` block (the pre-`jax.set_mesh` idiom many codes
    use), or None."""
    try:
        from jax._src.mesh import thread_resources

        mesh = thread_resources.env.physical_mesh
    except (ImportError, AttributeError):  # a jax without it: nothing to find
        return None
    return None if mesh.empty else mesh


def traced_input_meshes(x: Any) -> list[Any]:
    """The meshes (each once) of the shardings of the arguments of the function jax is tracing
    `x` in (jit's frame; vmap's and grad's tracers unwrapped), in argument order; empty where
    `x` is not traced or on a jax whose tracers look otherwise."""
    try:
        from jax._src.interpreters.partial_eval import DynamicJaxprTracer
    except ImportError:
        return []
    import jax

    for _ in range(64):  # a chain of nested transformations, never a cycle
        if not isinstance(x, jax.core.Tracer):
            return []
        if isinstance(x, DynamicJaxprTracer):
            try:
                invars = x._trace.frame.invars
            except AttributeError:
                return []
            meshes = []
            for v in invars:
                mesh = getattr(getattr(getattr(v, "aval", None), "sharding", None), "mesh", None)
                if mesh is not None and getattr(mesh, "axis_names", ()) and mesh not in meshes:
                    meshes.append(mesh)
            return meshes
        inner = getattr(x, "primal", None)
        if inner is None:
            inner = getattr(x, "val", None)
        if inner is None:
            return []
        x = inner
    return []


def is_traced_argument(x: Any) -> bool:
    """Whether traced `x` is an argument of the function jax is tracing (its buffer exists before
    the program runs), rather than a value the program makes.

    vmap's and grad's tracers are unwrapped to what they carry; a concrete value under them is
    in memory.  Read off jit's tracer: its variable is one of the traced frame's inputs.  On a
    jax whose tracers look otherwise the answer is True, the reading that never counts the
    input twice (the memory check of before).
    """
    try:
        from jax._src.interpreters.partial_eval import DynamicJaxprTracer
    except ImportError:
        return True
    import jax

    for _ in range(64):  # a chain of nested transformations, never a cycle
        if not isinstance(x, jax.core.Tracer):
            return True
        if isinstance(x, DynamicJaxprTracer):
            try:
                var, invars = x.val, x._trace.frame.invars
            except AttributeError:
                return True
            return any(var is v for v in invars)
        inner = getattr(x, "primal", None)
        if inner is None:
            inner = getattr(x, "val", None)
        if inner is None:
            return True
        x = inner
    return True


def concrete_mesh() -> Any:
    """The concrete mesh set with `jax.set_mesh` (readable under jit, unlike
    `jax.sharding.get_mesh`), or None."""
    try:
        from jax._src.mesh import get_concrete_mesh
    except ImportError:  # a jax without it: nothing to find
        return None
    mesh = get_concrete_mesh()
    return None if mesh is None or mesh.empty else mesh


def invariant_over(aval: Any, axis_name: str) -> Any:
    """`aval` (a value inside shard_map) made the same on every device of mesh axis `axis_name`,
    as a psum's result is: shard_map checks that outputs declared replicated are.  On a jax that
    keeps this elsewhere, `aval` unchanged (shard_map then refuses loudly where it matters)."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is None or not hasattr(mat, "varying"):
        return aval
    return aval.update(manual_axis_type=mat.update(
        varying=frozenset(a for a in mat.varying if a != axis_name)))


def distributed_client() -> Any:
    """jax.distributed's client (its key-value store), None in a one-process job."""
    try:
        from jax._src import distributed
    except ImportError:
        return None
    return getattr(distributed.global_state, "client", None)
