"""A deterministic in-process EngineClient for API tests (no torch, no processes).

The fake "model" writes text from a fixed word list chosen by a hash of the
prompt (and the seed), one UTF-8 byte per token, then EOS. With the audio
capability it emits float32 PCM chunks (a sine per voice); with the images
capability one uint8 [H, W, 3] image. It models what the server must cope
with: admission (``max_running`` + a bounded queue, then AdmissionRejected),
abort (closing the iterator or ``abort()`` frees the slot), failures (a
prompt containing ``FAIL_MAGIC`` fails after a few outputs) and health.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from walkserve.core.array import ArrayData
from walkserve.core.errors import AdmissionRejected, EngineDead
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.interface import EngineClient, Health, RuntimeStats
from walkserve.entrypoint.timeline import TimelineStore
from walkserve.models.processor import ModelCard, Processor
from walkserve.testing.fake_processor import EOS_ID, PROMPT_IDS, FakeProcessor

FAIL_MAGIC = "__walkserve_fail__"
FAIL_AFTER = 3  # outputs produced before an injected failure
WORDS = ("Hello", " world", ",", " walk", " graph", " ça", " marche", " 日本語", " 🙂", " serve", "!", " stream")
TEXT_CAPS = frozenset({"completions", "chat", "generate"})


@dataclass(frozen=True)
class FakeEngineConfig:
    """Shape and timing of the fake model."""

    model_id: str = "fake-tiny"
    audio: bool = False
    images: bool = False
    image_in: bool = True
    audio_in: bool = True
    token_delay_s: float = 0.001
    max_running: int = 8
    max_waiting: int = 16
    max_context: int = 2048
    voices: tuple[str, ...] = ("tara", "leo", "zoe")
    sample_rate: int = 24000
    audio_chunk_samples: int = 2400
    chars_per_audio_chunk: int = 8
    image_size: tuple[int, int] = (32, 24)  # (width, height)
    start_delay_s: float = 0.0
    retry_after_s: float = 1.0
    shutdown_grace_s: float = 5.0
    default_sampling: dict = field(default_factory=dict)
    timelines: int = 0  # recent requests kept for GET /v1/requests/{id}/timeline (their HTTP and request spans)

    def card(self) -> ModelCard:
        caps = set(TEXT_CAPS)
        caps |= {"image_in"} if self.image_in else set()
        caps |= {"audio_in"} if self.audio_in else set()
        caps |= {"speech", "audio_out"} if self.audio else set()
        caps |= {"images", "image_edit"} if self.images else set()
        return ModelCard(
            id=self.model_id,
            family="fake",
            capabilities=frozenset(caps),
            max_context=self.max_context,
            voices=self.voices if self.audio else (),
            default_voice=self.voices[0] if self.audio else None,
            sample_rate=self.sample_rate if self.audio else None,
            random_weights=True,
            description="deterministic fake model for tests",
            default_sampling=dict(self.default_sampling),
        )


def _token_stream(seed_bytes: bytes) -> Iterator[int]:
    """Natural answer bytes, EOS, then more bytes forever (for ignore_eos / min_tokens)."""
    digest = hashlib.sha256(seed_bytes).digest()
    rng = random.Random(digest)
    natural = 3 + digest[0] % 10
    for i in range(natural):
        yield from WORDS[rng.randrange(len(WORDS))].encode("utf-8")
        if i == natural - 1:
            yield EOS_ID
    while True:
        yield from WORDS[rng.randrange(len(WORDS))].encode("utf-8")


def _prompt_ids(spec: RequestSpec) -> list[int]:
    value = spec.inputs.get(PROMPT_IDS)
    return value.tolist() if isinstance(value, ArrayData) else list(value or [])


class _Run:
    """One admitted request's bookkeeping."""

    def __init__(self, spec: RequestSpec, sample_rate: int):
        self.spec = spec
        self.prompt = _prompt_ids(spec)
        self.fail = FAIL_MAGIC.encode() in bytes(t for t in self.prompt if t < 256)
        self.outputs = 0
        self.text_tokens = 0
        self.audio_index = 0
        self.phase = 0.0
        self.sample_rate = sample_rate
        self.t_arrive = time.monotonic()
        self.t_start = self.t_arrive
        self.t_first: float | None = None

    def event(self, modality: str, data: ArrayData, node: str, step: int, index: int) -> OutputEvent:
        self.outputs += 1
        if self.t_first is None:
            self.t_first = time.monotonic()
        return OutputEvent(self.spec.id, modality, self.spec.task, node, (step,), data, index)

    def finished(self, reason: FinishReason, error: str | None = None) -> RequestFinished:
        now = time.monotonic()
        usage = {"prompt_tokens": len(self.prompt), "completion_tokens": self.text_tokens}
        timings = {
            "queue_s": self.t_start - self.t_arrive,
            "first_output": (self.t_first or now) - self.t_arrive,
            "total": now - self.t_arrive,
        }
        return RequestFinished(self.spec.id, reason, error, usage, timings)


def _call_later(delay_s: float, callback) -> None:
    asyncio.get_running_loop().call_later(delay_s, callback)


class FakeEngine(EngineClient):
    """See the module docstring. ``shutdown_calls`` counts shutdown() calls (for drain tests)."""

    def __init__(self, config: FakeEngineConfig | None = None):
        self.config = config or FakeEngineConfig()
        self._processor = FakeProcessor(self.config.card())
        self._runs: dict[str, _Run] = {}
        self._aborts: set[str] = set()
        self._stop_strings: set[str] = set()
        self._waiters: list[asyncio.Future] = []
        self._running = 0
        self._waiting = 0
        self._counts = {"finished": 0, "failed": 0, "aborted": 0, "rejected": 0}
        self._steps = {"batches": 0.0, "items": 0.0, "busy_s": 0.0}
        self._created = time.monotonic()
        self._state: str | None = None
        self._workers = {0: True}
        self._closed = False
        self.shutdown_calls = 0
        if self.config.timelines:
            self.timeline = TimelineStore(self.config.timelines, [], _call_later)

    # -- EngineClient ---------------------------------------------------------------------------
    @property
    def processor(self) -> Processor:
        return self._processor

    async def generate(self, request: RequestSpec) -> AsyncIterator[OutputEvent | RequestFinished]:
        self._admit()
        run = _Run(request, self.config.sample_rate)
        self._waiting += 1
        try:
            await self._acquire()
        finally:
            self._waiting -= 1
        run.t_start = time.monotonic()
        self._runs[request.id] = run
        last: RequestFinished | None = None
        if self.timeline is not None:
            self.timeline.submitted(request.id)
        try:
            async for event in self._produce(run):
                if isinstance(event, RequestFinished):
                    last = event
                yield event
                if last is not None:
                    return
        finally:
            self._finish(run, last)
            if self.timeline is not None:
                self.timeline.finished(request.id, str(last.reason) if last is not None else "abort")

    async def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        if request_id not in self._runs:
            return
        if reason == FinishReason.STOP:
            self._stop_strings.add(request_id)  # ended by the caller at a stop string: counted as finished
        else:
            self._aborts.add(request_id)

    def health(self) -> Health:
        state = self._state or ("starting" if time.monotonic() - self._created < self.config.start_delay_s else "ready")
        if state == "ready" and not all(self._workers.values()):
            state = "degraded"
        return Health(ok=state == "ready", state=state, detail=f"fake engine {state}", workers=dict(self._workers))

    def stats(self) -> RuntimeStats:
        blocks_per_request = 4
        return RuntimeStats(
            running=self._running,
            waiting=self._waiting,
            preemptions=0,
            kv_blocks_used=self._running * blocks_per_request,
            kv_blocks_total=self.config.max_running * blocks_per_request,
            nodes={"fake_lm": dict(self._steps)},
            requests_with_state=len(self._runs),
            **self._counts,
        )

    async def shutdown(self) -> None:
        self.shutdown_calls += 1
        self._closed = True
        self._state = "draining"
        deadline = time.monotonic() + self.config.shutdown_grace_s
        while self._running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._state = "stopped"

    # -- test controls --------------------------------------------------------------------------
    def set_state(self, state: str | None) -> None:
        """Force a health state ("starting", "draining" ...); None returns to normal."""
        self._state = state

    def kill_worker(self, rank: int = 0) -> None:
        self._workers[rank] = False

    @property
    def active_requests(self) -> int:
        """Requests holding state (running); 0 once every request was freed."""
        return len(self._runs)

    # -- internals ------------------------------------------------------------------------------
    def _admit(self) -> None:
        if self._closed:
            raise EngineDead("the fake engine is shut down")
        cfg = self.config
        if self._running >= cfg.max_running and self._waiting >= cfg.max_waiting:
            self._counts["rejected"] += 1
            raise AdmissionRejected(
                f"{self._running} running and {self._waiting} waiting (queue bound {cfg.max_waiting})",
                retry_after_s=cfg.retry_after_s,
            )

    async def _acquire(self) -> None:
        while self._running >= self.config.max_running:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._running += 1

    def _finish(self, run: _Run, last: RequestFinished | None) -> None:
        self._runs.pop(run.spec.id, None)
        self._aborts.discard(run.spec.id)
        self._running -= 1
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        reason = last.reason if last is not None else None
        if reason is None and run.spec.id in self._stop_strings:
            reason = FinishReason.STOP  # closed early by a caller that found a stop string
        self._stop_strings.discard(run.spec.id)
        outcome = {None: "aborted", FinishReason.ABORT: "aborted", FinishReason.ERROR: "failed"}.get(reason, "finished")
        self._counts[outcome] += 1

    async def _step(self) -> None:
        delay = self.config.token_delay_s
        self._steps["batches"] += 1
        self._steps["items"] += 1
        self._steps["busy_s"] += delay
        await asyncio.sleep(delay)

    def _produce(self, run: _Run) -> AsyncIterator[OutputEvent | RequestFinished]:
        modalities = run.spec.modalities
        if "image" in modalities:
            return self._produce_image(run)
        if modalities == ("audio",):
            return self._produce_speech(run)
        return self._produce_text(run)

    def _stopped(self, run: _Run) -> RequestFinished | None:
        if run.spec.id in self._aborts:
            return run.finished(FinishReason.ABORT)
        if run.fail and run.outputs >= FAIL_AFTER:
            return run.finished(FinishReason.ERROR, "fake engine: failure injected by the prompt")
        return None

    async def _produce_text(self, run: _Run) -> AsyncIterator[OutputEvent | RequestFinished]:
        sampling = run.spec.sampling
        seed_bytes = bytes(t % 256 for t in run.prompt) + str(sampling.seed).encode()
        want_audio = "audio" in run.spec.modalities
        for step, token in enumerate(_token_stream(seed_bytes)):
            if (stop := self._stopped(run)) is not None:
                yield stop
                return
            await self._step()
            if token == EOS_ID and not sampling.ignore_eos and run.text_tokens >= sampling.min_tokens:
                break
            if token == EOS_ID:
                continue
            if token in sampling.stop_token_ids:
                break
            run.text_tokens += 1
            yield run.event("text", ArrayData.from_list([token], "int64"), "fake_lm", step, run.text_tokens - 1)
            if want_audio and run.text_tokens % 4 == 0:
                yield self._audio_chunk(run, step)
            if run.text_tokens >= sampling.max_tokens:
                yield run.finished(FinishReason.LENGTH)
                return
        if want_audio:
            yield self._audio_chunk(run, run.text_tokens)
        if "latent" in run.spec.modalities:  # a small float32 [2, 3] tensor, values 0.5 * (0..5)
            latent = ArrayData.from_list([0.5 * i for i in range(6)], "float32")
            yield run.event("latent", ArrayData("float32", (2, 3), latent.data), "fake_head", run.text_tokens, 0)
        yield run.finished(FinishReason.STOP)

    async def _produce_speech(self, run: _Run) -> AsyncIterator[OutputEvent | RequestFinished]:
        chunks = max(1, math.ceil(len(run.prompt) / self.config.chars_per_audio_chunk))
        limit = run.spec.sampling.max_tokens
        for step in range(min(chunks, limit)):
            if (stop := self._stopped(run)) is not None:
                yield stop
                return
            await self._step()
            yield self._audio_chunk(run, step)
        yield run.finished(FinishReason.LENGTH if chunks > limit else FinishReason.STOP)

    async def _produce_image(self, run: _Run) -> AsyncIterator[OutputEvent | RequestFinished]:
        if (stop := self._stopped(run)) is not None:
            yield stop
            return
        await self._step()
        if (stop := self._stopped(run)) is not None:
            yield stop
            return
        yield run.event("image", self._image(run), "fake_vae", 0, 0)
        yield run.finished(FinishReason.STOP)

    def _audio_chunk(self, run: _Run, step: int) -> OutputEvent:
        voices = self.config.voices
        voice = run.spec.params.voice or voices[0]  # FakeParams
        freq = 220.0 * (1 + (voices.index(voice) if voice in voices else 0))
        n, sr = self.config.audio_chunk_samples, self.config.sample_rate
        omega = 2 * math.pi * freq / sr
        samples = [0.3 * math.sin(run.phase + omega * i) for i in range(n)]
        run.phase = (run.phase + omega * n) % (2 * math.pi)
        run.audio_index += 1
        return run.event("audio", ArrayData.from_list(samples, "float32"), "fake_codec", step, run.audio_index - 1)

    def _image(self, run: _Run) -> ArrayData:
        images = run.spec.inputs.get("images")
        if images:
            src = images[0]  # an edit: the inverse of the first input image
            return ArrayData("uint8", src.shape, bytes(255 - b for b in src.data))
        width, height = run.spec.params.size or self.config.image_size
        tint = hashlib.sha256(bytes(t % 256 for t in run.prompt) + str(run.spec.sampling.seed).encode()).digest()[0]
        pixels = bytearray()
        for y in range(height):
            for x in range(width):
                pixels += bytes(((x * 255) // max(1, width - 1), (y * 255) // max(1, height - 1), tint))
        return ArrayData("uint8", (height, width, 3), bytes(pixels))


def build_fake_engine(**options) -> FakeEngine:
    """Factory for ``python -m walkserve.api --engine walkserve.testing.fake_engine:build_fake_engine``."""
    for key in ("voices",):
        if key in options:
            options[key] = tuple(options[key])
    if "image_size" in options:
        options["image_size"] = tuple(options["image_size"])
    return FakeEngine(FakeEngineConfig(**options))
