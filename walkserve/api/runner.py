"""RequestRunner: one RequestSpec through the engine, with admission errors mapped and aborts guaranteed."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from walkserve.api.errors import busy, unavailable
from walkserve.api.metrics import ApiMetrics
from walkserve.api.observer import RequestObserver
from walkserve.api.playback import StreamMeter
from walkserve.core.errors import AdmissionRejected, EngineDead
from walkserve.core.finish import FinishReason
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.interface import EngineClient

log = logging.getLogger(__name__)

Event = OutputEvent | RequestFinished


class RequestRunner:
    def __init__(self, engine: EngineClient, metrics: ApiMetrics, sample_rate: int | None, startup_buffer_s: float = 1.0):
        self.engine = engine
        self.metrics = metrics
        self.sample_rate = sample_rate
        self.startup_buffer_s = startup_buffer_s
        self._stopped: set[str] = set()  # requests the frontend ended at a stop string
        self._meters: dict[str, StreamMeter] = {}  # real-time streams running now

    def written(self, request_id: str, samples: int) -> None:
        """``samples`` of a real-time stream's audio were just written to its client (the playback clock)."""
        meter = self._meters.get(request_id)
        if meter is not None:
            meter.written(samples)

    async def stop(self, spec: RequestSpec) -> None:
        """The request hit a stop string: end it in the runtime as finished (call before closing its events)."""
        self._stopped.add(spec.id)
        try:
            await self.engine.abort(spec.id, FinishReason.STOP)
        except Exception:
            log.exception("stopping %s failed", spec.id)

    async def events(self, spec: RequestSpec, route: str) -> AsyncIterator[Event]:
        """The request's events, ending with its RequestFinished.

        AdmissionRejected becomes a 429 ApiError, EngineDead a 503. Closing
        this iterator early (a stop string, a client that went away, a
        cancelled task) closes the engine's iterator, which aborts the
        request, so the runtime frees its state.
        """
        observer = RequestObserver(self.metrics, route, self.sample_rate)
        meter = self._meter(spec, route)
        finished: RequestFinished | None = None
        stream = None
        rejected = False
        try:
            stream = self.engine.generate(spec)
            async for event in stream:
                if meter is not None:  # the node that emits the audio: the one named when a chunk is late
                    meter.on_event(event.node if getattr(event, "modality", "") == "audio" else "")
                if isinstance(event, RequestFinished):
                    finished = event
                    yield event
                    return
                observer.on_output(event)
                yield event
            finished = RequestFinished(spec.id, FinishReason.ERROR, "the runtime ended the request without a finish event")
            yield finished
        except AdmissionRejected as e:
            rejected = True
            if meter is not None:
                meter.rejected(e.cause)
            raise busy(f"the server is at capacity ({e}); retry later", e.retry_after_s) from None
        except EngineDead:
            rejected = True
            raise unavailable("the model runtime is not running", "engine_dead") from None
        finally:
            if finished is None and spec.id in self._stopped:
                finished = RequestFinished(spec.id, FinishReason.STOP)
            self._stopped.discard(spec.id)
            if meter is not None:
                self._meters.pop(spec.id, None)
                meter.close()
            if not rejected:
                observer.on_finish(finished)
            await self._release(spec, stream, finished or rejected)

    def _meter(self, spec: RequestSpec, route: str) -> StreamMeter | None:
        if not spec.realtime:
            return None
        rate = spec.audio_rate or self.sample_rate or 24000
        meter = self._meters[spec.id] = StreamMeter(self.metrics, route, spec.id, rate, self.startup_buffer_s)
        return meter

    async def _release(self, spec: RequestSpec, stream, done: object) -> None:
        """Closing the engine's iterator aborts an unfinished request (the EngineClient contract);
        ``abort`` is called only for an iterator that cannot be closed."""
        closable = stream is not None and hasattr(stream, "aclose")
        if closable:
            try:
                await stream.aclose()
            except Exception:
                log.exception("closing the event stream of %s failed", spec.id)
        if not done and stream is not None and not closable:
            try:
                await self.engine.abort(spec.id)
            except Exception:
                log.exception("aborting %s failed", spec.id)
