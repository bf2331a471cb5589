"""The house rules: every layer imports only downward, nothing imports in a circle, ``meshd/``
keeps few loose modules, and every package says what it owns and may import."""

from __future__ import annotations

import ast
from pathlib import Path

from testbed import imports

ROOT = Path(__file__).resolve().parent.parent


def test_no_layer_imports_a_higher_one() -> None:
    found = imports.upward(imports.graph())
    assert not found, "upward imports:\n" + "\n".join(map(str, found))


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert imports.cycles(imports.graph()) == []


def test_meshd_keeps_its_modules_in_packages() -> None:
    assert len(imports.loose()) <= imports.MAX_LOOSE, imports.loose()


def test_every_package_says_what_it_owns_and_may_import() -> None:
    for init in sorted((ROOT / "meshd").glob("*/__init__.py")):
        doc = " ".join((ast.get_docstring(ast.parse(init.read_text())) or "").split())
        assert "may import" in doc.lower() or "import anything" in doc.lower(), init


def test_the_checker_finds_an_upward_import_a_cycle_and_an_unknown_module() -> None:
    layers = (("low",), ("mid", "mid2"), ("high",))
    edges = {
        "low.a": [("high.b", 3)],  # upward
        "mid.a": [("mid2.b", 1), ("low.a", 2)],  # same layer, and down: fine
        "mid2.b": [("mid.a", 5)],  # ... but a circle with mid.a
        "high.b": [("stray", 7)],  # a module no layer names
    }
    assert [str(f) for f in imports.upward(edges, layers)] == [
        "high.b:7 imports stray", "low.a:3 imports high.b"]
    assert imports.cycles(edges) == [["mid.a", "mid2.b"]]
    assert imports.cycles({"x": [("y", 1)], "y": [("z", 1)], "z": []}) == []


def test_a_module_belongs_to_its_longest_named_layer() -> None:
    layers = (("meshd",), ("meshd.signals",), ("meshd.agent",))
    assert imports.layer_of("meshd.logs", layers) == 0
    assert imports.layer_of("meshd.signals.wire", layers) == 1
    assert imports.layer_of("meshd.signalsx", layers) == 0
    assert imports.layer_of("meshd.agent", layers) == 2
    assert imports.layer_of("elsewhere", layers) is None


def test_deferred_and_relative_imports_count(tmp_path: Path) -> None:
    pkg = tmp_path / "low"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from high import b\n    return b\n")
    (pkg / "c.py").write_text("from . import a\nfrom .a import f\n")
    (tmp_path / "high").mkdir()
    (tmp_path / "high" / "__init__.py").write_text("")
    (tmp_path / "high" / "b.py").write_text("")
    known = {"low": pkg / "__init__.py", "low.a": pkg / "a.py", "low.c": pkg / "c.py",
             "high": tmp_path / "high" / "__init__.py", "high.b": tmp_path / "high" / "b.py"}
    assert imports.imports_of("low.a", pkg / "a.py", known) == [("high.b", 2)]
    assert imports.imports_of("low.c", pkg / "c.py", known) == [("low.a", 1)]
