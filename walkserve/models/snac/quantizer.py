"""CodeEmbedding: SNAC codes of every level -> one latent sequence (the decoder side of the quantizer)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from walkserve.models.snac import kernels
from walkserve.models.snac.config import SnacConfig


class Codebook(nn.Module):
    """A ``[codebook_size, codebook_dim]`` table (left uninitialised: it is always loaded)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, dim))


class CodeLevel(nn.Module):
    """One level: codebook lookup, a pointwise projection to the latent width, repeated ``stride`` times in time.

    The projection is linear, so it is applied once to the whole codebook
    (``projected``, cached until a weight changes) and decoding is a table
    lookup: cheaper, and a row's values never depend on the batch around it.
    """

    def __init__(self, codebook_size: int, codebook_dim: int, latent: int, stride: int):
        super().__init__()
        self.stride = stride
        self.codebook = Codebook(codebook_size, codebook_dim)
        self.out_proj = nn.Conv1d(codebook_dim, latent, 1)
        self._projected: tuple[tuple, torch.Tensor] | None = None

    def projected(self) -> torch.Tensor:
        """``out_proj(codebook)``: ``[codebook_size, latent]``."""
        book, w, b = self.codebook.weight, self.out_proj.weight, self.out_proj.bias
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in (book, w, b))
        if self._projected is None or self._projected[0] != key:
            table = kernels.pointwise(book.detach()[None], w.detach(), b.detach())[0]  # [size, latent]
            self._projected = (key, table)
        return self._projected[1]

    def forward(self, codes: torch.Tensor) -> torch.Tensor:  # codes: [B, n]
        z = F.embedding(codes, self.projected())  # z: [B, n, latent]
        return z.repeat_interleave(self.stride, dim=1)  # [B, n * stride, latent]


class CodeEmbedding(nn.Module):
    """Sum of every level's projected codes: ``z = sum_l repeat(out_proj_l(codebook_l[codes_l]), stride_l)``."""

    def __init__(self, cfg: SnacConfig):
        super().__init__()
        self.cfg = cfg
        self.levels = nn.ModuleList(
            CodeLevel(cfg.codebook_size, cfg.codebook_dim, cfg.latent, s) for s in cfg.vq_strides
        )

    def check(self, codes: Sequence[torch.Tensor]) -> None:
        """Raise ValueError naming the level whose codes have the wrong shape, dtype or range."""
        if len(codes) != len(self.levels):
            raise ValueError(
                f"SNAC decode: expected {len(self.levels)} code levels, got {len(codes)}"
            )
        first = codes[0]
        if first.dim() != 2:
            raise ValueError(
                f"SNAC decode: level 0 codes must be [B, n], got shape {list(first.shape)}"
            )
        want = self.cfg.level_lengths(first.shape[1])
        for level, (c, n) in enumerate(zip(codes, want)):
            if c.dtype not in (torch.int64, torch.int32):
                raise ValueError(
                    f"SNAC decode: level {level} codes must be integers, got {c.dtype}"
                )
            if tuple(c.shape) != (first.shape[0], n):
                raise ValueError(
                    f"SNAC decode: level {level} codes must have shape {[first.shape[0], n]}, got {list(c.shape)}"
                )
            if c.numel() and (int(c.min()) < 0 or int(c.max()) >= self.cfg.codebook_size):
                raise ValueError(
                    f"SNAC decode: level {level} has a code outside 0..{self.cfg.codebook_size - 1}"
                )

    def forward(self, codes: Sequence[torch.Tensor]) -> torch.Tensor:
        z = None
        for level, c in zip(self.levels, codes):
            zl = level(c.long())  # zl: [B, n0 * stride_0, latent]
            z = zl if z is None else z + zl
        return z  # z: [B, n0 * stride_0, latent]  (time-major)
