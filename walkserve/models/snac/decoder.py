"""SnacDecoder: SNAC codes -> waveform (the decoder half of the codec, our own implementation).

    codes (3 levels) -> CodeEmbedding -> z: [B, 4 n0, latent]   (time-major from here on)
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

import math
from collections.abc import Sequence

import torch
from torch import nn

from walkserve.models.snac.attention import LocalAttention
from walkserve.models.snac.config import SnacConfig
from walkserve.models.snac.layers import Snake, UpsampleBlock, same_conv
from walkserve.models.snac.quantizer import CodeEmbedding
from walkserve.models.snac.spans import BlockSpan, plan_spans

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

    def forward(
        self,
        z: torch.Tensor,
        generators: Sequence[torch.Generator],
        keep: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Latents ``[B, T, latent]`` -> audio ``[B, 1, samples]``: all of it, or the samples ``keep``."""
        x = z  # x: [B, T, latent]
        for conv in self.stem:
            x = same_conv(conv, x)  # x: [B, T, decoder_dim]
        if self.attn is not None:
            x = self.attn(x)
        total = x.shape[1] * math.prod(self.cfg.decoder_rates)
        keep = keep or (0, total)
        spans = plan_spans(self.cfg.decoder_rates, x.shape[1], keep)
        x = x[:, spans[0].inputs[0] : spans[0].inputs[1]]
        first, rows = self._tail_plan(x.shape[0], spans)
        for block, span in zip(self.blocks[:first], spans[:first]):
            x = block(x, generators, span)  # x: [B, T_kept, C / 2]
        pieces = [
            self._tail(x[r : r + rows], generators[r : r + rows], spans, first, keep)
            for r in range(0, x.shape[0], rows)
        ]
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # [B, 1, keep[1] - keep[0]]

    def _tail(
        self,
        x: torch.Tensor,
        generators: Sequence[torch.Generator],
        spans: list[BlockSpan],
        first: int,
        keep: tuple[int, int],
    ) -> torch.Tensor:
        """Blocks ``first..`` and the output head on some rows: ``[b, T, C]`` -> ``[b, 1, kept samples]``."""
        for block, span in zip(self.blocks[first:], spans[first:]):
            x = block(x, generators, span)
        x = same_conv(self.out_conv, self.out_snake(x))  # x: [b, T_kept, 1]
        start = keep[0] - spans[-1].kept[0]
        return torch.tanh_(x[:, start : start + keep[1] - keep[0]]).transpose(1, 2)  # [b, 1, kept]

    def _tail_plan(self, batch: int, spans: list[BlockSpan]) -> tuple[int, int]:
        """(first block decoded in row pieces, rows per piece) so a piece's activations stay cache-sized.

        A block runs on the whole batch while its weights outweigh its
        activations or those fit ``CACHE_ELEMENTS`` (weights are then read
        once for every row); from the first block where neither holds, rows
        go in pieces small enough to stay in cache.
        """
        widths = [self.cfg.decoder_dim // 2 ** (k + 1) for k in range(len(spans))]
        sizes = [(s.upsampled[1] - s.upsampled[0]) * w for s, w in zip(spans, widths)]  # per row
        weights = [sum(p.numel() for p in block.parameters()) for block in self.blocks]
        first = next(
            (i for i, n in enumerate(sizes) if batch * n > max(CACHE_ELEMENTS, weights[i])), len(sizes)
        )
        if first == len(sizes):
            return first, batch
        return first, max(1, CACHE_ELEMENTS // max(sizes[first:]))

    @torch.inference_mode()
    def decode(
        self,
        codes: Sequence[torch.Tensor],
        generators: Sequence[torch.Generator] | None = None,
        keep: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """Codes ``[B, n0], [B, 2 n0], [B, 4 n0]`` (for strides 4/2/1) -> audio ``[B, 1, n0 * frame_samples]``.

        ``generators`` holds one generator per row (required when the config
        has ``noise``; see the module docstring for the draw order). ``keep``
        = ``(lo, hi)`` returns only samples ``[lo, hi)``, computing only what
        they depend on (``spans.py``): the same values as slicing the whole
        decode, for a fraction of the work when a streaming client keeps one
        frame of a window.
        """
        self.quantizer.check(codes)
        batch = codes[0].shape[0]
        gens = list(generators or [])
        if self.cfg.noise and len(gens) != batch:
            raise ValueError(f"SNAC decode: {batch} rows need {batch} generators, got {len(gens)}")
        device = self.out_conv.weight.device
        total = codes[0].shape[1] * self.cfg.frame_samples
        if keep is not None and not 0 <= keep[0] < keep[1] <= total:
            raise ValueError(f"SNAC decode: keep {list(keep)} is not a non-empty part of [0, {total})")
        if codes[0].shape[1] == 0:
            return torch.zeros(batch, 1, 0, device=device, dtype=self.out_conv.weight.dtype)
        z = self.quantizer([c.to(device) for c in codes])  # z: [B, n0 * stride_0, latent]
        return self.forward(z.to(self.out_conv.weight.dtype), gens, keep)
