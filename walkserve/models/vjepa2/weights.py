"""Load V-JEPA 2 checkpoints (safetensors only) into our modules.

    HF layout (facebook/vjepa2-*):   config.json (VJEPA2Config) + model.safetensors
                                     encoder.* -> VisionEncoder, predictor.* -> MaskedPredictor
    converted AC (walkserve convert vjepa2-ac):
                                     config.json (model_type "vjepa2-ac") + model.safetensors
                                     (or shards + index) encoder.* -> VisionEncoder,
                                     predictor.* -> ACPredictor

A released ``.pt`` must be converted once first (``convert.py``): the server never unpickles.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from walkserve.core.errors import ConfigError
from walkserve.models.common.checkpoint import (
    SafetensorsCheckpoint,
    load_into,
    materialize,
    on_meta,
)
from walkserve.models.vjepa2.ac_predictor import ACPredictor
from walkserve.models.vjepa2.config import VJEPA2ACConfig, VJEPA2Config, read_config
from walkserve.models.vjepa2.encoder import VisionEncoder
from walkserve.models.vjepa2.masked_predictor import MaskedPredictor

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ENCODER_PREFIX, PREDICTOR_PREFIX = "encoder.", "predictor."


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError(f"unsupported weight dtype {name!r} (supported: {', '.join(DTYPES)})")
    return DTYPES[name]


def _load(module: nn.Module, path: Path, prefix: str, device: str | torch.device, dtype: str | torch.dtype,
          progress: bool) -> nn.Module:
    """Materialise a meta-built ``module`` and fill it from the checkpoint tensors under ``prefix``."""
    materialize(module, device, _dtype(dtype))
    ignored = getattr(module, "checkpoint_ignored", tuple)()
    load_into(module, SafetensorsCheckpoint(path), prefix=prefix, ignored=ignored, progress=progress)
    return module.eval()


def load_encoder(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                 progress: bool = False) -> VisionEncoder:
    """The video encoder of an HF V-JEPA 2 checkpoint or of a converted V-JEPA 2-AC one."""
    config = read_config(path)
    with on_meta():
        module = VisionEncoder(config.encoder)
    return _load(module, Path(path), ENCODER_PREFIX, device, dtype, progress)


def load_masked_predictor(path: str | Path, device: str | torch.device = "cpu",
                          dtype: str | torch.dtype = "float32", progress: bool = False) -> MaskedPredictor:
    """The masked predictor of an HF V-JEPA 2 checkpoint."""
    config = read_config(path)
    if not isinstance(config, VJEPA2Config):
        raise ConfigError(f"{path}: a V-JEPA 2-AC checkpoint has no masked predictor")
    with on_meta():
        module = MaskedPredictor(config.predictor, config.encoder)
    return _load(module, Path(path), PREDICTOR_PREFIX, device, dtype, progress)


def load_ac_predictor(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                      progress: bool = False) -> ACPredictor:
    """The action-conditioned predictor of a converted V-JEPA 2-AC checkpoint."""
    config = read_config(path)
    if not isinstance(config, VJEPA2ACConfig):
        raise ConfigError(f"{path}: not a converted V-JEPA 2-AC checkpoint (run `walkserve convert vjepa2-ac`)")
    with on_meta():
        module = ACPredictor(config.predictor)
    return _load(module, Path(path), PREDICTOR_PREFIX, device, dtype, progress)
