"""ChoiceTracker: one choice's events -> text deltas, audio chunks and a finish reason."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from walkserve.api.errors import ApiError, scrub
from walkserve.api.merge import EventMerger
from walkserve.api.runner import Event, RequestRunner
from walkserve.api.text_stream import TextStream
from walkserve.core.array import ArrayData
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import RequestFinished
from walkserve.core.request import RequestSpec


def token_ids(value) -> list[int]:
    if isinstance(value, ArrayData):
        return [int(t) for t in value.tolist()]
    if isinstance(value, int):
        return [value]
    return [int(t) for t in value]


def audio_samples(value: ArrayData) -> np.ndarray:
    """An audio output as float32 [N] (mono; int16 is scaled to [-1, 1])."""
    if value.dtype == "bfloat16":
        bits = np.frombuffer(value.data, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(-1)
    array = np.frombuffer(value.data, dtype=np.dtype(value.dtype)).reshape(-1)
    if value.dtype == "int16":
        return array.astype(np.float32) / 32768.0
    return array.astype(np.float32, copy=False)


def failure(finished: RequestFinished) -> ApiError:
    if finished.reason == FinishReason.ABORT:
        return ApiError(503, f"request {finished.request_id} was aborted by the server", None, "aborted")
    detail = scrub(finished.error or "unknown error")
    return ApiError(500, f"request {finished.request_id} failed inside the runtime: {detail}", None, "request_failed")


@dataclass
class ChoiceUpdate:
    index: int
    text: str = ""
    audio: np.ndarray | None = None
    finish_reason: str | None = None


class ChoiceTracker:
    """Also counts the tokens the client received; ``group`` marks choices that share a prompt."""

    def __init__(self, index: int, text: TextStream, prompt_tokens: int | None, group: int = 0):
        self.index = index
        self.text = text
        self.prompt_tokens = prompt_tokens or 0
        self.group = group
        self.completion_tokens = 0
        self.finish_reason: str | None = None

    def on_event(self, event: Event) -> ChoiceUpdate | None:
        if isinstance(event, RequestFinished):
            return self._finish(event)
        if event.modality == "text":
            ids = token_ids(event.data)
            self.completion_tokens += len(ids)
            delta = self.text.push(ids)
            if self.text.stopped:
                self.finish_reason = "stop"
                return ChoiceUpdate(self.index, delta, finish_reason="stop")
            return ChoiceUpdate(self.index, delta) if delta else None
        if event.modality == "audio" and isinstance(event.data, ArrayData):
            return ChoiceUpdate(self.index, audio=audio_samples(event.data))
        return None

    def _finish(self, finished: RequestFinished) -> ChoiceUpdate:
        reported = (finished.usage or {}).get("prompt_tokens")
        if isinstance(reported, int):
            self.prompt_tokens = reported
        if finished.reason in (FinishReason.ERROR, FinishReason.ABORT):
            raise failure(finished)
        tail = self.text.flush()
        stopped = finished.reason == FinishReason.STOP or self.text.stopped
        self.finish_reason = "stop" if stopped else "length"
        return ChoiceUpdate(self.index, tail, finish_reason=self.finish_reason)


def usage(trackers: list[ChoiceTracker]) -> dict[str, int]:
    prompt = sum({t.group: t.prompt_tokens for t in trackers}.values())
    completion = sum(t.completion_tokens for t in trackers)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def drive_choices(
    runner: RequestRunner, specs: list[RequestSpec], trackers: list[ChoiceTracker], route: str
) -> AsyncIterator[ChoiceUpdate]:
    """Every choice's updates in arrival order; a choice that hits a stop string is aborted at once."""
    merger = EventMerger([runner.events(spec, route) for spec in specs])
    async with contextlib.aclosing(merger.items()) as items:
        async for index, event in items:
            update = trackers[index].on_event(event)
            if update is None:
                continue
            if update.finish_reason and not isinstance(event, RequestFinished):
                merger.close(index)
            yield update
