"""The cases of ``./dev bench bagel``: the offline loop one request at a time, and walkserve.

Generation requests are text-to-image with an explicit initial noise (request i: ``randn`` seeded i), so
both sides make the same image; understanding requests are one image and a question, greedy, exactly
``new_tokens`` tokens (``ignore_eos``). The offline loop (``walkserve.models.bagel.offline``) is the
release's inferencer: dense caches, three separate CFG forwards per flow step, no batching.
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

PROMPTS = ("a red cube on a table", "two moons over the sea", "a cat in the rain", "a city at night")
QUESTION = "What is in this picture?"


@dataclass(frozen=True)
class Workload:
    path: Path
    size: int  # generated images are size x size pixels
    num_timesteps: int
    gen_requests: int  # offline and at concurrency 1; max(this, c) at concurrency c
    und_requests: int
    new_tokens: int
    threads: int


@dataclass
class RunResult:
    """Per request: its output (image bytes or token ids) and latency; the timed part's wall time."""

    outputs: list[Any]
    latency_s: list[float]
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def per_minute(self) -> float:
        return 60.0 * len(self.outputs) / self.seconds

    def tokens_per_s(self) -> float:
        return sum(len(t) for t in self.outputs) / self.seconds


def noise(work: Workload, i: int):
    import torch

    n = (work.size // 16) ** 2
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(i))


def picture(i: int, side: int = 64) -> np.ndarray:
    rng = np.random.default_rng(200 + i)
    return rng.integers(0, 256, (side, side, 3), dtype=np.uint8)


def _array(x: np.ndarray) -> ArrayData:
    return ArrayData(str(x.dtype), tuple(x.shape), np.ascontiguousarray(x).tobytes())


# ---- the offline loop, one request at a time ------------------------------------------------------------
def offline(work: Workload) -> tuple[RunResult, RunResult]:
    """(generation, understanding) through OfflineBagel, each request after the other."""
    import torch
    from PIL import Image

    from walkserve.models.bagel.flow import Guidance
    from walkserve.models.bagel.inputs import ImageRules
    from walkserve.models.bagel.layout import SpecialTokens
    from walkserve.models.bagel.offline import OfflineBagel
    from walkserve.models.bagel.preprocess import image_inputs
    from walkserve.models.bagel.weights import load_bagel
    from walkserve.models.tokenizer import Tokenizer

    torch.set_num_threads(work.threads)
    tokenizer = Tokenizer.from_dir(work.path)
    parts = load_bagel(work.path)
    loop = OfflineBagel(parts, SpecialTokens.from_tokenizer(tokenizer))
    guidance = Guidance(4.0, 1.5, (0.4, 1.0), "global", 0.0)  # the text-to-image defaults
    rules = ImageRules.of(parts.config)

    def gen(i: int, timesteps: int) -> np.ndarray:
        ids = tokenizer.encode(PROMPTS[i % len(PROMPTS)], add_special_tokens=False)
        latents = loop.generate(ids, noise(work, i), size=(work.size, work.size), guidance=guidance,
                                num_timesteps=timesteps)
        return loop.decode_image(latents, (work.size, work.size)).numpy()

    def und(i: int, n: int) -> list[int]:
        _, vit = image_inputs(Image.fromarray(picture(i)), rules.vae, rules.vit)
        ids = tokenizer.encode(QUESTION, add_special_tokens=False)
        return loop.understand(ids, [vit], max_new_tokens=n, ignore_end=True)

    gen(0, 3), und(0, 2)  # warm-up
    return (_timed(lambda i: gen(i, work.num_timesteps), work.gen_requests),
            _timed(lambda i: und(i, work.new_tokens), work.und_requests))


def _timed(run, n: int) -> RunResult:
    outputs, latency, t0 = [], [], time.perf_counter()
    for i in range(n):
        start = time.perf_counter()
        outputs.append(run(i))
        latency.append(time.perf_counter() - start)
    return RunResult(outputs, latency, time.perf_counter() - t0)


# ---- walkserve -----------------------------------------------------------------------------------------
def served(work: Workload, placement: str, gen_levels: list[int], und_levels: list[int]) -> dict[str, dict]:
    """{"generation": {c: RunResult}, "understanding": {c: RunResult}} on one running engine."""
    return asyncio.run(_served(work, placement, gen_levels, und_levels))


async def _served(work: Workload, placement: str, gen_levels: list[int], und_levels: list[int]) -> dict[str, dict]:
    import torch

    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine
    from walkserve.placements import path as placement_path

    torch.set_num_threads(work.threads)
    config = RuntimeConfig(worker_threads=work.threads, status_interval_s=0.05, max_running=64)
    engine = await AsyncEngine.start("bagel", _cpu(placement_path(placement)), config=config,
                                     model_path=str(work.path))
    try:
        await asyncio.gather(_generate(engine, work, 0, 3), _understand(engine, work, 0, 2))  # warm-up
        gen = {c: await _level(lambda i: _generate(engine, work, i, work.num_timesteps), c, work.gen_requests)
               for c in gen_levels}
        und = {c: await _level(lambda i: _understand(engine, work, i, work.new_tokens), c, work.und_requests)
               for c in und_levels}
    finally:
        await engine.shutdown()
    return {"generation": gen, "understanding": und}


def _cpu(path: Path) -> dict:
    import yaml

    data = yaml.safe_load(path.read_text())
    for rank in data["ranks"]:
        rank["device"] = "cpu"
    return data


async def _level(one, concurrency: int, requests: int) -> RunResult:
    n = max(requests, concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int):
        async with gate:
            start = time.perf_counter()
            out = await one(i)
            return out, time.perf_counter() - start

    t0 = time.perf_counter()
    outs = await asyncio.gather(*[gated(i) for i in range(n)])
    return RunResult([o for o, _ in outs], [s for _, s in outs], time.perf_counter() - t0, {"requests": n})


async def _generate(engine, work: Workload, i: int, timesteps: int) -> np.ndarray:
    payload = {"prompt": PROMPTS[i % len(PROMPTS)], "noise": _array(noise(work, i).numpy())}
    params = {"size": f"{work.size}x{work.size}", "num_timesteps": timesteps}
    events = await _events(engine, "image", payload, SamplingParams(seed=i), params)
    (image,) = [e.data for e in events if e.modality == "image"]
    return np.frombuffer(image.data, np.uint8).reshape(image.shape)


async def _understand(engine, work: Workload, i: int, n: int) -> list[int]:
    content = [{"type": "text", "text": QUESTION}, {"type": "image", "image": _array(picture(i))}]
    sampling = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    events = await _events(engine, "chat", {"messages": [{"role": "user", "content": content}]}, sampling, {})
    return [int(t) for e in events if e.modality == "text" for t in e.data.tolist()]


async def _events(engine, task: str, payload: dict, sampling: SamplingParams, params: dict) -> list:
    from walkserve.core.outputs import OutputEvent

    spec = await asyncio.to_thread(engine.processor.build_request, task, payload, sampling,
                                   engine.processor.check_params(params))
    out = []
    async for event in engine.generate(spec):
        if isinstance(event, OutputEvent):
            out.append(event)
        elif event.error:
            raise RuntimeError(f"request failed: {event.error}")
    return out
