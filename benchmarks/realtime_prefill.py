"""``./dev bench realtime``'s second table: speech prefilled while it arrives, on vs off, against utterance length.

One engine (tiny random Qwen3-Omni, one rank, encoder windows of 2 s) behind two servers: one with
``realtime_prefill_while_speaking`` (the default), one without. For each utterance length, round and
side, one fresh single-turn session (its own voiced buzz, so no side reuses the other's cache) sends the
speech (a voiced buzz, f0 110-230 Hz, over a noise floor 40 dB down: with no floor, the features' ``max - 8`` clamp makes
every frame depend on the clip's loudest one, see docs/api.md) at real-time pace in 100 ms appends, commits at the end of speech and asks for a response, once
spoken (latency: end of speech -> first ``response.output_audio.delta``) and once text-only (-> first
``response.output_text.delta``); each answer is cancelled at that first delta. Sessions run one at a
time, so the thinker's prefilled-rows counter (``walkserve_kv_pool_prefill_tokens_total``) read at the
end of speech and again once the runtime is idle gives the rows computed after the end of speech.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import time
from dataclasses import dataclass, field

import numpy as np

from benchmarks.common import pct, table

MODEL = "tiny-omni"
SIDES = ("on", "off")
KINDS = ("audio", "text")


@dataclass
class Figures:
    latency: dict[tuple, list[float]] = field(default_factory=dict)  # (seconds, side, kind) -> seconds
    prefilled: dict[tuple, list[float]] = field(default_factory=dict)  # (seconds, side, kind) -> thinker rows

    def add(self, key: tuple, latency: float, prefilled: float) -> None:
        self.latency.setdefault(key, []).append(latency)
        self.prefilled.setdefault(key, []).append(prefilled)


async def thinker_prefilled(engine) -> float:
    await engine.refresh_status()
    return sum(v.get("prefill_tokens", 0.0) for (component, _), v in engine.stats().engine_ranks.items()
               if component == "thinker")


async def idle_prefilled(engine) -> float:
    while True:
        await asyncio.sleep(0.1)
        if not engine.stats().running:
            return await thinker_prefilled(engine)


async def turn(url: str, engine, pcm: bytes, kind: str, tokens: int, paced) -> tuple[float, float]:
    """One single-turn session: (end of speech -> first delta of ``kind``, thinker rows prefilled after it)."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    wanted = "response.output_audio.delta" if kind == "audio" else "response.output_text.delta"
    async with client.realtime.connect(model=MODEL) as conn:
        await conn.session.update(session={"type": "realtime", "temperature": 0, "max_output_tokens": tokens,
                                           "output_modalities": [kind], "audio": {"input": {"turn_detection": None}}})

        async def append(piece: bytes) -> None:
            await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())

        end = await paced(pcm, append)
        before = await thinker_prefilled(engine)
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        first = None
        async for event in conn:
            if event.type == wanted and first is None:
                first = time.monotonic()
                await conn.response.cancel()
            if event.type == "response.done":
                if first is None:
                    raise RuntimeError(f"an answer ended {event.response.status} before its first {kind} delta")
                break
    return first - end, await idle_prefilled(engine) - before


async def measure(urls: dict[str, str], engine, args: argparse.Namespace, buzz, paced) -> Figures:
    figures = Figures()
    seed = 100
    for _ in range(args.rounds):
        for seconds in args.prefill_lengths:
            for side in SIDES:
                for kind in KINDS:
                    seed += 1
                    pcm = noisy(buzz(seconds, seed % 5), seed)  # f0 110-190 Hz rising 40 Hz; its own noise
                    latency, rows = await turn(urls[side], engine, pcm, kind, args.tokens, paced)
                    figures.add((seconds, side, kind), latency, rows)
    return figures


def noisy(pcm: bytes, seed: int) -> bytes:
    """``pcm`` with white noise 40 dB under full scale, as a microphone's noise floor."""
    x = np.frombuffer(pcm, "<i2") + np.random.default_rng(seed).normal(0, 0.01 * 32767, len(pcm) // 2)
    return np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes()


def report(args: argparse.Namespace, f: Figures) -> str:
    rows = []
    for seconds in args.prefill_lengths:
        row: list[object] = [f"{seconds:g} s"]
        for kind in KINDS:
            on, off = (f.latency[(seconds, side, kind)] for side in SIDES)
            row += [1000 * pct(on, 0.5), 1000 * pct(off, 0.5), pct(on, 0.5) / pct(off, 0.5)]
        for side in SIDES:
            row.append(pct(f.prefilled[(seconds, side, "text")], 0.5))
        rows.append(row)
    return "\n".join([
        f"prefill while speaking ({'--heavier checkpoint' if args.heavier else 'tiny checkpoint'}): one session at a "
        f"time, speech at {args.speed:g}x real time, {args.rounds} round(s) per length and side, "
        f"{args.tokens} thinker tokens, greedy, each answer cancelled at its first delta; on / off = "
        "realtime_prefill_while_speaking; rows = thinker rows prefilled after the end of speech (text answer)",
        "",
        table(["utterance", "audio on p50 ms", "audio off p50 ms", "audio on / off", "text on p50 ms",
               "text off p50 ms", "text on / off", "rows on", "rows off"], rows),
    ])
