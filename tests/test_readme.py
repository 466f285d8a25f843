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
