"""Builders of the V-JEPA 2 components (the bodies of ``ComponentSpec.build``), one per engine kind.

    build_encoder(ctx, path)           stateless  EncoderComponent (node op: "video" or "ac_frames")
    build_masked_predictor(ctx, path)  stateless  PredictorComponent (the masked predictor of an HF checkpoint)
    build_ac_predictor(ctx, path)      kv         ACPredictor                 (rollout / plan steps)
    build_stepper(ctx, path)           stateless  RolloutStepper              (rollout bookkeeping)
    build_planner(ctx, path)           stateless  Planner                     (CEM bookkeeping)

``path`` is an HF V-JEPA 2 checkpoint or a converted V-JEPA 2-AC one (its
encoder serves ``build_encoder``; the AC pieces need the latter).
"""

from __future__ import annotations

from pathlib import Path

from walkserve.engines.spec import BuildContext
from walkserve.models.vjepa2.ac_predictor import ACPredictor
from walkserve.models.vjepa2.config import VJEPA2ACConfig, read_config
from walkserve.models.vjepa2.encoder_component import EncoderComponent
from walkserve.models.vjepa2.planner import Planner
from walkserve.models.vjepa2.predictor_component import PredictorComponent
from walkserve.models.vjepa2.stepper import RolloutStepper
from walkserve.models.vjepa2.weights import load_ac_predictor, load_encoder, load_masked_predictor


def _dtype(ctx: BuildContext, path: str | Path) -> str:
    """The rank's dtype, else the checkpoint's (a converted AC checkpoint says; HF ones are float32)."""
    return ctx.dtype or getattr(read_config(path), "dtype", "float32")


def build_encoder(ctx: BuildContext, path: str | Path) -> EncoderComponent:
    return EncoderComponent(load_encoder(path, ctx.device, _dtype(ctx, path)), mode="video")


def build_masked_predictor(ctx: BuildContext, path: str | Path) -> PredictorComponent:
    return PredictorComponent(load_masked_predictor(path, ctx.device, _dtype(ctx, path)))


def build_ac_predictor(ctx: BuildContext, path: str | Path) -> ACPredictor:
    return load_ac_predictor(path, ctx.device, _dtype(ctx, path))


def _ac_config(path: str | Path) -> VJEPA2ACConfig:
    config = read_config(path)
    assert isinstance(config, VJEPA2ACConfig), f"{path} is not a V-JEPA 2-AC checkpoint"
    return config


def build_stepper(ctx: BuildContext, path: str | Path) -> RolloutStepper:
    return RolloutStepper(_ac_config(path).predictor)


def build_planner(ctx: BuildContext, path: str | Path) -> Planner:
    return Planner(_ac_config(path).predictor)
