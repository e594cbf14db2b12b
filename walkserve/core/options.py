"""Engine options as typed structs, checked when a placement is loaded and again where an engine is built.

A component's options (``ComponentSpec.options``) with the runtime's
per-engine-kind overrides (``RuntimeConfig.engine_options``) must convert to
the struct of its engine kind; an unknown or out-of-range option is a
ConfigError naming it and the component.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from walkserve.core.errors import ConfigError, InvalidRequest
from walkserve.core.params import parse_params

Positive = Annotated[int, msgspec.Meta(ge=1)]


class KVOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The paged-KV engine's options (see ``KVCacheEngine``)."""

    block_size: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 16
    num_blocks: Positive | None = None
    kv_bytes: Positive | None = None
    max_batch_tokens: Positive = 2048
    max_running: Positive = 64
    attention: Literal["auto", "torch", "flashinfer"] = "auto"
    prefix_caching: bool = True
    # captured rows of finished prompt pieces, for an equal piece after the same history (engines/kv/capture_cache.py)
    capture_cache_bytes: Annotated[int, msgspec.Meta(ge=0)] = 256 * 2**20
    seed: Annotated[int, msgspec.Meta(ge=0)] | None = None
    cuda_graphs: bool = False  # decode steps replay per-batch-size CUDA graphs (engines/kv/cuda_graphs.py)
    cuda_graph_sizes: list[Positive] | None = None  # the batch-size buckets (default 1 2 4 8 16 24 32 48 64)


class StatelessOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    max_batch: Positive = 64


class NullOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    outputs: dict[str, Any] = {}


OPTIONS = {"kv": KVOptions, "stateless": StatelessOptions, "null": NullOptions}


def engine_options(kind: str, component: str, options: Mapping[str, Any] | None,
                   overrides: Mapping[str, Any] | None = None) -> msgspec.Struct:
    """The options of ``component`` on an engine of ``kind``, checked; ConfigError naming the bad option."""
    struct = OPTIONS.get(kind)
    if struct is None:
        raise ConfigError(f"component {component!r}: unknown engine kind {kind!r} (known: {', '.join(OPTIONS)})")
    try:
        return parse_params(struct, {**dict(options or {}), **dict(overrides or {})}, f"{kind} engine option")
    except InvalidRequest as e:
        raise ConfigError(f"component {component!r}: {e}") from None
