"""GET /v1/requests/{id}/timeline on the fake engine: the id every /v1 answer carries, and timelines off."""

from __future__ import annotations

import httpx
from starlette.testclient import TestClient

from tests.polling import wait_for
from walkserve.api.app import build_app
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig


def test_an_answer_names_its_timeline_by_its_request_id(base_url):
    r = httpx.post(f"{base_url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and "traceparent" not in r.headers  # no OTEL_*: no trace context
    key = r.headers["x-request-id"]

    def with_http_span() -> dict | None:  # the HTTP span closes just after the answer's last byte
        body = httpx.get(f"{base_url}/v1/requests/{key}/timeline", timeout=10).json()
        return body if any(e["name"].startswith("POST ") for e in body["traceEvents"]) else None

    timeline = wait_for(with_http_span, 10)
    assert timeline, "the timeline never showed the HTTP request"
    names = [e["name"] for e in timeline["traceEvents"] if e["ph"] == "X"]
    assert names[0] == "POST /v1/chat/completions" and len(names) == 2 and names[1].startswith("request ")
    rid = names[1].split(" ", 1)[1]
    assert httpx.get(f"{base_url}/v1/requests/{rid}/timeline", timeout=10).json() == timeline  # by the engine's id too


def test_without_timelines_there_is_no_id_and_the_route_says_so():
    with TestClient(build_app(FakeEngine(FakeEngineConfig()))) as client:
        r = client.get("/v1/models")
        assert r.status_code == 200 and "x-request-id" not in r.headers
        r = client.get("/v1/requests/http-1/timeline")
        assert r.status_code == 404 and r.json()["error"]["code"] == "timelines_off"
