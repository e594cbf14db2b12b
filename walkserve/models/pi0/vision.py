"""VisionEncoder: the SigLIP So400m/14 tower and PaliGemma's projector (a stateless component).

    pixels [N, 3, R, R] in [-1, 1] -> tower -> [N, (R/14)^2, 1152] -> projector -> [N, 256, D_lm]

The projected features enter the prefix as they are (only language
embeddings are scaled by sqrt(D)). Served, a request's cameras arrive as
they were sent (``request.pack_images``: one flat array and their [H, W]),
and are resized with padding here, on the rank's device. The features of
recent images are kept (``image_cache.py``): an image seen before, byte for
byte, is not encoded again.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from walkserve.engines.spec import Batch
from walkserve.layers.linear import Linear
from walkserve.models.pi0.image_cache import ImageFeatureCache
from walkserve.models.pi0.images import camera_pixels
from walkserve.models.pi0.request import IMAGE_SHAPES, IMAGES
from walkserve.models.siglip.config import SiglipVisionConfig
from walkserve.models.siglip.tower import SiglipVisionTower

IMAGE_EMBEDS = "image_embeds"  # output: [n * tokens_per_image, D_lm], cameras in input order


class VisionEncoder(nn.Module):
    """Parameter names: ``tower.*`` is the checkpoint's ``...paligemma.model.vision_tower.vision_model.*``,
    ``projector.*`` its ``...paligemma.model.multi_modal_projector.linear.*``."""

    def __init__(self, vision: SiglipVisionConfig, width: int, image_cache: int = 0):
        super().__init__()
        self.tower = SiglipVisionTower(vision)
        self.projector = Linear(vision.hidden_size, width)
        self.cache = ImageFeatureCache(image_cache)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, R, R] -> image tokens [N, P, D_lm]."""
        dtype = self.projector.weight.dtype
        return self.projector(self.tower.forward_images(pixels.to(dtype)))

    @torch.inference_mode()
    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """Per item ``images`` + ``image_shapes`` -> ``{"image_embeds": [n_i * P, D_lm]}``;
        one tower call for every camera of the batch that is not in the cache."""
        cameras = [unpack_images(f.inputs) for f in batch]
        features = self.encode([image for images in cameras for image in images])  # [sum n_i, P, D]
        return [{IMAGE_EMBEDS: f.reshape(-1, f.shape[-1])} for f in features.split([len(c) for c in cameras])]

    def encode(self, images: list[torch.Tensor]) -> torch.Tensor:
        """Camera images [H, W, 3] -> their features [N, P, D_lm]: cached ones looked up, the others in one call."""
        keys = [self.cache.key(image) for image in images] if self.cache.capacity else [None] * len(images)
        found = {k: f for k in set(keys) if k is not None and (f := self.cache.get(k)) is not None}
        missing = [i for i, k in enumerate(keys) if k not in found]
        if missing:
            device, resolution = self.projector.weight.device, self.tower.config.image_size
            computed = self.forward(torch.stack([camera_pixels(images[i].to(device), resolution) for i in missing]))
            for i, f in zip(missing, computed):
                if keys[i] is not None:
                    self.cache.put(keys[i], f)
                    found[keys[i]] = f
        if len(missing) == len(images):
            return computed
        rows = dict(zip(missing, computed)) if missing else {}
        return torch.stack([rows[i] if i in rows else found[k] for i, k in enumerate(keys)])


def unpack_images(inputs: dict[str, Any]) -> list[torch.Tensor]:
    """``images`` (every camera's [H, W, 3] pixels, flattened and concatenated) and ``image_shapes`` [n, 2]
    -> the n images [H, W, 3] (uint8, or float in [0, 1])."""
    flat = torch.as_tensor(inputs[IMAGES]).reshape(-1)
    shapes = torch.as_tensor(inputs[IMAGE_SHAPES]).reshape(-1, 2).tolist()
    sizes = [h * w * 3 for h, w in shapes]
    if sum(sizes) != flat.numel():
        raise ValueError(f"{IMAGES} holds {flat.numel()} values, the shapes {shapes} need {sum(sizes)}")
    return [part.view(h, w, 3) for part, (h, w) in zip(flat.split(sizes), shapes)]
