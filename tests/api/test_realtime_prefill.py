"""When a realtime session prefills its speech while it arrives (api/realtime/speech_prefill.py), and what speech.

The prefill requests themselves are recorded, not run: what they hold (the speech a commit would take at
that moment) and when they start is the session's bookkeeping. Their effect on the runtime's caches and
the answers' equality with chat completions are tested on the tiny Qwen3-Omni (tests/models/qwen3_omni/test_realtime.py).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import numpy as np

from walkserve.api.config import ServerConfig
from walkserve.api.realtime.session import RealtimeSession
from walkserve.api.state import AppState
from walkserve.testing.fake_engine import FakeEngine, FakeEngineConfig

RATE = 24000
WINDOW_S = 1.0


def voiced(seconds: float) -> bytes:
    t = np.arange(int(RATE * seconds)) / RATE
    x = sum(np.sin(2 * np.pi * 130 * k * t) / k for k in range(1, 16))
    return (0.3 * x / np.abs(x).max() * 32767).astype("<i2").tobytes()


def session(prefill: bool = True) -> tuple[RealtimeSession, list[int]]:
    """A session on a fake engine whose card has 1 s encoder windows; its prefills' speech lengths (samples),
    and in ``s.prefill_requests`` the chat requests they would run."""
    state = AppState(FakeEngine(FakeEngineConfig(audio=True)), ServerConfig(realtime_prefill_while_speaking=prefill))
    state.card = dataclasses.replace(state.card, audio_window_s=WINDOW_S)
    s, started = RealtimeSession(state, "fake-tiny"), []
    s.prefill_requests = []

    async def record(messages, request):
        started.append(len(messages[-1]["content"][0]["audio"].data) // 4)  # float32 samples
        s.prefill_requests.append(request)
        await asyncio.sleep(0)

    s.prefill._run = record
    return s, started


async def feed(s: RealtimeSession, pcm: bytes, piece_s: float = 0.1) -> None:
    step = int(RATE * piece_s) * 2
    for start in range(0, len(pcm), step):
        await s.handle(json.dumps({"type": "input_audio_buffer.append",
                                   "audio": base64.b64encode(pcm[start:start + step]).decode()}))
        await asyncio.sleep(0)  # let a started prefill run
    await s.prefill.settled()


def test_each_whole_window_is_prefilled_once_with_the_speech_so_far() -> None:
    async def go():
        s, started = session()
        await feed(s, voiced(3.5))
        assert started == [int(1.1 * RATE), int(2.1 * RATE), int(3.1 * RATE)]  # a window + 50 ms, at 100 ms appends
        # the session answers spoken by default: its prefill is a greedy spoken answer of two tokens (the least
        # the talker takes), so the captured thinker rows of each window are kept for the committed answer
        assert {(tuple(r.modalities), r.max_completion_tokens, r.temperature, r.audio.max_frames)
                for r in s.prefill_requests} == {(("text", "audio"), 2, 0, 1)}  # one talker frame: it is thrown away
        await s.handle(json.dumps({"type": "input_audio_buffer.commit"}))
        await feed(s, voiced(0.9))  # the next turn starts from no window
        assert len(started) == 3
        await feed(s, voiced(0.3))
        assert started[3:] == [int(1.1 * RATE)]

    asyncio.run(go())


def test_a_fast_client_gets_the_windows_it_sent_meanwhile() -> None:
    async def go():
        s, started = session()
        s.prefill._run = lambda messages, request: started.append(len(messages[-1]["content"][0]["audio"].data) // 4) or \
            asyncio.sleep(0.05)
        for _ in range(30):  # 3 s in one burst: the first prefill still runs while the rest arrives
            await s.handle(json.dumps({"type": "input_audio_buffer.append",
                                       "audio": base64.b64encode(voiced(0.1)).decode()}))
            await asyncio.sleep(0)
        await s.prefill.settled()
        assert started == [int(1.1 * RATE), 3 * RATE]

    asyncio.run(go())


def test_with_server_vad_only_the_speech_from_the_padding_on_is_prefilled() -> None:
    async def go():
        s, started = session()
        await s.handle(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "prefix_padding_ms": 300, "silence_duration_ms": 500}}}}}))
        await feed(s, bytes(2 * RATE * 2) + voiced(1.5))  # 2 s of silence (two windows: none prefilled), then speech
        start = s.speech_start - s._padding()  # what the commit will take from
        trigger = -(-(start + int(1.05 * RATE)) // 2400) * 2400  # the first append's end a window + 50 ms past it
        assert started == [trigger - start]

    asyncio.run(go())


def test_nothing_is_prefilled_when_turned_off() -> None:
    async def go():
        s, started = session(prefill=False)
        await feed(s, voiced(2.5))
        assert started == []

    asyncio.run(go())
