"""A burst of real-time speech streams over capacity on the live tiny Orpheus (the session's shared server).

The shared server admits at most one real-time stream and lets none wait
(``orpheus_split``: ``max_streams=1``, TTFA budget 0), so while one long
stream plays, every stream of a burst is surely over capacity, whatever this
machine's load: each must be answered 429 with ``Retry-After`` and the error
envelope, the playing stream must arrive without a gap (by the playback
clock, at the client and in the server's own metrics), and once it ends
nothing is left: no open stream, no stream in the runtime, and a new stream
is admitted again.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.api.conftest import ORPHEUS_SPLIT_STREAMS
from tests.api.real_server import wait_for
from tests.api.test_dashboard import scrape

pytestmark = pytest.mark.slow
ROUTE = "/v1/audio/speech"
RATE = 24000
LONG_TOKENS = 1400  # 200 frames = 17 s of audio: it is still being made while the burst arrives
BURST = 6
PROBES = 8  # streams over capacity sent one at a time (with /health and /metrics) to time the answers


def _total(samples: dict, name: str, **labels: str) -> float:
    return sum(s["_value"] for s in samples.get(name, []) if all(s.get(k) == v for k, v in labels.items()))


def _body(text: str, max_tokens: int) -> dict:
    return {"input": text, "voice": "tara", "response_format": "pcm", "seed": 5, "max_tokens": max_tokens}


def _play(client: httpx.Client, body: dict, started: threading.Event | None = None) -> tuple[int, list[tuple[float, float]], float]:
    """One streamed request: (status, [(arrival s, samples)] of its chunks as they came off the socket, submit time)."""
    t0 = time.monotonic()
    chunks: list[tuple[float, int]] = []
    with client.stream("POST", ROUTE, json=body, timeout=300) as r:
        for data in r.iter_bytes():
            if data:
                chunks.append((time.monotonic() - t0, len(data) / 2))
                if started is not None:
                    started.set()
        return r.status_code, chunks, t0


def gaps(chunks: list[tuple[float, float]], buffer_max_s: float = 1.0) -> list[float]:
    """How late each late chunk was: playback starts at the first chunk, after a start-up buffer of
    min(TTFA, buffer_max_s); a late chunk stalls playback by its lateness."""
    start, played, stall, late = chunks[0][0], 0.0, 0.0, []
    buffer = min(buffer_max_s, start)
    for arrival, samples in chunks[1:]:
        due = start + buffer + played + stall
        if arrival > due:
            late.append(arrival - due)
            stall += arrival - due
        played += samples / RATE
    return late


def _rejected(client: httpx.Client, i: int) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = client.post(ROUTE, json=_body(f"Burst number {i}.", 71), timeout=60)
    return r, time.monotonic() - t0


def _timed(client: httpx.Client, method: str, path: str, **kw) -> tuple[int, float]:
    t0 = time.monotonic()
    status = client.request(method, path, timeout=30, **kw).status_code
    return status, (time.monotonic() - t0) * 1e3


def _probes(client: httpx.Client, n: int = PROBES) -> dict[str, list[tuple[int, float]]]:
    """One at a time while the stream plays: a stream over capacity, /health, /metrics (status, ms)."""
    out: dict[str, list[tuple[int, float]]] = {"429": [], "health": [], "metrics": []}
    for i in range(n):
        out["429"].append(_timed(client, "POST", ROUTE, json=_body(f"Probe {i}.", 71)))
        out["health"].append(_timed(client, "GET", "/health"))
        out["metrics"].append(_timed(client, "GET", "/metrics"))
    return out


def test_a_burst_over_capacity_is_rejected_and_the_admitted_stream_plays_without_gaps(orpheus_split):
    url = orpheus_split.url
    assert ORPHEUS_SPLIT_STREAMS == 1
    before = scrape(url)
    started = threading.Event()
    # Clients made beforehand: making one (its TLS context) while the stream plays would stall this process,
    # which also runs the server, and so the stream.
    with ThreadPoolExecutor(BURST + 1) as pool, httpx.Client(base_url=url) as player, \
            httpx.Client(base_url=url, limits=httpx.Limits(max_connections=BURST + 1)) as knocker:
        long = pool.submit(_play, player, _body("A long story, told while the others knock.", LONG_TOKENS), started)
        assert started.wait(120), "the first stream never sent audio"
        answers = list(pool.map(lambda i: _rejected(knocker, i), range(BURST)))
        health = knocker.get("/health", timeout=10)
        during = scrape(url)  # the runtime's own estimate while the one stream runs
        probes = _probes(knocker)
        still_playing = not long.done()
        status, chunks, _ = long.result(300)
        burst = [r for r, _ in answers]

    assert health.status_code == 200
    # Rejected in milliseconds at the HTTP layer, and the server stays responsive, while a stream plays: the
    # medians are bounded below the 40 ms a response waits for a delayed ACK when Nagle's algorithm is left on
    # (what every answer took before), with room for a loaded machine.
    assert still_playing, "the stream ended before the probes: they measured an idle server"
    for kind, expected in (("429", 429), ("health", 200), ("metrics", 200)):
        assert [code for code, _ in probes[kind]] == [expected] * len(probes[kind]), kind
        times = sorted(ms for _, ms in probes[kind])
        assert times[len(times) // 2] < 30 and times[-1] < 1000, (kind, times)
    for r in burst:
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "server_busy" and r.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert status == 200
    assert sum(n for _, n in chunks) == (LONG_TOKENS // 7) * 2048
    long_chunks = chunks

    def settled() -> dict | None:
        now = scrape(url)
        return now if _total(now, "walkserve_streams_running") == 0 and _total(
            now, "walkserve_audio_streams_active", route=ROUTE) == 0 else None

    after = wait_for(settled, 30) and settled()
    assert after, "a stream is still counted as open after every request ended"
    grew = {name: _total(after, name, **labels) - _total(before, name, **labels) for name, labels in (
        ("walkserve_audio_streams_admitted_total", {"route": ROUTE}),
        ("walkserve_audio_streams_rejected_total", {"route": ROUTE, "reason": "capacity"}),
            ("walkserve_streams_rejected_capacity_total", {}),
        ("walkserve_http_rejected_total", {"route": ROUTE}))}
    assert grew == {"walkserve_audio_streams_admitted_total": 1, "walkserve_audio_streams_rejected_total": BURST + PROBES,
                    "walkserve_streams_rejected_capacity_total": BURST + PROBES,
                    "walkserve_http_rejected_total": BURST + PROBES}
    assert _total(after, "walkserve_stream_capacity") >= 1

    with httpx.Client(base_url=url) as client:
        status, chunks, _ = _play(client, _body("And one more, now that there is room.", 71))
    assert status == 200 and sum(n for _, n in chunks) == 10 * 2048

    # Gap-free: admission keeps the streams it admits real-time. One stream always runs (capacity >= 1), so on a
    # machine so loaded that the runtime measures one stream alone as slower than real time, no admission can
    # make it viable: then the runtime must have known it (its estimated load for one stream past 1).
    load = _total(during, "walkserve_stream_load")
    server_gaps = _total(after, "walkserve_audio_stream_gaps_total", route=ROUTE) - _total(
        before, "walkserve_audio_stream_gaps_total", route=ROUTE)
    if _total(during, "walkserve_stream_capacity_measured") == 1 and load > 1:
        assert _total(during, "walkserve_stream_capacity") == 1
        pytest.skip(f"this machine runs one stream at {load:.2f}x the time real time allows now (busy): "
                    f"{len(gaps(long_chunks))} gaps, rightly estimated")
    assert gaps(long_chunks) == [] and server_gaps == 0
