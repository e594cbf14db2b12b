"""Pixels for V-JEPA 2, in plain PyTorch (no torchvision).

``video_pixels`` is the evaluation transform of the HF checkpoints
(``VJEPA2VideoProcessor``): resize the short side to ``int(crop * 256 / 224)``
(bilinear, antialiased, the long side scaled to keep the aspect ratio),
center-crop ``crop`` x ``crop``, scale to [0, 1], ImageNet mean/std.

``ac_frame_pixels`` is the released V-JEPA 2-AC (DROID) transform:
``make_transforms(random_resize_scale=(1, 1), random_resize_aspect_ratio=(1, 1),
no flip)``, whose ``random_resized_crop`` takes the whole frame when it is
square and falls back to the central square of side min(H, W) when it is not,
then resizes it to ``crop`` (bilinear, no antialias, align_corners=False) — no
short-side resize, no center crop to the crop size — and normalises with
ImageNet mean/std. (A frame within a pixel of square, where
round(sqrt(H * W)) still fits, gets a random offset of at most one pixel
there; we take the central one.)

Frames come in as uint8 (or float in 0…255) ``[T, H, W, 3]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def resize_short_side(crop: int) -> int:
    """The short side the evaluation transform resizes to before cropping ``crop``."""
    return int(crop * 256 / 224)


def normalize(pixels: torch.Tensor) -> torch.Tensor:
    """Channels-first pixels [3, ...] in 0…255 -> ImageNet-normalised float32."""
    shape = (3,) + (1,) * (pixels.dim() - 1)
    mean = torch.tensor(IMAGENET_MEAN, device=pixels.device).view(shape) * 255.0
    std = torch.tensor(IMAGENET_STD, device=pixels.device).view(shape) * 255.0
    return (pixels - mean) / std


def _channels_first(frames: torch.Tensor) -> torch.Tensor:
    """[T, H, W, 3] uint8/float -> float32 [T, 3, H, W] in 0…255."""
    if frames.dim() != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be [T, H, W, 3], got {tuple(frames.shape)}")
    return frames.permute(0, 3, 1, 2).to(torch.float32)


def video_pixels(frames: torch.Tensor, crop: int) -> torch.Tensor:
    """Frames [T, H, W, 3] -> the encoder's clip [3, T, crop, crop] (short-side resize, center crop, normalise)."""
    x = _channels_first(frames)  # [T, 3, H, W]
    h, w = x.shape[-2:]
    short = resize_short_side(crop)
    size = (short, int(short * w / h)) if h <= w else (int(short * h / w), short)
    x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)  # [T, 3, h', w']
    top, left = round((size[0] - crop) / 2.0), round((size[1] - crop) / 2.0)  # as torchvision center_crop
    x = x[..., top : top + crop, left : left + crop]  # [T, 3, crop, crop]
    return normalize(x.transpose(0, 1))  # [3, T, crop, crop]


def as_given_pixels(frames: torch.Tensor) -> torch.Tensor:
    """Frames [T, H, W, 3] -> [3, T, H, W], normalised, not resized (the request param ``resize: false``)."""
    return normalize(_channels_first(frames).transpose(0, 1))


def ac_frame_pixels(frames: torch.Tensor, crop: int) -> torch.Tensor:
    """Frames [T, H, W, 3] -> per-frame pixels [T, 3, crop, crop] for the AC model (the DROID transform)."""
    x = _channels_first(frames)  # [T, 3, H, W]
    h, w = x.shape[-2:]
    side = min(h, w)  # the whole frame when square
    top, left = (h - side) // 2, (w - side) // 2
    x = x[..., top : top + side, left : left + side]
    x = F.interpolate(x, size=(crop, crop), mode="bilinear", align_corners=False)  # [T, 3, crop, crop]
    return normalize(x.transpose(0, 1)).transpose(0, 1)  # [T, 3, crop, crop]
