"""OpenTelemetry export of each request's trace (the ``otel`` extra; imported only when ``OTEL_*`` asks).

The conductor and the workers do not export spans themselves: they ship timing records (``Timing``)
to the frontend, which turns each trace into spans with explicit ids and timestamps and hands them
to the SDK's batch processor and OTLP/HTTP exporter. Every span keeps the resource of the process
that did the work (``walkserve.rank``, ``process.pid``), so a collector shows one process per rank.

    HTTP span (SERVER, id = the traceparent returned)       frontend
      request <id>                                          frontend: submit -> finish
        admission, queue                                    conductor
        walk <name>                                         conductor: start -> next walk / end
          <node> on rank N (links: the batch's other requests)  rank N, one per firing
          transfer to rank M                                 rank N
"""

from __future__ import annotations

import hashlib
import logging

from walkserve.core import env
from walkserve.core.trace import new_span_id
from walkserve.entrypoint.timeline import FRONTEND_RANK, RequestTrace, TimelineStore
from walkserve.protocol import messages as m

log = logging.getLogger(__name__)


def wanted() -> bool:
    """Whether the standard variables ask for traces (an exporter other than none, or an OTLP endpoint)."""
    if env.OTEL_SDK_DISABLED.get():
        return False
    exporter = (env.OTEL_TRACES_EXPORTER.get() or "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.OTEL_EXPORTER_OTLP_ENDPOINT.get() or env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.get())


def open_sink() -> OtelSink | None:
    """The sink when tracing is wanted and the extra is installed; else None (a warning if wanted)."""
    if not wanted():
        return None
    try:
        return OtelSink()
    except ImportError as e:
        log.warning("OTEL_* asks for traces but the OpenTelemetry SDK is missing (pip install 'walkserve[otel]'): %s", e)
        return None


def span_id(*parts: object) -> int:
    """A span id fixed by what the span is (so any record can name its parent before it is exported)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


class OtelSink:
    def __init__(self) -> None:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        exporter_name = (env.OTEL_TRACES_EXPORTER.get() or "otlp").strip().lower()
        if exporter_name == "console":
            exporter = ConsoleSpanExporter()
        else:
            if exporter_name != "otlp":
                log.warning("OTEL_TRACES_EXPORTER=%s is not supported here; exporting OTLP/HTTP", exporter_name)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        self.processor = BatchSpanProcessor(exporter)
        self._resources: dict[tuple[int, int], object] = {}

    def export(self, trace: RequestTrace, store: TimelineStore, new: list[tuple[int, int, m.Timing]], first: bool) -> None:
        ctx = trace.context
        if ctx is None or not ctx.sampled:
            return
        spans = _TraceSpans(trace, store, self)
        if first:  # the trace's own spans (HTTP, requests) go once
            spans.own()
        for rank, pid, rec in new:
            spans.record(rank, pid, rec)
        for span in spans.out:
            self.processor.on_end(span)

    def resource(self, rank: int, pid: int):
        from opentelemetry.sdk.resources import Resource

        key = (rank, pid)
        if key not in self._resources:
            role = {FRONTEND_RANK: "frontend", -1: "conductor"}.get(rank, f"rank {rank}")
            self._resources[key] = Resource.create({"service.name": env.OTEL_SERVICE_NAME.get(), "process.pid": pid,
                                                    "walkserve.process": role, "walkserve.rank": rank})
        return self._resources[key]

    def close(self) -> None:
        self.processor.shutdown()


class _TraceSpans:
    """The spans of one trace's export, with ids that follow from the trace and the record."""

    def __init__(self, trace: RequestTrace, store: TimelineStore, sink: OtelSink):
        from opentelemetry import trace as api
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.api, self.readable, self.scope = api, ReadableSpan, InstrumentationScope("walkserve")
        self.trace, self.store, self.sink, self.out = trace, store, sink, []
        self.tid = trace.context.trace_id
        self.walk_ids: dict[int, int] = {}  # id(walk record) -> its span id
        self.walks: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (request, walk) -> [(start, span id)]
        for rec in sorted((r for _, _, r in trace.records if r.kind == "walk"), key=lambda r: r.start_ns):
            seen = self.walks.setdefault((rec.request_ids[0], rec.name), [])
            self.walk_ids[id(rec)] = span_id(self.tid, "walk", rec.request_ids[0], rec.name, len(seen))
            seen.append((rec.start_ns, self.walk_ids[id(rec)]))

    def ctx(self, sid: int, trace_id: int | None = None):
        return self.api.SpanContext(trace_id or self.tid, sid, True, self.api.TraceFlags(1))

    def span(self, name: str, sid: int, parent: int, start: int, end: int, rank: int, pid: int, attrs: dict,
             kind=None, links=(), failed: bool = False) -> None:
        status = self.api.Status(self.api.StatusCode.ERROR if failed else self.api.StatusCode.UNSET)
        self.out.append(self.readable(
            name, context=self.ctx(sid), parent=self.ctx(parent) if parent else None,
            resource=self.sink.resource(rank, pid), attributes=attrs, links=links, status=status,
            kind=kind or self.api.SpanKind.INTERNAL, start_time=start, end_time=max(end, start),
            instrumentation_scope=self.scope))

    def request_id(self, rid: str) -> int:
        return span_id(self.tid, "request", rid)

    def own(self) -> None:
        trace, pid, ctx = self.trace, self.store.pid, self.trace.context
        top = 0
        if trace.http is not None and "end_ns" in trace.http:
            top = ctx.span_id
            self.span(trace.http["name"], top, ctx.parent_id, trace.started_ns, trace.http["end_ns"], FRONTEND_RANK, pid,
                      {"http.response.status_code": trace.http["status"], "walkserve.request_key": trace.key,
                       **trace.http["attributes"]}, kind=self.api.SpanKind.SERVER, failed=trace.http["status"] >= 500)
        for rid, req in trace.requests.items():
            self.span(f"request {rid}", self.request_id(rid), top or ctx.parent_id, req.submitted_ns,
                      req.finished_ns or req.submitted_ns, FRONTEND_RANK, pid,
                      {"walkserve.request_id": rid, "walkserve.finish_reason": req.reason}, failed=req.reason == "error")

    def record(self, rank: int, pid: int, rec: m.Timing) -> None:
        rids = [r for r in rec.request_ids if r in self.trace.requests]
        for rid in rids:
            attrs = {"walkserve.request_id": rid, "walkserve.rank": rank, "walkserve.walk": rec.walk,
                     **{f"walkserve.{k}": v for k, v in rec.attrs.items()}}
            if rec.kind == "walk":
                sid, parent = self.walk_ids[id(rec)], self.request_id(rid)
            elif rec.kind in ("admission", "queue"):
                sid, parent = span_id(self.tid, rec.kind, rid), self.request_id(rid)
            else:
                sid, parent = new_span_id(), self._walk_of(rid, rec)
            name = {"node": f"{rec.name} on rank {rank}", "transfer": f"transfer rank {rank} -> {rec.name}",
                    "walk": f"walk {rec.name}"}.get(rec.kind, rec.kind)
            self.span(name, sid, parent, rec.start_ns, rec.end_ns, rank, pid, attrs, links=self._links(rec, rid))

    def _walk_of(self, rid: str, rec: m.Timing) -> int:
        """The span of the walk the record ran in: that request's latest walk of the name started by then."""
        best = None
        for start, sid in self.walks.get((rid, rec.walk), ()):
            if best is None or start <= rec.start_ns:
                best = sid
        return best if best is not None else self.request_id(rid)

    def _links(self, rec: m.Timing, rid: str) -> list:
        """A batched firing links to every other request it served (in their own traces)."""
        if rec.kind != "node" or len(rec.request_ids) < 2:
            return []
        links = []
        for other in rec.request_ids:
            if other == rid:
                continue
            trace = self.store.trace_of(other)
            if trace is not None and trace.context is not None:
                sid = span_id(trace.context.trace_id, "request", other)
                links.append(self.api.Link(self.ctx(sid, trace.context.trace_id), {"walkserve.request_id": other}))
        return links
