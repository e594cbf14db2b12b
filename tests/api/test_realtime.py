"""/v1/realtime through the openai package's realtime client, against the fake engine (fast): the handshake,
bad input answered with error events (the session goes on), limits, cancel and barge-in, server VAD, and a
client that vanishes mid-response (its request is aborted, its session freed)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import openai
import pytest
import websockets

from tests.api.helpers import live_server
from tests.api.realtime_client import answer, append_audio, pcm16, until
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

MODEL = "fake-tiny"
MIB = 1024 * 1024


def fake(**more) -> FakeEngine:
    """A fake model that speaks until max_tokens (ignore_eos), a token every 5 ms."""
    return FakeEngine(FakeEngineConfig(audio=True, token_delay_s=0.005, default_sampling={"ignore_eos": True}, **more))


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return fake()


@pytest.fixture(scope="module")
def url(engine):
    with live_server(engine, realtime_max_sessions=4, realtime_max_event_bytes=MIB, realtime_max_buffer_s=3.0) as u:
        yield u


def connect(url: str, **kw):
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=kw.pop("api_key", "unused"), max_retries=0)
    return client.realtime.connect(model=kw.pop("model", MODEL), **kw)


async def opened(conn, **session) -> None:
    assert (await conn.recv()).type == "session.created"
    await conn.session.update(session={"type": "realtime", **session})
    event = await conn.recv()
    assert event.type == "session.updated", event


async def say(conn, text: str) -> None:
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})
    await until(conn, "conversation.item.done")


def tone(seconds: float, level: float = 0.3) -> bytes:
    t = np.arange(int(24000 * seconds)) / 24000
    x = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 16))
    return pcm16(level * x / np.abs(x).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)))


def silence(seconds: float) -> bytes:
    return bytes(2 * int(24000 * seconds))


async def wait_idle(engine: FakeEngine, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.active_requests and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert engine.active_requests == 0


def test_session_created_and_update(url) -> None:
    async def run():
        async with connect(url) as conn:
            created = await conn.recv()
            session = created.session
            assert session.model == MODEL and session.output_modalities == ["audio"]
            assert session.audio.output.voice == "tara" and session.audio.input.turn_detection.type == "server_vad"
            await conn.session.update(session={"type": "realtime", "audio": {"output": {"voice": "nobody"}}})
            error = await conn.recv()
            assert error.type == "error" and error.error.param == "session.audio.output.voice"
            assert error.error.code == "unknown_voice"
            await conn.session.update(session={"type": "realtime", "instructions": "Be kind", "temperature": 0,
                                               "output_modalities": ["text"],
                                               "audio": {"output": {"voice": "Leo", "max_frames": 8}}})
            updated = (await conn.recv()).session
            assert updated.instructions == "Be kind" and updated.audio.output.voice == "leo"
            assert session.audio.output.model_extra["max_frames"] is None  # the chat route's audio.max_frames
            assert updated.audio.output.model_extra["max_frames"] == 8
            assert updated.output_modalities == ["text"] and updated.model_extra["temperature"] == 0
        async with browser(url, "realtime", "openai-beta.realtime-v1") as ws:
            assert ws.subprotocol == "realtime" and json.loads(await ws.recv())["type"] == "session.created"
        async with browser(url) as ws:  # none offered (the openai package's client), none chosen
            assert ws.subprotocol is None and json.loads(await ws.recv())["type"] == "session.created"
    asyncio.run(run())


BAD = [
    ("{not json", "invalid_json", None),
    ("[1, 2]", "invalid_event", None),
    (json.dumps({"type": "session.teleport"}), "invalid_event_type", "type"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "@@@not base64"}), "invalid_base64", "audio"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}),
     "invalid_audio_format", "audio"),
    (json.dumps({"type": "session.update", "session": {"type": "realtime",
                 "audio": {"input": {"format": {"type": "audio/pcmu"}}}}}), "unsupported_format",
     "session.audio.input.format"),
    (json.dumps({"type": "session.update", "session": {"type": "realtime", "temperature": -1}}), "invalid_value",
     "session.temperature"),
    (json.dumps({"type": "session.update", "session": {"type": "realtime",
                 "audio": {"output": {"max_frames": 0}}}}), "invalid_value", "session.audio.output.max_frames"),
    (json.dumps({"type": "session.update", "session": {"type": "realtime",
                 "audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}}), "unsupported_parameter",
     "session.audio.input.turn_detection"),
    (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty", None),
    (json.dumps({"type": "response.cancel"}), "response_cancel_not_active", "response_id"),
    (json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}}),
     "invalid_value", "item.role"),
    (json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": [], "content": []}}),
     "invalid_value", "item.role"),  # unhashable values are refused, not looked up (hypothesis found this one)
    (json.dumps({"type": ["session.update"]}), "invalid_event_type", "type"),
    (json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"output": "loud"}}}),
     "invalid_value", "session.audio.output"),
    (json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": [1]}}}}),
     "invalid_value", "session.audio.output.voice"),
    (json.dumps({"type": "conversation.item.delete", "item_id": "item_nope"}), "item_not_found", "item_id"),
    (json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "hi"}, {"type": "input_audio", "audio": ""}]}}), "invalid_audio",
     "item.content[1].audio"),  # as the chat route's empty audio; once accepted, every later response failed
    (json.dumps({"type": "input_audio_buffer.append", "event_id": "mine", "audio": "A" * (MIB + 10)}),
     "event_too_large", None),
    (json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(silence(3.5)).decode()}),
     "audio_too_long", "audio"),
]


def test_bad_events_get_error_events_and_the_session_goes_on(url, engine) -> None:
    async def run():
        async with connect(url) as conn:
            await opened(conn, audio={"input": {"turn_detection": None}}, max_output_tokens=5)
            for text, code, param in BAD:
                await conn.send_raw(text)
                event = await conn.recv()
                assert event.type == "error", (text[:80], event)
                assert (event.error.code, event.error.param) == (code, param), (text[:80], event.error)
            await append_audio(conn, silence(2.0))  # within the 3 s buffer: no answer
            await append_audio(conn, silence(1.5), chunk=36000)
            assert (await conn.recv()).error.code == "input_audio_buffer_full"
            await conn.input_audio_buffer.clear()
            assert (await conn.recv()).type == "input_audio_buffer.cleared"
            await say(conn, "still here?")
            await conn.response.create()
            got = await answer(conn)
            assert got.done.status == "incomplete" and got.transcript and got.audio and not got.errors
    asyncio.run(run())


def test_a_second_response_while_one_runs_is_an_error_then_cancel_frees_it(url, engine) -> None:
    async def run():
        async with connect(url) as conn:
            await opened(conn, audio={"input": {"turn_detection": None}}, max_output_tokens=1500)
            await say(conn, "talk")
            await conn.response.create()
            first = await until(conn, "response.output_audio.delta")
            await conn.response.create()
            error = await until(conn, "error")
            assert error.error.code == "conversation_already_has_active_response"
            await conn.response.cancel()
            got = await answer(conn, first)
            assert got.done.status == "cancelled" and got.done.status_details.reason == "client_cancelled"
            await wait_idle(engine)
            # the next turn runs as usual
            await conn.response.create(response={"max_output_tokens": 3, "output_modalities": ["text"]})
            again = await answer(conn)
            assert again.done.status == "incomplete" and not again.audio and again.transcript
    asyncio.run(run())


def test_server_vad_commits_answers_and_barge_in_cancels(url, engine) -> None:
    async def run():
        async with connect(url) as conn:
            await opened(conn, max_output_tokens=1500, audio={"input": {"turn_detection": {
                "type": "server_vad", "silence_duration_ms": 400, "prefix_padding_ms": 200}}})
            await append_audio(conn, silence(0.6) + tone(1.0) + silence(0.6))
            seen: list = []
            started = await until(conn, "input_audio_buffer.speech_started", seen)
            assert 560 <= started.audio_start_ms <= 700, started
            stopped = await until(conn, "input_audio_buffer.speech_stopped", seen)
            assert 1900 <= stopped.audio_end_ms <= 2200, stopped
            committed = await until(conn, "input_audio_buffer.committed", seen)
            assert committed.item_id == started.item_id == stopped.item_id
            await until(conn, "response.created", seen)
            said = await until(conn, "response.output_audio.delta", seen)
            # barge-in: speech while the answer plays cancels it
            await append_audio(conn, tone(0.5))
            got = await answer(conn, said)
            assert got.done.status == "cancelled" and got.done.status_details.reason == "turn_detected"
            assert "input_audio_buffer.speech_started" in [t for t in got.types]
            item = got.done.output[0]
            assert item.status == "incomplete" and item.content[0].transcript is not None
            await wait_idle(engine)
            await append_audio(conn, silence(0.6))
            await until(conn, "input_audio_buffer.committed")
            await until(conn, "response.created")
            await conn.response.cancel()
            await until(conn, "response.done")
    asyncio.run(run())


def test_truncate_and_delete(url) -> None:
    async def run():
        async with connect(url) as conn:
            await opened(conn, audio={"input": {"turn_detection": None}}, max_output_tokens=12)
            await say(conn, "hello")
            await conn.response.create()
            got = await answer(conn)
            item = got.done.output[0]
            sent_ms = len(got.audio) // 2 * 1000 // 24000
            await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=sent_ms + 100)
            assert (await conn.recv()).error.param == "audio_end_ms"
            await conn.conversation.item.truncate(item_id=item.id, content_index=0, audio_end_ms=sent_ms // 2)
            truncated = await conn.recv()
            assert truncated.type == "conversation.item.truncated" and truncated.audio_end_ms == sent_ms // 2
            await conn.conversation.item.retrieve(item_id=item.id)
            assert (await conn.recv()).item.content[0].transcript == ""  # no text the user did not hear
            await conn.conversation.item.delete(item_id=item.id)
            assert (await conn.recv()).type == "conversation.item.deleted"
            await conn.conversation.item.retrieve(item_id=item.id)
            assert (await conn.recv()).error.code == "item_not_found"
    asyncio.run(run())


def test_session_cap_and_unknown_model(url) -> None:
    async def run():
        async with connect(url, model="gpt-realtime") as conn:
            error = await conn.recv()
            assert error.type == "error" and error.error.code == "model_not_found"
        held = [await connect(url).enter() for _ in range(4)]
        try:
            async with connect(url) as conn:
                error = await conn.recv()
                assert error.error.code == "session_limit_reached"
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await conn.recv()
                assert closed.value.rcvd.code == 1013
        finally:
            for conn in held:
                await conn.close()
    asyncio.run(run())


def browser(url: str, *subprotocols: str):
    """A socket as a browser's ``new WebSocket(url, protocols)`` opens it: no headers, the key among the protocols."""
    return websockets.connect(url.replace("http", "ws", 1) + f"/v1/realtime?model={MODEL}", subprotocols=subprotocols or None)


def test_api_key_idle_timeout_and_session_length() -> None:
    async def run(url):
        with pytest.raises(websockets.InvalidStatus):
            async with connect(url, api_key="wrong") as conn:
                await conn.recv()
        for wrong in (("realtime",), ("realtime", "openai-insecure-api-key.wrong", "openai-beta.realtime-v1")):
            with pytest.raises(websockets.InvalidStatus):
                async with browser(url, *wrong) as ws:
                    await ws.recv()
        async with browser(url, "realtime", "openai-insecure-api-key.k", "openai-beta.realtime-v1") as ws:
            assert ws.subprotocol == "realtime"  # a browser fails a handshake that offered protocols and got none
            assert json.loads(await ws.recv())["type"] == "session.created"
        async with connect(url, api_key="k") as conn:
            assert (await conn.recv()).type == "session.created"
            error = await conn.recv()  # nothing sent for 0.5 s
            assert error.type == "error" and error.error.code == "session_idle_timeout"
        async with connect(url, api_key="k") as conn:
            await conn.recv()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2:
                await conn.session.update(session={"type": "realtime"})
                event = await conn.recv()
                if event.type == "error":
                    assert event.error.code == "session_expired"
                    return
            raise AssertionError("the session outlived its limit")
    with live_server(fake(), api_key="k", realtime_idle_timeout_s=0.5, realtime_max_session_s=1.0) as url:
        asyncio.run(run(url))


CLIENT = """
import asyncio, sys, openai
async def main():
    client = openai.AsyncOpenAI(base_url=sys.argv[1] + "/v1", api_key="x", max_retries=0)
    async with client.realtime.connect(model="fake-tiny") as conn:
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 1500})
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "go"}]})
        await conn.response.create()
        async for event in conn:
            if event.type == "response.output_audio.delta":
                print("speaking", flush=True)
                await asyncio.sleep(60)
asyncio.run(main())
"""


def test_a_killed_client_frees_its_request_and_session(url, engine, tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    process = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "speaking"
        assert engine.active_requests == 1
    finally:
        process.kill()
        process.wait(10)
    asyncio.run(wait_idle(engine))

    async def full_house():  # the killed client's session is freed: the cap (4) still admits four
        held = [await connect(url).enter() for _ in range(4)]
        try:
            assert [(await conn.recv()).type for conn in held] == ["session.created"] * 4
        finally:
            for conn in held:
                await conn.close()
    asyncio.run(full_house())


CLIENT_TYPES = ["session.update", "input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear",
                "conversation.item.create", "conversation.item.delete", "conversation.item.truncate",
                "conversation.item.retrieve", "response.create", "response.cancel", "output_audio_buffer.clear"]


def drawn_events():
    from hypothesis import strategies as st

    scalar = st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.floats(allow_nan=False) | st.text(max_size=12)
    value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["type", "role", "content", "text", "audio", "item", "session", "response", "voice", "format",
                         "turn_detection", "input", "output", "threshold", "rate", "item_id", "audio_end_ms"]),
        inner, max_size=4), max_leaves=12)
    fields = st.dictionaries(st.sampled_from(["session", "audio", "item", "item_id", "content_index", "audio_end_ms",
                                              "response", "response_id", "previous_item_id", "event_id"]), value, max_size=4)
    return st.builds(lambda kind, more: {**more, "type": kind}, st.sampled_from(CLIENT_TYPES), fields)


def test_drawn_events_get_answers_never_internal_errors(url, engine) -> None:
    """Hypothesis draws client events of every type with odd fields; each is answered (an error event names
    the problem, or the event's own answer), never an internal error, and the session keeps answering."""
    from hypothesis import HealthCheck, given, settings

    async def probe(conn, text: str) -> list:
        await conn.send_raw(text)
        await conn.send_raw(json.dumps({"type": "conversation.item.retrieve", "item_id": "probe", "event_id": "probe"}))
        seen: list = []
        while True:
            event = await asyncio.wait_for(conn.recv(), 30)
            if event.type == "error" and event.error.event_id == "probe":
                return seen
            seen.append(event)

    async def run(events: list[dict]) -> None:
        async with connect(url) as conn:
            await opened(conn, audio={"input": {"turn_detection": None}}, max_output_tokens=3)
            for drawn in events:
                seen = await probe(conn, json.dumps(drawn))
                for event in seen:
                    if event.type == "error":
                        assert event.error.type != "server_error", (drawn, event.error)
                kinds = [e.type for e in seen]
                if "response.created" in kinds and "response.done" not in kinds:
                    await until(conn, "response.done")  # let a drawn response finish before the next event

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(events=__import__("hypothesis").strategies.lists(drawn_events(), min_size=1, max_size=6))
    def check(events: list[dict]) -> None:
        asyncio.run(run(events))

    check()
    asyncio.run(wait_idle(engine))



def test_a_client_that_stops_reading_ends_its_session_and_frees_its_request(monkeypatch) -> None:
    """The response outruns a client that reads nothing (no writer takes the session's events here): once its outbox
    stayed full for ``STALLED_S`` the session ends, and closing it (as the socket then does) aborts the response's
    request instead of holding it until the session's time limit."""
    from walkserve.api.config import ServerConfig
    from walkserve.api.realtime import session as realtime_session
    from walkserve.api.state import AppState

    monkeypatch.setattr(realtime_session, "OUTBOX", 8)
    monkeypatch.setattr(realtime_session, "STALLED_S", 0.3)
    engine = fake()  # a token every 5 ms: 2000 of them outlast the test

    async def run() -> None:
        session = realtime_session.RealtimeSession(AppState(engine, ServerConfig()), MODEL)
        await session.handle(json.dumps({"type": "session.update", "session": {"max_output_tokens": 2000}}))
        await session.handle(json.dumps({"type": "response.create"}))
        await asyncio.wait_for(session.ended.wait(), 10)
        assert session.end_reason.code == "client_not_reading" and engine.active_requests == 1
        await session.close()
        await wait_idle(engine)
        assert engine.stats().aborted == 1
    asyncio.run(run())
