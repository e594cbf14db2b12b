"""Random-weight V-JEPA 2 checkpoints for tests, demos and benchmarks.

``write_tiny_vjepa2(dir)`` writes the HF layout (config.json with
``VJEPA2Config`` fields + model.safetensors, loadable by transformers'
``VJEPA2Model.from_pretrained``); ``write_tiny_vjepa2_ac(dir)`` writes the
layout ``walkserve convert vjepa2-ac`` produces. The weights are random but
*perturbed* (weights ~ N(0, 1/fan_in), biases, norms and mask tokens with
noise) so that every tensor visibly shapes the output; the config says
``walkserve_random_weights: true``.

Presets: ``tiny`` (64² crops, 16 tokens per frame, two-layer stacks) and, for
the AC model, ``bench`` (128² crops: 64 tokens per frame; predictor width
256, 8 blocks).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from walkserve.core.errors import ConfigError
from walkserve.models.common.checkpoint import expected_shapes, on_meta
from walkserve.models.vjepa2.ac_predictor import IGNORED, ACPredictor
from walkserve.models.vjepa2.config import (
    ACTION_DIM,
    CONFIG_FILE,
    RANDOM_WEIGHTS_KEY,
    ACPredictorConfig,
    EncoderConfig,
    MaskedPredictorConfig,
    ViTShape,
    VJEPA2ACConfig,
    VJEPA2Config,
)
from walkserve.models.vjepa2.encoder import VisionEncoder
from walkserve.models.vjepa2.masked_predictor import MaskedPredictor

WEIGHTS_FILE = "model.safetensors"
TINY_ENCODER = EncoderConfig(ViTShape(128, 2, 2, 512), crop_size=64, frames_per_clip=4)
VJEPA2_PRESETS = {"tiny": VJEPA2Config(TINY_ENCODER, MaskedPredictorConfig(ViTShape(64, 2, 2, 256)))}
AC_PRESETS = {
    "tiny": VJEPA2ACConfig(TINY_ENCODER, ACPredictorConfig(64, 2, 2, 256, input_size=128, grid_size=4)),
    "bench": VJEPA2ACConfig(EncoderConfig(ViTShape(128, 2, 2, 512), crop_size=128),
                            ACPredictorConfig(256, 8, 4, 1024, input_size=128, grid_size=8)),
}


def _value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen)
    if name.endswith("mask_tokens"):
        return 0.5 * noise
    if name.endswith(".bias"):
        return 0.1 * noise
    if len(shape) == 1:  # a LayerNorm weight
        return 1.0 + 0.1 * noise
    return noise / math.sqrt(math.prod(shape[1:]))  # a linear or conv weight: N(0, 1/fan_in)


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """Checkpoint name -> perturbed random float32 tensor, drawn in sorted-name order (deterministic per seed)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: _value(name, shapes[name], gen).contiguous() for name in sorted(shapes)}


def _preset(presets: dict, preset: str, family: str):
    if preset not in presets:
        raise ConfigError(f"{family} has presets {', '.join(presets)}, not {preset!r}")
    return presets[preset]


def write_tiny_vjepa2(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """An HF-layout V-JEPA 2 checkpoint (encoder + masked predictor) with random weights."""
    config = _preset(VJEPA2_PRESETS, preset, "vjepa2")
    with on_meta():
        shapes = {**expected_shapes(VisionEncoder(config.encoder), "encoder."),
                  **expected_shapes(MaskedPredictor(config.predictor, config.encoder), "predictor.")}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps({**config.to_hf(), RANDOM_WEIGHTS_KEY: True}, indent=2) + "\n")
    save_file(random_tensors(shapes, seed), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out


def write_tiny_vjepa2_ac(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """A converted-layout V-JEPA 2-AC checkpoint (encoder + AC predictor) with random weights."""
    config = _preset(AC_PRESETS, preset, "vjepa2-ac")
    d = config.predictor.hidden_size
    with on_meta():
        shapes = {**expected_shapes(VisionEncoder(config.encoder), "encoder."),
                  **expected_shapes(ACPredictor(config.predictor), "predictor.")}
    shapes["predictor." + IGNORED[0]] = (d, ACTION_DIM - 1)  # the unused extrinsics encoder, as released
    shapes["predictor." + IGNORED[1]] = (d,)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = VJEPA2ACConfig(config.encoder, config.predictor, source=f"random ({preset})", random_weights=True)
    (out / CONFIG_FILE).write_text(json.dumps(meta.to_dict(), indent=2) + "\n")
    save_file(random_tensors(shapes, seed), str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out
