"""/v1/embeddings: one request per input (run concurrently), each input's pooled features as one embedding.

A video model streams one pooled feature vector [1, E] per clip (``task`` "embedding"); the embedding of
an input is the mean of its clips' vectors. ``encoding_format`` base64 sends the little-endian float32
bytes, as OpenAI does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from typing import Any

import numpy as np

from walkserve.api.errors import bad_request
from walkserve.api.native.inputs import convert_inputs
from walkserve.api.openai.choices import audio_samples, failure
from walkserve.api.openai.plan import build_sampling
from walkserve.api.schemas.embeddings import EmbeddingsRequest
from walkserve.api.state import AppState
from walkserve.core.array import ArrayData
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import RequestFinished

ROUTE = "/v1/embeddings"
TASK = "embedding"


async def embeddings(state: AppState, body: EmbeddingsRequest) -> dict[str, Any]:
    state.require("embeddings", "embeddings", "model")
    if body.dimensions is not None:
        raise bad_request("this model's embeddings have one size; dimensions is not supported", "dimensions")
    items = body.input if isinstance(body.input, list) else [body.input]
    specs = []
    for i, item in enumerate(items):
        param = "input" if not isinstance(body.input, list) else f"input[{i}]"
        if isinstance(item, str):
            raise bad_request(f"model {state.card.id!r} embeds images and video, not text", param)
        inputs = await convert_inputs(state, {"video": item})
        try:
            spec = await state.build_request(TASK, {"inputs": inputs}, build_sampling(state.card, {}), dict(body.params))
        except Exception as e:  # the processor names its own field; say which input it was
            if getattr(e, "param", None) in ("video", "frames"):
                e.param = param
            raise
        specs.append(spec)
    vectors = await asyncio.gather(*(_pooled(state, spec) for spec in specs))
    data = [{"object": "embedding", "index": i, "embedding": _encode(v, body.encoding_format)} for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": state.card.id, "usage": {"prompt_tokens": 0, "total_tokens": 0}}


async def _pooled(state: AppState, spec) -> np.ndarray:
    """The mean of the request's per-clip pooled features: float32 [E]."""
    clips = []
    async with contextlib.aclosing(state.runner.events(spec, ROUTE)) as events:
        async for event in events:
            if isinstance(event, RequestFinished):
                if event.reason in (FinishReason.ERROR, FinishReason.ABORT):
                    raise failure(event)
                break
            if isinstance(event.data, ArrayData):
                clips.append(audio_samples(event.data))  # float32 [E] (any float dtype)
    return np.mean(clips, axis=0)


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
