"""Loading BAGEL from a checkpoint directory as released (see ``config.py`` for the files).

Each component is built on the meta device, materialised and filled from its
prefix of ``ema.safetensors`` or ``ae.safetensors``:

    language_model.*                 MoTLM (forced qk_norm, untied lm_head)
    vit_model.vision_model.*         the SigLIP tower (26 layers; the Linear patch embedding reordered)
    connector.*, vit_pos_embed.*     BagelViT's connector and table
    time_embedder.*, vae2llm.*, llm2vae.*, latent_pos_embed.*    LatentEmbedder
    ae: encoder.*, decoder.*         the FLUX autoencoder

Missing, unexpected or mis-shaped tensors raise ConfigError naming them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from walkserve.models.bagel.config import AE_FILE, EMA_FILE, BagelConfig
from walkserve.models.bagel.flux_ae import FluxDecoder, FluxEncoder
from walkserve.models.bagel.latents import LatentEmbedder
from walkserve.models.bagel.mot import MoTLM
from walkserve.models.bagel.vae import VaeDecoder, VaeEncoder
from walkserve.models.bagel.vit import BagelViT, linear_to_conv_patch_weight
from walkserve.models.common.checkpoint import (
    SafetensorsCheckpoint,
    load_into,
    materialize,
    on_meta,
)
from walkserve.models.common.dtypes import resolve_dtype

LM_PREFIX = "language_model."
VIT_PREFIX = "vit_model.vision_model."
PATCH_KEY = VIT_PREFIX + "embeddings.patch_embedding.weight"
LATENT_PARTS = ("time_embedder", "vae2llm", "llm2vae", "latent_pos_embed")


class ConvertedCheckpoint:
    """A checkpoint whose listed tensors are transformed as they are read (shapes follow, on the meta device)."""

    def __init__(self, base: SafetensorsCheckpoint, convert: dict[str, Callable[[torch.Tensor], torch.Tensor]]):
        self.base, self.convert, self.directory = base, convert, base.directory

    def names(self) -> list[str]:
        return self.base.names()

    def shapes(self, names: Iterable[str] | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
        out = dict(self.base.shapes(names))
        for name, fn in self.convert.items():
            if name in out:
                shape, dtype = out[name]
                out[name] = (tuple(fn(torch.empty(shape, device="meta")).shape), dtype)
        return out

    def tensors(self, names: Iterable[str], progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.base.tensors(names, progress):
            yield name, self.convert[name](tensor) if name in self.convert else tensor


def _build(make: Callable[[], nn.Module], device: torch.device | str, dtype: torch.dtype) -> nn.Module:
    with on_meta():
        module = make()
    return materialize(module, device, dtype).eval()


def _load(make: Callable[[], nn.Module], checkpoint, prefix: str, device, dtype, ignored=(), progress=False):
    module = _build(make, device, dtype)
    load_into(module, checkpoint, prefix=prefix, ignored=ignored, progress=progress)
    return module


def load_lm(path: str | Path, config: BagelConfig, device="cpu", dtype=None, progress=False) -> MoTLM:
    dtype = resolve_dtype(dtype, config.llm)
    ckpt = SafetensorsCheckpoint(path, EMA_FILE)
    return _load(lambda: MoTLM(config.llm), ckpt, LM_PREFIX, device, dtype, progress=progress)


def load_vit(path: str | Path, config: BagelConfig, device="cpu", dtype=torch.float32, progress=False) -> BagelViT:
    """The tower (layers past the configured count, if stored, are not read), connector and table."""
    c = config.vit
    ckpt = ConvertedCheckpoint(
        SafetensorsCheckpoint(path, EMA_FILE),
        {PATCH_KEY: lambda w: linear_to_conv_patch_weight(w, c.num_channels, c.patch_size)},
    )
    vit = _build(lambda: BagelViT(config), device, dtype)
    ignored = [n[len(VIT_PREFIX):] for n in ckpt.names() if n.startswith(VIT_PREFIX) and _unused_vit(n, c.num_hidden_layers)]
    load_into(vit.vit_model, ckpt, prefix=VIT_PREFIX, ignored=ignored, progress=progress)
    load_into(vit.connector, ckpt, prefix="connector.", progress=False)
    load_into(vit.vit_pos_embed, ckpt, prefix="vit_pos_embed.", progress=False)
    return vit


def _unused_vit(name: str, layers: int) -> bool:
    """The dropped last layer and the pooling head, should a checkpoint still hold them."""
    rest = name[len(VIT_PREFIX):]
    m = re.match(r"encoder\.layers\.(\d+)\.", rest)
    return rest.startswith("head.") or (m is not None and int(m.group(1)) >= layers)


def load_latents(path: str | Path, config: BagelConfig, device="cpu", dtype=torch.float32) -> LatentEmbedder:
    ckpt = SafetensorsCheckpoint(path, EMA_FILE)
    latent = _build(lambda: LatentEmbedder(config), device, dtype)
    for part in LATENT_PARTS:
        load_into(getattr(latent, part), ckpt, prefix=f"{part}.", progress=False)
    return latent


def load_vae_encoder(path: str | Path, config: BagelConfig, device="cpu", dtype=torch.float32) -> VaeEncoder:
    ckpt = SafetensorsCheckpoint(path, AE_FILE)
    encoder = _load(lambda: FluxEncoder(config.vae), ckpt, "encoder.", device, dtype)
    return VaeEncoder(encoder, config.vae, config.latent_patch_size)


def load_vae_decoder(path: str | Path, config: BagelConfig, device="cpu", dtype=torch.float32) -> VaeDecoder:
    ckpt = SafetensorsCheckpoint(path, AE_FILE)
    decoder = _load(lambda: FluxDecoder(config.vae), ckpt, "decoder.", device, dtype)
    return VaeDecoder(decoder, config.vae, config.latent_patch_size)


@dataclass
class BagelParts:
    """Every component of one BAGEL checkpoint, loaded in one process (the offline loops and tests)."""

    config: BagelConfig
    lm: MoTLM
    vit: BagelViT
    latents: LatentEmbedder
    vae_encoder: VaeEncoder
    vae_decoder: VaeDecoder


def load_bagel(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = "float32",
               progress: bool = False) -> BagelParts:
    """All components; ``dtype`` for the LLM (None: llm_config's), the others run in float32 unless bf16/fp16 asked."""
    config = BagelConfig.from_dir(path)
    lm_dtype = resolve_dtype(dtype, config.llm)
    side_dtype = lm_dtype if dtype is not None else torch.float32
    return BagelParts(
        config=config,
        lm=load_lm(path, config, device, lm_dtype, progress),
        vit=load_vit(path, config, device, side_dtype, progress),
        latents=load_latents(path, config, device, side_dtype),
        vae_encoder=load_vae_encoder(path, config, device, side_dtype),
        vae_decoder=load_vae_decoder(path, config, device, side_dtype),
    )
