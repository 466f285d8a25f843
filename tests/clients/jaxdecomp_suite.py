"""jaxdecomp's own tests, unmodified, through `pencilfft.compat.install()` (issue 31).

On demand, not part of tests/run.sh (about 12 minutes of CPU; the lead's suite has a budget):

    python tests/clients/jaxdecomp_suite.py /path/to/jaxDecomp            # through pencilfft
    python tests/clients/jaxdecomp_suite.py /path/to/jaxDecomp --jaxdecomp  # the real one
    python tests/clients/jaxdecomp_suite.py /path/to/jaxDecomp -- -k transpose -x

It runs jaxdecomp's tests/test_fft.py, test_transpose.py and test_halo.py in this one process
on 8 simulated CPU devices, as their tests/conftest.py sets up a run off a cluster, and prints
the counts: passed, failed, errors, skipped (grouped by the skip's reason).  Arguments after
`--` go to pytest.

Through pencilfft (the default), `pencilfft.compat.install()` runs before pytest imports the
tests, and jaxdecomp's compiled extension (`jaxdecomplib`) is blocked, so no part of a real
jaxdecomp installed in the same environment can load: `import jaxdecomp...` gives compat or
fails.  At the end the script checks that every `jaxdecomp*` module loaded is pencilfft's.
jaxdecomp's pyproject adds `--cov=jaxdecomp --doctest-modules` to pytest's options (pytest-cov,
coverage of the library under test): the script clears them (`-o addopts=`).

The checkout stays outside this repository, e.g. from a mirror without a work tree:
`git -C <gitdir> worktree add /tmp/jaxdecomp <commit>` (0a62239 is v0.3.1's code).
Exit status: pytest's, or 3 when a real jaxdecomp module was loaded through pencilfft.
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
from pathlib import Path

MODULES = ("test_fft.py", "test_transpose.py", "test_halo.py")
DEVICES = 8
ROOT = Path(__file__).resolve().parents[2]  # this checkout of pencilfft


class Counts:
    """A pytest plugin: each test's outcome (its call, or its setup when that skipped or
    failed), and the skips by reason."""

    def __init__(self) -> None:
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.skips: collections.Counter[str] = collections.Counter()

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = "error" if report.when == "setup" and report.failed else report.outcome
            self.outcomes[outcome] += 1
            if report.skipped:
                self.skips[report.longrepr[2] if isinstance(report.longrepr, tuple)
                           else str(report.longrepr)] += 1
        elif report.when == "teardown" and report.failed:
            self.outcomes["error"] += 1

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.outcomes["error"] += 1  # a module that does not import


def checkout_commit(path: Path) -> str:
    out = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown (not a git work tree)"


def foreign_jaxdecomp_modules() -> list[str]:
    """The `jaxdecomp*` modules loaded that are not pencilfft's."""
    import pencilfft.compat

    home = Path(pencilfft.compat.__file__).resolve().parent
    bad = []
    for name, mod in list(sys.modules.items()):
        if name.split(".")[0] in ("jaxdecomp", "jaxdecomplib") and mod is not None:
            where = Path(getattr(mod, "__file__", None) or "?").resolve()
            if home not in where.parents:
                bad.append(f"{name} ({where})")
    return bad


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a jaxdecomp checkout (its tests/ is run)")
    parser.add_argument("--jaxdecomp", action="store_true",
                        help="run with the real jaxdecomp installed here (the baseline)")
    args = parser.parse_args(own)
    tests = args.checkout.resolve() / "tests"
    if not all((tests / m).is_file() for m in MODULES):
        parser.error(f"{tests} does not hold {', '.join(MODULES)}")
    if "jax" in sys.modules:
        raise RuntimeError("jax was imported before the device count was set")
    # As jaxdecomp's conftest sets up a local run (it does so only if jax is not imported yet).
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={DEVICES}").strip()

    if not args.jaxdecomp:
        sys.path.insert(0, str(ROOT))  # this checkout's pencilfft
        sys.modules["jaxdecomplib"] = None  # jaxdecomp's C++ extension: `import` fails
        import pencilfft.compat

        pencilfft.compat.install()
    import pytest

    counts = Counts()
    os.chdir(tests)
    rc = pytest.main(["-q", "-rfE", "-o", "addopts=", "-p", "no:cacheprovider", *MODULES,
                      *extra], plugins=[counts])
    import jax

    jaxdecomp = sys.modules.get("jaxdecomp")
    library = getattr(jaxdecomp, "__name__", "?") + f" ({getattr(jaxdecomp, '__file__', '?')})"
    print(f"\njaxdecomp's tests at {checkout_commit(args.checkout)}, {', '.join(MODULES)}; "
          f"jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} devices, "
          f"one process; `jaxdecomp` was {library}")
    print("counts: " + ", ".join(f"{counts.outcomes[k]} {k}"
                                 for k in ("passed", "failed", "error", "skipped")))
    for reason, n in counts.skips.most_common():
        print(f"  skipped {n:4d}: {reason}")
    if not args.jaxdecomp and (bad := foreign_jaxdecomp_modules()):
        print("a real jaxdecomp was loaded: " + ", ".join(bad))
        return 3
    return int(rc)


if __name__ == "__main__":
    sys.exit(main())
