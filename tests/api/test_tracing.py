"""OpenTelemetry traces and per-request timelines on a live two-rank server.

One server for the module: the embedded tiny Orpheus on ``orpheus-split`` (the LM on rank 0, the SNAC
codec on rank 1), with ``--api-key``, a trace directory, and ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing
at an OTLP/HTTP receiver the test runs (it decodes each ``ExportTraceServiceRequest``). One speech
request, sent with a client ``traceparent``, must come back as one trace whose spans name every node
of the graph on the rank (and process) that ran it, linked child to parent up to the client's span.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.api.real_server import in_thread_server, wait_for
from walkserve.cli.embedded import ensure_embedded
from walkserve.cli.placement_arg import placement_path
from walkserve.core.config import RuntimeConfig

if not os.environ.get("CI"):  # the otel extra is in the test extras: in CI a missing SDK fails here
    pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

pytestmark = pytest.mark.slow
KEY = "tracing-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
NODES = {"lm": 0, "codec": 1}  # orpheus-split: the graph's nodes and their ranks
SEED = 11  # unseeded, the random LM may sample END_OF_SPEECH before the first frame, and the codec never fires


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it was sent, flattened, with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.take(self.path, ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def take(self, path: str, request: ExportTraceServiceRequest) -> None:
        assert path == "/v1/traces"
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append({
                        "name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
                        "kind": s.kind, "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                        "attrs": {a.key: _value(a.value) for a in s.attributes}, "resource": resource,
                        "links": [(link.trace_id.hex(), link.span_id.hex()) for link in s.links]})


def _value(v):
    return getattr(v, v.WhichOneof("value"))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path, _ = ensure_embedded(tmp_path_factory.mktemp("walkserve-cache"))
    trace_dir = tmp_path_factory.mktemp("traces")
    receiver = Receiver()
    env = pytest.MonkeyPatch()
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    env.setenv("OTEL_SERVICE_NAME", "walkserve-test")
    env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    try:
        runtime = RuntimeConfig(max_running=4, timelines=8, trace_dir=str(trace_dir))
        with in_thread_server("orpheus", path, runtime, placement=placement_path("orpheus-split"), default_max_tokens=71,
                              api_key=KEY) as server:
            yield server, receiver, trace_dir
    finally:
        env.undo()
        receiver.http.shutdown()


@pytest.fixture(scope="module")
def speech(served):
    server = served[0]
    headers = {**AUTH, "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    r = httpx.post(f"{server.url}/v1/audio/speech", json={"input": "Trace me.", "response_format": "wav", "seed": SEED},
                   headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r


def trace_spans(receiver: Receiver) -> list[dict]:
    return [s for s in receiver.spans if s["trace"] == CLIENT_TRACE]


def test_the_response_names_the_server_span_of_the_client_trace(speech):
    version, trace_id, span_id, flags = speech.headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01")
    assert span_id != CLIENT_SPAN and int(span_id, 16) != 0
    assert speech.headers["x-request-id"].startswith("http-")


def test_one_trace_with_every_node_on_its_rank_and_process(served, speech):
    server, receiver, _ = served

    def nodes_in() -> list[dict] | None:
        spans = trace_spans(receiver)
        names = {s["name"] for s in spans}
        return spans if all(f"{n} on rank {r}" in names for n, r in NODES.items()) else None

    spans = wait_for(nodes_in, 30)
    assert spans, f"spans received: {sorted({s['name'] for s in receiver.spans})}"
    pids = server.engine.status.stats.pids
    for node, rank in NODES.items():
        firings = [s for s in spans if s["name"] == f"{node} on rank {rank}"]
        assert firings and all(s["resource"]["walkserve.rank"] == rank for s in firings)
        assert {s["resource"]["process.pid"] for s in firings} == {pids[rank]}, (node, pids)
        assert all(s["resource"]["service.name"] == "walkserve-test" for s in firings)
        assert all(s["start"] <= s["end"] for s in firings)
    assert pids[0] != pids[1] and os.getpid() not in pids.values()
    (http,) = [s for s in spans if s["kind"] == 2]  # SPAN_KIND_SERVER
    assert http["name"] == "POST /v1/audio/speech" and http["parent"] == CLIENT_SPAN
    assert http["id"] == speech.headers["traceparent"].split("-")[2]
    assert http["resource"]["process.pid"] == os.getpid()  # the frontend (this process runs the server)
    assert any(s["name"] == "transfer rank 0 -> rank 1" for s in spans), "no transfer span from rank 0 to rank 1"


def test_parents_link_every_span_up_to_the_client(served, speech):
    _, receiver, _ = served
    assert wait_for(lambda: any(s["name"] == "codec on rank 1" for s in trace_spans(receiver)), 30)
    spans = trace_spans(receiver)
    by_id = {s["id"]: s for s in spans}
    assert len(by_id) == len(spans), "span ids repeat"
    conductor = {s["resource"]["process.pid"] for s in spans if s["name"].startswith("walk ")}
    assert len(conductor) == 1 and conductor.isdisjoint({os.getpid(), *served[0].engine.status.stats.pids.values()})
    for s in spans:
        chain, cur = [s["name"]], s
        while cur["parent"] in by_id:
            cur = by_id[cur["parent"]]
            chain.append(cur["name"])
        assert cur["parent"] == CLIENT_SPAN, f"{chain} ends at {cur['parent']!r}, not the client's span"
        if " on rank " in s["name"]:  # a firing: its walk, the request, the HTTP span
            assert chain[1].startswith("walk ") and chain[2].startswith("request ") and chain[3] == "POST /v1/audio/speech"


def test_the_timeline_has_every_node_per_rank(served, speech):
    server, _, trace_dir = served
    key = speech.headers["x-request-id"]

    def timeline() -> dict | None:
        r = httpx.get(f"{server.url}/v1/requests/{key}/timeline", headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text
        body = r.json()
        names = {(e["name"], e["pid"]) for e in body["traceEvents"] if e["ph"] == "X"}
        return body if {n for n, _ in names} >= set(NODES) else None

    body = wait_for(timeline, 30)
    assert body, "the timeline never showed every node"
    pids = server.engine.status.stats.pids
    processes = {e["pid"]: e["args"]["name"] for e in body["traceEvents"] if e["name"] == "process_name"}
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in body["traceEvents"] if e["name"] == "thread_name"}
    for node, rank in NODES.items():
        events = [e for e in body["traceEvents"] if e["ph"] == "X" and e["name"] == node]
        assert events and {e["pid"] for e in events} == {pids[rank]}
        assert processes[pids[rank]] == f"rank {rank} (pid {pids[rank]})"
        assert {rows[(e["pid"], e["tid"])] for e in events} == {f"node {node}"}
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in events)
    assert body["otherData"]["trace_id"] == CLIENT_TRACE
    written = trace_dir / f"{key}.json"
    assert wait_for(written.exists, 10), sorted(p.name for p in trace_dir.iterdir())
    on_disk = json.loads(written.read_text())
    assert {e["name"] for e in on_disk["traceEvents"] if e["ph"] == "X"} >= set(NODES)


def test_an_unknown_timeline_is_404_and_a_missing_key_401(served):
    server = served[0]
    r = httpx.get(f"{server.url}/v1/requests/http-nothing/timeline", headers=AUTH, timeout=10)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "request_not_found" and r.json()["error"]["param"] == "request_id"
    r = httpx.get(f"{server.url}/v1/requests/http-nothing/timeline", timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
