"""The V-JEPA 2 encoder as a stateless-engine component (``forward_batch``).

Input slot ``video``: frames, uint8 (or float 0…255) ``[T, H, W, 3]``.
Output ``features``, float32:

    mode "video"      one clip: the evaluation transform, T = 1 repeated to
                      one tubelet, T a multiple of the tubelet -> [N, E]
    mode "ac_frames"  each frame alone (the DROID transform), repeated into
                      a 2-frame tubelet, encoded, layer-normed with no
                      affine: the AC predictor's frame tokens -> [T, F, E]

Firings whose pixels have the same shape run as one encoder batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from walkserve.models.vjepa2.encoder import VisionEncoder
from walkserve.models.vjepa2.preprocess import ac_frame_pixels, video_pixels
from walkserve.models.vjepa2.rollout import normalize_features

INPUT_SLOT = "video"
OUTPUT_NAME = "features"
MODES = ("video", "ac_frames")


class EncoderComponent:
    """Frames in, features out, for many requests per call."""

    def __init__(self, encoder: VisionEncoder, mode: str = "video"):
        if mode not in MODES:
            raise ValueError(f"encoder mode must be one of {MODES}, got {mode!r}")
        self.encoder, self.mode = encoder, mode

    @property
    def device(self) -> torch.device:
        return self.encoder.layernorm.weight.device

    def clip(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames [T, H, W, 3] -> the encoder input of this mode: [B, 3, t, crop, crop] (B = 1, or T frames)."""
        cfg = self.encoder.config
        frames = torch.as_tensor(frames).to(self.device)
        if self.mode == "ac_frames":
            pixels = ac_frame_pixels(frames, cfg.crop_size)  # [T, 3, crop, crop]
            return pixels[:, :, None].expand(-1, -1, cfg.tubelet_size, -1, -1)  # [T, 3, tubelet, crop, crop]
        pixels = video_pixels(frames, cfg.crop_size)  # [3, T, crop, crop]
        if pixels.shape[1] == 1:  # an image: one tubelet of the repeated frame
            pixels = pixels.expand(-1, cfg.tubelet_size, -1, -1)
        if pixels.shape[1] % cfg.tubelet_size:
            raise ValueError(f"{pixels.shape[1]} frames are not a multiple of the tubelet ({cfg.tubelet_size})")
        return pixels[None]  # [1, 3, T, crop, crop]

    @torch.inference_mode()
    def encode(self, clips: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Encoder inputs of this mode (``clip``) -> each one's features, batching equal shapes."""
        out: list[Any] = [None] * len(clips)
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, c in enumerate(clips):
            groups[tuple(c.shape[1:])].append(i)
        for rows in groups.values():
            sizes = [clips[i].shape[0] for i in rows]
            features = self.encoder(torch.cat([clips[i] for i in rows]))  # [sum B, N, E]
            for i, part in zip(rows, features.split(sizes)):
                out[i] = self._finish(part)
        return out

    def _finish(self, features: torch.Tensor) -> torch.Tensor:
        if self.mode == "ac_frames":
            return normalize_features(features).float()  # [T, F, E]
        return features[0].float()  # [N, E]

    def forward_batch(self, firings: Sequence[Any]) -> list[dict[str, torch.Tensor]]:
        """One ``{"features": ...}`` per firing (a Firing, or its ``inputs`` dict), in order."""
        inputs = [getattr(f, "inputs", f) for f in firings]
        return [{OUTPUT_NAME: x} for x in self.encode([self.clip(i[INPUT_SLOT]) for i in inputs])]
