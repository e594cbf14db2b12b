"""LocalAttention: pre-norm self-attention inside fixed, non-overlapping time windows, with rotary positions.

Used at the decoder's input when ``attn_window_size`` is set (not in the 24 kHz
model). The time axis is cut into windows of ``window`` steps; each window
attends only to itself (no mask inside it), with 64-wide heads and rotary
embeddings whose positions restart at 0 in every window::

    x: [B, T, C]  ->  LayerNorm over C  ->  q, k, v: [B, H, T/window, window, 64]
                  ->  softmax(q k^T / 8) v  ->  Linear  ->  + x
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from walkserve.models.snac.config import ATTN_HEAD_DIM

ROPE_BASE = 10000.0


def rotary_cos_sin(
    n: int, dim: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables ``[n, dim]`` for positions 0..n-1, halves laid out as ``[f0..f_{d/2-1}, f0..f_{d/2-1}]``."""
    inv_freq = 1.0 / ROPE_BASE ** (
        torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim
    )
    angles = torch.outer(
        torch.arange(n, device=device, dtype=torch.float32), inv_freq
    )  # [n, dim/2]
    angles = torch.cat((angles, angles), dim=-1)  # angles: [n, dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LocalAttention(nn.Module):
    """Windowed multi-head self-attention with a residual; ``T`` must be a multiple of ``window``."""

    def __init__(self, dim: int, window: int):
        super().__init__()
        self.window = window
        self.heads = dim // ATTN_HEAD_DIM
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, C]
        B, T, C = x.shape
        if T % self.window:
            raise ValueError(
                f"SNAC local attention: {T} latent steps is not a multiple of the window {self.window}"
            )
        h = self.norm(x)  # h: [B, T, C]
        shape = (B, T // self.window, self.window, self.heads, ATTN_HEAD_DIM)
        q, k, v = (t.reshape(shape).permute(0, 3, 1, 2, 4) for t in self.to_qkv(h).chunk(3, dim=-1))
        cos, sin = rotary_cos_sin(self.window, ATTN_HEAD_DIM, x.device, x.dtype)  # [window, 64]
        q = q * cos + rotate_half(q) * sin  # q: [B, H, W, window, 64]
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v)  # out: [B, H, W, window, 64]
        out = out.permute(0, 2, 3, 1, 4).reshape(B, T, C)  # out: [B, T, C]
        return self.to_out(out) + x  # [B, T, C]
