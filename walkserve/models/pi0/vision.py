"""VisionEncoder: the SigLIP So400m/14 tower and PaliGemma's projector (a stateless component).

    pixels [N, 3, R, R] in [-1, 1] -> tower -> [N, (R/14)^2, 1152] -> projector -> [N, 256, D_lm]

The projected features enter the prefix as they are (only language
embeddings are scaled by sqrt(D)).
"""

from __future__ import annotations

import torch
from torch import nn

from walkserve.layers.linear import Linear
from walkserve.models.siglip.config import SiglipVisionConfig
from walkserve.models.siglip.tower import SiglipVisionTower

PIXELS = "pixels"  # input slot: float [n, 3, R, R], one row per camera the request has
IMAGE_EMBEDS = "image_embeds"  # output: [n * tokens_per_image, D_lm], cameras in input order


class VisionEncoder(nn.Module):
    """Parameter names: ``tower.*`` is the checkpoint's ``...paligemma.model.vision_tower.vision_model.*``,
    ``projector.*`` its ``...paligemma.model.multi_modal_projector.linear.*``."""

    def __init__(self, vision: SiglipVisionConfig, width: int):
        super().__init__()
        self.tower = SiglipVisionTower(vision)
        self.projector = Linear(vision.hidden_size, width)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, R, R] -> image tokens [N, P, D_lm]."""
        dtype = self.projector.weight.dtype
        return self.projector(self.tower.forward_images(pixels.to(dtype)))

    def forward_batch(self, inputs: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
        """``{"pixels": [n_i, 3, R, R]}`` per request -> ``{"image_embeds": [n_i * P, D_lm]}``; one tower call."""
        counts = [x[PIXELS].shape[0] for x in inputs]
        features = self.forward(torch.cat([x[PIXELS] for x in inputs]))  # [sum n_i, P, D]
        return [{IMAGE_EMBEDS: f.reshape(-1, f.shape[-1])} for f in features.split(counts)]
