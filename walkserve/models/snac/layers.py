"""The SNAC decoder's building blocks, on plain (weight-norm folded) convolutions.

Activations are time-major, ``[B, T, C]`` (see ``kernels.py`` for why); the
modules only hold the checkpoint's parameters in PyTorch's convolution layouts.

UpsampleBlock(stride s):  Snake -> ConvTranspose1d(x s) -> [NoiseInjection] -> 3 x ResidualUnit
ResidualUnit(dilation d): x + Conv1x1(Snake(Conv7_d(Snake(x))))
Snake:                    x + sin(alpha * x)^2 / alpha        (per-channel alpha)
NoiseInjection:           x + noise * Conv1x1(x),  noise: [B, T, 1] ~ N(0, 1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from walkserve.models.snac import kernels
from walkserve.models.snac.spans import RESIDUAL_DILATIONS, BlockSpan


class Snake(nn.Module):
    """The periodic activation ``x + sin(alpha x)^2 / alpha`` with a learned alpha per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, C]
        return kernels.snake(x, self.alpha)


def same_conv(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """``conv`` (odd kernel, "same" padding, groups 1 or depthwise) on time-major ``x``: [B, T, C]."""
    if conv.kernel_size[0] == 1 and conv.groups == 1:
        return kernels.pointwise(x, conv.weight, conv.bias)
    if conv.groups == 1:
        return kernels.dense_conv(x, conv.weight, conv.bias, conv.dilation[0])
    if conv.groups == conv.in_channels == conv.out_channels:
        return kernels.depthwise_conv(x, conv.weight, conv.bias, conv.dilation[0])
    raise ValueError(f"SNAC: convolution with {conv.groups} groups over {conv.in_channels} channels")


class ResidualUnit(nn.Module):
    """A dilated kernel-7 convolution (grouped when depthwise) and a pointwise one, with Snakes, plus the input."""

    def __init__(self, dim: int, dilation: int, groups: int):
        super().__init__()
        self.snake1 = Snake(dim)
        self.conv1 = nn.Conv1d(dim, dim, 7, dilation=dilation, padding=3 * dilation, groups=groups)
        self.snake2 = Snake(dim)
        self.conv2 = nn.Conv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, C]
        h = self.snake2(same_conv(self.conv1, self.snake1(x)))  # h: [B, T, C]
        return kernels.pointwise(h, self.conv2.weight, self.conv2.bias).add_(x)


def draw_noise(
    generators: Sequence[torch.Generator], length: int, like: torch.Tensor
) -> torch.Tensor:
    """One ``randn((1, 1, length))`` per row from that row's generator, in row order -> ``[B, length, 1]``.

    Drawn in float32 on each generator's device, then moved to ``like``'s device and dtype.
    """
    rows = [
        torch.randn((1, 1, length), generator=g, device=g.device, dtype=torch.float32)
        for g in generators
    ]
    return torch.cat(rows).view(len(rows), length, 1).to(device=like.device, dtype=like.dtype)


class NoiseInjection(nn.Module):
    """Adds ``noise * W x`` where the noise is one Gaussian value per (row, time step), shared by channels."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Conv1d(dim, dim, 1, bias=False)

    def forward(
        self, x: torch.Tensor, generators: Sequence[torch.Generator], length: int, first: int = 0
    ) -> torch.Tensor:  # x: [B, T, C]: steps first .. first + T of a sequence of ``length`` steps
        noise = draw_noise(generators, length, x)[:, first : first + x.shape[1]]  # noise: [B, T, 1]
        h = kernels.pointwise(x, self.linear.weight, None)  # h: [B, T, C]
        return torch.addcmul(x, h, noise, out=h)


class UpsampleBlock(nn.Module):
    """Upsample the time axis by ``stride`` while halving channels, then refine with three residual units."""

    def __init__(self, in_dim: int, out_dim: int, stride: int, noise: bool, groups: int):
        super().__init__()
        self.stride = stride
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
        self._packed: tuple[tuple, torch.Tensor] | None = None

    def packed_up(self) -> torch.Tensor:
        """The upsampler's weight re-laid for ``kernels.conv_transpose``; re-packed only when the weight changes."""
        w = self.up.weight
        key = (w.data_ptr(), w._version, w.dtype, w.device)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, kernels.pack_transposed(w.detach()))
        return self._packed[1]

    def forward(
        self, x: torch.Tensor, generators: Sequence[torch.Generator], span: BlockSpan | None = None
    ) -> torch.Tensor:
        """``x``: [B, T, C_in] -> [B, T * stride, C_out]; with ``span``, ``x`` holds the steps
        ``span.inputs`` and the result the steps ``span.kept`` (see ``spans.py``)."""
        up = self.up
        if span is None:
            length = x.shape[1] * self.stride
            span = BlockSpan((0, x.shape[1]), (0, length), (0, length), length)
        first, last = span.upsampled
        origin = span.inputs[0] * self.stride - up.padding[0]  # output step of the slice's first un-padded step
        x = kernels.conv_transpose(
            self.snake(x), self.packed_up(), up.bias, self.stride, first - origin, last - first
        )  # x: [B, T_in, C_in] -> [B, T_up, C_out]
        if self.noise is not None:
            x = self.noise(x, generators, span.length, first)
        for unit in self.res:
            x = unit(x)
        keep = span.kept[0] - first
        return x[:, keep : keep + span.kept[1] - span.kept[0]]
