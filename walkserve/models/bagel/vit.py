"""BAGEL's NaViT image encoder: the shared SigLIP tower at native aspect ratio, then the connector.

    pixels [3, H, W] in [-1, 1] (H, W multiples of 14, at most 70 patches a side)
      -> patches [h*w, 3*14*14] (channel, row, col) with position ids row * 70 + col  (no interpolation)
      -> SigLIP tower, 26 layers (vit_config's 27 minus the last), attention within each image
      -> connector: fc1 -> tanh-GELU -> fc2 (1152 -> 3584 -> 3584)  + vit_pos_embed[row * 70 + col]
      -> LLM rows [h*w, D]

Parameters: ``vit_model.vision_model.*`` (the tower), ``connector.fc{1,2}``
and ``vit_pos_embed.pos_embed`` of ``ema.safetensors``. The release stores
the patch embedding already as a Linear [1152, 588] over (row, col,
channel); the loader reorders it into the tower's [1152, 3, 14, 14].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from walkserve.layers.linear import Linear
from walkserve.models.bagel.config import BagelConfig
from walkserve.models.bagel.latents import PositionTable, grid_ids
from walkserve.models.siglip.tower import SiglipVisionTower, patchify


def linear_to_conv_patch_weight(weight: torch.Tensor, channels: int, patch: int) -> torch.Tensor:
    """The release's Linear [D, P*P*C] over (row, col, channel) -> the Conv2d layout [D, C, P, P]."""
    d = weight.shape[0]
    return weight.reshape(d, patch, patch, channels).permute(0, 3, 1, 2).contiguous()


def conv_to_linear_patch_weight(weight: torch.Tensor) -> torch.Tensor:
    """[D, C, P, P] -> the release's Linear layout [D, P*P*C] (what tiny checkpoints write)."""
    return weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1).contiguous()


class Connector(nn.Module):
    """``connector.fc1`` -> tanh-GELU -> ``connector.fc2``."""

    def __init__(self, vit_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = Linear(vit_dim, llm_dim)
        self.fc2 = Linear(llm_dim, llm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class BagelViT(nn.Module):
    """A stateless component: images in, LLM rows out (``forward_items``), or packed patches (``forward``)."""

    def __init__(self, config: BagelConfig):
        super().__init__()
        self.vit_model = SiglipVisionTower(config.vit)
        self.connector = Connector(config.vit.hidden_size, config.hidden_size)
        self.vit_pos_embed = PositionTable(config.vit_max_num_patch_per_side, config.hidden_size)
        self.patch = config.vit.patch_size

    def patches(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pixels [3, H, W] -> (patches [h*w, 3*P*P], position ids [h*w])."""
        h, w = pixels.shape[1] // self.patch, pixels.shape[2] // self.patch
        if h > self.vit_pos_embed.side or w > self.vit_pos_embed.side:
            raise ValueError(f"a {pixels.shape[2]}x{pixels.shape[1]} image has more than "
                             f"{self.vit_pos_embed.side} patches a side")
        return patchify(pixels, self.patch), grid_ids(h, w, self.vit_pos_embed.side, pixels.device)

    def forward(self, patches: torch.Tensor, position_ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """patches [N, 3*P*P] of len(lengths) images, position_ids [N] -> LLM rows [N, D]."""
        x = self.vit_model(patches, position_ids, lengths)  # [N, D_vit]
        return self.connector(x) + self.vit_pos_embed(position_ids)  # [N, D]

    @torch.no_grad()
    def forward_items(self, inputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """``{"pixels": [3, H, W]}`` per image -> ``{"embeds": [h*w, D]}``, all images packed in one call."""
        device = self.connector.fc1.weight.device
        parts = [self.patches(item["pixels"].to(device, self.connector.fc1.weight.dtype)) for item in inputs]
        lengths = [p.shape[0] for p, _ in parts]
        out = self.forward(torch.cat([p for p, _ in parts]), torch.cat([i for _, i in parts]), lengths)
        return [{"embeds": rows} for rows in out.split(lengths)]
