"""The V-JEPA 2 video encoder (ViT-L / H / g): a stateless module.

    pixels [B, C, T, H, W] -> Conv3d (tubelet x patch x patch, stride = kernel) -> [B, N, E]
      -> L x Block (3-D RoPE at each token's (t, row, col) on the input's own grid)
      -> layernorm -> features [B, N, E],  N = T/tubelet * H/patch * W/patch (raster order t, row, col)

Checkpoint names are those of the HF ``encoder.`` prefix
(``embeddings.patch_embeddings.proj``, ``layer.N.*``, ``layernorm``).
Positions come from the real input grid, so a non-square or non-crop input
is encoded as the released code does with ``handle_nonsquare_inputs``
(transformers' ``VJEPA2Model`` instead assumes the config's square grid and
is valid only at exactly ``crop_size``).
"""

from __future__ import annotations

import torch
from torch import nn

from walkserve.models.vjepa2.block import Block, full_attention
from walkserve.models.vjepa2.config import EncoderConfig
from walkserve.models.vjepa2.rope3d import Rope3D, grid_positions


class PatchEmbeddings(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        kernel = (config.tubelet_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_chans, config.hidden_size, kernel_size=kernel, stride=kernel)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, C, T, H, W] -> [B, E, T/tubelet, H/patch, W/patch]."""
        return self.proj(pixels.to(self.proj.weight.dtype))


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.patch_embeddings = PatchEmbeddings(config)

    def forward(self, pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """pixels [B, C, T, H, W] -> tokens [B, N, E] and the token grid (t, rows, cols)."""
        x = self.patch_embeddings(pixels)  # [B, E, t, h, w]
        grid = tuple(x.shape[2:])
        return x.flatten(2).transpose(1, 2), grid  # [B, N, E]


class VisionEncoder(nn.Module):
    """Video clips to features. Frames per clip must be a multiple of the tubelet (callers repeat an image)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layer = nn.ModuleList(Block(config.vit) for _ in range(config.vit.num_hidden_layers))
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.vit.layer_norm_eps)
        self.rope = Rope3D(config.vit.head_dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [B, C, T, H, W] (normalised) -> features [B, N, E]."""
        c = self.config
        if pixels.dim() != 5 or pixels.shape[2] % c.tubelet_size or min(pixels.shape[3:]) < c.patch_size:
            raise ValueError(
                f"V-JEPA 2 encoder: pixels must be [B, C, T, H, W] with T a multiple of {c.tubelet_size} and "
                f"H, W >= {c.patch_size}, got {tuple(pixels.shape)}"
            )
        x, grid = self.embeddings(pixels)  # [B, N, E]
        cos, sin = self.rope.cos_sin(grid_positions(*grid, device=x.device))  # [N, Dh]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for block in self.layer:
            x = block(x, cos, sin, full_attention)  # [B, N, E]
        return self.layernorm(x)  # [B, N, E]
