"""Rules over the source tree that ruff and import-linter do not check."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "walkserve"

# Calls an assert may make: builtins and read-only methods (nothing that changes state).
PURE_FUNCTIONS = {"len", "isinstance", "issubclass", "all", "any", "bool", "set", "frozenset", "sorted", "min", "max",
                  "sum", "tuple", "list", "hasattr", "callable", "type", "id", "abs", "int", "float", "str", "repr",
                  "zip", "range", "enumerate"}
PURE_METHODS = {"all", "any", "keys", "values", "items", "get", "isdisjoint", "issubset", "issuperset", "startswith",
                "endswith", "numel", "dim", "size"}


def _sources(root: Path) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(root.rglob("*.py"))]


def _impure_calls(node: ast.expr) -> list[str]:
    bad = []
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        f = call.func
        if isinstance(f, ast.Name) and f.id in PURE_FUNCTIONS:
            continue
        if isinstance(f, ast.Attribute) and f.attr in PURE_METHODS:
            continue
        bad.append(ast.unparse(f))
    return bad


def test_asserts_have_no_side_effects():
    """``python -O`` strips asserts, so an assert must only check, never do (e.g. reserve KV slots)."""
    found = []
    for path, tree in _sources(PACKAGE):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert):
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {call}()" for call in _impure_calls(node.test)]
    assert not found, "asserts that call something (move the call out of the assert):\n" + "\n".join(found)


def _importorskips(tree: ast.Module) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip":
            arg = node.args[0] if node.args else None
            found.append((node.lineno, arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg)))
    return found


def test_only_optional_third_party_packages_are_importorskipped():
    """A broken import of our own code must fail the run, never turn a test into a skip."""
    own = []
    for path, tree in _sources(ROOT / "tests"):
        for line, name in _importorskips(tree):
            if not str(name).split(".")[0].isidentifier() or str(name).startswith(("walkserve", "tests")):
                own.append(f"{path.relative_to(ROOT)}:{line}: importorskip({name!r})")
    assert not own, "import our own modules directly:\n" + "\n".join(own)


def test_stateless_components_share_one_signature():
    """Every ``forward_batch`` (the stateless component contract) is ``forward_batch(self, batch: Batch)``."""
    bad = []
    for path, tree in _sources(PACKAGE):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "forward_batch":
                args = node.args
                names = [a.arg for a in args.args]
                annotation = ast.unparse(args.args[1].annotation) if len(args.args) == 2 and args.args[1].annotation else ""
                if names != ["self", "batch"] or annotation != "Batch" or args.vararg or args.kwarg or args.kwonlyargs:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: forward_batch({', '.join(names)})")
    assert not bad, "forward_batch must take (self, batch: Batch):\n" + "\n".join(bad)
