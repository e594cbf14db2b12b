"""Input images as the release prepares them: RGB on white, bicubic resize by a rule, then [-1, 1] pixels.

    edit:           vae = VAE_RESIZE(image); vit = VIT_RESIZE(vae); the output has vae's size
    understanding:  the release VAE-resizes first here too, then ViT-resizes
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from walkserve.models.bagel.sizes import VAE_RESIZE, VIT_RESIZE, ResizeRule


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB; transparency composited over white (as the release does)."""
    if image.mode == "RGBA" or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba.split()[3])
        return white
    return image.convert("RGB")


def resized(image: Image.Image, rule: ResizeRule) -> Image.Image:
    width, height = rule.fit(*image.size)
    return image if (width, height) == image.size else image.resize((width, height), Image.BICUBIC)


def pixels(image: Image.Image) -> torch.Tensor:
    """RGB image -> float32 [3, H, W] in [-1, 1] ((x / 255 - 0.5) / 0.5)."""
    array = np.asarray(image, dtype=np.float32) / 255.0  # [H, W, 3]
    return torch.from_numpy((array - 0.5) / 0.5).permute(2, 0, 1).contiguous()


def image_inputs(image: Image.Image, vae_rule: ResizeRule = VAE_RESIZE,
                 vit_rule: ResizeRule = VIT_RESIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """(VAE pixels [3, H, W], ViT pixels [3, h, w]) of an input image."""
    vae_image = resized(to_rgb(image), vae_rule)
    return pixels(vae_image), pixels(resized(vae_image, vit_rule))
