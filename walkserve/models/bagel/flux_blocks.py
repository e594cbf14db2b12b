"""The FLUX.1 autoencoder's building blocks, with ``ae.safetensors``'s parameter names.

GroupNorm(32, eps 1e-6) everywhere; swish (SiLU) activations; the mid
attention is single-head over the h*w positions with 1x1-conv projections.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EPS = 1e-6


def group_norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels, eps=EPS, affine=True)


class ResnetBlock(nn.Module):
    """x + conv2(swish(norm2(conv1(swish(norm1(x)))))), with a 1x1 ``nin_shortcut`` when widths differ."""

    def __init__(self, cin: int, cout: int, groups: int):
        super().__init__()
        self.norm1 = group_norm(cin, groups)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = group_norm(cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))  # [B, Cout, H, W]
        h = self.conv2(F.silu(self.norm2(h)))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class AttnBlock(nn.Module):
    """x + proj_out(softmax(q k^T / sqrt(C)) v), one head over all positions of the feature map."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = group_norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q, k, v = (f(n).reshape(b, 1, c, h * w).transpose(2, 3) for f in (self.q, self.k, self.v))  # [B, 1, HW, C]
        out = F.scaled_dot_product_attention(q, k, v)  # [B, 1, HW, C]
        return x + self.proj_out(out.transpose(2, 3).reshape(b, c, h, w))


class Downsample(nn.Module):
    """Pad right and bottom by one, then a stride-2 3x3 conv with no padding."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))  # [B, C, H/2, W/2]


class Upsample(nn.Module):
    """Nearest x2, then a 3x3 conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))  # [B, C, 2H, 2W]


class MidBlock(nn.Module):
    """``mid.block_1``, ``mid.attn_1``, ``mid.block_2`` at the lowest resolution."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, groups)
        self.attn_1 = AttnBlock(channels, groups)
        self.block_2 = ResnetBlock(channels, channels, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))
