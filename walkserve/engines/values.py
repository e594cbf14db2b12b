"""Tensor plumbing shared by executors: concatenating items, converting ArrayData."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from walkserve.core.array import ArrayData
from walkserve.transport.dtypes import NAME_TO_TORCH as _NAME_TO_TORCH
from walkserve.transport.dtypes import TORCH_TO_NAME as _NP_TO_NAME


def concat(items: Sequence[Any], template: Any = None) -> torch.Tensor:
    """Items concatenated along dim 0 (0-d items count as one row); empty -> [0, *template.shape[1:]]."""
    if not items:
        if isinstance(template, torch.Tensor):
            t = template.reshape(1) if template.dim() == 0 else template
            return t.new_empty((0, *t.shape[1:]))
        return torch.empty(0)
    rows = [x.reshape(1) if x.dim() == 0 else x for x in items]
    return torch.cat(rows, dim=0)


def to_tensor(value: Any) -> Any:
    """ArrayData -> torch tensor (shares the bytes when it can); anything else unchanged."""
    if isinstance(value, ArrayData):
        dtype = _NAME_TO_TORCH[value.dtype]
        if value.nbytes == 0:
            return torch.empty(value.shape, dtype=dtype)
        t = torch.frombuffer(bytearray(value.data), dtype=dtype)
        return t.reshape(value.shape)
    return value


def to_array(value: Any) -> Any:
    """torch tensor -> ArrayData; anything else unchanged."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        name = _NP_TO_NAME[t.dtype]
        if t.dtype == torch.bfloat16:
            data = t.view(torch.int16).numpy().tobytes()
        else:
            data = t.numpy().tobytes()
        return ArrayData(name, tuple(t.shape), data)
    if isinstance(value, np.ndarray):
        return ArrayData(str(value.dtype), tuple(value.shape), np.ascontiguousarray(value).tobytes())
    return value
