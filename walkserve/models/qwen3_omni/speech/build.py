"""``ComponentSpec.build`` bodies of the speech components (the worker imports this; torch)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from walkserve.engines.spec import BuildContext
from walkserve.models.common.checkpoint import SafetensorsCheckpoint
from walkserve.models.common.dtypes import torch_dtype
from walkserve.models.qwen3_omni.speech.code2wav_stream import Code2WavStream
from walkserve.models.qwen3_omni.speech.code_predictor import CodePredictor
from walkserve.models.qwen3_omni.speech.config import SpeechConfig
from walkserve.models.qwen3_omni.speech.graph import CODE2WAV, GLUE, PREDICTOR, TALKER
from walkserve.models.qwen3_omni.speech.nodes import TalkerGlue, TalkerLM, thinker_embedding
from walkserve.models.qwen3_omni.speech.weights import (
    load_code2wav,
    load_code_predictor,
    load_talker,
)

CODEC_TABLE = "talker.model.codec_embedding.weight"


def _dtype(ctx: BuildContext, path: str | Path) -> torch.dtype:
    return torch_dtype(ctx.dtype or None, SpeechConfig.from_file(path).dtype)


def build_talker(ctx: BuildContext, path: str | Path) -> TalkerLM:
    dtype, checkpoint = _dtype(ctx, path), SafetensorsCheckpoint(path)
    talker = load_talker(path, ctx.device, dtype, progress=False, checkpoint=checkpoint)
    predictor = load_code_predictor(path, ctx.device, dtype, progress=False, checkpoint=checkpoint)
    return TalkerLM(talker, thinker_embedding(path, ctx.device, dtype), predictor.model.embed_tokens).eval()


def build_code_predictor(ctx: BuildContext, path: str | Path) -> CodePredictor:
    return load_code_predictor(path, ctx.device, _dtype(ctx, path), progress=False)


def build_glue(ctx: BuildContext, path: str | Path) -> TalkerGlue:
    from safetensors import safe_open

    files = SafetensorsCheckpoint(path).files
    with safe_open(files[CODEC_TABLE], framework="pt", device="cpu") as f:
        table = f.get_tensor(CODEC_TABLE)
    embed = nn.Embedding.from_pretrained(table.to(ctx.device, _dtype(ctx, path)))  # frozen, and no random init first
    return TalkerGlue(SpeechConfig.from_file(path), embed).eval()


def build_code2wav(ctx: BuildContext, path: str | Path) -> Code2WavStream:
    return Code2WavStream(load_code2wav(path, ctx.device, "float32", progress=False))


BUILDERS = {TALKER: build_talker, PREDICTOR: build_code_predictor, GLUE: build_glue, CODE2WAV: build_code2wav}
