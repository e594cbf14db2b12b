"""Server VAD (api/realtime/vad.py) on synthetic audio: where speech starts and stops, and what a session commits,
whatever the append sizes."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest

from walkserve.api.config import ServerConfig
from walkserve.api.realtime.session import RealtimeSession
from walkserve.api.realtime.session_config import TurnDetection
from walkserve.api.realtime.vad import ServerVad
from walkserve.api.state import AppState
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

RATE = 24000


def voiced(seconds: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    x = sum(np.sin(2 * np.pi * 130 * k * t) / k for k in range(1, 16))
    return 0.3 * x / np.abs(x).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))


def noise(seconds: float, level: float, seed: int = 0) -> np.ndarray:
    return level * np.random.default_rng(seed).standard_normal(int(RATE * seconds))


def pcm(x: np.ndarray) -> bytes:
    return (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()


def run(audio: bytes, piece: int, **settings) -> list[tuple[str, int]]:
    vad, out = ServerVad(TurnDetection(**settings)), []
    for start in range(0, len(audio), piece):
        out += vad.push(audio[start:start + piece])
    return out


@pytest.mark.parametrize("piece", [2 * 4800, 2 * 333, 2 * 24000])  # 200 ms, an odd 13.9 ms, 1 s
def test_speech_starts_and_stops_where_it_is(piece: int) -> None:
    audio = pcm(np.concatenate([noise(0.5, 0.003), voiced(1.0), noise(1.0, 0.003, seed=1)]))
    events = run(audio, piece, silence_duration_ms=400)
    assert [kind for kind, _ in events] == ["speech_started", "speech_stopped"]
    start, stop = (position / RATE for _, position in events)
    assert 0.48 <= start <= 0.56  # the first voiced 20 ms frame
    assert 1.5 + 0.38 <= stop <= 1.5 + 0.5  # the end of speech plus the hangover


def test_quiet_noise_and_silence_are_not_speech() -> None:
    audio = pcm(np.concatenate([np.zeros(RATE), noise(2.0, 0.003)]))
    assert run(audio, 2 * 4800) == []


def test_a_short_pause_does_not_end_the_turn() -> None:
    audio = pcm(np.concatenate([voiced(0.6), np.zeros(RATE // 5), voiced(0.6), np.zeros(RATE)]))
    kinds = [kind for kind, _ in run(audio, 2 * 4800, silence_duration_ms=500)]
    assert kinds == ["speech_started", "speech_stopped"]
    kinds = [kind for kind, _ in run(audio, 2 * 4800, silence_duration_ms=100)]
    assert kinds == ["speech_started", "speech_stopped"] * 2


@pytest.mark.parametrize("piece_s", [0.02, 1.0, 10.0])  # a live microphone's pieces, a second, the whole file at once
def test_server_vad_commits_each_turn_its_own_audio_whatever_the_append_sizes(piece_s: float) -> None:
    """Two turns: each committed item holds its own speech, from the padding before it to where the VAD stopped it.
    Appends of a second or more used to commit the audio after a turn's end (the next turn's start included) to
    that turn, and the next turn got the rest or nothing (an empty item, whose answer failed)."""
    turn = np.concatenate([np.zeros(RATE // 2), voiced(1.0), np.zeros(RATE)])
    items = asyncio.run(_committed(pcm(np.concatenate([turn, turn])), int(RATE * piece_s) * 2))
    seconds = [len(item) / 2 / RATE for item in items]
    assert len(items) == 2 and all(1.6 <= s <= 1.8 for s in seconds), seconds  # 0.3 s padding, 1 s speech, 0.4 s hangover
    assert items[0] == items[1]


async def _committed(audio: bytes, piece: int) -> list[bytes]:
    """The user items a session with server VAD (no answers) commits from ``audio`` appended in ``piece`` bytes."""
    state = AppState(FakeEngine(FakeEngineConfig(audio=True)), ServerConfig(realtime_prefill_while_speaking=False))
    session = RealtimeSession(state, "fake-tiny")
    detection = {"type": "server_vad", "silence_duration_ms": 400, "prefix_padding_ms": 300, "create_response": False}
    await session.handle(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": detection}}}}))
    for start in range(0, len(audio), piece):
        await session.handle(json.dumps({"type": "input_audio_buffer.append",
                                         "audio": base64.b64encode(audio[start:start + piece]).decode()}))
    errors = [e for e in session.outbox._queue if e["type"] == "error"]
    assert not errors, errors
    return [item.parts[0].pcm for item in session.conversation.items]


def test_realtime_input_audio_is_no_longer_than_the_server_s_clip_limit() -> None:
    """``max_audio_seconds`` bounds every input clip: the realtime buffer (a committed turn) and an item's audio too."""
    async def run() -> list[dict]:
        state = AppState(FakeEngine(FakeEngineConfig(audio=True)), ServerConfig(max_audio_seconds=2.0))
        session = RealtimeSession(state, "fake-tiny")
        await session.handle(json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}))
        two_s = base64.b64encode(bytes(2 * 2 * RATE)).decode()
        for _ in range(2):  # 2 s fit; 2 s more do not
            await session.handle(json.dumps({"type": "input_audio_buffer.append", "audio": two_s}))
        item = {"type": "message", "role": "user", "content": [
            {"type": "input_audio", "audio": base64.b64encode(bytes(3 * 2 * RATE)).decode()}]}
        await session.handle(json.dumps({"type": "conversation.item.create", "item": item}))
        return [e["error"] for e in session.outbox._queue if e["type"] == "error"]
    errors = asyncio.run(run())
    assert [e["code"] for e in errors] == ["input_audio_buffer_full", "audio_too_long"], errors
