"""The cases of ``./dev bench omni-thinker``: transformers' thinker.generate one request at a time, and walkserve.

Every request is the same kind of turn, "an image and a 5 s audio clip, then a question", with its own
random image and clip, and makes ``new_tokens`` tokens (greedy, EOS ignored). Both sides take the same
inputs: our processor's output (its equality with the checkpoint's processor is tested in
tests/models/qwen3_omni/test_prompt.py), fed to transformers with an attention mask.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from walkserve.core.array import ArrayData
from walkserve.core.sampling import SamplingParams


@dataclass(frozen=True)
class Workload:
    path: Path
    requests: int
    new_tokens: int
    audio_seconds: float
    image_size: tuple[int, int]
    threads: int
    dtype: str = "float32"


@dataclass
class RunResult:
    """Tokens per request, wall time of the timed part, per-request TTFT, and extra figures."""

    tokens: list[list[int]]
    seconds: float
    ttft_s: list[float]
    extra: dict[str, Any] = field(default_factory=dict)

    def tokens_per_s(self) -> float:
        return sum(len(t) for t in self.tokens) / self.seconds


def _array(x: np.ndarray) -> ArrayData:
    return ArrayData(str(x.dtype), tuple(x.shape), np.ascontiguousarray(x).tobytes())


def messages(work: Workload, i: int) -> list[dict]:
    """Request i's turn: its image, its clip, a question (media decoded, as the API hands them on)."""
    rng = np.random.default_rng(100 + i)
    h, w = work.image_size
    y, x = np.mgrid[0:h, 0:w]
    image = np.stack([128 + 100 * np.sin(x / (5 + i) + c) * np.cos(y / 7 - c) for c in range(3)], -1)
    image = np.clip(image + rng.normal(0, 20, image.shape), 0, 255).astype(np.uint8)
    t = np.arange(int(16000 * work.audio_seconds)) / 16000
    clip = (0.3 * np.sin(2 * np.pi * (200 + 40 * i + 600 * t) * t) + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)
    content = [{"type": "image", "image": _array(image)}, {"type": "audio", "audio": _array(clip), "sample_rate": 16000},
               {"type": "text", "text": "What do you see and hear?"}]
    return [{"role": "user", "content": content}]


def greedy(work: Workload) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=work.new_tokens, ignore_eos=True)


# ---- transformers, one request at a time --------------------------------------------------------------
def reference(work: Workload) -> RunResult:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration
    from transformers.generation.streamers import BaseStreamer

    from walkserve.models.qwen3_omni.processor import Qwen3OmniProcessor

    torch.set_num_threads(work.threads)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(work.path, dtype=getattr(torch, work.dtype)).eval()
    processor = Qwen3OmniProcessor(work.path)

    class FirstToken(BaseStreamer):
        def __init__(self):
            self.calls: list[float] = []

        def put(self, value):
            self.calls.append(time.perf_counter())

        def end(self):
            pass

    def run(i: int, n: int) -> tuple[list[int], float]:
        streamer, t0 = FirstToken(), time.perf_counter()  # TTFT includes preprocessing, as walkserve's does
        request, _ = processor.thinker_request("chat", {"messages": messages(work, i)}, processor.check_params({}))
        with torch.no_grad():
            out = model.thinker.generate(**hf_inputs(request), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                         streamer=streamer, pad_token_id=0)
        return out[0, len(request.input_ids):].tolist(), streamer.calls[1] - t0  # call 0 is the prompt

    run(0, 2)  # warm-up
    tokens, ttft, t0 = [], [], time.perf_counter()
    for i in range(work.requests):
        ids, first = run(i, work.new_tokens)
        tokens.append(ids)
        ttft.append(first)
    return RunResult(tokens, time.perf_counter() - t0, ttft)


def hf_inputs(request) -> dict:
    import torch

    ids = torch.tensor([request.input_ids])
    kw: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if request.audio:
        kw["input_features"] = torch.from_numpy(np.stack(request.audio))
        kw["feature_attention_mask"] = torch.ones(1, request.audio[0].shape[1], dtype=torch.long)
    if request.images:
        kw["pixel_values"] = torch.from_numpy(np.concatenate([v.pixel_values for v in request.images]))
        kw["image_grid_thw"] = torch.tensor([v.grid_thw for v in request.images])
    return kw


# ---- walkserve -----------------------------------------------------------------------------------------
def served(work: Workload, placement: str, concurrency: list[int]) -> dict[int, RunResult]:
    """walkserve on ``placement`` (a shipped name): each concurrency level in turn, on one running engine."""
    return asyncio.run(_served(work, placement, concurrency))


async def _served(work: Workload, placement: str, concurrency: list[int]) -> dict[int, RunResult]:
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine
    from walkserve.placements import path as placement_path

    config = RuntimeConfig(worker_threads=work.threads, dtype=work.dtype, status_interval_s=0.05, max_running=64)
    engine = await AsyncEngine.start("qwen3-omni", str(placement_path(placement)), config=config,
                                     model_path=str(work.path))
    try:
        await asyncio.gather(*[_one(engine, work, i, 4, 0.0) for i in range(min(2, work.requests))])  # warm-up
        out = {}
        for c in concurrency:
            out[c] = await _level(engine, work, c)
    finally:
        await engine.shutdown()
    return out


async def _level(engine, work: Workload, concurrency: int) -> RunResult:
    n = max(work.requests, concurrency)
    gate = asyncio.Semaphore(concurrency)
    before = await _encoder_busy(engine)

    async def gated(i: int):
        async with gate:
            return await _one(engine, work, i, work.new_tokens, time.perf_counter())

    t0 = time.perf_counter()
    outs = await asyncio.gather(*[gated(i) for i in range(n)])
    seconds = time.perf_counter() - t0
    busy = await _encoder_busy(engine)
    return RunResult([o[0] for o in outs], seconds, [o[1] for o in outs],
                     {"encoder_s_per_request": (busy - before) / n, "requests": n})


async def _one(engine, work: Workload, i: int, n: int, t0: float) -> tuple[list[int], float]:
    from walkserve.core.outputs import OutputEvent

    sampling = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    t0 = t0 or time.perf_counter()
    spec = await asyncio.to_thread(engine.processor.build_request, "chat", {"messages": messages(work, i)}, sampling,
                                   engine.processor.check_params({}))
    tokens, first = [], None
    async for event in engine.generate(spec):
        if isinstance(event, OutputEvent):
            tokens.extend(int(t) for t in event.data.tolist())
            first = first if first is not None else time.perf_counter() - t0
        elif event.error:
            raise RuntimeError(f"request failed: {event.error}")
    return tokens, first or float("nan")


async def _encoder_busy(engine) -> float:
    """Seconds the two encoders have run so far (every worker's report, after the next status tick)."""
    await asyncio.sleep(0.2)
    nodes = engine.stats().nodes
    return sum(nodes.get(n, {}).get("busy_s", 0.0) for n in ("audio_encoder", "vision_encoder"))
