"""The bytes each served component of a pi0 / pi0.5 checkpoint holds, read from the safetensors headers (torch-free).

The placement's memory check sizes every rank with these: the tensors each
component loads (as stored, or at the dtype the rank loads them in), and the
KV pool the VLM and the expert share, per token 2 (K, V) x layers x KV heads
x head_dim x itemsize (36 KiB fp32, 18 KiB bf16 for gemma_2b: 18 x 1 x 256).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from walkserve.models.common.kv_sizing import kv_bytes_per_token as common_kv_bytes_per_token
from walkserve.models.common.safetensors_files import (
    DTYPE_ITEMSIZE,
    ITEMSIZE,
    read_header,
    weight_files,
)
from walkserve.models.pi0.config import PolicyConfig
from walkserve.models.pi0.names import EMBEDDING, TIED_HEAD, component_of

FILE_PREFIX = "model."


def component_bytes(path: str | Path, dtype: str | None = None) -> dict[str, int]:
    """{"vision", "lm", "expert", "flow_head": bytes}; the expert counts its own copy of the action projections."""
    entries = {}
    for file in weight_files(path):
        for name, entry in read_header(file).items():
            entries[name.removeprefix(FILE_PREFIX)] = entry
    out: dict[str, int] = defaultdict(int)
    for name, entry in entries.items():
        if name == TIED_HEAD and EMBEDDING in entries:
            continue  # the tied head duplicates the embedding, which is loaded instead
        owner = component_of(name)
        if owner is None:
            continue
        size = math.prod(entry["shape"]) * (DTYPE_ITEMSIZE[dtype] if dtype else ITEMSIZE.get(entry["dtype"], 4))
        out[owner] += size
        if owner == "flow_head":
            out["expert"] += size
    return {name: out[name] for name in ("vision", "lm", "expert", "flow_head")}


def kv_bytes_per_token(config: PolicyConfig, itemsize: int = 4) -> int:
    g = config.paligemma
    return common_kv_bytes_per_token(g.num_hidden_layers, g.num_key_value_heads, g.head_dim, itemsize)
