"""The SNAC decoder's building blocks, on plain (weight-norm folded) convolutions.

UpsampleBlock(stride s):  Snake -> ConvTranspose1d(x s) -> [NoiseInjection] -> 3 x ResidualUnit
ResidualUnit(dilation d): x + Conv1x1(Snake(Conv7_d(Snake(x))))
Snake:                    x + sin(alpha * x)^2 / alpha        (per-channel alpha)
NoiseInjection:           x + noise * Conv1x1(x),  noise: [B, 1, T] ~ N(0, 1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

RESIDUAL_DILATIONS = (1, 3, 9)


class Snake(nn.Module):
    """The periodic activation ``x + sin(alpha x)^2 / alpha`` with a learned alpha per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        alpha = self.alpha  # alpha: [1, C, 1]
        return x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


class ResidualUnit(nn.Module):
    """A dilated kernel-7 convolution (grouped when depthwise) and a pointwise one, with Snakes, plus the input."""

    def __init__(self, dim: int, dilation: int, groups: int):
        super().__init__()
        self.snake1 = Snake(dim)
        self.conv1 = nn.Conv1d(dim, dim, 7, dilation=dilation, padding=3 * dilation, groups=groups)
        self.snake2 = Snake(dim)
        self.conv2 = nn.Conv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        y = self.conv2(self.snake2(self.conv1(self.snake1(x))))  # y: [B, C, T]
        return x + y


def draw_noise(
    generators: Sequence[torch.Generator], length: int, like: torch.Tensor
) -> torch.Tensor:
    """One ``randn((1, 1, length))`` per row from that row's generator, in row order -> ``[B, 1, length]``.

    Drawn in float32 on each generator's device, then moved to ``like``'s device and dtype.
    """
    rows = [
        torch.randn((1, 1, length), generator=g, device=g.device, dtype=torch.float32)
        for g in generators
    ]
    return torch.cat(rows).to(device=like.device, dtype=like.dtype)  # [B, 1, length]


class NoiseInjection(nn.Module):
    """Adds ``noise * W x`` where the noise is one Gaussian value per (row, time step), shared by channels."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Conv1d(dim, dim, 1, bias=False)

    def forward(
        self, x: torch.Tensor, generators: Sequence[torch.Generator]
    ) -> torch.Tensor:  # x: [B, C, T]
        noise = draw_noise(generators, x.shape[-1], x)  # noise: [B, 1, T]
        return x + noise * self.linear(x)


class UpsampleBlock(nn.Module):
    """Upsample the time axis by ``stride`` while halving channels, then refine with three residual units."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, noise: bool, groups: int):
        super().__init__()
        self.snake = Snake(in_dim)
        self.up = nn.ConvTranspose1d(
            in_dim,
            out_dim,
            kernel_size=2 * stride,
            stride=stride,
            padding=math.ceil(stride / 2),
            output_padding=stride % 2,
        )
        self.noise = NoiseInjection(out_dim) if noise else None
        self.res = nn.ModuleList(ResidualUnit(out_dim, d, groups) for d in RESIDUAL_DILATIONS)

    def forward(self, x: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
        x = self.up(self.snake(x))  # x: [B, C_in, T] -> [B, C_out, T * stride]
        if self.noise is not None:
            x = self.noise(x, generators)
        for unit in self.res:
            x = unit(x)
        return x
