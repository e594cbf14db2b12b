"""Builders of the V-JEPA 2 components (the bodies of ``ComponentSpec.build``), one per engine kind.

    build_video_encoder(ctx, path)     stateless  EncoderComponent, mode "video"       (encode task)
    build_ac_frame_encoder(ctx, path)  stateless  EncoderComponent, mode "ac_frames"   (rollout / plan frames)
    build_masked_predictor(ctx, path)  stateless  PredictorComponent                   (predict task)
    build_ac_predictor(ctx, path)      kv         ACPredictor                          (rollout / plan steps)

``path`` is an HF V-JEPA 2 checkpoint for the first three, a converted
V-JEPA 2-AC one for the AC pieces (its encoder serves ``build_ac_frame_encoder``).
"""

from __future__ import annotations

from pathlib import Path

from walkserve.models.base import BuildContext
from walkserve.models.vjepa2.ac_predictor import ACPredictor
from walkserve.models.vjepa2.encoder_component import EncoderComponent
from walkserve.models.vjepa2.predictor_component import PredictorComponent
from walkserve.models.vjepa2.weights import load_ac_predictor, load_encoder, load_masked_predictor


def build_video_encoder(ctx: BuildContext, path: str | Path) -> EncoderComponent:
    return EncoderComponent(load_encoder(path, ctx.device, ctx.dtype), mode="video")


def build_ac_frame_encoder(ctx: BuildContext, path: str | Path) -> EncoderComponent:
    return EncoderComponent(load_encoder(path, ctx.device, ctx.dtype), mode="ac_frames")


def build_masked_predictor(ctx: BuildContext, path: str | Path) -> PredictorComponent:
    return PredictorComponent(load_masked_predictor(path, ctx.device, ctx.dtype))


def build_ac_predictor(ctx: BuildContext, path: str | Path) -> ACPredictor:
    return load_ac_predictor(path, ctx.device, ctx.dtype)
