"""Images: decode client uploads to uint8 [H, W, 3] (pixel cap checked before decoding), encode outputs."""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from walkserve.api.errors import bad_request
from walkserve.core.array import ArrayData

OUTPUT_FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg"), "webp": ("WEBP", "image/webp")}


def decode_image(data: bytes, max_pixels: int, param: str) -> ArrayData:
    """Any format Pillow reads -> RGB uint8 [H, W, 3], turned upright by its EXIF orientation; the first frame of
    an animation."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise bad_request(f"the image has {width}x{height} pixels; the limit is {max_pixels}", param, "image_too_large")
            ImageOps.exif_transpose(image, in_place=True)  # upright, as viewers show it (a phone's portrait photo)
            rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)  # rgb: [H, W, 3]
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):  # Pillow's own cap, read from the header
        limit = min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels)
        raise bad_request(f"the image has more than {limit} pixels, the limit", param, "image_too_large") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise bad_request("is not an image this server can decode", param, "invalid_image") from None
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
