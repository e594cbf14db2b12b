"""``./dev bench omni-turns``: a spoken-question conversation with Qwen3-Omni's thinker, with and without KV reuse.

One conversation of ``turns`` turns, each a user turn of one audio clip and a question, answered greedily
(text out; ``--speak``: text and audio out), the next turn re-sending the whole conversation (as a chat client,
or the realtime route, does). It runs twice on the same checkpoint, side by side in one run: (1) prefix caching
on, (2) off. Per turn:
the prompt's tokens, the thinker's prefilled and reused prompt tokens (``walkserve_kv_pool_prefill_tokens``
and ``walkserve_kv_pool_prefix_hit_tokens``, read from the engine's stats) and the TTFT; the answers of (1)
and (2) must be equal token for token.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import conditions, table
from walkserve.core.array import ArrayData
from walkserve.core.sampling import SamplingParams

QUESTIONS = ("What was said?", "And now?", "Say it again, shorter.", "Which one was louder?", "Why?", "Thanks.")


def clip(turn: int, seconds: float) -> ArrayData:
    """Turn ``turn``'s clip: a chirp with noise, never longer than the first (an earlier clip's features hold)."""
    rng = np.random.default_rng(10 + turn)
    t = np.arange(int(16000 * seconds)) / 16000
    wave = (0.3 * np.sin(2 * np.pi * (200 + 50 * turn + 700 * t) * t) + 0.05 * rng.standard_normal(t.shape))
    return ArrayData("float32", (t.shape[0],), wave.astype(np.float32).tobytes())


def user_turn(turn: int, seconds: float) -> dict:
    return {"role": "user", "content": [{"type": "audio", "audio": clip(turn, seconds), "sample_rate": 16000},
                                        {"type": "text", "text": QUESTIONS[turn % len(QUESTIONS)]}]}


async def conversation(path: Path, turns: int, seconds: float, new_tokens: int, caching: bool,
                       block_size: int, speak: bool = False) -> list[dict]:
    """One conversation on a fresh engine: per turn its prompt tokens, prefilled / reused tokens, TTFT, answer."""
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine
    from walkserve.placements import path as placement_path

    kv = {"prefix_caching": caching, "block_size": block_size}
    config = RuntimeConfig(worker_threads=1, status_interval_s=0.05, engine_options={"kv": kv})
    engine = await AsyncEngine.start("qwen3-omni", str(placement_path("qwen3-omni")), config=config,
                                     model_path=str(path))
    messages: list[dict] = [{"role": "system", "content": "Answer briefly."}]
    rows = []
    try:
        _, _, warm = await _ask(engine, [{"role": "system", "content": "Warm-up."}, user_turn(99, 1.0)], 2, speak)
        await _thinker_counters(engine, warm - speak)  # its rows reported (it shares no block with the conversation)
        for turn in range(turns):
            messages.append(user_turn(turn, seconds * (1 - 0.1 * turn)))
            before = await _thinker_counters(engine, 0.0)  # every earlier request's rows are in
            clips = _capture_hits(engine)
            tokens, ttft, prompt = await _ask(engine, messages, new_tokens, speak)
            after = await _thinker_counters(engine, sum(before) + prompt - speak)  # spoken: the last row apart
            rows.append({"turn": turn + 1, "prompt": prompt, "prefilled": after[0] - before[0],
                         "reused": after[1] - before[1], "ttft_s": ttft, "tokens": tokens,
                         "kept_clips": _capture_hits(engine) - clips})
            messages.append({"role": "assistant", "content": engine.processor.decode(tokens)})
    finally:
        await engine.shutdown()
    return rows


async def _ask(engine, messages: list[dict], n: int, speak: bool = False) -> tuple[list[int], float, int]:
    from walkserve.core.outputs import OutputEvent

    t0 = time.perf_counter()
    sampling = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    payload = {"messages": messages, **({"modalities": ["text", "audio"]} if speak else {})}
    params = {"max_audio_frames": 8} if speak else {}
    spec = await asyncio.to_thread(engine.processor.build_request, "chat", payload, sampling,
                                   engine.processor.check_params(params))
    tokens, first = [], None
    async for event in engine.generate(spec):
        if isinstance(event, OutputEvent):
            if event.modality == "text":
                tokens.extend(int(t) for t in event.data.tolist())
                first = first if first is not None else time.perf_counter() - t0
        elif event.error:
            raise RuntimeError(f"request failed: {event.error}")
    return tokens, first or float("nan"), int(spec.inputs["prompt_token_ids"].shape[0])


def _capture_hits(engine) -> float:
    """Media pieces the thinker's pools answered from their capture cache so far (spoken answers' earlier clips)."""
    pools = [v for (component, _), v in engine.stats().engine_ranks.items() if component == "thinker"]
    return sum(p.get("capture_cache_hits", 0.0) for p in pools)


async def _thinker_counters(engine, at_least: float) -> tuple[float, float]:
    """(prefill_tokens, prefix_hit_tokens) of the thinker's pool once the workers reported ``at_least`` rows in all
    (a text answer's prompt rows are each prefilled or reused; a spoken answer's but its last, a one-row firing),
    or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        pools = [v for (component, _), v in engine.stats().engine_ranks.items() if component == "thinker"]
        counts = sum(p.get("prefill_tokens", 0.0) for p in pools), sum(p.get("prefix_hit_tokens", 0.0) for p in pools)
        if sum(counts) >= at_least or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.05)


def report(on: list[dict], off: list[dict], args: argparse.Namespace) -> str:
    rows, previous = [], 0
    for a, b in zip(on, off):
        kept = (int(a["kept_clips"]),) if args.speak else ()
        rows.append((a["turn"], a["prompt"], a["prompt"] - previous, b["prefilled"], a["prefilled"], a["reused"], *kept,
                     a["prefilled"] / b["prefilled"], b["ttft_s"] * 1e3, a["ttft_s"] * 1e3,
                     "same" if a["tokens"] == b["tokens"] else "DIFFERENT"))
        previous = a["prompt"]
    lines = ["## Qwen3-Omni conversation turns with KV reuse (`./dev bench omni-turns`)", "",
             f"- workload: one conversation of {args.turns} turns; turn k: a {args.seconds:g} s x (1 - 0.1 (k - 1)) "
             f"clip and a question, {args.new_tokens} new tokens, greedy, EOS ignored, "
             f"{'spoken answers (text + audio out, 8 codec frames)' if args.speak else 'text out'}; each turn re-sends the whole "
             f"conversation (earlier answers as assistant text); tiny random-weight checkpoint, placement qwen3-omni "
             f"(one rank, CPU), KV block size {args.block_size}",
             f"- machine: {conditions()}",
             "- prefilled / reused: the thinker's prompt rows computed / taken from the prefix cache for that turn "
             "(the last prompt row is always computed: it samples the first token"
             f"{'; not counted for a spoken answer, a one-row firing' if args.speak else ''}); new since last prompt = "
             "the earlier answer and the new user turn"
             + ("; clips kept: earlier clips whose layer-24 rows (the talker's) came from the capture cache"
                if args.speak else ""), ""]
    kept_column = ["clips kept"] if args.speak else []
    lines.append(table(["turn", "prompt tokens", "new since last prompt", "prefilled (no reuse)", "prefilled (reuse)", "reused",
                        *kept_column, "prefilled ratio", "TTFT ms (no reuse)", "TTFT ms (reuse)", "answer"], rows))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="./dev bench omni-turns", description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3.0, help="the first clip's length (later ones 10%% shorter each)")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--speak", action="store_true", help="spoken answers (text + audio out): the thinker's media "
                   "pieces feed the talker their rows' layer-24 inputs, which the capture cache keeps for later turns")
    args = p.parse_args(argv)
    from walkserve.models.qwen3_omni.tiny import write_tiny_qwen3_omni

    with tempfile.TemporaryDirectory(prefix="walkserve-bench-omni-turns-") as tmp:
        path = write_tiny_qwen3_omni(Path(tmp) / "qwen3-omni-turns", seed=5)
        runs = {}
        for caching in (True, False):
            print(f"prefix caching {'on' if caching else 'off'}: {args.turns} turns ...", flush=True)
            runs[caching] = asyncio.run(conversation(path, args.turns, args.seconds, args.new_tokens, caching,
                                                     args.block_size, args.speak))
        print()
        print(report(runs[True], runs[False], args))
    return 0
