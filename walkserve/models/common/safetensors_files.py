"""Safetensors checkpoint files and headers, read without torch.

A checkpoint directory holds ``model.safetensors``, or shards listed by
``model.safetensors.index.json`` (``{"weight_map": {tensor name: shard file}}``).
Each file starts with an 8-byte little-endian header length and a JSON header
``{name: {"dtype", "shape", "data_offsets"}}``: enough to size the weights
for the placement's memory check in a process that never loads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from walkserve.core.errors import ConfigError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1}
DTYPE_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def read_header(path: Path) -> dict:
    """``{tensor name: {"dtype", "shape", "data_offsets"}}`` of one safetensors file."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable safetensors file ({e})") from None
    header.pop("__metadata__", None)
    return header


def weight_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (one, or the shards of its index)."""
    directory = Path(directory)
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ConfigError(f"{index}: not a safetensors index ({e})") from None
        return sorted(directory / file for file in set(weight_map.values()))
    if not (directory / SINGLE_FILE).is_file():
        raise ConfigError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}")
    return [directory / SINGLE_FILE]


def tensor_bytes(directory: str | Path, dtype: str | None = None, prefix: str = "") -> int:
    """Bytes of every tensor of the checkpoint (whose name starts with ``prefix``): as stored, or at ``dtype``
    ("float32", "bfloat16", "float16")."""
    if dtype is not None and dtype not in DTYPE_ITEMSIZE:
        raise ConfigError(f"unsupported weight dtype {dtype!r} (supported: {', '.join(DTYPE_ITEMSIZE)})")
    total = 0
    for path in weight_files(directory):
        for name, entry in read_header(path).items():
            if not name.startswith(prefix):
                continue
            itemsize = DTYPE_ITEMSIZE[dtype] if dtype else ITEMSIZE.get(entry["dtype"], 4)
            total += math.prod(entry["shape"]) * itemsize
    return total


def written_once(root: Path, model_id: str, write: Callable[[Path], None]) -> Path:
    """The checkpoint directory for ``model_id`` under ``root``: ``write(tmp)`` fills it once (into a temporary
    directory, renamed when complete), and a complete one is reused."""
    directory = root / model_id.replace("/", "--")
    if (directory / "config.json").is_file():
        return directory
    tmp = directory.with_name(directory.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    write(tmp)
    tmp.replace(directory)
    return directory
