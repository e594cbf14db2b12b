"""Model families by name, imported lazily so a bare install imports nothing heavy."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from walkserve.core.errors import ConfigError
from walkserve.models.base import Model, ModelRef

# family -> "module:factory"; the factory takes a ModelRef and returns a Model.
_FAMILIES: dict[str, str] = {}
ENTRY_POINTS = "walkserve.models"  # plugin families: an entry point named FAMILY = "package.module:factory"
_plugins_read = False


def register(family: str, target: str) -> None:
    """Register ``family`` as ``"package.module:factory"`` (imported on first use)."""
    _FAMILIES[family] = target


def _ensure_builtin() -> None:
    import walkserve.models.builtin  # noqa: F401  (registers the shipped families on first use)

    global _plugins_read
    if not _plugins_read:  # marked read only once read: a thread that comes meanwhile reads them too
        for entry in entry_points(group=ENTRY_POINTS):  # a shipped family keeps its name
            _FAMILIES.setdefault(entry.name, entry.value)
        _plugins_read = True


def families() -> list[str]:
    _ensure_builtin()
    return sorted(_FAMILIES)


def _resolve(target: str) -> Callable[[ModelRef], Model]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_model(ref: ModelRef) -> Model:
    """Build the model a ModelRef names. A ``module:factory`` family works without registration."""
    _ensure_builtin()
    target = _FAMILIES.get(ref.family)
    if target is None and ":" in ref.family:
        target = ref.family
    if target is None:
        raise ConfigError(f"unknown model family {ref.family!r} (known: {', '.join(families()) or 'none'})")
    try:
        factory = _resolve(target)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"model family {ref.family!r}: cannot import {target}: {e}") from None
    return factory(ref)
