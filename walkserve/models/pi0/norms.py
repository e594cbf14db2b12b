"""The two norms of the pi0 family, both computed in float32 and cast back.

    GemmaRMSNorm   y = RMS(x) * (1 + w)                                  (PaliGemma, pi0's expert)
    AdaRMSNorm     (scale, shift, gate) = dense(cond)                    (pi0.5's expert)
                   y = RMS(x) * (1 + scale) + shift,  the block then adds  gate * f(y)

with RMS(x) = x / sqrt(mean(x^2) + eps). Both return ``(y, gate)``; the plain
norm's gate is None (the residual is ungated).

The condition is per sequence (pi0.5: the flow time's MLP embedding) but the
tokens of a ragged batch come from many sequences, so it travels as a
``Condition``: its distinct rows once, and for each token the row it uses;
``dense`` then runs once per distinct row, not once per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from walkserve.layers.linear import Linear


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, in float32."""
    h = x.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


@dataclass(frozen=True)
class Condition:
    """Token i's condition is ``rows[index[i]]``: rows [U, C], index [T] (long)."""

    rows: torch.Tensor
    index: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.index.shape[0]


class GemmaRMSNorm(nn.Module):
    """Checkpoint name ``weight`` (zero-centred: 0 is the identity scale)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, cond: Condition | None = None) -> tuple[torch.Tensor, None]:
        return (rms(x, self.eps) * (1.0 + self.weight.float())).to(x.dtype), None


class AdaRMSNorm(nn.Module):
    """Checkpoint name ``dense`` (Linear cond_dim -> 3 * dim, with bias); no fixed weight.

    ``cond`` gives each of the T tokens of x [T, D] a condition row of cond_dim.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6):
        super().__init__()
        self.dense = Linear(cond_dim, 3 * dim, bias=True)
        self.eps = eps

    def forward(self, x: torch.Tensor, cond: Condition | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        assert cond is not None and cond.num_tokens == x.shape[0], "adaRMS needs a condition for every token"
        modulation = self.dense(cond.rows)[cond.index]  # [U, 3D] -> [T, 3D]
        scale, shift, gate = modulation.chunk(3, dim=-1)  # [T, D] each
        y = rms(x, self.eps) * (1.0 + scale.float()) + shift.float()  # [T, D]
        return y.to(x.dtype), gate.to(x.dtype)
