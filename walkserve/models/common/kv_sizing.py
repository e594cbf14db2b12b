"""KV-pool sizing for the placement's memory check: one rule for every family (torch-free).

A KV-cache component's pool is what its engine will allocate: the options'
``kv_bytes``; else ``num_blocks`` blocks of ``block_size`` tokens at the
component's bytes per token; else the device default
(``placement.memory.default_kv_bytes``: a fixed size on a CPU, a share of the
memory left once the weights are in on a GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from walkserve.core.errors import ConfigError
from walkserve.core.options import KVOptions
from walkserve.placement.memory import default_kv_bytes

SIZING_FIELDS = ("kv_bytes", "num_blocks", "block_size")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """K and V of one token in every layer: 2 x layers x KV heads x head_dim x bytes per value."""
    return 2 * layers * kv_heads * head_dim * itemsize


def sizing_options(options: KVOptions | Mapping[str, Any]) -> KVOptions:
    """The typed options a pool is sized from; a mapping's unset (None, 0) sizing fields take the defaults."""
    if isinstance(options, KVOptions):
        return options
    given = {name: options[name] for name in SIZING_FIELDS if options.get(name)}
    try:
        return msgspec.convert(given, KVOptions, strict=False)
    except msgspec.ValidationError as e:
        raise ConfigError(f"kv engine option: {e}") from None


def has_pool_size(options: KVOptions | Mapping[str, Any]) -> bool:
    """True when the options fix the pool's size (``kv_bytes`` or ``num_blocks``) rather than the device."""
    kv = sizing_options(options)
    return bool(kv.kv_bytes or kv.num_blocks)


def kv_pool_bytes(options: KVOptions | Mapping[str, Any], per_token: int, device: str, free_bytes: int | None) -> int:
    """The pool a KV engine with ``options`` allocates on ``device`` (``free_bytes`` free there once the weights
    are loaded; None where unknown)."""
    kv = sizing_options(options)
    if kv.kv_bytes:
        return kv.kv_bytes
    if kv.num_blocks:
        return kv.num_blocks * kv.block_size * per_token
    return default_kv_bytes(device, free_bytes)
