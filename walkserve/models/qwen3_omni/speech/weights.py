"""Load the speech components of a Qwen3-Omni checkpoint (the release's sharded layout) into our modules.

    talker.{model.*, codec_head, text_projection, hidden_projection}  -> Talker         (experts fused at load)
    talker.code_predictor.{model.*, lm_head.0-14}                     -> CodePredictor  (15 groups stacked)
    code2wav.*                                                        -> Code2Wav
    thinker.model.embed_tokens rows tts_bos, tts_eos, tts_pad         -> TextSpecials   (3 rows, read as slices)

Only these prefixes are read (the thinker's 60 GB stay on disk). Each
loader checks names and shapes against the module and raises ConfigError
naming what is missing, unexpected or mis-shaped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
from walkserve.models.common.dtypes import torch_dtype
from walkserve.models.common.safetensors_files import ITEMSIZE
from walkserve.models.qwen3_omni.speech.code2wav import Code2Wav
from walkserve.models.qwen3_omni.speech.code_predictor import CodePredictor
from walkserve.models.qwen3_omni.speech.config import SpeechConfig
from walkserve.models.qwen3_omni.speech.talker import Talker
from walkserve.models.qwen3_omni.speech.talker_inputs import TextSpecials

TALKER, PREDICTOR, CODE2WAV = "talker.", "talker.code_predictor.", "code2wav."
THINKER_EMBED = "thinker.model.embed_tokens.weight"
def _load(module: nn.Module, checkpoint: SafetensorsCheckpoint, prefix: str, device, dtype: torch.dtype,
          skip: str | None = None, progress: bool = True) -> nn.Module:
    materialize(module, device, dtype)
    ignored = [n[len(prefix):] for n in checkpoint.names() if skip and n.startswith(skip)]
    load_into(module, checkpoint, prefix=prefix, ignored=ignored, progress=progress)
    return module.eval()


def load_talker(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                progress: bool = True, checkpoint: SafetensorsCheckpoint | None = None) -> Talker:
    """The talker MoE LM with its head and projections (``dtype`` default: the checkpoint's)."""
    config = SpeechConfig.from_file(path)
    with on_meta():
        talker = Talker(config.talker)
    return _load(talker, checkpoint or SafetensorsCheckpoint(path), TALKER, device,
                 torch_dtype(dtype, config.dtype), skip=PREDICTOR, progress=progress)


def load_code_predictor(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                        progress: bool = True, checkpoint: SafetensorsCheckpoint | None = None) -> CodePredictor:
    """The code predictor, its 15 embeddings and heads stacked (``dtype`` default: the checkpoint's)."""
    config = SpeechConfig.from_file(path)
    with on_meta():
        predictor = CodePredictor(config.code_predictor)
    return _load(predictor, checkpoint or SafetensorsCheckpoint(path), PREDICTOR, device,
                 torch_dtype(dtype, config.dtype), progress=progress)


def load_code2wav(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = "float32",
                  progress: bool = True, checkpoint: SafetensorsCheckpoint | None = None) -> Code2Wav:
    """The vocoder (``dtype`` default float32: it is small and its output is what users hear)."""
    config = SpeechConfig.from_file(path)
    with on_meta():
        vocoder = Code2Wav(config.code2wav)
    return _load(vocoder, checkpoint or SafetensorsCheckpoint(path), CODE2WAV, device,
                 torch_dtype(dtype, config.dtype), progress=progress)


def load_text_specials(talker: Talker, path: str | Path, checkpoint: SafetensorsCheckpoint | None = None
                       ) -> TextSpecials:
    """text_projection of the thinker embeddings of tts_bos, tts_eos, tts_pad (3 rows read, not the table)."""
    from safetensors import safe_open

    tokens = SpeechConfig.from_file(path).tokens
    checkpoint = checkpoint or SafetensorsCheckpoint(path)
    if THINKER_EMBED not in checkpoint.files:
        raise ConfigError(f"{path}: missing tensor {THINKER_EMBED!r} (the tts_* text embeddings)")
    weight = talker.text_projection.linear_fc1.weight
    with safe_open(checkpoint.files[THINKER_EMBED], framework="pt", device="cpu") as f:
        table = f.get_slice(THINKER_EMBED)
        rows = torch.stack([table[i : i + 1][0] for i in (tokens.tts_bos, tokens.tts_eos, tokens.tts_pad)])
    with torch.no_grad():
        return TextSpecials.project(talker, rows.to(weight.device, weight.dtype))  # [3, Dt] -> 3 x [D]


@dataclass
class SpeechModules:
    """Everything the offline speech loop (and phase 2's components) needs, loaded once."""

    config: SpeechConfig
    talker: Talker
    predictor: CodePredictor
    code2wav: Code2Wav
    specials: TextSpecials


def load_speech(path: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                code2wav_dtype: str | torch.dtype | None = "float32", progress: bool = True) -> SpeechModules:
    """Talker, code predictor, Code2Wav and the tts_* specials of checkpoint ``path``."""
    checkpoint = SafetensorsCheckpoint(path)
    talker = load_talker(path, device, dtype, progress, checkpoint)
    return SpeechModules(
        config=SpeechConfig.from_file(path),
        talker=talker,
        predictor=load_code_predictor(path, device, dtype, progress, checkpoint),
        code2wav=load_code2wav(path, device, code2wav_dtype, progress, checkpoint),
        specials=load_text_specials(talker, path, checkpoint),
    )


def speech_weight_bytes(path: str | Path, dtype: str | None = None) -> dict[str, int]:
    """Bytes per speech component (``talker``, ``code_predictor``, ``code2wav``): as stored, or at ``dtype``.

    Read from the file headers only, for the placement's memory check.
    """
    itemsize = torch.empty((), dtype=torch_dtype(dtype, "float32")).element_size() if dtype else None
    out = {"talker": 0, "code_predictor": 0, "code2wav": 0}
    for name, (shape, stored) in SafetensorsCheckpoint(path).shapes().items():
        key = ("code_predictor" if name.startswith(PREDICTOR) else "talker" if name.startswith(TALKER)
               else "code2wav" if name.startswith(CODE2WAV) else None)
        if key:
            out[key] += math.prod(shape) * (itemsize or ITEMSIZE.get(stored, 4))
    return out
