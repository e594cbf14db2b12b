"""Images: decode client uploads to uint8 [H, W, 3] (pixel cap checked before decoding), encode outputs."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from walkserve.core.array import ArrayData
from walkserve.models.common.images import decode_rgb

OUTPUT_FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg"), "webp": ("WEBP", "image/webp")}


def decode_image(data: bytes, max_pixels: int, param: str) -> ArrayData:
    """Any format Pillow reads -> RGB uint8 [H, W, 3] (``models.common.images.decode_rgb``: upright, the first frame, the
    pixel cap checked first), as an ArrayData."""
    rgb = decode_rgb(data, max_pixels, param)
    return ArrayData("uint8", tuple(rgb.shape), rgb.tobytes())


def to_pixels(value: ArrayData) -> np.ndarray:
    """An image output as uint8 [H, W, C]; float images are read as 0..1."""
    array = np.frombuffer(value.data, dtype=np.dtype(value.dtype)).reshape(value.shape)
    if array.ndim == 2:
        array = array[:, :, None]  # [H, W] -> [H, W, 1]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise ValueError(f"an image output must be [H, W, 1|3|4], got {list(value.shape)}")
    if array.dtype != np.uint8:
        array = (np.clip(array.astype(np.float32), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return array


def encode_image(value: ArrayData, fmt: str = "png") -> bytes:
    """uint8 [H, W, C] -> PNG / JPEG / WEBP bytes."""
    pixels = to_pixels(value)
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[pixels.shape[2]]
    image = Image.fromarray(pixels[:, :, 0] if mode == "L" else pixels, mode=mode)
    if fmt == "jpeg" and mode == "RGBA":
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format=OUTPUT_FORMATS[fmt][0])
    return buffer.getvalue()
