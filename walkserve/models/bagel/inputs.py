"""Request inputs as the processor prepares them (torch-free): images resized by the release's rules,
the explicit initial noise checked, chat content split into images and text.

    edit image           uint8 [H, W, 3]  --VAE rule-->  vae_image  --ViT rule-->  vit_image
    understanding image  uint8 [H, W, 3]  --VAE rule--ViT rule-->  vit_image_<i>

The rules are the release's (``sizes.py``) capped by the checkpoint's position
tables (a tiny checkpoint's tables are small): the VAE side at most
``max_latent_size * 16``, the ViT side at most ``vit_max_num_patch_per_side * 14``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from walkserve.core.array import ArrayData
from walkserve.core.errors import InvalidRequest
from walkserve.models.bagel.config import BagelConfig
from walkserve.models.bagel.sizes import VAE_RESIZE, VIT_RESIZE, ResizeRule


@dataclass(frozen=True)
class ImageRules:
    vae: ResizeRule
    vit: ResizeRule

    @staticmethod
    def of(config: BagelConfig) -> ImageRules:
        vae_side = min(VAE_RESIZE.max_size, config.max_image_side)
        vit_side = min(VIT_RESIZE.max_size, config.vit_max_num_patch_per_side * config.vit.patch_size)
        return ImageRules(
            ResizeRule(vae_side, min(VAE_RESIZE.min_size, vae_side), VAE_RESIZE.stride),
            ResizeRule(vit_side, min(VIT_RESIZE.min_size, vit_side), VIT_RESIZE.stride),
        )


def to_image(value: Any, param: str) -> Image.Image:
    """A decoded upload (uint8 [H, W, 3], as the API's media decoder gives it) as a PIL image."""
    if not isinstance(value, ArrayData) or value.dtype != "uint8" or len(value.shape) != 3 or value.shape[2] != 3:
        raise InvalidRequest("must be an RGB image (uint8 [H, W, 3])", param=param)
    if min(value.shape[:2]) < 1:
        raise InvalidRequest("the image is empty", param=param)
    return Image.fromarray(np.frombuffer(value.data, dtype=np.uint8).reshape(value.shape), mode="RGB")


def resized(image: Image.Image, rule: ResizeRule) -> Image.Image:
    """The release's resize: bicubic to the rule's size (unchanged when it already fits)."""
    width, height = rule.fit(*image.size)
    return image if (width, height) == image.size else image.resize((width, height), Image.BICUBIC)


def as_array(image: Image.Image) -> ArrayData:
    pixels = np.asarray(image, dtype=np.uint8)  # [H, W, 3]
    return ArrayData("uint8", tuple(pixels.shape), pixels.tobytes())


def edit_images(value: Any, rules: ImageRules, param: str) -> tuple[ArrayData, ArrayData]:
    """(vae_image, vit_image) of the image to edit; the output keeps vae_image's size."""
    vae = resized(to_image(value, param), rules.vae)
    return as_array(vae), as_array(resized(vae, rules.vit))


def understanding_image(value: Any, rules: ImageRules, param: str) -> ArrayData:
    return as_array(resized(resized(to_image(value, param), rules.vae), rules.vit))


def initial_noise(value: Any, tokens: int, channels: int, param: str) -> ArrayData:
    """An explicit initial latent, float32 [tokens, channels] (diffusers' ``latents=``), checked."""
    if not isinstance(value, ArrayData):
        raise InvalidRequest("must be an array (float32 [tokens, 64])", param=param)
    if value.dtype not in ("float16", "float32", "float64"):
        raise InvalidRequest(f"must be a float array, got {value.dtype}", param=param)
    if tuple(value.shape) != (tokens, channels):
        raise InvalidRequest(f"must be [{tokens}, {channels}] for this size (one row per 16x16 pixels), "
                             f"got {list(value.shape)}", param=param)
    array = np.frombuffer(value.data, dtype=np.dtype(value.dtype)).astype(np.float32)
    if not np.isfinite(array).all():
        raise InvalidRequest("holds NaN or infinity", param=param)
    return ArrayData("float32", tuple(value.shape), array.tobytes())


def chat_content(messages: Any) -> tuple[list[tuple[Any, str]], list[str]]:
    """([(image, param)], [text]) of chat messages, each in order: BAGEL reads the images, then the text."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages")
    images, texts = [], []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for j, part in enumerate(parts):
            if part.get("type") == "image":
                images.append((part.get("image"), f"messages[{i}].content[{j}]"))
            elif part.get("type") == "text":
                if part.get("text"):
                    texts.append(str(part["text"]))
            else:
                raise InvalidRequest(f"BAGEL reads text and image parts, not {part.get('type')!r}",
                                     param=f"messages[{i}].content[{j}]")
    return images, texts
