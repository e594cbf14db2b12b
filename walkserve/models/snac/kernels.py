"""The SNAC decoder's operations on time-major activations ``[B, T, C]`` (channels last).

Why channels last: on a CPU every pointwise convolution becomes one GEMM over
``B * T`` rows, the transposed convolution becomes one GEMM plus an
overlap-add, and a depthwise kernel-7 convolution becomes seven fused
multiply-adds over shifted time slices (no im2col, no padded copy). The
oneDNN/"slow" convolution paths these replace cost 2-5x more here and scaled
worse than linearly with the batch.

All functions take plain weights in PyTorch's convolution layouts and never
change them; ``pack_transposed`` is the one re-layout, cached by the caller.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``x + sin(alpha x)^2 / alpha`` per channel; ``alpha`` is ``[1, C, 1]`` (the checkpoint's shape)."""
    a = alpha.reshape(-1)  # a: [C]
    t = x * a  # t: [B, T, C]
    t.sin_()
    t.mul_(t)
    return torch.addcmul(x, t, (a + 1e-9).reciprocal(), out=t)


def _tap_slices(length: int, offset: int) -> tuple[slice, slice] | None:
    """(output slice, input slice) where ``out[t] += in[t + offset]`` stays inside ``[0, length)``."""
    if abs(offset) >= length:
        return None
    if offset >= 0:
        return slice(0, length - offset), slice(offset, length)
    return slice(-offset, length), slice(0, length + offset)


def depthwise_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int
) -> torch.Tensor:
    """A "same"-padded depthwise convolution; ``weight`` is ``[C, 1, K]`` (K odd), zero padding outside."""
    T, C = x.shape[1:]
    K = weight.shape[-1]
    taps = weight.reshape(C, K).t()  # taps: [K, C]
    centre = K // 2
    y = x * taps[centre] if bias is None else torch.addcmul(bias, x, taps[centre])  # y: [B, T, C]
    for k in range(K):
        cut = _tap_slices(T, (k - centre) * dilation)
        if k != centre and cut is not None:
            out, src = cut
            y[:, out].addcmul_(x[:, src], taps[k])
    return y


def dense_conv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int
) -> torch.Tensor:
    """A "same"-padded dense convolution; ``weight`` is ``[C_out, C_in, K]`` (K odd).

    One GEMM gives every tap's contribution at every input step; each tap's
    column is then added at its time shift.
    """
    B, T, _ = x.shape
    c_out, c_in, K = weight.shape
    taps = weight.permute(2, 0, 1).reshape(K * c_out, c_in).contiguous()  # taps: [K * C_out, C_in]
    per_tap = F.linear(x, taps)  # [B, T, K * C_out]
    per_tap = per_tap.view(B, T, K, c_out)
    centre = K // 2
    y = per_tap[:, :, centre].clone()  # y: [B, T, C_out]
    if bias is not None:
        y.add_(bias)
    for k in range(K):
        cut = _tap_slices(T, (k - centre) * dilation)
        if k != centre and cut is not None:
            out, src = cut
            y[:, out].add_(per_tap[:, src, k])
    return y


def pointwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """A kernel-1 convolution; ``weight`` is ``[C_out, C_in, 1]``."""
    return F.linear(x, weight.reshape(weight.shape[0], weight.shape[1]), bias)  # [B, T, C_out]


def pack_transposed(weight: torch.Tensor) -> torch.Tensor:
    """``ConvTranspose1d`` weight ``[C_in, C_out, K]`` -> ``[C_in, K * C_out]`` (tap-major columns)."""
    c_in, c_out, K = weight.shape
    return weight.permute(0, 2, 1).reshape(c_in, K * c_out).contiguous()


def conv_transpose(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    stride: int,
    start: int,
    length: int,
) -> torch.Tensor:
    """``ConvTranspose1d`` with kernel ``2 * stride`` (SNAC's upsampler) as a GEMM and an overlap-add.

    Input step t writes taps ``0..2s-1`` to un-padded output steps
    ``t*s .. t*s+2s-1``: the first s taps land in output block t, the last s in
    block t + 1, so the un-padded result has ``(T + 1) * s`` steps. Returns its
    steps ``[start, start + length)``: ``start = padding`` and ``length =
    (T + 1) * s - 2 * padding + output_padding`` is the layer's usual output.
    """
    B, T, c_in = x.shape
    c_out = packed.shape[1] // (2 * stride)
    taps = (x.reshape(B * T, c_in) @ packed).view(B, T, 2, stride, c_out)  # [B, T, 2, s, C_out]
    full = x.new_empty(B, T + 1, stride, c_out)  # full: [B, T + 1, s, C_out]
    full[:, :T] = taps[:, :, 0]
    full[:, T] = 0
    full[:, 1:].add_(taps[:, :, 1])
    out = full.view(B, (T + 1) * stride, c_out)[:, start : start + length]  # [B, L, C_out]
    return out + bias if bias is not None else out.contiguous()
