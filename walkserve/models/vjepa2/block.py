"""The transformer block every V-JEPA 2 stack shares (encoder, masked predictor, AC predictor).

    x + proj(attend(rope(q), rope(k), v)) over norm1(x);  then h + fc2(gelu(fc1(norm2(h))))

Names follow the HF checkpoint (``layer.N.{norm1, attention.{query,key,value,proj},
norm2, mlp.{fc1,fc2}}``); query/key/value are read into one fused ``qkv``.
Who attends to whom is the caller's ``attend(q, k, v, scale)``: batched SDPA
for the stateless encoders, an ``AttentionContext`` for the AC predictor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.linear import FusedLinear, Linear
from walkserve.layers.rope import apply_rotary_adjacent
from walkserve.models.vjepa2.config import ViTShape

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


class Attention(nn.Module):
    """Multi-head self-attention with V-JEPA 2's 3-D RoPE on q and k."""

    def __init__(self, shape: ViTShape):
        super().__init__()
        d = shape.hidden_size
        self.num_heads, self.head_dim = shape.num_attention_heads, shape.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv = FusedLinear(d, [("query", d), ("key", d), ("value", d)], bias=shape.qkv_bias)
        self.proj = Linear(d, d, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """x [..., N, D], cos/sin [N, Dh] (or per row [..., N, Dh]) -> [..., N, D]."""
        q, k, v = (part.unflatten(-1, (self.num_heads, self.head_dim)) for part in self.qkv.split(self.qkv(x)))
        q, k = apply_rotary_adjacent(q, cos, sin), apply_rotary_adjacent(k, cos, sin)  # [..., N, H, Dh]
        out = attend(q, k, v, self.scale)  # [..., N, H, Dh]
        return self.proj(out.flatten(-2))  # [..., N, D]


class MLP(nn.Module):
    """fc2(gelu(fc1(x))), exact (erf) GELU."""

    def __init__(self, shape: ViTShape):
        super().__init__()
        self.fc1 = Linear(shape.hidden_size, shape.intermediate_size, bias=True)
        self.fc2 = Linear(shape.intermediate_size, shape.hidden_size, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then h + mlp(norm2(h))."""

    def __init__(self, shape: ViTShape):
        super().__init__()
        self.norm1 = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)
        self.attention = Attention(shape)
        self.norm2 = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        h = x + self.attention(self.norm1(x), cos, sin, attend)  # [..., N, D]
        return h + self.mlp(self.norm2(h))  # [..., N, D]


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Bidirectional attention within each batch row: q, k, v [B, N, H, Dh] -> [B, N, H, Dh]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale)
    return out.transpose(1, 2)  # [B, N, H, Dh]
