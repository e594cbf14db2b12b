"""The frontend's OpenTelemetry spans from timing records: explicit ids, parents by walk, links across a batch."""

from __future__ import annotations

import os

import pytest

if not os.environ.get("CI"):  # the otel extra is in the test extras: in CI a missing SDK fails here
    pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from walkserve.core.trace import CURRENT, TraceScope, server_context
from walkserve.entrypoint.otel import OtelSink
from walkserve.entrypoint.timeline import TimelineStore
from walkserve.protocol import messages as m


@pytest.fixture
def traced(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # replaced below: nothing is printed
    sink = OtelSink()
    memory = InMemorySpanExporter()
    sink.processor = SimpleSpanProcessor(memory)
    pending: list = []
    store = TimelineStore(4, [sink], lambda delay, f: pending.append(f), tracing=True)
    return store, memory, pending


def http_request(store: TimelineStore, key: str, rid: str, traceparent: str | None = None):
    context = server_context(traceparent)
    token = CURRENT.set(TraceScope(key, context))
    store.submitted(rid)
    CURRENT.reset(token)
    return context


def test_a_batched_firing_links_the_other_requests_and_sits_in_its_walk(traced):
    store, memory, pending = traced
    a = http_request(store, "http-a", "a", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    b = http_request(store, "http-b", "b")
    store.add(m.Timings(-1, 20, [m.Timing("walk", "decode", "decode", 100, 200, ["a"], {}),
                                 m.Timing("walk", "decode", "decode", 300, 400, ["a"], {}),
                                 m.Timing("walk", "decode", "decode", 100, 400, ["b"], {})]))
    store.add(m.Timings(0, 21, [m.Timing("node", "lm", "decode", 320, 330, ["a", "b"], {"batch": 2})]))
    for key, rid, status in (("http-a", "a", 200), ("http-b", "b", 500)):
        store.finished(rid, "stop" if rid == "a" else "error")
        store.http_done(key, "POST /v1/audio/speech", status, {}, 50)
    for flush in pending:
        flush()
    spans = memory.get_finished_spans()
    by = {(s.context.trace_id, s.name): s for s in spans if not s.name.startswith("walk")}
    lm_a, lm_b = by[(a.trace_id, "lm on rank 0")], by[(b.trace_id, "lm on rank 0")]
    req_a, req_b = by[(a.trace_id, "request a")], by[(b.trace_id, "request b")]
    walks_a = sorted((s for s in spans if s.context.trace_id == a.trace_id and s.name == "walk decode"),
                     key=lambda s: s.start_time)
    assert lm_a.parent.span_id == walks_a[1].context.span_id  # the walk running at 320 ns, not the first one
    assert [(link.context.trace_id, link.context.span_id) for link in lm_a.links] == [(b.trace_id, req_b.context.span_id)]
    assert [(link.context.trace_id, link.context.span_id) for link in lm_b.links] == [(a.trace_id, req_a.context.span_id)]
    http_a = by[(a.trace_id, "POST /v1/audio/speech")]
    assert http_a.context.span_id == a.span_id and http_a.parent.span_id == 0x00f067aa0ba902b7
    assert req_a.parent.span_id == a.span_id and walks_a[0].parent.span_id == req_a.context.span_id
    assert lm_a.resource.attributes["walkserve.rank"] == 0 and lm_a.resource.attributes["process.pid"] == 21
    assert by[(b.trace_id, "POST /v1/audio/speech")].status.is_ok is False and req_b.status.is_ok is False
    assert http_a.status.is_ok and req_a.status.is_ok


def test_an_unsampled_client_trace_is_not_exported(traced):
    store, memory, pending = traced
    http_request(store, "http-a", "a", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
    store.finished("a", "stop")
    store.http_done("http-a", "POST /v1/audio/speech", 200, {}, 50)
    for flush in pending:
        flush()
    assert pending and memory.get_finished_spans() == ()
