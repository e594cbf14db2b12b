"""Code2Wav's building blocks (channel-major activations ``[B, C, T]``; names as in the checkpoint).

CausalConv(k, d):        Conv1d with (k - 1) d zeros on the left: output t reads inputs t - (k-1)d .. t
CausalTransConv(k, s):   ConvTranspose1d(stride s), then k - s samples trimmed on both sides
                         (k = s: exact x s; k = 2s: output m reads inputs m//s and m//s + 1)
ConvNeXtBlock:           x + gamma * pwconv2(gelu(pwconv1(LayerNorm(dwconv_k7(x)))))
SnakeBeta:               x + sin(x e^alpha)^2 / (e^beta + 1e-9)       (per-channel log-parameters)
ResidualUnit(d):         x + conv_k1(snake(conv_k7_d(snake(x))))
DecoderBlock(s):         snake -> CausalTransConv(2s, s) -> ResidualUnit(1) -> (3) -> (9)
PreTransformerLayer:     x + ls_attn * attn(norm(x)); h + ls_mlp * mlp(norm(h))      (LayerScale per channel)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.attention import AttentionContext
from walkserve.layers.mlp import SwiGLU
from walkserve.layers.norm import RMSNorm
from walkserve.models.common.decoder import Attention
from walkserve.models.qwen3_omni.speech.code2wav_geometry import CONV_KERNEL, RESIDUAL_DILATIONS
from walkserve.models.qwen3_omni.speech.config import Code2WavConfig

SNAKE_EPS = 1e-9


class CausalConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.pad = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (self.pad, 0)))  # [B, C_out, T]


class CausalTransConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)  # [B, C_out, (T - 1) s + k]
        return y[..., self.trim : y.shape[-1] - self.trim] if self.trim else y  # [B, C_out, (T + 1) s - k]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, CONV_KERNEL, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.dwconv(x).transpose(1, 2))  # [B, T, C]
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))  # [B, T, C]
        return x + h.transpose(1, 2)  # [B, C, T]


class SnakeBeta(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]  # [1, C, 1]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + SNAKE_EPS)) * torch.sin(x * alpha).pow(2)  # [B, C, T]


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, CONV_KERNEL, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))  # [B, C, T]


class DecoderBlock(nn.Module):
    """One x``stride`` stage of the decoder; the channels halve."""

    def __init__(self, c_in: int, stride: int):
        super().__init__()
        c_out = c_in // 2
        units = [ResidualUnit(c_out, d) for d in RESIDUAL_DILATIONS]
        self.block = nn.ModuleList([SnakeBeta(c_in), CausalTransConv(c_in, c_out, 2 * stride, stride), *units])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.block:
            x = module(x)
        return x  # [B, C_in / 2, (T - 1) s]


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class PreTransformerLayer(nn.Module):
    """Pre-norm attention + SwiGLU block with LayerScale on both residual branches; no q/k norm."""

    def __init__(self, config: Code2WavConfig, layer_idx: int):
        super().__init__()
        a = config.attention
        self.self_attn = Attention(a.as_lm_config(config.codebook_size, config.intermediate_size, qk_norm=False),
                                   layer_idx)
        self.mlp = SwiGLU(a.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(a.hidden_size)
        self.mlp_layer_scale = LayerScale(a.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionContext) -> torch.Tensor:
        h = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin, attn))  # [T, D]
        return h + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(h)))  # [T, D]
