"""The code's shape, measured (run from the project root: ``python scripts/code_shape.py``).

Sizes (files, functions), import circles among walkserve's modules, imports from one model family into
another, and the signatures of the stateless component contract (``forward_batch``). The figures in
docs/structure.md ("The shape, measured") come from this script; rerun it when they may have moved.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from the root: tests/ importable

from tests.test_layering import cycles as circles  # one Tarjan, shared with the layering test

PACKAGE = pathlib.Path("walkserve")
SHARED = {"common"}  # models/common is every family's base, not a family


def trees() -> dict[pathlib.Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def sizes(parsed: dict[pathlib.Path, ast.Module], under: pathlib.Path, top: int = 5) -> None:
    files = {p: len(p.read_text().splitlines()) for p in parsed if under in p.parents or p == under}
    fns = sorted((n.end_lineno - n.lineno + 1, f"{p}:{n.lineno} {n.name}") for p in files for n in ast.walk(parsed[p])
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    lengths = [n for n, _ in fns]
    p90 = lengths[min(len(lengths) - 1, int(0.9 * len(lengths)))]
    print(f"{under}: {len(files)} files, {sum(files.values())} lines; functions {len(lengths)}: median "
          f"{statistics.median(lengths)}, p90 {p90}, max {lengths[-1]}, over 60 lines {sum(n > 60 for n in lengths)}")
    print("  largest files:", ", ".join(f"{p} {n}" for p, n in sorted(files.items(), key=lambda x: -x[1])[:top]))
    print("  longest functions:", "; ".join(f"{w} {n}" for n, w in fns[::-1][:top]))


def module_of(path: pathlib.Path) -> str:
    return ".".join(path.with_suffix("").parts).removesuffix(".__init__")


def import_edges(parsed: dict[pathlib.Path, ast.Module], runtime_only: bool) -> dict[str, set[str]]:
    """Module -> the walkserve modules it imports; ``runtime_only`` leaves out TYPE_CHECKING and function-level ones."""
    mods = {module_of(p): p for p in parsed}
    edges = {}
    for mod, path in mods.items():
        skip: set[int] = set()
        if runtime_only:
            for n in ast.walk(parsed[path]):
                if (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)) or isinstance(
                        n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    skip |= {id(x) for x in ast.walk(n)}
        out = set()
        for n in ast.walk(parsed[path]):
            if id(n) not in skip and isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("walkserve"):
                out |= {f"{n.module}.{a.name}" if f"{n.module}.{a.name}" in mods else n.module for a in n.names}
        edges[mod] = {t for t in out if t in mods and t != mod and mods[t].name != "__init__.py"}
    return edges


def family_imports(parsed: dict[pathlib.Path, ast.Module]) -> None:
    models = PACKAGE / "models"
    families = {p.name for p in models.iterdir() if (p / "__init__.py").is_file()} - SHARED
    cross: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    private = []
    for path, tree in parsed.items():
        if models not in path.parents or path.parent == models:
            continue
        family = path.relative_to(models).parts[0]
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("walkserve.models."):
                other = n.module.split(".")[2]
                if other in families and other != family:
                    cross[(family, other)].add(str(path.relative_to(models)))
                    if any(part.startswith("_") for part in n.module.split(".")[3:]) or any(
                            a.name.startswith("_") for a in n.names):
                        private.append(f"{path}: from {n.module} import ...")
    for (family, other), files in sorted(cross.items()):
        print(f"  {family} -> {other}: {len(files)} files ({', '.join(sorted(files))})")
    print("  private names or modules of another family imported:", len(private), *private)


def component_signatures(parsed: dict[pathlib.Path, ast.Module]) -> None:
    sigs: dict[str, list[str]] = collections.defaultdict(list)
    for path, tree in parsed.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.FunctionDef) and n.name == "forward_batch":
                args = ", ".join(f"{a.arg}: {ast.unparse(a.annotation) if a.annotation else '?'}"
                                 for a in n.args.args if a.arg != "self")
                sigs[f"forward_batch({args}) -> {ast.unparse(n.returns) if n.returns else '?'}"].append(f"{path}:{n.lineno}")
    for sig, where in sorted(sigs.items(), key=lambda x: -len(x[1])):
        print(f"  {len(where)} x {sig}")


def main() -> None:
    parsed = trees()
    print("== sizes")
    for under in (PACKAGE, PACKAGE / "models", PACKAGE / "worker"):
        sizes(parsed, under)
    print("== import circles")
    for label, runtime_only in (("all imports (TYPE_CHECKING and function-level included)", False),
                                ("module-level runtime imports", True)):
        found = circles(import_edges(parsed, runtime_only))
        print(f"  {label}: {len(found)}", *found)
        for package in ("worker", "engines", "layers"):
            mine = [c for c in found if any(m.startswith(f"walkserve.{package}.") for m in c)]
            print(f"    in walkserve/{package}: {len(mine)}")
    print("== imports from one model family into another (models/common excluded)")
    family_imports(parsed)
    print("== the stateless component contract")
    component_signatures(parsed)


if __name__ == "__main__":
    main()
