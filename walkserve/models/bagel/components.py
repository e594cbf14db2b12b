"""Component builders: the ``ComponentSpec.build`` bodies of BAGEL's components (each loads only its own part).

    lm            MoTLM            kv          language_model.* of ema.safetensors
    vit           VitNode          stateless   BagelViT: vit_model.*, connector.*, vit_pos_embed
    vae_encoder   VaeEncoderNode   stateless   encoder.* of ae.safetensors
    latents       LatentNode       stateless   time_embedder, vae2llm, llm2vae, latent_pos_embed; the CFG step
    vae_decoder   VaeDecoderNode   stateless   decoder.* of ae.safetensors

The LLM takes the rank's dtype; the other components run in float32 unless
``side_dtype`` asks otherwise (they are small, and the flow's latents are what
the image is made of).
"""

from __future__ import annotations

from pathlib import Path

import torch

from walkserve.engines.spec import BuildContext
from walkserve.models.bagel.config import BagelConfig
from walkserve.models.bagel.mot import MoTLM
from walkserve.models.bagel.nodes import LatentNode, VaeDecoderNode, VaeEncoderNode, VitNode
from walkserve.models.bagel.weights import (
    load_latents,
    load_lm,
    load_vae_decoder,
    load_vae_encoder,
    load_vit,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str | None) -> torch.dtype:
    return DTYPES[name or "float32"]


def build_lm(ctx: BuildContext, path: str | Path) -> MoTLM:
    return load_lm(path, BagelConfig.from_dir(path), ctx.device, _dtype(ctx.dtype))


def build_vit(ctx: BuildContext, path: str | Path, side_dtype: str) -> VitNode:
    return VitNode(load_vit(path, BagelConfig.from_dir(path), ctx.device, _dtype(side_dtype)))


def build_latents(ctx: BuildContext, path: str | Path, side_dtype: str) -> LatentNode:
    return LatentNode(load_latents(path, BagelConfig.from_dir(path), ctx.device, _dtype(side_dtype)))


def build_vae_encoder(ctx: BuildContext, path: str | Path, side_dtype: str) -> VaeEncoderNode:
    return VaeEncoderNode(load_vae_encoder(path, BagelConfig.from_dir(path), ctx.device, _dtype(side_dtype)))


def build_vae_decoder(ctx: BuildContext, path: str | Path, side_dtype: str) -> VaeDecoderNode:
    return VaeDecoderNode(load_vae_decoder(path, BagelConfig.from_dir(path), ctx.device, _dtype(side_dtype)))


BUILDERS = {"lm": build_lm, "vit": build_vit, "latents": build_latents, "vae_encoder": build_vae_encoder,
            "vae_decoder": build_vae_decoder}
