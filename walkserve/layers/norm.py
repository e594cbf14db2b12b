"""RMSNorm, computed in float32 and cast back (as transformers does)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """y = weight * (x / sqrt(mean(x^2) + eps)), normalised over the last dim in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 == self.weight.dtype:  # one fused kernel, the same arithmetic
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        h = x.to(torch.float32)  # [..., D]
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused residual add: returns (norm(x + residual), x + residual)."""
        summed = x + residual  # [..., D]
        return self.forward(summed), summed

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
