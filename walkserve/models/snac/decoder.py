"""SnacDecoder: SNAC codes -> waveform (the decoder half of the codec, our own implementation).

    codes (3 levels) -> CodeEmbedding -> z: [B, latent, 4 n0]
      -> stem (depthwise k7 + pointwise, or one k7 conv) -> [LocalAttention]
      -> UpsampleBlock x len(decoder_rates)   (channels halve, time x rate)
      -> Snake -> Conv k7 -> 1 channel -> tanh  ->  audio: [B, 1, n0 * frame_samples]

All convolutions are plain: the checkpoint's weight normalisation is folded
into them once at load time (see ``weights.py``).

Noise and reproducibility: with ``noise`` on, every UpsampleBlock draws
Gaussian noise. ``decode`` takes one ``torch.Generator`` per batch row, and
the exact call order is: for each upsampling block in order (0, 1, 2, ...),
for each row ``b`` in order, ``torch.randn((1, 1, T_block), generator=gens[b])``
in float32, where ``T_block`` is that block's output length. Hence a row's
noise depends only on its own generator and length, never on its batch
neighbours, and it equals the ``snac`` package's noise for that row decoded
alone (batch 1) after ``torch.manual_seed(seed)`` when ``gens[b]`` is a CPU
generator seeded with the same ``seed``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from walkserve.models.snac.attention import LocalAttention
from walkserve.models.snac.config import SnacConfig
from walkserve.models.snac.layers import Snake, UpsampleBlock
from walkserve.models.snac.quantizer import CodeEmbedding


def _stem(cfg: SnacConfig) -> nn.ModuleList:
    latent, dim = cfg.latent, cfg.decoder_dim
    if cfg.depthwise:
        return nn.ModuleList(
            [nn.Conv1d(latent, latent, 7, padding=3, groups=latent), nn.Conv1d(latent, dim, 1)]
        )
    return nn.ModuleList([nn.Conv1d(latent, dim, 7, padding=3)])


class SnacDecoder(nn.Module):
    """Codes to audio. Build on any device, then load weights with ``walkserve.models.snac.weights.load_snac``."""

    def __init__(self, cfg: SnacConfig):
        super().__init__()
        self.cfg = cfg
        self.quantizer = CodeEmbedding(cfg)
        self.stem = _stem(cfg)
        window = cfg.attn_window_size
        self.attn = LocalAttention(cfg.decoder_dim, window) if window is not None else None
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.decoder_rates) + 1)]
        self.blocks = nn.ModuleList(
            UpsampleBlock(
                dims[i], dims[i + 1], rate, cfg.noise, groups=dims[i + 1] if cfg.depthwise else 1
            )
            for i, rate in enumerate(cfg.decoder_rates)
        )
        self.out_snake = Snake(dims[-1])
        self.out_conv = nn.Conv1d(dims[-1], 1, 7, padding=3)

    def forward(self, z: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
        x = z  # x: [B, latent, T]
        for conv in self.stem:
            x = conv(x)  # x: [B, decoder_dim, T]
        if self.attn is not None:
            x = self.attn(x)
        for block in self.blocks:
            x = block(x, generators)  # x: [B, C / 2, T * rate]
        return torch.tanh(self.out_conv(self.out_snake(x)))  # [B, 1, T * upsample]

    @torch.inference_mode()
    def decode(
        self, codes: Sequence[torch.Tensor], generators: Sequence[torch.Generator] | None = None
    ) -> torch.Tensor:
        """Codes ``[B, n0], [B, 2 n0], [B, 4 n0]`` (for strides 4/2/1) -> audio ``[B, 1, n0 * frame_samples]``.

        ``generators`` holds one generator per row (required when the config
        has ``noise``; see the module docstring for the draw order).
        """
        self.quantizer.check(codes)
        batch = codes[0].shape[0]
        gens = list(generators or [])
        if self.cfg.noise and len(gens) != batch:
            raise ValueError(f"SNAC decode: {batch} rows need {batch} generators, got {len(gens)}")
        device = self.out_conv.weight.device
        if codes[0].shape[1] == 0:
            return torch.zeros(batch, 1, 0, device=device, dtype=self.out_conv.weight.dtype)
        z = self.quantizer([c.to(device) for c in codes])  # z: [B, latent, n0 * stride_0]
        return self.forward(z.to(self.out_conv.weight.dtype), gens)
