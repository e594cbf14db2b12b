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
class TokenLogprob:
    """One generated token with its log-probability and the ``k`` most likely tokens at its position."""

    token_id: int
    token: str  # its text; ``bytes:\\xNN...`` when its bytes are not whole UTF-8 characters (as OpenAI writes it)
    bytes: bytes
    logprob: float | None  # None for a prompt's first token (nothing precedes it)
    top: list[tuple[int, str, bytes, float]] | None  # (id, text, bytes, logprob), most likely first


@dataclass
class ChoiceUpdate:
    index: int
    text: str = ""
    audio: np.ndarray | None = None
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None  # the tokens behind ``text``, when the call asked for them
    prompt_logprobs: list[TokenLogprob] | None = None  # the prompt's tokens (echo with logprobs), once


class LogprobJoiner:
    """Pairs each text token with its ``logprobs`` events (same iteration) before the tracker sees it.

    The decode walk sends a token and its three logprob outputs in one pass, so
    all four parts of iteration k arrive before any part of k + 1; a token is
    released once its parts are all here. Parts are keyed by (walk, iteration),
    walks in the order they first send: a model whose prefill walk samples the
    first token (in a loop of its own, iteration 0) and whose decode walk then
    counts from 0 again keeps them apart.
    """

    PARTS = ("text", "logprob", "top_logprobs", "top_logprob_ids")

    def __init__(self, token_bytes):
        self.token_bytes = token_bytes  # id -> bytes
        self._names: dict[int, tuple[str, bytes]] = {}
        self._walks: dict[str, int] = {}
        self.pending: dict[tuple[int, ...], dict[str, object]] = {}

    def push(self, event) -> list[tuple[list[int], list[TokenLogprob]]]:
        part = "text" if event.modality == "text" else event.output
        walk = self._walks.setdefault(event.walk, len(self._walks))
        self.pending.setdefault((walk, *event.iteration), {})[part] = event.data
        ready = []
        for it in sorted(self.pending):
            parts = self.pending[it]
            if len(parts) < len(self.PARTS):
                break
            ready.append(self._join(self.pending.pop(it)))
        return ready

    def drain(self) -> list[tuple[list[int], list[TokenLogprob]]]:
        """Whatever is left at the end, in order (parts that never came count as missing)."""
        out = [self._join(self.pending.pop(it)) for it in sorted(self.pending) if "text" in self.pending[it]]
        self.pending.clear()
        return out

    def _join(self, parts: dict) -> tuple[list[int], list[TokenLogprob]]:
        ids = token_ids(parts["text"])
        if "logprob" not in parts:
            return ids, []
        lps = _floats(parts["logprob"])
        top_ids = token_ids(parts["top_logprob_ids"]) if "top_logprob_ids" in parts else []
        top_lps = _floats(parts["top_logprobs"]) if "top_logprobs" in parts else []
        top = [(t, *self._name(t), lp) for t, lp in zip(top_ids, top_lps, strict=False)]
        return ids, [TokenLogprob(t, *self._name(t), lp, top) for t, lp in zip(ids, lps, strict=False)]

    def _name(self, token_id: int) -> tuple[str, bytes]:
        """(text, bytes) of a token, cached per call."""
        name = self._names.get(token_id)
        if name is None:
            raw = self.token_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            name = self._names[token_id] = (text, raw)
        return name


PROMPT_PARTS = ("prompt_logprobs", "prompt_top_logprobs", "prompt_top_logprob_ids")


class PromptLogprobs:
    """Collects the prefill's three prompt-logprob outputs and names each prompt token (the first gets None)."""

    def __init__(self, joiner: LogprobJoiner, prompt_ids: list[int]):
        self.joiner, self.prompt_ids = joiner, prompt_ids
        self.parts: dict[str, object] = {}
        self.sent = False

    def first_only(self) -> list[TokenLogprob] | None:
        """A one-token prompt has no prefill: its entry (None) goes out with the first generated token."""
        if self.sent or len(self.prompt_ids) != 1:
            return None
        self.sent = True
        return [TokenLogprob(self.prompt_ids[0], *self.joiner._name(self.prompt_ids[0]), None, None)]

    def push(self, event) -> list[TokenLogprob] | None:
        self.parts[event.output] = event.data
        if len(self.parts) < len(PROMPT_PARTS):
            return None
        self.sent = True
        lps = _floats(self.parts["prompt_logprobs"])
        k = len(_floats(self.parts["prompt_top_logprobs"])) // max(len(lps), 1)
        top_ids = token_ids(self.parts["prompt_top_logprob_ids"])
        top_lps = _floats(self.parts["prompt_top_logprobs"])
        name = self.joiner._name
        entries = [TokenLogprob(self.prompt_ids[0], *name(self.prompt_ids[0]), None, None)]
        for i, (t, lp) in enumerate(zip(self.prompt_ids[1:], lps, strict=False)):
            top = [(j, *name(j), v) for j, v in zip(top_ids[i * k : (i + 1) * k], top_lps[i * k : (i + 1) * k], strict=False)]
            entries.append(TokenLogprob(t, *name(t), lp, top))
        return entries


def _floats(value) -> list[float]:
    return [float(x) for x in (value.tolist() if isinstance(value, ArrayData) else value)]


class ChoiceTracker:
    """Also counts the tokens the client received; ``group`` marks choices that share a prompt."""

    def __init__(self, index: int, text: TextStream, prompt_tokens: int | None, group: int = 0,
                 logprobs: LogprobJoiner | None = None, prompt: PromptLogprobs | None = None):
        self.index = index
        self.text = text
        self.prompt_tokens = prompt_tokens or 0
        self.group = group
        self.completion_tokens = 0
        self.audio_tokens = 0  # codec frames of a spoken answer (modality latent)
        self.finish_reason: str | None = None
        self.joiner = logprobs  # set when the call asked for logprobs
        self.prompt = prompt  # set when the call asked for the prompt's logprobs (echo)

    def on_event(self, event: Event) -> ChoiceUpdate | None:
        if isinstance(event, RequestFinished):
            return self._finish(event)
        if self.prompt is not None and event.modality == "logprobs" and event.output in PROMPT_PARTS:
            entries = self.prompt.push(event)
            return None if entries is None else ChoiceUpdate(self.index, prompt_logprobs=entries)
        if self.joiner is not None and event.modality in ("text", "logprobs"):
            return self._tokens(self.joiner.push(event))
        if event.modality == "text":
            return self._tokens([(token_ids(event.data), None)])
        if event.modality == "audio" and isinstance(event.data, ArrayData):
            return ChoiceUpdate(self.index, audio=audio_samples(event.data))
        if event.modality == "latent":
            self.audio_tokens += 1
        return None

    def _tokens(self, tokens: list[tuple[list[int], list[TokenLogprob] | None]]) -> ChoiceUpdate | None:
        """Text (and logprobs) for tokens that arrived, up to a stop string."""
        if self.text.stopped:
            return None  # already finished at a stop string
        delta, logprobs = [], []
        for ids, lps in tokens:
            if self.text.stopped:
                break
            self.completion_tokens += len(ids)
            delta.append(self.text.push(ids))
            logprobs += lps or []
        lps_out = logprobs if self.joiner is not None else None
        first = self.prompt.first_only() if self.prompt is not None else None
        if self.text.stopped:
            self.finish_reason = "stop"
            return ChoiceUpdate(self.index, "".join(delta), finish_reason="stop", logprobs=lps_out, prompt_logprobs=first)
        text = "".join(delta)
        if text or logprobs or first:
            return ChoiceUpdate(self.index, text, logprobs=lps_out, prompt_logprobs=first)
        return None

    def _finish(self, finished: RequestFinished) -> ChoiceUpdate:
        reported = (finished.usage or {}).get("prompt_tokens")
        if isinstance(reported, int):
            self.prompt_tokens = reported
        if finished.reason in (FinishReason.ERROR, FinishReason.ABORT):
            raise failure(finished)
        last = self._tokens(self.joiner.drain()) if self.joiner is not None else None
        text = last.text if last else ""
        lps = last.logprobs if last else ([] if self.joiner is not None else None)
        if self.text.stopped:
            self.finish_reason = "stop"
            return ChoiceUpdate(self.index, text, finish_reason="stop", logprobs=lps)
        tail = self.text.flush()
        stopped = finished.reason == FinishReason.STOP or self.text.stopped
        self.finish_reason = "stop" if stopped else "length"
        return ChoiceUpdate(self.index, text + tail, finish_reason=self.finish_reason, logprobs=lps)


def usage(trackers: list[ChoiceTracker]) -> dict[str, int]:
    prompt = sum({t.group: t.prompt_tokens for t in trackers}.values())
    completion = sum(t.completion_tokens for t in trackers)
    audio = sum(t.audio_tokens for t in trackers)
    if not audio:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {"prompt_tokens": prompt, "completion_tokens": completion + audio, "total_tokens": prompt + completion + audio,
            "completion_tokens_details": {"text_tokens": completion, "audio_tokens": audio}}


async def drive_choices(
    runner: RequestRunner, specs: list[RequestSpec], trackers: list[ChoiceTracker], route: str
) -> AsyncIterator[ChoiceUpdate]:
    """Every choice's updates in arrival order; a choice that hits a stop string is ended at once
    (as finished: the runtime stops it with the reason "stop")."""
    merger = EventMerger([runner.events(spec, route) for spec in specs])
    async with contextlib.aclosing(merger.items()) as items:
        async for index, event in items:
            update = trackers[index].on_event(event)
            if update is None:
                continue
            if update.finish_reason and not isinstance(event, RequestFinished):
                await runner.stop(specs[index])
                merger.close(index)
            yield update
