"""A two-turn spoken conversation over /v1/realtime with the openai package (audio_in + audio_out models):
python examples/openai_client/realtime.py [BASE_URL] [OUT_DIR] [IN.wav]

Turn 1 appends the WAV's audio and commits it by hand; turn 2 sends it again followed by silence and lets the
server's voice-activity detector find the end of speech, commit, and answer. Each spoken answer (pcm16,
24 kHz) is written to OUT_DIR/answer_N.wav. Without IN.wav a short voiced sound is generated to speak.
"""

import asyncio
import base64
import os
import sys
from pathlib import Path

import numpy as np
import openai
import soundfile as sf
from _base import base_url

RATE = 24000  # the realtime API's pcm16 rate, both ways


def read_wav(path: Path) -> bytes:
    """A WAV file as pcm16 mono at 24 kHz (other rates are resampled linearly)."""
    samples, rate = sf.read(path, dtype="float32", always_2d=True)
    mono = samples.mean(axis=1)
    if rate != RATE:
        mono = np.interp(np.arange(0, len(mono), rate / RATE), np.arange(len(mono)), mono)
    return (np.clip(mono, -1, 1) * 32767).astype("<i2").tobytes()


def demo_wav(path: Path) -> Path:
    t = np.arange(RATE) / RATE  # one second of a gliding, voiced buzz
    voice = sum(np.sin(2 * np.pi * k * np.cumsum(120 + 40 * t) / RATE) / k for k in range(1, 12))
    sf.write(path, 0.3 * voice / np.abs(voice).max(), RATE)
    return path


async def spoken_answer(conn, out: Path) -> str:
    transcript, pcm = "", bytearray()
    async for event in conn:
        if event.type == "response.output_audio_transcript.delta":
            transcript += event.delta
        elif event.type == "response.output_audio.delta":
            pcm += base64.b64decode(event.delta)
        elif event.type == "error":
            print("error:", event.error.message)
        elif event.type == "response.done":
            sf.write(out, np.frombuffer(bytes(pcm), "<i2"), RATE)
            print(f"answer ({event.response.status}): {transcript!r} | {len(pcm) // 2} samples -> {out}")
            return transcript
    raise RuntimeError("the connection closed before the answer was done")


async def append(conn, pcm: bytes) -> None:
    for start in range(0, len(pcm), 2 * 4800):  # 200 ms per event, as a microphone would send it
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[start:start + 2 * 4800]).decode())


async def main() -> None:
    out_dir = Path(sys.argv[2] if len(sys.argv) > 2 else ".")
    speech = read_wav(Path(sys.argv[3]) if len(sys.argv) > 3 else demo_wav(out_dir / "question.wav"))
    client = openai.AsyncOpenAI(base_url=f"{base_url()}/v1", api_key=os.environ.get("WALKSERVE_API_KEY", "unused"))
    model = (await client.models.list()).data[0].id
    async with client.realtime.connect(model=model) as conn:
        await conn.session.update(session={"type": "realtime", "instructions": "Answer briefly.",
                                           "max_output_tokens": 24, "audio": {"input": {"turn_detection": None}}})
        await append(conn, speech)  # turn 1: commit by hand, then ask for the answer
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        await spoken_answer(conn, out_dir / "answer_1.wav")
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": {
            "type": "server_vad", "silence_duration_ms": 500}}}})
        await append(conn, speech + bytes(2 * RATE))  # turn 2: speech, then a second of silence ends the turn
        await spoken_answer(conn, out_dir / "answer_2.wav")


asyncio.run(main())
