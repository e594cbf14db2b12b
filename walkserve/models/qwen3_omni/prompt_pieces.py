"""A thinker prompt cut at its media into the prefill walks' inputs (torch-free; the processor's last step).

    ids    |<|im_start|>system ... user\\n<|audio_start|>|pad x 31|<|audio_end|><|vision_start|>|pad x 6|<|vision_end|>What? ... assistant\\n|
    walks   prefill_text (0)                             prefill_audio (1)   prefill_text (2)              prefill_vision (3)   prefill_text (4)     (last token -> thinker_decode)

Each piece carries its token ids and its [3, n] positions (``rope_index``); a
media piece also its encoder input. ``RequestSpec.inputs`` then holds
``walks`` (the walk names in order), ``step<k>.<slot>`` per piece,
``last`` (the last prompt token, decode's first input) and
``prompt_token_ids`` (the whole expanded prompt, for usage).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from walkserve.core.array import ArrayData
from walkserve.core.request import Value
from walkserve.models.llama.graph import PROMPT_INPUT
from walkserve.models.qwen3_omni.config import OmniTokenIds
from walkserve.models.qwen3_omni.graph import (
    GRID,
    LAST_INPUT,
    MEL,
    PIXELS,
    PREFILL_AUDIO,
    PREFILL_TEXT,
    PREFILL_VISION,
    WALKS_INPUT,
    step_key,
)
from walkserve.models.qwen3_omni.prompt import media_spans
from walkserve.models.qwen3_omni.thinker_request import ThinkerRequest


def array(x: np.ndarray) -> ArrayData:
    x = np.ascontiguousarray(x)
    return ArrayData(str(x.dtype), tuple(x.shape), x.tobytes())


def request_inputs(request: ThinkerRequest, tokens: OmniTokenIds) -> dict[str, Value]:
    """The RequestSpec inputs of one prompt: its pieces in order, the last token, the whole prompt."""
    ids = np.asarray(request.input_ids, dtype=np.int64)
    positions = request.positions.positions  # [3, T] int64 or float32
    end = len(ids) - 1  # the last token is decode's first input
    walks: list[str] = []
    out: dict[str, Value] = {PROMPT_INPUT: array(ids), LAST_INPUT: array(ids[end:])}

    def piece(walk: str, lo: int, hi: int, **media: ArrayData) -> None:
        k = len(walks)
        walks.append(walk)
        out[step_key(k, "tokens")] = array(ids[lo:hi])
        out[step_key(k, "positions")] = array(positions[:, lo:hi])
        out.update({step_key(k, slot): value for slot, value in media.items()})

    at = 0
    for span in media_spans(request.input_ids, tokens):
        if span.start > at:
            piece(PREFILL_TEXT, at, span.start)
        _media_piece(piece, request, span)
        at = span.end
    if end > at:
        piece(PREFILL_TEXT, at, end)
    out[WALKS_INPUT] = walks
    return out


def _media_piece(piece: Any, request: ThinkerRequest, span: Any) -> None:
    if span.kind == "audio":
        piece(PREFILL_AUDIO, span.start, span.end, **{MEL: array(request.audio[span.index].astype(np.float32))})
        return
    vision = request.images[span.index] if span.kind == "image" else request.videos[span.index].vision
    piece(PREFILL_VISION, span.start, span.end,
          **{PIXELS: array(vision.pixel_values.astype(np.float32)), GRID: array(np.asarray(vision.grid_thw, np.int64))})
