"""Import rules inside packages, over every import import-linter skips: function-level and TYPE_CHECKING ones too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "walkserve"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """Every module ``path`` imports, wherever the import sits (``from a import b`` counts ``a.b`` when it is a module)."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known}
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    paths = sorted((PACKAGE / package.removeprefix("walkserve.").replace(".", "/")).rglob("*.py"))
    known = {module_name(p) for p in paths}
    return {module_name(p): {m for m in imported_modules(p, known) if m in known and m != module_name(p)}
            for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_sees_a_lazy_back_import():
    """The check itself: a function-level import back up closes a circle."""
    graph = {"p.low": {"p.high"}, "p.high": {"p.low"}, "p.leaf": set()}
    assert cycles(graph) == [["p.high", "p.low"]]
    assert cycles({"p.a": {"p.b"}, "p.b": set()}) == []


@pytest.mark.parametrize("package", ["walkserve.engines", "walkserve.layers"])
def test_no_import_cycle_inside(package):
    found = cycles(import_graph(package))
    assert not found, f"import circles in {package} (lazy and TYPE_CHECKING imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_imports_count_every_kind(tmp_path):
    """Module-level, function-level and TYPE_CHECKING imports are all edges, ``from pkg import module`` too."""
    (tmp_path / "walkserve").mkdir()
    src = tmp_path / "walkserve" / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from walkserve.a import X\n"
                   "def f():\n    from walkserve import b\n    import walkserve.c\n")
    got = imported_modules(src, {"walkserve.b"}, root=tmp_path)
    assert {"walkserve.a", "walkserve.b", "walkserve.c"} <= got


def _imports_of(package: str) -> list[tuple[str, str, list[str]]]:
    """(module, imported module, names) for every import under ``package``."""
    out = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                out.append((module_name(path), node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                out += [(module_name(path), a.name, []) for a in node.names]
    return out


def test_engines_never_import_models():
    """Engines see a component only through engines.spec (ComponentSpec, BuildContext, Batch)."""
    bad = [f"{m} imports {target}" for m, target, _ in _imports_of("engines") if target.startswith("walkserve.models")]
    assert not bad, "\n".join(bad)


def test_models_never_import_the_worker_engine_messages():
    """A model's stateless component reads an engines.spec.Batch, never a Firing (engines.base is the worker's side)."""
    bad = [f"{m} imports {target} {names}" for m, target, names in _imports_of("models")
           if target == "walkserve.engines.base" or (target == "walkserve.engines" and "base" in names)]
    assert not bad, "\n".join(bad)
