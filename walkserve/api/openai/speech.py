"""/v1/audio/speech: one speech request; a whole file, an encoded byte stream, or OpenAI's SSE events."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from walkserve.api.audio.formats import AudioFormat
from walkserve.api.errors import bad_request
from walkserve.api.openai.choices import audio_samples, failure
from walkserve.api.openai.plan import apply_default_max_tokens, build_sampling, prompt_length
from walkserve.api.schemas.speech import SpeechRequest
from walkserve.api.sse import sse
from walkserve.api.state import AppState
from walkserve.core.array import ArrayData
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import RequestFinished
from walkserve.core.request import RequestSpec

ROUTE = "/v1/audio/speech"


@dataclass
class SpeechPlan:
    spec: RequestSpec
    format: AudioFormat
    sample_rate: int
    input_tokens: int
    output_samples: int = 0


async def plan_speech(state: AppState, body: SpeechRequest) -> SpeechPlan:
    state.require("speech", "speech synthesis (/v1/audio/speech)")
    limit = state.config.max_speech_chars
    if len(body.input) > limit:
        raise bad_request(f"input has {len(body.input)} characters; the limit is {limit}", "input", "input_too_long")
    voice = state.check_voice(body.voice, "voice")
    name = body.response_format or state.audio.default()
    fmt = state.audio.get(name)
    if fmt is None:
        available = ", ".join(state.audio.names)
        raise bad_request(f"response_format {name!r} is not available here; available: {available}", "response_format", "unsupported_format")
    chosen = (("seed", body.seed), ("max_tokens", body.max_tokens), ("min_tokens", body.min_tokens))
    overrides = {k: v for k, v in chosen if v is not None}
    sampling = build_sampling(state.card, overrides)
    params = {"voice": voice, "speed": body.speed, **({"instructions": body.instructions} if body.instructions else {})}
    payload = {"input": body.input, "voice": voice, "speed": body.speed}
    spec = await state.build_request("speech", payload, sampling, params)  # fits max_tokens to the context
    apply_default_max_tokens(spec, state.card, body.max_tokens is not None)
    spec.audio_rate = int(state.card.sample_rate or 24000)
    spec.realtime = fmt.incremental  # streamed as it is made (SSE or chunked bytes): played as it arrives
    return SpeechPlan(spec, fmt, spec.audio_rate, prompt_length(spec) or 0)


async def speech_samples(state: AppState, plan: SpeechPlan) -> AsyncIterator[np.ndarray]:
    """The request's audio chunks as float32 [N]; a failed request raises its ApiError."""
    async with contextlib.aclosing(state.runner.events(plan.spec, ROUTE)) as events:
        async for event in events:
            if isinstance(event, RequestFinished):
                if event.reason in (FinishReason.ERROR, FinishReason.ABORT):
                    raise failure(event)
                return
            if event.modality == "audio" and isinstance(event.data, ArrayData):
                samples = audio_samples(event.data)
                plan.output_samples += len(samples)
                yield samples


async def speech_file(state: AppState, plan: SpeechPlan) -> bytes:
    parts = [chunk async for chunk in speech_samples(state, plan)]
    samples = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return await asyncio.to_thread(plan.format.encode, samples, plan.sample_rate)


async def speech_bytes(state: AppState, plan: SpeechPlan) -> AsyncIterator[bytes]:
    """Encoded bytes as they are produced (encoding runs in a worker thread)."""
    encoder = plan.format.stream(plan.sample_rate)
    pending = 0  # samples pushed whose bytes the encoder still holds
    async with contextlib.aclosing(speech_samples(state, plan)) as chunks:
        async for samples in chunks:
            data = await asyncio.to_thread(encoder.push, samples)
            pending += len(samples)
            if data:
                yield data
                state.runner.written(plan.spec.id, pending)  # the playback clock, as the client gets them
                pending = 0
    tail = await asyncio.to_thread(encoder.finish)
    if tail:
        yield tail


async def speech_events(state: AppState, plan: SpeechPlan) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE: ``speech.audio.delta`` events, then ``speech.audio.done`` with usage."""
    async with contextlib.aclosing(speech_bytes(state, plan)) as chunks:
        async for data in chunks:
            yield sse({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    usage = {"input_tokens": plan.input_tokens, "output_tokens": plan.output_samples, "total_tokens": plan.input_tokens + plan.output_samples}
    yield sse({"type": "speech.audio.done", "usage": usage})
