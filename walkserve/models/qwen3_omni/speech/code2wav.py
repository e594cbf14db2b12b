"""Code2Wav: 16 code groups per 80 ms frame -> 24 kHz waveform (the ``code2wav.`` prefix).

    codes [B, 16, F] -> code_embedding(code + 2048 g), mean over the 16 groups -> [B, F, D]
      -> pre_transformer: 8 x sliding-window (72) causal attention + SwiGLU, LayerScale; RMSNorm
      -> upsample: 2 x [CausalTransConv(x2), ConvNeXtBlock]                        -> [B, D, 4F]
      -> decoder: CausalConv k7 (D -> 1536), 4 x DecoderBlock(8, 5, 4, 3), SnakeBeta, CausalConv k7 -> 1
      -> clamp to [-1, 1]                                                           -> [B, 1, 1920 F - 555]

Rows of a batch are decoded independently (the attention is block-diagonal
over rows, the convolutions are per row). ``code2wav_geometry.py`` says which
samples of a decode are final and which frames they depend on.
"""

from __future__ import annotations

import torch
from torch import nn

from walkserve.layers.attention import DenseAttention
from walkserve.layers.norm import RMSNorm
from walkserve.layers.rope import RotaryEmbedding
from walkserve.models.qwen3_omni.speech.code2wav_geometry import CONV_KERNEL, Code2WavGeometry
from walkserve.models.qwen3_omni.speech.code2wav_layers import (
    CausalConv,
    CausalTransConv,
    ConvNeXtBlock,
    DecoderBlock,
    PreTransformerLayer,
    SnakeBeta,
)
from walkserve.models.qwen3_omni.speech.config import Code2WavConfig


def sliding_window_mask(rows: int, length: int, window: int, device: torch.device) -> torch.Tensor:
    """bool [R L, R L]: within a row, key j is visible to query i when 0 <= i - j < window."""
    seq = torch.arange(rows * length, device=device) // length  # [R L]
    pos = torch.arange(length, device=device).repeat(rows)  # [R L]
    gap = pos[:, None] - pos[None, :]  # [R L, R L]
    return (seq[:, None] == seq[None, :]) & (gap >= 0) & (gap < window)


class PreTransformer(nn.Module):
    def __init__(self, config: Code2WavConfig):
        super().__init__()
        a = config.attention
        self.window = config.sliding_window
        self.layers = nn.ModuleList(PreTransformerLayer(config, i) for i in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.rotary = RotaryEmbedding(a.head_dim, a.rope, a.max_position_embeddings)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, F, D] -> [B, F, D]; every row's positions start at 0."""
        rows, length, dim = x.shape
        cos, sin = self.rotary.cos_sin(torch.arange(length, device=x.device).repeat(rows))  # [B F, Dh/2]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        attn = DenseAttention(sliding_window_mask(rows, length, self.window, x.device))
        h = x.reshape(rows * length, dim)  # [B F, D]
        for layer in self.layers:
            h = layer(h, cos, sin, attn)
        return self.norm(h).reshape(rows, length, dim)


class Code2Wav(nn.Module):
    """The vocoder. ``forward(codes [B, G, F]) -> wav [B, 1, 1920 F - 555]`` as transformers computes it."""

    def __init__(self, config: Code2WavConfig):
        super().__init__()
        c, hidden = config, config.attention.hidden_size
        self.config = config
        self.geometry = Code2WavGeometry(c.upsampling_ratios, c.upsample_rates, c.sliding_window,
                                         c.attention.num_hidden_layers)
        self.code_embedding = nn.Embedding(c.codebook_size * c.num_quantizers, hidden)  # group g: rows g*2048...
        self.pre_transformer = PreTransformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransConv(hidden, hidden, r, r), ConvNeXtBlock(hidden)]) for r in c.upsampling_ratios
        )
        dims = [c.decoder_dim // 2**i for i in range(len(c.upsample_rates) + 1)]
        self.decoder = nn.ModuleList([
            CausalConv(hidden, c.decoder_dim, CONV_KERNEL),
            *(DecoderBlock(dims[i], s) for i, s in enumerate(c.upsample_rates)),
            SnakeBeta(dims[-1]),
            CausalConv(dims[-1], 1, CONV_KERNEL),
        ])

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"codes must be [B, {self.config.num_quantizers}, F], got {tuple(codes.shape)}")
        offset = torch.arange(codes.shape[1], device=codes.device)[None, :, None] * self.config.codebook_size
        x = self.code_embedding(codes + offset).mean(1)  # [B, G, F, D] -> [B, F, D]
        x = self.pre_transformer(x).transpose(1, 2)  # [B, D, F]
        for stage in self.upsample:
            for module in stage:
                x = module(x)  # [B, D, 4F] after both stages
        for module in self.decoder:
            x = module(x)  # [B, 1, 1920 F - 555] at the end
        return x.clamp(-1.0, 1.0)
