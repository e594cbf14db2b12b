"""Weight dtypes by name: the one table and the one resolution rule every family's loader uses."""

from __future__ import annotations

from typing import Protocol

import torch

from walkserve.core.errors import ConfigError

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HasDtype(Protocol):
    dtype: str  # the checkpoint's own dtype name (config.json ``dtype`` / ``torch_dtype``)


def torch_dtype(dtype: str | torch.dtype | None, default: str) -> torch.dtype:
    """A dtype name (``"bfloat16"``, ``"torch.bfloat16"``) or a torch dtype; None: ``default``, a name.

    ConfigError for a dtype weights are never loaded in.
    """
    if isinstance(dtype, torch.dtype):
        if dtype not in TORCH_DTYPES.values():
            raise ConfigError(f"unsupported weight dtype {dtype}")
        return dtype
    name = str(dtype or default).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise ConfigError(f"unsupported weight dtype {name!r} (supported: {', '.join(TORCH_DTYPES)})")
    return TORCH_DTYPES[name]


def resolve_dtype(dtype: str | torch.dtype | None, config: HasDtype) -> torch.dtype:
    """A dtype name, a torch dtype, or None for the checkpoint's own (``config.dtype``)."""
    return torch_dtype(dtype, config.dtype)
