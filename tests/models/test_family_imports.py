"""Model families import ``models/common``, the shared towers and the model API, never each other.

The one exception is by design: a family built on another's architecture
(Orpheus's LM is a Llama, served with Llama's component, walks and tiny
writer). Shared building blocks go to ``models/common`` (docs/adding-a-model.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import walkserve.models

MODELS = Path(walkserve.models.__file__).parent
SHARED = {"common", "snac", "siglip"}  # packages every family may import; they import no family
ALLOWED = {("orpheus", "llama")}  # (family, the family whose architecture it reuses by design)


def packages() -> list[str]:
    return sorted(p.name for p in MODELS.iterdir() if (p / "__init__.py").is_file())


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at any level (module, function, TYPE_CHECKING), relative ones resolved."""
    package = ".".join(path.relative_to(MODELS.parent.parent).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def foreign_imports(package: str) -> list[str]:
    """``file -> module`` for each import of another model package that the rule does not allow."""
    bad = []
    for path in sorted((MODELS / package).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            parts = module.split(".")
            if parts[:2] != ["walkserve", "models"] or len(parts) < 3 or not (MODELS / parts[2]).is_dir():
                continue
            target = parts[2]
            if target == package or target in SHARED or (package, target) in ALLOWED:
                continue
            bad.append(f"{path.relative_to(MODELS)} -> {module}")
    return bad


def test_the_scan_finds_every_kind_of_import(tmp_path, monkeypatch):
    """The scanner sees module-level, function-level, aliased and relative imports of another family."""
    fake = tmp_path / "walkserve" / "models"
    for name in ("alpha", "beta", "common"):
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text("")
    (fake / "alpha" / "a.py").write_text(
        "from walkserve.models.common import x\n"
        "import walkserve.models.beta.b as bb\n"
        "def f():\n    from ..beta import c\n"
        "from walkserve.models import beta\n"
    )
    monkeypatch.setitem(globals(), "MODELS", fake)
    assert foreign_imports("alpha") == [
        "alpha/a.py -> walkserve.models.beta",
        "alpha/a.py -> walkserve.models.beta.b",
        "alpha/a.py -> walkserve.models.beta.c",
    ]
    assert foreign_imports("common") == []


def test_families_import_no_other_family():
    found = {p: foreign_imports(p) for p in packages()}
    assert {p for p in found if p not in SHARED} >= {"llama", "orpheus", "qwen3_omni", "bagel", "vjepa2", "pi0"}
    assert {p: bad for p, bad in found.items() if bad} == {}


def test_the_allowed_reuse_is_still_used():
    """Each by-design exception is real: drop it from ALLOWED once the family stops reusing the other."""
    for family, base in ALLOWED:
        uses = {m for path in (MODELS / family).rglob("*.py") for m in imported_modules(path)}
        assert any(m.startswith(f"walkserve.models.{base}.") for m in uses), (family, base)
