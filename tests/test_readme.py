"""The README stays short and true: its Poisson example runs as written (on a smaller grid) and
gives numpy's answer, its other Python blocks run, its links lead to files that exist; and the
tables that moved from it to the docs (the package's layout, the API at a glance) match the
package."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DEVELOPMENT = ROOT / "docs" / "development.md"  # the package's layout table
API_INDEX = ROOT / "docs" / "api" / "index.md"  # the API at a glance
MAX_LINES = 200  # a README that fits on a screen or two; the rest is in docs/

CHECK = """
import numpy as np
d = np.asarray(delta)
k = np.fft.fftn(d)
kx, ky, kz = np.meshgrid(*[2 * np.pi * np.fft.fftfreq(n) for n in shape], indexing="ij")
k2 = kx**2 + ky**2 + kz**2
ref = np.fft.ifftn(np.where(k2 > 0, -k / np.where(k2 > 0, k2, 1), 0)).real
for name, got in (("c2c", phi), ("r2c", potential_r2c(delta))):
    err = np.abs(np.asarray(got) - ref).max() / np.abs(ref).max()
    assert err < 1e-5, (name, err)
    assert got.sharding.is_equivalent_to(pencilfft.real_space_sharding(mesh), 3), name
print("README example ok")
"""


def test_readme_poisson_example(tmp_path):
    text = README.read_text()
    code = re.search(r"## Example.*?```python\n(.*?)```", text, re.S).group(1)
    assert "shape = (128, 128, 128)" in code
    code = code.replace("shape = (128, 128, 128)", "shape = (32, 32, 32)")
    script = tmp_path / "example.py"
    script.write_text(code + CHECK)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "README example ok" in proc.stdout


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines (at most {MAX_LINES}): move text to docs/"


def test_readme_other_python_blocks_run(tmp_path):
    """Every Python block of the README but the example (run above) runs, in a fresh process."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = re.search(r"## Example.*?```python\n(.*?)```", README.read_text(), re.S).group(1)
    others = [b for b in blocks if b != example]
    assert others, "the README's jaxdecomp lines are Python blocks"
    script = tmp_path / "blocks.py"
    script.write_text("\n".join(others) + "\nimport sys\nassert sys.modules['jaxdecomp'] is jaxdecomp\n"
                      "print('README blocks ok')\n")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "README blocks ok" in proc.stdout


def test_readme_links_exist():
    """Every relative link of the README names a file of the checkout (the docs pages above all),
    and every #anchor one of its headings."""
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]*)(#[^)]*)?\)", text)
    assert links
    for target, anchor in links:
        if target.startswith(("http://", "https://")):
            continue
        path = ROOT / target if target else README
        assert path.exists(), f"README links to {target}, which does not exist"
        if anchor:
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                     for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}
            assert anchor[1:] in slugs, f"README links to {target}{anchor}: no such heading"


def _layout_rows() -> set[str]:
    """The files docs/development.md's table names: each row is a part (`_x/`, or "loose" for
    the top level's modules) and its modules (`name`, `name` + `name.cc`, `sub/name`)."""
    section = DEVELOPMENT.read_text().split("## Layout of the package", 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        folder = re.fullmatch(r"`(_?\w+)/`", cells[0])
        prefix = f"pencilfft/{folder.group(1)}/" if folder else "pencilfft/"
        for name in re.findall(r"`([\w/]+(?:\.cc)?)`", cells[1]):
            rows.add(prefix + (name if name.endswith(".cc") else name + ".py"))
    return rows


def _has_code(path: Path) -> bool:
    """A module with more than a docstring and imports (an `__init__` that holds something)."""
    import ast

    body = ast.parse(path.read_text()).body
    return any(not isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr)) and
               not (isinstance(node, ast.Assign) and
                    [getattr(t, "id", "") for t in node.targets] == ["__all__"])
               for node in body)


def test_layout_table_matches_the_package():
    """Every module of the package (and every compiled handler's source) has a row in
    docs/development.md's table, and every row names a file that exists; an `__init__.py` is
    named where it holds code, not only a docstring and re-exports."""
    root = ROOT
    files = [*(root / "pencilfft").rglob("*.py"), *(root / "pencilfft").rglob("*.cc")]
    modules = {str(p.relative_to(root)) for p in files
               if p.parent.name != "pencilfft" or p.name not in ("__init__.py", "__main__.py")
               if p.name != "__init__.py" or _has_code(p)}
    assert _layout_rows() == modules


def test_api_table_lists_the_public_api():
    import pencilfft

    table = API_INDEX.read_text().split("## At a glance", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in pencilfft.__all__
               if f"`{name}(" not in table and f"`{name}`" not in table]
    assert not missing, f"docs/api/index.md's table (At a glance) lacks {missing}"


def _test_command() -> str:
    """The README's test command (Quickstart): a venv, the install, tests/run.sh."""
    (command,) = re.findall(r"^python3 -m venv .*bash tests/run\.sh$", README.read_text(), re.M)
    return command


def test_the_test_command_is_quoted_the_same_everywhere():
    """Every place that gives the suite's install gives the README's, word for word: CI runs
    it exactly, tests/run.sh names its install when pytest or mpirun is missing, and the docs
    quote it."""
    command = _test_command()
    install = re.search(r'pip install -e "[^"]+"', command).group(0)
    assert install == 'pip install -e ".[mpi,fftw,test]"'  # FFTW asked for, so its tests run
    assert command in (ROOT / ".ci" / "run").read_text()
    assert f"INSTALL='{install}'" in (ROOT / "tests" / "run.sh").read_text()
    for doc in ("docs/getting-started.md", "docs/development.md", "README.md",
                "docs/troubleshooting.md"):
        text = (ROOT / doc).read_text()
        for quoted in re.findall(r'pip install -e "\.\[[\w,-]*test[\w,-]*\]"', text):
            assert quoted == install, f"{doc} quotes {quoted}, the README's command {install}"


@pytest.mark.parametrize("what", ["bare venv", "no mpirun"])
def test_run_sh_without_the_test_extras_names_the_install(what, tmp_path):
    """`bash tests/run.sh --quick` where pytest or mpirun is missing (a venv of the `[cli]`
    Quickstart) stops before any step with one line naming the README's install."""
    env = {k: v for k, v in os.environ.items() if k not in ("MPIRUN", "PYTHON")}
    if what == "bare venv":  # no pytest, no mpirun: what a `[cli]`-only venv has of them
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")],
                       check=True, timeout=120)
        env["PYTHON"], missing = str(tmp_path / "v" / "bin" / "python"), "pytest and mpirun"
    else:
        env["PYTHON"], env["MPIRUN"], missing = sys.executable, str(tmp_path / "mpirun"), "mpirun"
    proc = subprocess.run(["bash", str(ROOT / "tests" / "run.sh"), "--quick"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stdout.splitlines()
    install = re.search(r'pip install -e "[^"]+"', _test_command()).group(0)
    assert line.startswith(f"tests/run.sh: {missing} ") and line.endswith(install), line
    assert proc.stderr == ""


def test_the_suite_duration_is_stated_once():
    """How long the whole suite takes is said in the README alone; the other pages point to it
    (they once said 14 minutes and 15)."""
    pattern = re.compile(r"about \d+ min", re.I)
    assert len(pattern.findall(README.read_text())) == 1
    for page in [*(ROOT / "docs").rglob("*.md"), ROOT / "tests" / "run.sh"]:
        assert not pattern.findall(page.read_text()), page


def _documented_signatures() -> list[tuple[str, str]]:
    """(name, parameters) of every `name(parameters)` in the API table (At a glance), `...`
    and `(...)` left out."""
    table = API_INDEX.read_text().split("## At a glance", 1)[1].split("\n## ", 1)[0]
    found = []
    for cell in (line.split("|")[1] for line in table.splitlines() if line.startswith("| `")):
        for name, params in re.findall(r"`(\w+)\((.*?)\)`", cell):
            if params.strip() != "...":
                found.append((name, params))
    return found


def _split_params(params: str) -> list[str]:
    """'a, b=(1, 2), *, c="x"' -> ['a', 'b=(1, 2)', '*', 'c="x"'] (commas inside brackets kept)."""
    out, depth, current = [], 0, ""
    for ch in params:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    return [p for p in [*out, current.strip()] if p]


def test_api_table_defaults_match_the_signatures():
    """Every parameter the API table names exists, on its side of `*`, with the default the
    table gives (`inspect.signature`; a default the table leaves out is the docstring's to
    say); the table once said `chunks=1` where the code says "auto"."""
    import ast
    import inspect

    import numpy as np

    import pencilfft

    rows = _documented_signatures()
    assert len(rows) >= 20, rows
    problems = []
    for name, params in rows:
        signature = inspect.signature(getattr(pencilfft, name))
        keyword_only = False
        for param in _split_params(params):
            if param == "...":
                continue
            if param == "*":
                keyword_only = True
                continue
            if param.startswith("**"):
                if not any(p.kind is inspect.Parameter.VAR_KEYWORD and p.name == param[2:]
                           for p in signature.parameters.values()):
                    problems.append(f"{name}: no {param}")
                continue
            pname, has_default, text = (s.strip() for s in param.partition("="))
            actual = signature.parameters.get(pname)
            if actual is None:
                problems.append(f"{name}: no parameter {pname}")
                continue
            if keyword_only != (actual.kind is inspect.Parameter.KEYWORD_ONLY):
                problems.append(f"{name}: {pname} is {actual.kind.description}")
            if has_default:
                wanted = np.complex64 if text == "complex64" else ast.literal_eval(text)
                if actual.default is inspect.Parameter.empty or actual.default != wanted:
                    problems.append(f"{name}: {pname}={text} in the table, "
                                    f"{actual.default!r} in the code")
    assert not problems, "docs/api/index.md (At a glance): " + "; ".join(problems)
