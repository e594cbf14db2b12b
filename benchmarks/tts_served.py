"""Orpheus served by walkserve (AsyncEngine on a placement): rounds of concurrent speech requests, traced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.tts_trace import StreamTrace
from walkserve.core.outputs import RequestFinished
from walkserve.core.request import RequestSpec


@dataclass
class ServedRound:
    """One round: ``concurrency`` requests submitted together; wall = submit to the last finish."""

    concurrency: int
    traces: list[StreamTrace]
    wall_s: float
    codec: dict = field(default_factory=dict)  # codec node counters over the round: batches, items, busy_s


async def _one(engine, spec: RequestSpec, t0: float) -> StreamTrace:
    trace = StreamTrace(spec.id)
    async for out in engine.generate(spec):
        now = time.perf_counter() - t0
        if isinstance(out, RequestFinished):
            trace.finished_s, trace.reason = now, out.reason.value
            if out.error:
                raise RuntimeError(f"{spec.id} failed: {out.error}")
        elif out.modality == "audio":
            n = 1
            for d in out.data.shape:
                n *= d
            trace.add(now, n)
    return trace


async def _round(engine, specs: Sequence[RequestSpec]) -> ServedRound:
    await engine.refresh_status()
    before = dict(engine.stats().nodes.get("codec", {}))
    t0 = time.perf_counter()
    traces = list(await asyncio.gather(*(_one(engine, s, t0) for s in specs)))
    wall = time.perf_counter() - t0
    await asyncio.sleep(0.1)
    await engine.refresh_status()
    after = engine.stats().nodes.get("codec", {})
    codec = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("batches", "items", "busy_s")}
    return ServedRound(len(specs), traces, wall, codec)


async def _serve(model_path: Path, placement: str | dict, threads: int, warmup: RequestSpec,
                 rounds: Sequence[Sequence[RequestSpec]], dtype: str | None = None,
                 kv: dict | None = None) -> list[ServedRound]:
    from walkserve.core.config import RuntimeConfig
    from walkserve.entrypoint.engine import AsyncEngine

    config = RuntimeConfig(worker_threads=threads, status_interval_s=0.05, dtype=None if dtype == "float32" else dtype,
                           engine_options={"kv": dict(kv)} if kv else {})
    engine = await AsyncEngine.start("orpheus", placement=placement, config=config, model_path=str(model_path))
    try:
        await _one(engine, warmup, time.perf_counter())
        return [await _round(engine, specs) for specs in rounds]
    finally:
        await engine.shutdown(drain_s=0)


def served_rounds(model_path: Path, placement: str | dict, threads: int, warmup: RequestSpec,
                  rounds: Sequence[Sequence[RequestSpec]], dtype: str | None = None,
                  kv: dict | None = None) -> list[ServedRound]:
    """Start the runtime once, warm it with one request, then run each round (its requests at once).
    ``placement``: a YAML path or a placement dict; ``dtype``: the runtime's dtype override (None: the model's);
    ``kv``: KV engine options (e.g. cuda_graphs)."""
    return asyncio.run(_serve(model_path, placement, threads, warmup, rounds, dtype, kv))
