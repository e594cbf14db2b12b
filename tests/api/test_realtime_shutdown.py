"""/v1/realtime at the edges of a session's life, against the fake engine: the server's shutdown closes open sessions
cleanly (their running response ends, an ``error`` event says why, close 1001, nothing left running), and a frame
over the event limit but under the frame ceiling is an ``error`` event with the session intact."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.api.helpers import serving
from tests.api.test_realtime import fake, wait_idle

KIB = 1024


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/realtime?model=fake-tiny"


async def recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), 30))


async def until(ws, kind: str, seen: list | None = None) -> dict:
    while True:
        event = await recv(ws)
        if event["type"] == kind:
            return event
        if seen is not None:
            seen.append(event["type"])


async def closed_code(ws) -> int:
    """Read up to the close; the code the server closed with."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), 30)
    except ConnectionClosed as closed:
        assert closed.rcvd is not None, "the server did not send a close frame"
        return closed.rcvd.code


async def speaking(ws, tokens: int) -> None:
    """A session answering a long spoken response (the fake engine: a token every 5 ms)."""
    await until(ws, "session.created")
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": tokens}}))
    await until(ws, "session.updated")
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}}))
    await ws.send(json.dumps({"type": "response.create"}))
    await until(ws, "response.output_audio.delta")


def test_a_drain_ends_sessions_with_an_error_event_and_close_1001() -> None:
    """SIGTERM's drain: an idle session ends at once; a speaking one gets the drain's grace, then its response is
    cancelled; both get ``server_shutting_down`` and 1001, and no request is left in the engine."""
    engine = fake()

    async def run(url, server):
        async with connect(ws_url(url)) as idle, connect(ws_url(url)) as busy:
            await until(idle, "session.created")
            await speaking(busy, 1500)  # 7.5 s of tokens: longer than the drain's grace
            assert engine.active_requests == 1
            t0 = time.monotonic()
            server.handle_exit(signal.SIGTERM, None)
            error = await until(idle, "error")
            assert error["error"]["code"] == "server_shutting_down" and error["error"]["param"] is None
            assert await closed_code(idle) == 1001
            seen: list[str] = []
            done = await until(busy, "response.done", seen)
            assert done["response"]["status"] == "cancelled" and "response.output_audio.done" in seen
            assert time.monotonic() - t0 >= 0.5  # the response had the grace
            assert (await until(busy, "error"))["error"]["code"] == "server_shutting_down"
            assert await closed_code(busy) == 1001
        await wait_idle(engine)

    with serving(engine, drain_timeout_s=0.5) as (url, server):
        asyncio.run(run(url, server))


def test_a_response_that_ends_within_the_drain_completes_first() -> None:
    engine = fake()

    async def run(url, server):
        async with connect(ws_url(url)) as ws:
            await speaking(ws, 60)  # 0.3 s
            server.handle_exit(signal.SIGTERM, None)
            done = await until(ws, "response.done")
            assert done["response"]["status"] == "incomplete"  # max_output_tokens reached, not cancelled
            assert (await until(ws, "error"))["error"]["code"] == "server_shutting_down"
            assert await closed_code(ws) == 1001
        await wait_idle(engine)

    with serving(engine, drain_timeout_s=20) as (url, server):
        asyncio.run(run(url, server))


def test_a_stop_without_a_drain_still_closes_sessions_cleanly() -> None:
    """``should_exit`` (no signal, no drain): the session still gets its event and 1001, not uvicorn's bare 1012."""
    engine = fake()

    async def run(url, server):
        async with connect(ws_url(url)) as ws:
            await speaking(ws, 1500)
            server.should_exit = True
            seen: list[str] = []
            error = await until(ws, "error", seen)
            assert error["error"]["code"] == "server_shutting_down" and "response.done" in seen
            assert await closed_code(ws) == 1001
        await wait_idle(engine)

    with serving(engine) as (url, server):
        asyncio.run(run(url, server))


def test_an_event_over_the_limit_is_an_error_event_and_the_session_goes_on() -> None:
    """Event limit 64 KiB, frame ceiling 4 MiB: a 2 MiB append (over the openpi route's 64 KiB + 1 MiB) is an
    ``error`` event and the session answers the next event; a frame over the ceiling closes the socket (1009)."""

    async def run(url):
        async with connect(ws_url(url), max_size=None) as ws:
            await until(ws, "session.created")
            audio = base64.b64encode(bytes(3 * 512 * KIB)).decode()  # 2 MiB of base64
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "event_id": "big", "audio": audio}))
            error = await until(ws, "error")
            assert error["error"]["code"] == "event_too_large"
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "hi"}}))
            assert (await until(ws, "session.updated"))["session"]["instructions"] == "hi"
            await ws.send("x" * (4 * 1024 * KIB + 1))
            assert await closed_code(ws) == 1009

    with serving(fake(), realtime_max_event_bytes=64 * KIB, max_ws_message_bytes=64 * KIB,
                 realtime_max_frame_bytes=4 * 1024 * KIB) as (url, _):
        asyncio.run(run(url))
