"""The frontend's timeline store, the Chrome trace it renders, W3C trace context, and OpenTelemetry off by default."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from walkserve.core.errors import ConfigError
from walkserve.core.trace import (
    CURRENT,
    TraceScope,
    install_log_context,
    parse_traceparent,
    server_context,
)
from walkserve.entrypoint import otel
from walkserve.entrypoint.chrome_trace import TraceDirSink, chrome_trace
from walkserve.entrypoint.timeline import GRACE_S, TimelineStore
from walkserve.protocol import messages as m


class Sink:
    def __init__(self) -> None:
        self.exports: list[tuple[str, int, bool]] = []

    def export(self, trace, store, new, first) -> None:
        self.exports.append((trace.key, len(new), first))

    def close(self) -> None:
        pass


def make_store(keep: int):
    pending: list = []
    sink = Sink()
    store = TimelineStore(keep, [sink], lambda delay, f: pending.append((delay, f)))

    def run_pending() -> None:
        while pending:
            pending.pop(0)[1]()

    return store, sink, pending, run_pending


def node(name: str, rids: list[str], start: int = 100, end: int = 200) -> m.Timing:
    return m.Timing("node", name, "decode", start, end, rids, {"component": name, "batch": len(rids)})


def test_a_batched_firing_is_in_the_timeline_of_each_request_it_served():
    store, _, _, _ = make_store(4)
    for key, rid in (("http-a", "a"), ("http-b", "b")):
        token = CURRENT.set(TraceScope(key))
        store.submitted(rid)
        CURRENT.reset(token)
    store.add(m.Timings(0, 11, [node("lm", ["a", "b"]), node("lm", ["c"])]))  # c: not a request of this frontend
    a, b = store.get("http-a"), store.get("b")
    assert b.key == "http-b" and store.get("a") is a
    assert [(rank, pid, r.name, r.request_ids) for rank, pid, r in a.records] == [(0, 11, "lm", ["a", "b"])]
    assert [r.request_ids for _, _, r in b.records] == [["a", "b"]]


def test_a_trace_goes_to_the_sinks_once_complete_then_late_records_follow():
    store, sink, pending, run_pending = make_store(4)
    token = CURRENT.set(TraceScope("http-a"))
    store.submitted("a")
    CURRENT.reset(token)
    store.add(m.Timings(0, 11, [node("lm", ["a"])]))
    store.finished("a", "stop")
    assert not pending  # the HTTP answer is still going out
    store.http_done("http-a", "POST /v1/audio/speech", 200, {}, 50)
    assert [d for d, _ in pending] == [GRACE_S]
    run_pending()
    store.add(m.Timings(1, 12, [node("codec", ["a"]), node("codec", ["a"])]))
    run_pending()
    assert sink.exports == [("http-a", 1, True), ("http-a", 2, False)]


def test_the_ring_keeps_the_last_finished_requests_and_every_running_one():
    store, _, _, run_pending = make_store(2)
    store.submitted("running")
    for rid in ("r1", "r2", "r3"):
        store.submitted(rid)
        store.finished(rid, "stop")
        run_pending()
    assert store.get("r1") is None and store.get("r2") is not None and store.get("r3") is not None
    assert store.get("running") is not None and "r1" not in store.by_request


def test_the_chrome_trace_has_a_process_per_rank_and_a_row_per_node():
    store, _, _, _ = make_store(2)
    store.submitted("a")
    store.add(m.Timings(-1, 20, [m.Timing("walk", "decode", "decode", 150, 900, ["a"], {})]))
    store.add(m.Timings(0, 21, [node("lm", ["a"], 200, 300), node("lm", ["a"], 300, 450)]))
    store.add(m.Timings(1, 22, [node("codec", ["a"], 400, 700)]))
    store.finished("a", "stop")
    body = chrome_trace(store.get("a"), frontend_pid=5)
    events = [e for e in body["traceEvents"] if e["ph"] == "X"]
    names = {e["pid"]: e["args"]["name"] for e in body["traceEvents"] if e["name"] == "process_name"}
    assert names == {5: "frontend (pid 5)", 20: "conductor (pid 20)", 21: "rank 0 (pid 21)", 22: "rank 1 (pid 22)"}
    lm = [e for e in events if e["name"] == "lm"]
    assert [(e["pid"], e["dur"]) for e in lm] == [(21, 0.1), (21, 0.15)] and lm[1]["ts"] - lm[0]["ts"] == pytest.approx(0.1)
    assert len({e["tid"] for e in lm}) == 1
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in body["traceEvents"] if e["name"] == "thread_name"}
    assert rows[(21, lm[0]["tid"])] == "node lm" and ("walk decode", 20) in {(e["name"], e["pid"]) for e in events}
    assert min(e["ts"] for e in events) == 0


@pytest.mark.parametrize("header, parsed", [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", (0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, True)),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", (0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, False)),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None),
    ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None),
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", None),
    ("garbage", None),
    (None, None),
])
def test_traceparent_parsing(header, parsed):
    assert parse_traceparent(header) == parsed


def test_the_server_span_is_a_child_of_the_client_span_or_a_new_root():
    child = server_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert (child.trace_hex, child.parent_id) == ("4bf92f3577b34da6a3ce929d0e0e4736", 0x00f067aa0ba902b7)
    assert child.traceparent.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and child.span_id != child.parent_id
    root = server_context("not a traceparent")
    assert root.parent_id == 0 and root.trace_id != child.trace_id and root.traceparent.endswith("-01")


def test_log_lines_in_a_request_name_its_trace(caplog):
    install_log_context()
    context = server_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    token = CURRENT.set(TraceScope("http-x", context))
    with caplog.at_level(logging.INFO):
        logging.getLogger("walkserve.test").info("inside")
        CURRENT.reset(token)
        logging.getLogger("walkserve.test").info("outside")
    inside, outside = caplog.records
    assert inside.trace == f" request_id=http-x trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id={context.span_id:016x}"
    assert outside.trace == ""


def test_tracing_is_off_without_otel_variables(monkeypatch):
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert otel.open_sink() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    assert otel.wanted()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not otel.wanted()


def test_serving_without_otel_imports_no_sdk():
    code = ("import sys; from walkserve.api.app import build_app; import walkserve.entrypoint.engine; "
            "from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig; "
            "build_app(FakeEngine(FakeEngineConfig(timelines=4))); "
            "print(sorted(n for n in sys.modules if n.startswith('opentelemetry.sdk')))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_trace_dir_gets_one_file_per_request_named_by_its_key(tmp_path):
    store, _, _, run_pending = make_store(0)
    store.sinks = [TraceDirSink(tmp_path / "traces")]
    store.submitted("req/1")
    store.add(m.Timings(0, 21, [node("lm", ["req/1"])]))
    store.finished("req/1", "stop")
    run_pending()
    (written,) = (tmp_path / "traces").iterdir()
    assert written.name == "req_1.json" and [e["name"] for e in json.loads(written.read_text())["traceEvents"]
                                              if e["ph"] == "X"] == ["request req/1", "lm"]
    assert store.get("req/1") is None  # keep 0: gone once written
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot be created"):
        TraceDirSink(tmp_path / "file" / "traces")
