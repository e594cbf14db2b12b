"""AsyncEngine: start a model on a placement and iterate over each request's outputs.

    engine = await AsyncEngine.start("orpheus", model_path=..., placement="two_ranks.yaml")
    async for out in engine.generate(request):
        ...                      # OutputEvent ..., then one RequestFinished
    await engine.shutdown()

The engine runs the conductor in a child process, which runs one worker
process per rank; this process only encodes requests and decodes outputs,
so HTTP work here never stalls scheduling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from walkserve.conductor.ray_cluster import require_ray
from walkserve.conductor.supervisor import Child
from walkserve.core.config import RuntimeConfig
from walkserve.core.errors import AdmissionRejected, EngineDead, InvalidRequest, WalkserveError
from walkserve.core.finish import FinishReason
from walkserve.core.ids import new_run_id
from walkserve.core.options import engine_options
from walkserve.core.outputs import OutputEvent, RequestFinished
from walkserve.core.proc import describe_exit
from walkserve.core.request import RequestSpec
from walkserve.entrypoint.chrome_trace import TraceDirSink
from walkserve.entrypoint.interface import EngineClient, Health, RuntimeStats
from walkserve.entrypoint.otel import open_sink
from walkserve.entrypoint.stats import runtime_stats
from walkserve.entrypoint.timeline import TimelineStore
from walkserve.models.base import Model, ModelRef
from walkserve.models.processor import Processor
from walkserve.placement.plan import Placement, load_placement, parse_placement
from walkserve.placement.resolve import check_placement
from walkserve.protocol import messages as m
from walkserve.protocol.arrays import event_values
from walkserve.protocol.codec import BadMessage, decode, encode
from walkserve.protocol.run import RunSpec, save_run_spec
from walkserve.transport import rundir, shm

log = logging.getLogger(__name__)


def default_device() -> str:
    try:
        import torch

        return "cuda:0" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def device_free_bytes(device: str) -> int | None:
    """Free memory of a CUDA device now, for the memory check (every rank of a run is on this host)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.mem_get_info(torch.device(device))[0])


def device_total_bytes(device: str) -> int | None:
    """Total memory of a CUDA device (the budget of a GPU rank without one of its own), or None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.mem_get_info(torch.device(device))[1])


def resolve_placement(model: Model, placement: Any) -> tuple[dict, str]:
    """The placement as a validated mapping plus a name for error messages."""
    if placement is None:
        data = model.default_placement()
        device = default_device()
        for rank in data["ranks"]:
            if rank.get("device") == "cpu" and device != "cpu":
                rank["device"] = device
        return data, "<default placement>"
    if isinstance(placement, Placement):
        raise TypeError("pass the placement as a mapping or a YAML path")
    if isinstance(placement, (str, Path)):
        path = Path(placement)
        load_placement(path)
        import yaml

        return yaml.safe_load(path.read_text()), str(path)
    parse_placement(placement, "<placement>")
    return dict(placement), "<placement>"


class _Channel:
    """One request's messages, in order: a deque and at most one waiting reader (lighter than asyncio.Queue)."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: deque = deque()
        self.waiter: asyncio.Future | None = None

    def put(self, item: Any) -> None:
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Any:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.items.popleft()


class _Gather:
    """One request of ``run_batch``: its events in a list, and a future that resolves when it ends."""

    __slots__ = ("done", "events")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.events: list[OutputEvent] = []
        self.done: asyncio.Future = loop.create_future()

    def put(self, item: Any) -> None:
        if isinstance(item, OutputEvent):
            self.events.append(item)
        elif not self.done.done():
            self.done.set_result(item)  # Finished or Rejected


class AsyncEngine(EngineClient):
    def __init__(self, model: Model, spec: RunSpec):
        self.model = model
        self.spec = spec
        self.process: Child | None = None
        self._processor = model.processor()
        self.ctx = zmq.asyncio.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.inbox.bind(spec.frontend_address)
        self.outbox = self.ctx.socket(zmq.PUSH)
        self.outbox.setsockopt(zmq.LINGER, 1000)
        self.outbox.connect(spec.conductor_address)
        self.streams: dict[str, _Channel] = {}
        self.status = m.Status("starting", "starting the conductor", {}, m.RuntimeSnapshot())
        self.status_changed = asyncio.Event()
        self.closed = False
        self._tasks: list[asyncio.Task] = []
        self._queries = 0
        self.timeline: TimelineStore | None = None  # each recent request's timing records (RuntimeConfig.timings)

    # ---- life cycle --------------------------------------------------------------------------
    @classmethod
    async def start(
        cls,
        model: str | ModelRef | Model,
        placement: Any = None,
        config: RuntimeConfig | None = None,
        model_path: str | None = None,
        model_options: dict | None = None,
    ) -> AsyncEngine:
        import walkserve.models.builtin  # noqa: F401
        from walkserve.models.registry import load_model

        if isinstance(model, str):
            model = ModelRef(model, model_path, model_options or {})
        if isinstance(model, ModelRef):
            model = load_model(model)
        config = config or RuntimeConfig()
        otel = open_sink()  # None unless OTEL_* asks for traces (the SDK is imported only then)
        sinks = [s for s in (otel, TraceDirSink(config.trace_dir) if config.trace_dir else None) if s is not None]
        if sinks or config.timelines:
            config = replace(config, timings=True)
        data, source = resolve_placement(model, placement)
        model = model.for_placement(data)
        comps = model.components()
        for name, comp in comps.items():  # typed engine options: a bad one fails here, naming it
            engine_options(comp.engine, name, comp.options, config.engine_options.get(comp.engine))
        parsed = parse_placement(data, source)
        require_ray(parsed)
        movable = tuple(sorted(c for c, s in comps.items() if s.stateful and s.engine == "kv"))
        check_placement(
            parsed,
            model.graph(),
            {c for c, s in comps.items() if s.stateful},
            {c: s.weight_bytes for c, s in comps.items()},
            {c: s.state_bytes for c, s in comps.items()},
            device_free=device_free_bytes,
            kv_shares={c: s.kv_share for c, s in comps.items() if s.kv_share},
            movable=set(movable),
        )
        model.memory_report(parsed, device_total_bytes)  # a model with real sizes refuses a plan that cannot fit
        run_id = new_run_id()
        run_dir = rundir.make_run_dir(run_id)
        ref = model.ref
        spec = RunSpec(run_id, secrets.token_hex(16), str(run_dir), ref.family, ref.path, dict(ref.options), data, source, config,
                       movable)
        save_run_spec(spec, spec.address_path("spec.msgpack"))
        engine = cls(model, spec)
        if config.timings:
            engine.timeline = TimelineStore(config.timelines, sinks, asyncio.get_running_loop().call_later,
                                            tracing=otel is not None)
        engine.process = Child([sys.executable, "-m", "walkserve.conductor.main", spec.address_path("spec.msgpack"), str(os.getpid())])
        engine._tasks = [asyncio.create_task(engine._reader()), asyncio.create_task(engine._watch())]
        try:
            await engine._wait_ready(config.start_timeout_s)
        except BaseException:
            await engine.shutdown(drain_s=0)
            raise
        return engine

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.status.state not in ("ready",):
            if self.status.state in ("failed", "stopped"):
                raise WalkserveError(f"the runtime did not start: {self.status.detail}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WalkserveError(f"the runtime did not start within {timeout_s:.0f} s ({self.status.detail})")
            self.status_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.status_changed.wait(), timeout=min(remaining, 0.5))

    async def shutdown(self, drain_s: float = 10.0) -> None:
        if self.closed:
            return
        self.closed = True
        if self.process is not None and self.process.exitcode is None:
            with contextlib.suppress(zmq.ZMQError):
                await self.outbox.send(encode(self.spec.token, [m.Shutdown(drain_s)]))
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self.process.wait, drain_s + 15)
            if self.process.exitcode is None:
                self.process.kill()
                await loop.run_in_executor(None, self.process.wait, 5)
        if self.process is not None:
            self.process.close()
        for task in self._tasks:
            task.cancel()
        self._fail_all("the runtime shut down")
        if self.timeline is not None:
            self.timeline.close()
        self.inbox.close(0)
        self.outbox.close(0)
        self.ctx.term()
        shm.sweep(self.spec.run_id)
        rundir.remove_run_dir(Path(self.spec.run_dir))

    # ---- background tasks --------------------------------------------------------------------
    async def _reader(self) -> None:
        while True:
            frame = await self.inbox.recv()
            try:
                messages = decode(frame, self.spec.token)
            except BadMessage as e:
                log.warning("dropped a frame from the conductor: %s", e)
                continue
            for msg in messages:
                if isinstance(msg, m.Status):
                    if msg.query_id == 0 and self.status.query_id:
                        msg.query_id = self.status.query_id  # a periodic update keeps the last answer's id
                    if msg.state == "failed" and self.status.state == "failed":
                        msg.detail = self.status.detail  # the first failure names the cause, later ones its effects
                    self.status = msg
                    self.status_changed.set()
                    continue
                if isinstance(msg, m.Events):
                    self._events(msg)
                    continue
                if isinstance(msg, m.Timings):
                    if self.timeline is not None:
                        self.timeline.add(msg)
                    continue
                channel = self.streams.get(msg.request_id)
                if channel is not None:
                    channel.put(msg)

    def _events(self, msg: m.Events) -> None:
        """A cohort step's outputs of one node output: one OutputEvent per request still listening."""
        streams, walk, node, modality, output = self.streams, msg.walk, msg.node, msg.modality, msg.output
        values = event_values(msg.stacked, msg.values)
        for rid, path, index, value in zip(msg.request_ids, msg.paths, msg.indices, values, strict=True):
            channel = streams.get(rid)
            if channel is not None and index >= 0:
                channel.put(OutputEvent(rid, modality, walk, node, tuple(path), value, index, output))

    async def _watch(self) -> None:
        while self.process.exitcode is None:
            await asyncio.sleep(0.25)
        why = describe_exit(self.process.exitcode)
        self.status = m.Status("stopped", f"the conductor process {why}", {}, self.status.stats)
        self.status_changed.set()
        self._fail_all("the runtime stopped")

    def _fail_all(self, error: str) -> None:
        for rid, channel in self.streams.items():
            channel.put(m.Finished(rid, FinishReason.ERROR.value, error))

    # ---- EngineClient ------------------------------------------------------------------------
    @property
    def processor(self) -> Processor:
        if self._processor is None:
            raise WalkserveError(f"model {self.model.ref.family!r} has no processor")
        return self._processor

    async def generate(self, request: RequestSpec) -> AsyncIterator[OutputEvent | RequestFinished]:
        if self.closed or self.status.state in ("stopped", "failed"):
            raise EngineDead(f"the runtime is {self.status.state}: {self.status.detail}")
        rid = request.id
        if rid in self.streams:
            raise InvalidRequest(f"request id {rid!r} is already running", param="request_id")
        channel = _Channel()
        self.streams[rid] = channel
        finished, timeline = False, self.timeline
        if timeline is not None:
            timeline.submitted(rid)
        try:
            await self.outbox.send(encode(self.spec.token, [m.Submit(request)]))
            while True:
                msg = await channel.get()
                if isinstance(msg, OutputEvent):
                    yield msg
                    continue
                if isinstance(msg, m.Rejected):
                    finished = True
                    if timeline is not None:
                        timeline.finished(rid, "rejected")
                    if msg.invalid:
                        raise InvalidRequest(msg.message)
                    raise AdmissionRejected(msg.message, msg.retry_after_s, msg.cause)
                finished = True
                if timeline is not None:
                    timeline.finished(rid, msg.reason)
                yield RequestFinished(rid, FinishReason(msg.reason), msg.error, dict(msg.usage), dict(msg.timings))
                return
        finally:
            self.streams.pop(rid, None)
            if not finished and timeline is not None:
                timeline.finished(rid, FinishReason.ABORT.value)
            if not finished and not self.closed:
                with contextlib.suppress(zmq.ZMQError):
                    await self.outbox.send(encode(self.spec.token, [m.Abort(rid)]))

    async def run_batch(self, requests: list[RequestSpec]) -> list[tuple[list[OutputEvent], RequestFinished | WalkserveError]]:
        """Run requests together; per request, its events and how it ended (RequestFinished, or the rejection).

        The batch form of ``generate`` for offline work: the requests go to the
        conductor in one message and their events are gathered into lists as they
        arrive, with no task woken per event. Raises InvalidRequest (nothing
        submitted) when an id repeats or is already running; cancelling aborts
        the requests still running.
        """
        if self.closed or self.status.state in ("stopped", "failed"):
            raise EngineDead(f"the runtime is {self.status.state}: {self.status.detail}")
        ids = [r.id for r in requests]
        taken = [rid for rid in ids if rid in self.streams] or [rid for i, rid in enumerate(ids) if rid in ids[:i]]
        if taken:
            raise InvalidRequest(f"request id {taken[0]!r} is already running", param="request_id")
        loop = asyncio.get_running_loop()
        gathers = [_Gather(loop) for _ in requests]
        self.streams.update(zip(ids, gathers, strict=True))
        for rid in ids if self.timeline is not None else ():
            self.timeline.submitted(rid)
        try:
            await self.outbox.send(encode(self.spec.token, [m.Submit(r) for r in requests]))
            await asyncio.gather(*(g.done for g in gathers))
        finally:
            for rid in ids:
                self.streams.pop(rid, None)
            running = [m.Abort(rid) for rid, g in zip(ids, gathers, strict=True) if not g.done.done()]
            for rid, g in zip(ids, gathers, strict=True) if self.timeline is not None else ():
                ended = g.done.done() and not g.done.cancelled()
                self.timeline.finished(rid, getattr(g.done.result(), "reason", "rejected") if ended else "abort")
            if running and not self.closed:
                with contextlib.suppress(zmq.ZMQError):
                    await self.outbox.send(encode(self.spec.token, running))
        results = []
        for g in gathers:
            msg = g.done.result()
            if isinstance(msg, m.Rejected):
                outcome: RequestFinished | WalkserveError = (
                    InvalidRequest(msg.message) if msg.invalid else AdmissionRejected(msg.message, msg.retry_after_s, msg.cause)
                )
            else:
                outcome = RequestFinished(msg.request_id, FinishReason(msg.reason), msg.error, dict(msg.usage), dict(msg.timings))
            results.append((g.events, outcome))
        return results

    async def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> None:
        await self.outbox.send(encode(self.spec.token, [m.Abort(request_id, reason.value)]))

    def health(self) -> Health:
        s = self.status
        workers = {int(k): bool(v) for k, v in s.workers.items()}
        ok = s.state == "ready" and bool(workers) and all(workers.values()) and not self.closed
        return Health(ok, "stopped" if self.closed else s.state, s.detail, workers)

    def stats(self) -> RuntimeStats:
        return runtime_stats(self.status.stats)

    async def refresh_status(self, timeout_s: float = 2.0) -> None:
        """Ask the conductor for fresh counters from every worker and wait for that answer."""
        self._queries += 1
        query_id = self._queries
        await self.outbox.send(encode(self.spec.token, [m.StatusQuery(query_id)]))
        deadline = time.monotonic() + timeout_s
        while self.status.query_id < query_id and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.status_changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.status_changed.wait(), left)
