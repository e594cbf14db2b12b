"""``--config``: a placement YAML path, or the name of a placement shipped in ``walkserve/placements/``."""

from __future__ import annotations

from pathlib import Path

from walkserve.core.errors import PlacementError

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "placements"


def shipped_placements() -> list[str]:
    """Names of the placement files that ship with walkserve (``orpheus-split`` for orpheus-split.yaml)."""
    if not SHIPPED_DIR.is_dir():
        return []
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def placement_path(value: str) -> Path:
    """The file ``--config VALUE`` names: an existing path, else a shipped placement by name."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if path.exists():
        raise PlacementError(f"--config {value}: not a file")
    if "/" not in value:
        shipped = SHIPPED_DIR / (value if value.endswith((".yaml", ".yml")) else f"{value}.yaml")
        if shipped.is_file():
            return shipped
    names = shipped_placements()
    hint = f" (shipped placements: {', '.join(names)})" if names else ""
    raise PlacementError(f"--config {value}: no such placement file{hint}")
