"""Camera images to SigLIP pixels, as lerobot's pi0 / pi0.5 prepare them (no torchvision).

    uint8 [H, W, 3] (or float [H, W, 3] in [0, 1]) -> float [0, 1]
    -> if not R x R: resize with padding (bilinear, aspect kept, centred, black bars)
    -> x * 2 - 1 -> [3, R, R] in [-1, 1]

Resize with padding: scale by 1 / max(W / R, H / R), sizes truncated to ints,
``F.interpolate(bilinear, align_corners=False)`` without antialiasing, clamp
to [0, 1], then pad (R - h) // 2 rows on top and the rest below (likewise for
columns). A camera the request lacks is an all -1 image whose tokens are
masked; the serving path leaves such cameras out instead (same result).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def resize_with_pad(image: torch.Tensor, size: int) -> torch.Tensor:
    """float [C, H, W] in [0, 1] -> [C, size, size]."""
    _, height, width = image.shape
    ratio = max(width / size, height / size)
    h, w = int(height / ratio), int(width / ratio)
    resized = F.interpolate(image[None], size=(h, w), mode="bilinear", align_corners=False)[0].clamp(0.0, 1.0)
    top, left = (size - h) // 2, (size - w) // 2
    return F.pad(resized, (left, size - w - left, top, size - h - top), value=0.0)  # [C, size, size]


def camera_pixels(image: np.ndarray | torch.Tensor, size: int) -> torch.Tensor:
    """One camera image [H, W, 3] (uint8, or float in [0, 1]) -> float32 [3, size, size] in [-1, 1]."""
    x = torch.as_tensor(np.ascontiguousarray(image) if isinstance(image, np.ndarray) else image)
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    x = x.permute(2, 0, 1)  # [3, H, W]
    if tuple(x.shape[1:]) != (size, size):
        x = resize_with_pad(x, size)
    return x * 2.0 - 1.0
