"""/v1/audio/transcriptions and /v1/audio/translations: a chat completion with the transcription prompt.

The route's form becomes the ``ChatCompletionRequest`` a client would send
(``transcription_prompt.py``), planned by ``plan_chat`` like any chat call, so
the transcript is that chat completion's answer, token for token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from walkserve.api.errors import bad_request
from walkserve.api.media.audio_decode import decode_audio
from walkserve.api.openai.chat import plan_chat
from walkserve.api.openai.choices import drive_choices
from walkserve.api.openai.text_plan import TextPlan
from walkserve.api.openai.transcription_prompt import language_name, transcription_messages
from walkserve.api.schemas.chat import ChatCompletionRequest
from walkserve.api.sse import sse
from walkserve.api.state import AppState

ROUTES = {"transcribe": "/v1/audio/transcriptions", "translate": "/v1/audio/translations"}
STREAMABLE = ("json", "text")


@dataclass
class TranscriptionForm:
    """What the route read from the multipart body."""

    task: str  # "transcribe" or "translate"
    audio: bytes
    filename: str | None
    model: str | None
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float
    stream: bool


@dataclass
class TranscriptionPlan:
    form: TranscriptionForm
    chat: TextPlan
    language: str | None  # the hint's English name
    duration: float  # seconds of audio

    @property
    def route(self) -> str:
        return ROUTES[self.form.task]


def chat_request(form: TranscriptionForm) -> ChatCompletionRequest:
    """The chat completion whose answer is the transcript (validated as a JSON body would be)."""
    suffix = PurePath(form.filename or "").suffix.lstrip(".").lower()
    messages = transcription_messages(form.task, form.audio, suffix[:16] or "wav", language_name(form.language), form.prompt)
    return ChatCompletionRequest.model_validate({"model": form.model, "messages": messages, "temperature": form.temperature})


async def plan_transcription(state: AppState, form: TranscriptionForm) -> TranscriptionPlan:
    state.require("chat", "audio transcription (it runs as a chat completion)")
    state.require("audio_in", "audio transcription (audio inputs)")
    if form.stream and form.response_format not in STREAMABLE:
        raise bad_request(f"stream=true sends transcript.text events; response_format {form.response_format!r} "
                          f"cannot be streamed (use {' or '.join(STREAMABLE)})", "stream", "unsupported_format")
    if not form.audio:
        raise bad_request("the file is empty", "file", "invalid_audio")
    body = chat_request(form)
    samples, rate = await asyncio.to_thread(decode_audio, form.audio, state.config.max_audio_seconds, "file")
    chat = await plan_chat(state, body)
    return TranscriptionPlan(form, chat, language_name(form.language), samples.numel / rate)


def transcription_usage(plan: TranscriptionPlan) -> dict[str, Any]:
    tracker = plan.chat.trackers[0]
    return {"type": "tokens", "input_tokens": tracker.prompt_tokens, "output_tokens": tracker.completion_tokens,
            "total_tokens": tracker.prompt_tokens + tracker.completion_tokens}


async def _text_deltas(state: AppState, plan: TranscriptionPlan) -> AsyncIterator[str]:
    updates = drive_choices(state.runner, plan.chat.specs, plan.chat.trackers, plan.route)
    async with contextlib.aclosing(updates):
        async for update in updates:
            if update.text:
                yield update.text


async def transcribe(state: AppState, plan: TranscriptionPlan) -> str:
    return "".join([delta async for delta in _text_deltas(state, plan)])


async def transcription_events(state: AppState, plan: TranscriptionPlan) -> AsyncIterator[bytes]:
    """OpenAI's transcription SSE: ``transcript.text.delta`` events, then ``transcript.text.done`` with usage."""
    parts = []
    async with contextlib.aclosing(_text_deltas(state, plan)) as deltas:
        async for delta in deltas:
            parts.append(delta)
            yield sse({"type": "transcript.text.delta", "delta": delta})
    yield sse({"type": "transcript.text.done", "text": "".join(parts), "usage": transcription_usage(plan)})
