"""The README's Poisson example runs as written (on a smaller grid) and gives numpy's answer."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


README = Path(__file__).resolve().parents[1] / "README.md"

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


def _layout_rows() -> set[str]:
    section = README.read_text().split("## Layout of the package", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"`(pencilfft/[\w/.]+\.py)`", section))
    # "`pencilfft/compat/fft.py`, `halo.py`": a bare file name continues the folder before it
    for line in section.splitlines():
        folder = re.match(r"\| `(pencilfft/[\w/]+/)\w+\.py`", line)
        if folder:
            rows |= {folder.group(1) + f for f in re.findall(r"`(\w+\.py)`", line)}
    return rows


def test_layout_table_matches_the_package():
    """Every module of the package has a row, and every row names a module that exists."""
    root = README.parent
    modules = {str(p.relative_to(root)) for p in (root / "pencilfft").rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py") or p.parent.name != "pencilfft"}
    assert _layout_rows() == modules


def test_api_table_lists_the_public_api():
    import pencilfft

    table = README.read_text().split("## API", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in pencilfft.__all__
               if f"`{name}(" not in table and f"`{name}`" not in table]
    assert not missing, f"README's API table lacks {missing}"
