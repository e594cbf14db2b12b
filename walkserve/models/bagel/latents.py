"""BAGEL's latent tokens: packing VAE latents into 64-value tokens, and the embeddings around the LLM.

    VAE latent z [16, 2h, 2w]  --patch 2-->  tokens [h*w, 64]    values in (row, col, channel) order
    LLM input  = vae2llm(x_t) + time_embedder(t) + latent_pos_embed[row * 64 + col]      [N, D]
    velocity   = llm2vae(hidden of the latent rows)                                        [N, 64]

The timestep embedder takes the raw t in [0, 1] (not x1000): a 256-dim
sinusoid ordered [cos | sin] with max period 1e4, then Linear-SiLU-Linear.
Clean conditioning latents (an edited image) use t = 0. The position tables
are fixed 2-D sin-cos tables stored in the checkpoint (``sincos_table``
rebuilds them for tiny checkpoints).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.linear import Linear
from walkserve.models.bagel.config import BagelConfig

TIME_MAX_PERIOD = 10000.0


def latent_tokens(z: torch.Tensor, patch: int) -> torch.Tensor:
    """z [C, H, W] (H, W multiples of ``patch``) -> tokens [h*w, patch*patch*C], raster order."""
    c, height, width = z.shape
    h, w = height // patch, width // patch
    x = z.reshape(c, h, patch, w, patch)  # [C, h, p, w, q]
    return x.permute(1, 3, 2, 4, 0).reshape(h * w, patch * patch * c)  # [h*w, p*q*C]


def latent_image(tokens: torch.Tensor, h: int, w: int, patch: int) -> torch.Tensor:
    """The inverse of ``latent_tokens``: tokens [h*w, p*p*C] -> z [C, h*p, w*p]."""
    c = tokens.shape[1] // (patch * patch)
    x = tokens.reshape(h, w, patch, patch, c)  # [h, w, p, q, C]
    return x.permute(4, 0, 2, 1, 3).reshape(c, h * patch, w * patch)  # [C, H, W]


def grid_ids(h: int, w: int, side: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Table rows [h*w] of an h x w grid in a ``side`` x ``side`` table: row * side + col (no interpolation)."""
    return (torch.arange(h, device=device)[:, None] * side + torch.arange(w, device=device)[None, :]).reshape(-1)


def sincos_table(side: int, dim: int) -> torch.Tensor:
    """The fixed 2-D sin-cos table [side * side, dim] (float32; computed in float64 as the release was).

    Row ``r * side + c`` is [sin(c w) | cos(c w) | sin(r w) | cos(r w)] with
    w_i = 10000^(-i / (dim / 4)), i < dim / 4: the column's half comes first.
    """
    if dim % 4:
        raise ValueError(f"a 2-D sin-cos table needs dim divisible by 4, got {dim}")
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4))  # [dim/4]
    rows, cols = np.meshgrid(np.arange(side, dtype=np.float64), np.arange(side, dtype=np.float64), indexing="ij")

    def one_axis(pos: np.ndarray) -> np.ndarray:
        angles = np.outer(pos.reshape(-1), omega)  # [side², dim/4]
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)  # [side², dim/2]

    return torch.from_numpy(np.concatenate([one_axis(cols), one_axis(rows)], axis=1)).float()  # [side², dim]


def timestep_frequencies(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t [N] -> [N, dim]: [cos(t f) | sin(t f)], f_i = exp(-ln(1e4) i / (dim/2))."""
    half = dim // 2
    freqs = torch.exp(-math.log(TIME_MAX_PERIOD) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]  # [N, dim/2]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # [N, dim]


class TimestepEmbedder(nn.Module):
    """``time_embedder.mlp.{0,2}``: frequencies -> Linear -> SiLU -> Linear."""

    def __init__(self, hidden_size: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(Linear(freq_dim, hidden_size), nn.SiLU(), Linear(hidden_size, hidden_size))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.mlp(timestep_frequencies(t, self.freq_dim).to(self.mlp[0].weight.dtype))  # [N, D]


class PositionTable(nn.Module):
    """A fixed table ``pos_embed`` [side², D] looked up by row index."""

    def __init__(self, side: int, hidden_size: int):
        super().__init__()
        self.side = side
        self.pos_embed = nn.Parameter(torch.zeros(side * side, hidden_size), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.pos_embed)  # [N, D]


class LatentEmbedder(nn.Module):
    """The latent side of the LLM: tokens in (``embed``) and velocities out (``velocity``).

    Parameters are the checkpoint's top-level ``time_embedder``, ``vae2llm``,
    ``llm2vae`` and ``latent_pos_embed``.
    """

    def __init__(self, config: BagelConfig):
        super().__init__()
        d, n = config.hidden_size, config.latent_dim
        self.patch = config.latent_patch_size
        self.time_embedder = TimestepEmbedder(d, config.timestep_freq_dim)
        self.vae2llm = Linear(n, d)
        self.llm2vae = Linear(d, n)
        self.latent_pos_embed = PositionTable(config.max_latent_size, d)

    def position_ids(self, h: int, w: int) -> torch.Tensor:
        """Table rows [h*w] of an h x w token grid."""
        return grid_ids(h, w, self.latent_pos_embed.side, self.vae2llm.weight.device)

    def embed(self, x: torch.Tensor, t: torch.Tensor | float, position_ids: torch.Tensor) -> torch.Tensor:
        """x [N, 64] at time t (a scalar or [N]), position_ids [N] -> LLM inputs [N, D]."""
        t = torch.as_tensor(t, dtype=torch.float32, device=x.device).expand(x.shape[0])  # [N]
        out = self.vae2llm(x.to(self.vae2llm.weight.dtype)) + self.time_embedder(t)  # [N, D]
        return out + self.latent_pos_embed(position_ids)

    def velocity(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, D] of latent rows -> v [N, 64] in float32."""
        return self.llm2vae(hidden).float()

    def forward_items(self, inputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """Stateless use: ``{"latents" [N, 64], "t" [], "grid" [2] (h, w)}`` -> ``{"embeds" [N, D]}``,
        or ``{"hidden" [N, D]}`` -> ``{"velocity" [N, 64]}``."""
        out = []
        for item in inputs:
            if "hidden" in item:
                out.append({"velocity": self.velocity(item["hidden"])})
                continue
            h, w = (int(v) for v in item["grid"])
            out.append({"embeds": self.embed(item["latents"], item["t"], self.position_ids(h, w))})
        return out
