"""Tensor plumbing shared by executors: concatenating items, converting ArrayData."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from walkserve.core.array import ArrayData

_NP_TO_NAME = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
_NAME_TO_TORCH = {v: k for k, v in _NP_TO_NAME.items()}


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
