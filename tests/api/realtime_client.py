"""Client-side helpers for the /v1/realtime tests: the openai package's realtime client, one response's events."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field

import numpy as np

CHUNK = 4800  # samples per append: 200 ms at 24 kHz
WAIT_S = 60  # the longest wait for one event


@dataclass
class Answer:
    """One response as the client saw it."""

    types: list[str] = field(default_factory=list)  # every event type from response.created to response.done
    transcript: str = ""
    audio: bytes = b""  # pcm16 24 kHz
    done: object = None  # the response.done event's response
    errors: list[object] = field(default_factory=list)


def pcm16(samples: np.ndarray) -> bytes:
    return np.round(np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


async def append_audio(conn, pcm: bytes, chunk: int = CHUNK) -> None:
    for start in range(0, len(pcm), 2 * chunk):
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start:start + 2 * chunk]).decode())


async def until(conn, kind: str, seen: list | None = None):
    """Events up to (and returning) the first of type ``kind``; the ones before go to ``seen``."""
    while True:
        event = await asyncio.wait_for(conn.recv(), WAIT_S)
        if event.type == kind:
            return event
        if seen is not None:
            seen.append(event)


async def answer(conn, first=None) -> Answer:
    """Read one response's events (from ``first`` on, when already received) up to its response.done."""
    out = Answer()
    event = first or await asyncio.wait_for(conn.recv(), WAIT_S)
    while True:
        out.types.append(event.type)
        if event.type in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            out.transcript += event.delta
        elif event.type == "response.output_audio.delta":
            out.audio += base64.b64decode(event.delta)
        elif event.type == "error":
            out.errors.append(event.error)
        elif event.type == "response.done":
            out.done = event.response
            return out
        event = await asyncio.wait_for(conn.recv(), WAIT_S)
