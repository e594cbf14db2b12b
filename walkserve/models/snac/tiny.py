"""Write a random-weight SNAC checkpoint in the official layout (``config.json`` + ``model.safetensors``).

Every tensor of the official state dict is written (encoder and encode-side
quantizer projections included, weight norm stored as
``parametrizations.weight.original0/1``), so ``snac.SNAC(**config)`` loads
the same file with a strict ``load_state_dict``. The weights are random (not a
trained codec: the audio is noise-like), scaled so activations stay in range
and the tanh output is not saturated. ``"full"`` is the real 24 kHz shape
(~19.8M parameters, ~80 MB); ``"tiny"`` keeps its rates, strides and 4096-code
codebooks with small widths.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from walkserve.core.errors import ConfigError
from walkserve.models.common.checkpoint import on_meta
from walkserve.models.snac.attention import ROPE_BASE
from walkserve.models.snac.config import ATTN_HEAD_DIM, PRESETS, SnacConfig
from walkserve.models.snac.decoder import SnacDecoder
from walkserve.models.snac.layout import WEIGHT_NORM_SUFFIXES, attention_index, decoder_slots
from walkserve.models.snac.weights import CONFIG_FILE, WEIGHTS_FILE

G_SUFFIX, V_SUFFIX = WEIGHT_NORM_SUFFIXES[0]
Spec = tuple[str, tuple[int, ...], str, float]  # official name, shape, init kind, scale


def _wn_conv(
    name: str, out_ch: int, in_per_group: int, kernel: int, gain: float = 1.0, bias: bool = True
) -> Iterator[Spec]:
    yield name + G_SUFFIX, (out_ch, 1, 1), "g", gain
    yield name + V_SUFFIX, (out_ch, in_per_group, kernel), "v", 1.0
    if bias:
        yield name + ".bias", (out_ch,), "bias", 0.05


def _attention(name: str, dim: int) -> Iterator[Spec]:
    yield name + ".norm.weight", (dim,), "ln_weight", 0.1
    yield name + ".norm.bias", (dim,), "bias", 0.1
    yield name + ".to_qkv.weight", (3 * dim, dim), "linear", 1.0
    yield name + ".to_out.weight", (dim, dim), "linear", 1.0
    yield name + ".rel_pos.inv_freq", (ATTN_HEAD_DIM // 2,), "inv_freq", 1.0


def _encoder_residual(name: str, dim: int, groups: int) -> Iterator[Spec]:
    yield name + ".block.0.alpha", (1, dim, 1), "alpha", 1.0
    yield from _wn_conv(name + ".block.1", dim, dim // groups, 7)
    yield name + ".block.2.alpha", (1, dim, 1), "alpha", 1.0
    yield from _wn_conv(name + ".block.3", dim, dim, 1)


def _encoder_specs(cfg: SnacConfig) -> Iterator[Spec]:
    """The encoder and the quantizer's ``in_proj`` (never used by our decoder; written so the file is complete)."""
    dim = cfg.encoder_dim
    yield from _wn_conv("encoder.block.0", dim, 1, 7)
    for i, stride in enumerate(cfg.encoder_rates):
        name, half, dim = f"encoder.block.{1 + i}.block", dim, dim * 2
        groups = half if cfg.depthwise else 1
        for u in range(3):
            yield from _encoder_residual(f"{name}.{u}", half, groups)
        yield f"{name}.3.alpha", (1, half, 1), "alpha", 1.0
        yield from _wn_conv(f"{name}.4", dim, half, 2 * stride)
    index = 1 + len(cfg.encoder_rates)
    if cfg.attn_window_size is not None:
        yield from _attention(f"encoder.block.{index}", dim)
        index += 1
    yield from _wn_conv(f"encoder.block.{index}", dim, 1 if cfg.depthwise else dim, 7)
    for level in range(cfg.n_levels):
        yield from _wn_conv(
            f"quantizer.quantizers.{level}.in_proj", cfg.codebook_dim, cfg.latent, 1
        )


def _gain(ours: str, cfg: SnacConfig) -> float:
    """Weight-norm magnitude per layer: keeps the residual stack's variance from exploding."""
    if ours.endswith(".up"):
        return math.sqrt(cfg.decoder_rates[int(ours.split(".")[1])] / 2)
    if ours.endswith((".conv2", ".noise.linear")):
        return 0.3
    if ours == "out_conv":  # keeps the tanh mostly unsaturated
        return 0.2
    return 1.0


def _decoder_specs(cfg: SnacConfig) -> Iterator[Spec]:
    slots = decoder_slots(cfg)
    with on_meta():
        params = list(SnacDecoder(cfg).named_parameters())
    for name, p in params:
        prefix, _, leaf = name.rpartition(".")
        slot = slots[prefix]
        official = f"{slot.official}.{leaf}"
        if slot.weight_norm and leaf == "weight":
            yield slot.official + G_SUFFIX, (p.shape[0], 1, 1), "g", _gain(prefix, cfg)
            yield slot.official + V_SUFFIX, tuple(p.shape), "v", 1.0
        elif leaf == "alpha":
            yield official, tuple(p.shape), "alpha", 1.0
        elif prefix.endswith("codebook"):
            yield official, tuple(p.shape), "normal", 1.0
        elif prefix == "attn.norm":
            yield official, tuple(p.shape), "ln_weight" if leaf == "weight" else "bias", 0.1
        elif prefix.startswith("attn."):
            yield official, tuple(p.shape), "linear", 1.0
        else:
            yield official, tuple(p.shape), "bias", 0.05
    if cfg.attn_window_size is not None:
        yield (
            f"decoder.model.{attention_index(cfg)}.rel_pos.inv_freq",
            (ATTN_HEAD_DIM // 2,),
            "inv_freq",
            1.0,
        )


def _init(shape: tuple[int, ...], kind: str, scale: float, gen: torch.Generator) -> torch.Tensor:
    if kind == "inv_freq":
        return 1.0 / ROPE_BASE ** (torch.arange(0, 2 * shape[0], 2).float() / (2 * shape[0]))
    if kind in (
        "g",
        "alpha",
        "ln_weight",
    ):  # positive, around the scale (alpha, g) or 1 (LayerNorm)
        centre = 1.0 if kind == "ln_weight" else scale
        return centre * (1.0 + 0.4 * (torch.rand(shape, generator=gen) - 0.5))
    x = torch.randn(shape, generator=gen)
    if kind == "linear":
        return x / math.sqrt(shape[-1])
    return x * scale if kind == "bias" else x


def random_state_dict(cfg: SnacConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of an official SNAC state dict for ``cfg``, random, deterministic in ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    specs = [*_encoder_specs(cfg), *_decoder_specs(cfg)]
    return {name: _init(shape, kind, scale, gen) for name, shape, kind, scale in specs}


def write_snac(
    out_dir: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    overrides: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` for ``preset`` ("full" or "tiny") into ``out_dir``.

    ``overrides`` replaces config fields (e.g. ``{"attn_window_size": 4}``).
    Returns ``out_dir``.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown SNAC preset {preset!r} (known: {', '.join(PRESETS)})")
    cfg = SnacConfig.from_dict(
        {**PRESETS[preset].to_dict(), **(overrides or {})}, source=f"preset {preset}"
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    save_file(random_state_dict(cfg, seed), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out
