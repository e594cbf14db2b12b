"""The V-JEPA 2 encoder as a stateless-engine component (``forward_batch``).

Input slot ``video``: frames, uint8 (or float 0…255) ``[T, H, W, 3]``.
Output ``features``, float32 unless the request asks for another ``dtype``:

    mode "video"      one clip: the evaluation transform, T = 1 repeated to
                      one tubelet, T a multiple of the tubelet -> [N, E]
                      (with the request param ``pool``: the mean over tokens, [1, E])
    mode "ac_frames"  each frame alone (the DROID transform), repeated into
                      a 2-frame tubelet, encoded, layer-normed with no
                      affine: the AC predictor's frame tokens -> [T, F, E]
    mode "tokens"     as "video" over the whole input (no clip loop, no
                      pooling), always float32: the masked predictor's
                      input in the ``predict`` walk -> [N, E]

The mode is the node's ``op`` ("video", "ac_frames" or "tokens"), else the one the
component was built with. In mode "video" a firing inside the encode walk's
clip loop encodes clip i = its iteration: frames ``[i * clip_frames, (i + 1) *
clip_frames)`` of the video (request param ``clip_frames``), so a long video
streams one clip at a time. Firings whose pixels have the same shape run as
one encoder batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from walkserve.engines.spec import Batch, Item
from walkserve.models.vjepa2.encoder import VisionEncoder
from walkserve.models.vjepa2.params import run_params
from walkserve.models.vjepa2.preprocess import ac_frame_pixels, as_given_pixels, video_pixels
from walkserve.models.vjepa2.rollout import normalize_features
from walkserve.models.vjepa2.stepper import output_dtype

INPUT_SLOT = "video"
OUTPUT_NAME = "features"
MODES = ("video", "ac_frames", "tokens")


class EncoderComponent:
    """Frames in, features out, for many requests per call."""

    def __init__(self, encoder: VisionEncoder, mode: str = "video"):
        if mode not in MODES:
            raise ValueError(f"encoder mode must be one of {MODES}, got {mode!r}")
        self.encoder, self.mode = encoder, mode

    @property
    def device(self) -> torch.device:
        return self.encoder.layernorm.weight.device

    def clip(self, frames: torch.Tensor, mode: str | None = None, resize: bool = True) -> torch.Tensor:
        """Frames [T, H, W, 3] -> the encoder input of ``mode``: [B, 3, t, crop, crop] (B = 1, or T frames);
        with ``resize`` false a video clip keeps its own size (whole patches), [1, 3, T, H, W]."""
        cfg = self.encoder.config
        frames = torch.as_tensor(frames).to(self.device)
        if (mode or self.mode) == "ac_frames":
            pixels = ac_frame_pixels(frames, cfg.crop_size)  # [T, 3, crop, crop]
            return pixels[:, :, None].expand(-1, -1, cfg.tubelet_size, -1, -1)  # [T, 3, tubelet, crop, crop]
        pixels = video_pixels(frames, cfg.crop_size) if resize else as_given_pixels(frames)  # [3, T, h, w]
        if pixels.shape[1] == 1:  # an image: one tubelet of the repeated frame
            pixels = pixels.expand(-1, cfg.tubelet_size, -1, -1)
        if pixels.shape[1] % cfg.tubelet_size:
            raise ValueError(f"{pixels.shape[1]} frames are not a multiple of the tubelet ({cfg.tubelet_size})")
        return pixels[None]  # [1, 3, T, crop, crop]

    @torch.inference_mode()
    def encode(self, clips: Sequence[torch.Tensor], modes: Sequence[str] | None = None) -> list[torch.Tensor]:
        """Encoder inputs (``clip``) -> each one's features (float32), batching equal shapes of one mode."""
        modes = modes or [self.mode] * len(clips)
        out: list[Any] = [None] * len(clips)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, c in enumerate(clips):
            groups[(modes[i], *c.shape[1:])].append(i)
        for (mode, *_), rows in groups.items():
            sizes = [clips[i].shape[0] for i in rows]
            features = self.encoder(torch.cat([clips[i] for i in rows]))  # [sum B, N, E]
            for i, part in zip(rows, features.split(sizes)):
                out[i] = normalize_features(part).float() if mode == "ac_frames" else part[0].float()
        return out

    def forward_batch(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        """One ``{"features": ...}`` per item, in order."""
        mode = batch.op if batch.op in MODES else self.mode
        modes = [mode] * len(batch)
        clips = [self.clip(_frames(f, mode), mode, run_params(f.params).resize) for f in batch]
        out = []
        for f, x in zip(batch, self.encode(clips, modes)):
            params = run_params(f.params)
            if mode == "video":
                x = (x.mean(0, keepdim=True) if params.pool else x).to(output_dtype(params))  # [N or 1, E]
            out.append({OUTPUT_NAME: x})
        return out


def _frames(item: Item, mode: str) -> torch.Tensor:
    """The frames an item encodes: its video, or in the clip loop the clip of its iteration."""
    video = item.inputs[INPUT_SLOT]
    n = run_params(item.params).clip_frames
    if mode != "video" or not n:
        return video
    i = item.iteration
    return video[i * int(n) : (i + 1) * int(n)]
