"""dtype names on the wire <-> torch dtypes."""

from __future__ import annotations

import torch

TORCH_TO_NAME = {
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
NAME_TO_TORCH = {v: k for k, v in TORCH_TO_NAME.items()}
