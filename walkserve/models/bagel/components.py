"""Component builders: the ``ComponentSpec.build`` bodies of BAGEL's nodes (each loads only its own part).

    lm            MoTLM            kv          language_model.* of ema.safetensors
    vit           BagelViT         stateless   {"pixels"} -> {"embeds"}
    latents       LatentEmbedder   stateless   {"latents", "t", "grid"} -> {"embeds"}; {"hidden"} -> {"velocity"}
    vae_encoder   VaeEncoder       stateless   {"image", "seed" | "eps"} -> {"latents"}
    vae_decoder   VaeDecoder       stateless   {"latents", "grid"} -> {"image"}
    cfg_step      CfgStep          stateless   velocities + guidance -> {"x"} (no weights)
"""

from __future__ import annotations

from pathlib import Path

import torch

from walkserve.models.bagel.cfg_step import CfgStep
from walkserve.models.bagel.config import BagelConfig
from walkserve.models.bagel.latents import LatentEmbedder
from walkserve.models.bagel.mot import MoTLM
from walkserve.models.bagel.vae import VaeDecoder, VaeEncoder
from walkserve.models.bagel.vit import BagelViT
from walkserve.models.bagel.weights import (
    load_latents,
    load_lm,
    load_vae_decoder,
    load_vae_encoder,
    load_vit,
)
from walkserve.models.base import BuildContext


def _dtype(ctx: BuildContext) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[ctx.dtype]


def build_lm(ctx: BuildContext, path: str | Path) -> MoTLM:
    return load_lm(path, BagelConfig.from_dir(path), ctx.device, _dtype(ctx))


def build_vit(ctx: BuildContext, path: str | Path) -> BagelViT:
    return load_vit(path, BagelConfig.from_dir(path), ctx.device, _dtype(ctx))


def build_latents(ctx: BuildContext, path: str | Path) -> LatentEmbedder:
    return load_latents(path, BagelConfig.from_dir(path), ctx.device, _dtype(ctx))


def build_vae_encoder(ctx: BuildContext, path: str | Path) -> VaeEncoder:
    return load_vae_encoder(path, BagelConfig.from_dir(path), ctx.device, _dtype(ctx))


def build_vae_decoder(ctx: BuildContext, path: str | Path) -> VaeDecoder:
    return load_vae_decoder(path, BagelConfig.from_dir(path), ctx.device, _dtype(ctx))


def build_cfg_step(ctx: BuildContext) -> CfgStep:
    return CfgStep()
