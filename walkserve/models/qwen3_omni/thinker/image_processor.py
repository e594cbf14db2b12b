"""Images and video frames -> the vision encoder's flat patches (numpy + Pillow, torch-free).

As the checkpoint's processor (Qwen2-VL image processor, its Pillow backend):

    RGB uint8 [H, W, 3] -> smart_resize to (h, w), multiples of patch*merge = 32, pixels within
    [min_pixels, max_pixels], aspect ratio kept -> bicubic (Pillow) -> / 255 -> (x - mean) / std
    -> patches [t*gh*gw, C*2*16*16] in merge-block order (t, gh/2, gw/2, 2, 2); grid (t, gh, gw)

A still image is one temporal group: its frame is repeated to fill the
temporal patch. A video's frames are resized alike (one size for all) and
padded to a multiple of the temporal patch by repeating the last frame.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from walkserve.core.errors import ConfigError


@dataclass(frozen=True)
class VisionPreprocess:
    """Resize bounds and normalisation of images (``preprocessor_config.json``) or videos (the video config)."""

    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 768 * 32 * 32
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, d: dict, defaults: VisionPreprocess | None = None) -> VisionPreprocess:
        """Read a Qwen2-VL processor config: ``size.{shortest,longest}_edge`` or ``min/max_pixels``."""
        base = defaults or cls()
        size = d.get("size") or {}
        return cls(
            min_pixels=int(d.get("min_pixels") or size.get("shortest_edge") or base.min_pixels),
            max_pixels=int(d.get("max_pixels") or size.get("longest_edge") or base.max_pixels),
            patch_size=int(d.get("patch_size", base.patch_size)),
            temporal_patch_size=int(d.get("temporal_patch_size", base.temporal_patch_size)),
            merge_size=int(d.get("merge_size", base.merge_size)),
            image_mean=tuple(d.get("image_mean", base.image_mean)),
            image_std=tuple(d.get("image_std", base.image_std)),
        )

    @classmethod
    def from_checkpoint(cls, directory: str | Path, video: bool = False) -> VisionPreprocess:
        """The image settings (``preprocessor_config.json``), or the video ones (``video_preprocessor_config.json``,
        falling back to the processor's video defaults: 128 to 768 merged tokens per frame)."""
        directory = Path(directory)
        path = directory / ("video_preprocessor_config.json" if video else "preprocessor_config.json")
        if not path.is_file():
            if video:
                return cls()
            raise ConfigError(f"{directory}: no preprocessor_config.json")
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise ConfigError(f"{path}: invalid processor config ({e})") from None


@dataclass(frozen=True)
class VisionInput:
    """One image or video for the vision encoder."""

    pixel_values: np.ndarray  # float32 [t*gh*gw, C*tp*p*p]
    grid_thw: tuple[int, int, int]

    def token_count(self, merge_size: int = 2) -> int:
        t, h, w = self.grid_thw
        return t * h * w // merge_size**2


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(h, w): multiples of ``factor``, area within [min_pixels, max_pixels], aspect ratio about kept."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio must be under 200, got {max(height, width) / min(height, width):.1f}")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def preprocess_image(rgb: np.ndarray, settings: VisionPreprocess) -> VisionInput:
    """uint8 [H, W, 3] -> flat patches of one temporal group."""
    h, w = smart_resize(rgb.shape[0], rgb.shape[1], settings.factor, settings.min_pixels, settings.max_pixels)
    frame = _normalise(_resize(rgb, h, w), settings)  # [3, h, w]
    return _patchify(np.repeat(frame[None], settings.temporal_patch_size, axis=0), settings)


def preprocess_video(frames: Sequence[np.ndarray], settings: VisionPreprocess) -> VisionInput:
    """Frames uint8 [H, W, 3] (all one size) -> flat patches; the last frame repeats to fill a temporal patch."""
    if not len(frames):
        raise ValueError("a video needs at least one frame")
    height, width = frames[0].shape[:2]
    if any(f.shape[:2] != (height, width) for f in frames):
        raise ValueError("video frames must all have one size")
    h, w = smart_resize(height, width, settings.factor, settings.min_pixels, settings.max_pixels)
    stack = np.stack([_normalise(_resize(f, h, w), settings) for f in frames])  # [T, 3, h, w]
    pad = -len(stack) % settings.temporal_patch_size
    if pad:
        stack = np.concatenate([stack, np.repeat(stack[-1:], pad, axis=0)])
    return _patchify(stack, settings)


def _resize(rgb: np.ndarray, h: int, w: int) -> np.ndarray:
    from PIL import Image

    rgb = np.asarray(rgb)
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"an image must be RGB uint8 [H, W, 3], got {rgb.dtype} {list(rgb.shape)}")
    if rgb.shape[:2] == (h, w):
        return rgb
    return np.asarray(Image.fromarray(rgb).resize((w, h), resample=Image.Resampling.BICUBIC))


def _normalise(rgb: np.ndarray, s: VisionPreprocess) -> np.ndarray:
    """uint8 [h, w, 3] -> float32 [3, h, w], rescaled to 0..1 then standardised."""
    x = (rgb.astype(np.float64) * (1 / 255)).astype(np.float32).transpose(2, 0, 1)
    mean = np.asarray(s.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(s.image_std, dtype=np.float32)[:, None, None]
    return ((x - mean) / std).astype(np.float32)


def _patchify(video: np.ndarray, s: VisionPreprocess) -> VisionInput:
    """[T, C, h, w] (T a multiple of the temporal patch) -> rows (t, gh/m, gw/m, m, m), each (C, tp, p, p)."""
    n, c, h, w = video.shape
    p, m, tp = s.patch_size, s.merge_size, s.temporal_patch_size
    gt, gh, gw = n // tp, h // p, w // p
    x = video.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # [gt, gh/m, gw/m, m, m, C, tp, p, p]
    return VisionInput(np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw))
