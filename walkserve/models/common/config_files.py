"""A checkpoint's JSON config files, read once with the same errors for every family (torch-free)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from walkserve.core.errors import ConfigError
from walkserve.models.base import ModelRef

CONFIG_FILE = "config.json"
RANDOM_WEIGHTS_KEY = "walkserve_random_weights"  # config.json marker written by the tiny checkpoint writers


def read_config_json(path: str | Path, file: str = CONFIG_FILE, label: str = "") -> dict[str, Any]:
    """The JSON object in ``path`` (a file), or in ``path / file`` (a checkpoint directory).

    ConfigError, prefixed by ``label``, when the file is missing, is not JSON or holds no object.
    """
    path = Path(path)
    if path.is_dir():
        path = path / file
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{label}{path} does not exist (no {path.name} in {path.parent})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{label}{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{label}{path} must hold a JSON object")
    return data


def checkpoint_dir(ref: ModelRef, what: str) -> Path:
    """``ref.path`` as a directory holding a config.json; ConfigError naming ``what`` otherwise."""
    if not ref.path:
        raise ConfigError(f"model family {ref.family!r} needs a checkpoint directory for {what} (--model-path)")
    path = Path(ref.path)
    if not (path / CONFIG_FILE).is_file():
        raise ConfigError(f"{path}: not a checkpoint directory (no {CONFIG_FILE})")
    return path
