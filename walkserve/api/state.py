"""AppState: what every route shares (engine, config, card, metrics, drain, media, audio formats)."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from starlette.requests import Request

from walkserve.api.audio.formats import AudioFormats
from walkserve.api.config import ServerConfig
from walkserve.api.drain import DrainState
from walkserve.api.errors import ApiError, bad_request, unavailable
from walkserve.api.media.loader import MediaLoader
from walkserve.api.metrics import ApiMetrics
from walkserve.api.processor_lanes import ProcessorLanes
from walkserve.api.runner import RequestRunner
from walkserve.core.request import RequestSpec
from walkserve.core.sampling import SamplingParams
from walkserve.entrypoint.interface import EngineClient, Health
from walkserve.models.processor import ModelCard

AUDIO_CAPS = ("speech", "audio_out")
KV_RECHECK_S = 0.5  # how long the runtime's KV pools, read from its workers' reports, are taken as read
log = logging.getLogger(__name__)


class AppState:
    def __init__(self, engine: EngineClient, config: ServerConfig):
        self.engine = engine
        self.config = config
        self.card = card_with_defaults(engine.card, config)
        self.processor = engine.processor
        self.drain = DrainState()
        self.metrics = ApiMetrics(engine, lambda: self.drain.draining)
        speaks = any(cap in self.card.capabilities for cap in AUDIO_CAPS)
        self.audio = AudioFormats(self.card.sample_rate if speaks else None)
        self.media = MediaLoader(config)
        self.runner = RequestRunner(engine, self.metrics, self.card.sample_rate, config.stream_startup_buffer_s)
        self.realtime_sessions: set[Any] = set()  # open /v1/realtime sessions (api/realtime/socket.py)
        self.lanes = ProcessorLanes()  # processor calls (templates, tokenization): off the event loop, big ones apart
        self._warned_pool: int | None = None
        self._kv_read: tuple[float, int | None] = (float("-inf"), None)  # (when, what) kv_tokens last read

    def kv_tokens(self) -> int | None:
        """What the runtime's smallest KV pool holds, in tokens (its workers' reports; None before the first, or
        with no KV engine). One request's context cannot outgrow it: the served context is at most this. Read
        from the reports at most every ``KV_RECHECK_S``: every request asks."""
        read_at, tokens = self._kv_read
        now = time.monotonic()
        if now - read_at < KV_RECHECK_S:
            return tokens
        tokens = self._smallest_pool()
        self._kv_read = (now, tokens)
        return tokens

    def _smallest_pool(self) -> int | None:
        try:
            pools = [e["kv_tokens_total"] for e in self.engine.stats().engine_ranks.values() if "kv_tokens_total" in e]
        except Exception:  # a runtime that cannot report: requests are fitted to the model's context alone
            return None
        if not pools:
            return None
        tokens = int(min(pools))
        if tokens < self.card.max_context and tokens != self._warned_pool:
            self._warned_pool = tokens
            log.warning("a KV pool holds %d tokens, fewer than the model's context of %d: requests are fitted to %d "
                        "(raise --kv-blocks, or the engine's kv_bytes, to serve more)", tokens, self.card.max_context, tokens)
        return tokens

    def served_context(self) -> int:
        """The model's context, or less where a KV pool holds less (``kv_tokens``): what /v1/models reports."""
        tokens = self.kv_tokens()
        return self.card.max_context if tokens is None else min(tokens, self.card.max_context)

    async def build_request(
        self, task: str, payload: dict[str, Any], sampling: SamplingParams, params: dict[str, Any]
    ) -> RequestSpec:
        """The processor's request, built in a processor lane; a prompt whose length alone shows it cannot fit
        the served context is refused first, here, before it waits for a lane or is tokenized."""
        processor = self.processor
        processor.kv_tokens = self.kv_tokens()  # fitted to the pool too: a context that outgrew it would fail halfway
        processor.check_prompt_size(task, payload)

        def build() -> RequestSpec:  # the parameters are checked against the model's struct first
            return processor.build_request(task, payload, sampling, processor.check_params(dict(params)))

        return await self.lanes.run(payload, build)

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.card.id, *self.config.model_aliases)

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise ApiError(404, f"model {name!r} is not served here; this server serves {self.card.id!r}", "model", "model_not_found")

    def require(self, capability: str, what: str, param: str = "model") -> None:
        if capability not in self.card.capabilities:
            why = self.card.unsupported.get(capability)
            raise bad_request(f"model {self.card.id!r} does not support {what}" + (f": {why}" if why else ""), param,
                              "unsupported_capability")

    def health(self) -> Health:
        """The engine's report; an engine that cannot even answer counts as stopped."""
        try:
            return self.engine.health()
        except Exception as e:
            return Health(ok=False, state="stopped", detail=f"health check failed: {type(e).__name__}")

    def check_ready(self) -> None:
        if self.drain.draining:
            raise unavailable("the server is shutting down", "draining")
        health = self.health()
        if not health.ok:
            raise unavailable(f"the model runtime is {health.state}; retry later", f"engine_{health.state}")

    def check_voice(self, voice: str | None, param: str) -> str | None:
        voices = self.card.voices
        chosen = voice or self.card.default_voice or (voices[0] if voices else None)
        if voices and chosen not in voices:
            same = [v for v in voices if chosen is not None and v.lower() == chosen.lower()]  # names are case-insensitive
            if not same:
                raise bad_request(f"unknown voice {voice!r}; this model's voices are: {', '.join(voices)}", param,
                                  "unknown_voice")
            chosen = same[0]
        return chosen


def card_with_defaults(card: ModelCard, config: ServerConfig) -> ModelCard:
    """The engine's card with the server's overrides of its default sampling."""
    if config.default_max_tokens is None:
        return card
    sampling = {**card.default_sampling, "max_tokens": config.default_max_tokens}
    return dataclasses.replace(card, default_sampling=sampling)


def app_state(request: Request) -> AppState:
    return request.app.state.walkserve
