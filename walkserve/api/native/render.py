"""One OutputEvent as a JSON-able dict for the NDJSON stream."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np

from walkserve.api.audio.pcm import pcm16
from walkserve.api.media.image_codec import encode_image
from walkserve.api.openai.choices import audio_samples
from walkserve.core.array import ArrayData
from walkserve.core.outputs import OutputEvent


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def raw_array(value: ArrayData) -> dict[str, Any]:
    return {"dtype": value.dtype, "shape": list(value.shape), "data": _b64(value.data)}


def render_action(value: ArrayData) -> dict[str, Any]:
    """An action chunk [H, action_dim]: the numbers as nested lists (``actions``), and the raw array too."""
    array = np.frombuffer(value.data, dtype=value.dtype).reshape(value.shape)
    return {"actions": plain(array.tolist()), **raw_array(value)}


def render_audio(value: ArrayData, encoding: str, sample_rate: int | None) -> dict[str, Any]:
    samples = audio_samples(value)
    data = pcm16(samples) if encoding == "pcm16" else samples.astype("<f4").tobytes()
    return {"encoding": encoding, "sample_rate": sample_rate, "samples": len(samples), "data": _b64(data)}


async def render_image(value: ArrayData, image_format: str) -> dict[str, Any]:
    if image_format == "raw":
        return {"format": "raw", **raw_array(value)}
    png = await asyncio.to_thread(encode_image, value, "png")
    return {"format": "png", "shape": list(value.shape), "data": _b64(png)}


def event_head(event: OutputEvent) -> dict[str, Any]:
    return {
        "type": "output",
        "request_id": event.request_id,
        "modality": event.modality,
        "index": event.index,
        "iteration": list(event.iteration),
        "walk": event.walk,
        "node": event.node,
        "output": event.output,
    }


def plain(value: Any) -> Any:
    """A JSON-safe copy: non-finite floats become null (strict JSON has no NaN), containers recurse."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
