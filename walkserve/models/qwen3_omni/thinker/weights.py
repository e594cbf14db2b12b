"""Load the thinker's three components from a Qwen3-Omni checkpoint in the release layout.

The release is 15 shards + ``model.safetensors.index.json`` under three
prefixes: ``thinker.`` (``audio_tower``, ``visual``, ``model``, ``lm_head``),
``talker.`` and ``code2wav.``. Each loader reads only its own prefix, and
only the shards that hold it are opened: with speech off the talker and
Code2Wav tensors are never read. MoE experts are stored one tensor set per
expert and fused at load into the stacked ``gate_up`` / ``down`` weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from walkserve.core.errors import ConfigError
from walkserve.engines.spec import BuildContext
from walkserve.models.common.checkpoint import (
    SafetensorsCheckpoint,
    expected_shapes,
    load_into,
    materialize,
    on_meta,
)
from walkserve.models.common.dtypes import resolve_dtype
from walkserve.models.qwen3_omni.config import Qwen3OmniConfig
from walkserve.models.qwen3_omni.thinker.audio_encoder import AudioEncoder
from walkserve.models.qwen3_omni.thinker.lm import ThinkerLM
from walkserve.models.qwen3_omni.thinker.vision_encoder import VisionEncoder

THINKER_PREFIX = "thinker."
AUDIO_PREFIX = "thinker.audio_tower."
VISION_PREFIX = "thinker.visual."
SPEECH_PREFIXES = ("talker.", "code2wav.")
COMPONENT_PREFIXES = {"audio_encoder": AUDIO_PREFIX, "vision_encoder": VISION_PREFIX, "thinker": THINKER_PREFIX,
                      "talker": "talker.", "code2wav": "code2wav."}  # the first prefix that matches a name wins


@dataclass
class ThinkerComponents:
    """What serving the thinker needs: the LM (a KV-cache component) and its two encoders (stateless)."""

    config: Qwen3OmniConfig
    lm: ThinkerLM
    audio: AudioEncoder | None
    vision: VisionEncoder | None


def thinker_tensor_shapes(config: Qwen3OmniConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every ``thinker.*`` tensor the modules read (no weights allocated)."""
    with on_meta():
        out = expected_shapes(ThinkerLM(config.text), THINKER_PREFIX)
        if config.audio is not None:
            out.update(expected_shapes(AudioEncoder(config.audio), AUDIO_PREFIX))
        if config.vision is not None:
            out.update(expected_shapes(VisionEncoder(config.vision), VISION_PREFIX))
    return out


def load_thinker(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                 progress: bool = True, config: Qwen3OmniConfig | None = None) -> ThinkerLM:
    """The thinker LM (``thinker.model.*``, ``thinker.lm_head``), eval mode."""
    config = config or Qwen3OmniConfig.from_file(path)
    checkpoint = SafetensorsCheckpoint(path)
    encoders = [n[len(THINKER_PREFIX):] for n in checkpoint.names() if n.startswith((AUDIO_PREFIX, VISION_PREFIX))]
    with on_meta():
        lm = ThinkerLM(config.text)
    return _load(lm, checkpoint, THINKER_PREFIX, config, device, dtype, progress, ignored=encoders)


def load_audio_encoder(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                       progress: bool = True, config: Qwen3OmniConfig | None = None) -> AudioEncoder:
    """The audio encoder (``thinker.audio_tower.*``). Raises ConfigError for a checkpoint without one."""
    config = config or Qwen3OmniConfig.from_file(path)
    if config.audio is None:
        raise ConfigError(f"{path}: this checkpoint has no audio encoder")
    with on_meta():
        module = AudioEncoder(config.audio)
    return _load(module, SafetensorsCheckpoint(path), AUDIO_PREFIX, config, device, dtype, progress)


def load_vision_encoder(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                        progress: bool = True, config: Qwen3OmniConfig | None = None) -> VisionEncoder:
    """The vision encoder (``thinker.visual.*``). Raises ConfigError for a checkpoint without one."""
    config = config or Qwen3OmniConfig.from_file(path)
    if config.vision is None:
        raise ConfigError(f"{path}: this checkpoint has no vision encoder")
    with on_meta():
        module = VisionEncoder(config.vision)
    return _load(module, SafetensorsCheckpoint(path), VISION_PREFIX, config, device, dtype, progress)


def load_thinker_components(path: str | Path, device: str | torch.device = "cpu",
                            dtype: str | torch.dtype | None = None, progress: bool = True) -> ThinkerComponents:
    """The LM and whichever encoders the checkpoint has; reads ``thinker.*`` only."""
    config = Qwen3OmniConfig.from_file(path)
    kw = dict(device=device, dtype=dtype, progress=progress, config=config)
    return ThinkerComponents(
        config=config,
        lm=load_thinker(path, **kw),
        audio=load_audio_encoder(path, **kw) if config.audio is not None else None,
        vision=load_vision_encoder(path, **kw) if config.vision is not None else None,
    )


def estimate_weight_bytes(path: str | Path, dtype: str | torch.dtype | None = None, speech: bool = False) -> int:
    """Bytes the weights take once loaded at ``dtype``: the thinker's (LM and encoders), plus the talker's and
    Code2Wav's with ``speech`` (from the file headers only)."""
    parts = weight_bytes_by_component(path, dtype)
    names = ("thinker", "audio_encoder", "vision_encoder") + (("talker", "code2wav") if speech else ())
    return sum(parts.get(n, 0) for n in names)


def weight_bytes_by_component(path: str | Path, dtype: str | torch.dtype | None = None) -> dict[str, int]:
    """``{"thinker" (the LM), "audio_encoder", "vision_encoder", "talker", "code2wav": bytes at dtype}``
    for the placement's memory check, from the file headers only."""
    config = Qwen3OmniConfig.from_file(path)
    itemsize = torch.empty((), dtype=resolve_dtype(dtype, config)).element_size()
    out: dict[str, int] = {}
    for name, (shape, _) in SafetensorsCheckpoint(path).shapes().items():
        part = next((c for c, prefix in COMPONENT_PREFIXES.items() if name.startswith(prefix)), None)
        if part is not None:
            out[part] = out.get(part, 0) + _numel(shape) * itemsize
    return out


def build_thinker(ctx: BuildContext, path: str | Path) -> ThinkerLM:
    """The ``ComponentSpec.build`` body of the thinker LM: load on the context's device and dtype."""
    return load_thinker(path, ctx.device, ctx.dtype or None, progress=False)


def build_audio_encoder(ctx: BuildContext, path: str | Path) -> AudioEncoder:
    return load_audio_encoder(path, ctx.device, ctx.dtype or None, progress=False)


def build_vision_encoder(ctx: BuildContext, path: str | Path) -> VisionEncoder:
    return load_vision_encoder(path, ctx.device, ctx.dtype or None, progress=False)


def _load(module: nn.Module, checkpoint: SafetensorsCheckpoint, prefix: str, config: Qwen3OmniConfig,
          device: str | torch.device, dtype: str | torch.dtype | None, progress: bool, ignored: list[str] = ()):
    materialize(module, device, resolve_dtype(dtype, config))
    load_into(module, checkpoint, prefix=prefix, ignored=ignored, progress=progress)
    return module.eval()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
