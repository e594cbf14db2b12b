"""SnacDecoder: SNAC codes -> waveform (the decoder half of the codec, our own implementation).

    codes (3 levels) -> CodeEmbedding -> z: [B, latent, 4 n0]
      -> stem (depthwise k7 + pointwise, or one k7 conv) -> [LocalAttention]
      -> UpsampleBlock x len(decoder_rates)   (channels halve, time x rate)
      -> Snake -> Conv k7 -> 1 channel -> tanh  ->  audio: [B, 1, n0 * frame_samples]

All convolutions are plain: the checkpoint's weight normalisation is folded
into them once at load time (see ``weights.py``).

Noise and reproducibility: with ``noise`` on, every UpsampleBlock draws
Gaussian noise. ``decode`` takes one ``torch.Generator`` per batch row (distinct
objects), and each row's generator is called once per upsampling block, in
block order (0, 1, 2, ...): ``torch.randn((1, 1, T_block), generator=gens[b])``
in float32, where ``T_block`` is that block's output length. Hence a row's
noise depends only on its own generator and length, never on its batch
neighbours, and it equals the ``snac`` package's noise for that row decoded
alone (batch 1) after ``torch.manual_seed(seed)`` when ``gens[b]`` is a CPU
generator seeded with the same ``seed``.

Layout and batching: the upsampling blocks work time-major, ``[B, T, C]``
(``kernels.py``). Large batches are decoded in row pieces from the first
block whose activations would outgrow a core's cache (``_tail_plan``): rows
are independent, so this changes no value and keeps the cost per row flat
as the batch grows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from walkserve.models.snac.attention import LocalAttention
from walkserve.models.snac.config import SnacConfig
from walkserve.models.snac.layers import Snake, UpsampleBlock, same_conv
from walkserve.models.snac.quantizer import CodeEmbedding

# Activations up to this many elements per piece stay in a core's cache; bigger batches are decoded
# in row pieces from the first block that would overflow it (rows are independent).
CACHE_ELEMENTS = 1 << 19


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
        x = x.transpose(1, 2).contiguous()  # x: [B, T, decoder_dim]
        first, rows = self._tail_plan(x.shape[0], x.shape[1])
        for block in self.blocks[:first]:
            x = block(x, generators)  # x: [B, T * rate, C / 2]
        pieces = [
            self._tail(x[r : r + rows], generators[r : r + rows], first)
            for r in range(0, x.shape[0], rows)
        ]
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # [B, 1, T * upsample]

    def _tail(
        self, x: torch.Tensor, generators: Sequence[torch.Generator], first: int
    ) -> torch.Tensor:
        """Blocks ``first..`` and the output head on some rows: ``[b, T, C]`` -> ``[b, 1, T * rates]``."""
        for block in self.blocks[first:]:
            x = block(x, generators)
        x = same_conv(self.out_conv, self.out_snake(x))  # x: [b, T_out, 1]
        return torch.tanh_(x).transpose(1, 2)  # [b, 1, T_out]

    def _tail_plan(self, batch: int, steps: int) -> tuple[int, int]:
        """(first block decoded in row pieces, rows per piece) so a piece's activations stay cache-sized.

        Blocks before the first one whose whole-batch output exceeds
        ``CACHE_ELEMENTS`` run on the whole batch (their weights are the big
        part, read once); from there on, rows go in pieces.
        """
        sizes, width = [], self.cfg.decoder_dim  # sizes: elements per row of each block's output
        for rate in self.cfg.decoder_rates:
            steps, width = steps * rate, width // 2
            sizes.append(steps * width)
        first = next((i for i, n in enumerate(sizes) if batch * n > CACHE_ELEMENTS), len(sizes))
        if first == len(sizes):
            return first, batch
        return first, max(1, CACHE_ELEMENTS // max(sizes[first:]))

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
