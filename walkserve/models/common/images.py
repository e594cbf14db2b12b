"""Encoded images (PNG, JPEG, WEBP, ... : whatever Pillow reads) decoded to RGB pixels, with the pixel cap
checked from the header before any pixel is decoded. The one decoder of client images: the HTTP routes'
media loader and the policy inputs (openpi observations) both call it.

Errors are ``InvalidRequest`` naming the client's field (``param``): ``image_too_large`` over the cap
(the server's, or Pillow's own decompression-bomb limit when lower), ``invalid_image`` for bytes that
are not an image.
"""

from __future__ import annotations

import io
import warnings

import numpy as np

from walkserve.core.errors import InvalidRequest


def decode_rgb(data: bytes, max_pixels: int, param: str) -> np.ndarray:
    """Encoded image bytes -> RGB uint8 [H, W, 3], turned upright by its EXIF orientation (a phone's portrait
    photo, as viewers show it); the first frame of an animation."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise InvalidRequest(f"the image has {width}x{height} pixels; the limit is {max_pixels}", param=param,
                                     code="image_too_large")
            ImageOps.exif_transpose(image, in_place=True)
            return np.asarray(image.convert("RGB"), dtype=np.uint8)  # [H, W, 3]
    except (Image.DecompressionBombWarning, Image.DecompressionBombError):  # Pillow's own cap, read from the header
        limit = min(max_pixels, Image.MAX_IMAGE_PIXELS or max_pixels)
        raise InvalidRequest(f"the image has more than {limit} pixels, the limit", param=param,
                             code="image_too_large") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise InvalidRequest("is not an image this server can decode", param=param, code="invalid_image") from None
