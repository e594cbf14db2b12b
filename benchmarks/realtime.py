"""``./dev bench realtime``: spoken turns through /v1/realtime vs the same turns as chat completions, in one run.

A tiny random-weight Qwen3-Omni (thinker -> talker -> Code2Wav, one rank) served over HTTP on this loop.
Each of ``--sessions`` clients holds a conversation of spoken turns (a voiced buzz of each ``--lengths``
seconds, pcm16 24 kHz) sent at real-time pace (``--speed``: a multiple of it), 100 ms of audio per
``input_audio_buffer.append``:

    (1) realtime   the openai package's realtime client; at the end of speech the client commits and asks
                   for a response (turn_detection null); latency = end of speech -> first output audio delta
    (2) chat       the same conversations, each turn one streamed ``POST /v1/chat/completions`` (modalities
                   text + audio, pcm16) sent when the upload ends, carrying the history; latency = end of
                   speech -> first audio chunk
    (3) cancel     every realtime turn is cancelled at its first audio delta (the random talker would speak for
                   a minute); latency = response.cancel sent -> response.done (status cancelled) received.
                   The chat side closes its stream at the first audio chunk (which aborts the request)

Both paths run the same walks; the realtime route saves the client's WAV encoding, the base64 of the whole
history and its decoding per turn. The table shows latency per length.

    (4) prefill    ``realtime_prefill.py``: the realtime route with the speech prefilled while it arrives (the
                   default) against the same route without, per utterance length (``--prefill-lengths``)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import io
import json
import socket
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import realtime_prefill
from benchmarks.common import conditions, pct, table

RATE = 24000
STEP_S = 0.1  # one append per 100 ms of audio
MODEL = "tiny-omni"
HEAVIER = {"num_hidden_layers": 16, "intermediate_size": 512, "moe_intermediate_size": 256,
           "audio": {"d_model": 256, "encoder_layers": 8, "encoder_ffn_dim": 1024}}


def buzz(seconds: float, seed: int) -> bytes:
    t = np.arange(int(RATE * seconds)) / RATE
    f0 = 110 + 20 * seed + 40 * t / max(seconds, 1e-3)
    x = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / RATE) / k for k in range(1, 12))
    return (0.3 * x / np.abs(x).max() * 32767).astype("<i2").tobytes()


def wav_b64(pcm: bytes) -> str:
    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, np.frombuffer(pcm, "<i2"), RATE, format="WAV", subtype="PCM_16")
    return base64.b64encode(buffer.getvalue()).decode()


async def paced(pcm: bytes, send, speed: float = 1.0) -> float:
    """Send ``pcm`` in 100 ms pieces at ``speed`` times real-time pace; returns the end-of-speech time."""
    step, t0 = int(RATE * STEP_S) * 2, time.monotonic()
    for i, start in enumerate(range(0, len(pcm), step)):
        await asyncio.sleep(max(0.0, t0 + i * STEP_S / speed - time.monotonic()))
        await send(pcm[start:start + step])
    return time.monotonic()


async def realtime_session(url: str, turns: list[bytes], tokens: int, pace=paced) -> tuple[list[float], list[float]]:
    """Per turn: end of speech -> first audio, and response.cancel (sent at that first audio) -> response.done."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    latencies, cancels = [], []
    async with client.realtime.connect(model=MODEL) as conn:
        await conn.session.update(session={"type": "realtime", "temperature": 0, "max_output_tokens": tokens,
                                           "audio": {"input": {"turn_detection": None}}})

        async def append(piece: bytes) -> None:
            await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())

        for pcm in turns:
            end = await pace(pcm, append)
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            first = None
            async for event in conn:
                if event.type == "response.output_audio.delta" and first is None:
                    first = time.monotonic()
                    await conn.response.cancel()
                if event.type == "response.done":  # an answer that ended before the cancel arrived has no figure
                    if first is None:
                        raise RuntimeError(f"an answer ended {event.response.status} before any audio: "
                                           f"{event.response.status_details}")
                    if event.response.status == "cancelled":
                        cancels.append(time.monotonic() - first)
                    break
            latencies.append(first - end)
    return latencies, cancels


async def chat_session(url: str, turns: list[bytes], tokens: int, pace=paced) -> list[float]:
    import httpx

    history, latencies = [], []
    async with httpx.AsyncClient(timeout=300) as client:
        for pcm in turns:
            end = await pace(pcm, lambda piece: asyncio.sleep(0))
            history.append({"role": "user", "content": [{"type": "input_audio",
                                                          "input_audio": {"data": wav_b64(pcm), "format": "wav"}}]})
            body = {"model": MODEL, "messages": history, "temperature": 0, "max_tokens": tokens, "stream": True,
                    "modalities": ["text", "audio"], "audio": {"format": "pcm16"}}
            first, transcript = None, ""
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
                async for line in reply.aiter_lines():  # up to the first audio chunk; closing the stream aborts
                    audio = json.loads(line[6:])["choices"][0]["delta"].get("audio") if line.startswith("data: {") else None
                    transcript += (audio or {}).get("transcript") or ""
                    if (audio or {}).get("data"):
                        first = time.monotonic()
                        break
            if first is None:
                raise RuntimeError(f"a chat answer streamed no audio (HTTP {reply.status_code})")
            latencies.append(first - end)
            history.append({"role": "assistant", "content": transcript})
    return latencies


async def serve_app(engine, prefill: bool):
    import uvicorn

    from walkserve.api import ServerConfig, build_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = ServerConfig(max_audio_seconds=60, realtime_prefill_while_speaking=prefill)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, config), log_level="warning"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def run(args: argparse.Namespace, path: Path) -> str:
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine

    # Admission by count: this bench times answers, and capacity admission (measured by `bench tts --only load`)
    # could turn a session's answer away on a busy machine, which leaves that turn without a figure.
    config = RuntimeConfig(max_running=64, admission="count")
    engine = await AsyncEngine.start("qwen3-omni", None, model_path=str(path), config=config)
    apps = {side: await serve_app(engine, side == "on") for side in realtime_prefill.SIDES}  # one engine, two servers
    url, out, pace = apps["on"][2], [], functools.partial(paced, speed=args.speed)
    try:
        await realtime_session(url, [buzz(1.0, seed=99)], args.tokens, pace)  # warm-up
        await chat_session(url, [buzz(1.0, seed=99)], args.tokens, pace)
        if args.only in ("all", "chat"):
            out.append(await compare_chat(args, url, pace))
        if args.only in ("all", "prefill"):
            urls = {side: app[2] for side, app in apps.items()}
            out.append(realtime_prefill.report(args, await realtime_prefill.measure(urls, engine, args, buzz, pace)))
    finally:
        for server, task, _ in apps.values():
            server.should_exit = True
            await task
        await engine.shutdown()
    return "\n\n".join([f"conditions: {conditions()}", *out])


async def compare_chat(args: argparse.Namespace, url: str, pace) -> str:
    turns = [[buzz(s, seed=i) for s in args.lengths] for i in range(args.sessions)]
    rt, chat = [], []
    for _ in range(args.rounds):  # alternate the two sides, so a busy moment of the machine hits both
        rt += await asyncio.gather(*[realtime_session(url, t, args.tokens, pace) for t in turns])
        chat += await asyncio.gather(*[chat_session(url, t, args.tokens, pace) for t in turns])
    return report(args, rt, chat)


def report(args: argparse.Namespace, rt, chat) -> str:
    rows = []
    for j, seconds in enumerate(args.lengths):
        a = [1000 * lat[j] for lat, _ in rt]
        b = [1000 * lat[j] for lat in chat]
        rows.append([f"{seconds:g} s (turn {j + 1})", pct(a, 0.5), pct(a, 0.99), pct(b, 0.5), pct(b, 0.99),
                     pct(a, 0.5) / pct(b, 0.5)])
    cancel = [1000 * c for _, cs in rt for c in cs]
    return "\n".join([
        f"realtime bench: {args.sessions} concurrent sessions, turns of {', '.join(f'{s:g}' for s in args.lengths)} s "
        f"sent at {pace_words(args.speed)}, {args.tokens} thinker tokens per answer, greedy, {args.rounds} round(s) "
        "of each side; "
        "tiny random Qwen3-Omni, one rank; each answer cancelled at its first audio",
        "",
        table(["utterance", "realtime p50 ms", "realtime p99 ms", "chat p50 ms", "chat p99 ms", "realtime / chat p50"],
              rows),
        "",
        f"cancellation (response.cancel -> response.done cancelled): p50 {pct(cancel, 0.5):.0f} ms, "
        f"p99 {pct(cancel, 0.99):.0f} ms over {len(cancel)} responses",
    ])


def pace_words(speed: float) -> str:
    return "real-time pace" if speed == 1 else f"{speed:g}x real-time pace"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench realtime", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="2 sessions, turns of 1 and 2 s, prefill at 1 and 3 s, one round")
    p.add_argument("--only", choices=("all", "chat", "prefill"), default="all",
                   help="chat: realtime vs chat completions; prefill: prefill while speaking on vs off")
    p.add_argument("--heavier", action="store_true",
                   help="a thinker of 16 layers with wider experts and an audio encoder of 8 layers x 256 (still random "
                        "and small), so that prefill costs show above a busy machine's noise")
    p.add_argument("--prefill-lengths", type=float, nargs="+", default=[1.0, 2.0, 4.0, 8.0],
                   help="seconds of speech per utterance, prefill table")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--lengths", type=float, nargs="+", default=[1.0, 3.0, 6.0], help="seconds of each turn's speech")
    p.add_argument("--tokens", type=int, default=8, help="thinker tokens per answer")
    p.add_argument("--rounds", type=int, default=3, help="rounds of (realtime, then chat)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="send the speech at this multiple of real time (the smoke test's shortcut: latencies from "
                        "the end of speech then no longer show a live speaker's)")
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.lengths, args.rounds, args.prefill_lengths = 2, [1.0, 2.0], 1, [1.0, 3.0]
    from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_qwen3_omni(Path(tmp) / MODEL, seed=5, **(HEAVIER if args.heavier else {}))
        print(asyncio.run(run(args, path)))
    return 0
