"""The package's shape, read from its imports (docs/_ext/pencilfft_package.py): no import circle,
no private name taken across modules, each part importing only the parts below it, a facade of
subpackages with few loose modules, and a docstring on every part."""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "pencilfft_package", ROOT / "docs" / "_ext" / "pencilfft_package.py")
package = importlib.util.module_from_spec(_spec)
sys.modules["pencilfft_package"] = package
_spec.loader.exec_module(package)

LOOSE, FACADE = package.LOOSE, package.FACADE
# The contract: the parts each part may import (docs/development.md and each part's docstring
# say the same).  Below everything: the loose modules and the handlers' runtime.
BASE = {LOOSE}
MAY_IMPORT = {
    LOOSE: set(),
    "_native": set(),
    "_decomposition": BASE,
    "_processes": BASE | {"_decomposition"},
    "_exchange": BASE | {"_native", "_decomposition", "_processes"},
    "_transforms": BASE | {"_native", "_decomposition", "_processes", "_exchange"},
    "_pm": BASE | {"_native", "_decomposition", "_processes", "_exchange", "_transforms"},
    "compat": BASE | {"_decomposition", "_processes", "_exchange", "_transforms", "_pm"},
    "_cli": BASE | {"_native", "_decomposition", "_processes", "_exchange", "_transforms",
                    "_pm"},
}


@pytest.fixture(scope="module")
def edges():
    return package.graph()


def test_the_reader_sees_the_imports(edges):
    """The reader itself: known arrows, a relative import two levels up, a lazy one."""
    assert "pencilfft._transforms.plan" in edges["pencilfft._transforms.stages"]
    assert "pencilfft._native.build" in edges["pencilfft._exchange.mpi"]
    assert "pencilfft._pm.paint" in edges["pencilfft"]
    assert package.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle(edges):
    assert package.cycles(edges) == []


def test_no_private_name_crosses_modules():
    assert package.private_names() == []


def test_each_part_imports_only_the_parts_below_it(edges):
    arrows = package.parts(edges)
    assert set(arrows) - {FACADE} == set(MAY_IMPORT), "a new part: give it its place here"
    wrong = {p: sorted(set(dsts) - MAY_IMPORT[p]) for p, dsts in arrows.items()
             if p != FACADE and set(dsts) - MAY_IMPORT[p]}
    assert wrong == {}


def test_the_top_level_is_a_facade_of_parts():
    loose = sorted(p.name for p in package.PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "_jax_private.py", "_measure.py"]
    for folder in sorted(p for p in package.PACKAGE.iterdir()
                         if p.is_dir() and not p.name.startswith("__")):
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder.name} is not a package"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 200, f"{folder.name}/__init__.py: say what the part holds"
    # every compiled handler sits beside a module that names it
    for source in package.PACKAGE.rglob("*.cc"):
        binders = [p for p in source.parent.glob("*.py") if f'"{source.name}"' in p.read_text()]
        assert binders, f"{source} is bound by no module beside it"
