"""The FLUX.1 autoencoder's encoder and decoder (``ae.safetensors``: ``encoder.*`` and ``decoder.*``).

    encoder: image [B, 3, H, W] in [-1, 1] -> conv_in -> levels i = 0..L-1 (num_res_blocks ResnetBlocks at
             ch*mult[i], then a stride-2 downsample except the last) -> mid -> norm, swish, conv_out
             -> moments [B, 2z, H/8, W/8] = (mean | logvar)
    decoder: z [B, z, H/8, W/8] -> conv_in -> mid -> levels i = L-1..0 (num_res_blocks + 1 blocks, then
             nearest x2 upsample except level 0) -> norm, swish, conv_out -> image [B, 3, H, W]

The decoder's ``up`` list is indexed by level (``up.0`` is the last to run, at full resolution).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.models.bagel.config import FluxAEConfig
from walkserve.models.bagel.flux_blocks import (
    Downsample,
    MidBlock,
    ResnetBlock,
    Upsample,
    group_norm,
)


class _Level(nn.Module):
    """One resolution: ``block.j`` ResnetBlocks and an optional resampler (``downsample`` / ``upsample``)."""

    def __init__(self, blocks: list[ResnetBlock]):
        super().__init__()
        self.block = nn.ModuleList(blocks)


class FluxEncoder(nn.Module):
    def __init__(self, config: FluxAEConfig):
        super().__init__()
        c, g = config, config.num_groups
        self.conv_in = nn.Conv2d(c.in_channels, c.ch, 3, padding=1)
        self.down = nn.ModuleList()
        width = c.ch
        for i, mult in enumerate(c.ch_mult):
            blocks = []
            for _ in range(c.num_res_blocks):
                blocks.append(ResnetBlock(width, c.ch * mult, g))
                width = c.ch * mult
            level = _Level(blocks)
            if i != len(c.ch_mult) - 1:
                level.downsample = Downsample(width)
            self.down.append(level)
        self.mid = MidBlock(width, g)
        self.norm_out = group_norm(width, g)
        self.conv_out = nn.Conv2d(width, 2 * c.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """image [B, 3, H, W] -> moments [B, 2z, H/8, W/8] (mean, then logvar, along channels)."""
        h = self.conv_in(x)
        for level in self.down:
            for block in level.block:
                h = block(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        h = self.mid(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class FluxDecoder(nn.Module):
    def __init__(self, config: FluxAEConfig):
        super().__init__()
        c, g = config, config.num_groups
        width = c.ch * c.ch_mult[-1]
        self.conv_in = nn.Conv2d(c.z_channels, width, 3, padding=1)
        self.mid = MidBlock(width, g)
        levels: list[_Level] = []
        for i in reversed(range(len(c.ch_mult))):
            blocks = []
            for _ in range(c.num_res_blocks + 1):
                blocks.append(ResnetBlock(width, c.ch * c.ch_mult[i], g))
                width = c.ch * c.ch_mult[i]
            level = _Level(blocks)
            if i != 0:
                level.upsample = Upsample(width)
            levels.insert(0, level)
        self.up = nn.ModuleList(levels)
        self.norm_out = group_norm(width, g)
        self.conv_out = nn.Conv2d(width, c.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z [B, z, h, w] (unscaled) -> image [B, 3, 8h, 8w], nominally in [-1, 1]."""
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            for block in level.block:
                h = block(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))
