"""Placement files that ship with walkserve, found by name.

    walkserve.placements.path("orpheus-split")   -> .../walkserve/placements/orpheus-split.yaml
    walkserve.placements.names()                 -> ["orpheus-colocated", "orpheus-split"]

A value that is an existing file is returned as it is, so callers can accept
either a shipped name or a path. The YAML files are package data
(``[tool.setuptools.package-data]`` in pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

from walkserve.core.errors import PlacementError

DIR = Path(__file__).resolve().parent
SUFFIXES = (".yaml", ".yml")


def names() -> list[str]:
    """Names of the shipped placements (file names without ``.yaml``)."""
    return sorted(p.stem for p in DIR.glob("*.yaml"))


def path(name: str | Path) -> Path:
    """The placement file ``name`` refers to: an existing file, else a shipped placement by name.

    Raises PlacementError naming the value and listing the shipped names.
    """
    given = Path(name).expanduser()
    if given.is_file():
        return given
    text = str(name)
    if "/" not in text:
        shipped = DIR / (text if text.endswith(SUFFIXES) else f"{text}.yaml")
        if shipped.is_file():
            return shipped
    raise PlacementError(f"no placement file {text!r} (shipped placements: {', '.join(names())})")
