"""SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.linear import FusedLinear, Linear


class SwiGLU(nn.Module):
    """Checkpoint names: ``gate_proj``, ``up_proj``, ``down_proj`` (gate/up read into ``gate_up_proj``)."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = FusedLinear(
            hidden_size, [("gate_proj", intermediate_size), ("up_proj", intermediate_size)], bias=bias
        )
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))  # [..., I] each
        return self.down_proj(F.silu(gate) * up)  # [..., D]
