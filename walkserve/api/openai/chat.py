"""/v1/chat/completions: plan the requests, then stream OpenAI chunks or build one response."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from walkserve.api.audio.pcm import pcm16_base64
from walkserve.api.errors import bad_request
from walkserve.api.openai.chat_input import convert_messages
from walkserve.api.openai.choices import (
    ChoiceTracker,
    ChoiceUpdate,
    TokenLogprob,
    drive_choices,
    usage,
)
from walkserve.api.openai.plan import (
    apply_default_max_tokens,
    build_choices,
    build_sampling,
    check_n,
    check_stops,
    include_usage,
    logprob_joiner,
    prompt_length,
    unsupported,
)
from walkserve.api.openai.text_plan import AudioOut, TextPlan
from walkserve.api.schemas.chat import ChatCompletionRequest
from walkserve.api.sse import SSE_DONE, sse
from walkserve.api.state import AppState
from walkserve.api.text_stream import TextStream

ROUTE = "/v1/chat/completions"


def _reject_unsupported(body: ChatCompletionRequest) -> None:
    if body.top_logprobs is not None and not body.logprobs:
        raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
    if body.tools:
        raise unsupported("tools", "tool calling")
    if body.response_format and body.response_format.get("type") not in (None, "text"):
        raise unsupported("response_format", "structured output")


def _audio_out(state: AppState, body: ChatCompletionRequest) -> AudioOut | None:
    if "audio" not in (body.modalities or ["text"]):
        return None
    state.require("audio_out", "audio output", "modalities")
    if body.audio is None:
        raise bad_request("modalities includes 'audio': the 'audio' object (voice, format) is required", "audio")
    voice = state.check_voice(body.audio.voice, "audio.voice")
    fmt = state.audio.get(body.audio.format)
    if fmt is None:
        raise bad_request(f"audio format {body.audio.format!r} is not available; available: {', '.join(state.audio.names)}", "audio.format", "unsupported_format")
    if body.stream and fmt.name != "pcm":
        raise bad_request("streamed chat audio is sent as pcm16; set audio.format to 'pcm16'", "audio.format", "unsupported_format")
    return AudioOut(voice, fmt, [f"audio_{secrets.token_hex(8)}" for _ in range(body.n)])


async def plan_chat(state: AppState, body: ChatCompletionRequest, messages: list[dict[str, Any]] | None = None) -> TextPlan:
    """The requests of one chat call. ``messages``: the conversation already in the processor's shape (the
    realtime route's items, whose audio is decoded already); None converts ``body.messages``."""
    _reject_unsupported(body)
    check_n(body.n, state.config)
    with_usage = include_usage(body.stream, body.stream_options)
    stops = body.stop_strings()
    check_stops(stops, state.config)
    audio = _audio_out(state, body)
    payload: dict[str, Any] = {"messages": messages if messages is not None else await convert_messages(state, body.messages)}
    payload["modalities"] = ["text", "audio"] if audio else ["text"]
    explicit = body.max_completion_tokens or body.max_tokens
    overrides = body.sampling_overrides() | {"max_tokens": explicit}
    if body.logprobs:
        overrides["logprobs"] = body.top_logprobs or 0
    sampling = build_sampling(state.card, overrides, stops)
    params = {"voice": audio.voice} if audio and audio.voice else {}
    if body.think is not None:
        params["think"] = body.think
    if audio and body.audio is not None:
        params |= {k: v for k, v in (("max_audio_frames", body.audio.max_frames),
                                     ("node_sampling", body.audio.node_sampling)) if v is not None}
    specs, trackers = [], []
    for i, spec in enumerate(await build_choices(state, "chat", payload, sampling, params, body.n)):
        apply_default_max_tokens(spec, state.card, explicit is not None)
        if audio:
            spec.audio_rate, spec.realtime = int(state.card.sample_rate or 24000), bool(body.stream)
        text = TextStream(state.processor.detokenizer(body.skip_special_tokens), stops)
        specs.append(spec)
        joiner = logprob_joiner(state, "logprobs") if body.logprobs else None
        trackers.append(ChoiceTracker(i, text, prompt_length(spec), logprobs=joiner))
    return TextPlan(body.model or state.card.id, specs, trackers, with_usage, audio)


class ChatChunks:
    """The chunk shapes of one streamed chat completion."""

    def __init__(self, plan: TextPlan):
        self.plan = plan

    def chunk(self, choices: list[dict[str, Any]], usage_value: Any = None) -> dict[str, Any]:
        out = {
            "id": f"chatcmpl-{self.plan.id}",
            "object": "chat.completion.chunk",
            "created": self.plan.created,
            "model": self.plan.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.plan.include_usage:
            out["usage"] = usage_value
        return out

    @staticmethod
    def choice(index: int, delta: dict[str, Any], finish_reason: str | None = None,
               logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def role(self, index: int) -> dict[str, Any]:
        return self.chunk([self.choice(index, {"role": "assistant", "content": "" if not self.plan.audio else None})])

    def deltas(self, update: ChoiceUpdate) -> list[dict[str, Any]]:
        audio = self.plan.audio
        out = []
        if update.text or update.logprobs:
            delta = {"audio": {"id": audio.ids[update.index], "transcript": update.text}} if audio else {"content": update.text}
            logprobs = chat_logprobs(update.logprobs) if update.logprobs else None
            out.append(self.chunk([self.choice(update.index, delta, logprobs=logprobs)]))
        if update.audio is not None and audio is not None and len(update.audio):
            data = pcm16_base64(update.audio)
            out.append(self.chunk([self.choice(update.index, {"audio": {"id": audio.ids[update.index], "data": data}})]))
        if update.finish_reason:
            out.append(self.chunk([self.choice(update.index, {}, update.finish_reason)]))
        return out


def _token(text: str, raw: bytes, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """The chat ``logprobs`` object: per token its text, logprob, bytes and top alternatives."""
    content = [{**_token(e.token, e.bytes, e.logprob), "top_logprobs": [_token(*t[1:]) for t in e.top]}
               for e in entries]
    return {"content": content, "refusal": None}


async def chat_stream(state: AppState, plan: TextPlan) -> AsyncIterator[bytes]:
    chunks = ChatChunks(plan)
    started = False
    updates = drive_choices(state.runner, plan.specs, plan.trackers, ROUTE)
    async with contextlib.aclosing(updates):
        async for update in updates:
            if not started:
                started = True
                yield b"".join(sse(chunks.role(i)) for i in range(len(plan.trackers)))
            for chunk in chunks.deltas(update):
                yield sse(chunk)
            if update.audio is not None and plan.audio is not None:
                state.runner.written(plan.specs[update.index].id, len(update.audio))
    if plan.include_usage:
        yield sse(chunks.chunk([], usage(plan.trackers)))
    yield SSE_DONE


def _message(plan: TextPlan, tracker: ChoiceTracker, text: str, encoded: bytes | None) -> dict[str, Any]:
    if plan.audio is None:
        return {"role": "assistant", "content": text}
    return {
        "role": "assistant",
        "content": None,
        "audio": {
            "id": plan.audio.ids[tracker.index],
            "data": base64.b64encode(encoded or b"").decode(),
            "expires_at": int(time.time()) + 3600,
            "transcript": text,
        },
    }


async def _encode_audio(state: AppState, plan: TextPlan, parts: list[np.ndarray]) -> bytes | None:
    if plan.audio is None:
        return None
    samples = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return await asyncio.to_thread(plan.audio.format.encode, samples, state.card.sample_rate)


async def chat_collect(state: AppState, plan: TextPlan) -> dict[str, Any]:
    texts: list[list[str]] = [[] for _ in plan.trackers]
    audio: list[list[np.ndarray]] = [[] for _ in plan.trackers]
    entries: list[list[TokenLogprob]] = [[] for _ in plan.trackers]
    async with contextlib.aclosing(drive_choices(state.runner, plan.specs, plan.trackers, ROUTE)) as updates:
        async for update in updates:
            texts[update.index].append(update.text)
            entries[update.index] += update.logprobs or []
            if update.audio is not None:
                audio[update.index].append(update.audio)
    choices = []
    for tracker in plan.trackers:
        encoded = await _encode_audio(state, plan, audio[tracker.index])
        message = _message(plan, tracker, "".join(texts[tracker.index]), encoded)
        logprobs = chat_logprobs(entries[tracker.index]) if tracker.joiner is not None else None
        choices.append({"index": tracker.index, "message": message, "logprobs": logprobs, "finish_reason": tracker.finish_reason})
    return {
        "id": f"chatcmpl-{plan.id}",
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage(plan.trackers),
    }
