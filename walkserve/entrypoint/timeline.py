"""TimelineStore: each recent request's timing records, gathered in the frontend, and where they go.

One ``RequestTrace`` per HTTP request (keyed by its ``X-Request-Id``) or per request submitted
outside HTTP (keyed by its request id). It holds the HTTP span, each engine request's submit and
finish, and the ``Timing`` records the conductor and the workers sent for its requests (a batched
firing's record is in the trace of each request it served). When the HTTP answer is done and every
request of it finished, the trace goes to the sinks (OpenTelemetry, the trace directory) after a
short grace, so records still on their way join it; records that come later still go, as an update.

The store keeps every trace in flight and the ``keep`` most recent finished ones (the bounded ring
``GET /v1/requests/{id}/timeline`` reads); ``keep`` 0 keeps a trace only until its sinks ran.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from walkserve.core.trace import CURRENT, TraceContext, new_span_id
from walkserve.protocol import messages as m

log = logging.getLogger(__name__)

MAX_RECORDS = 20_000  # per trace; past it records are counted, not kept
GRACE_S = 0.25  # a finished trace waits this long for records still on their way
FRONTEND_RANK = -2  # the frontend's own spans (HTTP, requests), beside the conductor's -1


@dataclass
class EngineRequest:
    submitted_ns: int
    finished_ns: int = 0
    reason: str = ""


@dataclass
class RequestTrace:
    key: str
    context: TraceContext | None  # the server span's (HTTP), or a root of its own (no HTTP); None: no OTel
    started_ns: int
    http: dict | None = None  # the HTTP span: {} while it runs, then name, status, attributes, end_ns (None: no HTTP)
    requests: dict[str, EngineRequest] = field(default_factory=dict)
    records: list[tuple[int, int, m.Timing]] = field(default_factory=list)  # (rank, pid, record)
    dropped: int = 0
    sent: int = -1  # records already given to the sinks (-1: none yet)
    flush_pending: bool = False

    @property
    def complete(self) -> bool:
        http_done = self.http is None or "end_ns" in self.http
        return http_done and bool(self.requests) and all(r.finished_ns for r in self.requests.values())


class Sink(Protocol):
    def export(self, trace: RequestTrace, store: TimelineStore, new: list[tuple[int, int, m.Timing]], first: bool) -> None:
        """``new``: the records not given before; ``first``: the trace's first export (all its records)."""

    def close(self) -> None: ...


class TimelineStore:
    def __init__(self, keep: int, sinks: list[Sink], later: Callable[[float, Callable[[], None]], object],
                 tracing: bool = False):
        self.keep, self.sinks, self.later, self.tracing = keep, sinks, later, tracing
        self.pid = os.getpid()
        self.traces: OrderedDict[str, RequestTrace] = OrderedDict()
        self.by_request: dict[str, str] = {}  # engine request id -> its trace's key

    # ---- what happens to a request ---------------------------------------------------------
    def http_done(self, key: str, name: str, status: int, attributes: dict, started_ns: int) -> None:
        """The HTTP answer is sent. An HTTP request that submitted nothing has no trace (only requests that
        ran the model are kept)."""
        trace = self.traces.get(key)
        if trace is not None and trace.http is not None:
            trace.started_ns = started_ns
            trace.http.update(name=name, status=status, attributes=attributes, end_ns=time.time_ns())
            self._check(trace)

    def submitted(self, rid: str) -> None:
        """A request was submitted: it joins the current HTTP request's trace, or starts one of its own."""
        scope = CURRENT.get()
        trace = self.traces.get(scope.key) if scope is not None else None
        if trace is None and scope is not None:
            trace = RequestTrace(scope.key, scope.context, time.time_ns(), http={})
        elif trace is None:
            context = TraceContext(int.from_bytes(os.urandom(16), "big") or 1, new_span_id()) if self.tracing else None
            trace = RequestTrace(rid, context, time.time_ns())
        self.traces[trace.key] = trace
        trace.requests[rid] = EngineRequest(time.time_ns())
        self.by_request[rid] = trace.key

    def finished(self, rid: str, reason: str) -> None:
        trace = self.get(rid)
        if trace is not None and rid in trace.requests:
            trace.requests[rid].finished_ns, trace.requests[rid].reason = time.time_ns(), reason
            self._check(trace)

    def add(self, msg: m.Timings) -> None:
        """Records of one process: each goes to the trace of every request it served."""
        traces, by_request = self.traces, self.by_request
        for record in msg.records:
            for rid in record.request_ids:
                trace = traces.get(by_request.get(rid, ""))
                if trace is None:
                    continue
                if len(trace.records) >= MAX_RECORDS:
                    trace.dropped += 1
                    continue
                trace.records.append((msg.rank, msg.pid, record))
                if trace.sent >= 0:
                    self._schedule(trace)

    def get(self, key: str) -> RequestTrace | None:
        """A trace by its key (``X-Request-Id``) or by the id of one of its requests."""
        trace = self.traces.get(key)
        return trace if trace is not None else self.traces.get(self.by_request.get(key, ""))

    def trace_of(self, rid: str) -> RequestTrace | None:
        return self.traces.get(self.by_request.get(rid, ""))

    def close(self) -> None:
        for trace in list(self.traces.values()):
            if trace.complete and (trace.sent < 0 or trace.flush_pending):
                self._flush(trace.key)
        for sink in self.sinks:
            sink.close()

    # ---- sinks and the ring ----------------------------------------------------------------
    def _check(self, trace: RequestTrace) -> None:
        if trace.complete and trace.sent < 0:
            self._schedule(trace)

    def _schedule(self, trace: RequestTrace) -> None:
        if not trace.flush_pending:
            trace.flush_pending = True
            self.later(GRACE_S, lambda key=trace.key: self._flush(key))

    def _flush(self, key: str) -> None:
        trace = self.traces.get(key)
        if trace is None or not trace.flush_pending:
            return
        trace.flush_pending = False
        first, new = trace.sent < 0, trace.records[max(trace.sent, 0):]
        trace.sent = len(trace.records)
        for sink in self.sinks:
            try:
                sink.export(trace, self, new, first)
            except Exception:
                log.exception("a trace sink failed on %s", key)
        self._evict()

    def _evict(self) -> None:
        done = [k for k, t in self.traces.items() if t.sent >= 0 and not t.flush_pending]
        for key in done[:max(0, len(done) - self.keep)]:
            trace = self.traces.pop(key)
            for rid in trace.requests:
                if self.by_request.get(rid) == key:
                    del self.by_request[rid]
