"""The model -> attention boundary.

Model code computes q, k, v (after rotary embedding and any q/k norm) and
hands them to an AttentionContext, which owns where keys and values live
(a paged KV pool, a dense cache, nothing) and how attention is computed.

    q: [T, Hq, Dh]   k, v: [T, Hkv, Dh]   ->   out: [T, Hq, Dh]

T is the number of tokens of the whole batch (ragged, no padding); the
context knows which tokens belong to which sequence and at which positions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F


class AttentionContext(ABC):
    """Per-forward attention state shared by every layer of one model call."""

    @abstractmethod
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Store this layer's k/v for the batch's tokens, attend, return [T, Hq, Dh]."""


class DenseCausalAttention(AttentionContext):
    """One sequence, no cache: plain causal attention over the tokens given. For tests and references."""

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        hq, hkv = q.shape[1], k.shape[1]
        if hq != hkv:
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
        # [H, T, D]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=scale
        )
        return out.transpose(0, 1)
