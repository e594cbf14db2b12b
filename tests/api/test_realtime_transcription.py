"""/v1/realtime input audio transcription on the fake engine, through the openai package's realtime client: the GA
events of a committed turn (delta, then completed with usage), the transcript equal to /v1/audio/transcriptions' for
the same audio and settings, the item keeping it, a failed transcription as its own event, and bad settings refused.
(The tiny Qwen3-Omni's transcripts against the route: tests/models/qwen3_omni/test_realtime.py.)"""

from __future__ import annotations

import asyncio
import io

import httpx
import numpy as np
import soundfile as sf

from tests.api.helpers import live_server
from tests.api.realtime_client import append_audio, until
from tests.api.test_realtime import connect, fake, opened, tone
from walkserve.testing.fake_engine import FAIL_MAGIC

PREFIX = "conversation.item.input_audio_transcription"
SETTINGS = {"model": "whisper-1", "language": "de", "prompt": "Bahnhof"}
MAX_TOKENS = 24  # the server's default_max_tokens: unset, the fake model (ignore_eos) fills its 2,048-token context


def route_transcript(url: str, pcm: bytes, **form) -> str:
    """What POST /v1/audio/transcriptions answers for a WAV of ``pcm`` (pcm16 at 24 kHz)."""
    buffer = io.BytesIO()
    sf.write(buffer, np.frombuffer(pcm, "<i2"), 24000, format="WAV", subtype="PCM_16")
    reply = httpx.post(f"{url}/v1/audio/transcriptions", data=form, files={"file": ("turn.wav", buffer.getvalue())},
                       timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["text"]


async def committed_turn(conn, pcm: bytes) -> str:
    await append_audio(conn, pcm)
    await conn.input_audio_buffer.commit()
    return (await until(conn, "input_audio_buffer.committed")).item_id


def test_a_committed_turn_is_transcribed_as_the_transcription_route_would() -> None:
    pcm = tone(1.0)

    async def run(url):
        async with connect(url) as conn:
            await opened(conn, audio={"input": {"turn_detection": None, "transcription": SETTINGS}})
            item_id = await committed_turn(conn, pcm)
            seen: list = []
            done = await until(conn, f"{PREFIX}.completed", seen)
            deltas = [e for e in seen if e.type == f"{PREFIX}.delta"]
            assert deltas and all(e.item_id == item_id and e.content_index == 0 for e in deltas)
            assert done.item_id == item_id and done.content_index == 0
            assert done.transcript == "".join(e.delta for e in deltas)
            assert done.usage.type == "tokens" and MAX_TOKENS == done.usage.output_tokens >= len(deltas) > 0
            assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
            await conn.conversation.item.retrieve(item_id=item_id)
            item = (await until(conn, "conversation.item.retrieved")).item
            assert item.content[0].type == "input_audio" and item.content[0].transcript == done.transcript
            return done.transcript

    with live_server(fake(), default_max_tokens=MAX_TOKENS) as url:
        transcript = asyncio.run(run(url))
        assert transcript == route_transcript(url, pcm, language="de", prompt="Bahnhof")
        assert transcript != route_transcript(url, pcm, language="fr")  # the settings are part of the prompt


def test_session_object_failures_and_off() -> None:
    async def run(url):
        async with connect(url) as conn:
            await opened(conn, audio={"input": {"turn_detection": None}})
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": SETTINGS}}})
            updated = await until(conn, "session.updated")
            assert updated.session.audio.input.transcription.model == "whisper-1"
            assert updated.session.audio.input.transcription.language == "de"
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": {
                "language": "xx"}}}})
            error = await until(conn, "error")
            assert (error.error.code, error.error.param) == ("unsupported_language",
                                                            "session.audio.input.transcription.language")
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": {
                "prompt": FAIL_MAGIC}}}})  # the fake model fails a prompt holding it
            await until(conn, "session.updated")
            item_id = await committed_turn(conn, tone(0.5))
            failed = await until(conn, f"{PREFIX}.failed")
            assert failed.item_id == item_id and failed.error.message
            await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": None}}})
            assert (await until(conn, "session.updated")).session.audio.input.transcription is None
            await committed_turn(conn, tone(0.5))
            await asyncio.sleep(1.0)  # a transcription (a few dozen fake tokens, 5 ms each) would be done by now
            await conn.session.update(session={"type": "realtime"})  # a marker: nothing transcribed before it
            seen: list = []
            await until(conn, "session.updated", seen)
            assert not [e for e in seen if e.type.startswith(PREFIX)]

    with live_server(fake()) as url:
        asyncio.run(run(url))
