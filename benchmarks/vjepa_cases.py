"""The cases of ``./dev bench vjepa``: the released loops (in this process) and walkserve (a running engine).

Every case starts from the same pixels and the same random-weight checkpoint, and includes encoding the
context frame (and the goal) with the same encoder, so the columns differ only in how the predictor runs:

    official   the released loop: every step re-runs the AC predictor on the whole history
    cached     our offline loop with KV reuse (``rollout.cached_rollout``), one request at a time
    batched    the cached loop for all of a throughput row's rollouts stepping together, dense caches, no serving
               (``vjepa_offline.batched_rollout``): the model-level bound of concurrent served rollouts
    walkserve  the served walk: one block-causal append of 2 + F tokens a step to the request's paged
               context; concurrent requests share each forward; a CEM step is one fanned append of K
               candidate contexts forked from the shared prefix
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from walkserve.core.array import ArrayData
from walkserve.core.sampling import SamplingParams
from walkserve.engines.spec import Batch


@dataclass(frozen=True)
class Work:
    path: Path
    threads: int
    repeat: int
    crop: int


def frames_of(work: Work, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, work.crop, work.crop, 3), dtype=np.uint8)


def actions_states(h: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    actions = np.concatenate([0.05 * rng.standard_normal((h, 6)), rng.uniform(-0.5, 0.5, (h, 1))], 1)
    states = np.concatenate([rng.standard_normal((1, 6)), rng.uniform(0, 1, (1, 1))], 1)
    return actions.astype(np.float32), states.astype(np.float32)


def _array(x: np.ndarray) -> ArrayData:
    x = np.ascontiguousarray(x)
    return ArrayData(str(x.dtype), tuple(x.shape), x.tobytes())


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def timed(fn: Callable[[], object], cpu: Callable[[], float]) -> tuple[float, float]:
    """(wall seconds, CPU seconds by ``cpu``'s clock) of one call."""
    c0, t0 = cpu(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    return wall, cpu() - c0


def descendants(pid: int) -> list[int]:
    """Live descendant process ids of ``pid`` (Linux /proc; [] elsewhere): the served worker ranks."""
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    children: dict[int, list[int]] = {}
    for e in entries:
        try:
            with open(f"/proc/{e}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(e))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---- the released loops and ours, offline ------------------------------------------------------------
class Offline:
    """The encoder and AC predictor loaded in this process (``torch.set_num_threads(work.threads)``)."""

    def __init__(self, work: Work):
        from walkserve.models.vjepa2.encoder_component import EncoderComponent
        from walkserve.models.vjepa2.weights import load_ac_predictor, load_encoder

        torch.set_num_threads(work.threads)
        self.encoder = EncoderComponent(load_encoder(work.path), "ac_frames")
        self.model = load_ac_predictor(work.path)

    def features(self, pixels: np.ndarray) -> torch.Tensor:
        return self.encoder.forward_batch(Batch.of([{"video": torch.from_numpy(pixels)}]))[0]["features"]

    @torch.inference_mode()
    def rollout(self, pixels: np.ndarray, actions: np.ndarray, states: np.ndarray, h: int, cached: bool) -> torch.Tensor:
        from walkserve.models.vjepa2.rollout import cached_rollout, official_rollout

        loop = cached_rollout if cached else official_rollout
        return loop(self.model, self.features(pixels), torch.from_numpy(actions), torch.from_numpy(states), h)

    @torch.inference_mode()
    def batched(self, cases: list[tuple[np.ndarray, np.ndarray, np.ndarray]], h: int) -> torch.Tensor:
        """Rollouts (pixels, actions, states) stepping together through the cached loop, each frame encoded alone:
        the model-level bound of as many concurrent served rollouts (``vjepa_offline.batched_rollout``)."""
        from benchmarks.vjepa_offline import batched_rollout

        frames = torch.cat([self.features(px) for px, _, _ in cases])  # [B, F, E]
        actions = torch.stack([torch.from_numpy(a) for _, a, _ in cases])
        states = torch.stack([torch.from_numpy(s) for _, _, s in cases])
        return batched_rollout(self.model, frames, actions, states, h)

    @torch.inference_mode()
    def plan(self, pixels: np.ndarray, goal: np.ndarray, states: np.ndarray, samples: int, h: int,
             official: bool) -> torch.Tensor:
        """One CEM iteration's costs [K]: each candidate rolled out alone (the released way re-runs the history)."""
        from walkserve.models.vjepa2.cem import (
            CEMConfig,
            initial_distribution,
            l1_cost,
            plan,
            sample_candidates,
        )
        from walkserve.models.vjepa2.rollout import official_rollout

        config = CEMConfig(horizon=h, samples=samples, topk=min(10, samples), iterations=1)
        frames, target = self.features(pixels), self.features(goal)[0]
        s = torch.from_numpy(states)
        if not official:
            return plan(self.model, frames, s, target, config).costs
        cands = sample_candidates(*initial_distribution(config), config, torch.Generator().manual_seed(0))
        return torch.stack([l1_cost(official_rollout(self.model, frames, c, s, h)[-1], target) for c in cands])


# ---- walkserve ---------------------------------------------------------------------------------------------
class Served:
    """A running AsyncEngine on ``placement``; requests go through the processor like HTTP ones."""

    def __init__(self, engine, loop: asyncio.AbstractEventLoop):
        self.engine, self.loop = engine, loop
        self.pids = descendants(os.getpid())  # the worker ranks (and their supervisor), started by now

    def cpu(self) -> float:
        """CPU seconds of everything that serves: this process (API-side engine, conductor) and its worker ranks."""
        own = os.times()
        return own.user + own.system + sum(process_cpu(p) for p in self.pids)

    @staticmethod
    def start(work: Work, placement: str) -> Served:
        from walkserve.core.config import RuntimeConfig
        from walkserve.entrypoint.engine import AsyncEngine
        from walkserve.placements import path as placement_path

        loop = asyncio.new_event_loop()
        config = RuntimeConfig(worker_threads=work.threads, max_running=64, status_interval_s=0.05)
        engine = loop.run_until_complete(AsyncEngine.start("vjepa2", str(placement_path(placement)), config=config,
                                                           model_path=str(work.path)))
        return Served(engine, loop)

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.shutdown())
        self.loop.close()

    def run(self, bodies: list[tuple[str, dict, dict]]) -> tuple[float, list[int]]:
        """Requests (task, inputs, params) at once: wall seconds until the last finished, outputs of each."""
        return self.loop.run_until_complete(self._run(bodies))

    async def _run(self, bodies: list[tuple[str, dict, dict]]) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(self._one(*b) for b in bodies))
        return time.perf_counter() - t0, list(counts)

    async def _one(self, task: str, inputs: dict, params: dict) -> int:
        processor = self.engine.processor
        spec = processor.build_request(task, {"inputs": inputs}, SamplingParams(), processor.check_params(params))
        n = 0
        async for event in self.engine.generate(spec):
            if getattr(event, "error", None):
                raise RuntimeError(f"{task} failed: {event.error}")
            n += hasattr(event, "modality")
        return n

    def rollout_body(self, pixels: np.ndarray, actions: np.ndarray, states: np.ndarray, h: int) -> tuple:
        return "rollout", {"frames": _array(pixels), "actions": _array(actions), "states": _array(states)}, {"horizon": h}

    def plan_body(self, pixels: np.ndarray, goal: np.ndarray, states: np.ndarray, samples: int, h: int,
                  iterations: int = 1) -> tuple:
        inputs = {"frames": _array(pixels), "goal": _array(goal), "states": _array(states)}
        return "plan", inputs, {"horizon": h, "samples": samples, "topk": min(10, samples), "iterations": iterations}
