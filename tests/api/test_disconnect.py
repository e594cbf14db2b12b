"""Against a live server: a client that goes away frees its request; overload gets 429s, never 5xx, flat memory."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

from .helpers import live_server

LONG = {"ignore_eos": True, "max_tokens": 2000}  # ~10 s at 5 ms a token


@pytest.fixture(scope="module")
def slow() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(FakeEngineConfig(token_delay_s=0.005, max_running=4, max_waiting=4, retry_after_s=1.0))
    with live_server(engine) as url:
        yield url, engine


def gauge(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def wait_running(base_url: str, want: float, within_s: float) -> float:
    deadline = time.monotonic() + within_s
    while True:
        value = gauge(base_url, "walkserve_requests_running")
        if value == want or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def test_disconnect_mid_stream_frees_the_request(slow: tuple[str, FakeEngine]) -> None:
    base_url, engine = slow
    with httpx.Client(timeout=10) as client:
        body = {"messages": [{"role": "user", "content": "go"}], "stream": True, **LONG}
        with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert got[0].startswith("data: ")
            assert wait_running(base_url, 1, 1.0) == 1
    t0 = time.monotonic()
    assert wait_running(base_url, 0, 1.0) == 0
    assert time.monotonic() - t0 < 1.0 and engine.active_requests == 0


@pytest.mark.parametrize("route,body", [
    ("/v1/completions", {"prompt": "hold on", **LONG}),
    ("/v1/generate", {"inputs": {"prompt": "hold on"}, "sampling": LONG, "stream": False}),
])
def test_disconnect_while_waiting_for_a_non_streamed_answer(slow: tuple[str, FakeEngine], route: str, body: dict) -> None:
    base_url, engine = slow
    host, port = base_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    request = (f"POST {route} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(request)
        assert wait_running(base_url, 1, 2.0) == 1
    assert wait_running(base_url, 0, 1.0) == 0 and engine.active_requests == 0


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


async def burst(base_url: str, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as client:
        async def one(i: int) -> httpx.Response:
            body = {"prompt": f"load {i}", "max_tokens": 8, "stream": i % 2 == 0}
            return await client.post("/v1/completions", json=body)

        return await asyncio.gather(*(one(i) for i in range(count)))


def test_overload_gets_429_never_5xx_and_memory_stays_flat(slow: tuple[str, FakeEngine]) -> None:
    base_url, engine = slow
    asyncio.run(burst(base_url, 200))  # warm-up: imports, pools, first allocations
    baseline = rss_kib()
    for _ in range(2):
        responses = asyncio.run(burst(base_url, 200))
        statuses = [r.status_code for r in responses]
        assert not [s for s in statuses if s >= 500], statuses
        assert set(statuses) <= {200, 429}
        rejected = [r for r in responses if r.status_code == 429]
        assert len(rejected) > 100 and statuses.count(200) >= 8
        assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "server_busy" for r in rejected)
    growth_mib = (rss_kib() - baseline) / 1024
    assert growth_mib < 40, growth_mib
    assert wait_running(base_url, 0, 1.0) == 0 and engine.active_requests == 0
    assert 'walkserve_http_rejected_total{route="/v1/completions"}' in httpx.get(f"{base_url}/metrics").text
