"""Engine: the blocking face of AsyncEngine, for scripts, notebooks and tests.

    with Engine.start("fixture-omni", placement="two_ranks.yaml") as engine:
        results = engine.run([request_a, request_b])   # concurrently; one RequestResult each
        for out in engine.stream(request_c):            # OutputEvents, then a RequestFinished
            ...

An event loop runs in a background thread; every call hands a coroutine to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from walkserve.core.errors import AdmissionRejected
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.engine import AsyncEngine
from walkserve.entrypoint.interface import Health, RuntimeStats


@dataclass
class RequestResult:
    request: RequestSpec
    events: list[OutputEvent] = field(default_factory=list)
    finished: RequestFinished | None = None
    rejected: str | None = None

    def modality(self, name: str) -> list[OutputEvent]:
        return [e for e in self.events if e.modality == name]


class Engine:
    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, engine: AsyncEngine):
        self.loop, self.thread, self.engine = loop, thread, engine

    @classmethod
    def start(cls, model: Any, placement: Any = None, config: Any = None, **kwargs: Any) -> Engine:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="walkserve-engine-loop", daemon=True)
        thread.start()
        try:
            fut = asyncio.run_coroutine_threadsafe(AsyncEngine.start(model, placement, config, **kwargs), loop)
            engine = fut.result()
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            raise
        return cls(loop, thread, engine)

    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def run(self, requests: Sequence[RequestSpec], timeout: float | None = 600) -> list[RequestResult]:
        """Submit every request at once; wait for all; results in request order."""
        return self._call(self._run_all(list(requests)), timeout)

    async def _run_all(self, requests: list[RequestSpec]) -> list[RequestResult]:
        results = []
        for request, (events, outcome) in zip(requests, await self.engine.run_batch(requests), strict=True):
            result = RequestResult(request, events)
            if isinstance(outcome, AdmissionRejected):
                result.rejected = str(outcome)
            elif isinstance(outcome, Exception):
                raise outcome
            else:
                result.finished = outcome
            results.append(result)
        return results

    def stream(self, request: RequestSpec, timeout: float = 600) -> Iterator[OutputEvent | RequestFinished]:
        """Yield one request's outputs as they come; leaving the loop early aborts the request."""
        agen = self.engine.generate(request)
        try:
            while True:
                try:
                    yield self._call(agen.__anext__(), timeout)
                except StopAsyncIteration:
                    return
        finally:
            self._call(agen.aclose(), 30)

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        self._call(self.engine.abort(request_id, reason))

    def health(self) -> Health:
        return self.engine.health()

    def stats(self, fresh: bool = True) -> RuntimeStats:
        if fresh:
            self._call(self.engine.refresh_status())
        return self.engine.stats()

    @property
    def status(self):
        return self.engine.status

    def close(self, drain_s: float = 10.0) -> None:
        if self.loop.is_closed():
            return
        try:
            self._call(self.engine.shutdown(drain_s), drain_s + 60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(drain_s=0)
